// safetensors I/O: header writing and full validation, data read straight into the
// allocator's storage.
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

#include "pinstage/error.h"
#include "pinstage/pages.h"
#include "pinstage/parallel.h"

namespace pinstage {

namespace {

constexpr uint64_t kMaxHeaderBytes = uint64_t{100} << 20;  // the format's own limit
constexpr const char* kDirectionKey = "pinstage.direction.";
constexpr uint64_t kIoChunk = uint64_t{8} << 20;

// Closes the descriptor on every path out.
struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

[[noreturn]] void io_error(const std::string& path, const std::string& what) {
  throw Error(ErrorCode::io, "safetensors '" + path + "': " + what);
}

std::string sys_reason(int err) { return std::strerror(err); }

void write_all(int fd, const void* data, uint64_t bytes, const std::string& path) {
  const auto* p = static_cast<const unsigned char*>(data);
  while (bytes > 0) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(bytes, uint64_t{1} << 30));
    const ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      io_error(path, "write failed: " + sys_reason(errno));
    }
    p += w;
    bytes -= static_cast<uint64_t>(w);
  }
}

// Reads exactly `bytes` at `offset`; a short read means the file ended early.
void read_all(int fd, void* data, uint64_t bytes, uint64_t offset, const std::string& path) {
  auto* p = static_cast<unsigned char*>(data);
  while (bytes > 0) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(bytes, uint64_t{1} << 30));
    const ssize_t r = ::pread(fd, p, n, static_cast<off_t>(offset));
    if (r < 0) {
      if (errno == EINTR) continue;
      io_error(path, "read failed: " + sys_reason(errno));
    }
    if (r == 0) io_error(path, "the file ended early (was it changed while being read?)");
    p += r;
    bytes -= static_cast<uint64_t>(r);
    offset += static_cast<uint64_t>(r);
  }
}

uint64_t to_u64(const nlohmann::json& v, const std::string& path, const std::string& what) {
  if (!v.is_number_integer() || (!v.is_number_unsigned() && v.get<int64_t>() < 0))
    io_error(path, what + " must be a non-negative integer, got " + v.dump());
  return v.get<uint64_t>();
}

struct Header {
  std::vector<SafetensorsEntry> entries;  // in data order
  uint64_t data_start = 0;                // file offset of the data section
};

// The header's JSON text and where the data section starts, checked against the file.
std::string read_header_text(int fd, const std::string& path, uint64_t* data_start,
                             uint64_t* data_size) {
  struct stat st;
  if (::fstat(fd, &st) != 0) io_error(path, "cannot stat: " + sys_reason(errno));
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
  if (header_len > kMaxHeaderBytes)
    io_error(path, "the header length " + std::to_string(header_len) +
                       " is over the format's 100 MiB limit");
  std::string text(static_cast<size_t>(header_len), '\0');
  read_all(fd, text.data(), header_len, 8, path);
  *data_start = 8 + header_len;
  *data_size = file_size - *data_start;
  return text;
}

// The header as a JSON object; a repeated top-level key is refused (it would silently
// shadow the first).
nlohmann::json parse_header_json(const std::string& text, const std::string& path) {
  std::set<std::string> seen;
  std::string duplicate;
  nlohmann::json::parser_callback_t on_event = [&](int depth, nlohmann::json::parse_event_t event,
                                                   nlohmann::json& parsed) {
    if (event == nlohmann::json::parse_event_t::key && depth == 1 && parsed.is_string() &&
        !seen.insert(parsed.get<std::string>()).second && duplicate.empty())
      duplicate = parsed.get<std::string>();
    return true;
  };
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(text, on_event);
  } catch (const nlohmann::json::exception& e) {
    io_error(path, std::string("the header is not valid JSON: ") + e.what());
  }
  if (!duplicate.empty()) io_error(path, "the header names '" + duplicate + "' twice");
  if (!header.is_object())
    io_error(path, "the header must be a JSON object, got " + std::string(header.type_name()));
  return header;
}

