// The sim backend: a device that needs no hardware, modelled on what a real one does
// (docs/worker.md, "sim semantics").
//  - Device memory is a pool reserved up to the capacity at context creation, backed on
//    first use and reused after a free, like HBM (device_pool.h).
//  - Pinned host memory is the runtime's (placed and faulted there), pinned by mlock in
//    host_register; where the OS refuses the lock it stays usable, unlocked, and the
//    capability query says so. host_alloc_pinned (the vendor source) is mmap + mlock.
//  - Copies go through a driver (dma.h): pinned host memory is DMA'd directly by a copy
//    engine per direction; pageable memory is staged through pinned bounce buffers, the
//    CPU copy pipelined with the DMA. An optional link rate paces the engines. Async
//    copies run in order on one thread per stream, which hands queued pinned copies to
//    the engine back to back (Stream::push_direct).
//  - Host callables (a scene's execute step) run in place through host_execute.
//  - A fault hook (API or PINSTAGE_SIM_FAULT="kind:nth,...") fails the nth call of a kind.
// Slots throw SlotError and return through backend::guarded (one error style).
#include "backends/sim/sim_backend.h"

#include <sys/mman.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <type_traits>

#include "pinstage/backend/sim_ext.h"
#include "pinstage/backend/slot.h"
#include "pinstage/log.h"
#include "pinstage/pages.h"
#include "pinstage/settings.h"

