// Plugin SDK: slots a device plugin writes the same way whatever its runtime (cuda, acl),
// as templates over the plugin's traits `P`, so each is written once. What `P` gives:
//   using P::Ctx = ps_device_ctx, with `device`, `config` (backend::PinConfig: its pieces),
//   `capacity`
//     (backend::CapacityLedger), `faults` (backend::FaultCountdowns), `mu` and `pin_stats`;
//   static int P::guarded(body)         the plugin's guarded() (slot.h);
//   static void P::require_ctx(ctx)     refuses a NULL context;
//   P::Scope                            made from a ctx, makes its device current for a slot
//     (cuda: SlotScope; acl: aclrtSetCurrentContext);
//   static void P::copy_body(ctx, dst, src, bytes, flags, stream, to_device, what)   its one
//     copy dispatch, arguments checked and scope entered (stream NULL: synchronous);
//   static void* P::device_alloc(ctx, bytes)   the vendor allocation, reserved in the ledger;
//   static std::unique_ptr<ps_stream> P::new_stream(ctx), and P::new_event(ctx);
//   static void P::sync_stream(ctx, s), P::record_event(ctx, e, s), P::sync_event(ctx, e);
//   static void P::pin(ctx, bytes, out)  fills out->ptr/handle with the vendor's own pinned
//     host memory (host_alloc_pinned: the runtime takes it only where host_register fails);
//   static void P::register_range(ctx, ptr, bytes, read_only), P::unregister_range(ctx, ptr,
//     bytes)   pins / unpins memory the runtime mapped (ABI v7), in the device's scope;
//   using P::PinStats, P::PinStatsFn; static constexpr const char* P::kPinStatsName   its
//     pin_stats extension (the struct, the documented function type, the name);
//   static void P::copy_d2d(ctx, dst, src, bytes, stream), P::fill(ctx, dst, value, bytes,
//     stream)   the device-side work (ABI v5), arguments checked (stream NULL: synchronous);
//   static std::unique_ptr<Ctx> P::open_context(device_id, options)   the context for a
//     device id >= 0 (create_context);
//   static constexpr const char* P::kName, and the slots each plugin writes itself, with
//     the ABI's signatures: P::last_error, destroy_context, device_free,
//     stream_destroy, event_destroy, host_free_pinned, device_count, device_props, and
//     optionally event_query.
// A plugin's table is device_api<P>(): `kApi = slots::device_api<CudaSlots>()`.
// PINSTAGE_DEVICE_SLOT_HOOKS declares those static hooks (all but the usings, kName and
// event_query) in a traits struct, so the interface is written here once; `guarded` and
// `require_ctx` forward to the plugin's own (its slot.h and its context check).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>

#include "pinstage/backend/capacity.h"
#include "pinstage/backend/pin_mode.h"
#include "pinstage/backend/platform_abi.h"
#include "pinstage/backend/slot.h"
#include "pinstage/log.h"

#define PINSTAGE_DEVICE_SLOT_HOOKS                                                             \
  template <class Body>                                                                        \
  static int guarded(Body&& body) noexcept {                                                   \
    return ::guarded(std::forward<Body>(body));                                                \
  }                                                                                            \
  static void require_ctx(ps_device_ctx* ctx) { ::require_ctx(ctx); }                          \
  static void copy_body(ps_device_ctx* ctx, void* dst, const void* src, size_t bytes,          \
                        uint32_t flags, ps_stream* stream, bool to_device, const char* what);  \
  static void* device_alloc(ps_device_ctx* ctx, size_t bytes);                                 \
  static std::unique_ptr<ps_stream> new_stream(ps_device_ctx* ctx);                            \
  static std::unique_ptr<ps_event> new_event(ps_device_ctx* ctx);                              \
  static void sync_stream(ps_device_ctx* ctx, ps_stream* stream);                              \
  static void record_event(ps_device_ctx* ctx, ps_event* event, ps_stream* stream);            \
  static void sync_event(ps_device_ctx* ctx, ps_event* event);                                 \
  static void pin(ps_device_ctx* ctx, size_t bytes, ps_allocation& out);                       \
  static void register_range(ps_device_ctx* ctx, void* ptr, size_t bytes, bool read_only);     \
  static void unregister_range(ps_device_ctx* ctx, void* ptr, size_t bytes);                   \
  static void copy_d2d(ps_device_ctx* ctx, void* dst, const void* src, size_t bytes,           \
                       ps_stream* stream);                                                     \
  static void fill(ps_device_ctx* ctx, void* dst, int value, size_t bytes, ps_stream* stream); \
  static std::unique_ptr<ps_device_ctx> open_context(int device_id,                            \
                                                     const ps_context_options* options);       \
  static const char* last_error();                                                             \
  static int destroy_context(ps_device_ctx* ctx);                                              \
  static int device_free(ps_device_ctx* ctx, const ps_allocation* allocation);                 \
  static int stream_destroy(ps_device_ctx* ctx, ps_stream* stream);                            \
  static int event_destroy(ps_device_ctx* ctx, ps_event* event);                               \
  static int host_free_pinned(ps_device_ctx* ctx, const ps_allocation* allocation);            \
  static int device_count(const ps_context_options* options, int* out);                        \
  static int device_props(int device_id, const ps_context_options* options, ps_device_props* out);

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

