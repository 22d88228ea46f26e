// The sim backend: a device that needs no hardware.
//  - Device memory is host memory (anonymous mmap) tracked against a capacity.
//  - Pinned host memory is mmap'ed, pre-faulted in parallel, then mlock'ed; where the OS
//    refuses the lock it stays usable, unlocked, and the capability query says so.
//  - Copies are memcpy, split across threads for large sizes; async copies run in order on
//    one thread per stream.
//  - Callables run on the device buffers in place (see sim_callables.cpp).
//  - A fault hook (API or PINSTAGE_SIM_FAULT="kind:nth,...") fails the nth call of a kind.
#include "backends/sim/sim_backend.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

#include "pinstage/export.h"
#include "pinstage/log.h"
#include "pinstage/parallel.h"

namespace pinstage::sim {
namespace {

thread_local std::string t_last_error;

int fail(int status, std::string message) {
  t_last_error = std::move(message);
  return status;
}

size_t page_size() {
  static const size_t size = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return size;
}

size_t round_to_page(size_t bytes) { return (bytes + page_size() - 1) / page_size() * page_size(); }

// "12G", "512M", "4096" -> bytes; 0 on a malformed value (strtoull would take "-1" as
// 2^64 - 1, and value * scale could wrap).
uint64_t parse_bytes(const std::string& text) {
  if (text.empty() || text[0] < '0' || text[0] > '9') return 0;
  char* end = nullptr;
  errno = 0;
  const unsigned long long value = std::strtoull(text.c_str(), &end, 10);
  if (errno != 0 || end == text.c_str()) return 0;
  const std::string suffix(end);
  uint64_t scale = 1;
  if (suffix == "K" || suffix == "KiB")
    scale = 1ull << 10;
  else if (suffix == "M" || suffix == "MiB")
    scale = 1ull << 20;
  else if (suffix == "G" || suffix == "GiB")
    scale = 1ull << 30;
  else if (!suffix.empty())
    return 0;
  if (value > UINT64_MAX / scale) return 0;
  return value * scale;
}

const char* const kFaultNames[PS_FAULT_KIND_COUNT] = {"device_malloc", "device_free", "host_alloc",
                                                      "host_free",     "copy_h2d",    "copy_d2h",
                                                      "execute",       "corrupt_h2d"};

// Runs `body`, turning any exception into PS_ERR_INTERNAL: nothing unwinds through C.
template <typename F>
int guarded(F&& body) noexcept {
  try {
    t_last_error.clear();
    return body();
  } catch (const std::exception& e) {
    return fail(PS_ERR_INTERNAL, std::string("sim: exception: ") + e.what());
  } catch (...) {
    return fail(PS_ERR_INTERNAL, "sim: unknown exception");
  }
}

#define SIM_REQUIRE(cond, what) \
  if (!(cond)) return fail(PS_ERR_INVALID_ARGUMENT, std::string("sim: ") + (what))

int fault(Context* ctx, ps_fault_kind kind) {
  if (!ctx->should_fail(kind)) return PS_OK;
  return fail(PS_ERR_INJECTED_FAULT,
              std::string("sim: injected fault on ") + kFaultNames[kind] + " (fault hook)");
}

}  // namespace

// ---- Context ----

bool Context::should_fail(ps_fault_kind kind) {
  auto& counter = faults[kind];
  uint64_t left = counter.load();
  while (left != 0) {
    if (counter.compare_exchange_weak(left, left - 1)) return left == 1;
  }
  return false;
}

bool Context::device_range_ok(const void* ptr, size_t bytes) {
  const auto addr = reinterpret_cast<uintptr_t>(ptr);
  std::lock_guard lock(mu);
  auto it = device.upper_bound(addr);
  if (it == device.begin()) return false;
  --it;
  return addr >= it->first && bytes <= it->second && addr - it->first <= it->second - bytes;
}

// ---- Streams: one thread each, running queued copies in order ----

Stream::Stream() : thread_([this] { loop(); }) {}

Stream::~Stream() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void Stream::push(std::function<int()> task) {
  {
    std::lock_guard lock(mu_);
    queue_.push_back(std::move(task));
  }
  cv_.notify_all();
}

int Stream::sync(std::string* error) {
  std::unique_lock lock(mu_);
  cv_.wait(lock, [this] { return queue_.empty() && !busy_; });
  const int status = status_;
  *error = error_;
  status_ = PS_OK;
  error_.clear();
  return status;
}

void Stream::loop() {
  std::unique_lock lock(mu_);
  for (;;) {
    cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stop_ with nothing left
    auto task = std::move(queue_.front());
    queue_.pop_front();
    busy_ = true;
    lock.unlock();
    const int status = task();
    std::string detail = status == PS_OK ? std::string() : t_last_error;
    lock.lock();
    busy_ = false;
    if (status != PS_OK && status_ == PS_OK) {  // keep the first failure for sync
      status_ = status;
      error_ = std::move(detail);
    }
    cv_.notify_all();
  }
}

void Event::mark(bool done) {
  std::lock_guard lock(mu);
  this->done = done;
  if (done) cv.notify_all();
}

void Event::wait() {
  std::unique_lock lock(mu);
  cv.wait(lock, [this] { return done; });
}

// ---- The ABI slots ----

namespace {

const char* last_error() { return t_last_error.c_str(); }

int create_context(int device_id, const ps_context_options* options, ps_device_ctx** out) {
  return guarded([&]() -> int {
    SIM_REQUIRE(out != nullptr, "create_context: out is NULL");
    *out = nullptr;
    if (device_id != 0)
      return fail(PS_ERR_NO_DEVICE, "sim: there is one sim device (id 0), asked for device " +
                                        std::to_string(device_id));
    auto ctx = std::make_unique<Context>();
    const uint64_t physical = static_cast<uint64_t>(sysconf(_SC_PHYS_PAGES)) * page_size();
    ctx->capacity = physical / 10 * 8;
    if (const char* env = std::getenv("PINSTAGE_SIM_DEVICE_CAPACITY")) {
      ctx->capacity = parse_bytes(env);
      if (ctx->capacity == 0)
        return fail(PS_ERR_INVALID_ARGUMENT, std::string("sim: PINSTAGE_SIM_DEVICE_CAPACITY='") +
                                                 env +
                                                 "' is not a byte count (e.g. 8G, 512M, 1048576)");
    }
    if (options != nullptr && options->device_capacity_bytes != 0)
      ctx->capacity = options->device_capacity_bytes;
    if (const char* env = std::getenv("PINSTAGE_SIM_FAULT")) {
      // "copy_h2d:3,device_malloc:1"
      std::string spec(env);
      size_t start = 0;
      while (start < spec.size()) {
        const size_t end = std::min(spec.find(',', start), spec.size());
        const std::string item = spec.substr(start, end - start);
        const size_t colon = item.find(':');
        int kind = -1;
        for (int k = 0; k < PS_FAULT_KIND_COUNT; ++k)
          if (item.compare(0, colon, kFaultNames[k]) == 0) kind = k;
        const uint64_t nth = colon == std::string::npos ? 0 : parse_bytes(item.substr(colon + 1));
        if (kind < 0 || nth == 0)
          return fail(PS_ERR_INVALID_ARGUMENT,
                      "sim: PINSTAGE_SIM_FAULT item '" + item +
                          "' is not kind:nth (kinds: device_malloc, device_free, host_alloc, "
                          "host_free, copy_h2d, copy_d2h, execute, corrupt_h2d)");
        ctx->faults[kind].store(nth);
        start = end + 1;
      }
    }
    *out = reinterpret_cast<ps_device_ctx*>(ctx.release());
    return PS_OK;
  });
}

Context* as_ctx(ps_device_ctx* ctx) { return reinterpret_cast<Context*>(ctx); }

int destroy_context(ps_device_ctx* raw) {
  return guarded([&]() -> int {
    SIM_REQUIRE(raw != nullptr, "destroy_context: ctx is NULL");
    std::unique_ptr<Context> ctx(as_ctx(raw));
    ctx->streams.clear();  // joins their threads
    ctx->events.clear();
    for (const auto& [addr, size] : ctx->device) munmap(reinterpret_cast<void*>(addr), size);
    for (const auto& [ptr, entry] : ctx->pinned) munmap(ptr, entry.mapped);
    for (const auto& [ptr, bytes] : ctx->registered) munlock(ptr, bytes);
    return PS_OK;
  });
}

// Faults every page in from all cores: the kernel work of pinning scales with threads,
// while mlock alone would populate the range on one.
void prefault(void* ptr, size_t bytes) {
  auto* base = static_cast<volatile char*>(ptr);
  const size_t pages = bytes / page_size();
  parallel_for(pages, 1024, [&](size_t begin, size_t end) {
    for (size_t p = begin; p < end; ++p) base[p * page_size()] = 0;
  });
}

int device_malloc(ps_device_ctx* raw, size_t bytes, void** out) {
  return guarded([&]() -> int {
    SIM_REQUIRE(raw != nullptr && out != nullptr, "device_malloc: NULL argument");
    SIM_REQUIRE(bytes > 0, "device_malloc: 0 bytes");
    *out = nullptr;
    Context* ctx = as_ctx(raw);
    if (int s = fault(ctx, PS_FAULT_DEVICE_MALLOC)) return s;
    const size_t mapped = round_to_page(bytes);
    {
      std::lock_guard lock(ctx->mu);
      if (bytes > ctx->capacity || mapped > ctx->capacity - ctx->committed)
        return fail(PS_ERR_OUT_OF_MEMORY,
                    "sim: device out of memory: asked for " + std::to_string(bytes) + " bytes, " +
                        std::to_string(ctx->capacity - ctx->committed) + " of " +
                        std::to_string(ctx->capacity) + " bytes free");
      ctx->committed += mapped;
    }
    void* ptr = mmap(nullptr, mapped, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (ptr == MAP_FAILED) {
      std::lock_guard lock(ctx->mu);
      ctx->committed -= mapped;
      return fail(PS_ERR_OUT_OF_MEMORY,
                  std::string("sim: mmap of device memory failed: ") + std::strerror(errno));
    }
    // A device allocation is backed when it returns (as cudaMalloc's is), so uploads
    // measure copies, not page faults.
    prefault(ptr, mapped);
    std::lock_guard lock(ctx->mu);
    ctx->device.emplace(reinterpret_cast<uintptr_t>(ptr), mapped);
    *out = ptr;
    return PS_OK;
  });
}

int device_free(ps_device_ctx* raw, void* ptr) {
  return guarded([&]() -> int {
    SIM_REQUIRE(raw != nullptr && ptr != nullptr, "device_free: NULL argument");
    Context* ctx = as_ctx(raw);
    if (int s = fault(ctx, PS_FAULT_DEVICE_FREE)) return s;
    size_t mapped;
    {
      std::lock_guard lock(ctx->mu);
      auto it = ctx->device.find(reinterpret_cast<uintptr_t>(ptr));
      if (it == ctx->device.end())
        return fail(PS_ERR_UNKNOWN_POINTER,
                    "sim: device_free of a pointer the sim device did not allocate");
      mapped = it->second;
      ctx->device.erase(it);
      ctx->committed -= mapped;
    }
    munmap(ptr, mapped);
    return PS_OK;
  });
}

int copy(Context* ctx, ps_fault_kind kind, void* dst, const void* src, size_t bytes,
         const void* device_side) {
  if (int s = fault(ctx, kind)) return s;
  if (!ctx->device_range_ok(device_side, bytes))
    return fail(PS_ERR_INVALID_ARGUMENT, std::string("sim: ") + kFaultNames[kind] +
                                             ": the device range of " + std::to_string(bytes) +
                                             " bytes is not inside one device allocation");
  parallel_memcpy(dst, src, bytes);
  if (kind == PS_FAULT_COPY_H2D && bytes > 0 && ctx->should_fail(PS_FAULT_CORRUPT_H2D))
    static_cast<unsigned char*>(dst)[bytes / 2] ^= 0x40;  // an exponent bit of a bf16/f32
  return PS_OK;
}

int copy_h2d(ps_device_ctx* raw, void* dst, const void* src, size_t bytes) {
  return guarded([&]() -> int {
    SIM_REQUIRE(raw != nullptr && dst != nullptr && src != nullptr, "copy_h2d: NULL argument");
    return copy(as_ctx(raw), PS_FAULT_COPY_H2D, dst, src, bytes, dst);
  });
}

int copy_d2h(ps_device_ctx* raw, void* dst, const void* src, size_t bytes) {
  return guarded([&]() -> int {
    SIM_REQUIRE(raw != nullptr && dst != nullptr && src != nullptr, "copy_d2h: NULL argument");
    return copy(as_ctx(raw), PS_FAULT_COPY_D2H, dst, src, bytes, src);
  });
}

int stream_create(ps_device_ctx* raw, ps_stream** out) {
  return guarded([&]() -> int {
    SIM_REQUIRE(raw != nullptr && out != nullptr, "stream_create: NULL argument");
    Context* ctx = as_ctx(raw);
    auto stream = std::make_unique<Stream>();
    *out = reinterpret_cast<ps_stream*>(stream.get());
    std::lock_guard lock(ctx->mu);
    ctx->streams.emplace(stream.get(), std::move(stream));
    return PS_OK;
  });
}

// Looks a handle up in one of the context's tables.
template <typename Map, typename Handle>
auto* find_handle(Context* ctx, Map& map, Handle* handle) {
  std::lock_guard lock(ctx->mu);
  auto it = map.find(reinterpret_cast<typename Map::key_type>(handle));
  return it == map.end() ? nullptr : it->first;
}

int stream_destroy(ps_device_ctx* raw, ps_stream* stream) {
  return guarded([&]() -> int {
    SIM_REQUIRE(raw != nullptr && stream != nullptr, "stream_destroy: NULL argument");
    Context* ctx = as_ctx(raw);
    std::unique_ptr<Stream> dying;
    {
      std::lock_guard lock(ctx->mu);
      auto it = ctx->streams.find(reinterpret_cast<Stream*>(stream));
      if (it == ctx->streams.end())
        return fail(PS_ERR_UNKNOWN_POINTER, "sim: stream_destroy of an unknown stream");
      dying = std::move(it->second);
      ctx->streams.erase(it);
    }
    return PS_OK;  // `dying` drains and joins here, outside the lock
  });
}

int stream_sync(ps_device_ctx* raw, ps_stream* stream) {
  return guarded([&]() -> int {
    SIM_REQUIRE(raw != nullptr && stream != nullptr, "stream_sync: NULL argument");
    Stream* s = find_handle(as_ctx(raw), as_ctx(raw)->streams, stream);
    if (s == nullptr) return fail(PS_ERR_UNKNOWN_POINTER, "sim: stream_sync of an unknown stream");
    std::string error;
    const int status = s->sync(&error);
    if (status != PS_OK) return fail(status, error);
    return PS_OK;
  });
}

int copy_async(ps_device_ctx* raw, ps_fault_kind kind, void* dst, const void* src, size_t bytes,
               const void* device_side, ps_stream* stream) {
  return guarded([&]() -> int {
    SIM_REQUIRE(raw != nullptr && dst != nullptr && src != nullptr && stream != nullptr,
                std::string(kFaultNames[kind]) + "_async: NULL argument");
    Context* ctx = as_ctx(raw);
    Stream* s = find_handle(ctx, ctx->streams, stream);
    if (s == nullptr) return fail(PS_ERR_UNKNOWN_POINTER, "sim: async copy on an unknown stream");
    // Checked now so a bad call fails where it is made, not at the next sync.
    if (!ctx->device_range_ok(device_side, bytes))
      return fail(PS_ERR_INVALID_ARGUMENT,
                  std::string("sim: ") + kFaultNames[kind] + "_async: the device range of " +
                      std::to_string(bytes) + " bytes is not inside one device allocation");
    s->push([=] { return copy(ctx, kind, dst, src, bytes, device_side); });
    return PS_OK;
  });
}

int copy_h2d_async(ps_device_ctx* raw, void* dst, const void* src, size_t bytes,
                   ps_stream* stream) {
  return copy_async(raw, PS_FAULT_COPY_H2D, dst, src, bytes, dst, stream);
}

int copy_d2h_async(ps_device_ctx* raw, void* dst, const void* src, size_t bytes,
                   ps_stream* stream) {
  return copy_async(raw, PS_FAULT_COPY_D2H, dst, src, bytes, src, stream);
}

int event_create(ps_device_ctx* raw, ps_event** out) {
  return guarded([&]() -> int {
    SIM_REQUIRE(raw != nullptr && out != nullptr, "event_create: NULL argument");
    Context* ctx = as_ctx(raw);
    auto event = std::make_unique<Event>();
    *out = reinterpret_cast<ps_event*>(event.get());
    std::lock_guard lock(ctx->mu);
    ctx->events.emplace(event.get(), std::move(event));
    return PS_OK;
  });
}

int event_destroy(ps_device_ctx* raw, ps_event* event) {
  return guarded([&]() -> int {
    SIM_REQUIRE(raw != nullptr && event != nullptr, "event_destroy: NULL argument");
    Context* ctx = as_ctx(raw);
    std::lock_guard lock(ctx->mu);
    if (ctx->events.erase(reinterpret_cast<Event*>(event)) == 0)
      return fail(PS_ERR_UNKNOWN_POINTER, "sim: event_destroy of an unknown event");
    return PS_OK;
  });
}

int event_record(ps_device_ctx* raw, ps_event* event, ps_stream* stream) {
  return guarded([&]() -> int {
    SIM_REQUIRE(raw != nullptr && event != nullptr && stream != nullptr,
                "event_record: NULL argument");
    Context* ctx = as_ctx(raw);
    Event* e = find_handle(ctx, ctx->events, event);
    Stream* s = find_handle(ctx, ctx->streams, stream);
    if (e == nullptr || s == nullptr)
      return fail(PS_ERR_UNKNOWN_POINTER, "sim: event_record with an unknown event or stream");
    e->mark(false);
    s->push([e] {
      e->mark(true);
      return PS_OK;
    });
    return PS_OK;
  });
}

int event_sync(ps_device_ctx* raw, ps_event* event) {
  return guarded([&]() -> int {
    SIM_REQUIRE(raw != nullptr && event != nullptr, "event_sync: NULL argument");
    Context* ctx = as_ctx(raw);
    Event* e = find_handle(ctx, ctx->events, event);
    if (e == nullptr) return fail(PS_ERR_UNKNOWN_POINTER, "sim: event_sync of an unknown event");
    e->wait();
    return PS_OK;
  });
}

// Locks [ptr, ptr+bytes); on refusal records it, warns once, and leaves the range usable.
bool try_lock(Context* ctx, void* ptr, size_t bytes) {
  if (mlock(ptr, bytes) == 0) return true;
  const int err = errno;
  ctx->lock_refused.store(true);
  static std::once_flag warned;
  std::call_once(warned, [err] {
    log(LogLevel::warn, std::string("sim: mlock refused (") + std::strerror(err) +
                            "): pinned memory stays usable but is not page-locked; raise "
                            "RLIMIT_MEMLOCK (ulimit -l) or grant CAP_IPC_LOCK to lock it");
  });
  return false;
}

int host_alloc_pinned(ps_device_ctx* raw, size_t bytes, void** out) {
  return guarded([&]() -> int {
    SIM_REQUIRE(raw != nullptr && out != nullptr, "host_alloc_pinned: NULL argument");
    SIM_REQUIRE(bytes > 0, "host_alloc_pinned: 0 bytes");
    *out = nullptr;
    Context* ctx = as_ctx(raw);
    if (int s = fault(ctx, PS_FAULT_HOST_ALLOC)) return s;
    const size_t mapped = round_to_page(bytes);  // the page, never a power of two
    void* ptr = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (ptr == MAP_FAILED)
      return fail(PS_ERR_OUT_OF_MEMORY, "sim: mmap of " + std::to_string(mapped) +
                                            " pinned bytes failed: " + std::strerror(errno));
    prefault(ptr, mapped);
    const bool locked = try_lock(ctx, ptr, mapped);
    std::lock_guard lock(ctx->mu);
    ctx->pinned.emplace(ptr, PinnedEntry{mapped, locked});
    *out = ptr;
    return PS_OK;
  });
}

int host_free_pinned(ps_device_ctx* raw, void* ptr) {
  return guarded([&]() -> int {
    SIM_REQUIRE(raw != nullptr && ptr != nullptr, "host_free_pinned: NULL argument");
    Context* ctx = as_ctx(raw);
    if (int s = fault(ctx, PS_FAULT_HOST_FREE)) return s;
    PinnedEntry entry;
    {
      std::lock_guard lock(ctx->mu);
      auto it = ctx->pinned.find(ptr);
      if (it == ctx->pinned.end())
        return fail(PS_ERR_UNKNOWN_POINTER,
                    "sim: host_free_pinned of a pointer the sim backend did not allocate");
      entry = it->second;
      ctx->pinned.erase(it);
    }
    munmap(ptr, entry.mapped);  // also drops the lock
    return PS_OK;
  });
}

int host_register(ps_device_ctx* raw, void* ptr, size_t bytes) {
  return guarded([&]() -> int {
    SIM_REQUIRE(raw != nullptr && ptr != nullptr, "host_register: NULL argument");
    SIM_REQUIRE(bytes > 0, "host_register: 0 bytes");
    Context* ctx = as_ctx(raw);
    {
      std::lock_guard lock(ctx->mu);
      if (ctx->registered.count(ptr) != 0)
        return fail(PS_ERR_INVALID_ARGUMENT, "sim: host_register: range already registered");
    }
    try_lock(ctx, ptr, bytes);
    std::lock_guard lock(ctx->mu);
    ctx->registered.emplace(ptr, bytes);
    return PS_OK;
  });
}

int host_unregister(ps_device_ctx* raw, void* ptr) {
  return guarded([&]() -> int {
    SIM_REQUIRE(raw != nullptr && ptr != nullptr, "host_unregister: NULL argument");
    Context* ctx = as_ctx(raw);
    size_t bytes;
    {
      std::lock_guard lock(ctx->mu);
      auto it = ctx->registered.find(ptr);
      if (it == ctx->registered.end())
        return fail(PS_ERR_UNKNOWN_POINTER, "sim: host_unregister of an unregistered pointer");
      bytes = it->second;
      ctx->registered.erase(it);
    }
    munlock(ptr, bytes);
    return PS_OK;
  });
}

int mem_info(ps_device_ctx* raw, uint64_t* capacity, uint64_t* committed) {
  return guarded([&]() -> int {
    SIM_REQUIRE(raw != nullptr && capacity != nullptr && committed != nullptr,
                "mem_info: NULL argument");
    Context* ctx = as_ctx(raw);
    std::lock_guard lock(ctx->mu);
    *capacity = ctx->capacity;
    *committed = ctx->committed;
    return PS_OK;
  });
}

int get_capabilities(ps_device_ctx* raw, ps_capabilities* out) {
  return guarded([&]() -> int {
    SIM_REQUIRE(raw != nullptr && out != nullptr, "get_capabilities: NULL argument");
    Context* ctx = as_ctx(raw);
    out->pinned_is_page_locked = ctx->lock_refused.load() ? 0 : 1;
    out->async_copy = 1;
    out->host_register = 1;
    out->execute = 1;
    out->device_memory_is_host = 1;
    return PS_OK;
  });
}

int execute(ps_device_ctx* raw, const char* callable, const ps_exec_arg* args, size_t n_args) {
  return guarded([&]() -> int {
    SIM_REQUIRE(raw != nullptr && callable != nullptr, "execute: NULL argument");
    SIM_REQUIRE(args != nullptr || n_args == 0, "execute: args is NULL");
    Context* ctx = as_ctx(raw);
    if (int s = fault(ctx, PS_FAULT_EXECUTE)) return s;
    for (size_t i = 0; i < n_args; ++i) {
      SIM_REQUIRE(args[i].name != nullptr, "execute: argument without a name");
      if (args[i].bytes > 0 && !ctx->device_range_ok(args[i].device_ptr, args[i].bytes))
        return fail(PS_ERR_INVALID_ARGUMENT, std::string("sim: execute: argument '") +
                                                 args[i].name + "' is not device memory");
    }
    std::string error;
    const int status = run_callable(callable, args, n_args, &error);
    if (status != PS_OK) return fail(status, error);
    return PS_OK;
  });
}

int inject_fault(ps_device_ctx* raw, int kind, uint64_t nth) {
  return guarded([&]() -> int {
    SIM_REQUIRE(raw != nullptr, "inject_fault: ctx is NULL");
    SIM_REQUIRE(kind >= 0 && kind < PS_FAULT_KIND_COUNT,
                "inject_fault: unknown fault kind " + std::to_string(kind));
    as_ctx(raw)->faults[kind].store(nth);
    return PS_OK;
  });
}

const ps_platform_api kApi = {
    PINSTAGE_PLATFORM_API_VERSION,
    "sim",
    last_error,
    create_context,
    destroy_context,
    device_malloc,
    device_free,
    copy_h2d,
    copy_d2h,
    stream_create,
    stream_destroy,
    stream_sync,
    copy_h2d_async,
    copy_d2h_async,
    event_create,
    event_destroy,
    event_record,
    event_sync,
    host_alloc_pinned,
    host_free_pinned,
    host_register,
    host_unregister,
    mem_info,
    get_capabilities,
    execute,
    inject_fault,
};

}  // namespace
}  // namespace pinstage::sim

extern "C" PINSTAGE_API const ps_platform_api* pinstage_platform_entry(void) {
  return &pinstage::sim::kApi;
}
