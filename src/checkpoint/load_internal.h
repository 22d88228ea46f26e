// The checks and the parallel read every checkpoint load shares (load.cpp), used by the
// tensor-parallel load (load_tp.cpp) and the slice reader (slice.cpp) so that their
// refusals read the same and their bytes are read one way (internal to libpinstage).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "pinstage/checkpoint.h"

namespace pinstage::detail {

// Tells options.phase (when set) that `phase` begins (CheckpointLoadOptions::phase).
inline void enter_phase(const CheckpointLoadOptions& options, const char* phase) {
  if (options.phase) options.phase(phase);
}
// Error(invalid_argument), its message starting with `what`, for a value outside the bounds
// of checkpoint.h (kLoadMax*) and (device) a ring of fewer than 2 buffers.
void check_load_options(const CheckpointLoadOptions& options, bool device,
                        const char* what = "checkpoint load");
// verify without verify_if_present: Error(invalid_argument) when some tensor has no
// recorded hash, naming how many and the first.
void check_verifiable(const Checkpoint& checkpoint,
                      const std::vector<const CheckpointTensor*>& tensors,
                      const CheckpointLoadOptions& options);
// One byte range of a checkpoint file and where its bytes go.
struct FileRange {
  size_t file = 0;      // index into Checkpoint::files()
  uint64_t offset = 0;  // absolute file offset
  uint64_t bytes = 0;
  void* dst = nullptr;
};
// Reads the ranges by parallel pread in chunks of options.chunk_bytes (threads, direct and
// progress, over the ranges' total, as read_checkpoint); no hashes. The report's bytes are
// the ranges' bytes; tensors is left 0. `allocator` (when given) prepares each chunk's
// destination before its read (HostAllocator::prepare).
LoadReport read_ranges(const Checkpoint& checkpoint, const std::vector<FileRange>& ranges,
                       const CheckpointLoadOptions& options, HostAllocator* allocator = nullptr);
// Options for one of several reads that together make one load: no hashes (a part is no
// whole tensor; the caller checks them), and progress(*base + done, total), so the
// caller's callback sees the whole load's bytes while it advances *base between parts.
CheckpointLoadOptions part_options(const CheckpointLoadOptions& options, const uint64_t* base,
                                   uint64_t total);
// Error(io) naming the file, the tensor and both hashes.
[[noreturn]] void hash_mismatch(const Checkpoint& checkpoint, const CheckpointTensor& tensor,
                                uint64_t got);
// verify's check of tensors already read (nothing when options.verify is off): phase
// "verify", then digest(i), the xxh3-64 of tensor(i)'s bytes, against its recorded hash
// for each i < count, in parallel on report.threads (digest is called only for a hashed
// tensor); the first mismatch throws hash_mismatch. Sets the report's verify_s, unverified
// (the tensors without a hash) and verified.
void verify_hashes(const Checkpoint& checkpoint, const CheckpointLoadOptions& options, size_t count,
                   const std::function<const CheckpointTensor&(size_t)>& tensor,
                   const std::function<uint64_t(size_t)>& digest, LoadReport& report);

// The tensors `names` in checkpoint order: Error(not_found) for a name the checkpoint
// lacks, Error(invalid_argument) (starting with `who`) for one given twice.
std::vector<CheckpointTensor> select_tensors(const Checkpoint& checkpoint,
                                             const std::vector<std::string>& names,
                                             const char* who);
// The checkpoint's own records of `names` in checkpoint order (nullptr: every tensor), as
// select_tensors checks them.
std::vector<const CheckpointTensor*> selected(const Checkpoint& checkpoint,
                                              const std::vector<std::string>* names,
                                              const char* who);
// Allocates `tensors` from `allocator` (one reserve for all of them first) and reads them
// there: load_to_host's copy mode over a selection. On any error nothing stays allocated.
HostLoad copy_to_host(const Checkpoint& checkpoint,
                      const std::vector<const CheckpointTensor*>& tensors, HostAllocator& allocator,
                      const CheckpointLoadOptions& options);
// Map mode's device load (map.cpp): the files mapped and pinned, each tensor uploaded from
// its mapping with no ring. nullopt, with *note saying why, when a file could not be
// pinned: the caller then loads through its ring, as copy mode does, and reports the note.
std::optional<DeviceLoad> map_to_device(const Checkpoint& checkpoint,
                                        const std::vector<CheckpointTensor>& tensors,
                                        Worker& worker, const CheckpointLoadOptions& options,
                                        std::string* note);
// Map mode's host load (map.cpp) over `tensors`; writable: each file a private
// copy-on-write copy pinned writable (file_private), its tensors writable (a cache hit in
// copy mode).
HostLoad map_to_host(const Checkpoint& checkpoint,
                     const std::vector<const CheckpointTensor*>& tensors, Worker& worker,
                     const CheckpointLoadOptions& options, bool writable);
// The loads through the restart cache (cache_load.cpp), for options.cache != off: the
// entry looked up (filled when asked) and loaded instead of `checkpoint` on a hit, the
// report's cache fields set. names: nullptr for every tensor.
HostLoad load_host_through_cache(const Checkpoint& checkpoint, Worker& worker,
                                 const CheckpointLoadOptions& options,
                                 const std::vector<std::string>* names);
DeviceLoad load_device_through_cache(const Checkpoint& checkpoint, Worker& worker,
                                     const CheckpointLoadOptions& options,
                                     const std::vector<std::string>* names);
// load() with the first-touch split of its alloc_s in its report on sim (first_touch.cpp,
// LoadReport::device_first_touch_*); load() as it is on another backend.
DeviceLoad with_first_touch(Worker& worker, const std::function<DeviceLoad()>& load);
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
