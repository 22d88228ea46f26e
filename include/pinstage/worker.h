// pinstage::Worker: owns one device through a platform backend plugin, and the pinned
// host memory and device memory it hands out. See docs/worker.md for the user guide and
// docs/design/plugin-abi.md for the lifecycle (Note [Pinned memory lifecycle]).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include <functional>
#include <utility>
#include <vector>

#include "pinstage/backend/platform_abi.h"
#include "pinstage/error.h"
#include "pinstage/export.h"
#include "pinstage/pages.h"
#include "pinstage/report.h"

namespace pinstage {

// What a worker owns. `chip`: exactly one device (a Worker). `node`: every chip worker a
// process drives on one host (a WorkerGroup, worker_group.h); a Worker is never node level.
enum class WorkerLevel { chip, node };

// WorkerLevel::chip -> "chip", WorkerLevel::node -> "node".
PINSTAGE_API const char* worker_level_name(WorkerLevel level);
// "chip" / "node" -> the level; anything else throws Error(invalid_argument).
PINSTAGE_API WorkerLevel parse_worker_level(std::string_view name);

// Backend-specific settings as key/value pairs ({"pinned_mode", "register"}), in order.
// A repeated key is Error(invalid_argument); the backend refuses keys it does not know.
using BackendConfig = std::vector<std::pair<std::string, std::string>>;

// "k=v" -> {"k", "v"}, appended to `config`: the one parser the CLI and tools share.
// Error(invalid_argument) for a missing '=', an empty key or a repeated key.
PINSTAGE_API void add_backend_option(BackendConfig& config, std::string_view key_equals_value);

// One member of a struct built from a field list X(type, name, default, doc): the option and
// report structs below, bind.h's and scene.h's list their fields once so that the struct, its
// Python properties (python/src/bind_util.h) and their docstrings come from one place.
#define PINSTAGE_FIELD_MEMBER(type, name, value, doc) type name = value;
// A computed entry of a field list (LoadReport's RATE, BindReport's COMPUTED): a value the
// serialiser computes in its place, so the struct has no member for it.
#define PINSTAGE_FIELD_COMPUTED(...)

// The WorkerOptions fields, listed once in the order Python's Worker(**options) names them:
// X(type, name, default, doc), doc being "python type: meaning". The struct and Python's
// keywords (python/src/worker.cpp) come from it; docs/worker.md has the table.
//  host_cache_limit_bytes: 0 caches nothing: each request maps a segment of its own size
//    (whole pages), which goes back to the OS at its free, as an allocator without a pool
//    would (docs/worker.md, "Host memory pool").
//  host_numa_node: each segment is bound to it (mbind MPOL_BIND) before its first touch and
//    pre-faulted by threads on its CPUs (pages.h). A negative node is
//    Error(invalid_argument); a node this host lacks is warned about once and nothing is
//    placed (Worker::host_numa_node() = -1), so a device map written for a bigger machine
//    still builds here.
#define PINSTAGE_WORKER_OPTION_FIELDS(X)                                                     \
  X(uint64_t, device_capacity_bytes, 0,                                                      \
    "int: device memory the worker may commit; 0 = the backend's default (sim: "             \
    "PINSTAGE_SIM_DEVICE_CAPACITY, else 80% of physical memory)")                            \
  X(std::optional<uint64_t>, host_cache_limit_bytes, std::nullopt,                           \
    "int: most pinned bytes the host memory pool keeps cached for reuse; unset = "           \
    "PINSTAGE_HOST_CACHE_MAX, else an eighth of physical memory")                            \
  X(std::string, plugin_path, std::string{},                                                 \
    "str: plugin file to load; empty = default_backend_path(backend)")                       \
  X(BackendConfig, config, BackendConfig{},                                                  \
    "dict[str, str]: backend-specific settings, handed to the backend as key/value entries") \
  X(std::optional<int>, host_numa_node, std::nullopt,                                        \
    "int: host NUMA node for the worker's pinned memory; unset = the kernel's choice")

// How a worker is made: every field, its default and meaning is in the list above.
struct WorkerOptions {
  PINSTAGE_WORKER_OPTION_FIELDS(PINSTAGE_FIELD_MEMBER)
};

// Folder holding libpinstage.
PINSTAGE_API std::string library_dir();
// Where `backend` is looked for when WorkerOptions::plugin_path is empty:
// <library_dir>/pinstage/libpinstage_backend_<backend>.so when <library_dir>/pinstage
// exists (an installed tree), else <library_dir>/libpinstage_backend_<backend>.so (the
// build tree).
PINSTAGE_API std::string default_backend_path(const std::string& backend);
// Every libpinstage_backend_*.so in that plugin folder, sorted by path.
PINSTAGE_API std::vector<std::string> discover_backends();

// A backend as it describes itself, once: pinstage_add_backend (cmake/pinstage.cmake) writes
// libpinstage_backend_<name>.backend beside its plugin. Python (pinstage.backends(), device=
// strings, DLPack) and the CLI (--backend) read it (docs/design/plugin-abi.md).
struct BackendDescription {
  std::string name;            // "cuda": what Worker::init takes, Python's device= spelling
  int dlpack_device_type = 0;  // DLPack DLDeviceType of its device memory (1 kDLCPU, 2 kDLCUDA)
  std::string torch_device;    // torch.device type over that memory ("cuda"); "" = none
  std::string plugin_path;     // the plugin it describes
  bool test_only = false;      // a backend of the tests (pinstage_add_backend's TEST_ONLY)
};

// Every described backend of the plugin folder (a .backend file beside each plugin), sorted
// by name, test-only ones included; a plugin with no description is not listed, nor one
// whose description is malformed (a warning naming the file and why is logged, once:
// describe_plugin and backend_choice_error give its error when it is asked for). Read once
// per process.
PINSTAGE_API const std::vector<BackendDescription>& described_backends();
// What a user is offered: described_backends() less the test-only ones, unless
// PINSTAGE_TEST_BACKENDS=on. pinstage info, the CLI's --backend choices and
// pinstage.backends() list these.
PINSTAGE_API std::vector<BackendDescription> listed_backends();
// "" when `name` is one of listed_backends(); else why it cannot be chosen: its
// description's error (a malformed .backend file, named), or "unknown backend" naming the
// listed ones. The CLI's --backend check.
PINSTAGE_API std::string backend_choice_error(const std::string& name);
// The description of the plugin at `plugin_path` (read beside it, once per path).
// Error(not_found) when it has none, Error(io) as above.
PINSTAGE_API const BackendDescription& describe_plugin(const std::string& plugin_path);

// The loaded plugin.
struct BackendInfo {
  std::string name;
  std::string path;
  uint32_t api_version = 0;
};

// Loads and checks the plugin for `backend` (from `path`, or default_backend_path) once
// per process, without creating a context. Error(plugin_load) naming the backend, the
// path and the reason when it is missing, not a plugin, or built for another ABI.
PINSTAGE_API BackendInfo load_backend(const std::string& backend, const std::string& path = "");

// One device as its backend reports it (ABI v6 device_props). Where a backend has no
// topology slots it reports one device, id 0, with these defaults.
struct DeviceInfo {
  int id = 0;
  std::string name;           // "sim device 1", "NVIDIA H200"
  uint64_t memory_bytes = 0;  // the device's memory (sim: its capacity); 0 = unknown
  std::string pci_bus_id;     // "0000:3b:00.0"; empty where there is none
  int numa_node = -1;         // host NUMA node nearest the device; -1 = unknown
  bool usable = true;         // false: present but not usable now
  std::string reason;         // why not usable; empty when usable
};

// Every device the backend sees, loading the plugin but creating no context. `options`
// is the configuration a worker would get (sim reads devices= and numa_nodes= from its
// config) and its plugin_path. Error(plugin_load) as load_backend; the backend's own
// failure (no driver, a bad config value) as the Error its status maps to.
PINSTAGE_API std::vector<DeviceInfo> list_devices(const std::string& backend = "sim",
                                                  const WorkerOptions& options = {});

// What the backend can do; Worker::capabilities() asks the plugin each time.
struct Capabilities {
  bool pinned_is_page_locked = false;  // pinned host memory is really locked in RAM
  bool async_copy = false;             // copies can overlap with host work
  bool execute = false;                // the backend runs host callables (Worker::execute)
  bool device_memory_is_host = false;  // device memory is host RAM (sim): count it there
  // The backend has the ABI's (v5) optional device-side slots: copy_on_device and
  // fill_device work (else Error(unsupported)). From the plugin's table, not a query.
  bool device_copy = false;
  bool device_fill = false;
};

// The WorkerStats fields, listed once: X(type, name, default, doc), doc being the Python
// property's docstring. Outstanding counts are as requested.
#define PINSTAGE_WORKER_STATS_FIELDS(X)                                                     \
  X(uint64_t, pinned_bytes, 0, "int: pinned host bytes held.")                              \
  X(uint64_t, pinned_count, 0, "int: pinned allocations held.")                             \
  X(uint64_t, device_bytes, 0, "int: device bytes held.")                                   \
  X(uint64_t, device_count, 0, "int: device allocations held.")                             \
  X(uint64_t, device_committed_bytes, 0,                                                    \
    "int: device bytes the backend committed (with its rounding).")                         \
  X(uint64_t, device_capacity_bytes, 0, "int: the device's capacity.")                      \
  /* Releases the backend refused: the memory is still the backend's (and still locked), */ \
  /* no longer usable, and finalize releases it again. */                                   \
  X(uint64_t, failed_free_count, 0,                                                         \
    "int: allocations whose free failed, held until finalize retries.")                     \
  X(uint64_t, failed_free_bytes, 0, "int: their bytes.")                                    \
  /* Never decreases (finalize's retries count too); non-zero: the CLI exits non-zero. */   \
  X(uint64_t, free_failures, 0, "int: frees that failed over the worker's life.")           \
  /* Pinned requests over the pin budget (PINSTAGE_PIN_POLICY=fallback). */                 \
  X(uint64_t, pageable_fallback_count, 0,                                                   \
    "int: pinned requests given pageable memory (pin policy 'fallback'), held.")            \
  X(uint64_t, pageable_fallback_bytes, 0, "int: their bytes.")                              \
  X(uint64_t, pageable_fallbacks, 0, "int: such fallbacks over the worker's life.")

// A snapshot of what the worker holds; Worker::stats(). The fields are the list above.
struct WorkerStats {
  PINSTAGE_WORKER_STATS_FIELDS(PINSTAGE_FIELD_MEMBER)
};

// The host memory pool's figures, listed once in the order Python's dict has them:
// X(type, name, default, key, doc), `key` being torch's host_memory_stats() name where it
// has the figure (pinstage's own beside them), doc the meaning (docs/worker.md's table).
// Bytes of blocks are as requested; reserved and cached bytes are whole pages. The double
// fields are seconds, which report_fields gives in microseconds, as torch does.
#define PINSTAGE_HOST_MEMORY_STATS_FIELDS(X)                                                       \
  X(uint64_t, allocated_bytes, 0, "allocated_bytes.current", "bytes of live blocks, as requested") \
  X(uint64_t, allocated_bytes_peak, 0, "allocated_bytes.peak", "their peak")                       \
  X(uint64_t, allocations, 0, "allocation.current", "live blocks")                                 \
  X(uint64_t, allocations_peak, 0, "allocation.peak", "their peak")                                \
  X(uint64_t, reserved_bytes, 0, "reserved_bytes.current", "bytes of segments held (pinned)")      \
  X(uint64_t, reserved_bytes_peak, 0, "reserved_bytes.peak", "their peak")                         \
  X(uint64_t, segments, 0, "segment.current", "segments held")                                     \
  X(uint64_t, segments_peak, 0, "segment.peak", "their peak")                                      \
  X(uint64_t, num_host_alloc, 0, "num_host_alloc", "segments the backend allocated")               \
  X(uint64_t, num_host_free, 0, "num_host_free", "segments the backend released")                  \
  X(uint64_t, cached_bytes, 0, "cached_bytes.current",                                             \
    "free bytes inside segments, ready for reuse")                                                 \
  X(uint64_t, pending_bytes, 0, "pending_bytes.current",                                           \
    "bytes of freed blocks a queued copy may still read (reusable once its event is reached)")     \
  X(uint64_t, pending_blocks, 0, "pending_blocks.current", "those blocks")                         \
  X(uint64_t, hits, 0, "num_hits", "requests served from the cache")                               \
  X(uint64_t, misses, 0, "num_misses", "requests not served from the cache")                       \
  X(uint64_t, cache_limit_bytes, 0, "cache_limit_bytes", "the bound on cached_bytes")              \
  X(double, host_alloc_seconds, 0, "host_alloc_time.total",                                        \
    "time in the backend's segment allocations (microseconds in the dict)")                        \
  X(double, host_free_seconds, 0, "host_free_time.total",                                          \
    "time in its segment releases (microseconds in the dict)")                                     \
  X(double, alloc_seconds, 0, "alloc_time.total",                                                  \
    "all time in alloc_pinned_host, the pool's own work too (microseconds in the dict)")           \
  X(double, free_seconds, 0, "free_time.total",                                                    \
    "all time in pinned releases (microseconds in the dict)")

// One member of a struct built from a keyed field list X(type, name, default, key, doc).
#define PINSTAGE_KEYED_FIELD_MEMBER(type, name, value, key, doc) type name = value;

// Worker::host_memory_stats(): the fields of the list above.
struct HostMemoryStats {
  PINSTAGE_HOST_MEMORY_STATS_FIELDS(PINSTAGE_KEYED_FIELD_MEMBER)
};

// Every field of `s` in the list's order, keyed as the list says, the seconds in
// microseconds: Python's Worker.host_memory_stats() dict.
PINSTAGE_API ReportFields report_fields(const HostMemoryStats& s);

// What a pinned request must fit (docs/worker.md, "Pin budget"). UINT64_MAX = no limit.
struct PinBudget {
  // RLIMIT_MEMLOCK's soft limit where it applies: the backend locks with mlock(2) (its
  // device memory is host memory, as sim's) and the process lacks CAP_IPC_LOCK.
  uint64_t memlock_limit_bytes = UINT64_MAX;
  uint64_t locked_bytes = 0;  // VmLck of this process now
  // memory.max of this process's cgroup v2 (the lowest along its ancestors) and the
  // memory.current of that cgroup.
  uint64_t cgroup_limit_bytes = UINT64_MAX;
  uint64_t cgroup_used_bytes = 0;
  std::string cgroup_path;                // the cgroup whose memory.max is the limit
  uint64_t available_bytes = UINT64_MAX;  // MemAvailable
  // Of locked_bytes, what the asking worker's own pool holds (the Worker fills it in), so
  // that a refusal says who holds the budget.
  uint64_t worker_locked_bytes = 0;
};

// Where read_pin_budget reads the cgroup from: the defaults are the live system's; a test
// gives a tree of its own.
struct PinBudgetFiles {
  std::string proc_self_cgroup = "/proc/self/cgroup";  // holds "0::/the/cgroup"
  std::string cgroup_root = "/sys/fs/cgroup";          // where that path is mounted
};

// The budget now. `memlock_applies`: the backend pins with mlock(2).
PINSTAGE_API PinBudget read_pin_budget(bool memlock_applies, const PinBudgetFiles& files = {});
// Why a pinned request of `bytes` (page-rounded: what the kernel locks) does not fit
// `budget`: names the limit, the figures and how to raise it. Empty when it fits.
PINSTAGE_API std::string pin_budget_refusal(uint64_t bytes, const PinBudget& budget);
// VmLck of this process in bytes (/proc/self/status): memory really locked now.
PINSTAGE_API uint64_t locked_memory_bytes();
// Tests: every worker's pin budget comes from `source` instead of read_pin_budget (an
// empty function: the live reading again), so a test can script what each reading sees.
// Call it while no worker allocates.
PINSTAGE_API void set_pin_budget_source(std::function<PinBudget(bool memlock_applies)> source);

// Backend operations the fault hook can fail: the ABI's one list (PS_FAULT_KIND_LIST),
// value for value. corrupt_h2d is not a failure: the nth upload flips one byte.
enum class FaultKind {
#define PINSTAGE_FAULT_KIND_(E, n) n,
  PS_FAULT_KIND_LIST(PINSTAGE_FAULT_KIND_)
#undef PINSTAGE_FAULT_KIND_
};
// FaultKind::copy_h2d -> "copy_h2d".
PINSTAGE_API const char* fault_kind_name(FaultKind kind);

namespace runtime {
struct WorkerState;
class CallGuard;
}  // namespace runtime

// Which memory a Buffer owns: the worker's pinned host memory or device memory.
enum class MemoryKind { pinned_host, device };

// Move-only owner of one allocation made by a Worker: (pointer, size, owner token).
// Destruction releases it through the worker. A buffer that outlives its worker
// (finalized or destroyed first) is harmless: the worker already reclaimed the memory,
// so the release is a no-op. A failed release is logged, never thrown.
template <MemoryKind Kind>
class PINSTAGE_API Buffer {
 public:
  Buffer() = default;
  Buffer(Buffer&& other) noexcept;
  Buffer& operator=(Buffer&& other) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer();

