// Plugin SDK: slots a device plugin writes the same way whatever its runtime (cuda, acl),
// as templates over the plugin's traits `P`, so each is written once:
//   using P::Ctx = ps_device_ctx, with `mu` (a mutex guarding the fields below),
//     `capacity` (backend::CapacityLedger), `faults` (backend::FaultCountdowns) and `pin_stats`;
//   static int P::guarded(body)         the plugin's guarded() (slot.h);
//   static void P::require_ctx(ctx)     refuses a NULL context;
//   static int P::copy(ctx, dst, src, bytes, flags, stream, to_device)   its one copy
//     dispatch (stream NULL: synchronous);
//   static constexpr const char* P::kPinStatsName   its pin_stats extension's name.
// A plugin's table names them: `.mem_info = slots::mem_info<CudaSlots>`.
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>

#include "pinstage/backend/platform_abi.h"
#include "pinstage/backend/slot.h"

namespace pinstage::backend::slots {

template <class P>
int mem_info(typename P::Ctx* ctx, uint64_t* capacity, uint64_t* committed) {
  return P::guarded([&] {
    P::require_ctx(ctx);
    require(capacity != nullptr && committed != nullptr, "mem_info: an output pointer is NULL");
    std::lock_guard lock(ctx->mu);
    *capacity = ctx->capacity.capacity();
    *committed = ctx->capacity.committed();
  });
}

template <class P>
int inject_fault(typename P::Ctx* ctx, int kind, uint64_t nth) {
  return P::guarded([&] {
    P::require_ctx(ctx);
    ctx->faults.set(kind, nth);
  });
}

// The pinning statistics extension (get_proc_address(P::kPinStatsName)).
template <class P, class Stats>
int pin_stats(typename P::Ctx* ctx, Stats* out) {
  return P::guarded([&] {
    P::require_ctx(ctx);
    if (out == nullptr)
      fail(PS_ERR_INVALID_ARGUMENT, std::string(P::kPinStatsName) + ": output pointer is NULL");
    std::lock_guard lock(ctx->mu);
    *out = ctx->pin_stats;
  });
}

template <class P>
int copy_h2d(typename P::Ctx* ctx, void* dst, const void* src, size_t bytes, uint32_t flags) {
  return P::copy(ctx, dst, src, bytes, flags, nullptr, true);
}

template <class P>
int copy_d2h(typename P::Ctx* ctx, void* dst, const void* src, size_t bytes, uint32_t flags) {
  return P::copy(ctx, dst, src, bytes, flags, nullptr, false);
}

// The async copies need their stream: a NULL one is refused, never taken as synchronous.
template <class P, bool kToDevice>
int copy_async(typename P::Ctx* ctx, void* dst, const void* src, size_t bytes, uint32_t flags,
               ps_stream* stream) {
  if (stream == nullptr)
    return P::guarded([] {
      fail(PS_ERR_INVALID_ARGUMENT, kToDevice ? "host-to-device async copy: stream is NULL"
                                              : "device-to-host async copy: stream is NULL");
    });
  return P::copy(ctx, dst, src, bytes, flags, stream, kToDevice);
}

}  // namespace pinstage::backend::slots
