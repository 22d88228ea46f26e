// Tensor-parallel loading on the host: a TpPlan says, per tensor, whether each of N ranks
// gets it whole (replicated) or a slice along one dimension; load_tp_to_host reads the
// checkpoint once for all ranks and gives each rank its slices in storages of their own,
// so a rank's memory holds its share and nothing else. See docs/loading.md,
// "Tensor-parallel loading".
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "pinstage/checkpoint.h"
#include "pinstage/export.h"
#include "pinstage/tensor.h"
#include "pinstage/worker_group.h"

namespace pinstage {

inline constexpr int kTpMaxRanks = 1024;  // the largest tp a plan or a load takes
inline constexpr int kTpMaxDim = 64;      // a plan's dim is in [-kTpMaxDim, kTpMaxDim - 1]
inline constexpr const char* kTpPlanFormat = "pinstage.tp_plan/1";
inline constexpr uint64_t kTpPlanMaxBytes = uint64_t{16} << 20;  // largest plan file read

namespace detail {
struct TpPattern;  // a compiled glob or regex (private)
}

// One rule of a plan: a name pattern and what the tensors it matches get.
struct TpRule {
  // A glob ('*' any run of characters, '?' one character, everything else itself) or,
  // when `regex`, a regex of the ECMAScript subset docs/loading.md lists ("Regex rules"),
  // matched in time linear in the name and with no recursion on it; either must match
  // the whole tensor name.
  std::string pattern;
  bool regex = false;
  // Split along this dimension (negative counts from the last: -1 is the last);
  // nullopt replicates.
  std::optional<int> split_dim;
  std::shared_ptr<const detail::TpPattern> compiled;  // set by TpPlan, shared by copies
};

// Which tensors are split, and along which dimension. Rules are tried in order and the
// first match wins; a tensor no rule matches gets the default (replicate unless set).
// The builders and the parser refuse the same things with Error(invalid_argument): an
// empty pattern, a regex that does not compile or uses syntax outside the subset, a dim outside
// [-kTpMaxDim, kTpMaxDim), a tp outside [1, kTpMaxRanks].
class PINSTAGE_API TpPlan {
 public:
  TpPlan& split(std::string glob, int dim);
  TpPlan& replicate(std::string glob);
  TpPlan& split_regex(std::string regex, int dim);
  TpPlan& replicate_regex(std::string regex);
  TpPlan& default_split(int dim);  // tensors no rule matches are split along dim
  TpPlan& default_replicate();     // ... or replicated (the default)
  // The tp the plan was written for: a load with another tp is refused.
  TpPlan& expect_tp(int tp);

  // The JSON form (docs/loading.md): {"format": "pinstage.tp_plan/1", "tp": N (optional),
  // "rules": [{"match": GLOB | "regex": RE, "split": DIM | "replicate": true}, ...],
  // "default": {"split": DIM} | {"replicate": true} (optional)}, parsed strictly: an
  // unknown or repeated key, a missing one, a wrong type or a value out of range is
  // Error(invalid_argument) naming `source`, the rule's number and the key.
  static TpPlan parse(std::string_view text, const std::string& source);
  // parse() of a regular file of at most kTpPlanMaxBytes.
  static TpPlan read_file(const std::string& path);

  const std::vector<TpRule>& rules() const noexcept { return rules_; }
  const std::optional<int>& default_dim() const noexcept { return default_dim_; }
  const std::optional<int>& tp() const noexcept { return tp_; }
  // The index of the first rule that matches `name`, or -1 (the default applies).
  int match(std::string_view name) const;
  // "rule 2 (match '*.q_proj.weight': split dim 0)", or "the default (replicate)" for -1.
  std::string describe(int rule) const;