  // For pinned_host a host pointer; for device an address in the device's space. Null
  // once the buffer is empty. After the worker is finalized the memory is gone: using
  // data() then is the caller's error.
  void* data() const noexcept { return data_; }
  size_t size() const noexcept { return size_; }
  explicit operator bool() const noexcept { return data_ != nullptr; }
  // True while the owning worker is alive and initialized (the memory is valid).
  bool valid() const noexcept;
  // Releases now; the buffer becomes empty. Safe to call repeatedly.
  void reset() noexcept;

 private:
  friend class Worker;
  Buffer(std::shared_ptr<runtime::WorkerState> owner, void* data, size_t size) noexcept;

  std::shared_ptr<runtime::WorkerState> owner_;
  void* data_ = nullptr;
  size_t size_ = 0;
};

using PinnedHostBuffer = Buffer<MemoryKind::pinned_host>;
using DeviceBuffer = Buffer<MemoryKind::device>;

// Which backend queue object a QueueHandle owns.
enum class QueueKind { stream, event };

// Move-only owner of a backend stream or event, released through its worker (a no-op
// once the worker is finalized, which released it with the context).
template <QueueKind Kind>
class PINSTAGE_API QueueHandle {
 public:
  QueueHandle() = default;
  QueueHandle(QueueHandle&& other) noexcept;
  QueueHandle& operator=(QueueHandle&& other) noexcept;
  QueueHandle(const QueueHandle&) = delete;
  QueueHandle& operator=(const QueueHandle&) = delete;
  ~QueueHandle();

