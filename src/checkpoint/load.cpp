// Loading a validated Checkpoint: parallel pread into host storage (read_checkpoint,
// load_to_host) and streaming onto the device through a StagingRing (load_to_device).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <mutex>
#include <optional>
#include <system_error>
#include <thread>

#include "checkpoint/load_internal.h"
#include "pinstage/checkpoint.h"
#include "pinstage/clock.h"
#include "pinstage/error.h"
#include "pinstage/files.h"
#include "pinstage/parallel.h"
#include "pinstage/safetensors.h"
#include "pinstage/staging_ring.h"

namespace pinstage {

namespace {

constexpr uint64_t kDirectAlign = 4096;  // O_DIRECT offset, length and address alignment

[[noreturn]] void read_error(const std::string& path, const std::string& what) {
  throw Error(ErrorCode::io, "checkpoint file '" + path + "': " + what);
}

}  // namespace

namespace detail {

void check_load_options(const CheckpointLoadOptions& o, bool device, const char* what) {
  const std::string prefix = std::string(what) + ": ";
  if (o.threads < 0 || o.threads > kLoadMaxThreads)
    throw Error(ErrorCode::invalid_argument,
                prefix + "threads is " + std::to_string(o.threads) + "; it must be in 0.." +
                    std::to_string(kLoadMaxThreads) + " (0 = all cores)");
  if (o.chunk_bytes == 0 || o.chunk_bytes > kLoadMaxChunkBytes)
    throw Error(ErrorCode::invalid_argument,
                prefix + "the chunk size is " + std::to_string(o.chunk_bytes) +
                    " bytes; it must be in 1.." + std::to_string(kLoadMaxChunkBytes));
  if (device && o.ring_bytes > kLoadMaxRingBytes)
    throw Error(ErrorCode::invalid_argument,
                prefix + "the staging ring is " + std::to_string(o.ring_bytes) +
                    " bytes; it must be at most " + std::to_string(kLoadMaxRingBytes));
  if (device && (o.ring_buffers < 2 || o.ring_bytes / std::max<size_t>(o.ring_buffers, 1) == 0))
    throw Error(ErrorCode::invalid_argument,
                prefix + "the staging ring needs at least 2 buffers of at least 1 byte, got " +
                    std::to_string(o.ring_buffers) + " buffers in " + std::to_string(o.ring_bytes) +
                    " bytes");
}

}  // namespace detail

namespace {

using detail::check_load_options;

// The open files of a load: buffered or O_DIRECT descriptors of the files that hold a
// wanted tensor (another shard that changed or went away does not fail this read),
// closed on every path out, a constructor that throws included.
class Files {
 public:
  Files(const Checkpoint& c, const std::vector<bool>& wanted, bool direct, LoadReport& report)
      : fds_(c.files().size()), direct_(c.files().size(), false) {
    report.direct = direct;
    for (size_t i = 0; i < c.files().size(); ++i) {
      if (!wanted[i]) continue;
      const CheckpointFile& f = c.files()[i];
      std::string why;
      bool is_direct = false;
      int fd = direct ? open_direct(f.path, report, &is_direct) : -1;
      direct_[i] = is_direct;
      if (fd < 0) fd = open_regular_file(f.path, 0, &why);
      if (fd < 0) read_error(f.path, "cannot open: " + why);
      fds_[i] = UniqueFd(fd);
      struct stat st {};
      if (::fstat(fd, &st) != 0 || static_cast<uint64_t>(st.st_size) != f.size)
        read_error(f.path, "its size changed since the checkpoint was opened (" +
                               std::to_string(f.size) + " bytes then, " +
                               std::to_string(st.st_size) + " now)");
    }
  }
  int fd(size_t file) const { return fds_[file].get(); }
  bool direct(size_t file) const { return direct_[file]; }

