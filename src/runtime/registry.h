// The generic part of pinned and device memory tracking: pointer -> size, with stats.
// Not thread-safe by itself: WorkerState guards it with its mutex.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <unordered_map>
#include <utility>
#include <vector>

#include "pinstage/export.h"

namespace pinstage::detail {

class PINSTAGE_API AllocationRegistry {
 public:
  // False when `ptr` is already tracked (a backend handing out the same address twice).
  bool insert(void* ptr, size_t bytes);
  // The size of `ptr`, now untracked; nullopt when it was never tracked.
  std::optional<size_t> erase(void* ptr);
  // Every tracked allocation, leaving the registry empty (finalize's reclaim).
  std::vector<std::pair<void*, size_t>> take_all();
  uint64_t bytes() const noexcept { return bytes_; }
  uint64_t count() const noexcept { return entries_.size(); }

 private:
  std::unordered_map<void*, size_t> entries_;
  uint64_t bytes_ = 0;
};

}  // namespace pinstage::detail