 private:
  friend class Worker;
  QueueHandle(std::shared_ptr<runtime::WorkerState> owner, void* handle) noexcept
      : owner_(std::move(owner)), handle_(handle) {}

  std::shared_ptr<runtime::WorkerState> owner_;
  void* handle_ = nullptr;  // ps_stream* or ps_event*; null without async copies
};

// A copy queue on the worker's device. Copies on one stream complete in order.
using Stream = QueueHandle<QueueKind::stream>;
// Marks a point on a stream; waiting on it waits for the copies queued before it.
using Event = QueueHandle<QueueKind::event>;

// A file's bytes mapped and pinned where they lie: the page cache itself, read-only, with
// nothing read or copied (the file_shared source, docs/worker.md "Host sources";
// docs/loading.md "Modes"), or, where the backend cannot pin read-only memory (a CUDA
// driver without cudaHostRegisterReadOnly), a private copy-on-write copy the kernel made
// (file_private: nothing went through the pool; note() says so). Made by
// Worker::map_file_pinned; shared by whatever views it (a checkpoint's tensors). The last
// owner unpins it (while its worker lives: finalize unpins it first, and the bytes then stay
// readable, unpinned) and unmaps it. Writing through data() of a file_shared mapping is a
// segfault: the mapping is PROT_READ.
class PINSTAGE_API PinnedFileMapping {
 public:
  PinnedFileMapping(const PinnedFileMapping&) = delete;
  PinnedFileMapping& operator=(const PinnedFileMapping&) = delete;
  ~PinnedFileMapping();

