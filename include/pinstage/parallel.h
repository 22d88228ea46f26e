// A process-wide pool of worker threads for data-parallel loops (generation, copies,
// golden). Deterministic work splitting is the caller's job: results must not depend on
// how ranges are divided.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>

#include "pinstage/export.h"

namespace pinstage {

// CPUs this process may run on: its affinity mask (sched_getaffinity), which taskset, a
// cgroup cpuset or a launcher narrows, unlike hardware_concurrency(). At least 1.
PINSTAGE_API int usable_cpu_count();
// Threads used by parallel_for: PINSTAGE_NUM_THREADS if set, else usable_cpu_count();
// inside ThreadTeam::run, the team's size.
PINSTAGE_API int default_thread_count();
// The process's thread count (PINSTAGE_NUM_THREADS, else usable_cpu_count()), inside a
// team or not: what a WorkerGroup splits across its devices.
PINSTAGE_API int process_thread_count();

// Threads of one device's work in a WorkerGroup (docs/node.md, "Threads"): parallel_for
// and everything built on it, called inside run() on the calling thread, split over this
// team's threads instead of the process pool, so N devices' loads and binds run N jobs
// at once rather than queueing on one pool. The caller works too: a team of n has n - 1
// threads of its own. Thread-safe; one run at a time per team.
class PINSTAGE_API ThreadTeam {
 public:
  // threads in [1, 1024], else Error(invalid_argument); Error(out_of_memory) when the
  // threads cannot start (none stay).
  explicit ThreadTeam(int threads);
  ~ThreadTeam();
  ThreadTeam(const ThreadTeam&) = delete;
  ThreadTeam& operator=(const ThreadTeam&) = delete;
  int size() const noexcept;
  // Calls fn() on this thread with the team current (nested teams: the innermost wins).
  void run(const std::function<void()>& fn);
  // Jobs parallel_for ran on this team (tests: the work went where it was sent).
  uint64_t jobs() const noexcept;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// Calls fn(begin, end) over [0, n) split into contiguous chunks of at least `grain`
// items, on up to `threads` threads (0 = default_thread_count()). Runs inline when one
// chunk suffices. The first exception thrown by fn is rethrown after all chunks finish.
// The pool starts on first use; when it cannot start every thread it throws
// Error(out_of_memory) (and tries again on the next call).
PINSTAGE_API void parallel_for(size_t n, size_t grain,
                               const std::function<void(size_t, size_t)>& fn, int threads = 0);

// A copy with non-temporal (streaming) stores: the destination is written around the CPU
// caches, with no read of its old lines, as a DMA engine writes memory. Faster than memcpy
// for copies larger than the caches, slower for data read again at once. Bit-exact at any
// size and alignment; it ends with a store fence, so the bytes are visible to another
// thread that synchronizes with this one afterwards. memcpy where the CPU has no
// streaming stores (non-x86).
PINSTAGE_API void stream_copy(void* dst, const void* src, size_t bytes);

// A large copy split across threads, each piece copied with stream_copy (pieces of 1 MiB
// and more) or memcpy: the all-core host copy rate, the baseline of the bind and load
// benchmarks.
PINSTAGE_API void parallel_memcpy(void* dst, const void* src, size_t bytes, int threads = 0);

}  // namespace pinstage
