// The bind phase: put a task's arguments on the device, optionally run a callable, read
// the results back and release the device memory, timing every step. See docs/bind.md.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "pinstage/error.h"
#include "pinstage/export.h"
#include "pinstage/report.h"
#include "pinstage/tensor.h"
#include "pinstage/worker.h"
#include "pinstage/worker_group.h"

namespace pinstage {

// How device memory is taken for a task. One arena is one allocation (one backend call,
// one free); per_tensor mirrors frameworks that allocate each argument on its own.
enum class DeviceLayout { arena, per_tensor };

// How a pageable input (IN/INOUT tensor) reaches the device. Pinned ones always go direct.
//  direct: the tensor's host memory is handed to the backend's copy as it is.
//  staged: sent through the staging ring (StagingRing, staging_ring.h): a few pinned
//          buffers, filling buffer k+1 while buffer k's device copy is in flight. In
//          bind, "staged" means this and nothing else.
enum class UploadPath { direct, staged };

PINSTAGE_API const char* device_layout_name(DeviceLayout layout);  // "arena", "per_tensor"
PINSTAGE_API const char* upload_path_name(UploadPath path);        // "direct", "staged"
// Parses the names above; throws Error(invalid_argument) listing the valid names.
PINSTAGE_API DeviceLayout parse_device_layout(std::string_view name);
PINSTAGE_API UploadPath parse_upload_path(std::string_view name);
// A layout field of a report as report_fields writes it: its name.
inline ReportValue report_value(DeviceLayout layout) {
  return std::string(device_layout_name(layout));
}

// The BindOptions fields, listed once: X(type, name, default, doc). BindOptions is built
// from it, and so are the Python bindings (python/src/bind_options.h), so a field added
// here reaches every front end; docs/bind.md has the table. Python calls
// execute_callable `execute`.
#define PINSTAGE_BIND_OPTION_FIELDS(X)                                                          \
  X(DeviceLayout, layout, DeviceLayout::arena,                                                  \
    "how device memory is taken: arena (one allocation, tensors at aligned offsets) or "        \
    "per_tensor")                                                                               \
  X(UploadPath, upload, UploadPath::direct,                                                     \
    "how pageable inputs reach the device: direct or staged (through the staging ring)")        \
  X(size_t, staging_buffers, 4,                                                                 \
    "staging ring buffers, 1..64, taken from the worker on the first staged upload or verify "  \
    "and kept for the Binder's life")                                                           \
  X(size_t, staging_buffer_bytes, size_t{8} << 20,                                              \
    "bytes of each staging ring buffer, 1 byte..1 GiB")                                         \
  X(size_t, chunk_bytes, size_t{1} << 30,                                                       \
    "direct uploads and all downloads go to the backend in pieces of at most this many bytes "  \
    "(large on purpose: on sim small pieces cost up to half the copy speed)")                   \
  X(size_t, arena_alignment, 256, "arena offsets are rounded up to this power of two, 1..4096") \
  X(std::string, execute_callable, std::string{},                                               \
    "backend callable run between upload and download; empty = no execute step")                \
  X(bool, verify_upload, false,                                                                 \
    "read every input back through the staging ring after the upload and compare it with "      \
    "its host bytes; a difference fails the bind (ErrorCode::mismatch)")                        \
  X(int, copy_threads, 0, "threads for the staging ring's host copies; 0 = all cores")

// How one bind is done; every field, its default and meaning is in the list above.
struct BindOptions {
  PINSTAGE_BIND_OPTION_FIELDS(PINSTAGE_FIELD_MEMBER)
};

// The upper bounds validate() enforces (each lower bound is 1), for a front end that checks
// while it parses: the CLI's --staging-buffers and --staging-buffer-mib.
inline constexpr size_t kBindMaxStagingBuffers = 64;
inline constexpr size_t kBindMaxStagingBufferBytes = size_t{1} << 30;
inline constexpr size_t kBindMaxArenaAlignment = 4096;

// Throws Error(invalid_argument) naming the bad option and its valid range.
PINSTAGE_API void validate(const BindOptions& options);

// The steps of one bind, in order.
enum class BindPhase { device_alloc, upload, verify, execute, download, release };
inline constexpr size_t kBindPhaseCount = 6;
PINSTAGE_API const char* bind_phase_name(BindPhase phase);  // "device_alloc", ...

// The TensorBindReport fields, listed once: X(type, name, default, doc), doc being the
// Python property's docstring (Python reads direction and path as their names).
#define PINSTAGE_TENSOR_BIND_REPORT_FIELDS(X)                                              \
  X(std::string, name, std::string{}, "str: the tensor's name.")                           \
  X(Direction, direction, Direction::in, "str: 'IN', 'INOUT' or 'OUT'.")                   \
  X(bool, pinned, false, "bool: the tensor was in the worker's pinned memory.")            \
  /* direct when not uploaded */                                                           \
  X(UploadPath, path, UploadPath::direct,                                                  \
    "str: how it went up: 'direct' or 'staged' (through the staging ring).")               \
  X(uint64_t, bytes, 0, "int: the tensor's bytes.")                                        \
  /* the offset in the arena (0 with per_tensor) */                                        \
  X(uint64_t, device_offset, 0, "int: where it lies in the device layout.")                \
  X(double, upload_seconds, 0.0, "float: time of its upload (0 when not uploaded).")       \
  X(double, download_seconds, 0.0, "float: time of its download (0 when not downloaded).") \
  /* Both false in a one-shot bind. */                                                     \
  X(bool, resident, false,                                                                 \
    "bool: a ResidentBinder keeps it on the device across steps (IN, INOUT).")             \
  /* unchanged since its last upload */                                                    \
  X(bool, stayed, false, "bool: it stayed on the device this step (not uploaded; ResidentBinder).")

// One tensor's part in a bind; the fields are the list above.
struct PINSTAGE_API TensorBindReport {
  PINSTAGE_TENSOR_BIND_REPORT_FIELDS(PINSTAGE_FIELD_MEMBER)

