// The one best-fit range allocator: free ranges of an address space, merged with their
// free neighbours, handed out best fit. sim's device pool and the runtime's host memory
// pool both carve their blocks with it (one allocator, not two).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <utility>

#include "pinstage/export.h"

namespace pinstage {

// Not thread-safe: its owner locks. Offsets are whatever the owner counts in (an offset
// into one reservation, or an address).
class PINSTAGE_API FreeRanges {
 public:
  // Adds [offset, offset + size) as free, merged with free neighbours unless a fence
  // stands between them.
  void give(uint64_t offset, uint64_t size);
  // The lowest-addressed range among the smallest that hold `size`, split: the rest stays
  // free. nullopt (and nothing changes) when no range fits.
  std::optional<uint64_t> take(uint64_t size);
  // Removes exactly the free range [offset, offset + size); false when it is not one.
  bool remove(uint64_t offset, uint64_t size);
  // Ranges never merge across `offset` (the start of one separately released segment).
  void add_fence(uint64_t offset) { fences_.insert(offset); }
  void remove_fence(uint64_t offset) { fences_.erase(offset); }

  uint64_t count() const noexcept { return by_offset_.size(); }
  uint64_t largest() const noexcept { return by_size_.empty() ? 0 : by_size_.rbegin()->first; }
  uint64_t free_bytes() const noexcept { return free_bytes_; }
  // Free ranges by offset (tests, trim).
  const std::map<uint64_t, uint64_t>& ranges() const noexcept { return by_offset_; }

 private:
  void erase(std::map<uint64_t, uint64_t>::iterator it);
  std::map<uint64_t, uint64_t> by_offset_;           // offset -> size
  std::set<std::pair<uint64_t, uint64_t>> by_size_;  // (size, offset): best fit
  std::set<uint64_t> fences_;
  uint64_t free_bytes_ = 0;
};

}  // namespace pinstage
