/* Plugin SDK: the fault hook's countdowns, one per fault kind (PS_FAULT_KIND_LIST), the
 * one implementation every backend's inject_fault slot and copy paths share. The nth
 * call of a kind fails once (nth = 0 turns it off). Lock-free: slots of one context are
 * called from several threads. See docs/design/plugin-abi.md ("Fault injection"). */
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <string>

#include "pinstage/backend/platform_abi.h"
#include "pinstage/backend/slot.h"

namespace pinstage::backend {

class FaultCountdowns {
 public:
  // The inject_fault slot: PS_ERR_INVALID_ARGUMENT (through fail) for an unknown kind.
  void set(int kind, uint64_t nth) {
    if (ps_fault_kind_name(kind) == nullptr)
      fail(PS_ERR_INVALID_ARGUMENT, "inject_fault: unknown fault kind " + std::to_string(kind));
    left_[static_cast<size_t>(kind)].store(nth);
  }
  // True exactly once: on the nth call of `kind` since set().
  bool hits(ps_fault_kind kind) {
    auto& counter = left_[static_cast<size_t>(kind)];
    uint64_t left = counter.load();
    while (left != 0)
      if (counter.compare_exchange_weak(left, left - 1)) return left == 1;
    return false;
  }
  // Fails (PS_ERR_INJECTED_FAULT) when this call is the one to fail.
  void maybe_fail(ps_fault_kind kind, const std::string& what) {
    if (hits(kind)) fail(PS_ERR_INJECTED_FAULT, "injected fault: " + what);
  }

 private:
  std::array<std::atomic<uint64_t>, PS_FAULT_KIND_COUNT> left_{};
};

}  // namespace pinstage::backend