 private:
  // O_DIRECT descriptor, or -1 with the reason in the report when the file system
  // refuses it (at open, or at a first aligned read).
  static int open_direct(const std::string& path, LoadReport& report, bool* is_direct) {
    std::string why;
    UniqueFd fd(open_regular_file(path, O_DIRECT, &why));
    int err = fd.get() < 0 ? errno : 0;
    if (fd.get() < 0 && err == 0) read_error(path, "cannot open: " + why);  // not regular
    if (fd.get() >= 0) {
      void* probe = std::aligned_alloc(kDirectAlign, kDirectAlign);
      if (probe != nullptr && ::pread(fd.get(), probe, kDirectAlign, 0) < 0) err = errno;
      std::free(probe);
      if (err == 0) {
        *is_direct = true;
        return fd.release();
      }
    }
    report.direct = false;
    report.direct_note = "O_DIRECT refused for '" + path + "' (" + std::strerror(err) +
                         "); reading through the page cache instead";
    return -1;
  }

  std::vector<UniqueFd> fds_;
  std::vector<bool> direct_;
};

// The files that hold at least one of `tensors`.
std::vector<bool> files_of(const Checkpoint& c,
                           const std::vector<const CheckpointTensor*>& tensors) {
  std::vector<bool> wanted(c.files().size(), false);
  for (const CheckpointTensor* t : tensors) wanted[t->file] = true;
  return wanted;
}

// Buffered: exactly `bytes` at `offset` into dst.
void pread_all(int fd, void* dst, uint64_t bytes, uint64_t offset, const std::string& path) {
  const uint64_t got = pread_full(fd, dst, bytes, offset);
  if (got == bytes) return;
  if (errno != 0) read_error(path, std::string("read failed: ") + std::strerror(errno));
  read_error(path, "the file ended at byte " + std::to_string(offset + got) +
                       " (was it truncated after the checkpoint was opened?)");
}

// A reader's aligned buffer for O_DIRECT, grown as needed and freed when its read
// call ends (a thread_local one outlived the load and the worker).
struct Bounce {
  void* data = nullptr;
  size_t size = 0;
  Bounce() = default;
  Bounce(const Bounce&) = delete;
  Bounce& operator=(const Bounce&) = delete;
  ~Bounce() { std::free(data); }
};

// O_DIRECT: the aligned range around [offset, offset + bytes) into the reader's aligned
// bounce buffer, then the wanted bytes into dst.
void pread_direct(int fd, void* dst, uint64_t bytes, uint64_t offset, const std::string& path,
                  Bounce& bounce) {
  const uint64_t begin = offset / kDirectAlign * kDirectAlign;
  const uint64_t end = (offset + bytes + kDirectAlign - 1) / kDirectAlign * kDirectAlign;
  if (bounce.size < end - begin) {
    std::free(bounce.data);
    bounce.size = 0;
    bounce.data = std::aligned_alloc(kDirectAlign, end - begin);
    if (bounce.data == nullptr) throw Error(ErrorCode::out_of_memory, "O_DIRECT bounce buffer");
    bounce.size = end - begin;
  }
  auto* b = static_cast<unsigned char*>(bounce.data);
  if (b == nullptr) throw Error(ErrorCode::out_of_memory, "O_DIRECT bounce buffer");
  uint64_t have = 0;  // bytes from `begin` read so far
  while (begin + have < offset + bytes) {
    const ssize_t r = ::pread(fd, b + have, end - begin - have, static_cast<off_t>(begin + have));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) read_error(path, std::string("O_DIRECT read failed: ") + std::strerror(errno));
    if (r == 0) read_error(path, "the file ended at byte " + std::to_string(begin + have));
    have += static_cast<uint64_t>(r);
  }
  std::memcpy(dst, b + (offset - begin), bytes);
}

// One pread of a load: bytes of a file into dst.
struct Chunk {
  size_t file;
  uint64_t offset;
  uint64_t bytes;
  unsigned char* dst;
};

// Runs body() on `threads` threads (the caller is one of them). Reads block in the kernel,
// so they get threads of their own rather than the CPU pool (parallel_for stops at one
// thread per core, and a cold disk wants more requests in flight than that). The first
// exception is rethrown after every thread stopped; a thread that cannot start is an
// error after the started ones are joined.
void run_readers(int threads, const std::function<void(int)>& body) {
  std::exception_ptr first;
  std::mutex mutex;
  auto guarded = [&](int index) {
    try {
      body(index);
    } catch (...) {
      const std::lock_guard<std::mutex> lock(mutex);
      if (!first) first = std::current_exception();
    }
  };
  std::vector<std::thread> pool;
  try {
    for (int i = 1; i < threads; ++i) pool.emplace_back(guarded, i);
  } catch (const std::system_error& e) {
    const std::lock_guard<std::mutex> lock(mutex);
    first = std::make_exception_ptr(Error(
        ErrorCode::out_of_memory, "checkpoint load: could only start " +
                                      std::to_string(pool.size() + 1) + " of " +
                                      std::to_string(threads) + " reader threads: " + e.what()));
  }
  if (!first) guarded(0);
  for (std::thread& t : pool) t.join();
  if (first) std::rethrow_exception(first);
}

// Reads the chunks on `threads` threads (at most bounces.size()), each taking the next one
// until none are left or one failed; progress (one caller at a time, the bytes done
// increasing) after each; an exception it throws ends the load as a failed read does. Reader
// i reads O_DIRECT files through bounces[i], which the load owns. `allocator` (when given)
// prepares each chunk's destination before its read: fresh pinned pages are faulted by the
// reader that fills them, in parallel with the other readers' I/O.
void read_chunks(const Checkpoint& c, const Files& files, const std::vector<Chunk>& chunks,
                 std::vector<Bounce>& bounces, const CheckpointLoadOptions& o, uint64_t* done_bytes,
                 uint64_t total, HostAllocator* allocator = nullptr) {
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  std::atomic<uint64_t> done{*done_bytes};
  std::mutex progress_mutex;
  const int n = static_cast<int>(std::min(bounces.size(), chunks.size()));
  run_readers(std::max(n, 1), [&](int reader) {
    Bounce& bounce = bounces[static_cast<size_t>(reader)];
    try {
      for (size_t i = next.fetch_add(1); i < chunks.size() && !failed; i = next.fetch_add(1)) {
        const Chunk& k = chunks[i];
        const std::string& path = c.files()[k.file].path;
        if (allocator != nullptr) allocator->prepare(k.dst, k.bytes);
        if (files.direct(k.file))
          pread_direct(files.fd(k.file), k.dst, k.bytes, k.offset, path, bounce);
        else
          pread_all(files.fd(k.file), k.dst, k.bytes, k.offset, path);
        if (o.progress) {
          // Counted under the lock, so the calls see `done` increase; once a reader failed
          // (or a call threw, marked before the lock is let go) no call follows.
          const std::lock_guard<std::mutex> lock(progress_mutex);
          if (failed) break;
          try {
            o.progress(done.fetch_add(k.bytes) + k.bytes, total);
          } catch (...) {
            failed = true;
            throw;
          }
        } else {
          done.fetch_add(k.bytes);
        }
      }
    } catch (...) {
      failed = true;
      throw;
    }
  });
  *done_bytes = done.load();
}

int thread_count(const CheckpointLoadOptions& o) {
  return o.threads > 0 ? o.threads : default_thread_count();
}

}  // namespace

