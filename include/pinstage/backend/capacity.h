// Plugin SDK: the device-capacity ledger that backends over a vendor allocator share (cuda,
// acl). A request is reserved before the vendor call, so two concurrent requests cannot
// both pass the check, and given back if that call fails; mem_info reports from it.
// Header only, so a plugin links base alone.
#pragma once

#include <algorithm>
#include <cstdint>
#include <mutex>
#include <string>

#include "pinstage/backend/slot.h"

namespace pinstage::backend {

// What a context may commit: the device's free memory when the context is made (what the
// vendor allocator can really give), or `requested` when that is smaller (0 = all of it).
inline uint64_t plan_capacity(uint64_t requested, uint64_t free_bytes) {
  return requested == 0 ? free_bytes : std::min(requested, free_bytes);
}

class CapacityLedger {
 public:
  void set_capacity(uint64_t bytes) {
    std::lock_guard lock(mu_);
    capacity_ = bytes;
  }
  uint64_t capacity() const {
    std::lock_guard lock(mu_);
    return capacity_;
  }
  // Includes reservations of vendor calls in flight.
  uint64_t committed() const {
    std::lock_guard lock(mu_);
    return committed_;
  }
  // Reserves `bytes`, or fails with PS_ERR_OUT_OF_MEMORY naming `what` ("device_malloc of
  // N bytes on device 0") and the figures.
  void reserve(uint64_t bytes, const std::string& what) {
    std::lock_guard lock(mu_);
    if (bytes > capacity_ - committed_)
      fail(PS_ERR_OUT_OF_MEMORY, what + " exceeds the capacity: " + std::to_string(committed_) +
                                     " of " + std::to_string(capacity_) +
                                     " bytes already committed");
    committed_ += bytes;
  }
  // Gives back a reservation (a failed vendor call) or a freed allocation. A free the
  // vendor refused keeps its bytes committed: the memory may still be held.
  void release(uint64_t bytes) noexcept {
    std::lock_guard lock(mu_);
    committed_ -= std::min(bytes, committed_);
  }

 private:
  mutable std::mutex mu_;
  uint64_t capacity_ = 0;
  uint64_t committed_ = 0;
};

}  // namespace pinstage::backend