  // Moved host to device in this bind or step.
  bool uploaded() const noexcept { return direction != Direction::out && !stayed; }
  // Read back at its end: OUT always, INOUT unless it is resident (it stays on the device).
  bool downloaded() const noexcept {
    return direction == Direction::out || (direction == Direction::inout && !resident);
  }
  double upload_gbps() const noexcept;  // bytes / upload_seconds / 1e9; 0 if not timed
  double download_gbps() const noexcept;
};

// The BindReport totals, listed once in the order report_fields writes them: X(type, name,
// default, doc) for a member, COMPUTED(name, doc) for a member function report_fields
// calls in its place; doc is the Python property's docstring. The struct, report_fields
// (`pinstage scene --json`) and Python's BindReport properties come from it. The counts
// of a ResidentBinder step are its own: the inputs that stayed on the device are not
// uploaded.
#define PINSTAGE_BIND_REPORT_FIELDS(X, COMPUTED)                                                 \
  X(double, total_seconds, 0.0, "float: the whole bind.")                                        \
  COMPUTED(staging_seconds,                                                                      \
           "float: every phase but execute (alloc, upload, verify, download, release): what "    \
           "staging the arguments cost.")                                                        \
  COMPUTED(upload_gbps, "float: uploaded bytes / upload phase time, in GB/s.")                   \
  COMPUTED(download_gbps, "float: downloaded bytes / download phase time, in GB/s.")             \
  X(DeviceLayout, layout, DeviceLayout::arena,                                                   \
    "str: 'arena' (one device allocation) or 'per_tensor'.")                                     \
  /* arena padding included */                                                                   \
  X(uint64_t, device_bytes, 0, "int: device memory the bind allocated.")                         \
  X(size_t, device_allocations, 0, "int: device allocations the bind made.")                     \
  /* inputs: IN + INOUT tensors */                                                               \
  X(size_t, uploaded_count, 0, "int: tensors uploaded.")                                         \
  X(uint64_t, uploaded_bytes, 0, "int: bytes uploaded.")                                         \
  /* INOUT + OUT tensors */                                                                      \
  X(size_t, downloaded_count, 0, "int: tensors downloaded.")                                     \
  X(uint64_t, downloaded_bytes, 0, "int: bytes downloaded.")                                     \
  X(size_t, ring_count, 0, "int: tensors that went through the staging ring.")                   \
  X(uint64_t, ring_bytes, 0, "int: bytes that went through the staging ring.")                   \
  X(bool, executed, false, "bool: the backend ran the task between upload and download.")        \
  /* A ResidentBinder step: its number, and the inputs that stayed on the device. */             \
  X(int, step, 0, "int: a ResidentBinder step's number (1-based); 0 for a one-shot bind.")       \
  X(size_t, stayed_count, 0, "int: inputs that stayed on the device instead of being uploaded.") \
  X(uint64_t, stayed_bytes, 0, "int: their bytes.")

// What one Binder::run (or ResidentBinder::step) did and how long each part took: the
// phases, the tensors, and the totals of the list above.
struct PINSTAGE_API BindReport {
  std::array<double, kBindPhaseCount> phase_seconds{};  // indexed by BindPhase
  std::vector<TensorBindReport> tensors;                // in argument order
  PINSTAGE_BIND_REPORT_FIELDS(PINSTAGE_FIELD_MEMBER, PINSTAGE_FIELD_COMPUTED)

