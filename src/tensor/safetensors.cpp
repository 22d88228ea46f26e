// safetensors I/O: header writing and full validation (any dtype), data read straight
// into the allocator's storage, and the xxh3-64 integrity hash.
#include "pinstage/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>
#include <set>
#include <unordered_map>

#include "pinstage/atomic_file.h"
#include "pinstage/error.h"
#include "pinstage/files.h"
#include "pinstage/pages.h"
#include "pinstage/parallel.h"
#include "tensor/strict_json.h"

// The standard xxh3 implementation (Debian's libxxhash-dev), compiled in from its header
// so the library needs no run-time libxxhash.
#define XXH_INLINE_ALL
#include <xxhash.h>

namespace pinstage {

namespace {

constexpr uint64_t kIoChunk = uint64_t{8} << 20;
using detail::shown;

[[noreturn]] void io_error(const std::string& path, const std::string& what) {
  throw Error(ErrorCode::io, "safetensors '" + path + "': " + what);
}

std::string sys_reason(int err) { return std::strerror(err); }

// An untrusted JSON value for a message: scalars bounded, structures only named (dumping
// them would recurse over and print whatever the file holds).
std::string describe(const nlohmann::json& v) {
  if (v.is_array()) return "an array of " + std::to_string(v.size()) + " items";
  if (v.is_object()) return "an object of " + std::to_string(v.size()) + " keys";
  if (v.is_string()) return "the string " + shown(v.get_ref<const std::string&>());
  return shown(v.dump());
}

void read_all(int fd, void* data, uint64_t bytes, uint64_t offset, const std::string& path) {
  if (pread_full(fd, data, bytes, offset) == bytes) return;
  if (errno != 0) io_error(path, "read failed: " + sys_reason(errno));
  io_error(path, "the file ended early (was it changed while being read?)");
}

uint64_t to_u64(const nlohmann::json& v, const std::string& path, const std::string& what) {
  if (!v.is_number_integer() || (!v.is_number_unsigned() && v.get<int64_t>() < 0))
    io_error(path, what + " must be a non-negative integer, got " + describe(v));
  return v.get<uint64_t>();
}

// The header as a JSON object, parsed strictly (strict_json.h): nesting past
// kSafetensorsMaxJsonDepth, a repeated key in any object and a BOM are refused.
nlohmann::json parse_header_json(std::string_view text, const std::string& path) {
  nlohmann::json header;
  try {
    header = detail::parse_strict_json(text, "the header", kSafetensorsMaxJsonDepth);
  } catch (const detail::StrictJsonError& e) {
    io_error(path, e.message);
  }
  if (!header.is_object())
    io_error(path, "the header must be a JSON object, got " + std::string(header.type_name()));
  return header;
}

void check_name(const std::string& name, const std::string& what, const std::string& path) {
  if (name.empty()) io_error(path, what + " has an empty name");
  if (name.find('\0') != std::string::npos)
    io_error(path, what + " " + shown(name) + " holds a NUL byte");
}

std::vector<std::pair<std::string, std::string>> parse_metadata(const nlohmann::json& v,
                                                                const std::string& path) {
  if (!v.is_object()) io_error(path, "__metadata__ must be an object of strings");
  std::vector<std::pair<std::string, std::string>> out;
  for (auto m = v.begin(); m != v.end(); ++m) {
    // An empty key is allowed, as the reference writes and reads one; a NUL byte is not.
    if (m.key().find('\0') != std::string::npos)
      io_error(path, "a __metadata__ key " + shown(m.key()) + " holds a NUL byte");
    if (!m.value().is_string())
      io_error(path, "__metadata__ entry " + shown(m.key()) + " must be a string, got " +
                         describe(m.value()));
    out.emplace_back(m.key(), m.value().get<std::string>());
  }
  return out;
}

std::vector<int64_t> parse_shape(const nlohmann::json& v, const std::string& where,
                                 const std::string& path) {
  if (!v.contains("shape") || !v["shape"].is_array()) io_error(path, where + " has no shape array");
  std::vector<int64_t> shape;
  for (const auto& d : v["shape"]) {
    const uint64_t dim = to_u64(d, path, where + " shape dimension");
    if (dim > static_cast<uint64_t>(INT64_MAX))
      io_error(path, where + " has a dimension past INT64_MAX");
    shape.push_back(static_cast<int64_t>(dim));
  }
  return shape;
}

// numel * element size, or an error naming the tensor when it overflows.
uint64_t shape_bytes(const std::vector<int64_t>& shape, size_t element_size,
                     const std::string& where, const std::string& path) {
  uint64_t n = element_size;
  for (int64_t d : shape)
    if (__builtin_mul_overflow(n, static_cast<uint64_t>(d), &n) || n > uint64_t{INT64_MAX})
      io_error(path, where + ": shape " + format_shape(shape) + " overflows a 64-bit byte count");
  return n;
}

// One tensor entry, its byte range checked against its dtype and shape and the data.
SafetensorsTensorInfo parse_entry(const std::string& name, const nlohmann::json& v,
                                  uint64_t data_size, const std::string& path) {
  check_name(name, "a tensor", path);
  const std::string where = "tensor " + shown(name);
  if (!v.is_object())
    io_error(path, where + " must be an object with dtype, shape and data_offsets");
  for (auto f = v.begin(); f != v.end(); ++f)
    if (f.key() != "dtype" && f.key() != "shape" && f.key() != "data_offsets")
      io_error(path, where + " has an unknown field " + shown(f.key()) +
                         " (expected dtype, shape, data_offsets)");
  if (!v.contains("dtype") || !v["dtype"].is_string())
    io_error(path, where + " has no dtype string");
  SafetensorsTensorInfo info;
  info.name = name;
  info.dtype = v["dtype"].get<std::string>();
  info.element_size = safetensors_dtype_size(info.dtype);
  if (info.element_size == 0)
    io_error(path, where + " has the unknown dtype " + shown(info.dtype) +
                       " (safetensors dtypes: BOOL, U8, I8, I16, I32, I64, F16, BF16, F32, F64, "
                       "F8_E4M3, F8_E5M2)");
  info.shape = parse_shape(v, where, path);
  const uint64_t nbytes = shape_bytes(info.shape, info.element_size, where, path);
  if (!v.contains("data_offsets") || !v["data_offsets"].is_array() || v["data_offsets"].size() != 2)
    io_error(path, where + " needs data_offsets [begin, end]");
  info.begin = to_u64(v["data_offsets"][0], path, where + " data_offsets begin");
  info.end = to_u64(v["data_offsets"][1], path, where + " data_offsets end");
  const std::string range =
      "[" + std::to_string(info.begin) + ", " + std::to_string(info.end) + "]";
  if (info.begin > info.end)
    io_error(path, where + " has data_offsets " + range + ": begin is past end");
  if (info.end > data_size)
    io_error(path, where + " has data_offsets " + range + " past the end of the data section (" +
                       std::to_string(data_size) +
                       " bytes): the file is truncated or the offsets are wrong");
  if (info.end - info.begin != nbytes)
    io_error(path, where + " is " + info.dtype + " " + format_shape(info.shape) + ", which is " +
                       std::to_string(nbytes) + " bytes, but its data_offsets span " +
                       std::to_string(info.end - info.begin));
  return info;
}

// The tensors must tile the data section exactly: no overlap, no gap, nothing after.
void check_tiling(std::vector<SafetensorsTensorInfo>& tensors, uint64_t data_size,
                  const std::string& path) {
  std::stable_sort(tensors.begin(), tensors.end(),
                   [](const SafetensorsTensorInfo& a, const SafetensorsTensorInfo& b) {
                     return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
                   });
  uint64_t cursor = 0;
  const SafetensorsTensorInfo* prev = nullptr;
  for (const SafetensorsTensorInfo& e : tensors) {
    if (e.begin < cursor)
      io_error(path, "tensors " + shown(prev->name) + " and " + shown(e.name) + " overlap (bytes " +
                         std::to_string(e.begin) + " to " + std::to_string(cursor) + ")");
    if (e.begin > cursor)
      io_error(path, "bytes " + std::to_string(cursor) + " to " + std::to_string(e.begin) +
                         " of the data belong to no tensor");
    cursor = e.end;
    prev = &e;
  }
  if (cursor != data_size)
    io_error(path, "the data section has " + std::to_string(data_size) +
                       " bytes but the tensors cover " + std::to_string(cursor));
}

// pinstage's own metadata must name tensors of the file and hold valid values.
void check_pinstage_metadata(const SafetensorsHeader& h, const std::string& path) {
  std::set<std::string_view> names;
  for (const auto& t : h.tensors) names.insert(t.name);
  for (const auto& [key, value] : h.metadata) {
    for (const char* prefix : {kSafetensorsDirectionKey, kSafetensorsXxh3Key}) {
      if (key.rfind(prefix, 0) != 0) continue;
      const std::string name = key.substr(std::strlen(prefix));
      if (names.count(name) == 0)
        io_error(path, "__metadata__ " + shown(key) + " names " + shown(name) +
                           ", which is not in the file");
      const bool ok = prefix == kSafetensorsDirectionKey ? parse_direction(value).has_value()
                                                         : parse_xxh3_hex(value).has_value();
      if (!ok)
        io_error(path,
                 "__metadata__ " + shown(key) + " is " + shown(value) +
                     (prefix == kSafetensorsDirectionKey ? " (expected IN, INOUT or OUT)"
                                                         : " (expected 16 lower-case hex digits)"));
    }
  }
}

UniqueFd open_read(const std::string& path) {
  std::string why;
  UniqueFd fd(open_regular_file(path, 0, &why));
  if (fd.get() < 0) io_error(path, "cannot open: " + why);
  return fd;
}

// The header text of an open file, its length field checked against the file's size.
std::string read_header_text(int fd, const std::string& path, uint64_t* data_size) {
  struct stat st;
  if (::fstat(fd, &st) != 0) io_error(path, "cannot stat: " + sys_reason(errno));
  if (!S_ISREG(st.st_mode)) io_error(path, "not a regular file");
  const auto file_size = static_cast<uint64_t>(st.st_size);
  if (file_size < 8)
    io_error(path, "the file has " + std::to_string(file_size) +
                       " bytes; a safetensors file starts with an 8-byte header length");
  unsigned char len_bytes[8];
  read_all(fd, len_bytes, 8, 0, path);
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | len_bytes[i];
  if (header_len > file_size - 8)
    io_error(path, "the header length says " + std::to_string(header_len) + " bytes but only " +
                       std::to_string(file_size - 8) +
                       " follow it: the file is truncated or not safetensors");
  if (header_len > kSafetensorsMaxHeaderBytes)
    io_error(path, "the header length " + std::to_string(header_len) +
                       " is over the format's 100 MiB limit");
  std::string text(static_cast<size_t>(header_len), '\0');
  read_all(fd, text.data(), header_len, 8, path);
  *data_size = file_size - 8 - header_len;
  return text;
}

SafetensorsHeader layout_of(int fd, const std::string& path) {
  uint64_t data_size = 0;
  const std::string text = read_header_text(fd, path, &data_size);
  return parse_safetensors_header(text, data_size, path);
}

// A layout as pinstage tensors: the five computed dtypes and the recorded directions.
std::vector<SafetensorsEntry> entries_of(const SafetensorsHeader& h, const std::string& path,
                                         Direction default_direction) {
  std::unordered_map<std::string, Direction> dirs;
  const std::string prefix = kSafetensorsDirectionKey;
  for (const auto& [key, value] : h.metadata)
    if (key.rfind(prefix, 0) == 0) dirs[key.substr(prefix.size())] = *parse_direction(value);
  std::vector<SafetensorsEntry> out;
  for (const SafetensorsTensorInfo& t : h.tensors) {
    const std::optional<DType> dtype = parse_dtype(t.dtype);
    if (!dtype || t.dtype != dtype_safetensors_name(*dtype))
      io_error(path, "tensor " + shown(t.name) + " has the unknown dtype " + shown(t.dtype));
    const auto it = dirs.find(t.name);
    out.push_back({t.name, *dtype, t.shape, it == dirs.end() ? default_direction : it->second,
                   t.begin, t.end});
  }
  return out;
}

// The header of `args`: metadata first (its position is free), then the tensors in order.
std::string header_of(const TaskArgs& args, uint64_t* data_bytes) {
  nlohmann::ordered_json doc = nlohmann::ordered_json::object();
  doc["__metadata__"] = {{"format", "pt"}};
  uint64_t offset = 0;
  for (const Tensor& t : args) {
    if (t.name() == "__metadata__")
      throw Error(ErrorCode::invalid_argument,
                  "save_safetensors: '__metadata__' is reserved and cannot name a tensor");
    doc[t.name()] = {{"dtype", dtype_safetensors_name(t.dtype())},
                     {"shape", t.shape()},
                     {"data_offsets", {offset, offset + t.nbytes()}}};
    doc["__metadata__"][kSafetensorsDirectionKey + t.name()] = direction_name(t.direction());
    offset += t.nbytes();
  }
  // Hashes in parallel over tensors: the writer records them for every loader to check.
  std::vector<const Tensor*> list;
  for (const Tensor& t : args) list.push_back(&t);
  std::vector<uint64_t> hashes(list.size());
  parallel_for(list.size(), 1, [&](size_t b, size_t e) {
    for (size_t i = b; i < e; ++i) hashes[i] = xxh3_64(list[i]->data(), list[i]->nbytes());
  });
  for (size_t i = 0; i < list.size(); ++i)
    doc["__metadata__"][kSafetensorsXxh3Key + list[i]->name()] = xxh3_hex(hashes[i]);
  std::string text = doc.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // data starts 8-byte aligned
  *data_bytes = offset;
  return text;
}

}  // namespace

size_t safetensors_dtype_size(std::string_view dtype) {
  // The one dtype table (dtype.h), in its safetensors spelling only.
  const std::optional<DType> d = parse_dtype(dtype);
  return d && dtype == dtype_safetensors_name(*d) ? dtype_size(*d) : 0;
}

SafetensorsHeader parse_safetensors_header(std::string_view text, uint64_t data_size,
                                           const std::string& source) {
  if (text.size() > kSafetensorsMaxHeaderBytes)
    io_error(source, "the header length " + std::to_string(text.size()) +
                         " is over the format's 100 MiB limit");
  const nlohmann::json header = parse_header_json(text, source);
  SafetensorsHeader out;
  out.data_start = 8 + text.size();
  out.data_size = data_size;
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__")
      out.metadata = parse_metadata(it.value(), source);
    else
      out.tensors.push_back(parse_entry(it.key(), it.value(), data_size, source));
  }
  check_tiling(out.tensors, data_size, source);
  check_pinstage_metadata(out, source);
  return out;
}

