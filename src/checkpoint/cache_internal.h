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

// The manifest a fill of `source` records (identities filled in by the fill).
Manifest manifest_of(const Checkpoint& source);
// The index file of an indexed checkpoint, or "".
std::string index_path_of(const Checkpoint& source);

}  // namespace pinstage::detail
