// The shared state behind a Worker and every buffer, stream and event it hands out.
// See Note [Pinned memory lifecycle] in worker.cpp and Note [One allocation table].
#pragma once

#include <array>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>

#include <sys/types.h>
#include <unistd.h>

#include "pinstage/backend/platform_abi.h"
#include "pinstage/worker.h"
#include "runtime/allocation_table.h"
#include "runtime/host_memory/host_pool.h"
#include "runtime/host_memory/host_source.h"
#include "runtime/host_memory/placement.h"
#include "runtime/plugin.h"

namespace pinstage::detail {
// read_pin_budget, or what set_pin_budget_source installed (pin_budget.cpp).
PinBudget current_pin_budget(bool memlock_applies);
}  // namespace pinstage::detail

namespace pinstage::runtime {

inline constexpr const char* kFinalizedMessage =
    "worker is finalized: create and init a new Worker to use the device again";

// A forked child's copy of a Worker: the context, its threads and the pinned memory stay
// with the parent (Note [Fork] in worker.cpp).
inline constexpr const char* kForkedMessage =
    "this Worker belongs to the process that initialized it; after fork() the child cannot "
    "use it (its device context, threads and pinned memory stay with the parent): create "
    "and init a new Worker in the child";

// A file as map_file_pinned shares its mapping: the same inode, unchanged since.
struct FileKey {
  dev_t dev;
  ino_t ino;
  int64_t mtime_s, mtime_ns;
  uint64_t size;
  // std::tie, not a defaulted <=>: clang-tidy 14 reads that as a comparison with 0.
  bool operator<(const FileKey& o) const {
    return std::tie(dev, ino, mtime_s, mtime_ns, size) <
           std::tie(o.dev, o.ino, o.mtime_s, o.mtime_ns, o.size);
  }
};

struct WorkerState {
  const Plugin* plugin = nullptr;
  pid_t owner_pid = 0;  // the process that created the context
  // True in a forked child: nothing may touch the context or take `mu` (it may have been
  // held by a thread that does not exist here).
  bool forked() const noexcept { return owner_pid != 0 && ::getpid() != owner_pid; }
  ps_device_ctx* ctx = nullptr;
  int device_id = 0;
  WorkerOptions options;    // as init() got them: device_info() asks the backend with them
  HostPlacement placement;  // where and how host memory is placed, for every source
  // One of each source (Note [Segment sources]), made at init; the pool's is `pool_source`:
  // anonymous where the plugin has host_register, vendor where it has not (or refused).
  std::array<std::unique_ptr<HostSource>, kSourceKindCount> sources;
  SourceKind pool_source = SourceKind::anonymous;
  // host_register took anonymous memory once (probe_anonymous_register): fills may defer
  // faulting and pinning to their writers.
  bool anonymous_registers = false;

  mutable std::mutex mu;
  std::condition_variable idle;  // signalled when in_flight drops to 0
  bool live = false;             // initialized and not finalized
  uint64_t in_flight = 0;        // backend calls running now (finalize waits for them)
  AllocationTable table;         // device memory, streams, events, pageable fallbacks; failed frees
  HostPool host;                 // pinned host memory (Note [Host memory pool])
  uint64_t host_cache_limit = 0;
  bool pins_with_mlock = false;     // the backend's device memory is host memory (sim)
  uint64_t free_failures = 0;       // releases the backend refused, ever (WorkerStats)
  uint64_t pageable_fallbacks = 0;  // pinned requests served pageable, ever
  // Live file mappings (file_source.cpp), so a file's tensors share one pinned mapping.
  std::map<FileKey, std::weak_ptr<PinnedFileMapping>> mapped_files;

  const ps_platform_api& api() const { return *plugin->api; }
  const std::string& name() const { return plugin->info.name; }

  // Throws Error(code, "<backend> <what> failed: <status> (<detail>)") unless status is OK.
  void check(int status, const char* what) const;

