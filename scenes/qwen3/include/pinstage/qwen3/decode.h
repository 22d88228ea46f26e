// The Qwen3-14B decode scene: its constants and the fixture (the twenty arguments). The
// contract is docs/scene-qwen3-decode.md; the fixture's user guide is docs/tensors.md. Part
// of the scene's own library (scenes/qwen3), not of libpinstage.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "pinstage/export.h"
#include "pinstage/scene.h"
#include "pinstage/tensor.h"

namespace pinstage::qwen3 {

inline constexpr int kNumHeads = 40;
inline constexpr int kNumKvHeads = 8;
inline constexpr int kHeadDim = 128;
inline constexpr int kHidden = kNumHeads * kHeadDim;      // 5120
inline constexpr int kKvHidden = kNumKvHeads * kHeadDim;  // 1024
inline constexpr int kQPerKv = kNumHeads / kNumKvHeads;   // 5
inline constexpr int kHalfDim = kHeadDim / 2;             // 64
inline constexpr int kIntermediate = 17408;
inline constexpr int kBatch = 16;
inline constexpr float kEps = 1e-6f;
inline constexpr float kRopeTheta = 1e4f;
inline constexpr int kDefaultLayers = 40;
inline constexpr int kMaxSeq = 5500;
inline constexpr int kBlockSize = 128;
inline constexpr int kMaxBlocksPerSeq = (kMaxSeq + kBlockSize - 1) / kBlockSize;      // 43
inline constexpr int kNumPages = kBatch * kMaxBlocksPerSeq;                           // 688
inline constexpr int64_t kCacheRows = int64_t{kNumPages} * kNumKvHeads * kBlockSize;  // 704512
inline constexpr int kDefaultSeqLen = 3500;
inline constexpr uint64_t kDefaultSeed = 1234;
// Comparison tolerance: |a - b| <= kAtol + kRtol * |b|.
inline constexpr float kRtol = 5e-2f;
inline constexpr float kAtol = 1e-1f;

// The fixture's parameters.
struct Config {
  int n_layers = kDefaultLayers;  // >= 1
  int seq_len = kDefaultSeqLen;   // [1, kMaxSeq]
  uint64_t seed = kDefaultSeed;
  int threads = 0;  // generation threads; 0 = all cores (never changes the bytes)
};

// Throws Error(invalid_argument) naming the bad parameter (and its CLI option) and its
// valid range. Every function below calls it before doing anything else.
PINSTAGE_API void validate(const Config& config);

// How one argument's values are drawn.
enum class Fill {
  normal,        // std * z + bias, z standard normal (per (seed, tensor, element))
  seq_lens,      // seq_len in every lane
  block_table,   // identity: entry i = i
  slot_mapping,  // the spec's paging formula
  rope_cos,
  rope_sin,
  zeros,
};

// One row of the scene's single table of tensors. The values of the tensor at table
// index k (0-based) are drawn from random stream k under the config's seed.
struct TensorSpec {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;  // for the current n_layers
  Direction dir;
  Fill fill;
  float std = 0.0f;    // Fill::normal: value = (r * std) * trig + bias, see docs/tensors.md
  float bias = 0.0f;   // added only when nonzero
  int64_t layers = 0;  // > 0: stacked along dim 0, one slice per layer, replicated
  uint64_t nbytes = 0;
};

// The twenty arguments in signature order, sized for `config` (validated first). This is
// the size-only mode: nothing is allocated.
PINSTAGE_API std::vector<TensorSpec> tensor_specs(const Config& config);

// Counts and byte totals of the twenty arguments (size-only: nothing is allocated).
// Inputs = IN + INOUT, the bytes a run uploads.
using Sizes = TaskSizes;
PINSTAGE_API Sizes sizes(const Config& config);

// Builds the twenty arguments straight into `allocator`'s storage on config.threads
// threads: layer 0 of each stacked tensor is generated in place, the other layers are
// copies of it, `out` is zeros. The bytes depend only on n_layers, seq_len and seed (not
// on threads, allocator or machine). Validates before allocating; if an allocation
// fails, nothing stays allocated.
PINSTAGE_API TaskArgs make_args(HostAllocator& allocator, const Config& config);

// Decode steps (the contract's "Decode steps"): step s runs at seq_len + s. Throws
// Error(invalid_argument) naming --steps and --seq-len unless steps >= 1 and
// seq_len + steps - 1 <= kMaxSeq.
PINSTAGE_API void validate_steps(const Config& config, int steps);

// Makes `args` (holding step - 1's results) step `step`'s inputs (step >= 1): seq_lens and
// slot_mapping for seq_len + step, hidden_states = out as read back. Returns the names of
// the three tensors it wrote. Error(invalid_argument) for a step out of range or a tensor
// that is not the fixture's.
PINSTAGE_API std::vector<std::string> advance_step(const TaskArgs& args, const Config& config,
                                                   int step);

}  // namespace pinstage::qwen3
