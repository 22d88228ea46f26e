// The restart cache (docs/cache.md, include/pinstage/cache.h): the directory, its checks and
// what it is; the entries' fill, lookup and removal follow in cache_entry.cpp.
#include "pinstage/cache.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <string>

#include "pinstage/error.h"
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

namespace {
[[noreturn]] void not_yet(const char* what) {
  throw Error(ErrorCode::unsupported,
              std::string("WeightCache::") + what + " is not implemented yet");
}
}  // namespace

WeightCache WeightCache::open(std::optional<std::string>) { not_yet("open"); }
CacheDirInfo WeightCache::info() const { not_yet("info"); }
CacheLookup WeightCache::lookup(const Checkpoint&) const { not_yet("lookup"); }
CacheLookup WeightCache::fill(const Checkpoint&, const CacheFillOptions&) { not_yet("fill"); }
std::vector<CacheEntryInfo> WeightCache::list() const { not_yet("list"); }
void WeightCache::remove(const std::string&) { not_yet("remove"); }
CachePruneReport WeightCache::prune(std::optional<uint64_t>) { not_yet("prune"); }

}  // namespace pinstage