namespace detail {

[[noreturn]] void hash_mismatch(const Checkpoint& c, const CheckpointTensor& t, uint64_t got) {
  throw Error(ErrorCode::io, "checkpoint file '" + c.files()[t.file].path + "': tensor '" +
                                 t.name.substr(0, 96) + "' fails its integrity check: xxh3-64 " +
                                 xxh3_hex(got) + " read, " + xxh3_hex(*t.xxh3) +
                                 " recorded (the file is corrupt)");
}

void verify_hashes(const Checkpoint& c, const CheckpointLoadOptions& o, size_t count,
                   const std::function<const CheckpointTensor&(size_t)>& tensor,
                   const std::function<uint64_t(size_t)>& digest, LoadReport& r) {
  if (!o.verify) return;
  enter_phase(o, "verify");
  const Stopwatch verify;
  std::atomic<size_t> unverified{0};
  parallel_for(
      count, 1,
      [&](size_t b, size_t e) {
        for (size_t i = b; i < e; ++i) {
          const CheckpointTensor& t = tensor(i);
          if (!t.xxh3) {
            ++unverified;
            continue;
          }
          const uint64_t got = digest(i);
          if (got != *t.xxh3) hash_mismatch(c, t, got);
        }
      },
      r.threads);
  r.verify_s = verify.seconds();
  r.unverified = unverified.load();
  r.verified = r.unverified == 0;
}

// verify asks every tensor to be checked: one without a recorded hash is an error before
// anything is read, unless verify_if_present.
void check_verifiable(const Checkpoint& c, const std::vector<const CheckpointTensor*>& tensors,
                      const CheckpointLoadOptions& o) {
  check_sidecar(c, o);  // a stale sidecar refuses a load that verifies, as the CLI's does
  if (!o.verify || o.verify_if_present) return;
  size_t unhashed = 0;
  const CheckpointTensor* first = nullptr;
  for (const CheckpointTensor* t : tensors)
    if (!t->xxh3) {
      ++unhashed;
      if (first == nullptr) first = t;
    }
  if (unhashed == 0) return;
  throw Error(ErrorCode::invalid_argument,
              "checkpoint '" + c.path() + "': verify cannot check " + std::to_string(unhashed) +
                  " of " + std::to_string(tensors.size()) +
                  " tensors, which have no recorded xxh3-64 hash (the first is '" +
                  first->name.substr(0, 96) +
                  "'); nothing was loaded. Record hashes for every tensor first with "
                  "`pinstage hash " +
                  c.path() +
                  "` (a sidecar file), or verify only the "
                  "tensors that have one with verify_if_present (Python verify=\"if-present\", CLI "
                  "--verify=if-present)");
}

}  // namespace detail

