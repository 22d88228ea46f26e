// Reading the hash sidecar at open (internal to libpinstage; the sidecar's writer and its
// path are public in checkpoint.h).
#pragma once

#include <string>
#include <vector>

#include "pinstage/checkpoint.h"

namespace pinstage::detail {

// Fills each tensor's xxh3 from the sidecar of `checkpoint_path` when there is one.
// Error(io) naming the sidecar for a malformed one, a stale one (a file's size, mtime or
// inode unlike those it recorded: "is stale ... run `pinstage hash`"), one recorded for another
// checkpoint or another version of it (a tensor it lists that is not there, or at another place or
// size), or a hash that contradicts the one the writer recorded.
// `tensors` is a copy of checkpoint.tensors() (same order) that receives the hashes; the
// sidecar's names are looked up in the checkpoint's index.
void apply_hash_sidecar(const std::string& checkpoint_path, const Checkpoint& checkpoint,
                        std::vector<CheckpointTensor>& tensors);

// Checkpoint::open without the sidecar: what hash_checkpoint(path) hashes, so that a stale
// or broken sidecar is replaced instead of refusing the run meant to replace it.
Checkpoint open_checkpoint_without_sidecar(const std::string& path);

}  // namespace pinstage::detail
