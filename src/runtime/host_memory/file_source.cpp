// The file sources (Note [Segment sources] in host_source.cpp), and the file mappings made of
// them: a file's page cache mapped read-only (file_shared) and pinned through the backend's
// host_register, or,
// where the backend cannot pin read-only memory, a private copy-on-write copy the kernel
// makes (file_private). Nothing is read into memory of our own through the pool: a warm
// file costs the page-table work of the faults and the lock. Several files are faulted and
// pinned in parallel: a cold one is read by its faults (the kernel's read-ahead).
#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "pinstage/clock.h"
#include "pinstage/files.h"
#include "pinstage/log.h"
#include "pinstage/pages.h"
#include "pinstage/parallel.h"
#include "runtime/worker_state.h"

namespace pinstage {

namespace runtime {
namespace {

// file_shared (read-only, the page cache) or file_private (a copy-on-write copy).
class FileSource final : public HostSource {
 public:
  FileSource(SourceKind kind, const HostPlacement& p) : HostSource(kind), placement_(p) {}
  HostSegment make(const SegmentRequest& r) override {
    const bool private_copy = kind() == SourceKind::file_private;
    MapOptions options;
    options.prefault = r.fault;
    options.threads = placement_.fault_threads;
    options.numa_node = placement_.numa_node;
    HostSegment s =
        runtime::segment_of(kind(), map_file_pages(r.fd, r.bytes, private_copy, options, r.what));
    s.read_only = !private_copy;
    if (private_copy) dont_fork(placement_, s);  // a shared mapping is the page cache's
    return s;
  }

