// The restart cache (docs/cache.md, include/pinstage/cache.h): the directory, its checks and
// what it holds; the manifest is in cache_manifest.cpp, lookup and fill in cache_fill.cpp.
//
// Note [Cache directory]
// ~~~~~~~~~~~~~~~~~~~~~~
// Weights in a shared directory are code an attacker could plant, and data another user
// should not read. So the directory is opened once (O_DIRECTORY | O_NOFOLLOW) and checked on
// its descriptor: owned by the effective user, no group or other bit, on hugetlbfs or
// tmpfs. Every later step is relative to that descriptor (openat, renameat2, unlinkat,
// O_NOFOLLOW), so a path swapped after the check is never followed. Root passes permission
// checks, so the owner check is what keeps root's cache out of a directory another user
// made. Entries, temporaries and lock files are made 0700 / 0600 inside it.
#include "pinstage/cache.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/magic.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <string>

#include "checkpoint/cache_internal.h"
#include "pinstage/error.h"
#include "pinstage/pages.h"
#include "pinstage/safetensors.h"
#include "pinstage/settings.h"

namespace pinstage {

const char* cache_use_name(CacheUse use) {
  switch (use) {
    case CacheUse::use:
      return "use";
    case CacheUse::fill:
      return "fill";
    case CacheUse::off:
      break;
  }
  return "off";
}

CacheUse parse_cache_use(std::string_view name) {
  std::string lower(name);
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
  for (CacheUse u : {CacheUse::off, CacheUse::use, CacheUse::fill})
    if (lower == cache_use_name(u)) return u;
  throw Error(ErrorCode::invalid_argument, "unknown cache use '" + std::string(name.substr(0, 64)) +
                                               "' (valid: off, use, fill)");
}

std::string default_cache_dir() {
  if (std::optional<std::string> dir = setting_cache_dir()) return *dir;
  return "/dev/shm/pinstage-" + std::to_string(::geteuid());
}

std::string cache_key(const std::string& path) {
  char real[PATH_MAX];
  if (::realpath(path.c_str(), real) == nullptr)
    throw Error(ErrorCode::io, "cannot find checkpoint '" + path + "': " + std::strerror(errno));
  const std::string r(real);
  return xxh3_hex(xxh3_64(r.data(), r.size()));
}

namespace detail {

bool is_cache_key(std::string_view name) noexcept {
  return name.size() == 16 && std::all_of(name.begin(), name.end(), [](char c) {
           return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
         });
}

std::optional<std::string> cache_temp_key(std::string_view name) {
  if (name.size() < 22 || name[0] != '.' || name.substr(17, 5) != ".tmp.") return std::nullopt;
  const std::string_view key = name.substr(1, 16);
  return is_cache_key(key) ? std::optional<std::string>(key) : std::nullopt;
}

std::optional<std::string> cache_lock_key(std::string_view name) {
  if (name.size() != 21 || !name.ends_with(".lock") || !is_cache_key(name.substr(0, 16)))
    return std::nullopt;
  return std::string(name.substr(0, 16));
}

std::string cache_temp_name(const std::string& key) {
  std::random_device rd;
  char tail[32];
  std::snprintf(tail, sizeof tail, "%08x%08x", rd(), rd());
  return "." + key + ".tmp." + std::to_string(::getpid()) + "." + tail;
}

std::vector<std::string> names_in(int dir, const std::string& what) {
  const int fd = ::openat(dir, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  DIR* d = fd >= 0 ? ::fdopendir(fd) : nullptr;
  if (d == nullptr) {
    const int err = errno;
    if (fd >= 0) ::close(fd);
    throw Error(ErrorCode::io, "cannot list " + what + ": " + std::strerror(err));
  }
  std::vector<std::string> names;
  while (const dirent* e = ::readdir(d)) {
    const std::string_view n = e->d_name;
    if (n != "." && n != "..") names.emplace_back(n);
  }
  ::closedir(d);
  std::sort(names.begin(), names.end());
  return names;
}

bool remove_at(int dir, const std::string& name, const std::string& what) {
  struct stat st {};
  if (::fstatat(dir, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
    if (errno == ENOENT) return false;
    throw Error(ErrorCode::io, "cannot remove " + what + ": " + std::strerror(errno));
  }
  if (S_ISDIR(st.st_mode)) {
    const UniqueFd sub(
        ::openat(dir, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (sub.get() < 0)
      throw Error(ErrorCode::io, "cannot remove " + what + ": " + std::strerror(errno));
    for (const std::string& child : names_in(sub.get(), what))
      remove_at(sub.get(), child, what + "/" + child);
  }
  if (::unlinkat(dir, name.c_str(), S_ISDIR(st.st_mode) ? AT_REMOVEDIR : 0) != 0 && errno != ENOENT)
    throw Error(ErrorCode::io, "cannot remove " + what + ": " + std::strerror(errno));
  return true;
}

uint64_t bytes_at(int dir, const std::string& name) {
  struct stat st {};
  if (::fstatat(dir, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) return 0;
  if (S_ISREG(st.st_mode)) return static_cast<uint64_t>(st.st_size);
  if (!S_ISDIR(st.st_mode)) return 0;
  const UniqueFd sub(::openat(dir, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (sub.get() < 0) return 0;
  uint64_t bytes = 0;
  for (const std::string& child : names_in(sub.get(), name)) {
    struct stat c {};
    if (::fstatat(sub.get(), child.c_str(), &c, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(c.st_mode))
      bytes += static_cast<uint64_t>(c.st_size);
  }
  return bytes;
}

UniqueFd lock_cache_key(int dir, const std::string& key, bool wait) {
  const std::string name = key + ".lock";
  for (;;) {
    UniqueFd fd(::openat(dir, name.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600));
    if (fd.get() < 0)
      throw Error(ErrorCode::io,
                  "cannot open the cache's lock file '" + name + "': " + std::strerror(errno));
    int rc = 0;
    while ((rc = ::flock(fd.get(), wait ? LOCK_EX : LOCK_EX | LOCK_NB)) != 0 && errno == EINTR) {
    }
    if (rc != 0) {
      if (errno == EWOULDBLOCK) return UniqueFd();
      throw Error(ErrorCode::io, "cannot lock '" + name + "': " + std::strerror(errno));
    }
    struct stat held {
    }, named{};
    if (::fstat(fd.get(), &held) == 0 &&
        ::fstatat(dir, name.c_str(), &named, AT_SYMLINK_NOFOLLOW) == 0 &&
        held.st_ino == named.st_ino && held.st_dev == named.st_dev)
      return fd;
    // Removed (prune) between our open and our lock: lock the file that is there now.
  }
}

}  // namespace detail

namespace {

[[noreturn]] void refuse(const std::string& dir, const std::string& why) {
  throw Error(ErrorCode::invalid_argument, "cache directory '" + dir + "' " + why);
}

std::string fs_name(int64_t magic) {
  switch (magic) {
    case HUGETLBFS_MAGIC:
      return "hugetlbfs";
    case TMPFS_MAGIC:
      return "tmpfs";
    case EXT4_SUPER_MAGIC:
      return "ext4";
    case XFS_SUPER_MAGIC:
      return "xfs";
    case BTRFS_SUPER_MAGIC:
      return "btrfs";
    case OVERLAYFS_SUPER_MAGIC:
      return "overlayfs";
    case NFS_SUPER_MAGIC:
      return "nfs";
    default:
      break;
  }
  char hex[32];
  std::snprintf(hex, sizeof hex, "file system 0x%llx", static_cast<unsigned long long>(magic));
  return hex;
}

// A number in a file of /sys/kernel/mm/hugepages/hugepages-<size>kB, or 0.
uint64_t huge_pool_value(uint64_t page_bytes, const char* name) {
  const std::string path =
      "/sys/kernel/mm/hugepages/hugepages-" + std::to_string(page_bytes >> 10) + "kB/" + name;
  FILE* f = std::fopen(path.c_str(), "r");
  unsigned long long v = 0;
  if (f == nullptr) return 0;
  if (std::fscanf(f, "%llu", &v) != 1) v = 0;
  std::fclose(f);
  return v;
}

// Bytes of the huge-page pool of `page_bytes` pages that nobody has reserved.
uint64_t huge_pool_free(uint64_t page_bytes) {
  const uint64_t free = huge_pool_value(page_bytes, "free_hugepages");
  const uint64_t reserved = huge_pool_value(page_bytes, "resv_hugepages");
  return (free > reserved ? free - reserved : 0) * page_bytes;
}

// The whole text of a /proc or /sys file (their size reads 0, so no sized read), "" when
// it cannot be read.
std::string proc_text(const char* path) {
  std::ifstream in(path);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// CacheDirInfo::huge of the tmpfs directory open as `dir` at `path`.
std::string huge_of(int dir, const std::string& path) {
  struct stat st {};
  if (::fstat(dir, &st) != 0) return "unknown";
  const std::optional<detail::MountLine> mount =
      detail::mount_of(proc_text("/proc/self/mountinfo"), st.st_dev, path);
  if (!mount || mount->fs_type != "tmpfs") return "unknown";
  return detail::tmpfs_huge(mount->super_options,
                            proc_text("/sys/kernel/mm/transparent_hugepage/shmem_enabled"));
}

// The checks of Note [Cache directory] on the opened directory.
void check_dir(int fd, const std::string& path) {
  struct stat st {};
  if (::fstat(fd, &st) != 0)
    throw Error(ErrorCode::io,
                "cannot stat cache directory '" + path + "': " + std::strerror(errno));
  const uid_t me = ::geteuid();
  if (st.st_uid != me)
    refuse(path, "belongs to uid " + std::to_string(st.st_uid) + ", not to you (uid " +
                     std::to_string(me) +
                     "): another user could read or plant weights there; point "
                     "PINSTAGE_CACHE_DIR at a directory of your own (or, if it is yours, chown " +
                     std::to_string(me) + " '" + path + "')");
  if ((st.st_mode & 077) != 0) {
    char mode[8];
    std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(st.st_mode & 07777));
    refuse(path, std::string("has mode ") + mode + ": " +
                     ((st.st_mode & 022) != 0 ? "another user could plant weights there"
                                              : "another user could read the weights") +
                     "; run chmod 700 '" + path + "'");
  }
  struct statfs sf {};
  if (::fstatfs(fd, &sf) != 0)
    throw Error(ErrorCode::io,
                "cannot statfs cache directory '" + path + "': " + std::strerror(errno));
  if (sf.f_type != HUGETLBFS_MAGIC && sf.f_type != TMPFS_MAGIC)
    refuse(path, "is on " + fs_name(sf.f_type) +
                     ", neither hugetlbfs nor tmpfs: an entry there is one more copy on disk that "
                     "the page cache can drop; point PINSTAGE_CACHE_DIR at a hugetlbfs mount or "
                     "under /dev/shm");
}

}  // namespace

WeightCache WeightCache::open(std::optional<std::string> dir) {
  std::string path = dir ? std::move(*dir) : default_cache_dir();
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  if (path.empty() || path.front() != '/')
    throw Error(ErrorCode::invalid_argument,
                "cache directory '" + path + "' is not an absolute path: give one");
  if (::mkdir(path.c_str(), 0700) != 0 && errno != EEXIST)
    throw Error(ErrorCode::io, "cannot create cache directory '" + path +
                                   "': " + std::strerror(errno) +
                                   " (make its parent, or set PINSTAGE_CACHE_DIR elsewhere)");
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (fd.get() < 0) {
    if (errno == ELOOP || errno == ENOTDIR) {
      struct stat st {};
      const bool link = ::lstat(path.c_str(), &st) == 0 && S_ISLNK(st.st_mode);
      refuse(path, link ? "is a symbolic link: the cache is never reached through one (another "
                          "user could point it at their files); remove it, or name the real "
                          "directory"
                        : "is not a directory: remove it, or set PINSTAGE_CACHE_DIR elsewhere");
    }
    throw Error(ErrorCode::io,
                "cannot open cache directory '" + path + "': " + std::strerror(errno));
  }
  check_dir(fd.get(), path);
  return WeightCache(std::move(fd), std::move(path));
}

CacheDirInfo WeightCache::info() const {
  struct statfs sf {};
  if (::fstatfs(dir_.get(), &sf) != 0)
    throw Error(ErrorCode::io,
                "cannot statfs cache directory '" + path_ + "': " + std::strerror(errno));
  CacheDirInfo info;
  info.path = path_;
  info.fs = fs_name(sf.f_type);
  info.page_bytes = file_page_bytes(dir_.get());
  info.huge = sf.f_type == HUGETLBFS_MAGIC ? "hugetlbfs" : huge_of(dir_.get(), path_);
  info.free_bytes = static_cast<uint64_t>(sf.f_bavail) * static_cast<uint64_t>(sf.f_bsize);
  if (sf.f_type == HUGETLBFS_MAGIC) {  // the pool bounds it; without size= it alone does
    const uint64_t pool = huge_pool_free(info.page_bytes);
    info.free_bytes = sf.f_blocks > 0 ? std::min(info.free_bytes, pool) : pool;
  }
  for (const std::string& name : detail::names_in(dir_.get(), "cache directory '" + path_ + "'")) {
    if (detail::is_cache_key(name)) ++info.entries;
    if (detail::is_cache_key(name) || detail::cache_temp_key(name))
      info.used_bytes += detail::bytes_at(dir_.get(), name);
  }
  return info;
}

ReportFields report_fields(const CacheDirInfo& i) {
  return {{"path", i.path},
          {"fs", i.fs},
          {"page_bytes", i.page_bytes},
          {"huge", i.huge},
          {"free_bytes", i.free_bytes},
          {"used_bytes", i.used_bytes},
          {"entries", report_value(i.entries)}};
}

ReportFields report_fields(const CacheLookup& l) {
  return {{"state", l.state}, {"key", l.key}, {"entry_path", l.entry_path}, {"reason", l.reason}};
}

ReportFields report_fields(const CachePruneReport& r) {
  return {{"temps", report_value(r.temps)},
          {"stale", report_value(r.stale)},
          {"evicted", report_value(r.evicted)},
          {"freed_bytes", r.freed_bytes},
          {"removed", r.removed}};
}

ReportFields report_fields(const CacheEntryInfo& e) {
  return {{"key", e.key},     {"source", e.source},
          {"bytes", e.bytes}, {"last_use_ns", e.last_use_ns},
          {"state", e.state}, {"reason", e.reason}};
}

}  // namespace pinstage
