// Map mode (docs/loading.md, "Modes"): a checkpoint's files mapped read-only and pinned in
// place through the worker (Worker::map_file_pinned, the `file` segment source), so the
// tensors are views of the page cache and nothing is read or copied; and the one host
// load through a worker that the CLI and Python call, in either mode.
#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "checkpoint/load_internal.h"
#include "pinstage/checkpoint.h"
#include "pinstage/clock.h"
#include "pinstage/error.h"
#include "pinstage/parallel.h"
#include "pinstage/safetensors.h"
#include "pinstage/staging_ring.h"
#include "pinstage/tensor.h"

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

// Maps and pins every file holding one of `tensors`, in file order; progress per file.
Mappings map_files(const Checkpoint& c, const std::vector<const CheckpointTensor*>& tensors,
                   Worker& worker, const CheckpointLoadOptions& o, LoadReport& r) {
  std::vector<uint64_t> bytes_in(c.files().size(), 0);
  std::vector<bool> wanted(c.files().size(), false);
  for (const CheckpointTensor* t : tensors) {
    wanted[t->file] = true;
    bytes_in[t->file] += t->bytes;
  }
  Mappings maps(c.files().size());
  uint64_t done = 0;
  for (size_t f = 0; f < c.files().size(); ++f) {
    if (!wanted[f]) continue;
    maps[f] = worker.map_file_pinned(c.files()[f].path, c.files()[f].size);
    r.map_s += maps[f]->map_seconds();
    r.pin_s += maps[f]->pin_seconds();
    if (!maps[f]->pinned() && r.map_note.empty())
      r.map_note = maps[f]->refusal() + "; its tensors were copied into pinned memory";
    done += bytes_in[f];
    if (o.progress) o.progress(done, r.bytes);
  }
  return maps;
}

// Each tensor's bytes, checked against its recorded hash in parallel.
void verify_views(const Checkpoint& c, const HostLoad& load, const CheckpointLoadOptions& o,
                  LoadReport& r) {
  if (!o.verify) return;
  const Stopwatch verify;
  std::atomic<size_t> unverified{0};
  parallel_for(
      load.tensors.size(), 1,
      [&](size_t b, size_t e) {
        for (size_t i = b; i < e; ++i) {
          const CheckpointTensor& t = load.tensors[i].info;
          if (!t.xxh3) {
            ++unverified;
            continue;
          }
          const uint64_t got = xxh3_64(load.tensors[i].storage->data(), t.bytes);
          if (got != *t.xxh3) detail::hash_mismatch(c, t, got);
        }
      },
      r.threads);
  r.verify_s = verify.seconds();
  r.unverified = unverified.load();
  r.verified = r.unverified == 0;
}

HostLoad map_to_host(const Checkpoint& c, const std::vector<const CheckpointTensor*>& tensors,
                     Worker& worker, const CheckpointLoadOptions& o) {
  detail::check_load_options(o, false);
  const Stopwatch total;
  HostLoad out;
  LoadReport& r = out.report;
  start_report(c, tensors, o, r);
  const Mappings maps = map_files(c, tensors, worker, o, r);
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
      out.tensors.push_back(
          {*t, std::make_shared<Storage>(t->bytes > 0 ? at : nullptr, t->bytes, true, m, true)});
    else
      out.tensors.push_back({*t, pool.allocate(static_cast<size_t>(t->bytes))});
  }
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

}  // namespace

HostLoad load_to_host(const Checkpoint& c, Worker& worker, const CheckpointLoadOptions& o,
                      const std::vector<std::string>* names) {
  require_chip_worker(worker, "load_to_host");
  const std::vector<const CheckpointTensor*> tensors = detail::selected(c, names, "load_to_host");
  if (o.mode == LoadMode::map) return map_to_host(c, tensors, worker, o);
  PinnedAllocator pool(worker);
  HostLoad out = detail::copy_to_host(c, tensors, pool, o);
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
  const Mappings maps = map_files(c, tensors, worker, quiet, r);
  if (!r.map_note.empty()) {
    *note = r.map_note.substr(0, r.map_note.find(';')) + "; the load went through the ring";
    return std::nullopt;  // the mappings go: the ring reads the files instead
  }
  if (o.verify) {  // the page cache's bytes, before they go up
    HostLoad views;
    for (const CheckpointTensor* t : tensors)
      views.tensors.push_back(
          {*t,
           std::make_shared<Storage>(const_cast<unsigned char*>(maps[t->file]->data()) + t->offset,
                                     t->bytes, true, nullptr)});
    verify_views(c, views, o, r);
  }
  const Stopwatch alloc;
  for (const CheckpointTensor* t : tensors)
    out.tensors.push_back({*t, t->bytes > 0 ? worker.alloc_device(t->bytes) : DeviceBuffer{}});
  r.alloc_s = alloc.seconds();
  Stream stream = worker.create_stream();
  const Stopwatch upload;
  uint64_t done = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const CheckpointTensor& t = *tensors[i];
    if (t.bytes == 0) continue;
    // Straight from the pinned mapping: the copy engine reads the page cache.
    worker.copy_to_device_async(out.tensors[i].buffer, 0, maps[t.file]->data() + t.offset, t.bytes,
                                stream);
    done += t.bytes;
    if (o.progress) o.progress(done, r.bytes);
  }
  worker.synchronize(stream);
  r.upload_s = upload.seconds();
  if (o.verify) check_arrived(c, worker, out, r);
  r.peak_pinned_bytes = worker.stats().pinned_bytes;
  r.total_s = total.seconds();
  return out;
}

}  // namespace detail

}  // namespace pinstage
