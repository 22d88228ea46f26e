// The restart cache (docs/cache.md): a checkpoint's own bytes kept in a directory on
// hugetlbfs or tmpfs, which outlives every process and survives the page cache's reclaim,
// so that a restarted process maps its weights (map mode, pinned in place) instead of
// reading the disk again. An entry is a valid checkpoint any loader can read, published
// atomically, with a manifest of its source's identity; a changed source makes it "stale",
// never used. Every step is relative to the opened directory (openat, O_NOFOLLOW), which
// must belong to the user with mode 0700: another user can neither read nor plant weights.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "pinstage/export.h"
#include "pinstage/files.h"
#include "pinstage/report.h"

namespace pinstage {

class Checkpoint;

// How a load uses the cache (CheckpointLoadOptions::cache).
//  off:  the cache is not looked at.
//  use:  a hit loads from the entry; a miss or a stale entry loads from the source (and the
//        report says "miss" / "stale"); nothing is written.
//  fill: as use, but a miss or a stale entry is filled (WeightCache::fill) first and the
//        load then reads the entry ("filled").
enum class CacheUse { off, use, fill };
// CacheUse::fill -> "fill".
PINSTAGE_API const char* cache_use_name(CacheUse use);
// "off" / "use" / "fill" (any case) -> the value; Error(invalid_argument) naming all three.
PINSTAGE_API CacheUse parse_cache_use(std::string_view name);

// The file names an entry holds besides the checkpoint's own files.
inline constexpr const char* kCacheManifestName = "manifest.json";
// The manifest's "format" value; a manifest of another format is an entry to refill.
inline constexpr int kCacheManifestFormat = 1;
// Largest manifest accepted (one line per tensor: far below this for real checkpoints).
inline constexpr uint64_t kCacheMaxManifestBytes = uint64_t{64} << 20;

// The directory named by PINSTAGE_CACHE_DIR, or /dev/shm/pinstage-<euid> when unset.
PINSTAGE_API std::string default_cache_dir();

// What the cache directory is.
struct CacheDirInfo {
  std::string path;         // the directory opened
  std::string fs;           // "hugetlbfs" or "tmpfs"
  uint64_t page_bytes = 0;  // the page size files are mapped in: the huge page on hugetlbfs
  // Whether files get 2 MiB pages: "hugetlbfs"; on tmpfs its mount's huge= option,
  // "never" (none: /dev/shm's), "within_size", "always" or "advise" (only where a mapping
  // asks, which the cache does not), read from /proc/self/mountinfo and overridden by
  // shmem_enabled's deny / force; "unknown" when the mount is not found there.
  std::string huge;
  uint64_t free_bytes = 0;  // what the file system can still give (statfs f_bavail)
  uint64_t used_bytes = 0;  // bytes of the entries and leftover temporaries
  size_t entries = 0;       // published entries
};

// What the cache holds for one checkpoint.
struct CacheLookup {
  // "hit" (the entry matches its source), "miss" (none), "stale" (the source changed, or
  // the entry is damaged: reason says which file and field), "filled" (fill() made it).
  std::string state;
  std::string key;         // the entry's name: cache_key of the source
  std::string entry_path;  // what Checkpoint::open takes ("" unless hit or filled)
  std::string reason;      // why stale (or, for a hit made by another filler, who filled)
};

// One thing in the cache directory.
struct CacheEntryInfo {
  std::string key;
  std::string source;       // the source's real path ("" for a temporary)
  uint64_t bytes = 0;       // bytes its files take
  int64_t last_use_ns = 0;  // the last hit or fill (CLOCK_REALTIME ns)
  std::string state;        // "ok", "stale" (reason says why) or "temp" (a filler's)
  std::string reason;
};

// What prune() removed.
struct CachePruneReport {
  size_t temps = 0;    // leftover temporaries whose filler is gone
  size_t stale = 0;    // stale or damaged entries
  size_t evicted = 0;  // least recently used entries removed to get under max_bytes
  uint64_t freed_bytes = 0;
  std::vector<std::string> removed;  // their keys (temporaries: their names)
};

// Every field of each, in its struct's order: the one serialiser the CLI's `cache --json`
// and Python's pinstage.cache dicts share (a prune's `removed` is a list of keys).
PINSTAGE_API ReportFields report_fields(const CacheDirInfo& info);
PINSTAGE_API ReportFields report_fields(const CacheLookup& lookup);
PINSTAGE_API ReportFields report_fields(const CacheEntryInfo& entry);
PINSTAGE_API ReportFields report_fields(const CachePruneReport& report);

// How fill() copies.
struct CacheFillOptions {
  // The cache's limit: a fill that would take the entries past it is Error(out_of_memory)
  // before anything is written (0: only the file system's free space bounds it).
  uint64_t max_bytes = 0;
  int threads = 0;  // copy threads; 0 = all cores
  // The NUMA node the entry's pages are bound to (its device's node, so that a hit maps
  // memory local to it), or -1: the filler's own memory policy places them.
  int numa_node = -1;
  // Called after each piece with the bytes copied and the total, one call at a time.
  std::function<void(uint64_t done, uint64_t total)> progress;
};

// The key of the checkpoint at `path`: the xxh3-64 (16 hex digits) of its real path, so one
// checkpoint maps to one entry whatever path names it. Error(io) when it does not exist.
PINSTAGE_API std::string cache_key(const std::string& path);

// An opened cache directory. Movable, not copyable; closes the directory on destruction.
class PINSTAGE_API WeightCache {
 public:
  // Opens `dir` (default_cache_dir() when not given), creating its last component with mode
  // 0700 when missing, with O_DIRECTORY | O_NOFOLLOW. Error(invalid_argument) naming the
  // directory and the fix for: a symbolic link, not a directory, another owner than the
  // effective user (chown), any group or other permission bit (chmod 700), a file system
  // that is neither hugetlbfs nor tmpfs (a copy on disk the page cache can drop: point it
  // at /dev/shm or a hugetlbfs mount). Error(io) when it cannot be created or opened.
  static WeightCache open(std::optional<std::string> dir = {});