void check_metadata(const nlohmann::json& v, const std::string& path) {
  if (!v.is_object()) io_error(path, "__metadata__ must be an object of strings");
  for (auto m = v.begin(); m != v.end(); ++m)
    if (!m.value().is_string())
      io_error(path,
               "__metadata__ entry '" + m.key() + "' must be a string, got " + m.value().dump());
}

// The dtype and shape of one tensor entry.
std::pair<DType, std::vector<int64_t>> parse_dtype_and_shape(const nlohmann::json& v,
                                                             const std::string& where,
                                                             const std::string& path) {
  if (!v.contains("dtype") || !v["dtype"].is_string())
    io_error(path, where + " has no dtype string");
  const std::string dtype_text = v["dtype"].get<std::string>();
  const std::optional<DType> dtype = parse_dtype(dtype_text);
  if (!dtype || dtype_text != dtype_safetensors_name(*dtype))
    io_error(path, where + " has dtype '" + dtype_text +
                       "', which pinstage does not support (BF16, F16, F32, I32, I64)");
  if (!v.contains("shape") || !v["shape"].is_array()) io_error(path, where + " has no shape array");
  std::vector<int64_t> shape;
  for (const auto& d : v["shape"]) {
    const uint64_t dim = to_u64(d, path, where + " shape dimension");
    if (dim > static_cast<uint64_t>(INT64_MAX))
      io_error(path, where + " has a dimension past INT64_MAX");
    shape.push_back(static_cast<int64_t>(dim));
  }
  return {*dtype, std::move(shape)};
}

// One tensor entry, its byte range checked against its dtype and shape and the data.
SafetensorsEntry parse_entry(const std::string& name, const nlohmann::json& v, uint64_t data_size,
                             const std::string& path, Direction dir) {
  const std::string where = "tensor '" + name + "'";
  if (name.empty()) io_error(path, "a tensor has an empty name");
  if (!v.is_object())
    io_error(path, where + " must be an object with dtype, shape and data_offsets");
  for (auto f = v.begin(); f != v.end(); ++f)
    if (f.key() != "dtype" && f.key() != "shape" && f.key() != "data_offsets")
      io_error(path, where + " has an unknown field '" + f.key() +
                         "' (expected dtype, shape, data_offsets)");
  auto [dtype, shape] = parse_dtype_and_shape(v, where, path);
  uint64_t nbytes = 0;
  try {
    nbytes = checked_nbytes(shape, dtype);
  } catch (const Error& e) {
    io_error(path, where + ": " + e.what());
  }
  if (!v.contains("data_offsets") || !v["data_offsets"].is_array() || v["data_offsets"].size() != 2)
    io_error(path, where + " needs data_offsets [begin, end]");
  const uint64_t begin = to_u64(v["data_offsets"][0], path, where + " data_offsets begin");
  const uint64_t end = to_u64(v["data_offsets"][1], path, where + " data_offsets end");
  const std::string range = "[" + std::to_string(begin) + ", " + std::to_string(end) + "]";
  if (begin > end) io_error(path, where + " has data_offsets " + range + ": begin is past end");
  if (end > data_size)
    io_error(path, where + " has data_offsets " + range + " past the end of the data section (" +
                       std::to_string(data_size) +
                       " bytes): the file is truncated or the offsets are wrong");
  if (end - begin != nbytes)
    io_error(path, where + " is " + dtype_safetensors_name(dtype) + " " + format_shape(shape) +
                       ", which is " + std::to_string(nbytes) +
                       " bytes, but its data_offsets span " + std::to_string(end - begin));
  return {name, dtype, std::move(shape), dir, begin, end};
}