inline std::string dev_name(int device) { return "device " + std::to_string(device); }

// Sets the context's capacity when it is made: the device's free memory (what the vendor
// allocator can still give; the total would approve sizes it then refuses), or less when
// `requested` (plan_capacity, one rule for every plugin). Logs "<backend>: device N
// <describe()>T MiB (F free), capacity C MiB"; `describe` runs only then.
template <class Ctx, class Describe>
void set_capacity(Ctx* ctx, uint64_t requested, uint64_t free_bytes, uint64_t total_bytes,
                  const char* backend, Describe&& describe) {
  ctx->capacity.set_capacity(plan_capacity(requested, free_bytes));
  if (pinstage::log_level() > pinstage::LogLevel::info) return;
  pinstage::log(pinstage::LogLevel::info,
                std::string(backend) + ": " + dev_name(ctx->device) + " " + describe() +
                    std::to_string(total_bytes >> 20) + " MiB (" +
                    std::to_string(free_bytes >> 20) + " free), capacity " +
                    std::to_string(ctx->capacity.capacity() >> 20) + " MiB");
}

// device_malloc and host_alloc_pinned: `*out` holds no pointer unless `body` (run in the
// device's scope) gave one.
template <class P, class Body>
int allocation_slot(typename P::Ctx* ctx, size_t bytes, ps_allocation* out, const char* slot,
                    ps_fault_kind fault, Body&& body) {
  return P::guarded([&] {
    P::require_ctx(ctx);
    if (out == nullptr)
      fail(PS_ERR_INVALID_ARGUMENT, std::string(slot) + ": output pointer is NULL");
    *out = ps_allocation{nullptr, bytes, nullptr};
    if (bytes == 0) fail(PS_ERR_INVALID_ARGUMENT, std::string(slot) + ": cannot allocate 0 bytes");
    ctx->faults.maybe_fail(fault, slot);
    const typename P::Scope scope(ctx);
    body();
  });
}

// Reserves in the ledger before the vendor call, gives it back if that fails.
template <class P>
int device_malloc(typename P::Ctx* ctx, size_t bytes, ps_allocation* out) {
  return allocation_slot<P>(ctx, bytes, out, "device_malloc", PS_FAULT_DEVICE_MALLOC, [&] {
    ctx->capacity.reserve(
        bytes, "device_malloc of " + std::to_string(bytes) + " bytes on " + dev_name(ctx->device));
    try {
      out->ptr = P::device_alloc(ctx, bytes);
    } catch (...) {
      ctx->capacity.release(bytes);
      throw;
    }
  });
}

// The one copy dispatch's checks (a 0-byte copy does nothing) and fault hook.
template <class P>
int copy(typename P::Ctx* ctx, void* dst, const void* src, size_t bytes, uint32_t flags,
         ps_stream* stream, bool to_device) {
  const char* what = to_device ? "host-to-device copy" : "device-to-host copy";
  return P::guarded([&] {
    P::require_ctx(ctx);
    require(dst != nullptr && src != nullptr, to_device ? "host-to-device copy: a pointer is NULL"
                                                        : "device-to-host copy: a pointer is NULL");
    if (bytes == 0) return;
    ctx->faults.maybe_fail(to_device ? PS_FAULT_COPY_H2D : PS_FAULT_COPY_D2H, what);
    const typename P::Scope scope(ctx);
    P::copy_body(ctx, dst, src, bytes, flags, stream, to_device, what);
  });
}

