// The hash sidecar: per-tensor xxh3-64 recorded next to a checkpoint whose writer recorded
// none (a Hugging Face checkpoint), so that `--verify` means something for it from then on.
// Written by hash_checkpoint (`pinstage hash`), read by Checkpoint::open.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "checkpoint/hash_sidecar.h"
#include "checkpoint/load_internal.h"
#include "pinstage/atomic_file.h"
#include "pinstage/checkpoint.h"
#include "pinstage/clock.h"
#include "pinstage/error.h"
#include "pinstage/files.h"
#include "pinstage/parallel.h"
#include "pinstage/safetensors.h"
#include "tensor/strict_json.h"

namespace pinstage {

namespace fs = std::filesystem;
using detail::shown;

namespace {

constexpr const char* kFormat = "pinstage.xxh3/1";
constexpr uint64_t kMaxSidecarBytes = uint64_t{256} << 20;

[[noreturn]] void sidecar_error(const std::string& path, const std::string& why) {
  throw Error(ErrorCode::io, "hash sidecar '" + path + "': " + why);
}

const nlohmann::json& member(const nlohmann::json& obj, const char* key, const std::string& path,
                             const std::string& where) {
  const auto it = obj.find(key);
  if (it == obj.end()) sidecar_error(path, where + " has no \"" + key + "\"");
  return *it;
}

void only_keys(const nlohmann::json& obj, std::initializer_list<const char*> keys,
               const std::string& path, const std::string& where) {
  if (const auto key = detail::unknown_key(obj, keys))
    sidecar_error(path, where + " has an unknown key " + shown(*key));
}

uint64_t whole_number(const nlohmann::json& v, const std::string& path, const std::string& where) {
  if (!v.is_number_unsigned()) sidecar_error(path, where + " is not a whole number >= 0");
  return v.get<uint64_t>();
}

// What tells a re-saved file from the one hashed: a writer's save changes its size, its
// modification time or (written anew and renamed, as writers do) its inode; damage in
// place changes none of them.
struct FileIdentity {
  uint64_t bytes = 0, mtime_ns = 0, inode = 0;
  bool operator==(const FileIdentity&) const = default;
};

FileIdentity identity_of(const struct stat& st) {
  return {static_cast<uint64_t>(st.st_size),
          static_cast<uint64_t>(st.st_mtim.tv_sec) * 1'000'000'000u +
              static_cast<uint64_t>(st.st_mtim.tv_nsec),
          static_cast<uint64_t>(st.st_ino)};
}

nlohmann::ordered_json identity_json(const FileIdentity& id) {
  return {{"bytes", id.bytes}, {"mtime_ns", id.mtime_ns}, {"inode", id.inode}};
}

// The sidecar's optional "files" ({shard: {bytes, mtime_ns, inode}}, written since issue
// 41): every file of the checkpoint must be there as it is now, or the sidecar is stale.
void check_identities(const nlohmann::json& doc, const std::vector<CheckpointFile>& files,
                      const std::string& path, const std::string& checkpoint_path) {
  const auto it = doc.find("files");
  if (it == doc.end()) return;  // an older sidecar: the layout checks alone
  if (!it->is_object()) sidecar_error(path, "\"files\" is not an object");
  for (const CheckpointFile& f : files) {
    const std::string shard = fs::path(f.path).filename().string();
    const auto entry = it->find(shard);
    std::optional<FileIdentity> recorded;
    if (entry != it->end()) {
      const std::string where = "file " + shown(shard);
      if (!entry->is_object()) sidecar_error(path, where + " is not an object");
      only_keys(*entry, {"bytes", "mtime_ns", "inode"}, path, where);
      recorded = FileIdentity{whole_number(member(*entry, "bytes", path, where), path, where),
                              whole_number(member(*entry, "mtime_ns", path, where), path, where),
                              whole_number(member(*entry, "inode", path, where), path, where)};
    }
    struct stat st {};
    if (recorded && ::stat(f.path.c_str(), &st) == 0 && identity_of(st) == *recorded) continue;
    throw Error(ErrorCode::io, "hash sidecar '" + path + "' is stale: " + shown(shard) +
                                   (recorded ? " changed since it was recorded (its size, "
                                               "modification time or inode differ)"
                                             : " was not there when it was recorded") +
                                   "; run `pinstage hash " + checkpoint_path + "` to replace it");
  }
}

// xxh3-64 of one tensor, read with pread in chunks from an open file.
uint64_t hash_tensor(int fd, const CheckpointTensor& t, uint64_t chunk, std::vector<char>& buf,
                     const std::string& file) {
  Xxh3Stream stream;
  buf.resize(static_cast<size_t>(std::min<uint64_t>(chunk, std::max<uint64_t>(t.bytes, 1))));
  for (uint64_t done = 0; done < t.bytes;) {
    const size_t want = static_cast<size_t>(std::min<uint64_t>(buf.size(), t.bytes - done));
    if (pread_full(fd, buf.data(), want, t.offset + done) < want)
      throw Error(ErrorCode::io, "reading tensor " + shown(t.name) + " of '" + file + "': " +
                                     (errno == 0 ? std::string("the file is shorter than at open")
                                                 : std::strerror(errno)));
    stream.update(buf.data(), want);
    done += want;
  }
  return stream.digest();
}

}  // namespace

void check_sidecar(const Checkpoint& checkpoint, const CheckpointLoadOptions& options) {
  if (options.verify && !checkpoint.sidecar_problem().empty())
    throw Error(ErrorCode::io, checkpoint.sidecar_problem() +
                                   " (a load that verifies needs its hashes; or load without "
                                   "verify)");
}

std::string hash_sidecar_path(const std::string& checkpoint_path) {
  std::error_code ec;
  if (fs::is_directory(checkpoint_path, ec))
    return (fs::path(checkpoint_path) / kHashSidecarName).string();
  return checkpoint_path + "." + kHashSidecarName;
}

namespace detail {

void apply_hash_sidecar(const std::string& checkpoint_path, const Checkpoint& checkpoint,
                        std::vector<CheckpointTensor>& tensors) {
  const std::vector<CheckpointFile>& files = checkpoint.files();
  const std::string path = hash_sidecar_path(checkpoint_path);
  std::error_code ec;
  if (!fs::exists(path, ec)) return;
  std::string text, why;
  if (!read_regular_file(path, kMaxSidecarBytes, &text, &why)) sidecar_error(path, why);
  nlohmann::json doc;
  try {
    doc = parse_strict_json(text, "the sidecar", 8);
  } catch (const StrictJsonError& e) {
    sidecar_error(path, e.message);
  }
  if (!doc.is_object()) sidecar_error(path, "it is not a JSON object");
  only_keys(doc, {"format", "files", "tensors"}, path, "the sidecar");
  const nlohmann::json& format = member(doc, "format", path, "the sidecar");
  if (!format.is_string() || format.get<std::string>() != kFormat)
    sidecar_error(path, std::string("its format is not \"") + kFormat + "\"");
  check_identities(doc, files, path, checkpoint_path);
  const nlohmann::json& list = member(doc, "tensors", path, "the sidecar");
  if (!list.is_object()) sidecar_error(path, "\"tensors\" is not an object");
  for (const auto& [name, entry] : list.items()) {
    const std::string where = "tensor " + shown(name);
    const CheckpointTensor* found = checkpoint.find(name);
    if (found == nullptr)
      sidecar_error(path, where +
                              " is not in the checkpoint: the sidecar was recorded for "
                              "another checkpoint (run pinstage hash again)");
    CheckpointTensor& t = tensors[static_cast<size_t>(found - checkpoint.tensors().data())];
    if (!entry.is_object()) sidecar_error(path, where + " is not an object");
    only_keys(entry, {"file", "offset", "bytes", "xxh3"}, path, where);
    const nlohmann::json& file = member(entry, "file", path, where);
    const std::string shard = fs::path(files[t.file].path).filename().string();
    if (!file.is_string() || file.get<std::string>() != shard ||
        whole_number(member(entry, "offset", path, where), path, where + " offset") != t.offset ||
        whole_number(member(entry, "bytes", path, where), path, where + " bytes") != t.bytes)
      sidecar_error(path, where +
                              " was recorded at another place or size than the checkpoint "
                              "has now: it changed since (run pinstage hash again)");
    const nlohmann::json& hex = member(entry, "xxh3", path, where);
    const auto hash = hex.is_string() ? parse_xxh3_hex(hex.get<std::string>()) : std::nullopt;
    if (!hash) sidecar_error(path, where + " xxh3 is not 16 hex digits");
    if (t.xxh3 && *t.xxh3 != *hash)
      sidecar_error(path, where + " has xxh3 " + xxh3_hex(*hash) + " but its writer recorded " +
                              xxh3_hex(*t.xxh3));
    t.xxh3 = hash;
  }
}

}  // namespace detail

namespace {

// The hash the checkpoint's writer recorded for `t` (its file's metadata), never one a
// sidecar gave: a stale sidecar's hash is no evidence of damage.
std::optional<uint64_t> writer_hash(const CheckpointFile& file, const CheckpointTensor& t) {
  const std::string key = kSafetensorsXxh3Key + t.name;
  for (const auto& [k, v] : file.metadata)
    if (k == key) return parse_xxh3_hex(v);
  return std::nullopt;
}

// Each file open for reading, with its identity as read.
struct OpenFiles {
  std::vector<int> fds;
  nlohmann::ordered_json identities = nlohmann::ordered_json::object();
  explicit OpenFiles(const std::vector<CheckpointFile>& files) : fds(files.size(), -1) {
    for (size_t f = 0; f < files.size(); ++f) {
      std::string why;
      fds[f] = open_regular_file(files[f].path, O_RDONLY | O_CLOEXEC, &why);
      struct stat st {};
      if (fds[f] >= 0 && ::fstat(fds[f], &st) != 0) why = std::strerror(errno);
      if (!why.empty() || fds[f] < 0)
        throw Error(ErrorCode::io, "hash_checkpoint: '" + files[f].path + "': " + why);
      identities[fs::path(files[f].path).filename().string()] = identity_json(identity_of(st));
    }
  }
  ~OpenFiles() {
    for (int fd : fds)
      if (fd >= 0) ::close(fd);
  }
  OpenFiles(const OpenFiles&) = delete;
  OpenFiles& operator=(const OpenFiles&) = delete;
};

}  // namespace

HashReport hash_checkpoint(const Checkpoint& checkpoint, const CheckpointLoadOptions& options) {
  detail::check_load_options(options, false, "hash_checkpoint");
  const Stopwatch clock;
  const auto& files = checkpoint.files();
  const OpenFiles open(files);
  const auto& tensors = checkpoint.tensors();
  std::vector<uint64_t> hashes(tensors.size());
  parallel_for(
      tensors.size(), 1,
      [&](size_t begin, size_t end) {
        std::vector<char> buf;
        for (size_t i = begin; i < end; ++i) {
          const CheckpointTensor& t = tensors[i];
          hashes[i] =
              hash_tensor(open.fds[t.file], t, options.chunk_bytes, buf, files[t.file].path);
        }
      },
      options.threads);
  HashReport report;
  nlohmann::ordered_json list = nlohmann::ordered_json::object();
  for (size_t i = 0; i < tensors.size(); ++i) {
    const CheckpointTensor& t = tensors[i];
    const std::optional<uint64_t> recorded = writer_hash(files[t.file], t);
    if (recorded && *recorded != hashes[i])
      throw Error(ErrorCode::mismatch,
                  "hash_checkpoint: tensor " + shown(t.name) + " of '" + files[t.file].path +
                      "' reads as xxh3 " + xxh3_hex(hashes[i]) + " but its recorded hash is " +
                      xxh3_hex(*recorded) + ": the file is damaged; no sidecar was written");
    if (recorded) ++report.already_recorded;
    list[t.name] = {{"file", fs::path(files[t.file].path).filename().string()},
                    {"offset", t.offset},
                    {"bytes", t.bytes},
                    {"xxh3", xxh3_hex(hashes[i])}};
    report.bytes += t.bytes;
  }
  report.tensors = tensors.size();
  report.sidecar = hash_sidecar_path(checkpoint.path());
  const nlohmann::ordered_json doc = {
      {"format", kFormat}, {"files", open.identities}, {"tensors", list}};
  write_file_atomically(report.sidecar, doc.dump(1) + "\n");
  report.seconds = clock.seconds();
  return report;
}

HashReport hash_checkpoint(const std::string& path, const CheckpointLoadOptions& options) {
  return hash_checkpoint(detail::open_checkpoint_without_sidecar(path), options);
}

}  // namespace pinstage