  const unsigned char* data() const noexcept { return data_; }  // the file's byte 0
  uint64_t size() const noexcept { return size_; }              // the file's bytes, mapped
  // True when the backend registered it (copies from it take the pinned path); false when
  // it refused or has no host_register slot, and refusal() says why (starting "over the
  // pin budget" when the budget refused it under PINSTAGE_PIN_POLICY=fallback).
  bool pinned() const noexcept { return pinned_; }
  const std::string& refusal() const noexcept { return refusal_; }
  // "file_shared" (the page cache, read-only) or "file_private" (a private copy).
  const char* source() const noexcept { return private_ ? "file_private" : "file_shared"; }
  // Why the mapping is a private copy, or "" (file_shared).
  const std::string& note() const noexcept { return note_; }
  double map_seconds() const noexcept { return map_seconds_; }  // open + mmap (+ faults)
  double pin_seconds() const noexcept { return pin_seconds_; }  // host_register

 private:
  friend class Worker;
  PinnedFileMapping() = default;
  // The pin step of a new mapping of the file open as `fd` (file_source.cpp): read-only in
  // place, else a private copy pinned writable, else unpinned with refusal() set; a mapping
  // made private (map_files_pinned's writable) is pinned writable as it is.
  void pin_in_place(runtime::WorkerState& s, int fd, const std::string& path);

