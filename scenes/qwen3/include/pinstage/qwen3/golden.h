// The Qwen3-14B decode golden: the spec's reference decode, used to check a run, and the
// comparison of a run's outputs against it. See docs/golden.md.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "pinstage/export.h"
#include "pinstage/qwen3/decode.h"
#include "pinstage/scene.h"

namespace pinstage::qwen3 {

// The twenty arguments' positions in signature order (the index into DecodeBuffers::ptr).
enum ArgIndex : int {
  kArgHiddenStates = 0,
  kArgInputRmsWeight,
  kArgWq,
  kArgWk,
  kArgWv,
  kArgQNormWeight,
  kArgKNormWeight,
  kArgSeqLens,
  kArgBlockTable,
  kArgSlotMapping,
  kArgRopeCos,
  kArgRopeSin,
  kArgKCache,
  kArgVCache,
  kArgWo,
  kArgWGate,
  kArgWUp,
  kArgWDown,
  kArgPostRmsWeight,
  kArgOut,
  kNumArgs  // 20
};

// The reference decode's result: `out` and every K/V row the decode writes, so checking a
// run never needs a second copy of the KV pools.
struct Golden {
  int n_layers = 0;
  std::vector<uint16_t> out;     // [kBatch * kHidden] bf16
  std::vector<int64_t> kv_rows;  // flat row index into k_cache/v_cache, layer-major, then lane,
                                 // then kv head: n_layers * kBatch * kNumKvHeads entries
  std::vector<uint16_t> k_rows;  // kv_rows.size() * kHeadDim bf16, in kv_rows order
  std::vector<uint16_t> v_rows;  // likewise
};

// The golden as four tensors (direction OUT): "out" [16, 5120] bf16, "kv_rows" [n] i64,
// "k_rows" and "v_rows" [n, 128] bf16, with n = n_layers * 16 * 8 rows.
PINSTAGE_API TaskArgs golden_tensors(const Golden& golden, HostAllocator& allocator);

// Writes golden_tensors(golden) as a .safetensors file (the scene's --save-golden); returns
// the file's size. Error(io) as save_safetensors.
PINSTAGE_API uint64_t save_golden(const Golden& golden, const std::string& path);

// Reads a file save_golden wrote. Error(io) naming the path when a tensor is missing or
// shaped otherwise.
PINSTAGE_API Golden load_golden(const std::string& path);

// Runs the spec's reference decode over `args` (read only) on all cores. `args` must be the
// scene's twenty arguments with n_layers layers (names, dtypes and shapes as tensor_specs
// gives them); anything else is Error(invalid_argument) naming the tensor.
PINSTAGE_API Golden compute_golden(const TaskArgs& args, int n_layers);

// The kernel set compute_golden uses: "avx512", "avx2" or "generic" (the best the CPU
// has, or PINSTAGE_GOLDEN_ISA). The execute step (execute_decode) always uses "generic".
PINSTAGE_API const char* golden_kernels();

// The twenty arguments as raw addresses (signature order, ArgIndex): the form shared by the
// golden and the scene's qwen3_decode host callable, which runs on bound device buffers.
struct DecodeBuffers {
  const void* ptr[kNumArgs] = {};  // inputs; ptr[kArgKCache], ptr[kArgVCache] are read
  void* k_cache = nullptr;         // written when write_cache (usually == ptr[kArgKCache])
  void* v_cache = nullptr;         // likewise
  void* out = nullptr;             // bf16 [16, 5120], written when not null
};

// Runs the decode over `buffers` for n_layers layers (seq_len per lane from seq_lens). Writes
// `out` when buffers.out is set and, when write_cache is set, the new K/V rows into
// buffers.k_cache/v_cache in place (the spec's step 11). Fills *golden (out and the written
// rows) when golden is not null. Checks seq_lens, block_table and slot_mapping first and throws
// Error(invalid_argument) naming the lane before anything is written.
PINSTAGE_API void run_decode(const DecodeBuffers& buffers, int n_layers, bool write_cache,
                             Golden* golden);

// One bound argument as the host callable sees it (an ExecArg, name viewed).
struct DecodeArg {
  std::string_view name;
  void* ptr = nullptr;
  uint64_t bytes = 0;
};

// Checks twenty bound arguments (names in signature order, byte sizes those of one layer
// count) and returns them as DecodeBuffers with k_cache, v_cache and out writable. Sets
// *n_layers. Throws Error(invalid_argument) naming the first argument that does not fit.
PINSTAGE_API DecodeBuffers decode_buffers(std::span<const DecodeArg> args, int* n_layers);

// The same for host arguments: checks names, dtypes and shapes against tensor_specs for
// n_layers. Writable pointers are set too; only run_decode's write_cache writes through them.
PINSTAGE_API DecodeBuffers decode_buffers(const TaskArgs& args, int n_layers);

// The comparison report (include/pinstage/scene.h), filled with the spec's tolerance
// |a - b| <= kAtol + kRtol * |b|. differing counts elements whose bits differ at all: the
// execute step runs other kernels than the golden (docs/golden.md), so some may.
using TensorComparison = pinstage::TensorComparison;
using Comparison = pinstage::Comparison;

// Compares n bf16 values element by element.
PINSTAGE_API TensorComparison compare_bf16(std::string_view tensor, const uint16_t* actual,
                                           const uint16_t* expected, size_t n);

// Compares the golden's rows of one cache: for each entry i of `rows`, the kHeadDim values at
// flat row rows[i] of `cache` against expected[i * kHeadDim ..]. When a row index repeats,
// only its last entry counts (the last write wins). Row indices must be < cache_rows.
PINSTAGE_API TensorComparison compare_rows(std::string_view tensor, const uint16_t* cache,
                                           uint64_t cache_rows, const std::vector<int64_t>& rows,
                                           const std::vector<uint16_t>& expected);

// Compares a run's raw outputs: out [16 * 5120] and the caches ([cache_rows, 128] each) at
// the golden's rows.
PINSTAGE_API Comparison compare(const uint16_t* out, const uint16_t* k_cache,
                                const uint16_t* v_cache, uint64_t cache_rows, const Golden& golden);

// Compares a run's results held in `result` ("out", "k_cache", "v_cache", as the fixture
// shapes them) against the golden.
PINSTAGE_API Comparison compare(const TaskArgs& result, const Golden& golden);

}  // namespace pinstage::qwen3