  double phase(BindPhase p) const noexcept { return phase_seconds[static_cast<size_t>(p)]; }
  double upload_gbps() const noexcept;  // uploaded_bytes / upload phase / 1e9
  double download_gbps() const noexcept;
  // Everything but the execute step: what staging the arguments cost (alloc, upload,
  // verify, download, release), the figure a resident step is measured by.
  double staging_seconds() const noexcept;
  // "19 of 20 tensors uploaded (inputs), 40,859,999,040 bytes": the inputs (IN + INOUT)
  // of all tensors, and their bytes; a resident step adds "(17 stayed on the device)".
  std::string summary() const;
  // A multi-line readable report: the summary, the phases and one row per tensor.
  std::string to_string() const;
};

// The one serialiser of a bind's phases: seconds keyed by bind_phase_name, in phase order
// (the bench's and the scene's JSON "phases", Python's BindReport.phase_seconds).
PINSTAGE_API ReportFields phase_fields(const std::array<double, kBindPhaseCount>& phase_seconds);
// A BindReport's totals as fields: PINSTAGE_BIND_REPORT_FIELDS in its order, under the
// member names, the layout by its name. The phases are phase_fields and the tensors their
// own rows; neither is here.
PINSTAGE_API ReportFields report_fields(const BindReport& r);

// A bind that failed: which step and which tensor (empty when the step concerns no one
// tensor, e.g. the arena allocation or the execute step). code() is the cause's code.
class PINSTAGE_API BindError : public Error {
 public:
  BindError(ErrorCode code, BindPhase phase, std::string tensor, const std::string& message);
  BindPhase phase() const noexcept { return phase_; }
  const std::string& tensor() const noexcept { return tensor_; }

 private:
  BindPhase phase_;
  std::string tensor_;
};

// Binds TaskArgs on one chip-level Worker. Reusable: the staging ring, stream and events
// are made once and kept, so repeated runs (the A/B benchmark's rounds) pay only for the
// bind itself. Not for concurrent use from several threads.
class PINSTAGE_API Binder {
 public:
  // require_chip_worker() guard; validate(options). The worker must outlive the Binder.
  explicit Binder(Worker& worker, BindOptions options = {});
  Binder(const Binder&) = delete;
  Binder& operator=(const Binder&) = delete;
  ~Binder();

  // One bind: allocate device memory for every tensor, upload the inputs, execute
  // (when a callable is set), download INOUT and OUT into their host tensors, release.
  // On failure everything the run took is released and BindError names the step and
  // the tensor. Host tensors are only read until the download step; a failed download
  // may leave the tensor it failed on partly written (earlier ones hold their results).
  BindReport run(const TaskArgs& args);

  const BindOptions& options() const noexcept { return options_; }
  // Pinned bytes the staging ring holds now (0 until the first staged upload or verify).
  uint64_t staging_bytes() const noexcept;

 private:
  struct State;
  Worker* worker_;
  BindOptions options_;
  std::unique_ptr<State> state_;
};

// Keeps a task's inputs on the device across the steps of a loop (a decode: weights and
// KV caches stay, only what changed goes up). See docs/bind.md, "Resident args".
//  - The first step() allocates the device memory (as a Binder does) and uploads every IN
//    and INOUT tensor; each later step uploads only the inputs marked changed since.
//  - Every step executes (when a callable is set) and reads back the OUT tensors.
//  - INOUT tensors (the caches) stay on the device, where the execute step updates them;
//    download() reads any range of them back.
//  - Changes are declared (mark_changed). A host write left undeclared is not seen by the
//    device: with check_writes (PINSTAGE_RESIDENT_CHECK=on) every step first compares an
//    xxh3-64 digest of each IN tensor that stayed with the one taken at its upload, and
//    refuses the step naming the tensor.
// Not for concurrent use from several threads; the worker must outlive its steps (after
// finalize every call but close() is refused, and close() frees nothing twice).
class PINSTAGE_API ResidentBinder {
 public:
  // require_chip_worker() guard; validate(options). Keeps `args` (sharing their storage,
  // so the caller's tensors and the binder's are the same bytes). check_writes unset =
  // PINSTAGE_RESIDENT_CHECK (default off). Nothing is taken on the device until step().
  ResidentBinder(Worker& worker, TaskArgs args, BindOptions options = {},
                 std::optional<bool> check_writes = {});
  ResidentBinder(const ResidentBinder&) = delete;
  ResidentBinder& operator=(const ResidentBinder&) = delete;
  ~ResidentBinder();  // close(); never throws

