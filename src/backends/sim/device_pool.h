// The sim device's memory: one pool, like HBM. The whole capacity is reserved as address
// space (PROT_NONE, MAP_NORESERVE) when the context is created; pages are backed the first
// time an allocation reaches them and stay backed after a free, so a reused range never
// faults again. The one best-fit allocator (pinstage/free_ranges.h) hands out 256-byte-
// aligned blocks.
// docs/worker.md ("sim semantics") says what this stands for and what it costs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>

#include "pinstage/free_ranges.h"

namespace pinstage::sim {

// What the pool holds now, for the sim.pool_stats extension and tests.
struct PoolStats {
  uint64_t span = 0;           // bytes the pool can hand out (capacity, whole granules)
  uint64_t used = 0;           // bytes in live blocks (granule-rounded)
  uint64_t backed = 0;         // bytes backed so far (the high-water mark, whole pages)
  uint64_t free_blocks = 0;    // free ranges after coalescing
  uint64_t largest_free = 0;   // the largest of them
  double backing_seconds = 0;  // time spent backing pages, over the pool's life
};

class DevicePool {
 public:
  // The alignment and granule of every block, as cudaMalloc's.
  static constexpr size_t kAlignment = 256;

  // Reserves `capacity` bytes of address space; nothing is backed yet. Throws
  // Error(out_of_memory) when the address space cannot be reserved.
  explicit DevicePool(uint64_t capacity);
  ~DevicePool();
  DevicePool(const DevicePool&) = delete;
  DevicePool& operator=(const DevicePool&) = delete;

  // A 256-byte-aligned block of at least `bytes` (> 0), backed when it returns. Throws
  // Error(out_of_memory) naming the free bytes and the largest free block when no free
  // range fits; the pool is then unchanged.
  void* allocate(size_t bytes);
  // Returns the block `allocate(bytes)` gave; its pages stay backed for reuse.
  void release(void* ptr, size_t bytes);

  // Backs the first `bytes` of the pool now (whole pages; at most the span, else
  // Error(invalid_argument) naming both), so allocations there never fault.
  void back(uint64_t bytes);

  PoolStats stats() const;
  uint64_t used() const;
  // The reserved range (tests: whether a pointer lies in the pool).
  const void* base() const { return base_; }

 private:
  void back_up_to(uint64_t end);

  mutable std::mutex mu_;
  char* base_ = nullptr;
  uint64_t reserved_ = 0;  // mapped bytes (whole pages)
  uint64_t span_ = 0;
  uint64_t used_ = 0;
  uint64_t backed_ = 0;  // [0, backed_) is read/write and faulted in
  double backing_seconds_ = 0;
  FreeRanges free_;
};

}  // namespace pinstage::sim