  std::weak_ptr<runtime::WorkerState> owner_;
  unsigned char* data_ = nullptr;
  uint64_t size_ = 0;
  size_t map_bytes_ = 0;  // whole pages: what is mapped and registered
  bool pinned_ = false;
  bool private_ = false;
  std::string refusal_, note_;
  double map_seconds_ = 0, pin_seconds_ = 0;
};

// Fresh pinned memory that its writers fault in (Worker::reserve_host_fill): a load's
// reader threads each call prepare() on the range they are about to write, which faults it
// under the worker's placement (its NUMA node, huge pages with the stall watch) in parallel
// with their reads, and the segment is pinned behind them: page by page as they fault it
// where the backend can (sim: PS_REGISTER_ON_FAULT), else whole by finish(). Until finish() its
// blocks are not pinned memory (is_pinned_host says false; copies take the pageable path), so
// nothing reports as pinned what is not. Move-only. Destroying an unfinished fill finishes it (a
// failure is logged and the segment stays unpinned, released once its blocks are freed).
class PINSTAGE_API HostFill {
 public:
  HostFill() = default;
  HostFill(HostFill&& other) noexcept;
  HostFill& operator=(HostFill&& other) noexcept;
  HostFill(const HostFill&) = delete;
  HostFill& operator=(const HostFill&) = delete;
  ~HostFill();