SafetensorsHeader read_safetensors_layout(const std::string& path) {
  UniqueFd fd = open_read(path);
  return layout_of(fd.get(), path);
}

uint64_t xxh3_64(const void* data, size_t bytes) noexcept { return XXH3_64bits(data, bytes); }

uint64_t content_digest(const void* data, size_t bytes, int threads) {
  constexpr size_t kBlock = size_t{4} << 20;
  const size_t blocks = (bytes + kBlock - 1) / kBlock;
  std::vector<uint64_t> digests(blocks);
  const auto* base = static_cast<const unsigned char*>(data);
  parallel_for(
      blocks, 1,
      [&](size_t first, size_t last) {
        for (size_t b = first; b < last; ++b)
          digests[b] = XXH3_64bits(base + b * kBlock, std::min(kBlock, bytes - b * kBlock));
      },
      threads);
  return XXH3_64bits_withSeed(digests.data(), digests.size() * sizeof(uint64_t), bytes);
}

Xxh3Stream::Xxh3Stream() : state_(XXH3_createState()) {
  if (state_ == nullptr) throw Error(ErrorCode::out_of_memory, "xxh3: cannot allocate a state");
  XXH3_64bits_reset(static_cast<XXH3_state_t*>(state_));
}
Xxh3Stream::~Xxh3Stream() {
  if (state_ != nullptr) XXH3_freeState(static_cast<XXH3_state_t*>(state_));
}
Xxh3Stream::Xxh3Stream(Xxh3Stream&& other) noexcept
    : state_(std::exchange(other.state_, nullptr)) {}
