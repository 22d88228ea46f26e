// The restart cache's listing and removal (docs/cache.md, "Limits"): ls, rm and prune,
// each entry removed under its key's lock, so never in the middle of a fill.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "checkpoint/cache_internal.h"
#include "pinstage/error.h"

namespace pinstage {

namespace {

int64_t atime_ns(const struct stat& st) {
  return static_cast<int64_t>(st.st_atim.tv_sec) * 1'000'000'000 + st.st_atim.tv_nsec;
}

// One entry as list() sees it: checked against its manifest's sources.
CacheEntryInfo describe_entry(int dir, const std::string& key) {
  CacheEntryInfo e;
  e.key = key;
  e.state = "stale";
  e.bytes = detail::bytes_at(dir, key);
  const UniqueFd entry(::openat(dir, key.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  struct stat st {};
  if (entry.get() < 0 || ::fstat(entry.get(), &st) != 0) {
    e.reason = std::string("the entry cannot be opened: ") + std::strerror(errno);
    return e;
  }
  e.last_use_ns = atime_ns(st);
  std::string why;
  const std::optional<detail::Manifest> m = detail::read_manifest(entry.get(), &why);
  if (!m) {
    e.reason = "the entry is damaged: " + why;
    return e;
  }
  e.source = m->source;
  e.reason = detail::source_change(*m);
  if (e.reason.empty()) e.reason = detail::entry_damage(*m, entry.get());
  if (e.reason.empty()) e.state = "ok";
  return e;
}

CacheEntryInfo describe_temp(int dir, const std::string& name) {
  CacheEntryInfo e;
  e.key = name;
  e.state = "temp";
  e.bytes = detail::bytes_at(dir, name);
  struct stat st {};
  if (::fstatat(dir, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0) e.last_use_ns = atime_ns(st);
  const UniqueFd free_lock = detail::lock_cache_key(dir, *detail::cache_temp_key(name), false);
  e.reason = free_lock.get() >= 0 ? "its filler is gone: prune or the next put removes it"
                                  : "a fill in progress";
  return e;
}

}  // namespace

std::vector<CacheEntryInfo> WeightCache::list() const {
  std::vector<CacheEntryInfo> out;
  for (const std::string& name : detail::names_in(dir_.get(), "cache directory '" + path_ + "'")) {
    if (detail::is_cache_key(name))
      out.push_back(describe_entry(dir_.get(), name));
    else if (detail::cache_temp_key(name))
      out.push_back(describe_temp(dir_.get(), name));
  }
  return out;
}

void WeightCache::remove(const std::string& key_or_path) {
  std::string key = key_or_path;
  if (!detail::is_cache_key(key_or_path)) {
    try {
      key = cache_key(key_or_path);
    } catch (const Error& e) {  // a source removed since: its entry is named by its key
      throw Error(ErrorCode::not_found, std::string(e.what()) +
                                            "; remove its entry by its key (pinstage cache ls "
                                            "lists them)");
    }
  }
  const UniqueFd lock = detail::lock_cache_key(dir_.get(), key, true);
  if (!detail::remove_at(dir_.get(), key, "cache entry " + key)) {
    (void)::unlinkat(dir_.get(), (key + ".lock").c_str(), 0);
    throw Error(ErrorCode::not_found, "no cache entry " + key + " in '" + path_ + "'" +
                                          (key == key_or_path ? "" : " for '" + key_or_path + "'") +
                                          " (pinstage cache ls lists them)");
  }
  (void)::unlinkat(dir_.get(), (key + ".lock").c_str(), 0);  // held: see lock_cache_key
}

namespace {

// Removes `name` (an entry or a temporary of `key`) when its key's lock is free, with the
// lock file; false when a fill holds it.
bool remove_unlocked(int dir, const std::string& key, const std::string& name,
                     CachePruneReport& r) {
  const UniqueFd lock = detail::lock_cache_key(dir, key, false);
  if (lock.get() < 0) return false;
  const uint64_t bytes = detail::bytes_at(dir, name);
  if (!detail::remove_at(dir, name, name)) return false;
  r.freed_bytes += bytes;
  r.removed.push_back(name);
  return true;
}

}  // namespace

CachePruneReport WeightCache::prune(std::optional<uint64_t> max_bytes) {
  CachePruneReport r;
  const int dir = dir_.get();
  std::vector<CacheEntryInfo> kept;
  uint64_t busy_bytes = 0;  // temporaries of live fills: they count against the limit
  for (const CacheEntryInfo& e : list()) {
    if (e.state == "temp") {
      if (remove_unlocked(dir, *detail::cache_temp_key(e.key), e.key, r))
        ++r.temps;
      else
        busy_bytes += e.bytes;
    } else if (e.state == "stale" && remove_unlocked(dir, e.key, e.key, r)) {
      ++r.stale;
    } else {
      kept.push_back(e);
    }
  }
  // Lock files of keys with nothing left: removed while held (lock_cache_key re-checks).
  for (const std::string& name : detail::names_in(dir, "cache directory '" + path_ + "'")) {
    const std::optional<std::string> key = detail::cache_lock_key(name);
    struct stat st {};
    if (!key || ::fstatat(dir, key->c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0) continue;
    const UniqueFd lock = detail::lock_cache_key(dir, *key, false);
    if (lock.get() >= 0) (void)::unlinkat(dir, name.c_str(), 0);
  }
  if (!max_bytes) return r;
  std::sort(kept.begin(), kept.end(), [](const CacheEntryInfo& a, const CacheEntryInfo& b) {
    return a.last_use_ns < b.last_use_ns;
  });
  uint64_t total = busy_bytes;
  for (const CacheEntryInfo& e : kept) total += e.bytes;
  for (const CacheEntryInfo& e : kept) {
    if (total <= *max_bytes) break;
    if (!remove_unlocked(dir, e.key, e.key, r)) continue;
    (void)::unlinkat(dir, (e.key + ".lock").c_str(), 0);
    total -= e.bytes;
    ++r.evicted;
  }
  return r;
}

}  // namespace pinstage
