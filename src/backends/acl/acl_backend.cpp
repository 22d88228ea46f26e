// The acl platform backend: the platform ABI (pinstage/backend/platform_abi.h) on the
// Ascend runtime (libascendcl), loaded with dlopen (acl_runtime.h), so it builds and loads
// with no CANN present. See docs/acl.md.
//
// Note [Process, device, context]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// aclInit runs once per process: the plugin counts the contexts alive and calls
// aclFinalize when the last one goes, but only when its own aclInit initialised ACL. An
// ACL_ERROR_REPEAT_INITIALIZE from a runtime someone else initialised (torch_npu) means
// that runtime owns ACL: finalizing it would pull ACL from beneath it, so the plugin
// leaves aclFinalize to it. Each context opens its device with aclrtSetDevice and
// makes its own aclrtContext; that context is made current on the calling thread at the
// start of every slot, since the binder's copy threads and Python threads call in and the
// runtime's current context is per thread.
//
// Note [Devices without a context]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// device_count and device_props (ABI v6) need the runtime loaded and initialised, so they
// count as a context while they run (aclInit when none is alive) but never call
// aclFinalize: the facts say to call it once, at the very end, and a worker made right
// after a listing (pinstage info does that) would otherwise initialise the runtime again.
// The last worker's teardown finalizes as before; a process that only lists leaves it
// to the exit. The facts give no way to read a device's memory without opening it, so
// device_props opens it for the call (aclrtSetDevice, aclrtGetMemInfo(ACL_HBM_MEM),
// aclrtResetDevice: reference-counted, so a worker's device stays open); a device that
// will not open is listed, not usable, with the runtime's reason. The calling thread is
// left with that device's default context current, or none (each slot sets its own
// first anyway). The facts map no device id to a PCI address (ASCEND_RT_VISIBLE_DEVICES
// renumbers them), so the PCI id is "" and the NUMA node -1; the name is "Ascend device N".
//
// Note [Teardown order]
// ~~~~~~~~~~~~~~~~~~~~~
// The runtime destroys streams and events, frees device memory, then pinned host memory,
// then calls destroy_context (platform_abi.h). destroy_context then destroys the context
// and resets the device. A pinned block kept past aclrtResetDevice once hung the next
// process on the card, so a release that failed is not forgotten: the slot keeps the object
// on the context's retry list (Note [Releases that failed]) and destroy_context retries it,
// in the same order, before the context and the device go. Each later step runs even when
// an earlier one failed.
//
// Note [Releases that failed]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The backend keeps no table of its allocations (the runtime does). The one exception is
// this retry list: objects whose release call failed, so still held by the runtime of the
// card. The runtime may hand such an object back again (Worker::free keeps a failed one for
// finalize); each release call first takes the object off the list and puts it back only
// if it fails again, so nothing is released twice.
//
// Note [Pinned ranges]
// ~~~~~~~~~~~~~~~~~~~~
// aclrtMemcpyAsync needs page-locked host memory; pageable memory takes aclrtMemcpy. Since
// ABI v4 the runtime says which kind a copy gets (PS_COPY_HOST_PINNED, from its one table
// of pinned ranges), so the plugin keeps no list: an unflagged host side goes through a
// stream sync plus aclrtMemcpy, which keeps stream order.
//
// destMax is always `bytes`: the runtime has checked that the device side lies inside one
// allocation, and the ABI passes no room beyond that, so `bytes` is the room the plugin
// knows to be real. The test double refuses a destMax larger than the real room.
#include <algorithm>
#include <array>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "backends/acl/acl_runtime.h"
#include "pinstage/backend/acl_ext.h"
#include "pinstage/backend/capacity.h"
#include "pinstage/backend/device_slots.h"
#include "pinstage/backend/faults.h"
#include "pinstage/backend/pin_mode.h"
#include "pinstage/backend/platform_abi.h"
#include "pinstage/backend/slot.h"
#include "pinstage/clock.h"
#include "pinstage/error.h"
#include "pinstage/log.h"
#include "pinstage/pages.h"

using pinstage::acl::aclError;
using pinstage::acl::Runtime;
using pinstage::backend::PinConfig;  // the pinning keys (pin_mode.h)

struct ps_stream {
  pinstage::acl::aclrtStream stream = nullptr;
};

struct ps_event {
  pinstage::acl::aclrtEvent event = nullptr;
};