Xxh3Stream& Xxh3Stream::operator=(Xxh3Stream&& other) noexcept {
  std::swap(state_, other.state_);
  return *this;
}
void Xxh3Stream::update(const void* data, size_t bytes) noexcept {
  if (bytes > 0) XXH3_64bits_update(static_cast<XXH3_state_t*>(state_), data, bytes);
}
uint64_t Xxh3Stream::digest() const noexcept {
  return XXH3_64bits_digest(static_cast<const XXH3_state_t*>(state_));
}

std::string xxh3_hex(uint64_t hash) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(hash));
  return buf;
}

std::optional<uint64_t> parse_xxh3_hex(std::string_view text) {
  if (text.size() != 16) return std::nullopt;
  uint64_t v = 0;
  for (char c : text) {
    int d = -1;
    if (c >= '0' && c <= '9') d = c - '0';
    if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
    if (d < 0) return std::nullopt;
    v = (v << 4) | static_cast<uint64_t>(d);
  }
  return v;
}

uint64_t save_safetensors(const TaskArgs& args, const std::string& path) {
  check_output_path(path);  // a device or a missing directory fails before any work
  uint64_t data_bytes = 0;
  const std::string text = header_of(args, &data_bytes);
  AtomicFile out(path);
  unsigned char len_bytes[8];
  uint64_t len = text.size();
  for (int i = 0; i < 8; ++i, len >>= 8) len_bytes[i] = static_cast<unsigned char>(len & 0xff);
  out.write(len_bytes, 8);
  out.write(text);
  for (const Tensor& t : args)
    if (t.nbytes() > 0) out.write(t.data(), t.nbytes());
  out.commit();  // until here the previous file at `path` is untouched
  return 8 + text.size() + data_bytes;
}

