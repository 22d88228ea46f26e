// The two arms of `pinstage bench load` that read a checkpoint's files themselves rather
// than through the loader: read() then copy, and mmap then copy. Apart from the command so
// that tests can run them on a file truncated under them.
#pragma once

#include <functional>
#include <string>

#include "pinstage/checkpoint.h"
#include "pinstage/tensor.h"

namespace pinstage::cli {

// Error(io) "bench load: 'PATH': WHAT: strerror(errno)".
[[noreturn]] void bench_io(const std::string& path, const char* what);

// Arm a: read() each whole file into fresh pageable memory, then copy each tensor into
// its own pinned storage (what a Python user does by hand).
// A shard's descriptor (read-only), refused without blocking when it is not a regular
// file (open_regular_file); Error(io) naming it.
int open_shard(const std::string& path);

void arm_read_then_copy(const Checkpoint& c, HostAllocator& pinned);

// Arm b: mmap each file and copy each tensor out of the mapping into pinned storage (what
// safetensors' safe_open does, into pinned memory here so every arm ends in the same
// place). `after_map` (tests) runs for each file between its mmap and its copies.
void arm_mmap_copy(const Checkpoint& c, HostAllocator& pinned,
                   const std::function<void(const CheckpointFile&)>& after_map = {});

}  // namespace pinstage::cli
