// The cache directory's mount from /proc/self/mountinfo, for CacheDirInfo::huge (whether a
// tmpfs gives 2 MiB pages). Its own file so that tests/cpp/test_cache.cpp compiles it in and
// tests the parser on strings.
#include <sys/sysmacros.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <string>
#include <string_view>

#include "checkpoint/cache_internal.h"

namespace pinstage::detail {

namespace {

// The next space-separated field of `line` from `at`, or "" at the end.
std::string_view next_field(std::string_view line, size_t& at) {
  while (at < line.size() && line[at] == ' ') ++at;
  const size_t start = at;
  while (at < line.size() && line[at] != ' ') ++at;
  return line.substr(start, at - start);
}

// `field` with mountinfo's octal escapes (\040 space, \011 tab, \012 newline, \134
// backslash) undone; false for a backslash not followed by three octal digits.
bool unescape_octal(std::string_view field, std::string& out) {
  out.clear();
  for (size_t i = 0; i < field.size(); ++i) {
    if (field[i] != '\\') {
      out += field[i];
      continue;
    }
    if (i + 3 >= field.size()) return false;
    int v = 0;
    for (size_t k = 1; k <= 3; ++k) {
      const char c = field[i + k];
      if (c < '0' || c > '7') return false;
      v = v * 8 + (c - '0');
    }
    if (v > 0377) return false;
    out += static_cast<char>(v);
    i += 3;
  }
  return true;
}

}  // namespace

std::optional<MountLine> parse_mountinfo_line(std::string_view line) {
  // ID PARENT MAJOR:MINOR ROOT MOUNT_POINT OPTIONS [OPTIONAL...] - FS_TYPE SOURCE SUPER_OPTIONS
  size_t at = 0;
  std::string_view f[5];
  for (std::string_view& field : f)
    if ((field = next_field(line, at)).empty()) return std::nullopt;
  MountLine m;
  unsigned major = 0, minor = 0;
  int used = 0;
  const std::string dev(f[2]);
  if (std::sscanf(dev.c_str(), "%u:%u%n", &major, &minor, &used) != 2 ||
      static_cast<size_t>(used) != dev.size() || !std::isdigit(static_cast<unsigned char>(dev[0])))
    return std::nullopt;
  m.major = major;
  m.minor = minor;
  if (!unescape_octal(f[4], m.mount_point) || m.mount_point.empty() || m.mount_point[0] != '/')
    return std::nullopt;
  if (next_field(line, at).empty()) return std::nullopt;  // the mount options
  for (std::string_view opt = next_field(line, at); opt != "-"; opt = next_field(line, at))
    if (opt.empty()) return std::nullopt;  // no separator
  m.fs_type = std::string(next_field(line, at));
  const std::string_view source = next_field(line, at);
  m.super_options = std::string(next_field(line, at));
  if (m.fs_type.empty() || source.empty() || m.super_options.empty() ||
      !next_field(line, at).empty())
    return std::nullopt;
  return m;
}

std::optional<MountLine> mount_of(std::string_view mountinfo, dev_t dev, std::string_view path) {
  std::optional<MountLine> best;
  size_t best_length = 0;  // of the best prefix; 0 while none is one
  while (!mountinfo.empty()) {
    const size_t end = std::min(mountinfo.find('\n'), mountinfo.size());
    std::optional<MountLine> m = parse_mountinfo_line(mountinfo.substr(0, end));
    mountinfo.remove_prefix(std::min(end + 1, mountinfo.size()));
    if (!m || m->major != ::major(dev) || m->minor != ::minor(dev)) continue;
    const std::string& mp = m->mount_point;
    const bool prefix = mp == "/" || path == mp ||
                        (path.starts_with(mp) && path.size() > mp.size() && path[mp.size()] == '/');
    if (prefix ? mp.size() >= best_length : best_length == 0) {
      best_length = prefix ? std::max<size_t>(mp.size(), 1) : 0;
      best = std::move(m);
    }
  }
  return best;
}

std::string tmpfs_huge(std::string_view super_options, std::string_view shmem_enabled) {
  if (shmem_enabled.find("[deny]") != std::string_view::npos) return "never";
  if (shmem_enabled.find("[force]") != std::string_view::npos) return "always";
  std::string huge;
  size_t at = 0;
  while (at <= super_options.size()) {
    const size_t end = std::min(super_options.find(',', at), super_options.size());
    const std::string_view opt = super_options.substr(at, end - at);
    if (opt.starts_with("huge=")) {
      if (!huge.empty()) return "unknown";  // written twice: not the kernel's format
      huge = std::string(opt.substr(5));
    }
    at = end + 1;
  }
  if (huge.empty()) return "never";
  for (const char* known : {"never", "always", "within_size", "advise"})
    if (huge == known) return huge;
  return "unknown";
}

}  // namespace pinstage::detail