 private:
  TpPlan& add(std::string pattern, bool regex, std::optional<int> dim);
  std::vector<TpRule> rules_;
  std::optional<int> default_dim_;
  std::optional<int> tp_;
};

// Part `rank` of a dimension of `size` split into `parts`, as torch.tensor_split and
// numpy.array_split cut it: the first size % parts parts get one row more.
struct TpPart {
  int64_t begin = 0;
  int64_t count = 0;
};
// begin = rank * (size / parts) + min(rank, size % parts),
// count = size / parts + (rank < size % parts ? 1 : 0).
PINSTAGE_API TpPart tp_part(int64_t size, int parts, int rank);

// What the plan decided for one tensor of a checkpoint.
struct TpDecision {
  const CheckpointTensor* tensor = nullptr;
  int rule = -1;  // the rule that matched, -1 for the default
  int dim = -1;   // the split dimension (counted from 0), -1 when replicated
};

// The plan applied to every tensor for `tp` ranks, in Checkpoint::tensors() order, with
// every refusal raised here, before a load takes memory. Error(invalid_argument) naming
// the tensor, its shape, the rule and the sizes for: a tp outside [1, kTpMaxRanks] or
// unlike the plan's, a split dim the tensor does not have, and a split that would leave
// a rank an empty part (a dimension smaller than tp: replicate the tensor instead).
PINSTAGE_API std::vector<TpDecision> resolve_tp_plan(const Checkpoint& checkpoint,
                                                     const TpPlan& plan, int tp);

// One rank's share of one tensor.
struct TpTensor {
  CheckpointTensor info;       // the whole tensor as the checkpoint has it
  std::vector<int64_t> shape;  // this rank's slice (info.shape when replicated)
  int dim = -1;                // the split dimension, -1 when replicated
  int64_t begin = 0;           // the slice's first index along dim
  uint64_t bytes = 0;          // the slice's bytes, row-major
  int rule = -1;               // the plan rule that decided, -1 for the default
  bool staged = false;         // copied from the staging buffer (a strided split), not read in
  // Exactly `bytes`. A replicated tensor's storage is one storage shared by every rank
  // (read and held once), so writing to it writes every rank's copy.
  std::shared_ptr<Storage> storage;
};

// One rank's share of a tensor-parallel load: bytes = direct_bytes + scatter_bytes +
// shared_bytes. Per-device figures (an upload) extend this per rank.
struct TpRankReport {
  uint64_t bytes = 0;          // its slices' bytes, replicated tensors included
  uint64_t direct_bytes = 0;   // read from the files straight into its own storages
  uint64_t scatter_bytes = 0;  // copied to it from the staging buffer (strided splits)
  uint64_t shared_bytes = 0;   // replicated tensors' (one storage every rank shares)
};

// What a tensor-parallel load did.
struct TpLoadReport {
  LoadReport load;                // the reads (load.bytes: bytes read from the files)
  uint64_t read_bytes = 0;        // bytes read from the checkpoint's files, all reads together
  uint64_t checkpoint_bytes = 0;  // the checkpoint's tensor bytes: read_bytes equals it
  uint64_t host_bytes = 0;        // storage taken, each replicated tensor counted once
  uint64_t scatter_bytes = 0;     // bytes copied from the staging buffer to strided slices
  double scatter_s = 0;
  size_t replicated = 0;            // tensors replicated
  size_t contiguous = 0;            // tensors split into one byte range per rank
  size_t strided = 0;               // tensors split along an inner dimension (staged, scattered)
  std::vector<int> unused_rules;    // rules that matched no tensor (a typo in a plan?)
  std::vector<TpRankReport> ranks;  // per rank
};

struct TpHostLoad {
  int tp = 1;
  std::vector<std::vector<TpTensor>> ranks;  // ranks[r]: Checkpoint::tensors() order
  TpLoadReport report;
};

// Loads `checkpoint` for `tp` ranks into storages from `allocator`, reading every byte of
// it once: a replicated tensor into one shared storage; a split whose slices are byte
// ranges (dim 0, or every dimension before the split of size 1) straight into each rank's
// storage; a split along an inner dimension by reading whole rows into a bounded staging
// buffer and copying each row's pieces to the ranks. options as for load_to_host (verify
// hashes every tensor as read, across its slices). Refusals are resolve_tp_plan's, raised
// before any memory is taken; on any later error nothing stays allocated.
PINSTAGE_API TpHostLoad load_tp_to_host(const Checkpoint& checkpoint, const TpPlan& plan, int tp,
                                        HostAllocator& allocator,
                                        const CheckpointLoadOptions& options = {});
// The same with one allocator per rank (rank r's slices from allocators[r], a replicated
// tensor's one storage from allocators[0]): each device's share in its own worker's pinned
// memory, on its NUMA node. Error(invalid_argument) unless there are tp allocators, none null.
PINSTAGE_API TpHostLoad load_tp_to_host(const Checkpoint& checkpoint, const TpPlan& plan, int tp,
                                        std::span<HostAllocator* const> allocators,
                                        const CheckpointLoadOptions& options = {});

// ---- One rank alone (docs/distributed.md) ----
// Under torch.distributed each process holds one rank's share and reads only the bytes
// of it, instead of load_tp_to_host's every rank at once.

// A run of one rank's slice: `bytes` at `offset` from its tensor's first byte (in the
// file, or in memory holding the whole tensor) go to `slice_offset` in the slice. A
// replicated tensor or a contiguous split is one piece; a split along an inner dimension
// one piece per row (rows that meet, as at tp 1, are merged).
struct TpPiece {
  uint64_t offset = 0;
  uint64_t bytes = 0;
  uint64_t slice_offset = 0;
};

// Rank `rank`'s slice of every tensor, in Checkpoint::tensors() order, with no memory
// (storage null). Refusals are resolve_tp_plan's, and Error(invalid_argument) for a rank
// outside [0, tp).
PINSTAGE_API std::vector<TpTensor> tp_rank_slices(const Checkpoint& checkpoint, const TpPlan& plan,
                                                  int tp, int rank);
// The pieces of one slice (of tp_rank_slices or load_tp_to_host), in slice order.
PINSTAGE_API std::vector<TpPiece> tp_slice_pieces(const TpTensor& slice);

// Reads each slice into dsts[i] (at least slices[i].bytes), asking the files for its
// pieces and nothing else: TpLoadReport::read_bytes is the slices' bytes. options as for
// read_checkpoint, except that verify is refused (a slice is no whole tensor to check
// against its hash; load_tp_to_host verifies). Error(invalid_argument) for a count of
// dsts unlike the slices' or a null dst of a slice with bytes.
PINSTAGE_API TpLoadReport read_tp_slices(const Checkpoint& checkpoint,
                                         const std::vector<TpTensor>& slices,
                                         const std::vector<void*>& dsts,
                                         const CheckpointLoadOptions& options = {});

// Copies `slice` out of memory holding its whole tensor (slice.info's bytes, row-major)
// to `dst`, on up to `threads` threads (0 = default_thread_count()): how a rank takes its
// share of a file another process read (docs/distributed.md, "once per node").
PINSTAGE_API void copy_tp_slice(const TpTensor& slice, const void* whole, void* dst,
                                int threads = 0);

struct TpRankLoad {
  int tp = 1;
  int rank = 0;
  std::vector<TpTensor> tensors;  // Checkpoint::tensors() order, one storage each
  TpLoadReport report;            // read_bytes: this rank's bytes only
};

// tp_rank_slices, a storage from `allocator` for each slice (one reserve() first), then
// read_tp_slices. On any error nothing stays allocated.
PINSTAGE_API TpRankLoad load_tp_rank_to_host(const Checkpoint& checkpoint, const TpPlan& plan,
                                             int tp, int rank, HostAllocator& allocator,
                                             const CheckpointLoadOptions& options = {});

// ---- Onto the devices of a node (docs/node.md, "Tensor-parallel loading") ----

// One device's part of load_tp_to_devices.
struct TpDeviceReport {
  int device = 0;       // its id
  uint64_t bytes = 0;   // its slices' bytes, uploaded
  size_t tensors = 0;   // device buffers made (tensors of 0 bytes get an empty buffer)
  double upload_s = 0;  // its uploads' wall time (the devices upload at once)
  double gbps() const { return upload_s > 0 ? static_cast<double>(bytes) / upload_s / 1e9 : 0; }
};

struct TpDeviceLoad {
  int tp = 1;
  std::vector<int> devices;  // member r's device id, rank r
  // ranks[r] on devices[r], in checkpoint order; each info has the slice's shape and bytes
  // (a split tensor's xxh3 dropped: it was the whole tensor's).
  std::vector<std::vector<DeviceTensor>> ranks;
  TpLoadReport host;                    // the host load: every byte read once
  std::vector<TpDeviceReport> uploads;  // per device
  uint64_t uploaded_bytes = 0;          // all devices
  double upload_s = 0;                  // the upload phase's wall time, all devices
  double total_s = 0;
  double upload_gbps() const {
    return upload_s > 0 ? static_cast<double>(uploaded_bytes) / upload_s / 1e9 : 0;
  }
};

// Tensor-parallel load onto a WorkerGroup: rank r is member r (tp = group.size()). The
// checkpoint is read once (load_tp_to_host, with member r's pinned memory for rank r's
// slices: on its device's NUMA node), then every member uploads its slices to its device
// at once, each on its thread team, and the host storages go back to the pools. A
// slice along an inner dimension is gathered contiguous on the host first, so each device
// receives one dense buffer per tensor. Refusals are load_tp_to_host's, before any memory;
// on a later failure every device buffer of every member is released and GroupError names
// the device.
PINSTAGE_API TpDeviceLoad load_tp_to_devices(const Checkpoint& checkpoint, const TpPlan& plan,
                                             WorkerGroup& group,
                                             const CheckpointLoadOptions& options = {});

}  // namespace pinstage
