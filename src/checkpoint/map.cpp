// Map mode (docs/loading.md, "Modes"): a checkpoint's files mapped read-only and pinned in
// place through the worker (Worker::map_file_pinned, the `file` segment source), so the
// tensors are views of the page cache and nothing is read or copied; and the one host
// load through a worker that the CLI and Python call, in either mode.
#include <algorithm>
#include <cctype>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "checkpoint/folios.h"
#include "checkpoint/load_internal.h"
#include "pinstage/checkpoint.h"
#include "pinstage/clock.h"
#include "pinstage/error.h"
#include "pinstage/parallel.h"
#include "pinstage/safetensors.h"
#include "pinstage/staging_ring.h"
#include "pinstage/tensor.h"
#include "pinstage/worker.h"

namespace pinstage {

const char* load_mode_name(LoadMode mode) { return mode == LoadMode::map ? "map" : "copy"; }

LoadMode parse_load_mode(std::string_view name) {
  std::string lower(name);
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
  if (lower == "copy") return LoadMode::copy;
  if (lower == "map") return LoadMode::map;
  throw Error(ErrorCode::invalid_argument,
              "unknown load mode '" + std::string(name.substr(0, 64)) + "' (valid: copy, map)");
}

namespace {

using Mappings = std::vector<std::shared_ptr<PinnedFileMapping>>;

void check_map_options(const CheckpointLoadOptions& o) {
  if (o.direct)
    throw Error(ErrorCode::invalid_argument,
                "map mode reads the page cache in place, and direct (O_DIRECT) bypasses it: "
                "ask for one of them");
}

// A map-mode load's checks (before anything is mapped) and its report's opening figures.
void start_report(const Checkpoint& c, const std::vector<const CheckpointTensor*>& tensors,
                  const CheckpointLoadOptions& o, LoadReport& r) {
  check_map_options(o);
  detail::check_verifiable(c, tensors, o);
  r.mode = "map";
  r.files = c.files().size();
  r.threads = o.threads > 0 ? o.threads : default_thread_count();
  r.chunk_bytes = o.chunk_bytes;
  r.tensors = tensors.size();
  for (const CheckpointTensor* t : tensors) r.bytes += t->bytes;
}

// Maps and pins every file holding one of `tensors`, faulted and pinned in parallel
// (Worker::map_files_pinned); progress once they are. The notes say what was not pinned in
// place: a private copy (a backend that cannot pin read-only memory), or a file whose
// tensors are copied, into pinned memory or, over the budget under the fallback policy,
// into pageable memory.
Mappings map_files(const Checkpoint& c, const std::vector<const CheckpointTensor*>& tensors,
                   Worker& worker, const CheckpointLoadOptions& o, LoadReport& r,
                   bool writable = false) {
  std::vector<bool> wanted(c.files().size(), false);
  for (const CheckpointTensor* t : tensors) wanted[t->file] = true;
  std::vector<std::string> paths;
  std::vector<uint64_t> sizes;
  std::vector<size_t> index;
  for (size_t f = 0; f < c.files().size(); ++f) {
    if (!wanted[f]) continue;
    paths.push_back(c.files()[f].path);
    sizes.push_back(c.files()[f].size);
    index.push_back(f);
  }
  detail::enter_phase(o, "pin");
  detail::FolioCensus folios;  // before the files are mapped: it reads FileHugePages then
  const Mappings made = worker.map_files_pinned(paths, sizes, o.threads, writable);
  Mappings maps(c.files().size());
  for (size_t k = 0; k < made.size(); ++k) {
    const std::shared_ptr<PinnedFileMapping>& m = maps[index[k]] = made[k];
    folios.add(*m, r);
    r.map_s = std::max(r.map_s, m->map_seconds());  // the files were mapped in parallel
    r.pin_s = std::max(r.pin_s, m->pin_seconds());
    if (!m->note().empty() && r.map_note.empty()) r.map_note = m->note();
    if (m->pinned() || r.map_note.find("copied") != std::string::npos) continue;
    // Over the budget (the fallback policy: strict would have thrown), the pool's copies
    // are over it too, and take pageable memory.
    const bool pageable = m->refusal().rfind("over the pin budget", 0) == 0;
    r.map_note = m->refusal().substr(0, m->refusal().find(". ")) +
                 (pageable ? "; its tensors were copied into pageable memory "
                             "(PINSTAGE_PIN_POLICY=fallback): not pinned"
                           : "; its tensors were copied into pinned memory");
  }
  if (o.progress) o.progress(r.bytes, r.bytes);
  return maps;
}

// Each tensor's bytes, checked against its recorded hash in parallel.
void verify_views(const Checkpoint& c, const HostLoad& load, const CheckpointLoadOptions& o,
                  LoadReport& r) {
  detail::verify_hashes(
      c, o, load.tensors.size(),
      [&](size_t i) -> const CheckpointTensor& { return load.tensors[i].info; },
      [&](size_t i) {
        return xxh3_64(load.tensors[i].storage->data(), load.tensors[i].info.bytes);
      },
      r);
}

}  // namespace

namespace detail {

HostLoad map_to_host(const Checkpoint& c, const std::vector<const CheckpointTensor*>& tensors,
                     Worker& worker, const CheckpointLoadOptions& o, bool writable) {
  detail::check_load_options(o, false);
  const Stopwatch total;
  HostLoad out;
  LoadReport& r = out.report;
  start_report(c, tensors, o, r);
  const Mappings maps = map_files(c, tensors, worker, o, r, writable);
  // Refused files: their tensors copied out of the mapping into pinned pool memory.
  PinnedAllocator pool(worker);
  std::vector<size_t> copied_sizes;
  for (const CheckpointTensor* t : tensors)
    if (!maps[t->file]->pinned()) copied_sizes.push_back(static_cast<size_t>(t->bytes));
  if (!copied_sizes.empty()) pool.reserve(copied_sizes);
  out.tensors.reserve(tensors.size());
  for (const CheckpointTensor* t : tensors) {
    const std::shared_ptr<PinnedFileMapping>& m = maps[t->file];
    unsigned char* at =
        const_cast<unsigned char*>(m->data()) + t->offset;  // NOLINT: read-only view
    if (m->pinned())
      out.tensors.push_back({*t, std::make_shared<Storage>(t->bytes > 0 ? at : nullptr, t->bytes,
                                                           true, m, !writable)});
    else
      out.tensors.push_back({*t, pool.allocate(static_cast<size_t>(t->bytes))});
  }
  if (!copied_sizes.empty()) detail::enter_phase(o, "read");
  const Stopwatch copy;
  parallel_for(
      out.tensors.size(), 1,
      [&](size_t b, size_t e) {
        for (size_t i = b; i < e; ++i)
          if (!maps[tensors[i]->file]->pinned() && tensors[i]->bytes > 0)
            std::memcpy(out.tensors[i].storage->data(),
                        maps[tensors[i]->file]->data() + tensors[i]->offset, tensors[i]->bytes);
      },
      r.threads);
  r.read_s = copied_sizes.empty() ? 0 : copy.seconds();
  verify_views(c, out, o, r);
  r.peak_pinned_bytes = worker.stats().pinned_bytes;
  r.total_s = total.seconds();
  return out;
}

}  // namespace detail

HostLoad load_to_host(const Checkpoint& c, Worker& worker, const CheckpointLoadOptions& o,
                      const std::vector<std::string>* names) {
  require_chip_worker(worker, "load_to_host");
  if (o.cache != CacheUse::off) return detail::load_host_through_cache(c, worker, o, names);
  const std::vector<const CheckpointTensor*> tensors = detail::selected(c, names, "load_to_host");
  if (o.mode == LoadMode::map) {
    try {
      return detail::map_to_host(c, tensors, worker, o, false);
    } catch (const Error& refused) {
      if (refused.code() != ErrorCode::out_of_memory) throw;
      // Whole files do not fit the pin budget; the tensors asked for may (safe_open's one
      // small tensor of a large shard): copied, as copy mode would, and said so. When they
      // do not fit either, the map's own refusal stands.
      CheckpointLoadOptions copy = o;
      copy.mode = LoadMode::copy;
      PinnedAllocator pool(worker);
      try {
        HostLoad out = detail::copy_to_host(c, tensors, pool, copy);
        const std::string why = refused.what();
        out.report.mode = "map";
        out.report.map_note =
            "the files do not fit the pin budget (" + why.substr(0, why.find(". ")) + "); the " +
            std::to_string(tensors.size()) + " tensor(s) asked for were copied into pinned memory";
        out.report.peak_pinned_bytes = worker.stats().pinned_bytes;
        return out;
      } catch (const Error& again) {
        if (again.code() != ErrorCode::out_of_memory) throw;
        throw refused;
      }
    }
  }
  PinnedAllocator pool(worker);
  HostLoad out = detail::copy_to_host(c, tensors, pool, o);
  out.report.host_pages = pool.fill() != nullptr ? pool.fill()->pages() : "";
  out.report.peak_pinned_bytes = worker.stats().pinned_bytes;
  return out;
}

namespace {

// What arrived: every hashed tensor read back from the device through one pinned buffer
// and hashed again, as the ring load does.
void check_arrived(const Checkpoint& c, Worker& worker, const DeviceLoad& load, LoadReport& r) {
  const Stopwatch verify;
  constexpr size_t kPiece = size_t{8} << 20;
  PinnedHostBuffer piece;
  for (const DeviceTensor& t : load.tensors) {
    if (!t.info.xxh3 || t.info.bytes == 0) continue;
    if (!piece) piece = worker.alloc_pinned_host(kPiece);
    Xxh3Stream hash;
    for (uint64_t off = 0; off < t.info.bytes; off += kPiece) {
      const size_t n = static_cast<size_t>(std::min<uint64_t>(kPiece, t.info.bytes - off));
      worker.copy_to_host(piece.data(), t.buffer, static_cast<size_t>(off), n);
      hash.update(piece.data(), n);
    }
    r.verify_readback_bytes += t.info.bytes;
    const uint64_t got = hash.digest();
    if (got != *t.info.xxh3)
      throw Error(ErrorCode::io, "checkpoint file '" + c.files()[t.info.file].path + "': tensor '" +
                                     t.info.name.substr(0, 96) +
                                     "' arrived damaged on the device: xxh3-64 " + xxh3_hex(got) +
                                     " read back, " + xxh3_hex(*t.info.xxh3) + " recorded");
  }
  r.verify_s += verify.seconds();
}

}  // namespace

namespace detail {

namespace {

// Uploads `tensors` (indexes into `all`) straight from their pinned mappings, then waits.
void upload_mapped(Worker& worker, const std::vector<const CheckpointTensor*>& all,
                   const std::vector<size_t>& tensors, const Mappings& maps, DeviceLoad& out,
                   const CheckpointLoadOptions& o, uint64_t& done) {
  Stream stream = worker.create_stream();
  for (size_t i : tensors) {
    const CheckpointTensor& t = *all[i];
    if (t.bytes == 0) continue;
    // Straight from the pinned mapping: the copy engine reads the page cache.
    worker.copy_to_device_async(out.tensors[i].buffer, 0, maps[t.file]->data() + t.offset, t.bytes,
                                stream);
    done += t.bytes;
    if (o.progress) o.progress(done, out.report.bytes);
  }
  worker.synchronize(stream);
}

// The files one at a time, each mapped, uploaded and let go before the next: a load whose
// files do not fit the pin budget together, where each does. false (with *note) when one
// does not fit alone.
bool upload_file_by_file(const Checkpoint& c, const std::vector<const CheckpointTensor*>& tensors,
                         Worker& worker, const CheckpointLoadOptions& quiet,
                         const CheckpointLoadOptions& o, DeviceLoad& out, std::string* note) {
  uint64_t done = 0;
  for (size_t f = 0; f < c.files().size(); ++f) {
    std::vector<const CheckpointTensor*> mine;
    std::vector<size_t> index;
    for (size_t i = 0; i < tensors.size(); ++i)
      if (tensors[i]->file == f) {
        mine.push_back(tensors[i]);
        index.push_back(i);
      }
    if (mine.empty()) continue;
    LoadReport part;
    Mappings maps;
    try {
      maps = map_files(c, mine, worker, quiet, part);
    } catch (const Error& e) {
      if (e.code() != ErrorCode::out_of_memory) throw;
      const std::string why = e.what();
      *note = "a file does not fit the pin budget alone (" + why.substr(0, why.find(". ")) +
              "); the load went through the ring";
      return false;
    }
    if (!part.map_note.empty()) {
      *note = part.map_note.substr(0, part.map_note.find(';')) + "; the load went through the ring";
      return false;
    }
    out.report.map_s += part.map_s;
    out.report.pin_s += part.pin_s;
    upload_mapped(worker, tensors, index, maps, out, o, done);
  }
  out.report.map_note =
      "the files do not fit the pin budget together: each was pinned, uploaded and let go in "
      "turn";
  return true;
}

}  // namespace

std::optional<DeviceLoad> map_to_device(const Checkpoint& c,
                                        const std::vector<CheckpointTensor>& chosen, Worker& worker,
                                        const CheckpointLoadOptions& o, std::string* note) {
  std::vector<const CheckpointTensor*> tensors;
  tensors.reserve(chosen.size());
  for (const CheckpointTensor& t : chosen) tensors.push_back(&t);
  const Stopwatch total;
  DeviceLoad out;
  LoadReport& r = out.report;
  start_report(c, tensors, o, r);
  CheckpointLoadOptions quiet = o;
  quiet.progress = nullptr;  // progress is for the uploads below
  std::optional<Mappings> maps;
  try {
    maps = map_files(c, tensors, worker, quiet, r);
  } catch (const Error& e) {
    if (e.code() != ErrorCode::out_of_memory) throw;  // together they do not fit: see below
  }
  if (maps && !r.map_note.empty()) {
    *note = r.map_note.substr(0, r.map_note.find(';')) + "; the load went through the ring";
    return std::nullopt;  // the mappings go: the ring reads the files instead
  }
  if (o.verify && maps) {  // the page cache's bytes, before they go up
    HostLoad views;
    for (const CheckpointTensor* t : tensors)
      views.tensors.push_back(
          {*t, std::make_shared<Storage>(
                   const_cast<unsigned char*>((*maps)[t->file]->data()) + t->offset, t->bytes, true,
                   nullptr)});
    verify_views(c, views, o, r);
  }
  detail::enter_phase(o, "allocate");
  const Stopwatch alloc;
  for (const CheckpointTensor* t : tensors)
    out.tensors.push_back({*t, t->bytes > 0 ? worker.alloc_device(t->bytes) : DeviceBuffer{}});
  r.alloc_s = alloc.seconds();
  detail::enter_phase(o, "upload");
  const Stopwatch upload;
  if (maps) {
    std::vector<size_t> all(tensors.size());
    for (size_t i = 0; i < all.size(); ++i) all[i] = i;
    uint64_t done = 0;
    upload_mapped(worker, tensors, all, *maps, out, o, done);
  } else if (!upload_file_by_file(c, tensors, worker, quiet, o, out, note)) {
    return std::nullopt;
  }
  r.upload_s = upload.seconds();
  if (o.verify && !maps) {  // file by file: every hashed tensor is checked as it arrived
    r.unverified = static_cast<size_t>(std::count_if(
        tensors.begin(), tensors.end(), [](const CheckpointTensor* t) { return !t->xxh3; }));
    r.verified = r.unverified == 0;
  }
  if (o.verify) {
    detail::enter_phase(o, "verify");
    check_arrived(c, worker, out, r);
  }
  r.peak_pinned_bytes = worker.stats().pinned_bytes;
  r.total_s = total.seconds();
  return out;
}

}  // namespace detail

}  // namespace pinstage