namespace {

// One release that failed (Note [Releases that failed]).
enum class Retry { stream, event, device, registered, host };
struct RetryItem {
  Retry kind;
  ps_allocation a;  // ptr is the ps_stream*/ps_event* for queues
};

}  // namespace

struct ps_device_ctx {
  int device = 0;
  PinConfig config;
  pinstage::backend::CapacityLedger capacity;  // device memory (backend/capacity.h)
  pinstage::acl::aclrtContext context = nullptr;

  std::mutex mu;                              // guards everything below
  pinstage::backend::FaultCountdowns faults;  // the fault hook (backend/faults.h)
  ps_acl_pin_stats pin_stats{};
  std::vector<RetryItem> retry;
};

namespace {

using pinstage::backend::fail;
using pinstage::backend::require;
namespace slots = pinstage::backend::slots;
namespace acl = pinstage::acl;

thread_local pinstage::backend::LastError t_last_error;

template <class Body>
int guarded(Body&& body) noexcept {
  return pinstage::backend::guarded(t_last_error, "acl", std::forward<Body>(body));
}

// ---- process-wide state (Note [Process, device, context], Note [Pinned ranges]) ----

struct Process {
  std::mutex mu;
  std::unique_ptr<Runtime> rt;  // loaded once, never unloaded
  int contexts = 0;             // alive; aclFinalize when it drops to 0
  bool ours = false;            // our aclInit initialised ACL (not another runtime's)
};

Process& process() {
  static Process* p = new Process();  // never destroyed: slots may run at exit
  return *p;
}

const Runtime& runtime() { return *process().rt; }

std::string dev_name(const ps_device_ctx* ctx) { return "device " + std::to_string(ctx->device); }

// Fails with the call's name, code, code name and aclGetRecentErrMsg unless `code` is 0.
template <class What>
void check(aclError code, What&& what, ps_status fallback = PS_ERR_BACKEND) {
  if (code == acl::ACL_SUCCESS) return;
  std::string call;
  if constexpr (std::is_invocable_v<What>)
    call = what();
  else
    call = what;
  fail(acl::status_from_acl(code, fallback), "acl: " + acl::call_error(runtime(), call, code));
}

ps_device_ctx* require_ctx(ps_device_ctx* ctx) {
  require(ctx != nullptr, "device context is NULL");
  return ctx;
}

// Note [Process, device, context]: every slot that calls the runtime starts here.
void use_ctx(const ps_device_ctx* ctx) {
  check(runtime().aclrtSetCurrentContext(ctx->context),
        [ctx] { return "aclrtSetCurrentContext for " + dev_name(ctx); });
}

bool fault_hits(ps_device_ctx* ctx, ps_fault_kind kind) { return ctx->faults.hits(kind); }

void maybe_fault(ps_device_ctx* ctx, ps_fault_kind kind, const char* what) {
  ctx->faults.maybe_fail(kind, what);
}

// Note [Process, device, context]: the scope of a slot that calls the runtime.
struct CtxScope {
  explicit CtxScope(const ps_device_ctx* ctx) { use_ctx(ctx); }
};

// What the shared slot bodies (pinstage/backend/device_slots.h) need of this plugin.
struct AclSlots {
  using Ctx = ps_device_ctx;
  using Scope = CtxScope;
  using PinStats = ps_acl_pin_stats;
  using PinStatsFn = ps_acl_pin_stats_fn;  // the documented signature
  static constexpr const char* kPinStatsName = PS_ACL_PIN_STATS_NAME;
  static constexpr const char* kName = "acl";
  PINSTAGE_DEVICE_SLOT_HOOKS  // the hooks, declared once; defined below
};

// ---- retry list (Note [Releases that failed]) ----

// Takes `ptr` off the retry list (the runtime hands it back now).
void unlist(ps_device_ctx* ctx, const void* ptr) {
  std::lock_guard lock(ctx->mu);
  std::erase_if(ctx->retry, [ptr](const RetryItem& r) { return r.a.ptr == ptr; });
}

void relist(ps_device_ctx* ctx, Retry kind, const ps_allocation& a) noexcept {
  try {
    std::lock_guard lock(ctx->mu);
    ctx->retry.push_back(RetryItem{kind, a});
  } catch (...) {  // no memory to remember it: the release error is still reported
  }
}

// Runs a release body; on failure the object goes on the retry list.
template <class Body>
int release(ps_device_ctx* ctx, Retry kind, const ps_allocation& a, Body&& body) {
  unlist(ctx, a.ptr);
  const int status = guarded(std::forward<Body>(body));
  if (status != PS_OK) relist(ctx, kind, a);
  return status;
}

// ---- process init and context set-up ----

// Loads the runtime if needed and counts one more context; aclInit for the first.
void acquire_process() {
  Process& p = process();
  std::lock_guard lock(p.mu);
  if (!p.rt) {
    // Error(no_device) naming every candidate; guarded() keeps its code.
    p.rt = acl::load_runtime(acl::search_inputs_from_environment());
    pinstage::log(pinstage::LogLevel::info,
                  "acl: loaded " + p.rt->path + " (from " + p.rt->origin + ")");
  }
  if (p.contexts == 0) {
    const aclError code = p.rt->aclInit(nullptr);
    if (code != acl::ACL_SUCCESS && code != acl::ACL_ERROR_REPEAT_INITIALIZE)
      fail(acl::status_from_acl(code, PS_ERR_NO_DEVICE),
           "acl: " + acl::call_error(*p.rt, "aclInit", code));
    // A repeat keeps `ours` as it was: a listing of ours may have initialised it.
    if (code == acl::ACL_SUCCESS) p.ours = true;
    if (!p.ours)
      pinstage::log(pinstage::LogLevel::info,
                    "acl: ACL was initialised by another runtime in this process; its "
                    "aclFinalize is left to that runtime");
  }
  ++p.contexts;
}

// Note [Devices without a context]: the runtime loaded and initialised for one listing
// call; never finalizes.
class Listing {
 public:
  Listing() { acquire_process(); }
  Listing(const Listing&) = delete;
  Listing& operator=(const Listing&) = delete;
  ~Listing() {
    Process& p = process();
    std::lock_guard lock(p.mu);
    --p.contexts;
  }
};

// One context fewer; aclFinalize after the last. Returns the error text, or empty.
std::string release_process() noexcept {
  Process& p = process();
  std::lock_guard lock(p.mu);
  if (p.contexts == 0 || --p.contexts > 0 || !p.ours) return {};
  p.ours = false;
  const aclError code = p.rt->aclFinalize();
  return code == acl::ACL_SUCCESS ? std::string() : acl::call_error(*p.rt, "aclFinalize", code);
}

// The backend's keys (pin_mode.h), checked before the runtime is looked for: a typo
// fails the same everywhere. The defaults without options.
PinConfig parse_config(const ps_context_options* options, const char* slot) {
  if (options == nullptr) return PinConfig{};
  if (options->config == nullptr && options->config_count != 0)
    fail(PS_ERR_INVALID_ARGUMENT, std::string(slot) + ": config is NULL but config_count is not 0");
  return pinstage::backend::parse_pin_config({options->config, options->config_count});
}

void require_device(int device_id) {
  if (device_id < 0)
    fail(PS_ERR_NO_DEVICE, "acl: device id must be >= 0, got " + std::to_string(device_id));
  uint32_t count = 0;
  check(runtime().aclrtGetDeviceCount(&count), "aclrtGetDeviceCount", PS_ERR_NO_DEVICE);
  if (count == 0) fail(PS_ERR_NO_DEVICE, "acl: aclrtGetDeviceCount found no Ascend device");
  if (static_cast<uint32_t>(device_id) >= count)
    fail(PS_ERR_NO_DEVICE, "acl: Ascend device " + std::to_string(device_id) + " does not exist: " +
                               std::to_string(count) + " device(s) visible (ids 0.." +
                               std::to_string(count - 1) + "; see ASCEND_RT_VISIBLE_DEVICES)");
}

// Opens the device, makes the context and reads the memory size. `ctx` may be half made
// when this throws: teardown() undoes what is there.
void open_device(ps_device_ctx* ctx, uint64_t requested, bool& device_set) {
  const Runtime& rt = runtime();
  const std::string dev = std::to_string(ctx->device);
  check(rt.aclrtSetDevice(ctx->device), "aclrtSetDevice(" + dev + ")", PS_ERR_NO_DEVICE);
  device_set = true;
  check(rt.aclrtCreateContext(&ctx->context, ctx->device), "aclrtCreateContext(" + dev + ")");
  use_ctx(ctx);
  size_t free_bytes = 0, total_bytes = 0;
  check(rt.aclrtGetMemInfo(acl::ACL_HBM_MEM, &free_bytes, &total_bytes),
        "aclrtGetMemInfo(ACL_HBM_MEM) on device " + dev);
  slots::set_capacity(ctx, requested, free_bytes, total_bytes, "acl", [] { return "has "; });
}

// ---- releases, shared by the slots and the retry at teardown ----

void destroy_stream(const ps_device_ctx* ctx, ps_stream* s) {
  const Runtime& rt = runtime();
  // The ABI promises queued copies are done when this returns (their buffers go next).
  // A failed sync still destroys the stream (which ends its work), so the memory its
  // copies use can go next; the sync's error is logged.
  const aclError synced = rt.aclrtSynchronizeStream(s->stream);
  const std::string sync_error =
      synced == acl::ACL_SUCCESS
          ? std::string()
          : acl::call_error(rt,
                            "aclrtSynchronizeStream before destroying a stream on " + dev_name(ctx),
                            synced);
  check(rt.aclrtDestroyStream(s->stream),
        "aclrtDestroyStream on " + dev_name(ctx) +
            (sync_error.empty() ? "" : " (after " + sync_error + ")"));
  delete s;
  if (!sync_error.empty()) pinstage::log(pinstage::LogLevel::error, "acl: " + sync_error);
}

void destroy_event(const ps_device_ctx* ctx, ps_event* e) {
  check(runtime().aclrtDestroyEvent(e->event), "aclrtDestroyEvent on " + dev_name(ctx));
  delete e;
}

void free_device(ps_device_ctx* ctx, const ps_allocation& a) {
  // On failure the memory may still be held: it stays committed.
  check(runtime().aclrtFree(a.ptr),
        [&] { return "aclrtFree of " + std::to_string(a.bytes) + " bytes on " + dev_name(ctx); });
  ctx->capacity.release(a.bytes);
}

// The runtime's memory, registered by host_register (the runtime unmaps it itself).
void unregister_host(const ps_device_ctx* ctx, const ps_allocation& a) {
  check(runtime().aclrtHostUnregister(a.ptr), [&] {
    return "aclrtHostUnregister of a " + std::to_string(a.bytes) + " byte registered range on " +
           dev_name(ctx);
  });
}

// The vendor source's memory (aclrtMallocHost).
void free_host(const ps_device_ctx* ctx, const ps_allocation& a) {
  check(runtime().aclrtFreeHost(a.ptr), [&] {
    return "aclrtFreeHost of a " + std::to_string(a.bytes) + " byte pinned buffer on " +
           dev_name(ctx);
  });
}

void release_item(ps_device_ctx* ctx, const RetryItem& item) {
  switch (item.kind) {
    case Retry::stream:
      return destroy_stream(ctx, static_cast<ps_stream*>(item.a.ptr));
    case Retry::event:
      return destroy_event(ctx, static_cast<ps_event*>(item.a.ptr));
    case Retry::device:
      return free_device(ctx, item.a);
    case Retry::registered:
      return unregister_host(ctx, item.a);
    case Retry::host:
      return free_host(ctx, item.a);
  }
}

// Runs one teardown step; its error text joins `errors` and the next step still runs.
template <class Step>
void step(std::string& errors, Step&& body) noexcept {
  const int status = guarded(std::forward<Step>(body));
  if (status != PS_OK) errors.append(errors.empty() ? "" : "; ").append(t_last_error.c_str());
}

// Runs a teardown call; a failure is logged and the call made once more.
template <class Call>
void try_twice(const std::string& what, Call&& call) {
  const aclError first = call();
  if (first == acl::ACL_SUCCESS) return;
  pinstage::log(pinstage::LogLevel::warn,
                "acl: " + acl::call_error(runtime(), what, first) + "; trying once more");
  check(call(), what + " (second try)");
}

// Note [Teardown order]: retries, then the context, then the device, then the process.
// Each of the last calls is tried twice: one transient failure must not leave the card
// held. Returns the errors that remained, joined ("" when none).
std::string teardown(ps_device_ctx* ctx, bool device_set) noexcept {
  std::string errors;
  const Runtime& rt = runtime();
  if (ctx->context != nullptr) {
    step(errors, [&] { use_ctx(ctx); });
    for (Retry kind :
         {Retry::stream, Retry::event, Retry::device, Retry::registered, Retry::host}) {
      std::vector<RetryItem> items;
      for (const RetryItem& r : ctx->retry)
        if (r.kind == kind) items.push_back(r);
      for (const RetryItem& r : items) step(errors, [&] { release_item(ctx, r); });
    }
    step(errors, [&] {
      try_twice("aclrtDestroyContext on " + dev_name(ctx),
                [&] { return rt.aclrtDestroyContext(ctx->context); });
    });
  }
  if (device_set)
    step(errors, [&] {
      try_twice("aclrtResetDevice(" + std::to_string(ctx->device) + ")",
                [&] { return rt.aclrtResetDevice(ctx->device); });
    });
  const std::string finalize = release_process();
  if (!finalize.empty()) errors += (errors.empty() ? "" : "; ") + finalize;
  return errors;
}

// ---- slots ----

const char* AclSlots::last_error() { return t_last_error.c_str(); }

std::unique_ptr<ps_device_ctx> AclSlots::open_context(int device_id,
                                                      const ps_context_options* options) {
  auto ctx = std::make_unique<ps_device_ctx>();
  ctx->device = device_id;
  ctx->config = parse_config(options, "create_context");
  acquire_process();
  bool device_set = false;
  try {
    require_device(device_id);
    open_device(ctx.get(), options != nullptr ? options->device_capacity_bytes : 0, device_set);
  } catch (...) {
    const std::string left = teardown(ctx.get(), device_set);
    if (!left.empty())
      pinstage::log(pinstage::LogLevel::error,
                    "acl: undoing a failed "
                    "create_context: " +
                        left);
    throw;
  }
  return ctx;
}

// ---- topology (ABI v6, Note [Devices without a context]) ----

template <size_t N>
void put_text(char (&field)[N], const std::string& text) {
  std::snprintf(field, N, "%s", text.c_str());
}

// Fills `out` for an existing device: its memory from the device opened for the call.
void describe_device(int id, ps_device_props& out) {
  const Runtime& rt = runtime();
  const std::string dev = std::to_string(id);
  put_text(out.name, "Ascend device " + dev);
  const aclError set = rt.aclrtSetDevice(id);
  if (set != acl::ACL_SUCCESS) {
    put_text(out.reason, "acl: " + acl::call_error(rt, "aclrtSetDevice(" + dev + ")", set));
    return;
  }
  size_t free_bytes = 0, total_bytes = 0;
  const aclError mem = rt.aclrtGetMemInfo(acl::ACL_HBM_MEM, &free_bytes, &total_bytes);
  std::string why;
  if (mem != acl::ACL_SUCCESS)
    why = acl::call_error(rt, "aclrtGetMemInfo(ACL_HBM_MEM) on device " + dev, mem);
  const aclError reset = rt.aclrtResetDevice(id);
  if (reset != acl::ACL_SUCCESS && why.empty())
    why = acl::call_error(rt, "aclrtResetDevice(" + dev + ")", reset);
  if (mem == acl::ACL_SUCCESS) out.memory_bytes = total_bytes;
  out.usable = why.empty() ? 1 : 0;
  if (!why.empty()) put_text(out.reason, "acl: " + why);
}

int AclSlots::device_count(const ps_context_options* options, int* out) {
  return guarded([&] {
    require(out != nullptr, "device_count: output pointer is NULL");
    *out = 0;
    parse_config(options, "device_count");
    const Listing listing;
    uint32_t count = 0;
    check(runtime().aclrtGetDeviceCount(&count), "aclrtGetDeviceCount", PS_ERR_NO_DEVICE);
    *out = static_cast<int>(std::min<uint32_t>(count, 1 << 20));
  });
}

int AclSlots::device_props(int device_id, const ps_context_options* options, ps_device_props* out) {
  return guarded([&] {
    require(out != nullptr, "device_props: output pointer is NULL");
    *out = ps_device_props{};
    out->numa_node = -1;
    parse_config(options, "device_props");
    const Listing listing;
    require_device(device_id);
    describe_device(device_id, *out);
  });
}

int AclSlots::destroy_context(ps_device_ctx* ctx) {
  return guarded([&] {
    require_ctx(ctx);
    std::unique_ptr<ps_device_ctx> owned(ctx);
    const std::string errors = teardown(ctx, true);
    if (!errors.empty())
      fail(PS_ERR_BACKEND, "destroying the acl context of " + dev_name(ctx) + ": " + errors);
  });
}

// The ledger has reserved `bytes` (slots::device_malloc).
void* AclSlots::device_alloc(ps_device_ctx* ctx, size_t bytes) {
  void* ptr = nullptr;
  check(runtime().aclrtMalloc(&ptr, bytes, acl::ACL_MEM_MALLOC_HUGE_FIRST), [&] {
    return "aclrtMalloc(" + std::to_string(bytes) + " bytes, ACL_MEM_MALLOC_HUGE_FIRST) on " +
           dev_name(ctx);
  });
  return ptr;
}

int AclSlots::device_free(ps_device_ctx* ctx, const ps_allocation* allocation) {
  if (ctx == nullptr || allocation == nullptr || allocation->ptr == nullptr)
    return guarded([] { require(false, "device_free: context, allocation or pointer is NULL"); });
  return release(ctx, Retry::device, *allocation, [&] {
    maybe_fault(ctx, PS_FAULT_DEVICE_FREE, "device_free");
    use_ctx(ctx);
    free_device(ctx, *allocation);
  });
}

// The corrupt_h2d fault: flip one bit of the upload's middle byte once it has landed.
void corrupt_middle_byte(const ps_device_ctx* ctx, void* dst, size_t bytes) {
  const Runtime& rt = runtime();
  unsigned char byte = 0;
  auto* where = static_cast<unsigned char*>(dst) + bytes / 2;
  check(rt.aclrtMemcpy(&byte, 1, where, 1, acl::ACL_MEMCPY_DEVICE_TO_HOST),
        "aclrtMemcpy (corrupt_h2d fault read) on " + dev_name(ctx));
  byte ^= 0x40;
  check(rt.aclrtMemcpy(where, 1, &byte, 1, acl::ACL_MEMCPY_HOST_TO_DEVICE),
        "aclrtMemcpy (corrupt_h2d fault write) on " + dev_name(ctx));
}

// One copy: synchronous (aclrtMemcpy) when `stream` is null, else aclrtMemcpyAsync when
// the host side is pinned (Note [Pinned ranges]: the runtime's PS_COPY_HOST_PINNED flag).
// destMax is `bytes` (see the top).
void AclSlots::copy_body(ps_device_ctx* ctx, void* dst, const void* src, size_t bytes,
                         uint32_t flags, ps_stream* stream, bool to_device, const char* what) {
  const Runtime& rt = runtime();
  const auto kind = to_device ? acl::ACL_MEMCPY_HOST_TO_DEVICE : acl::ACL_MEMCPY_DEVICE_TO_HOST;
  auto desc = [&](const char* call) {
    return std::string(call) + " (" + what + " of " + std::to_string(bytes) + " bytes on " +
           dev_name(ctx) + ")";
  };
  if (stream != nullptr && (flags & PS_COPY_HOST_PINNED) != 0) {
    check(
        rt.aclrtMemcpyAsync(dst, bytes, src, bytes, kind, stream->stream),
        [&] { return desc("aclrtMemcpyAsync"); }, PS_ERR_COPY_FAILED);
  } else {
    if (stream != nullptr)  // pageable: keep the stream's order, then copy synchronously
      check(
          rt.aclrtSynchronizeStream(stream->stream),
          [&] { return desc("aclrtSynchronizeStream before aclrtMemcpy"); }, PS_ERR_COPY_FAILED);
    check(
        rt.aclrtMemcpy(dst, bytes, src, bytes, kind), [&] { return desc("aclrtMemcpy"); },
        PS_ERR_COPY_FAILED);
  }
  if (to_device && fault_hits(ctx, PS_FAULT_CORRUPT_H2D)) {
    if (stream != nullptr)
      check(rt.aclrtSynchronizeStream(stream->stream), desc("aclrtSynchronizeStream"));
    corrupt_middle_byte(ctx, dst, bytes);
  }
}

// Device-side work (ABI v5). A copy is aclrtMemcpyAsync(ACL_MEMCPY_DEVICE_TO_DEVICE) on
// `stream`, or aclrtMemcpy without one. A fill is aclrtMemsetAsync; without a stream it
// runs on a stream made for it and synchronized (the facts name no synchronous memset).
// destMax/maxCount are `bytes`, as for the copies above (see the top).
void AclSlots::copy_d2d(ps_device_ctx* ctx, void* dst, const void* src, size_t bytes,
                        ps_stream* stream) {
  use_ctx(ctx);
  const Runtime& rt = runtime();
  auto desc = [&](const char* call) {
    return std::string(call) + " (device-to-device copy of " + std::to_string(bytes) +
           " bytes on " + dev_name(ctx) + ")";
  };
  const auto kind = acl::ACL_MEMCPY_DEVICE_TO_DEVICE;
  if (stream != nullptr)
    check(
        rt.aclrtMemcpyAsync(dst, bytes, src, bytes, kind, stream->stream),
        [&] { return desc("aclrtMemcpyAsync"); }, PS_ERR_COPY_FAILED);
  else
    check(
        rt.aclrtMemcpy(dst, bytes, src, bytes, kind), [&] { return desc("aclrtMemcpy"); },
        PS_ERR_COPY_FAILED);
}

void AclSlots::fill(ps_device_ctx* ctx, void* dst, int value, size_t bytes, ps_stream* stream) {
  const Runtime& rt = runtime();
  if (rt.aclrtMemsetAsync == nullptr)
    fail(PS_ERR_UNSUPPORTED,
         "device fill: this Ascend runtime (" + rt.path + ") has no aclrtMemsetAsync");
  use_ctx(ctx);
  auto desc = [&](const char* call) {
    return std::string(call) + " (device fill of " + std::to_string(bytes) + " bytes on " +
           dev_name(ctx) + ")";
  };
  if (stream != nullptr) {
    check(
        rt.aclrtMemsetAsync(dst, bytes, value, bytes, stream->stream),
        [&] { return desc("aclrtMemsetAsync"); }, PS_ERR_COPY_FAILED);
    return;
  }
  acl::aclrtStream own = nullptr;
  check(rt.aclrtCreateStream(&own), [&] { return desc("aclrtCreateStream"); });
  acl::aclError err = rt.aclrtMemsetAsync(dst, bytes, value, bytes, own);
  const char* call = "aclrtMemsetAsync";
  if (err == acl::ACL_SUCCESS) {
    err = rt.aclrtSynchronizeStream(own);
    call = "aclrtSynchronizeStream";
  }
  const acl::aclError destroyed = rt.aclrtDestroyStream(own);  // even after a failure
  check(
      err, [&] { return desc(call); }, PS_ERR_COPY_FAILED);
  check(destroyed, [&] { return desc("aclrtDestroyStream"); });
}

std::unique_ptr<ps_stream> AclSlots::new_stream(ps_device_ctx* ctx) {
  auto s = std::make_unique<ps_stream>();
  check(runtime().aclrtCreateStream(&s->stream), "aclrtCreateStream on " + dev_name(ctx));
  return s;
}

// stream_destroy and event_destroy: `destroy` in the context, through release() (a
// failed one goes on the retry list).
template <class Handle>
int destroy_handle(ps_device_ctx* ctx, Handle* handle, Retry kind, const char* message,
                   void (*destroy)(const ps_device_ctx*, Handle*)) {
  if (ctx == nullptr || handle == nullptr) return guarded([message] { require(false, message); });
  return release(ctx, kind, ps_allocation{handle, 0, nullptr}, [&] {
    use_ctx(ctx);
    destroy(ctx, handle);
  });
}

int AclSlots::stream_destroy(ps_device_ctx* ctx, ps_stream* stream) {
  return destroy_handle(ctx, stream, Retry::stream, "stream_destroy: context or stream is NULL",
                        destroy_stream);
}

void AclSlots::sync_stream(ps_device_ctx* ctx, ps_stream* stream) {
  check(
      runtime().aclrtSynchronizeStream(stream->stream),
      [ctx] { return "aclrtSynchronizeStream on " + dev_name(ctx); }, PS_ERR_COPY_FAILED);
}

std::unique_ptr<ps_event> AclSlots::new_event(ps_device_ctx* ctx) {
  auto e = std::make_unique<ps_event>();
  check(runtime().aclrtCreateEvent(&e->event), "aclrtCreateEvent on " + dev_name(ctx));
  return e;
}

int AclSlots::event_destroy(ps_device_ctx* ctx, ps_event* event) {
  return destroy_handle(ctx, event, Retry::event, "event_destroy: context or event is NULL",
                        destroy_event);
}

void AclSlots::record_event(ps_device_ctx* ctx, ps_event* event, ps_stream* stream) {
  check(runtime().aclrtRecordEvent(event->event, stream->stream),
        [ctx] { return "aclrtRecordEvent on " + dev_name(ctx); });
}

void AclSlots::sync_event(ps_device_ctx* ctx, ps_event* event) {
  check(
      runtime().aclrtSynchronizeEvent(event->event),
      [ctx] { return "aclrtSynchronizeEvent on " + dev_name(ctx); }, PS_ERR_COPY_FAILED);
}

// ---- pinned host memory ----

void count_pinning(ps_device_ctx* ctx, ps_acl_pin_mode mode, size_t bytes, double seconds) {
  std::lock_guard lock(ctx->mu);
  ps_acl_pin_stats& s = ctx->pin_stats;
  if (mode == PS_ACL_PIN_REGISTER) {
    ++s.register_count;
    s.register_bytes += bytes;
  } else {
    ++s.malloc_host_count;
    s.malloc_host_bytes += bytes;
  }
  s.last_mode = mode;
  s.last_seconds = seconds;
}

// ABI v7: the runtime's memory registered in place, whole: a copy must lie inside one
// registration (the runtime's rule, which the double enforces), so the runtime registers a
// segment or a file mapping as one range, never in chunks. aclrtHostRegister has no
// read-only flag (the facts list type 0, mapped, only): a read-only range goes to it as it
// is. ACL_ERROR_RT_FEATURE_NOT_SUPPORT is PS_ERR_UNSUPPORTED: the runtime then takes
// aclrtMallocHost (anonymous memory) or a private copy (a file), and says so.
void AclSlots::register_range(ps_device_ctx* ctx, void* ptr, size_t bytes, bool /*read_only*/) {
  const pinstage::Stopwatch watch;
  void* dev_ptr = nullptr;
  const aclError code = runtime().aclrtHostRegister(ptr, bytes, 0, &dev_ptr);
  if (code == acl::ACL_SUCCESS) {
    count_pinning(ctx, PS_ACL_PIN_REGISTER, bytes, watch.seconds());
    return;
  }
  if (code == acl::ACL_ERROR_RT_FEATURE_NOT_SUPPORT) {
    std::lock_guard lock(ctx->mu);
    ++ctx->pin_stats.unsupported_count;
  }
  fail(code == acl::ACL_ERROR_RT_FEATURE_NOT_SUPPORT ? PS_ERR_UNSUPPORTED
                                                     : acl::status_from_acl(code, PS_ERR_BACKEND),
       "acl: " + acl::call_error(runtime(),
                                 "aclrtHostRegister of " + std::to_string(bytes) + " bytes for " +
                                     dev_name(ctx),
                                 code));
}

// A failed unregister stays on the retry list (Note [Releases that failed]): a registration
// must not outlive the device (Note [Teardown order]).
void AclSlots::unregister_range(ps_device_ctx* ctx, void* ptr, size_t bytes) {
  const ps_allocation a{ptr, bytes, nullptr};
  unlist(ctx, ptr);
  try {
    unregister_host(ctx, a);
  } catch (...) {
    relist(ctx, Retry::registered, a);
    throw;
  }
}

// The vendor source (where the runtime cannot pin its own memory): aclrtMallocHost.
void AclSlots::pin(ps_device_ctx* ctx, size_t bytes, ps_allocation& out) {
  const pinstage::Stopwatch watch;
  check(runtime().aclrtMallocHost(&out.ptr, bytes), [&] {
    return "aclrtMallocHost of " + std::to_string(bytes) + " bytes for " + dev_name(ctx) +
           " (in a container, raise RLIMIT_MEMLOCK)";
  });
  count_pinning(ctx, PS_ACL_PIN_MALLOC_HOST, bytes, watch.seconds());
}

int AclSlots::host_free_pinned(ps_device_ctx* ctx, const ps_allocation* allocation) {
  if (ctx == nullptr || allocation == nullptr || allocation->ptr == nullptr)
    return guarded(
        [] { require(false, "host_free_pinned: context, allocation or pointer is NULL"); });
  return release(ctx, Retry::host, *allocation, [&] {
    maybe_fault(ctx, PS_FAULT_HOST_FREE, "host_free_pinned");
    use_ctx(ctx);
    free_host(ctx, *allocation);
  });
}

constexpr ps_platform_api kApi = slots::device_api<AclSlots>();

}  // namespace

extern "C" PINSTAGE_PLUGIN_EXPORT const ps_platform_api* pinstage_platform_entry(void) {
  return &kApi;
}