  WeightCache(WeightCache&& other) noexcept = default;
  WeightCache& operator=(WeightCache&& other) noexcept = default;
  ~WeightCache() = default;

  const std::string& path() const noexcept { return path_; }
  // The file system, its page size, free space and what the cache takes.
  CacheDirInfo info() const;

  // What the cache holds for `source`: "hit" when an entry exists and every file's size,
  // mtime and inode match the source's as they are now (and the manifest's tensor layout
  // matches the source's), "stale" (reason names the file and the field) when one differs
  // or the entry is damaged, "miss" when there is none. A hit marks the entry used. Reads
  // only the manifest and stats the files: no tensor byte.
  CacheLookup lookup(const Checkpoint& source) const;

  // Makes the entry of `source` (a miss or a stale entry; a hit is returned as it is):
  // under an flock on <key>.lock, removes the key's leftover temporaries, reserves the
  // bytes (fallocate: a full file system or huge-page reservation is Error(out_of_memory)
  // before any copy), copies each file into a temporary directory through a shared
  // mapping (hugetlbfs takes no write(); pages placed by the filler's NUMA policy),
  // writes the manifest, then renames the directory to <key> in one step (exchanging it
  // with a stale one). A second filler of the same key waits on the lock and then finds
  // the entry: it gets "hit". On any error (a read, ENOSPC, an exception from progress)
  // the temporary is removed and the old entry, if any, is left as it was. A reader never
  // sees a partial entry. Returns state "filled" (or "hit").
  CacheLookup fill(const Checkpoint& source, const CacheFillOptions& options = {});

  // Everything in the directory: entries (checked against their sources: "ok" or "stale")
  // and temporaries ("temp"), sorted by key.
  std::vector<CacheEntryInfo> list() const;

  // Removes the entry named by `key_or_path` (a key, or a checkpoint path whose key it is).
  // Safe for a process that still maps it: its mappings keep the pages until they go
  // (docs/cache.md, "Limits"). Error(not_found) naming the key when there is none, or
  // naming the path when it no longer exists (its entry is then removed by its key).
  void remove(const std::string& key_or_path);

  // Removes leftover temporaries whose filler is gone (their lock is free), stale and
  // damaged entries, then the least recently used entries until the cache's bytes are at
  // most `max_bytes` (when given).
  CachePruneReport prune(std::optional<uint64_t> max_bytes = {});

 private:
  WeightCache(UniqueFd dir, std::string path) : dir_(std::move(dir)), path_(std::move(path)) {}
  UniqueFd dir_;
  std::string path_;
};

}  // namespace pinstage