using detail::check_verifiable;
using detail::hash_mismatch;

namespace detail {

LoadReport read_ranges(const Checkpoint& c, const std::vector<FileRange>& ranges,
                       const CheckpointLoadOptions& o, HostAllocator* allocator) {
  check_load_options(o, false);
  const Stopwatch total;
  LoadReport r;
  r.files = c.files().size();
  r.threads = thread_count(o);
  r.chunk_bytes = o.chunk_bytes;
  std::vector<bool> wanted(c.files().size(), false);
  for (const FileRange& g : ranges) wanted[g.file] = true;
  const Files files(c, wanted, o.direct, r);
  std::vector<Chunk> chunks;
  for (const FileRange& g : ranges) {
    r.bytes += g.bytes;
    for (uint64_t off = 0; off < g.bytes; off += o.chunk_bytes)
      chunks.push_back({g.file, g.offset + off, std::min(o.chunk_bytes, g.bytes - off),
                        static_cast<unsigned char*>(g.dst) + off});
  }
  uint64_t done = 0;
  std::vector<Bounce> bounces(static_cast<size_t>(r.threads));
  const Stopwatch read;
  read_chunks(c, files, chunks, bounces, o, &done, r.bytes, allocator);
  r.read_s = read.seconds();
  r.total_s = total.seconds();
  return r;
}

CheckpointLoadOptions part_options(const CheckpointLoadOptions& o, const uint64_t* base,
                                   uint64_t total) {
  CheckpointLoadOptions p = o;
  p.verify = false;
  p.verify_if_present = false;
  p.progress = nullptr;
  if (o.progress)
    p.progress = [&o, base, total](uint64_t done, uint64_t) { o.progress(*base + done, total); };
  return p;
}

}  // namespace detail