  // Raw alloc/free: internal only; the public surface is the buffer types.
  void* alloc(MemoryKind kind, size_t bytes);
  // The pool's side (host_memory.cpp). A block of `bytes`: from the cache, else from a
  // new segment, else (over the budget, PINSTAGE_PIN_POLICY=fallback) pageable memory.
  void* alloc_pinned(size_t bytes);
  // The pin budget's one verdict, for every source: for a segment of `bytes` (`minimum`
  // when only that fits; `bytes` is then lowered to it), "" when it fits. Over the budget:
  // Error(out_of_memory) naming `what` and `requested` (the caller's own size), or, under
  // PINSTAGE_PIN_POLICY=fallback, the refusal, which the caller acts on without reading the
  // budget again. Wholly free cached segments are released before anyone is refused.
  std::string pin_verdict(size_t& bytes, size_t minimum, size_t requested, const std::string& what);
  // Pins a segment a source made (host_register, read-only for a read-only one; vendor
  // segments come pinned) and enters it in the table under its source's kind. PS_OK, or
  // PS_ERR_UNSUPPORTED (the backend cannot pin this kind of memory; nothing registered);
  // any other failure throws.
  // `flags` adds PS_REGISTER_ON_FAULT for a segment its writers will fault.
  int pin_segment(const HostSegment& segment, uint32_t flags = 0);
  // Makes one pool segment of `bytes` (or `minimum`, see pin_verdict) through the pool's
  // source, faulted and pinned (`fault`) or left to a HostFill; "" when made, else the
  // fallback policy's refusal. `base` gets the segment's address.
  std::string map_segment(size_t bytes, size_t minimum, size_t requested, bool fault = true,
                          HostSegment* made = nullptr);
  // Whether fills can defer to their writers: the pool's source is anonymous and the
  // plugin registers anonymous memory, found out once on one page before any data is
  // written (a refusal switches the pool to the vendor source: false).
  bool probe_anonymous_register();
  // read_pin_budget for this worker's backend, with what it holds pinned; takes `mu`.
  PinBudget pin_budget() const;
  // Releases the pool block at `ptr`; false when it is none.
  bool free_pinned(void* ptr);
  // Releases pool segments (unpins the pinned ones, then their source releases them);
  // returns the bytes released. Failures are kept for finalize and counted, and thrown as
  // Error when `strict`.
  uint64_t release_segments(const std::vector<HostPool::Owned>& segments, bool strict);
  // Unpins (when `unpin`) and releases (when `release`) one host segment of `source`;
  // "" or why it failed (a failed unpin leaves it mapped: unmapping registered memory is
  // not safe).
  std::string release_host(SourceKind source, const ps_allocation& segment, bool unpin,
                           bool release) noexcept;
  // Destroys pool events whose blocks became reusable; `mu` is held.
  void recycle_reached_locked();
  // The copy flags for a host range (PS_COPY_HOST_PINNED), noting `stream` on its block.
  uint32_t host_flags(const void* host, size_t bytes, ps_stream* stream);
  // Releases a tracked pointer; a no-op once the worker is no longer live (finalize
  // reclaimed it already). Throws Error(unknown_pointer) for an untracked pointer and
  // Error(<backend code>) when the backend refuses (the entry then waits in the table's
  // failed list for finalize's retry).
  void free(MemoryKind kind, void* ptr);
  // A pinned request the pin budget refused (`refusal`, under PINSTAGE_PIN_POLICY=fallback):
  // pageable memory mapped for it, with a warning. Never null.
  void* pageable_fallback(size_t bytes, const std::string& refusal);
  // Enters a stream or event handle in the table; destroy_handle takes it out and
  // releases it through the backend (a no-op after finalize).
  void add_handle(EntryKind kind, void* handle);
  void destroy_handle(EntryKind kind, void* handle) noexcept;
  // Throws Error(invalid_argument) unless [ptr, ptr + bytes) lies in one device allocation.
  void require_device_range(const void* ptr, size_t bytes, const std::string& what) const;

  // Releases streams, events and memory through the backend once, then the context.
  // Idempotent.
  void shutdown() noexcept;
};

constexpr EntryKind entry_kind(QueueKind kind) {
  return kind == QueueKind::stream ? EntryKind::stream : EntryKind::event;
}

// Counts a backend call as in flight so finalize cannot destroy the context under it.
// entered() is false when the worker is no longer live; then nothing is counted.
class CallGuard {
 public:
  explicit CallGuard(WorkerState& state) noexcept;
  ~CallGuard();
  CallGuard(CallGuard&& other) noexcept;  // so Worker::enter can return one
  CallGuard(const CallGuard&) = delete;
  CallGuard& operator=(const CallGuard&) = delete;
  bool entered() const noexcept { return entered_; }
  // Throws Error(finalized) unless entered.
  void require() const;

 private:
  WorkerState& state_;
  bool entered_;
};

// The registered host callable `name`; Error(not_found) listing the registered names.
const HostCallable& find_host_callable(const std::string& name);

}  // namespace pinstage::runtime