namespace pinstage::sim {

using backend::fail;
using backend::require;

namespace {
thread_local backend::LastError t_last_error;

template <class Body>
int guarded(Body&& body) noexcept {
  return backend::guarded(t_last_error, "sim", std::forward<Body>(body));
}
}  // namespace

bool Context::should_fail(ps_fault_kind kind) { return faults.hits(kind); }

void Event::mark(bool done, int failure, std::string failure_text) {
  std::lock_guard lock(mu);
  this->done = done;
  status = failure;
  error = std::move(failure_text);
  if (done) cv.notify_all();
}

bool Event::reached() {
  std::lock_guard lock(mu);
  return done;
}

int Event::wait(std::string* error_out) {
  std::unique_lock lock(mu);
  cv.wait(lock, [this] { return done; });
  *error_out = error;
  return status;
}

// ---- The ABI slots ----

namespace {

Context* as_ctx(ps_device_ctx* ctx) {
  require(ctx != nullptr, "sim: device context is NULL");
  return reinterpret_cast<Context*>(ctx);
}

void fault(Context* ctx, ps_fault_kind kind) {
  if (ctx->should_fail(kind))
    fail(PS_ERR_INJECTED_FAULT,
         std::string("sim: injected fault on ") + ps_fault_kind_name(kind) + " (fault hook)");
}

const char* last_error() { return t_last_error.c_str(); }

// The context options' config (the defaults without options).
SimConfig config_of(const ps_context_options* options) {
  if (options == nullptr || options->config_count == 0) return SimConfig{};
  require(options->config != nullptr, "sim: config entries are NULL");
  return parse_config({options->config, options->config_count});
}

// A device's capacity: the worker's device_capacity_bytes, else
// PINSTAGE_SIM_DEVICE_CAPACITY (per device), else 80% of physical memory split evenly
// across the devices (the devices share the host's RAM).
uint64_t capacity_of(const SimConfig& config, const ps_context_options* options) {
  if (options != nullptr && options->device_capacity_bytes != 0)
    return options->device_capacity_bytes;
  return setting_sim_device_capacity().value_or(physical_memory_bytes() / 10 * 8 /
                                                static_cast<uint64_t>(config.devices));
}

void require_device(const SimConfig& config, int device_id) {
  if (device_id < 0 || device_id >= config.devices)
    fail(PS_ERR_NO_DEVICE, "sim: no device " + std::to_string(device_id) + ": this sim has " +
                               std::to_string(config.devices) + " device(s), ids 0.." +
                               std::to_string(config.devices - 1) + " (config devices=N)");
}

int create_context(int device_id, const ps_context_options* options, ps_device_ctx** out) {
  return guarded([&] {
    require(out != nullptr, "sim: create_context: out is NULL");
    *out = nullptr;
    auto ctx = std::make_unique<Context>();
    ctx->config = config_of(options);
    require_device(ctx->config, device_id);
    ctx->capacity = capacity_of(ctx->config, options);
    for (const FaultSetting& f : setting_sim_faults()) ctx->faults.set(f.kind, f.nth);
    ctx->pool = std::make_unique<DevicePool>(ctx->capacity);
    ctx->pool->back(ctx->config.backed_bytes);
    const SimConfig& c = ctx->config;
    const int dma_threads = resolved_dma_threads(c);
    ctx->h2d =
        std::make_unique<Channel>(c.bounce_chunk, c.bounce_buffers, c.link_gbps, dma_threads);
    ctx->d2h =
        std::make_unique<Channel>(c.bounce_chunk, c.bounce_buffers, c.link_gbps, dma_threads);
    *out = reinterpret_cast<ps_device_ctx*>(ctx.release());
  });
}

// Topology (ABI v6): devices=N of them, each on its numa_nodes= node, with a PCI id in
// domain ffff (which no real bus uses) so listings have something to show.
int device_count(const ps_context_options* options, int* out) {
  return guarded([&] {
    require(out != nullptr, "sim: device_count: out is NULL");
    *out = config_of(options).devices;
  });
}

int device_props(int device_id, const ps_context_options* options, ps_device_props* out) {
  return guarded([&] {
    require(out != nullptr, "sim: device_props: out is NULL");
    const SimConfig config = config_of(options);
    require_device(config, device_id);
    *out = ps_device_props{};
    std::snprintf(out->name, sizeof out->name, "sim device %d", device_id);
    std::snprintf(out->pci_bus_id, sizeof out->pci_bus_id, "ffff:%02x:00.0", device_id);
    out->memory_bytes = capacity_of(config, options);
    out->numa_node = config.numa_node(device_id);
    out->usable = 1;
  });
}

int destroy_context(ps_device_ctx* raw) {
  return guarded([&] { delete as_ctx(raw); });
}

void unmap(void* ptr, size_t bytes) {
  if (munmap(ptr, round_up_to_pages(bytes)) != 0)
    fail(PS_ERR_BACKEND, std::string("sim: munmap failed: ") + std::strerror(errno));
}

int device_malloc(ps_device_ctx* raw, size_t bytes, ps_allocation* out) {
  return guarded([&] {
    Context* ctx = as_ctx(raw);
    require(out != nullptr && bytes > 0, "sim: device_malloc: NULL output or 0 bytes");
    fault(ctx, PS_FAULT_DEVICE_MALLOC);
    *out = ps_allocation{ctx->pool->allocate(bytes), bytes, nullptr};
  });
}

int device_free(ps_device_ctx* raw, const ps_allocation* a) {
  return guarded([&] {
    Context* ctx = as_ctx(raw);
    require(a != nullptr && a->ptr != nullptr, "sim: device_free: NULL allocation");
    fault(ctx, PS_FAULT_DEVICE_FREE);
    ctx->pool->release(a->ptr, a->bytes);
  });
}

// A copy's count on its path; true when a planted PS_FAULT_CORRUPT_H2D is to damage it.
bool count_copy(Context* ctx, bool up, bool pinned, size_t bytes) {
  const size_t path = (up ? 0 : 4) + (pinned ? 0 : 2);
  ctx->copies[path] += 1;
  ctx->copies[path + 1] += bytes;
  return up && bytes > 0 && ctx->should_fail(PS_FAULT_CORRUPT_H2D);
}

void corrupt(void* dst, size_t bytes) {
  static_cast<unsigned char*>(dst)[bytes / 2] ^= 0x40;  // an exponent bit of a bf16/f32
}

// One copy through the driver: a pinned host side (the runtime's flag) is DMA'd directly,
// a pageable one is staged through the bounce buffers of that direction.
void copy(Context* ctx, ps_fault_kind kind, void* dst, const void* src, size_t bytes,
          uint32_t flags) {
  fault(ctx, kind);
  const bool up = kind == PS_FAULT_COPY_H2D;
  const bool pinned = (flags & PS_COPY_HOST_PINNED) != 0;
  Channel& channel = up ? *ctx->h2d : *ctx->d2h;
  if (pinned)
    channel.direct(dst, src, bytes);
  else if (up)
    channel.bounce_in(dst, src, bytes);
  else
    channel.bounce_out(dst, src, bytes);
  if (count_copy(ctx, up, pinned, bytes)) corrupt(dst, bytes);
}

// An async pinned copy's start on its stream: its chunks queued behind the stream's earlier
// ones (Stream::push_direct); a planted corruption waits for them to land first.
void copy_start(Context* ctx, ps_fault_kind kind, void* dst, const void* src, size_t bytes,
                Transfer& inflight, size_t& chunks) {
  fault(ctx, kind);
  const bool up = kind == PS_FAULT_COPY_H2D;
  chunks += (up ? *ctx->h2d : *ctx->d2h).direct_start(dst, src, bytes, inflight);
  if (count_copy(ctx, up, true, bytes)) {
    inflight.wait_for(chunks);
    corrupt(dst, bytes);
  }
}

int copy_h2d(ps_device_ctx* raw, void* dst, const void* src, size_t bytes, uint32_t flags) {
  return guarded([&] {
    require(dst != nullptr && src != nullptr, "sim: copy_h2d: NULL argument");
    copy(as_ctx(raw), PS_FAULT_COPY_H2D, dst, src, bytes, flags);
  });
}

int copy_d2h(ps_device_ctx* raw, void* dst, const void* src, size_t bytes, uint32_t flags) {
  return guarded([&] {
    require(dst != nullptr && src != nullptr, "sim: copy_d2h: NULL argument");
    copy(as_ctx(raw), PS_FAULT_COPY_D2H, dst, src, bytes, flags);
  });
}

Stream* as_stream(ps_stream* stream) {
  require(stream != nullptr, "sim: stream is NULL");
  return reinterpret_cast<Stream*>(stream);
}

Event* as_event(ps_event* event) {
  require(event != nullptr, "sim: event is NULL");
  return reinterpret_cast<Event*>(event);
}

// stream_create/event_create and their destroys: the opaque handle is the object itself
// (the runtime's table tracks it; destroying a Stream drains and joins its thread).
template <class Handle, class Object>
int create_handle(ps_device_ctx* raw, Handle** out) {
  return guarded([&] {
    Context* ctx = as_ctx(raw);
    require(out != nullptr, "sim: stream/event create: out is NULL");
    if constexpr (std::is_same_v<Object, Stream>)
      *out = reinterpret_cast<Handle*>(new Stream(&ctx->gate, last_error));
    else
      *out = reinterpret_cast<Handle*>(new Object);
  });
}

template <class Handle, class Object>
int destroy_handle(ps_device_ctx* raw, Handle* handle) {
  return guarded([&] {
    as_ctx(raw);
    require(handle != nullptr, "sim: stream/event destroy: handle is NULL");
    delete reinterpret_cast<Object*>(handle);
  });
}

// stream_sync and event_sync: `wait(&error)`'s status, with its message, is the slot's.
template <class Wait>
int wait_slot(ps_device_ctx* raw, Wait&& wait) {
  return guarded([&] {
    as_ctx(raw);
    std::string error;
    const int status = wait(&error);
    if (status != PS_OK) fail(static_cast<ps_status>(status), error);
  });
}

int stream_sync(ps_device_ctx* raw, ps_stream* stream) {
  return wait_slot(raw, [&](std::string* error) { return as_stream(stream)->sync(error); });
}

int copy_async(ps_device_ctx* raw, ps_fault_kind kind, void* dst, const void* src, size_t bytes,
               uint32_t flags, ps_stream* stream) {
  return guarded([&] {
    Context* ctx = as_ctx(raw);
    require(dst != nullptr && src != nullptr, "sim: async copy: NULL argument");
    if ((flags & PS_COPY_HOST_PINNED) != 0)
      as_stream(stream)->push_direct(
          kind == PS_FAULT_COPY_H2D, dst, bytes, [=](Transfer& inflight, size_t& chunks) {
            return guarded([&] { copy_start(ctx, kind, dst, src, bytes, inflight, chunks); });
          });
    else
      as_stream(stream)->push(
          [=] { return guarded([&] { copy(ctx, kind, dst, src, bytes, flags); }); });
  });
}

int copy_h2d_async(ps_device_ctx* raw, void* dst, const void* src, size_t bytes, uint32_t flags,
                   ps_stream* stream) {
  return copy_async(raw, PS_FAULT_COPY_H2D, dst, src, bytes, flags, stream);
}

int copy_d2h_async(ps_device_ctx* raw, void* dst, const void* src, size_t bytes, uint32_t flags,
                   ps_stream* stream) {
  return copy_async(raw, PS_FAULT_COPY_D2H, dst, src, bytes, flags, stream);
}

// Device-side work (ABI v5): device memory is host RAM here, so a device-to-device copy
// is a memcpy (the runtime refuses overlapping ranges) and a fill a memset, run on the
// stream's thread in its order like the async copies, or inline without a stream. No
// fault kind of their own: the copy kinds name host/device directions.
void device_work(ps_stream* stream, std::function<void()> work) {
  if (stream == nullptr) return work();
  as_stream(stream)->push([work = std::move(work)] { return guarded(work); });
}

int copy_d2d_async(ps_device_ctx* raw, void* dst, const void* src, size_t bytes,
                   ps_stream* stream) {
  return guarded([&] {
    as_ctx(raw);
    require(dst != nullptr && src != nullptr, "sim: copy_d2d_async: NULL argument");
    device_work(stream, [=] { std::memcpy(dst, src, bytes); });
  });
}

int memset_async(ps_device_ctx* raw, void* dst, int value, size_t bytes, ps_stream* stream) {
  return guarded([&] {
    as_ctx(raw);
    require(dst != nullptr, "sim: memset_async: NULL argument");
    device_work(stream, [=] { std::memset(dst, value, bytes); });
  });
}

int event_record(ps_device_ctx* raw, ps_event* event, ps_stream* stream) {
  return guarded([&] {
    as_ctx(raw);
    Event* e = as_event(event);
    Stream* s = as_stream(stream);
    e->mark(false);
    s->push([e, s] {
      std::string error;
      const int failure = s->pending_failure(&error);
      e->mark(true, failure, std::move(error));
      return PS_OK;
    });
  });
}

int event_query(ps_device_ctx* raw, ps_event* event) {
  // Not through guarded: PS_ERR_NOT_READY is an answer, not a failure with a message.
  if (raw == nullptr || event == nullptr) return PS_ERR_INVALID_ARGUMENT;
  return reinterpret_cast<Event*>(event)->reached() ? PS_OK : PS_ERR_NOT_READY;
}

int event_sync(ps_device_ctx* raw, ps_event* event) {
  return wait_slot(raw, [&](std::string* error) { return as_event(event)->wait(error); });
}

// Locks [ptr, ptr+bytes); on refusal records it, warns once, and leaves the range usable.
void try_lock(Context* ctx, void* ptr, size_t bytes, bool on_fault = false) {
  if ((on_fault ? mlock2(ptr, bytes, MLOCK_ONFAULT) : mlock(ptr, bytes)) == 0) return;
  const int err = errno;
  ctx->lock_refused.store(true);
  static std::once_flag warned;
  std::call_once(warned, [err] {
    log(LogLevel::warn, std::string("sim: mlock refused (") + std::strerror(err) +
                            "): pinned memory stays usable but is not page-locked; raise "
                            "RLIMIT_MEMLOCK (ulimit -l) or grant CAP_IPC_LOCK to lock it");
  });
}

// The vendor source, for a runtime that cannot pin its own memory (a test plugin built on
// sim without host_register): plain pages, locked. Placing, huge pages and the parallel
// pre-fault are the runtime's (Note [Segment sources]); mlock faults this in itself.
int host_alloc_pinned(ps_device_ctx* raw, size_t bytes, ps_allocation* out) {
  return guarded([&] {
    Context* ctx = as_ctx(raw);
    require(out != nullptr && bytes > 0, "sim: host_alloc_pinned: NULL output or 0 bytes");
    fault(ctx, PS_FAULT_HOST_ALLOC);
    const size_t mapped = round_up_to_pages(bytes);  // the page, never a power of two
    void* ptr = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (ptr == MAP_FAILED)
      fail(errno == ENOMEM ? PS_ERR_OUT_OF_MEMORY : PS_ERR_BACKEND,
           std::string("sim: host_alloc_pinned: mmap of ") + std::to_string(mapped) +
               " bytes failed: " + std::strerror(errno));
    try_lock(ctx, ptr, mapped);  // never throws: a refusal stays usable
    *out = ps_allocation{ptr, bytes, nullptr};
  });
}

// ABI v7: pins memory the runtime mapped (fresh anonymous pages, a read-only file
// mapping) in place. mlock faults in what is not resident yet (with PS_REGISTER_ON_FAULT,
// mlock2 MLOCK_ONFAULT locks each page as its writer faults it); a refusal leaves the range
// usable, unlocked, as host_alloc_pinned does (the capability query says so). The fault
// kinds are host_alloc and host_free: pinning is one concern whatever made the memory.
int host_register(ps_device_ctx* raw, void* ptr, size_t bytes, uint32_t flags) {
  return guarded([&] {
    Context* ctx = as_ctx(raw);
    require(ptr != nullptr && bytes > 0, "sim: host_register: NULL pointer or 0 bytes");
    require(reinterpret_cast<uintptr_t>(ptr) % page_size() == 0 && bytes % page_size() == 0,
            "sim: host_register: the range is not page-aligned");
    require((flags & ~(PS_REGISTER_READ_ONLY | PS_REGISTER_ON_FAULT)) == 0,
            "sim: host_register: unknown flags");
    fault(ctx, PS_FAULT_HOST_ALLOC);
    // On fault (ABI v8): each page locked as its writer faults it, in the writer's thread.
    try_lock(ctx, ptr, bytes, (flags & PS_REGISTER_ON_FAULT) != 0);
  });
}

int host_unregister(ps_device_ctx* raw, void* ptr, size_t bytes) {
  return guarded([&] {
    Context* ctx = as_ctx(raw);
    require(ptr != nullptr && bytes > 0, "sim: host_unregister: NULL pointer or 0 bytes");
    fault(ctx, PS_FAULT_HOST_FREE);
    // munlock of a range that was never locked (a refused lock) succeeds too.
    if (munlock(ptr, bytes) != 0)
      fail(PS_ERR_BACKEND, std::string("sim: munlock failed: ") + std::strerror(errno));
  });
}

int host_free_pinned(ps_device_ctx* raw, const ps_allocation* a) {
  return guarded([&] {
    Context* ctx = as_ctx(raw);
    require(a != nullptr && a->ptr != nullptr, "sim: host_free_pinned: NULL allocation");
    fault(ctx, PS_FAULT_HOST_FREE);
    unmap(a->ptr, a->bytes);  // also drops the lock
  });
}

int mem_info(ps_device_ctx* raw, uint64_t* capacity, uint64_t* committed) {
  return guarded([&] {
    Context* ctx = as_ctx(raw);
    require(capacity != nullptr && committed != nullptr, "sim: mem_info: NULL argument");
    *capacity = ctx->capacity;
    *committed = ctx->pool->used();
  });
}

int get_capabilities(ps_device_ctx* raw, ps_capabilities* out) {
  return guarded([&] {
    Context* ctx = as_ctx(raw);
    require(out != nullptr, "sim: get_capabilities: NULL argument");
    *out = ps_capabilities{.pinned_is_page_locked = ctx->lock_refused.load() ? 0 : 1,
                           .async_copy = 1,
                           .execute = 1,
                           .device_memory_is_host = 1};
  });
}

int host_execute(ps_device_ctx* raw, ps_host_fn fn, void* user) {
  return guarded([&] {
    Context* ctx = as_ctx(raw);
    require(fn != nullptr, "sim: host_execute: NULL function");
    fault(ctx, PS_FAULT_EXECUTE);
    if (const int status = fn(user); status != PS_OK)
      fail(static_cast<ps_status>(status), "sim: the host callable failed");
  });
}

int inject_fault(ps_device_ctx* raw, int kind, uint64_t nth) {
  return guarded([&] {
    Context* ctx = as_ctx(raw);
    ctx->faults.set(kind, nth);
  });
}

int sim_stats(ps_device_ctx* raw, ps_sim_stats* out) {
  return guarded([&] {
    Context* ctx = as_ctx(raw);
    require(out != nullptr, "sim: sim.stats: NULL argument");
    const PoolStats pool = ctx->pool->stats();
    const auto& n = ctx->copies;
    *out = ps_sim_stats{
        .h2d_direct_count = n[0],
        .h2d_direct_bytes = n[1],
        .h2d_bounced_count = n[2],
        .h2d_bounced_bytes = n[3],
        .d2h_direct_count = n[4],
        .d2h_direct_bytes = n[5],
        .d2h_bounced_count = n[6],
        .d2h_bounced_bytes = n[7],
        .link_wait_seconds = ctx->h2d->link_wait_seconds() + ctx->d2h->link_wait_seconds(),
        .bounce_chunk_bytes = ctx->config.bounce_chunk,
        .bounce_buffers = ctx->config.bounce_buffers,
        .bounce_locked = ctx->h2d->locked() && ctx->d2h->locked() ? 1 : 0,
        .link_gbps = ctx->config.link_gbps,
        .dma_threads = ctx->h2d->engine().threads(),
        .h2d_dma_thread_bytes = {},
        .d2h_dma_thread_bytes = {},
        .h2d_staged_bytes = ctx->h2d->staged_bytes(),
        .d2h_staged_bytes = ctx->d2h->staged_bytes(),
        .pool_span_bytes = pool.span,
        .pool_used_bytes = pool.used,
        .pool_backed_bytes = pool.backed,
        .pool_free_blocks = pool.free_blocks,
        .pool_largest_free_bytes = pool.largest_free,
        .pool_backing_seconds = pool.backing_seconds};
    for (int w = 0; w < out->dma_threads; ++w) {
      out->h2d_dma_thread_bytes[w] = ctx->h2d->engine().thread_bytes(w);
      out->d2h_dma_thread_bytes[w] = ctx->d2h->engine().thread_bytes(w);
    }
  });
}

int hold_streams(ps_device_ctx* raw, int hold) {
  return guarded([&] { as_ctx(raw)->gate.set_held(hold != 0); });
}

void* get_proc_address(const char* name) {
  if (name == nullptr) return nullptr;
  if (std::strcmp(name, PS_SIM_STATS_NAME) == 0) return reinterpret_cast<void*>(&sim_stats);
  if (std::strcmp(name, PS_SIM_HOLD_STREAMS_NAME) == 0)
    return reinterpret_cast<void*>(&hold_streams);
  return nullptr;
}

constexpr ps_platform_api kApi = {
    .api_version = PINSTAGE_PLATFORM_API_VERSION,
    .name = "sim",
    .last_error = last_error,
    .get_proc_address = get_proc_address,
    .create_context = create_context,
    .destroy_context = destroy_context,
    .device_malloc = device_malloc,
    .device_free = device_free,
    .copy_h2d = copy_h2d,
    .copy_d2h = copy_d2h,
    .stream_create = create_handle<ps_stream, Stream>,
    .stream_destroy = destroy_handle<ps_stream, Stream>,
    .stream_sync = stream_sync,
    .copy_h2d_async = copy_h2d_async,
    .copy_d2h_async = copy_d2h_async,
    .event_create = create_handle<ps_event, Event>,
    .event_destroy = destroy_handle<ps_event, Event>,
    .event_record = event_record,
    .event_sync = event_sync,
    .host_alloc_pinned = host_alloc_pinned,
    .host_free_pinned = host_free_pinned,
    .mem_info = mem_info,
    .get_capabilities = get_capabilities,
    .host_execute = host_execute,
    .inject_fault = inject_fault,
    .event_query = event_query,
    .copy_d2d_async = copy_d2d_async,
    .memset_async = memset_async,
    .device_count = device_count,
    .device_props = device_props,
    .host_register = host_register,
    .host_unregister = host_unregister,
};

}  // namespace
}  // namespace pinstage::sim

extern "C" PINSTAGE_PLUGIN_EXPORT const ps_platform_api* pinstage_platform_entry(void) {
  return &pinstage::sim::kApi;
}
