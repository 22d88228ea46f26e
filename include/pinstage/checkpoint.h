// Checkpoints: a .safetensors file, a directory with a Hugging Face style
// model.safetensors.index.json and its shards, or a directory of *.safetensors files,
// validated up front and loaded by parallel pread into pinned host memory or streamed
// through a StagingRing onto the device. See docs/loading.md.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "pinstage/cache.h"
#include "pinstage/export.h"
#include "pinstage/report.h"
#include "pinstage/tensor.h"
#include "pinstage/worker.h"

namespace pinstage {

// The index file name a sharded checkpoint directory holds.
inline constexpr const char* kCheckpointIndexName = "model.safetensors.index.json";
// Largest index file accepted (real ones are well under 1 MiB).
inline constexpr uint64_t kCheckpointMaxIndexBytes = uint64_t{64} << 20;

// How a checkpoint was laid out on disk.
enum class CheckpointLayout { single_file, indexed_directory, shard_directory };
// CheckpointLayout::indexed_directory -> "indexed_directory".
PINSTAGE_API const char* checkpoint_layout_name(CheckpointLayout layout);

// A parsed model.safetensors.index.json: {"metadata": {...}, "weight_map": {tensor: shard}}.
struct CheckpointIndex {
  // "metadata" values as text (strings as they are, numbers and booleans as JSON text),
  // sorted by key.
  std::vector<std::pair<std::string, std::string>> metadata;
  std::vector<std::pair<std::string, std::string>> weight_map;  // tensor -> shard file name
};

// Parses index JSON `text` from memory, naming `source` in errors: the entry point of the
// index fuzz target. Throws Error(io) for: text over kCheckpointMaxIndexBytes, a leading
// byte-order mark, bad JSON, nesting deeper than kSafetensorsMaxJsonDepth, a repeated key
// at any level, a missing or non-object weight_map, an unknown top-level key, a tensor
// name that is empty or holds a NUL, a shard that is not a plain file name ending in
// .safetensors (no '/', no "..", no NUL), a metadata value that is null, an array or
// an object, and a raw NUL byte anywhere in the text.
PINSTAGE_API CheckpointIndex parse_checkpoint_index(std::string_view text,
                                                    const std::string& source);

// One file of a checkpoint.
struct CheckpointFile {
  std::string path;
  uint64_t size = 0;                                          // bytes of the whole file
  uint64_t data_start = 0;                                    // file offset of its data section
  std::vector<std::pair<std::string, std::string>> metadata;  // its __metadata__
};

// One tensor: where its bytes are.
struct CheckpointTensor {
  std::string name;
  std::string dtype;  // safetensors spelling: BOOL, U8, ..., F8_E5M2
  size_t element_size = 0;
  std::vector<int64_t> shape;
  size_t file = 0;      // index into Checkpoint::files()
  uint64_t offset = 0;  // absolute file offset of the first byte
  uint64_t bytes = 0;
  std::optional<uint64_t> xxh3;  // the hash the writer recorded, if any
};

// A validated checkpoint. Opening reads only headers (and the index), never tensor data.
class PINSTAGE_API Checkpoint {
 public:
  // Opens `path` (a file, or a directory with or without the index) and validates
  // everything before returning. Throws Error(io) naming the file and the tensor for: a
  // path that is neither, an empty directory, a missing, truncated or malformed shard
  // (every read_safetensors_layout error), a tensor the index puts in a shard that does
  // not hold it, a shard tensor the index does not list, a shard the index never names, a
  // tensor listed twice (in the index or in two shards), and conflicting __metadata__.
  static Checkpoint open(const std::string& path);

  CheckpointLayout layout() const noexcept { return layout_; }
  const std::string& path() const noexcept { return path_; }
  const std::vector<CheckpointFile>& files() const noexcept { return files_; }
  // Every tensor, ordered by file then data offset (the order reads go in).
  const std::vector<CheckpointTensor>& tensors() const noexcept { return tensors_; }
  // The index's "metadata" merged with every file's __metadata__ (a key given twice with
  // different values is refused at open).
  const std::vector<std::pair<std::string, std::string>>& metadata() const noexcept {
    return metadata_;
  }
  // nullptr / Error(not_found) naming the tensor and the checkpoint. O(1): a name index
  // built once at open serves every lookup, so callers need none of their own.
  const CheckpointTensor* find(std::string_view name) const noexcept;
  const CheckpointTensor& get(std::string_view name) const;
  uint64_t total_bytes() const noexcept;
  // Why the hash sidecar next to the checkpoint was not used: "" when there is none or it
  // was; else the Error(io) message open() used to throw (stale: a file changed since
  // `pinstage hash`, naming the command that replaces it; or broken). Its hashes are then
  // not taken: a load that asks to verify is refused (check_sidecar), one that does not
  // goes on, since a hash nobody asked to check should not block it.
  const std::string& sidecar_problem() const noexcept { return sidecar_problem_; }

