// The restart cache's pieces shared by its sources (internal to libpinstage): the names in
// the directory, the per-key lock, the manifest, and the steps relative to a directory
// descriptor that never follow a symbolic link.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "pinstage/cache.h"
#include "pinstage/checkpoint.h"
#include "pinstage/files.h"

namespace pinstage::detail {

// A key: 16 lower-case hex digits (xxh3_hex).
bool is_cache_key(std::string_view name) noexcept;
// The key of a filler's temporary ".<key>.tmp.<pid>.<rand>", or nullopt.
std::optional<std::string> cache_temp_key(std::string_view name);
// "<key>.lock" -> key, or nullopt.
std::optional<std::string> cache_lock_key(std::string_view name);
// A fresh temporary name for `key`.
std::string cache_temp_name(const std::string& key);

// Every name in the directory `dir` but "." and "..". Error(io) naming `what`.
std::vector<std::string> names_in(int dir, const std::string& what);
// Removes `name` in `dir` (a directory with everything in it), never following a link.
// false when it was not there; Error(io) naming `what` on any other failure.
bool remove_at(int dir, const std::string& name, const std::string& what);
// Bytes of the regular files in `name` (a file, or a directory one level deep).
uint64_t bytes_at(int dir, const std::string& name);

// The flock on "<key>.lock" in `dir` (created 0600, O_NOFOLLOW), held while the
// descriptor lives. wait: block until it is free; else an empty lock when another holds it.
// The lock file is checked to still be the one named after locking, so that a lock file
// removed and made anew (prune) never gives two holders.
UniqueFd lock_cache_key(int dir, const std::string& key, bool wait);

// One file of an entry: its name in the entry and its source's identity when filled.
struct ManifestFile {
  std::string name;    // "model-00001-of-00002.safetensors", "model.safetensors.index.json"
  std::string source;  // the source file's path
  uint64_t size = 0;
  uint64_t mtime_ns = 0;
  uint64_t inode = 0;
  uint64_t dev = 0;
};

// An entry's manifest.json.
struct Manifest {
  std::string source;     // the checkpoint's real path
  std::string layout;     // checkpoint_layout_name
  std::string open_name;  // the name Checkpoint::open takes inside the entry ("" = the entry)
  std::vector<ManifestFile> files;
  std::vector<CheckpointTensor> tensors;  // name, dtype, shape, file, offset, bytes, xxh3
  std::optional<std::string> checkpoint_xxh3;
};

std::string manifest_json(const Manifest& manifest);
// Parses strictly (unknown or missing key, wrong type, another format): nullopt with `why`.
std::optional<Manifest> parse_manifest(std::string_view text, std::string* why);
// The manifest of the entry open as `entry`, or nullopt with `why` (missing, damaged).
std::optional<Manifest> read_manifest(int entry, std::string* why);

// The identity fields of a stat, as the manifest records them.
ManifestFile identity_of(const struct stat& st, std::string name, std::string source);
// "" when every source file is as the manifest recorded it; else which file and field
// changed ("model.safetensors: mtime changed").
std::string source_change(const Manifest& manifest);
// "" when the entry open as `entry` holds every file at its recorded size, owned by this
// user and private; else what is wrong.
std::string entry_damage(const Manifest& manifest, int entry);

// One line of /proc/self/mountinfo (proc_pid_mountinfo(5)), the fields the cache reads.
struct MountLine {
  unsigned major = 0;
  unsigned minor = 0;
  std::string mount_point;    // octal escapes undone ("\040" -> ' ')
  std::string fs_type;        // "tmpfs"
  std::string super_options;  // "rw,size=8388608k,mode=700,huge=within_size"
};
// One line parsed, or nullopt when it is malformed (fewer fields than the format has, no
// "-" separator, a device that is not MAJOR:MINOR, a bad octal escape): the kernel writes
// the file, so a line it wrote in a format this does not know is skipped, not an error.
std::optional<MountLine> parse_mountinfo_line(std::string_view line);
// Of the lines of `mountinfo` on device `dev` (major:minor), the one whose mount point is
// the longest whole-component prefix of `path` (or the last one on `dev` when none is:
// `path` reached through a link); nullopt when no line is on `dev`.
std::optional<MountLine> mount_of(std::string_view mountinfo, dev_t dev, std::string_view path);
// What CacheDirInfo::huge says of a tmpfs mounted with `super_options`: its huge= value
// ("never" when absent; "unknown" for a value this does not know), overridden by the
// kernel-wide /sys/kernel/mm/transparent_hugepage/shmem_enabled `deny` ("never") and
// `force` ("always"); `shmem_enabled` is that file's text ("" when unreadable).
std::string tmpfs_huge(std::string_view super_options, std::string_view shmem_enabled);

// The manifest a fill of `source` records (identities filled in by the fill).
Manifest manifest_of(const Checkpoint& source);
// The index file of an indexed checkpoint, or "".
std::string index_path_of(const Checkpoint& source);

}  // namespace pinstage::detail
