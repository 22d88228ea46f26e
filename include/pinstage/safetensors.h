// TaskArgs to and from .safetensors files: an 8-byte little-endian header length, a JSON
// header ({name: {dtype, shape, data_offsets}}, plus "__metadata__"), then the raw bytes.
// Each tensor's direction is kept in the metadata as "pinstage.direction.<name>": "IN" |
// "INOUT" | "OUT", so a round trip keeps it. See docs/tensors.md.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "pinstage/export.h"
#include "pinstage/tensor.h"

namespace pinstage {

// One tensor of a validated header.
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

// Writes `args` in order (tensor data back to back, header padded to 8 bytes). Returns
// the file's size. Throws Error(io) naming the path and the reason; a partly written
// file is removed.
PINSTAGE_API uint64_t save_safetensors(const TaskArgs& args, const std::string& path);

// Reads and fully validates the header of `path` without reading any tensor data;
// entries are in data order. Throws Error(io) naming the problem: a file too short for
// its header, a header longer than the file, bad JSON, an unknown dtype, a shape whose
// byte size differs from its data_offsets, offsets out of range, overlapping or leaving
// gaps, a data section longer or shorter than the tensors, duplicate names, bad metadata.
PINSTAGE_API std::vector<SafetensorsEntry> read_safetensors_header(
    const std::string& path, const SafetensorsLoadOptions& options = {});

// Validates the header (as above), allocates every tensor from `allocator`, then reads
// the data straight into that storage in parallel. Tensors come back in data order. A bad
// file or read throws Error(io), a failed allocation the allocator's error (such as
// out_of_memory), threads < 0 Error(invalid_argument); none leaves anything allocated.
PINSTAGE_API TaskArgs load_safetensors(const std::string& path, HostAllocator& allocator,
                                       const SafetensorsLoadOptions& options = {});

}  // namespace pinstage
