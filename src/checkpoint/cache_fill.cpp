// The restart cache's lookup and fill (docs/cache.md, "The lifecycle").
//
// Note [Cache fill]
// ~~~~~~~~~~~~~~~~~
// A fill holds the flock on <key>.lock from its lookup to its rename, so two fillers of one
// checkpoint make one entry: the second waits, looks up again and finds a hit. It copies
// into a temporary directory ".<key>.tmp.<pid>.<rand>" that no reader ever opens, then
// renames it to <key> in one step (renameat2: RENAME_NOREPLACE, or RENAME_EXCHANGE with a
// stale entry, which is then removed), so a reader sees the whole entry or none. Each file
// is reserved first (fallocate: a full tmpfs or huge-page reservation is ENOSPC now, not a
// SIGBUS in the middle of a copy through the mapping), then written through a shared
// mapping made by the provider's shared_named source: hugetlbfs takes no write(), and the
// pages land on the filler's NUMA node by its memory policy. A fill that fails, or a
// filler killed mid-fill, leaves only the temporary, which no lookup reads: the fill
// removes it on error; after SIGKILL, the next fill of the key or prune() does (its lock is
// free: no filler is alive).
#include <fcntl.h>
#include <linux/fs.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <nlohmann/json.hpp>

#include "checkpoint/cache_internal.h"
#include "pinstage/error.h"
#include "pinstage/pages.h"
#include "pinstage/parallel.h"
#include "pinstage/safetensors.h"
#include "runtime/host_memory/host_source.h"
#include "runtime/host_memory/placement.h"

namespace pinstage {

namespace {

using detail::Manifest;
using detail::ManifestFile;

std::string key_of_real(const std::string& real) {
  return xxh3_hex(xxh3_64(real.data(), real.size()));
}

// Why the entry open as `entry` is not what `want` (the manifest a fill of the source
// would record) describes, or "".
std::string stale_reason(const Manifest& want, int entry) {
  struct stat st {};
  if (::fstat(entry, &st) != 0 || st.st_uid != ::geteuid() || (st.st_mode & 077) != 0)
    return "the entry is not a private directory of this user";
  std::string why;
  const std::optional<Manifest> have = detail::read_manifest(entry, &why);
  if (!have) return "the entry is damaged: " + why;
  if (have->source != want.source)
    return "the entry was filled from '" + have->source + "', not this checkpoint";
  std::string changed = detail::source_change(*have);  // the likeliest: name the file
  if (!changed.empty()) return changed;
  bool same =
      have->files.size() == want.files.size() && have->tensors.size() == want.tensors.size();
  for (size_t i = 0; same && i < want.files.size(); ++i)
    same = have->files[i].name == want.files[i].name;
  for (size_t i = 0; same && i < want.tensors.size(); ++i) {
    const CheckpointTensor& a = have->tensors[i];
    const CheckpointTensor& b = want.tensors[i];
    same = a.name == b.name && a.dtype == b.dtype && a.shape == b.shape && a.file == b.file &&
           a.offset == b.offset && a.bytes == b.bytes && (!b.xxh3 || a.xxh3 == b.xxh3);
  }
  if (!same) return "the source's files or tensor layout differ from the entry's";
  changed = detail::entry_damage(*have, entry);
  return changed.empty() ? "" : "the entry is damaged: " + changed;
}

// Where a fill writes: the temporary entry open as `dir`, the cache's path (for messages) and
// the placement of the entry's pages (its NUMA node, or none: the filler's own policy).
struct FillTarget {
  int dir = -1;
  std::string cache;
  runtime::HostPlacement placement;
};

// A file made in the temporary entry: `bytes` reserved, then mapped shared and writable by
// the shared_named source until destruction.
class EntryFile {
 public:
  EntryFile(const FillTarget& to, const std::string& name, uint64_t bytes)
      : fd_(::openat(to.dir, name.c_str(), O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC,
                     0600)) {
    if (fd_.get() < 0)
      throw Error(ErrorCode::io, "cannot create '" + name +
                                     "' in the cache's temporary entry: " + std::strerror(errno));
    if (bytes == 0) return;
    if (::fallocate(fd_.get(), 0, 0, static_cast<off_t>(bytes)) != 0) {
      const int err = errno;
      throw Error(err == ENOSPC || err == ENOMEM || err == EDQUOT ? ErrorCode::out_of_memory
                                                                  : ErrorCode::io,
                  "the cache directory '" + to.cache + "' has no room for '" + name + "' (" +
                      std::to_string(bytes) + " bytes): " + std::strerror(err) +
                      "; nothing was kept. Free room with `pinstage cache prune --max-bytes N` "
                      "or `pinstage cache rm`, or grow the tmpfs (mount -o remount,size=) or "
                      "the huge-page reservation (vm.nr_hugepages)");
    }
    source_ = runtime::make_source(runtime::SourceKind::shared_named, to.placement, api(), nullptr);
    seg_ = source_->make({static_cast<size_t>(bytes), false, fd_.get(), "'" + name + "'"});
  }
  ~EntryFile() {
    if (source_ && seg_.data != nullptr) (void)source_->release(seg_.allocation(), nullptr);
  }
  EntryFile(const EntryFile&) = delete;
  EntryFile& operator=(const EntryFile&) = delete;
  unsigned char* data() const noexcept { return static_cast<unsigned char*>(seg_.data); }

