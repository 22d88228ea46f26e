// Reading the hash sidecar at open (internal to libpinstage; the sidecar's writer and its
// path are public in checkpoint.h).
#pragma once

#include <string>
#include <vector>

#include "pinstage/checkpoint.h"

namespace pinstage::detail {

// Fills each tensor's xxh3 from the sidecar of `checkpoint_path` when there is one.
// Error(io) naming the sidecar for a malformed one, one recorded for another checkpoint or
// another version of it (a tensor it lists that is not there, or at another place or
// size), or a hash that contradicts the one the writer recorded.
void apply_hash_sidecar(const std::string& checkpoint_path,
                        const std::vector<CheckpointFile>& files,
                        std::vector<CheckpointTensor>& tensors);

}  // namespace pinstage::detail