  // The host bytes of IN or INOUT tensor `name` changed: the next step uploads it (an
  // INOUT's device copy is overwritten). Error(not_found) naming a tensor the args lack,
  // Error(invalid_argument) for an OUT tensor (never uploaded) or a closed binder.
  void mark_changed(std::string_view name);
  // One step: on the first, device_alloc and every input's upload; then the changed
  // inputs' uploads (and their verify with verify_upload), execute, the OUT tensors'
  // download. The report's `step` is its number, `stayed_*` what did not move, and its
  // release phase is 0 (nothing is released between steps). On failure BindError names
  // the step, phase and tensor, and the binder frees its device memory and closes.
  // With check_writes, an undeclared host write is Error(mismatch) before anything moves,
  // and the binder stays open.
  BindReport step();
  // Copies the whole device copy of tensor `name`, or [offset, offset + bytes) of it, into
  // its host storage at the same offset (an INOUT cache's rows a step wrote, say). Only
  // between the first step and close(). Error(invalid_argument) for a range outside the
  // tensor or bytes = 0, Error(not_found) for an unknown name.
  void download(std::string_view name);
  void download(std::string_view name, uint64_t offset, uint64_t bytes);
  // Copies tensor `from`'s device bytes over input `to`'s on the device (Worker::
  // copy_on_device, platform ABI v5): a decode's output fed back as the next step's input
  // without a trip through the host. Both the same size; `to` IN or INOUT. The host copy of
  // `to` is not touched, and `to` is not uploaded at the next step unless marked changed
  // after this. Between the first step and close(); Error(unsupported) where the backend
  // has no device copy, Error(invalid_argument) for sizes that differ or an OUT `to`.
  void copy_on_device(std::string_view from, std::string_view to);
  // Frees the device memory and the staging ring; idempotent. step() is then refused.
  void close() noexcept;

  bool is_open() const noexcept;           // not closed (by close() or a failed step)
  int steps() const noexcept;              // steps run so far
  uint64_t device_bytes() const noexcept;  // device memory held now (0 before step 1)
  bool check_writes() const noexcept;
  const TaskArgs& args() const noexcept;
  const BindOptions& options() const noexcept;

 private:
  struct State;
  Worker* worker_;
  std::unique_ptr<State> state_;
};

// ---- The node level (docs/node.md, "Group bind") ----

// The GroupBindReport fields Python reads, listed once: X(type, name, default, doc), doc
// being the Python property's docstring. Lists are in group order.
#define PINSTAGE_GROUP_BIND_REPORT_FIELDS(X)                                                       \
  X(std::vector<int>, devices, {}, "list[int]: each member's device id.")                          \
  X(std::vector<BindReport>, reports, {}, "list[BindReport]: each member's bind, in group order.") \
  X(double, total_seconds, 0.0, "float: wall time of the group bind.")                             \
  X(uint64_t, uploaded_bytes, 0, "int: every device's inputs.")                                    \
  X(uint64_t, downloaded_bytes, 0, "int: every device's results.")

// What one GroupBinder::run did: each member's BindReport and the node's totals.
struct PINSTAGE_API GroupBindReport {
  PINSTAGE_GROUP_BIND_REPORT_FIELDS(PINSTAGE_FIELD_MEMBER)
  double longest_upload_s = 0.0;    // the slowest member's upload phase
  double longest_download_s = 0.0;  // the slowest member's download phase
  // The node's rates: every device's bytes over the slowest member's phase (the members
  // start their binds together, so their uploads run at the same time). 0 if not timed.
  double upload_gbps() const noexcept;
  double download_gbps() const noexcept;
  // "2 devices, 2 x 19 of 20 tensors uploaded, ... aggregate 38.2 GB/s", then one line per
  // device.
  std::string to_string() const;
};

// Binds a task's args on every member of a WorkerGroup at once: one Binder per device,
// made once and reused across runs (rings, streams), each run on its member's thread team.
// The group must outlive the GroupBinder. Not for concurrent use from several threads.
class PINSTAGE_API GroupBinder {
 public:
  // validate(options) once; Error(invalid_argument) for an empty or finalized group.
  explicit GroupBinder(WorkerGroup& group, BindOptions options = {});
  GroupBinder(const GroupBinder&) = delete;
  GroupBinder& operator=(const GroupBinder&) = delete;
  ~GroupBinder();

  // args[i] on member i; Error(invalid_argument) unless there is one TaskArgs per member.
  // The members start together (run_each) and each binds to its end: a member that fails
  // released what its bind took (as Binder::run does) and the others finished and released
  // theirs, so no device holds memory of this run. Then GroupError names the first failing
  // device in group order, with the BindError's phase and tensor in its message and its
  // code.
  GroupBindReport run(const std::vector<TaskArgs>& args);

  const BindOptions& options() const noexcept { return options_; }

 private:
  WorkerGroup* group_;
  BindOptions options_;
  std::vector<std::unique_ptr<Binder>> binders_;
};

}  // namespace pinstage