namespace {

// read_checkpoint, with each chunk's destination prepared by `allocator` (when given).
LoadReport read_targets(const Checkpoint& c, const std::vector<ReadTarget>& targets,
                        const CheckpointLoadOptions& o, HostAllocator* allocator) {
  check_load_options(o, false);
  std::vector<const CheckpointTensor*> wanted;
  wanted.reserve(targets.size());
  for (const ReadTarget& t : targets) wanted.push_back(t.tensor);
  check_verifiable(c, wanted, o);
  const Stopwatch total;
  std::vector<detail::FileRange> ranges;
  ranges.reserve(targets.size());
  for (const ReadTarget& t : targets)
    ranges.push_back({t.tensor->file, t.tensor->offset, t.tensor->bytes, t.dst});
  detail::enter_phase(o, "read");
  LoadReport r = detail::read_ranges(c, ranges, o, allocator);
  r.tensors = targets.size();
  detail::verify_hashes(
      c, o, targets.size(), [&](size_t i) -> const CheckpointTensor& { return *targets[i].tensor; },
      [&](size_t i) { return xxh3_64(targets[i].dst, targets[i].tensor->bytes); }, r);
  r.total_s = total.seconds();
  return r;
}

}  // namespace

LoadReport read_checkpoint(const Checkpoint& c, const std::vector<ReadTarget>& targets,
                           const CheckpointLoadOptions& o) {
  return read_targets(c, targets, o, nullptr);
}

namespace detail {

HostLoad copy_to_host(const Checkpoint& c, const std::vector<const CheckpointTensor*>& tensors,
                      HostAllocator& allocator, const CheckpointLoadOptions& o) {
  check_load_options(o, false);
  check_verifiable(c, tensors, o);  // before any memory is taken
  const Stopwatch total;
  HostLoad out;
  std::vector<ReadTarget> targets;
  enter_phase(o, "allocate");
  const Stopwatch alloc;
  std::vector<size_t> sizes;
  sizes.reserve(tensors.size());
  for (const CheckpointTensor* t : tensors) sizes.push_back(static_cast<size_t>(t->bytes));
  allocator.reserve(sizes);  // one pinned segment for the lot, or a cache hit when warm
  out.tensors.reserve(tensors.size());
  targets.reserve(tensors.size());
  for (const CheckpointTensor* t : tensors) {
    out.tensors.push_back({*t, allocator.allocate(static_cast<size_t>(t->bytes))});
    targets.push_back({t, out.tensors.back().storage->data()});
  }
  const double alloc_s = alloc.seconds();
  try {
    out.report = read_targets(c, targets, o, &allocator);
  } catch (...) {
    allocator.abandon();  // a failed load's fresh memory is never pinned; it goes with `out`
    throw;
  }
  const Stopwatch pin;
  allocator.finish();  // fresh pinned pages are pinned behind the readers
  out.report.pin_s = pin.seconds();
  out.report.alloc_s = alloc_s;
  out.report.total_s = total.seconds();
  return out;
}

}  // namespace detail

HostLoad load_to_host(const Checkpoint& c, HostAllocator& allocator, const CheckpointLoadOptions& o,
                      const std::vector<std::string>* names) {
  if (o.mode != LoadMode::copy)
    throw Error(ErrorCode::invalid_argument,
                "load_to_host(checkpoint, allocator): map mode needs the worker that pins the "
                "mapping: call load_to_host(checkpoint, worker, options)");
  return detail::copy_to_host(c, detail::selected(c, names, "load_to_host"), allocator, o);
}