 private:
  const HostPlacement& placement_;
};

template <SourceKind kKind>
std::unique_ptr<HostSource> make_file_source(const HostPlacement& p, const ps_platform_api&,
                                             ps_device_ctx*) {
  return std::make_unique<FileSource>(kKind, p);
}
const SourceRegistration kFileShared(SourceKind::file_shared, "file_shared",
                                     make_file_source<SourceKind::file_shared>);
const SourceRegistration kFilePrivate(SourceKind::file_private, "file_private",
                                      make_file_source<SourceKind::file_private>);

}  // namespace
}  // namespace runtime

namespace {

[[noreturn]] void io_error(const std::string& path, const std::string& what) {
  throw Error(ErrorCode::io, "cannot map '" + path + "' read-only: " + what);
}

// Unpins through the worker while it lives: every stream is synchronized first (a queued
// copy may still read the range; this is rare, a mapping's last owner going away).
void unregister(runtime::WorkerState& s, runtime::SourceKind source, void* data,
                size_t bytes) noexcept {
  runtime::CallGuard guard(s);
  if (!guard.entered()) return;  // finalize unpinned it already
  const runtime::EntryKind kind = runtime::entry_kind(source);
  std::vector<ps_allocation> streams;
  {
    std::lock_guard lock(s.mu);
    if (!s.table.erase(kind, data)) return;
    streams = s.table.snapshot(runtime::EntryKind::stream);
  }
  if (s.api().stream_sync != nullptr)
    for (const ps_allocation& st : streams)
      (void)s.api().stream_sync(s.ctx,
                                static_cast<ps_stream*>(st.ptr));  // failures: their waiter's
  const std::string why = s.release_host(source, ps_allocation{data, bytes, nullptr}, true, false);
  if (why.empty()) return;
  log(LogLevel::error,
      s.name() + ": unpinning a file mapping failed: " + why + " (kept for finalize)");
  std::lock_guard lock(s.mu);
  s.table.add_failed(kind, ps_allocation{data, bytes, nullptr});
  ++s.free_failures;
}

// A file opened for a mapping: read-only and never blocking (a FIFO renamed over a
// checkpoint is refused at once), a regular file of the size the caller validated.
struct OpenFile {
  UniqueFd fd;
  runtime::FileKey key{};
};

OpenFile open_for_map(const std::string& path, uint64_t expect_bytes) {
  std::string why;
  OpenFile f;
  f.fd = UniqueFd(open_regular_file(path, 0, &why));
  if (f.fd.get() < 0) io_error(path, why);
  struct stat st {};
  if (::fstat(f.fd.get(), &st) != 0) io_error(path, std::strerror(errno));
  const auto size = static_cast<uint64_t>(st.st_size);
  // Before any live mapping is shared: one of another size would be read past its end.
  if (expect_bytes != UINT64_MAX && size != expect_bytes)
    io_error(path, "the file has " + std::to_string(size) + " bytes, " +
                       std::to_string(expect_bytes) +
                       " when it was opened: it changed since; open it again");
  if (size == 0) io_error(path, "the file is empty");
  f.key = runtime::FileKey{st.st_dev, st.st_ino, st.st_mtim.tv_sec, st.st_mtim.tv_nsec, size};
  return f;
}

}  // namespace

PinnedFileMapping::~PinnedFileMapping() {
  if (data_ == nullptr) return;
  const runtime::SourceKind source =
      private_ ? runtime::SourceKind::file_private : runtime::SourceKind::file_shared;
  if (pinned_)
    if (const std::shared_ptr<runtime::WorkerState> s = owner_.lock())
      unregister(*s, source, data_, map_bytes_);
  std::string why;
  if (!unmap_pages(MappedPages{data_, map_bytes_, data_, map_bytes_, {}, 0}, &why))
    log(LogLevel::error, "unmapping a file mapping failed: " + why);
}

void PinnedFileMapping::pin_in_place(runtime::WorkerState& s, int fd, const std::string& path) {
  using runtime::SourceKind;
  const Stopwatch watch;
  runtime::HostSegment seg;
  seg.source = private_ ? SourceKind::file_private : SourceKind::file_shared;
  seg.data = data_;
  seg.bytes = map_bytes_;
  seg.read_only = !private_;
  int status = s.pin_segment(seg);
  if (private_) {  // asked for a writable copy (map_files_pinned's writable): pinned as it is
    pin_seconds_ = watch.seconds();
    pinned_ = status == PS_OK;
    if (!pinned_)
      refusal_ = s.name() + " cannot pin a private copy of the file: " + s.api().last_error();
    return;
  }
  const std::string read_only_refusal = status == PS_OK ? "" : s.api().last_error();
  if (status == PS_ERR_UNSUPPORTED && s.api().host_register != nullptr) {
    // A private copy the kernel makes (no zero fill, nothing through the pool), pinned
    // writable: what a driver without read-only registration can pin.
    const runtime::HostSegment copy =
        s.sources[static_cast<size_t>(SourceKind::file_private)]->make(
            {size_, true, fd, "'" + path + "'"});
    try {
      status = s.pin_segment(copy);
    } catch (...) {
      s.sources[static_cast<size_t>(SourceKind::file_private)]->release(copy.allocation(), nullptr);
      throw;
    }
    if (status == PS_OK) {
      (void)unmap_pages(MappedPages{data_, map_bytes_, data_, map_bytes_, {}, 0});
      data_ = static_cast<unsigned char*>(copy.data);
      private_ = true;
      note_ = s.name() + " cannot pin read-only memory (" + read_only_refusal +
              "): mapped as a private copy-on-write copy (file_private), pinned writable; "
              "nothing went through the pool";
    } else {
      s.sources[static_cast<size_t>(SourceKind::file_private)]->release(copy.allocation(), nullptr);
    }
  }
  pin_seconds_ = watch.seconds();
  if (status == PS_OK) {
    pinned_ = true;
    return;
  }
  refusal_ = s.api().host_register == nullptr
                 ? "the " + s.name() + " backend has no host_register slot"
                 : s.name() + " cannot pin a read-only file mapping: " + read_only_refusal;
}

namespace {

using Mapping = std::shared_ptr<PinnedFileMapping>;

constexpr const char* kOverBudget = "over the pin budget (PINSTAGE_PIN_POLICY=fallback): ";

// Faults the new mappings in on `threads` threads of their own, 64 MiB at a time across
// every file (a cold file is read by these faults: blocking I/O wants threads beyond the
// CPU pool's); a mapping refused by the budget is skipped.
void fault_in(const std::vector<const PinnedFileMapping*>& maps, int threads) {
  constexpr size_t kUnit = size_t{64} << 20;
  std::vector<std::pair<const unsigned char*, size_t>> units;
  for (const PinnedFileMapping* m : maps)
    for (uint64_t off = 0; off < m->size(); off += kUnit)
      units.emplace_back(m->data() + off, std::min<uint64_t>(kUnit, m->size() - off));
  std::atomic<size_t> next{0};
  const auto work = [&] {
    for (size_t i = next++; i < units.size(); i = next++)
      (void)prefault(const_cast<unsigned char*>(units[i].first), units[i].second, 1, 0,
                     PrefaultMethod::read);  // NOLINT: a read fault writes nothing
  };
  std::vector<std::thread> pool;
  const int n = std::max(1, std::min<int>(threads, static_cast<int>(units.size())));
  for (int t = 1; t < n; ++t) pool.emplace_back(work);
  try {
    work();
  } catch (...) {
    for (std::thread& t : pool) t.join();
    throw;
  }
  for (std::thread& t : pool) t.join();
}

}  // namespace

std::vector<Mapping> Worker::map_files_pinned(const std::vector<std::string>& paths,
                                              const std::vector<uint64_t>& expect_bytes,
                                              int threads, bool writable) {
  const runtime::CallGuard guard = enter();
  if (expect_bytes.size() != paths.size())
    throw Error(ErrorCode::invalid_argument, "map_files_pinned: " + std::to_string(paths.size()) +
                                                 " paths but " +
                                                 std::to_string(expect_bytes.size()) + " sizes");
  runtime::WorkerState& s = *state_;
  std::vector<Mapping> out(paths.size());
  std::vector<OpenFile> files(paths.size());
  std::vector<size_t> fresh;  // indexes of the files mapped here
  for (size_t i = 0; i < paths.size(); ++i) {
    const Stopwatch watch;
    files[i] = open_for_map(paths[i], expect_bytes[i]);
    if (!writable) {  // the file mapped already (another tensor of it): one mapping, pinned once
      std::lock_guard lock(s.mu);
      auto it = s.mapped_files.find(files[i].key);
      if (it != s.mapped_files.end()) {
        if ((out[i] = it->second.lock())) continue;
        s.mapped_files.erase(it);
      }
    }
    const runtime::SourceKind kind =
        writable ? runtime::SourceKind::file_private : runtime::SourceKind::file_shared;
    const runtime::HostSegment seg = s.sources[static_cast<size_t>(kind)]->make(
        {files[i].key.size, false, files[i].fd.get(), "'" + paths[i] + "'"});
    std::shared_ptr<PinnedFileMapping> m(new PinnedFileMapping());
    m->private_ = writable;
    m->owner_ = state_;
    m->data_ = static_cast<unsigned char*>(seg.data);
    m->size_ = files[i].key.size;
    m->map_bytes_ = seg.bytes;
    m->map_seconds_ = watch.seconds();
    out[i] = std::move(m);
    fresh.push_back(i);
  }
  // The budget's one verdict per file, in order, each over the files before it in this call
  // too (they are pinned together below); under the fallback policy a refused file stays
  // unpinned and its tensors are copied. Then the faults and the pins, in parallel.
  std::vector<const PinnedFileMapping*> to_fault;
  size_t before = 0;
  for (size_t i : fresh) {
    size_t want = before + out[i]->map_bytes_;
    const std::string what =
        "mapping '" + paths[i] + "'" +
        (before > 0 ? " (with the " + std::to_string(before) + " bytes of the files before it)"
                    : std::string()) +
        ": ";
    const std::string over = s.pin_verdict(want, want, want, what);
    if (!over.empty()) {
      out[i]->refusal_ = std::string(kOverBudget) + over;
      continue;
    }
    to_fault.push_back(out[i].get());
    before += out[i]->map_bytes_;
  }
  const int n = threads > 0 ? threads : std::max(default_thread_count(), 4);
  const Stopwatch faults;
  fault_in(to_fault, n);
  const double fault_s = faults.seconds() / std::max<size_t>(to_fault.size(), 1);
  parallel_for(
      fresh.size(), 1,
      [&](size_t b, size_t e) {
        for (size_t k = b; k < e; ++k) {
          PinnedFileMapping& m = *out[fresh[k]];
          if (!m.refusal_.empty()) continue;
          m.map_seconds_ += fault_s;  // each file's share of the parallel faults
          m.pin_in_place(s, files[fresh[k]].fd.get(), paths[fresh[k]]);
        }
      },
      n);
  std::lock_guard lock(s.mu);
  if (!writable)  // a private copy is this caller's alone
    for (size_t i : fresh) s.mapped_files[files[i].key] = out[i];  // a race maps twice: both work
  return out;
}

std::shared_ptr<PinnedFileMapping> Worker::map_file_pinned(const std::string& path,
                                                           uint64_t expect_bytes) {
  return map_files_pinned({path}, {expect_bytes}).front();
}

}  // namespace pinstage
