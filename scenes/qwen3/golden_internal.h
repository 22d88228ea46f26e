// Internal: the decode with its kernel set and thread count chosen by the caller (tests
// compare kernel sets and thread counts; the public run_decode uses the defaults).
#pragma once

#include "golden_kernels.h"
#include "pinstage/qwen3/golden.h"

namespace pinstage::qwen3::detail {

// run_decode with an explicit kernel set and thread count (0 = all cores).
PINSTAGE_API void run_decode_with(const DecodeBuffers& buffers, int n_layers, bool write_cache,
                                  Golden* golden, Isa isa, int threads);

// The twenty argument names in signature order (ArgIndex).
PINSTAGE_API extern const char* const kArgNames[kNumArgs];

}  // namespace pinstage::qwen3::detail
