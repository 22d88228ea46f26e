// The checks every checkpoint load shares (load.cpp), used by the tensor-parallel load
// (load_tp.cpp) so that its refusals read the same (internal to libpinstage).
#pragma once

#include <cstdint>
#include <vector>

#include "pinstage/checkpoint.h"

namespace pinstage::detail {

// Error(invalid_argument) for threads outside 0..1024, a chunk of 0 bytes and (device) a
// ring of fewer than 2 buffers.
void check_load_options(const CheckpointLoadOptions& options, bool device);
// verify without verify_if_present: Error(invalid_argument) when some tensor has no
// recorded hash, naming how many and the first.
void check_verifiable(const Checkpoint& checkpoint,
                      const std::vector<const CheckpointTensor*>& tensors,
                      const CheckpointLoadOptions& options);
// Error(io) naming the file, the tensor and both hashes.
[[noreturn]] void hash_mismatch(const Checkpoint& checkpoint, const CheckpointTensor& tensor,
                                uint64_t got);

// A tensor around a split dimension `dim` (>= 0): `outer` rows (the product of the
// dimensions before it), each of `row_bytes`, holding the dimension's indices of
// `inner_bytes` each. load_tp.cpp and load_tp_rank.cpp cut slices from it.
struct TpGeometry {
  uint64_t outer = 1;
  uint64_t inner_bytes = 0;
  uint64_t row_bytes = 0;
};
TpGeometry tp_geometry(const CheckpointTensor& tensor, int dim);

}  // namespace pinstage::detail
