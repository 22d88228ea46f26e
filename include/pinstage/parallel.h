// A process-wide pool of worker threads for data-parallel loops (generation, copies,
// golden). Deterministic work splitting is the caller's job: results must not depend on
// how ranges are divided.
#pragma once

#include <cstddef>
#include <functional>

#include "pinstage/export.h"

namespace pinstage {

// CPUs this process may run on: its affinity mask (sched_getaffinity), which taskset, a
// cgroup cpuset or a launcher narrows, unlike hardware_concurrency(). At least 1.
PINSTAGE_API int usable_cpu_count();
// Threads used by parallel_for: PINSTAGE_NUM_THREADS if set, else usable_cpu_count().
PINSTAGE_API int default_thread_count();

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