 private:
  static const ps_platform_api& api() {
    static const ps_platform_api kNone{};
    return kNone;
  }
  UniqueFd fd_;
  std::unique_ptr<runtime::HostSource> source_;
  runtime::HostSegment seg_;
};

// The bytes copied so far over every file, reported one call at a time.
struct FillProgress {
  explicit FillProgress(const CacheFillOptions& o) : options(o) {}
  const CacheFillOptions& options;
  uint64_t total = 0;
  uint64_t done = 0;
  std::mutex mu;
  void add(uint64_t bytes) {
    if (!options.progress) return;
    std::lock_guard lock(mu);
    done += bytes;
    options.progress(done, total);
  }
};

// Copies the source file `f` into the temporary entry `tmp`, recording its identity as
// opened; a file that changes while it is copied is refused.
void copy_file(ManifestFile& f, uint64_t want_size, const FillTarget& to, FillProgress& progress,
               int threads) {
  std::string why;
  const UniqueFd src(open_regular_file(f.source, 0, &why));
  struct stat before {
  }, after{};
  if (src.get() < 0 || ::fstat(src.get(), &before) != 0)
    throw Error(ErrorCode::io, "cannot fill the cache from '" + f.source +
                                   "': " + (why.empty() ? std::strerror(errno) : why));
  f = detail::identity_of(before, f.name, f.source);
  if (f.size != want_size)
    throw Error(ErrorCode::io, "cannot fill the cache from '" + f.source + "': it has " +
                                   std::to_string(f.size) + " bytes, " + std::to_string(want_size) +
                                   " when the checkpoint was opened: open it again");
  const EntryFile out(to, f.name, f.size);
  constexpr uint64_t kPiece = uint64_t{16} << 20;
  const size_t pieces = static_cast<size_t>((f.size + kPiece - 1) / kPiece);
  parallel_for(
      pieces, 1,
      [&](size_t b, size_t e) {
        for (size_t i = b; i < e; ++i) {
          const uint64_t off = i * kPiece, n = std::min(kPiece, f.size - off);
          if (pread_full(src.get(), out.data() + off, n, off) != n)
            throw Error(ErrorCode::io, "cannot fill the cache from '" + f.source + "': " +
                                           (errno == 0 ? std::string("it shrank while copied")
                                                       : std::strerror(errno)));
          progress.add(n);
        }
      },
      threads);
  if (::fstat(src.get(), &after) != 0 ||
      detail::identity_of(after, f.name, f.source).mtime_ns != f.mtime_ns ||
      after.st_size != before.st_size)
    throw Error(ErrorCode::io, "cannot fill the cache from '" + f.source +
                                   "': it changed while it was copied; nothing was kept");
}

// Writes `text` as `name` into the temporary entry (through a mapping: hugetlbfs takes no
// write()).
void put_text(const FillTarget& to, const std::string& name, const std::string& text) {
  const EntryFile out(to, name, text.size());
  std::memcpy(out.data(), text.data(), text.size());
}

// The hash sidecar of the entry, when the source's hashes came (partly) from one: the
// source's hashes, so that verify on a hit checks the entry's bytes against them. Without
// "files" (an entry never changes in place).
void put_sidecar(const Checkpoint& source, const Manifest& m, const FillTarget& to) {
  std::error_code ec;
  if (!source.sidecar_problem().empty() ||
      !std::filesystem::exists(hash_sidecar_path(source.path()), ec))
    return;
  nlohmann::ordered_json list = nlohmann::ordered_json::object();
  for (const CheckpointTensor& t : m.tensors)
    if (t.xxh3)
      list[t.name] = {{"file", m.files[t.file].name},
                      {"offset", t.offset},
                      {"bytes", t.bytes},
                      {"xxh3", xxh3_hex(*t.xxh3)}};
  const nlohmann::ordered_json doc = {{"format", "pinstage.xxh3/1"}, {"tensors", list}};
  const std::string name =
      m.open_name.empty() ? std::string(kHashSidecarName) : m.open_name + "." + kHashSidecarName;
  put_text(to, name, doc.dump(1) + "\n");
}

}  // namespace

CacheLookup WeightCache::lookup(const Checkpoint& source) const {
  const Manifest want = detail::manifest_of(source);
  CacheLookup out;
  out.key = key_of_real(want.source);
  out.state = "miss";
  const UniqueFd entry(
      ::openat(dir_.get(), out.key.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (entry.get() < 0) {
    if (errno == ENOENT) return out;
    out.state = "stale";
    out.reason = std::string("the entry cannot be opened: ") + std::strerror(errno);
    return out;
  }
  out.reason = stale_reason(want, entry.get());
  if (!out.reason.empty()) {
    out.state = "stale";
    return out;
  }
  out.state = "hit";
  out.entry_path = path_ + "/" + out.key + (want.open_name.empty() ? "" : "/" + want.open_name);
  const struct timespec used[2] = {{0, UTIME_NOW}, {0, UTIME_OMIT}};  // last use: its atime
  (void)::utimensat(dir_.get(), out.key.c_str(), used, AT_SYMLINK_NOFOLLOW);
  return out;
}

namespace {

// Error(out_of_memory) before anything is written when the entry cannot fit the file
// system's free space (whole pages of it) or the cache's limit.
void check_room(const CacheDirInfo& info, int dir, const Manifest& m, const std::string& key,
                uint64_t max_bytes) {
  uint64_t need = 0;
  for (const ManifestFile& f : m.files)
    need += (f.size + info.page_bytes - 1) / info.page_bytes * info.page_bytes;
  if (need > info.free_bytes)
    throw Error(ErrorCode::out_of_memory,
                "the cache directory '" + info.path + "' (" + info.fs + ") has " +
                    std::to_string(info.free_bytes) + " bytes free, and the entry of '" + m.source +
                    "' needs " + std::to_string(need) +
                    "; nothing was written. Free room with `pinstage cache prune --max-bytes N` or "
                    "`pinstage cache rm`, or grow the tmpfs or the huge-page reservation");
  const uint64_t replaced = detail::bytes_at(dir, key);  // a stale entry the fill replaces
  if (max_bytes > 0 && info.used_bytes - replaced + need > max_bytes)
    throw Error(ErrorCode::out_of_memory,
                "filling the cache with '" + m.source + "' (" + std::to_string(need) +
                    " bytes) would take it past its limit of " + std::to_string(max_bytes) +
                    " bytes (it holds " + std::to_string(info.used_bytes - replaced) +
                    "); nothing was written. Prune it (`pinstage cache prune --max-bytes N`) or "
                    "raise the limit");
}

// Renames the temporary `tmp` to `key` in one step: RENAME_NOREPLACE, or, over a stale
// entry, RENAME_EXCHANGE and the old one (now named `tmp`) removed.
void publish(int dir, const std::string& tmp, const std::string& key) {
  if (::renameat2(dir, tmp.c_str(), dir, key.c_str(), RENAME_NOREPLACE) == 0) return;
  if (errno != EEXIST || ::renameat2(dir, tmp.c_str(), dir, key.c_str(), RENAME_EXCHANGE) != 0)
    throw Error(ErrorCode::io,
                "cannot publish the cache entry " + key + ": " + std::strerror(errno));
  detail::remove_at(dir, tmp, "the stale entry " + key);
}

}  // namespace

CacheLookup WeightCache::fill(const Checkpoint& source, const CacheFillOptions& options) {
  if (options.numa_node < -1)
    throw Error(ErrorCode::invalid_argument, "fill: numa_node " +
                                                 std::to_string(options.numa_node) +
                                                 " is not a node (-1: the filler's own policy)");
  Manifest m = detail::manifest_of(source);
  const std::string key = key_of_real(m.source);
  const UniqueFd lock = detail::lock_cache_key(dir_.get(), key, true);
  CacheLookup now = lookup(source);
  if (now.state == "hit") return now;  // another filler made it while we waited
  for (const std::string& name : detail::names_in(dir_.get(), "cache directory '" + path_ + "'"))
    if (detail::cache_temp_key(name) == key) detail::remove_at(dir_.get(), name, name);
  check_room(info(), dir_.get(), m, key, options.max_bytes);
  const std::string tmp = detail::cache_temp_name(key);
  if (::mkdirat(dir_.get(), tmp.c_str(), 0700) != 0)
    throw Error(ErrorCode::io,
                "cannot make a temporary entry in '" + path_ + "': " + std::strerror(errno));
  try {
    const UniqueFd dir(
        ::openat(dir_.get(), tmp.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (dir.get() < 0)
      throw Error(ErrorCode::io, "cannot open '" + tmp + "': " + std::strerror(errno));
    FillTarget to{dir.get(), path_, {}};
    to.placement.numa_node = options.numa_node;
    FillProgress progress(options);
    for (const ManifestFile& f : m.files) progress.total += f.size;
    for (ManifestFile& f : m.files)  // its size as the checkpoint was opened
      copy_file(f, f.size, to, progress, options.threads);
    put_sidecar(source, m, to);
    put_text(to, kCacheManifestName, detail::manifest_json(m));
    publish(dir_.get(), tmp, key);
  } catch (...) {
    try {
      detail::remove_at(dir_.get(), tmp, tmp);
    } catch (...) {  // the first error is the one to report; prune removes the rest
    }
    throw;
  }
  now = lookup(source);
  if (now.state != "hit")
    throw Error(ErrorCode::io,
                "the cache entry of '" + m.source + "' was filled but " + now.reason);
  now.state = "filled";
  return now;
}

}  // namespace pinstage