  // A segment waits for its writers (false when the cache had the memory: nothing to do).
  bool active() const noexcept { return data_ != nullptr && !finished_; }
  // Faults the pages of [data, data + bytes) that lie in the segment (none: a no-op).
  // Thread-safe: each writer prepares its own range.
  void prepare(void* data, size_t bytes);
  // Pins the segment (host_register); Error as alloc_pinned_host's. Idempotent.
  void finish();
  // Ends the fill without pinning (its writers failed): the segment goes back to the OS once
  // its blocks are freed, never pinned. A no-op after finish(). Never throws.
  void abandon() noexcept;
  // Seconds spent in prepare() on every thread (summed), and in finish().
  double fault_seconds() const noexcept;
  double pin_seconds() const noexcept { return pin_seconds_; }
  // The pages its segment took: "huge" (2 MiB), "base", or "huge, then base after a stall
  // of N ms"; "" when it had no segment (the cache or the vendor's allocation served it).
  std::string pages() const;

 private:
  friend class Worker;
  std::shared_ptr<runtime::WorkerState> owner_;
  unsigned char* data_ = nullptr;
  size_t bytes_ = 0;
  bool huge_ = false;
  bool on_fault_ = false;  // registered before its writers (PS_REGISTER_ON_FAULT)
  bool finished_ = false;
  std::unique_ptr<FaultPlan> plan_;
  std::unique_ptr<std::atomic<int64_t>> fault_ns_;
  double pin_seconds_ = 0;
};

// How a worker places its host memory, decided once at init (docs/worker.md, "Placement").
struct HostPlacementInfo {
  int numa_node = -1;        // every segment is bound there before its first touch; -1: none
  bool huge_pages = false;   // anonymous segments of 2 MiB and more ask for huge pages
  std::string huge_reason;   // the switch and the kernel's THP mode behind huge_pages
  double stall_seconds = 0;  // a 2 MiB fault slower than this gives the rest base pages
  std::string pool_source;   // "anonymous" (host_register) or "vendor" (the plugin's own)
};

// One bound argument handed to a backend callable.
struct ExecArg {
  std::string name;
  void* device_ptr = nullptr;
  uint64_t bytes = 0;
};

// A function the runtime runs on device pointers for backends whose device memory is
// host memory (sim): a scene's execute step without the plugin linking the scene. See
// Note [Host callables] in src/runtime/host_callables.cpp.
using HostCallable = std::function<void(std::span<const ExecArg> args)>;
// Registers `fn` under `name` for every worker in the process. Error(invalid_argument)
// when the name is empty or already taken.
PINSTAGE_API void register_host_callable(const std::string& name, HostCallable fn);
// The registered names, sorted.
PINSTAGE_API std::vector<std::string> host_callable_names();

// Owns one device through a backend plugin (docs/worker.md): its pinned host and device
// memory, streams and events. Methods are thread-safe; finalize waits for calls in flight.
class PINSTAGE_API Worker {
 public:
  // Error(invalid_argument) for WorkerLevel::node: a Worker owns one device; the node level
  // is a WorkerGroup.
  explicit Worker(WorkerLevel level = WorkerLevel::chip);
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;
  ~Worker();  // finalize(); never throws