// The tensors must tile the data section exactly: no overlap, no gap, nothing after.
void check_tiling(std::vector<SafetensorsEntry>& entries, uint64_t data_size,
                  const std::string& path) {
  std::stable_sort(entries.begin(), entries.end(),
                   [](const SafetensorsEntry& a, const SafetensorsEntry& b) {
                     return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
                   });
  uint64_t cursor = 0;
  const SafetensorsEntry* prev = nullptr;
  for (const SafetensorsEntry& e : entries) {
    if (e.begin < cursor)
      io_error(path, "tensors '" + prev->name + "' and '" + e.name + "' overlap (bytes " +
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

// pinstage's own metadata: "pinstage.direction.<tensor>" = IN | INOUT | OUT.
void apply_directions(const nlohmann::json& metadata, std::vector<SafetensorsEntry>& entries,
                      const std::string& path) {
  const std::string prefix = kDirectionKey;
  for (auto m = metadata.begin(); m != metadata.end(); ++m) {
    if (m.key().rfind(prefix, 0) != 0) continue;  // other tools' metadata is kept out
    const std::string name = m.key().substr(prefix.size());
    auto it = std::find_if(entries.begin(), entries.end(),
                           [&](const SafetensorsEntry& e) { return e.name == name; });
    if (it == entries.end())
      io_error(path, "__metadata__ gives a direction for '" + name + "', which is not in the file");
    const auto dir = parse_direction(m.value().get<std::string>());
    if (!dir)
      io_error(path, "__metadata__ direction of '" + name + "' is '" +
                         m.value().get<std::string>() + "' (expected IN, INOUT or OUT)");
    it->dir = *dir;
  }
}

Header parse_header(int fd, const std::string& path, const SafetensorsLoadOptions& options) {
  Header out;
  uint64_t data_size = 0;
  const nlohmann::json header =
      parse_header_json(read_header_text(fd, path, &out.data_start, &data_size), path);
  const nlohmann::json* metadata = nullptr;
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") {
      check_metadata(it.value(), path);
      metadata = &it.value();
      continue;
    }
    out.entries.push_back(
        parse_entry(it.key(), it.value(), data_size, path, options.default_direction));
  }
  check_tiling(out.entries, data_size, path);
  if (metadata != nullptr) apply_directions(*metadata, out.entries, path);
  return out;
}

Fd open_read(const std::string& path) {
  Fd fd;
  fd.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd.fd < 0) io_error(path, "cannot open: " + sys_reason(errno));
  return fd;
}

}  // namespace

uint64_t save_safetensors(const TaskArgs& args, const std::string& path) {
  // Metadata first (its position is free in the format), then the tensors in order.
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
    doc["__metadata__"][kDirectionKey + t.name()] = direction_name(t.direction());
    offset += t.nbytes();
  }
  std::string text = doc.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // data starts 8-byte aligned

  Fd fd;
  fd.fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd.fd < 0) io_error(path, "cannot create: " + sys_reason(errno));
  try {
    unsigned char len_bytes[8];
    uint64_t len = text.size();
    for (int i = 0; i < 8; ++i, len >>= 8) len_bytes[i] = static_cast<unsigned char>(len & 0xff);
    write_all(fd.fd, len_bytes, 8, path);
    write_all(fd.fd, text.data(), text.size(), path);
    for (const Tensor& t : args) write_all(fd.fd, t.data(), t.nbytes(), path);
    if (::close(fd.fd) != 0) {
      fd.fd = -1;
      io_error(path, "close failed: " + sys_reason(errno));
    }
    fd.fd = -1;
  } catch (...) {
    ::unlink(path.c_str());
    throw;
  }
  return 8 + text.size() + offset;
}

std::vector<SafetensorsEntry> read_safetensors_header(const std::string& path,
                                                      const SafetensorsLoadOptions& options) {
  Fd fd = open_read(path);
  return parse_header(fd.fd, path, options).entries;
}

TaskArgs load_safetensors(const std::string& path, HostAllocator& allocator,
                          const SafetensorsLoadOptions& options) {
  if (options.threads < 0)
    throw Error(ErrorCode::invalid_argument,
                "load_safetensors: threads must be >= 0 (0 = all cores)");
  Fd fd = open_read(path);
  const Header header = parse_header(fd.fd, path, options);

  std::vector<Tensor> tensors;
  tensors.reserve(header.entries.size());
  for (const SafetensorsEntry& e : header.entries)
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
          read_all(fd.fd, dst, c.bytes,
                   header.data_start + header.entries[c.tensor].begin + c.offset, path);
        }
      },
      want);

  TaskArgs args;
  for (Tensor& t : tensors) args.add(std::move(t));
  return args;
}

}  // namespace pinstage