 private:
  CheckpointLayout layout_ = CheckpointLayout::single_file;
  std::string path_;
  std::vector<CheckpointFile> files_;
  std::vector<CheckpointTensor> tensors_;
  std::vector<std::pair<std::string, std::string>> metadata_;
  std::string sidecar_problem_;
  // Hashes a std::string and a std::string_view alike, so find() looks up without a copy.
  struct NameHash {
    using is_transparent = void;
    size_t operator()(std::string_view name) const noexcept {
      return std::hash<std::string_view>{}(name);
    }
  };
  // A tensor's name -> its place in tensors_ (a place, not a pointer: copies stay right).
  std::unordered_map<std::string, size_t, NameHash, std::equal_to<>> by_name_;
};

// The bounds of CheckpointLoadOptions: every load and hash_checkpoint refuses a value
// outside them (Error(invalid_argument)), and the CLI's --threads, --chunk-mib and
// --ring-mib take their ranges from here.
inline constexpr int kLoadMaxThreads = 1024;                       // threads: 0..1024
inline constexpr uint64_t kLoadMaxChunkBytes = uint64_t{4} << 30;  // chunk_bytes: 1..4 GiB
inline constexpr uint64_t kLoadMaxRingBytes = uint64_t{64} << 30;  // ring_bytes: ..64 GiB

// How a load gets the tensors' bytes (docs/loading.md, "Modes").
//  copy: read into the worker's pinned pool memory (pread, or O_DIRECT with `direct`):
//        writable tensors that own their bytes.
//  map:  every file that holds a wanted tensor mapped read-only and pinned where it lies
//        (Worker::map_file_pinned, the page cache itself): nothing is read or copied, and
//        the tensors are read-only views that keep the mapping alive. Where the backend
//        refuses to pin a file mapping, its tensors are copied into pinned pool memory and
//        LoadReport::map_note says so.
enum class LoadMode { copy, map };
// LoadMode::map -> "map".
PINSTAGE_API const char* load_mode_name(LoadMode mode);
// "copy" / "map" (any case) -> the mode; Error(invalid_argument) naming both otherwise.
PINSTAGE_API LoadMode parse_load_mode(std::string_view name);

// The CheckpointLoadOptions value fields, listed once: X(type, name, default, doc). The
// struct and docs/loading.md's table come from it.
//  mode: host loads through a worker (load_to_host(checkpoint, worker, ...)) and device
//    loads; map with direct is Error(invalid_argument): a mapping is the page cache, which
//    direct bypasses. load_to_host(checkpoint, allocator) copies only.
//  direct: reads in aligned chunks through a per-thread aligned bounce buffer, since
//    tensors start anywhere in a file. Where the file system refuses O_DIRECT, the load
//    falls back to buffered reads and says so in the report.
//  verify: on a host load the bytes read, on a device load the bytes as they pass and again
//    as read back from the device. A tensor without a recorded hash is an
//    Error(invalid_argument) before anything is read, unless verify_if_present (then it is
//    counted in LoadReport::unverified).
//  cache: load_to_host(checkpoint, worker) and load_to_device look the checkpoint up in
//    WeightCache::open() (PINSTAGE_CACHE_DIR) and, on a hit, load the entry instead: map
//    mode maps it in place (read-only, pinned, nothing read), copy mode maps it as a private
//    copy-on-write copy (file_private: writable, no zero fill), a device load uploads from
//    the pinned mapping. fill fills a miss first. load_to_host(checkpoint, allocator)
//    refuses anything but off.
#define PINSTAGE_CHECKPOINT_LOAD_OPTION_FIELDS(X)                                              \
  X(LoadMode, mode, LoadMode::copy, "copy or map (LoadMode, \"Modes\")")                       \
  X(int, threads, 0, "reader threads; 0 = all cores")                                          \
  X(uint64_t, chunk_bytes, uint64_t{8} << 20, "bytes of one pread")                            \
  X(bool, direct, false, "O_DIRECT reads (page cache bypassed)")                               \
  X(bool, verify, false, "check each tensor's xxh3-64 against the recorded one")               \
  X(bool, verify_if_present, false,                                                            \
    "with verify: a tensor without a recorded hash is counted, not refused")                   \
  X(uint64_t, ring_bytes, uint64_t{64} << 20, "device loads: pinned bytes of the StagingRing") \
  X(size_t, ring_buffers, 4, "device loads: the buffers the ring is split into")               \
  X(CacheUse, cache, CacheUse::off, "the restart cache: off, use or fill (docs/cache.md)")

// How a checkpoint is read: the fields of the list above, and two callbacks.
struct CheckpointLoadOptions {
  PINSTAGE_CHECKPOINT_LOAD_OPTION_FIELDS(PINSTAGE_FIELD_MEMBER)
  // Called after each chunk with the bytes done so far and the total, from the reader
  // threads (the calling thread among them), one call at a time, `done` increasing. An
  // exception it throws stops the load, which then fails with that exception as it fails
  // on a read error (nothing stays allocated).
  std::function<void(uint64_t done, uint64_t total)> progress{};
  // Called from the calling thread as each phase of the load begins, so a progress display
  // can name what runs before the first byte and after the last: "allocate" (pinned host or
  // device memory), "read" (preads into place; map mode's copies out of a mapping the
  // backend would not pin), "pin" (map mode: mapping and pinning the files),
  // "read+upload" (a device load's reads and copies through the staging ring, overlapped),
  // "upload" (map mode: copies from the pinned mappings), "verify" (hash checks). An
  // exception it throws stops the load as progress's does.
  std::function<void(const char* phase)> phase{};
};

// The LoadReport fields, listed once in the order a report lists them: X(type, name,
// default, doc) for a field, RATE(name, seconds, doc) for a rate report_fields computes
// (bytes / seconds / 1e9, LoadReport::gbps) in its place. The struct, report_fields (the
// CLI's `load` JSON, Python's report dicts) and docs/loading.md's table follow it. Seconds
// are wall time of the whole load and of each phase; on a device load read and upload
// overlap, so overlap = (read_s + upload_s - total_s) / min(read_s, upload_s) (1 = the
// shorter phase fully hidden, 0 = none), where upload_s is the time the loader waited for
// device copies plus the copies' own issue time.
#define PINSTAGE_LOAD_REPORT_FIELDS(X, RATE)                                                   \
  X(uint64_t, bytes, 0, "int: bytes loaded.")                                                  \
  X(size_t, tensors, 0, "int: tensors loaded.")                                                \
  X(size_t, files, 0, "int: files read.")                                                      \
  X(int, threads, 0, "int: reader threads.")                                                   \
  X(uint64_t, chunk_bytes, 0, "int: bytes of one pread.")                                      \
  X(double, total_s, 0, "float: the whole load.")                                              \
  RATE(total_gbps, total_s, "float: bytes / total_s, in GB/s.")                                \
  X(double, alloc_s, 0, "float: taking pinned host or device memory.")                         \
  X(double, read_s, 0, "float: pread time (all threads' wall time, not summed).")              \
  RATE(read_gbps, read_s, "float: bytes / read_s, in GB/s.")                                   \
  X(double, verify_s, 0, "float: xxh3 checks not overlapped with reading.")                    \
  X(double, upload_s, 0, "float: device loads: issuing copies and waiting for the ring.")      \
  X(double, overlap, 0, "float: device loads: the share of the shorter phase hidden.")         \
  X(uint64_t, ring_pinned_bytes, 0, "int: device loads: pinned bytes of the ring.")            \
  X(uint64_t, peak_pinned_bytes, 0, "int: the worker's pinned bytes at the load's peak.")      \
  X(bool, direct, false, "bool: O_DIRECT was used for every file.")                            \
  X(std::string, direct_note, std::string{}, "str: why it was not, when asked for.")           \
  X(bool, verified, false, "bool: every tensor had a recorded hash and it matched.")           \
  X(size_t, unverified, 0, "int: tensors without a recorded hash (verify_if_present).")        \
  X(uint64_t, verify_readback_bytes, 0,                                                        \
    "int: device loads: bytes read back from the device and hashed.")                          \
  X(std::string, mode, "copy", "str: the load's mode, 'copy' or 'map' (load_mode_name).")      \
  X(double, map_s, 0, "float: map mode: opening and mapping the files.")                       \
  X(double, pin_s, 0, "float: pinning: map mode's files in place; copy mode's fresh segment.") \
  X(std::string, map_note, std::string{},                                                      \
    "str: map mode: why a file was copied instead ('' when none was).")                        \
  /* "huge", "base", "huge, then base after a stall of N ms"; "" when the pool had the */      \
  /* memory already (nothing faulted) or nothing was pinned fresh. */                          \
  X(std::string, host_pages, std::string{},                                                    \
    "str: copy mode into a worker's pinned memory: the pages its readers faulted.")            \
  X(std::string, cache, "off",                                                                 \
    "str: the restart cache: 'off', 'hit', 'miss', 'stale' or 'filled' (docs/cache.md).")      \
  X(std::string, cache_entry, std::string{},                                                   \
    "str: the cache entry's path on 'hit' or 'filled', else ''.")                              \
  X(std::string, cache_note, std::string{}, "str: why the entry was not used ('stale').")      \
  /* docs/loading.md, "Folios": "kpageflags" (64 pages of each file sampled through */         \
  /* /proc/self/pagemap and /proc/kpageflags, readable with CAP_SYS_ADMIN) or */               \
  /* "FileHugePages" (/proc/meminfo's system-wide figure before and after). */                 \
  X(std::string, map_folio_source, std::string{},                                              \
    "str: map mode: where map_folios comes from, 'kpageflags' or 'FileHugePages'.")            \
  /* "2 MiB 84%, 4 KiB 16% of the bytes (128 of 131074 pages sampled)" */                      \
  X(std::string, map_folios, std::string{},                                                    \
    "str: map mode: each folio size's share of the bytes, largest first.")                     \
  X(uint64_t, map_huge_bytes, 0,                                                               \
    "int: map mode: the estimated bytes in 2 MiB folios (or FileHugePages after).")

// The fields report_fields adds after the list above only when device_first_touch_reason
// is set: a device load on sim, where part of alloc_s backs sim's device pool the first
// time (its device memory is host RAM, faulted in on first use; a device's is not). All
// three stay empty on another backend. X(type, name, default, doc) as above.
#define PINSTAGE_LOAD_REPORT_FIRST_TOUCH_FIELDS(X)                                          \
  X(uint64_t, device_first_touch_bytes, 0, "int: sim: device bytes backed the first time.") \
  X(double, device_first_touch_s, 0, "float: sim: the part of alloc_s that backed them.")   \
  X(std::string, device_first_touch_reason, std::string{},                                  \
    "str: sim: why alloc_s has this part (set on every device load on sim).")

// What a load did: the fields of the two lists above.
struct LoadReport {
  PINSTAGE_LOAD_REPORT_FIELDS(PINSTAGE_FIELD_MEMBER, PINSTAGE_FIELD_COMPUTED)
  PINSTAGE_LOAD_REPORT_FIRST_TOUCH_FIELDS(PINSTAGE_FIELD_MEMBER)
  double gbps(double seconds) const {
    return seconds > 0 ? static_cast<double>(bytes) / seconds / 1e9 : 0;
  }
};

// Every field of `r` in the list's order, each RATE computed in its place, then the
// first-touch fields when device_first_touch_reason is set. The CLI's `load` JSON and
// Python's report dicts are these (docs/loading.md, "The load report").
PINSTAGE_API ReportFields report_fields(const LoadReport& r);

// A tensor in host memory: its description and its storage (exactly its bytes).
struct HostTensor {
  CheckpointTensor info;
  std::shared_ptr<Storage> storage;
};

// The result of load_to_host.
struct HostLoad {
  std::vector<HostTensor> tensors;  // in Checkpoint::tensors() order
  LoadReport report;
};

// One read: a tensor of the checkpoint and where its bytes go (tensor.bytes writable).
struct ReadTarget {
  const CheckpointTensor* tensor = nullptr;
  void* dst = nullptr;
};

// Reads the targets' bytes by parallel pread straight into dst, in chunks of
// options.chunk_bytes spread over options.threads threads, checking hashes when asked.
// Throws Error(invalid_argument) for bad options, Error(io) naming the file (and the
// tensor for a hash mismatch) when a read fails or a file is shorter than at open.
PINSTAGE_API LoadReport read_checkpoint(const Checkpoint& checkpoint,
                                        const std::vector<ReadTarget>& targets,
                                        const CheckpointLoadOptions& options = {});

// One dimension of a slice of a tensor: the `count` indices begin, begin + step, ...
struct SliceDim {
  int64_t begin = 0;
  int64_t count = 0;
  int64_t step = 1;  // at least 1
};

// A byte range of a tensor's file: absolute offset, bytes.
struct SliceRange {
  uint64_t offset = 0;
  uint64_t bytes = 0;
};

// Largest number of SliceRanges one slice may cover (a step along the last dim makes one
// range per element): past it, read the dim whole and slice in memory.
inline constexpr uint64_t kSliceMaxRanges = uint64_t{1} << 24;

// The file ranges `slice` (one SliceDim per dimension of `tensor`) covers, in the slice's
// row-major order, ranges that touch merged: their bytes, end to end, are the slice's
// elements packed row-major. A slice of rows (dim 0) is one range; a slice of columns is
// one range per row. Error(invalid_argument) naming the tensor, its shape and the dim for:
// a slice with another number of dims than the tensor, a negative begin or count, a step
// below 1, an index past the dim's size, and more than kSliceMaxRanges ranges.
PINSTAGE_API std::vector<SliceRange> tensor_slice_ranges(const CheckpointTensor& tensor,
                                                         const std::vector<SliceDim>& slice);

// Reads the slice of `tensor` into dst (its elements packed row-major: the product of the
// counts times element_size bytes), asking the files for exactly the bytes of
// tensor_slice_ranges (LoadReport::bytes counts them; tensors is 1) by parallel pread as
// read_checkpoint does (threads, chunk_bytes, direct, progress). options.verify without
// verify_if_present is Error(invalid_argument): the recorded hash covers the whole tensor,
// so a slice cannot be checked (with verify_if_present it counts as unverified).
PINSTAGE_API LoadReport read_tensor_slice(const Checkpoint& checkpoint,
                                          const CheckpointTensor& tensor,
                                          const std::vector<SliceDim>& slice, void* dst,
                                          const CheckpointLoadOptions& options = {});

// Allocates every tensor (or the tensors `names`, as load_to_host(checkpoint, worker)
// selects them) from `allocator`, reserved once for all of them (exactly their bytes, one
// storage each), and reads them there with read_checkpoint. Copy mode only. On any error
// nothing stays allocated.
PINSTAGE_API HostLoad load_to_host(const Checkpoint& checkpoint, HostAllocator& allocator,
                                   const CheckpointLoadOptions& options = {},
                                   const std::vector<std::string>* names = nullptr);

// The one host load through a worker (what the CLI and Python's load_file, safe_open and
// get_tensor call): the tensors `names` (nullptr: every tensor; Error(not_found) for a
// name the checkpoint lacks, Error(invalid_argument) for one given twice, both before
// anything is taken), in checkpoint order. copy mode reserves the pool once for all of
// them (one segment on a cold pool), then allocates each exactly and reads; map mode maps
// and pins the files (LoadMode). On any error nothing stays allocated, mapped or pinned.
PINSTAGE_API HostLoad load_to_host(const Checkpoint& checkpoint, Worker& worker,
                                   const CheckpointLoadOptions& options = {},
                                   const std::vector<std::string>* names = nullptr);

// The same tensors as TaskArgs (direction IN), sharing the storages; every safetensors
// dtype maps onto a DType (raw storage for those pinstage does not compute on).
PINSTAGE_API TaskArgs to_task_args(const HostLoad& load);

// A tensor in device memory, owned by the caller (an empty buffer for 0 bytes).
struct DeviceTensor {
  CheckpointTensor info;
  DeviceBuffer buffer;
};

struct DeviceLoad {
  std::vector<DeviceTensor> tensors;  // in Checkpoint::tensors() order
  LoadReport report;
};

// Streams the checkpoint onto `worker`'s device through a StagingRing of
// options.ring_bytes of pinned memory, whatever the checkpoint size: chunk k+1 is read
// into the next ring buffer while chunk k's device copy runs. Hashes are checked as the
// bytes pass (verify). On any error (a read, an allocation, a copy) every device buffer
// and the ring are released before the Error propagates.
PINSTAGE_API DeviceLoad load_to_device(const Checkpoint& checkpoint, Worker& worker,
                                       const CheckpointLoadOptions& options = {});
// The same for the tensors `names` only (DeviceLoad::tensors and the report's bytes and
// tensors are those, in checkpoint order): Error(not_found) for a name the checkpoint
// lacks, Error(invalid_argument) for a name given twice, both before anything is taken.
PINSTAGE_API DeviceLoad load_to_device(const Checkpoint& checkpoint, Worker& worker,
                                       const CheckpointLoadOptions& options,
                                       const std::vector<std::string>& names);

// The hash sidecar (docs/loading.md, "Integrity"): per-tensor xxh3-64 recorded next to a
// checkpoint whose writer recorded none, so that verify checks it from then on.
// Checkpoint::open reads it when present (one that no longer matches the checkpoint, or is
// broken, is not used: Checkpoint::sidecar_problem says why). <dir>/pinstage.xxh3.json for a
// directory, <file>.pinstage.xxh3.json for a file.
inline constexpr const char* kHashSidecarName = "pinstage.xxh3.json";
PINSTAGE_API std::string hash_sidecar_path(const std::string& checkpoint_path);
// Error(io) with checkpoint.sidecar_problem() when `options` ask to verify (verify, with
// or without verify_if_present) and the sidecar could not be used: the hashes asked for
// are not there. Nothing otherwise. The CLI, Python and the TP loads call it before
// loading (and warn when a load that does not verify goes on without the sidecar).
PINSTAGE_API void check_sidecar(const Checkpoint& checkpoint, const CheckpointLoadOptions& options);

// What hash_checkpoint did.
struct HashReport {
  size_t tensors = 0;
  uint64_t bytes = 0;
  size_t already_recorded = 0;  // tensors whose writer recorded a hash (it matched)
  double seconds = 0;
  std::string sidecar;  // the file written
};

// Reads every tensor (options.threads, options.chunk_bytes) and writes its xxh3-64 to the
// sidecar, atomically, replacing an older one. A tensor whose recorded hash differs from
// its bytes is Error(mismatch) naming it, and nothing is written. Error(io) for a read.
PINSTAGE_API HashReport hash_checkpoint(const Checkpoint& checkpoint,
                                        const CheckpointLoadOptions& options = {});
// The same for the checkpoint at `path`, opened without its sidecar: a stale or broken
// sidecar is replaced, not refused (`pinstage hash`).
PINSTAGE_API HashReport hash_checkpoint(const std::string& path,
                                        const CheckpointLoadOptions& options = {});

// The index metadata key of the checkpoint-level digest the sharded writer records: the
// xxh3-64 (16 hex digits) of every tensor's shard, name, dtype, shape, place and hash.
// Checkpoint::open checks it when present (Error(io): "a mix of two writes?").
inline constexpr const char* kCheckpointDigestKey = "pinstage.checkpoint_xxh3";

// Writes `args` as a sharded checkpoint in directory `dir` (created if missing): shards
// of at most `shard_bytes` of tensor data each (a larger tensor gets a shard of its own),
// then model.safetensors.index.json with metadata.total_size, kCheckpointDigestKey and
// the weight_map. The write is atomic as a whole: shards are named
// model-0000i-of-0000N.safetensors, with a tag (model-00001-of-00003-3fa2b1c0.safetensors)
// when those names exist, so no shard an index names is overwritten; the index is renamed
// in last; then the shards only the old index named are removed. Stopped at any point
// before the index's rename, `dir` holds the old checkpoint, whole (and perhaps new shard
// files no index names). on_shard(done, shards) after each shard. Returns the number of
// shards. Error(invalid_argument) for shard_bytes 0.
PINSTAGE_API size_t
save_sharded_checkpoint(const TaskArgs& args, const std::string& dir, uint64_t shard_bytes,
                        const std::function<void(size_t, size_t)>& on_shard = {});

}  // namespace pinstage