  // Loads the backend plugin (once), checks its api_version, creates the device context.
  // Throws Error(plugin_load) naming the backend, the path tried and the reason.
  void init(const std::string& backend = "sim", int device_id = 0,
            const WorkerOptions& options = {});
  // Terminal and idempotent: reclaims every outstanding pinned and device allocation
  // (logging the count), destroys the device context, unloads the plugin. On a worker
  // never initialized it only makes it terminal: init() then throws Error(finalized).
  void finalize() noexcept;

  bool initialized() const noexcept;  // init() succeeded and finalize() has not run
  bool finalized() const noexcept;
  WorkerLevel level() const noexcept { return level_; }
  int device_id() const;
  // This worker's device, as list_devices reports it (with this worker's options).
  DeviceInfo device_info() const;
  // The NUMA node its pinned memory is really placed on, by the runtime, on every backend:
  // WorkerOptions::host_numa_node when the host has that node, else -1 (none asked, or
  // absent here: the kernel's choice).
  int host_numa_node() const;
  // Where and how its host memory is placed (NUMA node, huge pages, the pool's source).
  HostPlacementInfo host_placement() const;
  const BackendInfo& backend() const;
  Capabilities capabilities() const;
  WorkerStats stats() const;
  // WorkerStats::free_failures, readable at any time, after finalize too (finalize's
  // retries count): the CLI's exit status.
  uint64_t free_failures() const noexcept;

  // Pinned host memory; bytes must be in [1, physical memory]. The request must fit the
  // pin budget (read_pin_budget): otherwise Error(out_of_memory) naming the limit, or,
  // with PINSTAGE_PIN_POLICY=fallback, pageable memory with a warning (stats count it).
  PinnedHostBuffer alloc_pinned_host(size_t bytes);
  // Device memory; bytes must be > 0. Error(out_of_memory) past the capacity.
  DeviceBuffer alloc_device(size_t bytes);

  // The host memory pool (docs/worker.md, "Host memory pool"). A freed pinned buffer is
  // cached for reuse; these give the cache back or fill it ahead.
  HostMemoryStats host_memory_stats() const;
  // Returns every wholly free cached segment to the OS (unlocked, unmapped); the bytes
  // returned. A segment the backend refuses to release is kept for finalize and reported
  // (Error) after the others were released.
  uint64_t empty_cache();
  // The same, stopping once at least `bytes` went back.
  uint64_t trim_host_cache(uint64_t bytes);
  // Makes sure `bytes` of pinned memory are cached, mapping one segment of exactly the
  // shortfall when they are not: a load calls it before its many allocations, so a
  // first load maps once and a second load of the same tensors maps nothing.
  void reserve_pinned_host(size_t bytes);
  // The same for memory its writers fault in while they write it (a load's readers): the
  // segment is mapped and placed but neither faulted nor pinned until the returned fill's
  // finish() (see HostFill). Where the cache already holds the bytes, or the pool's source
  // cannot defer (vendor), the fill is inactive and the memory is pinned already.
  HostFill reserve_host_fill(size_t bytes);
  // True when [ptr, ptr + bytes) lies inside one live pinned buffer of this worker: the
  // one table of pinned ranges that copies, the Binder and the loader ask.
  bool is_pinned_host(const void* ptr, size_t bytes) const;

  // Maps the file at `path` read-only (PROT_READ, MAP_SHARED: its page cache), faults it
  // in and pins it in place through the backend's host_register (ABI v7) with
  // PS_REGISTER_READ_ONLY; the range then counts as this worker's pinned memory
  // (is_pinned_host, copy paths) until the mapping goes. `expect_bytes`: the size the
  // caller validated (a checkpoint's), or UINT64_MAX to take the file as it is; a file of
  // another size is Error(io) ("changed since it was opened"), checked before any mapping
  // is shared. A backend that cannot pin read-only memory (PS_ERR_UNSUPPORTED: a driver
  // without read-only registration) gets a file_private mapping pinned instead (note()
  // says so); one without the slot, or refusing that too, gives an unpinned mapping whose
  // refusal() says why: the caller copies instead. Over the pin budget:
  // Error(out_of_memory), or unpinned under PINSTAGE_PIN_POLICY=fallback. Error(io) for a
  // file that cannot be opened (never blocking: a FIFO is refused) or mapped, an empty or
  // non-regular one included.
  std::shared_ptr<PinnedFileMapping> map_file_pinned(const std::string& path,
                                                     uint64_t expect_bytes = UINT64_MAX);
  // The same for several files at once: faulted and pinned in parallel (threads: 0 = the
  // placement's), in the order given. Nothing stays mapped or pinned when one fails.
  // writable: each file mapped as a private copy-on-write copy (file_private) pinned
  // writable, never shared with another mapping: the kernel copies the page cache's pages
  // as it pins them (no zero fill, nothing read through the pool), and writes stay in this
  // mapping (a load from a restart-cache hit in copy mode, docs/cache.md).
  std::vector<std::shared_ptr<PinnedFileMapping>> map_files_pinned(
      const std::vector<std::string>& paths, const std::vector<uint64_t>& expect_bytes,
      int threads = 0, bool writable = false);