template <class P>
int copy_h2d(typename P::Ctx* ctx, void* dst, const void* src, size_t bytes, uint32_t flags) {
  return copy<P>(ctx, dst, src, bytes, flags, nullptr, true);
}

template <class P>
int copy_d2h(typename P::Ctx* ctx, void* dst, const void* src, size_t bytes, uint32_t flags) {
  return copy<P>(ctx, dst, src, bytes, flags, nullptr, false);
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
  return copy<P>(ctx, dst, src, bytes, flags, stream, kToDevice);
}

// stream_create and event_create: `*out` is NULL unless `make` made the object.
template <class P, class Handle, class Make>
int create_handle(typename P::Ctx* ctx, Handle** out, const char* message, Make&& make) {
  return P::guarded([&] {
    P::require_ctx(ctx);
    require(out != nullptr, message);
    *out = nullptr;
    const typename P::Scope scope(ctx);
    *out = make().release();
  });
}

template <class P>
int stream_create(typename P::Ctx* ctx, ps_stream** out) {
  return create_handle<P>(ctx, out, "stream_create: output pointer is NULL",
                          [ctx] { return P::new_stream(ctx); });
}

template <class P>
int event_create(typename P::Ctx* ctx, ps_event** out) {
  return create_handle<P>(ctx, out, "event_create: output pointer is NULL",
                          [ctx] { return P::new_event(ctx); });
}

// A slot on a stream or an event of the context: `message` when `ok` is false (a NULL
// argument), else `body` in the device's scope.
template <class P, class Body>
int on_handle(typename P::Ctx* ctx, bool ok, const char* message, Body&& body) {
  return P::guarded([&] {
    P::require_ctx(ctx);
    require(ok, message);
    const typename P::Scope scope(ctx);
    body();
  });
}

template <class P>
int stream_sync(typename P::Ctx* ctx, ps_stream* stream) {
  return on_handle<P>(ctx, stream != nullptr, "stream_sync: stream is NULL",
                      [&] { P::sync_stream(ctx, stream); });
}

template <class P>
int event_record(typename P::Ctx* ctx, ps_event* event, ps_stream* stream) {
  return on_handle<P>(ctx, event != nullptr && stream != nullptr,
                      "event_record: event or stream is NULL",
                      [&] { P::record_event(ctx, event, stream); });
}

template <class P>
int event_sync(typename P::Ctx* ctx, ps_event* event) {
  return on_handle<P>(ctx, event != nullptr, "event_sync: event is NULL",
                      [&] { P::sync_event(ctx, event); });
}

template <class P>
int host_alloc_pinned(typename P::Ctx* ctx, size_t bytes, ps_allocation* out) {
  return allocation_slot<P>(ctx, bytes, out, "host_alloc_pinned", PS_FAULT_HOST_ALLOC,
                            [&] { P::pin(ctx, bytes, *out); });
}

// ABI v7 host_register: the range checks every backend makes, the host_alloc fault kind
// (pinning is one concern, whoever mapped the memory), then the vendor call.
template <class P>
int host_register(typename P::Ctx* ctx, void* ptr, size_t bytes, uint32_t flags) {
  return P::guarded([&] {
    P::require_ctx(ctx);
    require(ptr != nullptr && bytes > 0, "host_register: NULL pointer or 0 bytes");
    require((flags & ~(PS_REGISTER_READ_ONLY | PS_REGISTER_ON_FAULT)) == 0,
            "host_register: unknown flags");
    // A device runtime pins the pages there are (cudaHostRegister, aclrtHostRegister): the
    // runtime registers a fill once it is written.
    if ((flags & PS_REGISTER_ON_FAULT) != 0)
      fail(PS_ERR_UNSUPPORTED, "host_register: pinning pages as they fault in is not supported");
    ctx->faults.maybe_fail(PS_FAULT_HOST_ALLOC, "host_register");
    const typename P::Scope scope(ctx);
    P::register_range(ctx, ptr, bytes, (flags & PS_REGISTER_READ_ONLY) != 0);
  });
}

template <class P>
int host_unregister(typename P::Ctx* ctx, void* ptr, size_t bytes) {
  return P::guarded([&] {
    P::require_ctx(ctx);
    require(ptr != nullptr && bytes > 0, "host_unregister: NULL pointer or 0 bytes");
    ctx->faults.maybe_fail(PS_FAULT_HOST_FREE, "host_unregister");
    const typename P::Scope scope(ctx);
    P::unregister_range(ctx, ptr, bytes);
  });
}

