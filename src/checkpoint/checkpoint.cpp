// Checkpoint: opening and validating the three layouts, the index parser, and the
// sharded writer. Reading tensor data is in load.cpp.
#include "pinstage/checkpoint.h"

#include "checkpoint/hash_sidecar.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <unordered_map>

#include "pinstage/atomic_file.h"
#include "pinstage/error.h"
#include "pinstage/files.h"
#include "pinstage/names.h"
#include "pinstage/safetensors.h"
#include "tensor/strict_json.h"

namespace pinstage {

namespace {

namespace fs = std::filesystem;

[[noreturn]] void ckpt_error(const std::string& where, const std::string& what) {
  throw Error(ErrorCode::io, "checkpoint '" + where + "': " + what);
}

using detail::shown;

// Index JSON with the same guards as a safetensors header: depth cap, repeated keys.
nlohmann::json parse_index_json(std::string_view text, const std::string& source) {
  if (text.size() > kCheckpointMaxIndexBytes)
    ckpt_error(source, "the index is " + std::to_string(text.size()) + " bytes, over the " +
                           std::to_string(kCheckpointMaxIndexBytes >> 20) + " MiB limit");
  try {
    return detail::parse_strict_json(text, "the index", kSafetensorsMaxJsonDepth);
  } catch (const detail::StrictJsonError& e) {
    ckpt_error(source, e.message);
  }
}

void check_shard_name(const std::string& tensor, const std::string& shard,
                      const std::string& source) {
  const bool plain = !shard.empty() && shard.find('/') == std::string::npos &&
                     shard.find('\0') == std::string::npos && shard != "." && shard != ".." &&
                     shard.size() > 12 && shard.ends_with(".safetensors");
  if (!plain)
    ckpt_error(source, "the weight_map puts tensor " + shown(tensor) + " in " + shown(shard) +
                           ", which is not a plain *.safetensors file name in the directory");
}

std::vector<std::pair<std::string, std::string>> index_metadata(const nlohmann::json& v,
                                                                const std::string& source) {
  std::vector<std::pair<std::string, std::string>> out;
  if (!v.is_object()) ckpt_error(source, "the index's \"metadata\" must be an object");
  for (auto it = v.begin(); it != v.end(); ++it) {
    if (it.key().empty() || it.key().find('\0') != std::string::npos)
      ckpt_error(source, "a metadata key is empty or holds a NUL byte");
    if (it.value().is_structured() || it.value().is_null())
      ckpt_error(source, "metadata " + shown(it.key()) + " is " +
                             (it.value().is_null() ? "null" : "an array or object") +
                             "; it must be a string, number or boolean");
    out.emplace_back(it.key(),
                     it.value().is_string() ? it.value().get<std::string>() : it.value().dump());
  }
  return out;
}

// Adds `kv` to `into`; the same key with another value is an error naming both places.
void merge_metadata(std::vector<std::pair<std::string, std::string>>& into,
                    std::map<std::string, std::string>& origin,
                    const std::vector<std::pair<std::string, std::string>>& kv,
                    const std::string& from) {
  for (const auto& entry : kv) {
    const std::string& key = entry.first;
    const std::string& value = entry.second;
    const auto it =
        std::find_if(into.begin(), into.end(), [&](const auto& p) { return p.first == key; });
    if (it == into.end()) {
      into.emplace_back(key, value);
      origin[key] = from;
    } else if (it->second != value) {
      ckpt_error(from, "metadata " + shown(key) + " is " + shown(value) + " here but " +
                           shown(it->second) + " in '" + origin[key] + "'");
    }
  }
}

std::string read_index_text(const std::string& path) {
  std::string text, why;
  if (!read_regular_file(path, kCheckpointMaxIndexBytes, &text, &why))
    ckpt_error(path, "cannot read the index: " + why);
  return text;
}

// The shard files of a directory without an index: every *.safetensors, sorted.
// A shard named <prefix>-<k>-of-<n><suffix>.safetensors (Hugging Face's and our writer's
// names), split into its parts; nullopt for any other name.
struct NumberedShard {
  std::string prefix, k, n, suffix;
};

bool all_digits(std::string_view s) {
  return !s.empty() && s.size() <= 9 &&
         std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

std::optional<NumberedShard> numbered_shard(const std::string& name) {
  const size_t of = name.rfind("-of-");
  const size_t dash = of == std::string::npos ? of : name.rfind('-', of == 0 ? 0 : of - 1);
  if (of == std::string::npos || dash == std::string::npos || dash >= of) return std::nullopt;
  size_t n_end = of + 4;
  while (n_end < name.size() && name[n_end] >= '0' && name[n_end] <= '9') ++n_end;
  NumberedShard s{name.substr(0, dash), name.substr(dash + 1, of - dash - 1),
                  name.substr(of + 4, n_end - of - 4), name.substr(n_end)};
  if (!all_digits(s.k) || !all_digits(s.n)) return std::nullopt;
  return s;
}

// The names say how many shards there are: a directory holding some of a series must
// hold them all, or the checkpoint would load short of tensors without a word.
void check_numbered_shards(const std::string& dir, const std::vector<std::string>& paths) {
  std::map<std::string, std::pair<NumberedShard, std::set<unsigned long>>> series;
  for (const std::string& p : paths) {
    const std::string name = fs::path(p).filename().string();
    const std::optional<NumberedShard> s = numbered_shard(name);
    if (!s) continue;
    const unsigned long k = std::stoul(s->k), n = std::stoul(s->n);
    if (k == 0 || k > n)
      ckpt_error(dir, "shard " + shown(name) + " is numbered " +
                          (k == 0 ? std::string("0 (shards count from 1)")
                                  : "past its count of " + std::to_string(n)) +
                          ": a stray file of another write? Move it out of the directory");
    auto& entry = series[s->prefix + '\n' + s->n + '\n' + s->suffix];
    entry.first = *s;
    entry.second.insert(k);
  }
  for (const auto& [key, entry] : series) {
    const auto& [s, have] = entry;
    const unsigned long n = std::stoul(s.n);
    if (have.size() == n) continue;
    std::string missing;
    size_t listed = 0;
    for (unsigned long k = 1; k <= n && listed < 5; ++k) {
      if (have.count(k)) continue;
      std::string digits = std::to_string(k);
      digits.insert(0, s.k.size() > digits.size() ? s.k.size() - digits.size() : 0, '0');
      missing += (listed++ ? ", " : "") + shown(s.prefix + "-" + digits + "-of-" + s.n + s.suffix);
    }
    const size_t absent = n - have.size();
    if (absent > listed) missing += " and " + std::to_string(absent - listed) + " more";
    ckpt_error(dir, "the directory holds " + std::to_string(have.size()) + " of the " +
                        std::to_string(n) + " shards of " +
                        shown(s.prefix + "-*-of-" + s.n + s.suffix) + ": " + missing +
                        (absent == 1 ? " is" : " are") +
                        " missing (restore them, or give the shards you have as files)");
  }
}

std::vector<std::string> shard_files(const std::string& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.path().extension() == ".safetensors" && e.is_regular_file())
      out.push_back(e.path().string());
  if (ec) ckpt_error(dir, "cannot list the directory: " + ec.message());
  std::sort(out.begin(), out.end());
  if (out.empty())
    ckpt_error(dir, std::string("the directory holds neither ") + kCheckpointIndexName +
                        " nor any *.safetensors file");
  check_numbered_shards(dir, out);
  return out;
}

// Set while open_checkpoint_without_sidecar runs on this thread.
thread_local bool t_skip_sidecar = false;

}  // namespace

namespace detail {

Checkpoint open_checkpoint_without_sidecar(const std::string& path) {
  struct Skip {
    Skip() { t_skip_sidecar = true; }
    ~Skip() { t_skip_sidecar = false; }
  } skip;
  return Checkpoint::open(path);
}

}  // namespace detail

const char* checkpoint_layout_name(CheckpointLayout layout) {
  static constexpr const char* kNames[] = {"single_file", "indexed_directory", "shard_directory"};
  return enum_name(layout, kNames);
}

CheckpointIndex parse_checkpoint_index(std::string_view text, const std::string& source) {
  const nlohmann::json doc = parse_index_json(text, source);
  if (!doc.is_object()) ckpt_error(source, "the index must be a JSON object");
  CheckpointIndex out;
  bool have_map = false;
  for (auto it = doc.begin(); it != doc.end(); ++it) {
    if (it.key() == "metadata") {
      out.metadata = index_metadata(it.value(), source);
    } else if (it.key() == "weight_map") {
      if (!it.value().is_object()) ckpt_error(source, "\"weight_map\" must be an object");
      have_map = true;
      for (auto w = it.value().begin(); w != it.value().end(); ++w) {
        if (w.key().empty() || w.key().find('\0') != std::string::npos)
          ckpt_error(source, "a weight_map tensor name is empty or holds a NUL byte");
        if (!w.value().is_string())
          ckpt_error(source, "the weight_map entry of " + shown(w.key()) + " must be a file name");
        check_shard_name(w.key(), w.value().get<std::string>(), source);
        out.weight_map.emplace_back(w.key(), w.value().get<std::string>());
      }
    } else {
      ckpt_error(source, "the index has an unknown key " + shown(it.key()) +
                             " (expected metadata, weight_map)");
    }
  }
  if (!have_map) ckpt_error(source, "the index has no \"weight_map\"");
  return out;
}

namespace {

// Reads every file's header and lists its tensors, each name in `by_name` (name -> place
// in `tensors`); a tensor in two files is refused. A template only so that it can fill
// Checkpoint's private index type.
template <class NameIndex>
void add_files(std::vector<CheckpointFile>& files, std::vector<CheckpointTensor>& tensors,
               NameIndex& by_name, const std::vector<std::string>& paths) {
  for (const std::string& p : paths) {
    struct stat st {};
    if (::stat(p.c_str(), &st) != 0)
      ckpt_error(p, std::string("the shard is missing: ") + std::strerror(errno));
    const SafetensorsHeader h = read_safetensors_layout(p);
    const size_t file = files.size();
    files.push_back({p, h.data_start + h.data_size, h.data_start, h.metadata});
    std::map<std::string, uint64_t> hashes;
    for (const auto& [k, v] : h.metadata)
      if (k.rfind(kSafetensorsXxh3Key, 0) == 0)
        hashes[k.substr(std::strlen(kSafetensorsXxh3Key))] = *parse_xxh3_hex(v);
    by_name.reserve(by_name.size() + h.tensors.size());
    for (const SafetensorsTensorInfo& t : h.tensors) {
      const auto [it, fresh] = by_name.emplace(t.name, tensors.size());
      if (!fresh)
        ckpt_error(p, "tensor " + shown(t.name) + " is listed twice: also in '" +
                          files[tensors[it->second].file].path + "'");
      CheckpointTensor ct{t.name,          t.dtype,     t.element_size,
                          t.shape,         file,        h.data_start + t.begin,
                          t.end - t.begin, std::nullopt};
      if (const auto hash = hashes.find(t.name); hash != hashes.end()) ct.xxh3 = hash->second;
      tensors.push_back(std::move(ct));
    }
  }
}

// The index and the shards must agree tensor for tensor.
void check_against_index(const CheckpointIndex& index, const std::vector<CheckpointFile>& files,
                         const std::vector<CheckpointTensor>& tensors, const std::string& dir) {
  std::map<std::string, std::string> listed(index.weight_map.begin(), index.weight_map.end());
  for (const CheckpointTensor& t : tensors) {
    const std::string shard = fs::path(files[t.file].path).filename().string();
    const auto it = listed.find(t.name);
    if (it == listed.end())
      ckpt_error(files[t.file].path,
                 "holds tensor " + shown(t.name) +
                     ", which the index does not list: it does not match the index");
    if (it->second != shard)
      ckpt_error(files[t.file].path, "holds tensor " + shown(t.name) +
                                         " but the index puts it in " + shown(it->second));
    listed.erase(it);
  }
  if (!listed.empty())
    ckpt_error(dir + "/" + listed.begin()->second,
               "the index puts tensor " + shown(listed.begin()->first) +
                   " in this shard, which does not hold it: it does not match the index");
}

// The checkpoint-level digest the sharded writer records in the index: xxh3-64 over
// every tensor's shard name, name, dtype, shape, place and recorded hash, in read order.
// A shard from another write changes it, even one that matches its own hashes.
uint64_t checkpoint_digest(const std::vector<CheckpointFile>& files,
                           const std::vector<CheckpointTensor>& tensors) {
  std::string text;
  for (const CheckpointTensor& t : tensors) {
    text += fs::path(files[t.file].path).filename().string();
    text += '\0' + t.name + '\0' + t.dtype + '\0';
    for (int64_t d : t.shape) text += std::to_string(d) + ',';
    text += '\0' + std::to_string(t.offset) + '\0' + std::to_string(t.bytes) + '\0' +
            (t.xxh3 ? xxh3_hex(*t.xxh3) : std::string("-")) + '\n';
  }
  return xxh3_64(text.data(), text.size());
}

void check_digest(const CheckpointIndex& index, const std::vector<CheckpointFile>& files,
                  const std::vector<CheckpointTensor>& tensors, const std::string& index_path) {
  for (const auto& [key, value] : index.metadata) {
    if (key != kCheckpointDigestKey) continue;
    const std::optional<uint64_t> recorded = parse_xxh3_hex(value);
    if (!recorded)
      ckpt_error(index_path, std::string("metadata '") + kCheckpointDigestKey + "' is " +
                                 shown(value) + " (expected 16 lower-case hex digits)");
    if (*recorded != checkpoint_digest(files, tensors))
      ckpt_error(index_path, std::string("the shards do not match the index's ") +
                                 kCheckpointDigestKey +
                                 ": they are not the files this index was written with (a "
                                 "mix of two writes?)");
  }
}

}  // namespace

Checkpoint Checkpoint::open(const std::string& path) {
  Checkpoint c;
  c.path_ = path;
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (ec || !fs::exists(st)) ckpt_error(path, "no such file or directory");
  std::vector<std::string> paths;
  std::optional<CheckpointIndex> index;
  if (fs::is_regular_file(st)) {
    paths.push_back(path);
  } else if (fs::is_directory(st)) {
    const std::string index_path = (fs::path(path) / kCheckpointIndexName).string();
    if (fs::exists(index_path)) {
      c.layout_ = CheckpointLayout::indexed_directory;
      index = parse_checkpoint_index(read_index_text(index_path), index_path);
      std::set<std::string> seen;
      for (const auto& [tensor, shard] : index->weight_map)
        if (seen.insert(shard).second) paths.push_back((fs::path(path) / shard).string());
      std::sort(paths.begin(), paths.end());
      if (paths.empty()) ckpt_error(index_path, "the weight_map is empty");
    } else {
      c.layout_ = CheckpointLayout::shard_directory;
      paths = shard_files(path);
    }
  } else {
    ckpt_error(path, "neither a regular file nor a directory");
  }
  add_files(c.files_, c.tensors_, c.by_name_, paths);
  std::map<std::string, std::string> origin;
  if (index) {
    check_against_index(*index, c.files_, c.tensors_, path);
    check_digest(*index, c.files_, c.tensors_, path + "/" + kCheckpointIndexName);
    merge_metadata(c.metadata_, origin, index->metadata, path + "/" + kCheckpointIndexName);
  }
  for (const CheckpointFile& f : c.files_) merge_metadata(c.metadata_, origin, f.metadata, f.path);
  if (!t_skip_sidecar) {
    std::vector<CheckpointTensor> hashed = c.tensors_;  // all of the sidecar or none of it
    try {
      detail::apply_hash_sidecar(path, c, hashed);
      c.tensors_ = std::move(hashed);
    } catch (const Error& e) {
      c.sidecar_problem_ = e.what();
    }
  }
  return c;
}

const CheckpointTensor* Checkpoint::find(std::string_view name) const noexcept {
  const auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &tensors_[it->second];
}

const CheckpointTensor& Checkpoint::get(std::string_view name) const {
  const CheckpointTensor* t = find(name);
  if (t == nullptr)
    throw Error(ErrorCode::not_found, "checkpoint '" + path_ + "' has no tensor " + shown(name));
  return *t;
}

uint64_t Checkpoint::total_bytes() const noexcept {
  uint64_t n = 0;
  for (const CheckpointTensor& t : tensors_) n += t.bytes;
  return n;
}

namespace {

// The shard names of the index in `dir`, if it has one that parses; else none.
std::set<std::string> indexed_shards(const std::string& dir) {
  std::set<std::string> out;
  const std::string index_path = (fs::path(dir) / kCheckpointIndexName).string();
  std::error_code ec;
  if (!fs::exists(index_path, ec)) return out;
  try {
    for (const auto& entry :
         parse_checkpoint_index(read_index_text(index_path), index_path).weight_map)
      out.insert(entry.second);
  } catch (const Error&) {
    out.clear();  // not ours to clean up after
  }
  return out;
}

// model-0000i-of-0000N.safetensors, or with a tag ("-3fa2b1c0") when a file of the plain
// names exists: a new write never overwrites a shard the current index may name.
std::vector<std::string> new_shard_names(const std::string& dir, size_t shards) {
  std::random_device random;
  for (int attempt = 0;; ++attempt) {
    char tag[16] = "";
    if (attempt > 0) std::snprintf(tag, sizeof tag, "-%08x", static_cast<unsigned>(random()));
    std::vector<std::string> names;
    bool taken = false;
    for (size_t i = 0; i < shards; ++i) {
      char name[80];
      std::snprintf(name, sizeof name, "model-%05zu-of-%05zu%s.safetensors", i + 1, shards, tag);
      names.emplace_back(name);
      std::error_code ec;
      taken = taken || fs::exists(fs::symlink_status(fs::path(dir) / name, ec));
    }
    if (!taken) return names;
    if (attempt == 100) ckpt_error(dir, "cannot find unused shard names");
  }
}

}  // namespace

size_t save_sharded_checkpoint(const TaskArgs& args, const std::string& dir, uint64_t shard_bytes,
                               const std::function<void(size_t, size_t)>& on_shard) {
  if (shard_bytes == 0)
    throw Error(ErrorCode::invalid_argument, "save_sharded_checkpoint: the shard size must be > 0");
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw Error(ErrorCode::io, "checkpoint '" + dir + "': cannot create: " + ec.message());
  const std::string index_path = (fs::path(dir) / kCheckpointIndexName).string();
  check_output_path(index_path);
  // Tensors in order, a new shard when the next one would pass shard_bytes.
  std::vector<TaskArgs> shards(1);
  uint64_t in_shard = 0;
  for (const Tensor& t : args) {
    if (!shards.back().empty() && in_shard + t.nbytes() > shard_bytes) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().add(t);
    in_shard += t.nbytes();
  }
  // The whole write is atomic: new shards under names no index uses, then the index (with
  // the digest of exactly those shards) in one rename, then the old shards go. Stopped
  // anywhere before the rename, the old checkpoint is whole.
  const std::set<std::string> old_shards = indexed_shards(dir);
  const std::vector<std::string> names = new_shard_names(dir, shards.size());
  nlohmann::ordered_json index;
  index["metadata"] = {{"total_size", args.total_bytes()}};
  index["weight_map"] = nlohmann::ordered_json::object();
  std::vector<std::string> paths;
  for (size_t i = 0; i < shards.size(); ++i) {
    paths.push_back((fs::path(dir) / names[i]).string());
    save_safetensors(shards[i], paths.back());
    for (const Tensor& t : shards[i]) index["weight_map"][t.name()] = names[i];
    if (on_shard) on_shard(i + 1, shards.size());
  }
  std::vector<CheckpointFile> files;
  std::vector<CheckpointTensor> tensors;
  std::unordered_map<std::string, size_t> by_name;
  std::sort(paths.begin(), paths.end());  // the order Checkpoint::open reads them in
  add_files(files, tensors, by_name, paths);
  index["metadata"][kCheckpointDigestKey] = xxh3_hex(checkpoint_digest(files, tensors));
  write_file_atomically(index_path, index.dump(2) + "\n");
  for (const std::string& old : old_shards)
    if (std::find(names.begin(), names.end(), old) == names.end())
      fs::remove(fs::path(dir) / old, ec);  // best effort: the index no longer names it
  return shards.size();
}

ReportFields report_fields(const LoadReport& r) {
  ReportFields fields{{"bytes", r.bytes},
                      {"tensors", uint64_t{r.tensors}},
                      {"files", uint64_t{r.files}},
                      {"threads", int64_t{r.threads}},
                      {"chunk_bytes", r.chunk_bytes},
                      {"total_s", r.total_s},
                      {"total_gbps", r.gbps(r.total_s)},
                      {"alloc_s", r.alloc_s},
                      {"read_s", r.read_s},
                      {"read_gbps", r.gbps(r.read_s)},
                      {"verify_s", r.verify_s},
                      {"upload_s", r.upload_s},
                      {"overlap", r.overlap},
                      {"ring_pinned_bytes", r.ring_pinned_bytes},
                      {"peak_pinned_bytes", r.peak_pinned_bytes},
                      {"direct", r.direct},
                      {"direct_note", r.direct_note},
                      {"verified", r.verified},
                      {"unverified", uint64_t{r.unverified}},
                      {"verify_readback_bytes", r.verify_readback_bytes},
                      {"mode", r.mode},
                      {"map_s", r.map_s},
                      {"pin_s", r.pin_s},
                      {"map_note", r.map_note},
                      {"host_pages", r.host_pages},
                      {"cache", r.cache},
                      {"cache_entry", r.cache_entry},
                      {"cache_note", r.cache_note},
                      {"map_folio_source", r.map_folio_source},
                      {"map_folios", r.map_folios},
                      {"map_huge_bytes", r.map_huge_bytes}};
  if (!r.device_first_touch_reason.empty()) {
    fields.push_back({"device_first_touch_bytes", r.device_first_touch_bytes});
    fields.push_back({"device_first_touch_s", r.device_first_touch_s});
    fields.push_back({"device_first_touch_reason", r.device_first_touch_reason});
  }
  return fields;
}

}  // namespace pinstage