  // Synchronous copies; [offset, offset+bytes) must lie inside the device buffer.
  void copy_to_device(const DeviceBuffer& dst, size_t dst_offset, const void* src, size_t bytes);
  void copy_to_host(void* dst, const DeviceBuffer& src, size_t src_offset, size_t bytes);

  // Async copies. Where the backend has no async slots they run synchronously and the
  // stream/event calls are no-ops, so callers need one code path.
  Stream create_stream();
  Event create_event();
  void copy_to_device_async(const DeviceBuffer& dst, size_t dst_offset, const void* src,
                            size_t bytes, Stream& stream);
  void copy_to_host_async(void* dst, const DeviceBuffer& src, size_t src_offset, size_t bytes,
                          Stream& stream);
  void record(Event& event, Stream& stream);
  void wait(Event& event);
  // True when the copies queued before `event`'s last record have completed (or it was
  // never recorded), without waiting; a failed copy is the Error wait() would throw.
  // Without async slots copies ran synchronously: always true.
  bool query(Event& event);
  void synchronize(Stream& stream);

  // Device-side work, without a trip through the host. Every range must lie inside its
  // buffer of this worker; a copy's two ranges may share a buffer but must not overlap.
  // bytes == 0 is a no-op (ranges still checked, as the copies above do). A backend
  // without the operation (its ABI v5 slot is NULL) is Error(unsupported): there is no
  // host fallback. The async forms are ordered on `stream` (they complete before it
  // returns where the backend has no async slots); the others complete before they return.
  void copy_on_device(const DeviceBuffer& dst, size_t dst_offset, const DeviceBuffer& src,
                      size_t src_offset, size_t bytes);
  void copy_on_device_async(const DeviceBuffer& dst, size_t dst_offset, const DeviceBuffer& src,
                            size_t src_offset, size_t bytes, Stream& stream);
  // Sets [offset, offset + bytes) of `dst` to `value`, which must be in [0, 255]
  // (Error(invalid_argument) otherwise: no silent truncation to a byte).
  void fill_device(const DeviceBuffer& dst, size_t offset, int value, size_t bytes);
  void fill_device_async(const DeviceBuffer& dst, size_t offset, int value, size_t bytes,
                         Stream& stream);

  // Runs a registered host callable on bound device memory through the backend's
  // host_execute slot. Every argument must lie inside one device allocation of this
  // worker. Error(not_found) for an unknown name, Error(unsupported) when the backend
  // runs no host callables (its device memory is not host memory).
  void execute(const std::string& callable, std::span<const ExecArg> args);

  // Plugin SDK escape hatch for tools: the backend's extension function `name` (its
  // get_proc_address slot; nullptr when it has none) and the native ps_device_ctx that
  // such a function takes. The extension's header documents the signature.
  void* backend_extension(const std::string& name) const;
  ps_device_ctx* native_context() const;

  // Tests: make the nth (1-based) next backend call of `kind` fail; nth = 0 clears it.
  void inject_fault(FaultKind kind, uint64_t nth);

 private:
  const runtime::WorkerState& state() const;  // throws unless initialized
  // Throws unless initialized and not finalized; holds off finalize until destroyed.
  runtime::CallGuard enter() const;
  // Throws Error(finalized) or Error(not_initialized) when there is no state to use.
  void require_state() const;

  WorkerLevel level_;
  std::shared_ptr<runtime::WorkerState> state_;
  // finalize() ran before any init(): no state to mark, yet just as terminal.
  std::atomic<bool> finalized_unused_{false};
};

// Throws Error(invalid_argument) unless `worker` is an initialized chip-level worker.
// The one guard every place that needs a device-owning worker shares; `who` names the
// caller in the message, which tells a finalized worker from a never-initialized one.
PINSTAGE_API void require_chip_worker(const Worker& worker, std::string_view who);

}  // namespace pinstage