TaskArgs to_task_args(const HostLoad& load) {
  TaskArgs args;
  for (const HostTensor& t : load.tensors) {
    const std::optional<DType> dtype = parse_dtype(t.info.dtype);
    if (!dtype || t.info.dtype != dtype_safetensors_name(*dtype))
      throw Error(ErrorCode::invalid_argument,
                  "tensor '" + t.info.name + "' has the unknown dtype " + t.info.dtype);
    args.add(Tensor(t.info.name, *dtype, t.info.shape, Direction::in, t.storage));
  }
  return args;
}

namespace {

// One ring buffer's worth of a device load: consecutive bytes of one file, cut into the
// tensors they belong to.
struct Segment {
  size_t tensor;
  uint64_t tensor_offset;
  uint64_t bytes;
  uint64_t buffer_offset;
};
struct Piece {
  size_t file = 0;
  uint64_t file_offset = 0;
  uint64_t bytes = 0;
  std::vector<Segment> segments;
};

// The next piece from tensor *i at byte *off on: at most `room` consecutive bytes of one
// file.
Piece next_piece(const std::vector<CheckpointTensor>& tensors, size_t* i, uint64_t* off,
                 uint64_t room) {
  Piece p;
  while (*i < tensors.size() && tensors[*i].bytes == 0) ++*i;
  if (*i == tensors.size()) return p;
  p.file = tensors[*i].file;
  p.file_offset = tensors[*i].offset + *off;
  while (*i < tensors.size() && p.bytes < room) {
    const CheckpointTensor& t = tensors[*i];
    // One file, consecutive bytes: a selection of tensors may leave gaps between them.
    if (t.file != p.file || t.offset + *off != p.file_offset + p.bytes) break;
    const uint64_t take = std::min(room - p.bytes, t.bytes - *off);
    if (take > 0) p.segments.push_back({*i, *off, take, p.bytes});
    p.bytes += take;
    *off += take;
    if (*off == t.bytes) {
      ++*i;
      *off = 0;
    }
  }
  return p;
}

// Reads a piece into `buffer` split over the threads (pieces of 256 KiB at least).
void read_piece(const Checkpoint& c, const Files& files, const Piece& p, unsigned char* buffer,
                std::vector<Bounce>& bounces, const CheckpointLoadOptions& o, uint64_t* done,
                uint64_t total) {
  const auto threads = static_cast<uint64_t>(bounces.size());
  const uint64_t part = std::max<uint64_t>(
      std::min(o.chunk_bytes, (p.bytes + threads - 1) / threads), uint64_t{256} << 10);
  std::vector<Chunk> chunks;
  for (uint64_t off = 0; off < p.bytes; off += part)
    chunks.push_back({p.file, p.file_offset + off, std::min(part, p.bytes - off), buffer + off});
  read_chunks(c, files, chunks, bounces, o, done, total);
}

// Queues a piece's device copies. The ring's enqueue copies from the buffer's start, so
// the first segment goes last through it and records the buffer's event after all.
void upload_piece(Worker& worker, Stream& stream, StagingRing& ring, const Piece& p,
                  const unsigned char* buffer, std::vector<DeviceTensor>& out) {
  for (size_t s = 1; s < p.segments.size(); ++s) {
    const Segment& g = p.segments[s];
    worker.copy_to_device_async(out[g.tensor].buffer, g.tensor_offset, buffer + g.buffer_offset,
                                g.bytes, stream);
  }
  const Segment& first = p.segments.front();
  ring.enqueue_to_device(out[first.tensor].buffer, first.tensor_offset, first.bytes);
}

void check_hashes(const Checkpoint& c, const std::vector<CheckpointTensor>& tensors,
                  std::vector<Xxh3Stream>& hashes, LoadReport& r) {
  for (size_t i = 0; i < tensors.size(); ++i) {
    const CheckpointTensor& t = tensors[i];
    if (!t.xxh3) {
      ++r.unverified;
      continue;
    }
    const uint64_t got = t.bytes == 0 ? xxh3_64(nullptr, 0) : hashes[i].digest();
    if (got != *t.xxh3) hash_mismatch(c, t, got);
  }
  r.verified = r.unverified == 0;
}

// The check of what arrived: every hashed tensor read back from the device through the
// ring and hashed again, so a copy that damaged bytes on the way is caught too.
void check_device_hashes(const Checkpoint& c, StagingRing& ring,
                         const std::vector<DeviceTensor>& tensors, LoadReport& r) {
  for (size_t i = 0; i < tensors.size(); ++i) {
    const CheckpointTensor& t = tensors[i].info;
    if (!t.xxh3 || t.bytes == 0) continue;
    Xxh3Stream hash;
    ring.readback(tensors[i].buffer, 0, t.bytes,
                  [&](size_t, const void* data, size_t bytes) { hash.update(data, bytes); });
    ring.drain();
    r.verify_readback_bytes += t.bytes;
    const uint64_t got = hash.digest();
    if (got != *t.xxh3)
      throw Error(ErrorCode::io,
                  "checkpoint file '" + c.files()[t.file].path + "': tensor '" +
                      t.name.substr(0, 96) + "' arrived damaged on the device: xxh3-64 " +
                      xxh3_hex(got) + " read back, " + xxh3_hex(*t.xxh3) +
                      " recorded and read from the file (a device copy corrupted it)");
  }
}

// load_to_device of `tensors`: every tensor of the checkpoint, or a selection of them, in
// checkpoint order.
DeviceLoad load_selected(const Checkpoint& c, const std::vector<CheckpointTensor>& tensors,
                         Worker& worker, const CheckpointLoadOptions& o) {
  check_load_options(o, true);
  require_chip_worker(worker, "load_to_device");
  std::string map_note;  // map mode, a file the backend would not pin: the ring copies
  if (o.mode == LoadMode::map)
    if (std::optional<DeviceLoad> mapped = detail::map_to_device(c, tensors, worker, o, &map_note))
      return std::move(*mapped);
  const Stopwatch total;
  DeviceLoad out;
  LoadReport& r = out.report;
  r.mode = load_mode_name(o.mode);
  r.map_note = map_note;
  r.files = c.files().size();
  r.threads = thread_count(o);
  r.chunk_bytes = o.chunk_bytes;
  r.tensors = tensors.size();
  std::vector<const CheckpointTensor*> wanted;
  wanted.reserve(tensors.size());
  for (const CheckpointTensor& t : tensors) {
    wanted.push_back(&t);
    r.bytes += t.bytes;
  }
  check_verifiable(c, wanted, o);
  const Files files(c, files_of(c, wanted), o.direct, r);
  std::vector<Bounce> bounces(static_cast<size_t>(r.threads));
  detail::enter_phase(o, "allocate");
  const Stopwatch alloc;
  for (const CheckpointTensor& t : tensors)
    out.tensors.push_back({t, t.bytes > 0 ? worker.alloc_device(t.bytes) : DeviceBuffer{}});
  // Declared after the tensors: on an error the ring drains its copies before they go.
  Stream stream = worker.create_stream();
  StagingRing ring(worker, stream, o.ring_buffers, o.ring_bytes / o.ring_buffers, 1);
  r.alloc_s = alloc.seconds();
  r.ring_pinned_bytes = ring.pinned_bytes();
  r.peak_pinned_bytes = worker.stats().pinned_bytes;
  std::vector<Xxh3Stream> hashes(o.verify ? tensors.size() : 0);
  size_t i = 0;
  uint64_t off = 0;
  uint64_t done = 0;
  double overlapped_read_s = 0;
  size_t queued = 0;  // pieces whose copies may still run
  detail::enter_phase(o, "read+upload");
  for (Piece p = next_piece(tensors, &i, &off, ring.buffer_bytes()); p.bytes > 0;
       p = next_piece(tensors, &i, &off, ring.buffer_bytes())) {
    Stopwatch phase;
    auto* buffer = static_cast<unsigned char*>(ring.advance());
    r.upload_s += phase.restart();
    read_piece(c, files, p, buffer, bounces, o, &done, r.bytes);
    const double read_s = phase.restart();
    r.read_s += read_s;
    if (queued > 0) overlapped_read_s += read_s;
    for (const Segment& g : p.segments)
      if (o.verify) hashes[g.tensor].update(buffer + g.buffer_offset, g.bytes);
    r.verify_s += phase.restart();
    upload_piece(worker, stream, ring, p, buffer, out.tensors);
    r.upload_s += phase.seconds();
    ++queued;
  }
  const Stopwatch drain;
  ring.drain();
  r.upload_s += drain.seconds();
  r.overlap = r.read_s > 0 ? overlapped_read_s / r.read_s : 0;
  if (o.verify) {
    detail::enter_phase(o, "verify");
    const Stopwatch verify;
    check_hashes(c, tensors, hashes, r);
    check_device_hashes(c, ring, out.tensors, r);
    r.verify_s += verify.seconds();
  }
  r.total_s = total.seconds();
  return out;
}

}  // namespace

