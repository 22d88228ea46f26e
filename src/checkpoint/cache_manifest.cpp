// The restart cache's manifest (docs/cache.md, "An entry"): the source's identity (each
// file's real path, size, mtime, inode, device), the tensor layout with its hashes and the
// checkpoint digest, parsed strictly; and the checks that tell a stale or damaged entry.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "checkpoint/cache_internal.h"
#include "pinstage/error.h"
#include "pinstage/safetensors.h"
#include "tensor/strict_json.h"

namespace pinstage::detail {

namespace fs = std::filesystem;

namespace {

// A manifest that does not parse: the entry is damaged (its caller says so; never thrown
// past the cache).
struct Bad {
  std::string why;
};

const nlohmann::json& field(const nlohmann::json& obj, const char* key, const std::string& where) {
  const auto it = obj.find(key);
  if (it == obj.end()) throw Bad{where + " has no \"" + key + "\""};
  return *it;
}

void closed(const nlohmann::json& obj, std::initializer_list<const char*> keys,
            const std::string& where) {
  if (!obj.is_object()) throw Bad{where + " is not an object"};
  if (const auto key = unknown_key(obj, keys))
    throw Bad{where + " has an unknown key " + shown(*key)};
}

uint64_t number(const nlohmann::json& obj, const char* key, const std::string& where) {
  const nlohmann::json& v = field(obj, key, where);
  if (!v.is_number_unsigned()) throw Bad{where + " \"" + key + "\" is not a whole number >= 0"};
  return v.get<uint64_t>();
}

std::string text(const nlohmann::json& obj, const char* key, const std::string& where) {
  const nlohmann::json& v = field(obj, key, where);
  if (!v.is_string()) throw Bad{where + " \"" + key + "\" is not a string"};
  return v.get<std::string>();
}

ManifestFile parse_file(const nlohmann::json& f, const std::string& where) {
  closed(f, {"name", "source", "size", "mtime_ns", "inode", "dev"}, where);
  ManifestFile m{text(f, "name", where),       text(f, "source", where),  number(f, "size", where),
                 number(f, "mtime_ns", where), number(f, "inode", where), number(f, "dev", where)};
  if (m.name.empty() || m.name.find('/') != std::string::npos || m.name == "." || m.name == "..")
    throw Bad{where + " name " + shown(m.name) + " is not a plain file name"};
  return m;
}

CheckpointTensor parse_tensor(const nlohmann::json& t, size_t files, const std::string& where) {
  closed(t, {"name", "dtype", "shape", "file", "offset", "bytes", "xxh3"}, where);
  CheckpointTensor c;
  c.name = text(t, "name", where);
  c.dtype = text(t, "dtype", where);
  const nlohmann::json& shape = field(t, "shape", where);
  if (!shape.is_array()) throw Bad{where + " \"shape\" is not an array"};
  for (const nlohmann::json& d : shape) {
    if (!d.is_number_unsigned() || d.get<uint64_t>() > uint64_t{INT64_MAX})
      throw Bad{where + " \"shape\" holds " + shown(d.dump())};
    c.shape.push_back(d.get<int64_t>());
  }
  c.file = static_cast<size_t>(number(t, "file", where));
  if (c.file >= files) throw Bad{where + " \"file\" is past the manifest's files"};
  c.offset = number(t, "offset", where);
  c.bytes = number(t, "bytes", where);
  if (t.contains("xxh3")) {
    c.xxh3 = parse_xxh3_hex(text(t, "xxh3", where));
    if (!c.xxh3) throw Bad{where + " \"xxh3\" is not 16 hex digits"};
  }
  return c;
}

Manifest parse(const nlohmann::json& doc) {
  closed(doc, {"format", "source", "layout", "open_name", "files", "tensors", "checkpoint_xxh3"},
         "the manifest");
  if (number(doc, "format", "the manifest") != kCacheManifestFormat)
    throw Bad{"the manifest's format is not " + std::to_string(kCacheManifestFormat)};
  Manifest m;
  m.source = text(doc, "source", "the manifest");
  m.layout = text(doc, "layout", "the manifest");
  m.open_name = text(doc, "open_name", "the manifest");
  const nlohmann::json& files = field(doc, "files", "the manifest");
  const nlohmann::json& tensors = field(doc, "tensors", "the manifest");
  if (!files.is_array() || files.empty() || !tensors.is_array())
    throw Bad{"the manifest's files or tensors are not a list"};
  for (size_t i = 0; i < files.size(); ++i)
    m.files.push_back(parse_file(files[i], "file " + std::to_string(i)));
  for (size_t i = 0; i < tensors.size(); ++i)
    m.tensors.push_back(parse_tensor(tensors[i], m.files.size(), "tensor " + std::to_string(i)));
  if (doc.contains("checkpoint_xxh3"))
    m.checkpoint_xxh3 = text(doc, "checkpoint_xxh3", "the manifest");
  return m;
}

}  // namespace

std::string manifest_json(const Manifest& m) {
  nlohmann::ordered_json files = nlohmann::ordered_json::array();
  for (const ManifestFile& f : m.files)
    files.push_back({{"name", f.name},
                     {"source", f.source},
                     {"size", f.size},
                     {"mtime_ns", f.mtime_ns},
                     {"inode", f.inode},
                     {"dev", f.dev}});
  nlohmann::ordered_json tensors = nlohmann::ordered_json::array();
  for (const CheckpointTensor& t : m.tensors) {
    nlohmann::ordered_json j = {{"name", t.name}, {"dtype", t.dtype},   {"shape", t.shape},
                                {"file", t.file}, {"offset", t.offset}, {"bytes", t.bytes}};
    if (t.xxh3) j["xxh3"] = xxh3_hex(*t.xxh3);
    tensors.push_back(std::move(j));
  }
  nlohmann::ordered_json doc = {
      {"format", kCacheManifestFormat}, {"source", m.source}, {"layout", m.layout},
      {"open_name", m.open_name},       {"files", files},     {"tensors", tensors}};
  if (m.checkpoint_xxh3) doc["checkpoint_xxh3"] = *m.checkpoint_xxh3;
  return doc.dump(1) + "\n";
}

std::optional<Manifest> parse_manifest(std::string_view text, std::string* why) {
  try {
    return parse(parse_strict_json(text, "the manifest", 8));
  } catch (const StrictJsonError& e) {
    *why = e.message;
  } catch (const Bad& e) {
    *why = e.why;
  }
  return std::nullopt;
}

std::optional<Manifest> read_manifest(int entry, std::string* why) {
  const UniqueFd fd(
      ::openat(entry, kCacheManifestName, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
  struct stat st {};
  if (fd.get() < 0 || ::fstat(fd.get(), &st) != 0) {
    *why = std::string("its manifest cannot be opened: ") + std::strerror(errno);
    return std::nullopt;
  }
  if (!S_ISREG(st.st_mode) || static_cast<uint64_t>(st.st_size) > kCacheMaxManifestBytes) {
    *why = "its manifest is not a regular file of at most " +
           std::to_string(kCacheMaxManifestBytes) + " bytes";
    return std::nullopt;
  }
  std::string text(static_cast<size_t>(st.st_size), '\0');
  if (pread_full(fd.get(), text.data(), text.size(), 0) != text.size()) {
    *why = "its manifest cannot be read";
    return std::nullopt;
  }
  return parse_manifest(text, why);
}

ManifestFile identity_of(const struct stat& st, std::string name, std::string source) {
  return {std::move(name),
          std::move(source),
          static_cast<uint64_t>(st.st_size),
          static_cast<uint64_t>(st.st_mtim.tv_sec) * 1'000'000'000u +
              static_cast<uint64_t>(st.st_mtim.tv_nsec),
          static_cast<uint64_t>(st.st_ino),
          static_cast<uint64_t>(st.st_dev)};
}

std::string source_change(const Manifest& m) {
  for (const ManifestFile& f : m.files) {
    struct stat st {};
    if (::stat(f.source.c_str(), &st) != 0)
      return f.name + ": the source file '" + f.source + "' is gone (" + std::strerror(errno) + ")";
    const ManifestFile now = identity_of(st, f.name, f.source);
    const char* changed = now.size != f.size           ? "size"
                          : now.mtime_ns != f.mtime_ns ? "mtime"
                          : now.inode != f.inode       ? "inode"
                          : now.dev != f.dev           ? "device"
                                                       : nullptr;
    if (changed != nullptr)
      return f.name + ": the source's " + changed + " changed since the entry was filled";
  }
  return "";
}

std::string entry_damage(const Manifest& m, int entry) {
  for (const ManifestFile& f : m.files) {
    struct stat st {};
    if (::fstatat(entry, f.name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0)
      return f.name + ": missing from the entry (" + std::strerror(errno) + ")";
    if (!S_ISREG(st.st_mode) || st.st_uid != ::geteuid() || (st.st_mode & 077) != 0)
      return f.name + ": not a private regular file of this user in the entry";
    if (static_cast<uint64_t>(st.st_size) != f.size)
      return f.name + ": the entry's copy has " + std::to_string(st.st_size) + " bytes, not " +
             std::to_string(f.size);
  }
  return "";
}

std::string index_path_of(const Checkpoint& source) {
  if (source.layout() != CheckpointLayout::indexed_directory) return "";
  return (fs::path(source.path()) / kCheckpointIndexName).string();
}

Manifest manifest_of(const Checkpoint& source) {
  Manifest m;
  char real[PATH_MAX];
  if (::realpath(source.path().c_str(), real) == nullptr)
    throw Error(ErrorCode::io,
                "cannot find checkpoint '" + source.path() + "': " + std::strerror(errno));
  m.source = real;
  m.layout = checkpoint_layout_name(source.layout());
  const bool single = source.layout() == CheckpointLayout::single_file;
  const fs::path dir = single ? fs::path(m.source).parent_path() : fs::path(m.source);
  if (single) m.open_name = fs::path(m.source).filename().string();
  for (const CheckpointFile& f : source.files()) {
    const std::string name = single ? m.open_name : fs::path(f.path).filename().string();
    m.files.push_back({name, (dir / name).string(), f.size, 0, 0, 0});
  }
  if (!index_path_of(source).empty()) {
    struct stat st {};  // its size for the fill's progress; the fill checks it again
    const std::string index = (dir / kCheckpointIndexName).string();
    const uint64_t size = ::stat(index.c_str(), &st) == 0 ? static_cast<uint64_t>(st.st_size) : 0;
    m.files.push_back({kCheckpointIndexName, index, size, 0, 0, 0});
  }
  m.tensors = source.tensors();
  for (const auto& [key, value] : source.metadata())
    if (key == kCheckpointDigestKey) m.checkpoint_xxh3 = value;
  return m;
}

}  // namespace pinstage::detail
