// TaskArgs to and from .safetensors files: an 8-byte little-endian header length, a JSON
// header ({name: {dtype, shape, data_offsets}}, plus "__metadata__"), then the raw bytes.
// Each tensor's direction is kept in the metadata as "pinstage.direction.<name>": "IN" |
// "INOUT" | "OUT", so a round trip keeps it, and its xxh3-64 as "pinstage.xxh3.<name>"
// (16 lower-case hex digits), so a loader can verify it. See docs/tensors.md and
// docs/loading.md.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "pinstage/export.h"
#include "pinstage/tensor.h"

namespace pinstage {

// Limits on untrusted headers: the format's own 100 MiB header limit, and a JSON nesting
// depth far above what a valid header needs (3), so a hostile file cannot exhaust the
// stack or the heap of anything that walks the parsed value.
inline constexpr uint64_t kSafetensorsMaxHeaderBytes = uint64_t{100} << 20;
inline constexpr int kSafetensorsMaxJsonDepth = 32;
// Metadata keys pinstage writes: the prefix, then the tensor's name.
inline constexpr const char* kSafetensorsDirectionKey = "pinstage.direction.";
inline constexpr const char* kSafetensorsXxh3Key = "pinstage.xxh3.";

// Bytes per element of a safetensors dtype (BOOL, U8, I8, I16, I32, I64, F16, BF16, F32,
// F64, F8_E4M3, F8_E5M2); 0 for any other name. Dtypes pinstage does not compute on are
// carried as raw bytes.
PINSTAGE_API size_t safetensors_dtype_size(std::string_view dtype);

// One tensor of a validated header, any safetensors dtype.
struct SafetensorsTensorInfo {
  std::string name;
  std::string dtype;  // the safetensors spelling, e.g. "F8_E4M3"
  size_t element_size = 0;
  std::vector<int64_t> shape;
  uint64_t begin = 0;  // byte offsets into the data section, [begin, end)
  uint64_t end = 0;
};

// A validated header: tensors in data order (they tile the data section exactly) and
// __metadata__ sorted by key.
struct SafetensorsHeader {
  std::vector<SafetensorsTensorInfo> tensors;
  std::vector<std::pair<std::string, std::string>> metadata;
  uint64_t data_start = 0;  // file offset of the data section (8 + header length)
  uint64_t data_size = 0;   // bytes of the data section
};

// Parses and validates header JSON `text` from memory for a data section of `data_size`
// bytes, naming `source` in errors; data_start is set to 8 + text.size(). The entry point
// of the header fuzz target. Throws Error(io) for: a header over
// kSafetensorsMaxHeaderBytes, a leading byte-order mark, bad JSON, nesting deeper than
// kSafetensorsMaxJsonDepth, a repeated key at any level (top level, inside a tensor entry,
// in __metadata__), a name that is empty or holds a NUL, an unknown dtype or field, a shape
// whose byte size differs from its data_offsets, offsets out of range, overlapping or
// leaving gaps, metadata that is not strings, and bad pinstage.* metadata. Messages quote
// untrusted text truncated and never print a structured value.
PINSTAGE_API SafetensorsHeader parse_safetensors_header(std::string_view text, uint64_t data_size,
                                                        const std::string& source);

// Reads the header of the file at `path` (never its data) and validates it as above,
// checking the length field against the file's size. Throws Error(io) naming the path.
PINSTAGE_API SafetensorsHeader read_safetensors_layout(const std::string& path);

// xxh3-64 (the standard XXH3_64bits with seed 0, from Debian's libxxhash) of `bytes` at
// `data`: the per-tensor integrity hash the writer records and loaders check.
PINSTAGE_API uint64_t xxh3_64(const void* data, size_t bytes) noexcept;

// A content digest of large buffers on `threads` threads (0 = all cores): xxh3-64 of each
// fixed 4 MiB block, then xxh3-64 of those block digests in order. Its value depends on
// the bytes only (not the thread count); it is not xxh3_64 of the whole buffer. What a
// check that a buffer did not change uses (the ResidentBinder's write check, a scene's
// cache restore).
PINSTAGE_API uint64_t content_digest(const void* data, size_t bytes, int threads = 0);

// The same hash over bytes that arrive in order in pieces.
class PINSTAGE_API Xxh3Stream {
 public:
  Xxh3Stream();
  ~Xxh3Stream();
  Xxh3Stream(const Xxh3Stream&) = delete;
  Xxh3Stream& operator=(const Xxh3Stream&) = delete;
  Xxh3Stream(Xxh3Stream&& other) noexcept;
  Xxh3Stream& operator=(Xxh3Stream&& other) noexcept;
  void update(const void* data, size_t bytes) noexcept;
  uint64_t digest() const noexcept;

 private:
  void* state_ = nullptr;  // an XXH3_state_t
};

// A hash as its metadata text (16 lower-case hex digits), and back (nullopt unless the
// text is exactly that).
PINSTAGE_API std::string xxh3_hex(uint64_t hash);
PINSTAGE_API std::optional<uint64_t> parse_xxh3_hex(std::string_view text);

// One tensor of a validated header, as a pinstage tensor.
struct SafetensorsEntry {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  Direction dir;
  uint64_t begin;  // byte offsets into the data section, [begin, end)
  uint64_t end;
};

// How load_safetensors reads a file.
struct SafetensorsLoadOptions {
  // Direction of a tensor the metadata does not name (files written elsewhere).
  Direction default_direction = Direction::in;
  int threads = 0;  // reader threads; 0 = all cores
};

// Writes `args` in order (tensor data back to back, header padded to 8 bytes), recording
// each tensor's direction and xxh3-64 in __metadata__. Returns the file's size. Writes
// through AtomicFile (pinstage/atomic_file.h): `path` is checked before any work (a
// device, FIFO or directory is refused), and on any failure the previous file at `path`
// is left as it was. Throws Error(io) naming the path and the reason,
// Error(invalid_argument) for a tensor named "__metadata__".
PINSTAGE_API uint64_t save_safetensors(const TaskArgs& args, const std::string& path);

// Reads and fully validates the header of `path` (read_safetensors_layout) without
// reading any tensor data; entries are in data order. Every safetensors dtype maps onto a
// DType (those pinstage does not compute on are raw storage).
PINSTAGE_API std::vector<SafetensorsEntry> read_safetensors_header(
    const std::string& path, const SafetensorsLoadOptions& options = {});

// Validates the header (as above), allocates every tensor from `allocator`, then reads
// the data straight into that storage in parallel. Tensors come back in data order. A bad
// file or read throws Error(io), a failed allocation the allocator's error (such as
// out_of_memory), threads < 0 Error(invalid_argument); none leaves anything allocated.
PINSTAGE_API TaskArgs load_safetensors(const std::string& path, HostAllocator& allocator,
                                       const SafetensorsLoadOptions& options = {});

}  // namespace pinstage