// ABI v5 device-side work: the pointers checked; a 0-byte copy or fill does nothing.
template <class P>
int copy_d2d_async(typename P::Ctx* ctx, void* dst, const void* src, size_t bytes,
                   ps_stream* stream) {
  return P::guarded([&] {
    P::require_ctx(ctx);
    require(dst != nullptr && src != nullptr, "device-to-device copy: a pointer is NULL");
    if (bytes == 0) return;
    P::copy_d2d(ctx, dst, src, bytes, stream);
  });
}

template <class P>
int memset_async(typename P::Ctx* ctx, void* dst, int value, size_t bytes, ps_stream* stream) {
  return P::guarded([&] {
    P::require_ctx(ctx);
    require(dst != nullptr, "device fill: the pointer is NULL");
    if (bytes == 0) return;
    P::fill(ctx, dst, value, bytes, stream);
  });
}

// A plugin that only stages data: its pinned memory is page-locked, copies may be async,
// and it runs no host callables (device memory is not host memory).
template <class P>
int get_capabilities(typename P::Ctx* ctx, ps_capabilities* out) {
  return P::guarded([&] {
    P::require_ctx(ctx);
    require(out != nullptr, "get_capabilities: output pointer is NULL");
    *out = ps_capabilities{
        .pinned_is_page_locked = 1,
        .async_copy = 1,
        .execute = 0,
        .device_memory_is_host = 0,
    };
  });
}

// The one extension: P::kPinStatsName, with its documented signature P::PinStatsFn.
template <class P>
void* get_proc_address(const char* name) {
  if (name == nullptr || std::strcmp(name, P::kPinStatsName) != 0) return nullptr;
  const typename P::PinStatsFn fn = pin_stats<P, typename P::PinStats>;
  return reinterpret_cast<void*>(fn);
}

// create_context: the output pointer and the device id checked; `*out` is NULL unless
// P::open_context made the context.
template <class P>
int create_context(int device_id, const ps_context_options* options, typename P::Ctx** out) {
  return P::guarded([&] {
    require(out != nullptr, "create_context: output pointer is NULL");
    *out = nullptr;
    if (device_id < 0)
      fail(PS_ERR_INVALID_ARGUMENT, "device id must be >= 0, got " + std::to_string(device_id));
    *out = P::open_context(device_id, options).release();
  });
}

// An optional slot of the plugin's own: P::event_query where it has one, else NULL.
template <class P>
constexpr decltype(ps_platform_api::event_query) optional_event_query() {
  if constexpr (requires { P::event_query; })
    return P::event_query;
  else
    return nullptr;
}

// The plugin's table: the slots above, and the plugin's own (P::create_context ...).
// host_execute is NULL: a device plugin only stages data.
template <class P>
constexpr ps_platform_api device_api() {
  return {
      .api_version = PINSTAGE_PLATFORM_API_VERSION,
      .name = P::kName,
      .last_error = P::last_error,
      .get_proc_address = get_proc_address<P>,
      .create_context = create_context<P>,
      .destroy_context = P::destroy_context,
      .device_malloc = device_malloc<P>,
      .device_free = P::device_free,
      .copy_h2d = copy_h2d<P>,
      .copy_d2h = copy_d2h<P>,
      .stream_create = stream_create<P>,
      .stream_destroy = P::stream_destroy,
      .stream_sync = stream_sync<P>,
      .copy_h2d_async = copy_async<P, true>,
      .copy_d2h_async = copy_async<P, false>,
      .event_create = event_create<P>,
      .event_destroy = P::event_destroy,
      .event_record = event_record<P>,
      .event_sync = event_sync<P>,
      .host_alloc_pinned = host_alloc_pinned<P>,
      .host_free_pinned = P::host_free_pinned,
      .mem_info = mem_info<P>,
      .get_capabilities = get_capabilities<P>,
      .host_execute = nullptr,
      .inject_fault = inject_fault<P>,
      .event_query = optional_event_query<P>(),
      .copy_d2d_async = copy_d2d_async<P>,
      .memset_async = memset_async<P>,
      .device_count = P::device_count,
      .device_props = P::device_props,
      .host_register = host_register<P>,
      .host_unregister = host_unregister<P>,
  };
}

}  // namespace pinstage::backend::slots