std::vector<SafetensorsEntry> read_safetensors_header(const std::string& path,
                                                      const SafetensorsLoadOptions& options) {
  return entries_of(read_safetensors_layout(path), path, options.default_direction);
}

TaskArgs load_safetensors(const std::string& path, HostAllocator& allocator,
                          const SafetensorsLoadOptions& options) {
  if (options.threads < 0)
    throw Error(ErrorCode::invalid_argument,
                "load_safetensors: threads must be >= 0 (0 = all cores)");
  UniqueFd fd = open_read(path);
  const SafetensorsHeader header = layout_of(fd.get(), path);
  const std::vector<SafetensorsEntry> entries = entries_of(header, path, options.default_direction);

  std::vector<Tensor> tensors;
  tensors.reserve(entries.size());
  for (const SafetensorsEntry& e : entries)
    tensors.push_back(Tensor::empty(e.name, e.dtype, e.shape, e.dir, allocator));

  struct Chunk {
    size_t tensor;
    uint64_t offset;  // within the tensor
    uint64_t bytes;
  };
  std::vector<Chunk> chunks;
  for (size_t i = 0; i < tensors.size(); ++i)
    for (uint64_t off = 0; off < tensors[i].nbytes(); off += kIoChunk)
      chunks.push_back({i, off, std::min(kIoChunk, tensors[i].nbytes() - off)});
  const bool populate = !allocator.pinned();
  const int want = options.threads > 0 ? options.threads : default_thread_count();
  std::atomic<size_t> next{0};
  parallel_for(
      static_cast<size_t>(want), 1,
      [&](size_t, size_t) {
        for (size_t i = next.fetch_add(1); i < chunks.size(); i = next.fetch_add(1)) {
          const Chunk& c = chunks[i];
          auto* dst = static_cast<unsigned char*>(tensors[c.tensor].data()) + c.offset;
          if (populate) populate_for_write(dst, c.bytes);
          read_all(fd.get(), dst, c.bytes, header.data_start + entries[c.tensor].begin + c.offset,
                   path);
        }
      },
      want);

  TaskArgs args;
  for (Tensor& t : tensors) args.add(std::move(t));
  return args;
}

}  // namespace pinstage