DeviceLoad load_to_device(const Checkpoint& c, Worker& worker, const CheckpointLoadOptions& o) {
  if (o.cache != CacheUse::off) return detail::load_device_through_cache(c, worker, o, nullptr);
  return detail::with_first_touch(worker, [&] { return load_selected(c, c.tensors(), worker, o); });
}

DeviceLoad load_to_device(const Checkpoint& c, Worker& worker, const CheckpointLoadOptions& o,
                          const std::vector<std::string>& names) {
  if (o.cache != CacheUse::off) return detail::load_device_through_cache(c, worker, o, &names);
  return detail::with_first_touch(worker, [&] {
    return load_selected(c, detail::select_tensors(c, names, "load_to_device"), worker, o);
  });
}

namespace detail {

namespace {

// Which of the checkpoint's tensors `names` choose, by place: Error(not_found) for a name
// the checkpoint lacks, Error(invalid_argument) (starting with `who`) for one given twice.
std::vector<bool> chosen_places(const Checkpoint& c, const std::vector<std::string>& names,
                                const char* who) {
  std::vector<bool> chosen(c.tensors().size(), false);
  for (const std::string& name : names) {
    const CheckpointTensor& t = c.get(name);  // Error(not_found) naming it
    const auto index = static_cast<size_t>(&t - c.tensors().data());
    if (chosen[index])
      throw Error(ErrorCode::invalid_argument,
                  std::string(who) + ": tensor '" + name.substr(0, 96) + "' is named twice");
    chosen[index] = true;
  }
  return chosen;
}

}  // namespace

std::vector<CheckpointTensor> select_tensors(const Checkpoint& c,
                                             const std::vector<std::string>& names,
                                             const char* who) {
  const std::vector<bool> chosen = chosen_places(c, names, who);
  std::vector<CheckpointTensor> tensors;
  tensors.reserve(names.size());
  for (size_t i = 0; i < chosen.size(); ++i)
    if (chosen[i]) tensors.push_back(c.tensors()[i]);
  return tensors;
}

std::vector<const CheckpointTensor*> selected(const Checkpoint& c,
                                              const std::vector<std::string>* names,
                                              const char* who) {
  std::vector<const CheckpointTensor*> out;
  out.reserve(names == nullptr ? c.tensors().size() : names->size());
  const std::vector<bool> chosen = names == nullptr ? std::vector<bool>(c.tensors().size(), true)
                                                    : chosen_places(c, *names, who);
  for (size_t i = 0; i < chosen.size(); ++i)
    if (chosen[i]) out.push_back(&c.tensors()[i]);
  return out;
}

}  // namespace detail

}  // namespace pinstage
