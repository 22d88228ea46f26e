// The cuda platform backend: the platform ABI (pinstage/platform_abi.h) on the CUDA
// runtime API. Host C++ only, no kernels. See docs/cuda.md.
//
// Note [Two pinned modes]
// ~~~~~~~~~~~~~~~~~~~~~~~
// host_alloc_pinned page-locks memory one of two ways, chosen per request by size
// (pinned_mode=auto, register_threshold_mb) or forced (pinned_mode=alloc|register):
//  - alloc: cudaHostAlloc(cudaHostAllocPortable). Never write-combined: the host reads
//    these buffers back to check results, and WC reads are uncached and very slow.
//  - register: mmap anonymous memory, pre-fault every page from several threads (page
//    faults are kernel work that scales with cores), then one cudaHostRegister(portable)
//    over the resident range. cudaHostAlloc faults and locks inside one driver call,
//    serially, which is what makes large pinned buffers slow to create.
// The context keeps ptr -> (mode, mapping) so each buffer is released the way it was
// made: cudaFreeHost, or cudaHostUnregister then munmap. A pointer not in that table is
// PS_ERR_UNKNOWN_POINTER. Both modes are portable, so any context may copy from them.
//
// Note [Device per call]
// ~~~~~~~~~~~~~~~~~~~~~~
// Every slot that touches the device first calls cudaSetDevice(ctx->device) on the
// calling thread: a worker may be driven from any thread, whose current device is
// whatever that thread last set (device 0 on a fresh thread). The previous device is
// not restored; the calling thread is left on the worker's device.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "backends/cuda/cuda_config.h"
#include "backends/cuda/cuda_ext.h"
#include "backends/cuda/cuda_status.h"
#include "backends/cuda/host_pages.h"
#include "pinstage/export.h"
#include "pinstage/log.h"
#include "pinstage/platform_abi.h"

using pinstage::cuda::CudaConfig;
using pinstage::cuda::MappedPages;
using pinstage::cuda::PinnedMode;

struct ps_stream {
  cudaStream_t stream = nullptr;
};

struct ps_event {
  cudaEvent_t event = nullptr;
};

namespace {

// One pinned host buffer and how it was made.
struct HostBlock {
  PinnedMode mode = PinnedMode::alloc;
  size_t bytes = 0;   // as requested
  MappedPages pages;  // register mode only
};

}  // namespace

struct ps_device_ctx {
  int device = 0;
  CudaConfig config;
  uint64_t capacity = 0;
  cudaStream_t stream = nullptr;  // the synchronous copies run on this

  std::mutex mu;  // guards everything below
  std::map<uintptr_t, size_t> device_allocs;
  uint64_t committed = 0;  // includes reservations of cudaMalloc calls in flight
  std::unordered_map<void*, HostBlock> host_blocks;
  std::unordered_map<void*, size_t> registered;  // host_register'ed caller memory
  std::unordered_set<ps_stream*> streams;
  std::unordered_set<ps_event*> events;
  std::array<uint64_t, PS_FAULT_KIND_COUNT> fault_countdown{};
  ps_cuda_pin_stats pin_stats{};
};

namespace {

thread_local std::string t_last_error;

// A slot's failure: thrown inside a slot, turned into a status at its boundary.
struct Failure {
  ps_status status;
  std::string message;
};

[[noreturn]] void fail(ps_status status, std::string message) {
  throw Failure{status, std::move(message)};
}

void set_last_error(const char* message, const char* detail = "") noexcept {
  try {
    t_last_error = message;
    t_last_error += detail;
  } catch (...) {
    t_last_error.clear();  // no memory for the text: an empty message beats none
  }
}

// Runs a slot body; nothing unwinds through the C ABI.
template <class Body>
int guarded(Body&& body) noexcept {
  try {
    body();
    return PS_OK;
  } catch (const Failure& f) {
    set_last_error(f.message.c_str());
    return f.status;
  } catch (const std::bad_alloc&) {
    set_last_error("host memory exhausted inside the cuda backend");
    return PS_ERR_OUT_OF_MEMORY;
  } catch (const std::exception& e) {
    set_last_error("internal error in the cuda backend: ", e.what());
    return PS_ERR_INTERNAL;
  } catch (...) {
    set_last_error("internal error in the cuda backend: unknown exception");
    return PS_ERR_INTERNAL;
  }
}

std::string dev_name(const ps_device_ctx* ctx) { return "device " + std::to_string(ctx->device); }

// Fails with the CUDA error's status and text unless `error` is cudaSuccess. `what`
// names the call: a string, or (on hot paths) a callable returning one, so the text is
// built only on failure.
template <class What>
void check(cudaError_t error, What&& what, ps_status fallback = PS_ERR_BACKEND) {
  if (error == cudaSuccess) return;
  (void)cudaGetLastError();  // clear the runtime's non-sticky error state
  std::string text;
  if constexpr (std::is_invocable_v<What>)
    text = what();
  else
    text = what;
  fail(pinstage::cuda::status_from_cuda(error, fallback),
       text + ": " + pinstage::cuda::cuda_error_text(error));
}

void require(bool ok, const char* message) {
  if (!ok) fail(PS_ERR_INVALID_ARGUMENT, message);
}

ps_device_ctx* require_ctx(ps_device_ctx* ctx) {
  require(ctx != nullptr, "device context is NULL");
  return ctx;
}

// Note [Device per call].
void use_device(const ps_device_ctx* ctx) {
  check(
      cudaSetDevice(ctx->device),
      [ctx] { return "cudaSetDevice(" + std::to_string(ctx->device) + ")"; }, PS_ERR_NO_DEVICE);
}

// The fault hook: fails the nth call of `kind` once.
void maybe_fault(ps_device_ctx* ctx, ps_fault_kind kind, const char* what) {
  std::lock_guard lock(ctx->mu);
  uint64_t& left = ctx->fault_countdown[kind];
  if (left == 0) return;
  if (--left == 0) fail(PS_ERR_INJECTED_FAULT, std::string("injected fault: ") + what);
}

ps_stream* require_stream(ps_device_ctx* ctx, ps_stream* stream) {
  require(stream != nullptr, "stream is NULL");
  std::lock_guard lock(ctx->mu);
  require(ctx->streams.count(stream) != 0, "stream was not created by this cuda context");
  return stream;
}

ps_event* require_event(ps_device_ctx* ctx, ps_event* event) {
  require(event != nullptr, "event is NULL");
  std::lock_guard lock(ctx->mu);
  require(ctx->events.count(event) != 0, "event was not created by this cuda context");
  return event;
}

// [ptr, ptr + bytes) must lie inside one device allocation of this context.
void require_device_range(ps_device_ctx* ctx, const void* ptr, size_t bytes, const char* what) {
  const auto addr = reinterpret_cast<uintptr_t>(ptr);
  std::lock_guard lock(ctx->mu);
  auto it = ctx->device_allocs.upper_bound(addr);
  bool inside = false;
  if (it != ctx->device_allocs.begin()) {
    --it;
    const uintptr_t offset = addr - it->first;
    inside = offset < it->second && bytes <= it->second - offset;
  }
  if (!inside)
    fail(PS_ERR_INVALID_ARGUMENT, std::string(what) + ": " + std::to_string(bytes) +
                                      " bytes at the device address are not inside one device "
                                      "allocation of this cuda context");
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

std::string fmt(const char* format, double value) {
  char buf[64];
  std::snprintf(buf, sizeof buf, format, value);
  return buf;
}

void log_pinning(const ps_device_ctx* ctx, const ps_cuda_pin_stats& s) {
  if (pinstage::log_level() > pinstage::LogLevel::info) return;
  const double mib = static_cast<double>(s.last_bytes) / (1 << 20);
  std::string line = "cuda: pinned " + fmt("%.1f", mib) + " MiB for " + dev_name(ctx) + " by " +
                     (s.last_mode == PS_CUDA_PIN_REGISTER ? "register" : "cudaHostAlloc") + " in " +
                     fmt("%.3f", s.last_seconds) + " s (" +
                     fmt("%.2f", mib / 1024 / std::max(s.last_seconds, 1e-9)) + " GiB/s)";
  if (s.last_mode == PS_CUDA_PIN_REGISTER)
    line += ": pre-fault " + fmt("%.3f", s.last_prefault_seconds) + " s on " +
            std::to_string(s.last_prefault_threads) + " thread(s)" +
            (s.last_populate_write ? " (MADV_POPULATE_WRITE)" : " (touch)") +
            ", cudaHostRegister " + fmt("%.3f", s.last_register_seconds) + " s";
  pinstage::log(pinstage::LogLevel::info, line);
}

// Releases one pinned block the way it was made; returns the time it took.
double release_block(const ps_device_ctx* ctx, void* ptr, const HostBlock& block) {
  const auto t0 = std::chrono::steady_clock::now();
  if (block.mode == PinnedMode::reg) {
    check(cudaHostUnregister(ptr), "cudaHostUnregister of a " + std::to_string(block.bytes) +
                                       " byte pinned buffer on " + dev_name(ctx));
    std::string error;
    if (!pinstage::cuda::unmap_pages(block.pages, error)) fail(PS_ERR_BACKEND, error);
  } else {
    check(cudaFreeHost(ptr), "cudaFreeHost of a " + std::to_string(block.bytes) +
                                 " byte pinned buffer on " + dev_name(ctx));
  }
  return seconds_since(t0);
}

// ---- slots ----

const char* cuda_last_error() { return t_last_error.c_str(); }

int cuda_create_context(int device_id, const ps_context_options* options, ps_device_ctx** out) {
  return guarded([&] {
    require(out != nullptr, "create_context: output pointer is NULL");
    *out = nullptr;
    if (device_id < 0)
      fail(PS_ERR_INVALID_ARGUMENT, "device id must be >= 0, got " + std::to_string(device_id));
    CudaConfig config;
    if (options != nullptr && options->config != nullptr) {
      std::string error;
      if (!pinstage::cuda::parse_config(options->config, config, error))
        fail(PS_ERR_INVALID_ARGUMENT, error);
    }
    int count = 0;
    const cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess) {
      (void)cudaGetLastError();
      fail(PS_ERR_NO_DEVICE, "cudaGetDeviceCount: " + pinstage::cuda::cuda_error_text(err) +
                                 ": no usable NVIDIA GPU or driver here (check nvidia-smi, or "
                                 "use the sim backend)");
    }
    if (count == 0)
      fail(PS_ERR_NO_DEVICE, "cudaGetDeviceCount: no CUDA-capable device is detected");
    if (device_id >= count)
      fail(PS_ERR_NO_DEVICE, "CUDA device " + std::to_string(device_id) + " does not exist: " +
                                 std::to_string(count) + " device(s) visible (ids 0.." +
                                 std::to_string(count - 1) + "; see CUDA_VISIBLE_DEVICES)");

    auto ctx = std::make_unique<ps_device_ctx>();
    ctx->device = device_id;
    ctx->config = config;
    use_device(ctx.get());
    size_t free_bytes = 0, total_bytes = 0;
    check(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo on " + dev_name(ctx.get()));
    const uint64_t requested = options != nullptr ? options->device_capacity_bytes : 0;
    ctx->capacity = requested == 0 ? total_bytes : std::min<uint64_t>(requested, total_bytes);
    check(cudaStreamCreateWithFlags(&ctx->stream, cudaStreamNonBlocking),
          "cudaStreamCreateWithFlags on " + dev_name(ctx.get()));
    if (pinstage::log_level() <= pinstage::LogLevel::info) {
      cudaDeviceProp prop{};
      if (cudaGetDeviceProperties(&prop, device_id) == cudaSuccess)
        pinstage::log(
            pinstage::LogLevel::info,
            "cuda: " + dev_name(ctx.get()) + " is " + prop.name + ", " +
                std::to_string(total_bytes >> 20) + " MiB (" + std::to_string(free_bytes >> 20) +
                " free), capacity " + std::to_string(ctx->capacity >> 20) +
                " MiB, pinned_mode=" + pinstage::cuda::pinned_mode_name(config.pinned_mode));
      (void)cudaGetLastError();
    }
    *out = ctx.release();
  });
}

int cuda_destroy_context(ps_device_ctx* ctx) {
  return guarded([&] {
    require_ctx(ctx);
    std::unique_ptr<ps_device_ctx> owned(ctx);
    // Best effort throughout: release everything, report the first failure.
    std::string first_error;
    ps_status first_status = PS_OK;
    auto note = [&](cudaError_t err, const std::string& what) {
      if (err == cudaSuccess || first_status != PS_OK) return;
      first_status = pinstage::cuda::status_from_cuda(err, PS_ERR_BACKEND);
      first_error = what + ": " + pinstage::cuda::cuda_error_text(err);
    };
    note(cudaSetDevice(ctx->device), "cudaSetDevice(" + std::to_string(ctx->device) + ")");
    if (ctx->stream != nullptr) note(cudaStreamSynchronize(ctx->stream), "cudaStreamSynchronize");
    for (ps_stream* s : ctx->streams) {
      note(cudaStreamSynchronize(s->stream), "cudaStreamSynchronize");
      note(cudaStreamDestroy(s->stream), "cudaStreamDestroy");
      delete s;
    }
    for (ps_event* e : ctx->events) {
      note(cudaEventDestroy(e->event), "cudaEventDestroy");
      delete e;
    }
    for (const auto& [addr, bytes] : ctx->device_allocs)
      note(cudaFree(reinterpret_cast<void*>(addr)), "cudaFree");
    for (const auto& [ptr, block] : ctx->host_blocks) {
      try {
        release_block(ctx, ptr, block);
      } catch (const Failure& f) {
        if (first_status == PS_OK) {
          first_status = f.status;
          first_error = f.message;
        }
      }
    }
    for (const auto& [ptr, bytes] : ctx->registered)
      note(cudaHostUnregister(ptr), "cudaHostUnregister");
    if (ctx->stream != nullptr) note(cudaStreamDestroy(ctx->stream), "cudaStreamDestroy");
    (void)cudaGetLastError();
    if (first_status != PS_OK)
      fail(first_status, "destroying the cuda context of " + dev_name(ctx) + ": " + first_error);
  });
}

int cuda_device_malloc(ps_device_ctx* ctx, size_t bytes, void** out) {
  return guarded([&] {
    require_ctx(ctx);
    require(out != nullptr, "device_malloc: output pointer is NULL");
    *out = nullptr;
    require(bytes > 0, "device_malloc: cannot allocate 0 bytes");
    maybe_fault(ctx, PS_FAULT_DEVICE_MALLOC, "device_malloc");
    use_device(ctx);
    {
      // Reserve first so concurrent requests cannot both pass the capacity check.
      std::lock_guard lock(ctx->mu);
      if (bytes > ctx->capacity - ctx->committed)
        fail(PS_ERR_OUT_OF_MEMORY,
             "device_malloc of " + std::to_string(bytes) + " bytes on " + dev_name(ctx) +
                 " exceeds the capacity: " + std::to_string(ctx->committed) + " of " +
                 std::to_string(ctx->capacity) + " bytes already committed");
      ctx->committed += bytes;
    }
    auto unreserve = [&] {
      std::lock_guard lock(ctx->mu);
      ctx->committed -= bytes;
    };
    void* ptr = nullptr;
    const cudaError_t err = cudaMalloc(&ptr, bytes);
    if (err != cudaSuccess) {
      unreserve();
      check(err, "cudaMalloc of " + std::to_string(bytes) + " bytes on " + dev_name(ctx));
    }
    try {
      std::lock_guard lock(ctx->mu);
      ctx->device_allocs.emplace(reinterpret_cast<uintptr_t>(ptr), bytes);
    } catch (...) {
      (void)cudaFree(ptr);
      unreserve();
      throw;
    }
    *out = ptr;
  });
}

int cuda_device_free(ps_device_ctx* ctx, void* ptr) {
  return guarded([&] {
    require_ctx(ctx);
    require(ptr != nullptr, "device_free: pointer is NULL");
    maybe_fault(ctx, PS_FAULT_DEVICE_FREE, "device_free");
    use_device(ctx);
    size_t bytes = 0;
    {
      std::lock_guard lock(ctx->mu);
      auto it = ctx->device_allocs.find(reinterpret_cast<uintptr_t>(ptr));
      if (it == ctx->device_allocs.end())
        fail(PS_ERR_UNKNOWN_POINTER,
             "device_free: the pointer was not allocated by device_malloc of this cuda context");
      bytes = it->second;
      ctx->device_allocs.erase(it);
    }
    const cudaError_t err = cudaFree(ptr);
    std::lock_guard lock(ctx->mu);
    if (err != cudaSuccess) {
      ctx->device_allocs.emplace(reinterpret_cast<uintptr_t>(ptr), bytes);  // still owned
      check(err, "cudaFree of " + std::to_string(bytes) + " bytes on " + dev_name(ctx));
    }
    ctx->committed -= bytes;
  });
}

// One copy, synchronous when `stream` is null (on the context's own stream).
int do_copy(ps_device_ctx* ctx, void* dst, const void* src, size_t bytes, ps_stream* stream,
            bool to_device) {
  const char* what = to_device ? "host-to-device copy" : "device-to-host copy";
  return guarded([&] {
    require_ctx(ctx);
    require(dst != nullptr && src != nullptr, to_device ? "host-to-device copy: a pointer is NULL"
                                                        : "device-to-host copy: a pointer is NULL");
    cudaStream_t s = stream != nullptr ? require_stream(ctx, stream)->stream : ctx->stream;
    if (bytes == 0) return;
    maybe_fault(ctx, to_device ? PS_FAULT_COPY_H2D : PS_FAULT_COPY_D2H, what);
    require_device_range(ctx, to_device ? dst : src, bytes, what);
    use_device(ctx);
    const auto kind = to_device ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost;
    auto desc = [&] {
      return std::string(what) + " of " + std::to_string(bytes) + " bytes on " + dev_name(ctx);
    };
    check(
        cudaMemcpyAsync(dst, src, bytes, kind, s), [&] { return "cudaMemcpyAsync " + desc(); },
        PS_ERR_COPY_FAILED);
    if (stream == nullptr)
      check(
          cudaStreamSynchronize(s), [&] { return "cudaStreamSynchronize after " + desc(); },
          PS_ERR_COPY_FAILED);
  });
}

int cuda_copy_h2d(ps_device_ctx* ctx, void* dst, const void* src, size_t bytes) {
  return do_copy(ctx, dst, src, bytes, nullptr, true);
}

int cuda_copy_d2h(ps_device_ctx* ctx, void* dst, const void* src, size_t bytes) {
  return do_copy(ctx, dst, src, bytes, nullptr, false);
}

int cuda_copy_h2d_async(ps_device_ctx* ctx, void* dst, const void* src, size_t bytes,
                        ps_stream* stream) {
  if (stream == nullptr) {
    set_last_error("host-to-device async copy: stream is NULL");
    return PS_ERR_INVALID_ARGUMENT;
  }
  return do_copy(ctx, dst, src, bytes, stream, true);
}

int cuda_copy_d2h_async(ps_device_ctx* ctx, void* dst, const void* src, size_t bytes,
                        ps_stream* stream) {
  if (stream == nullptr) {
    set_last_error("device-to-host async copy: stream is NULL");
    return PS_ERR_INVALID_ARGUMENT;
  }
  return do_copy(ctx, dst, src, bytes, stream, false);
}

int cuda_stream_create(ps_device_ctx* ctx, ps_stream** out) {
  return guarded([&] {
    require_ctx(ctx);
    require(out != nullptr, "stream_create: output pointer is NULL");
    *out = nullptr;
    use_device(ctx);
    auto s = std::make_unique<ps_stream>();
    check(cudaStreamCreateWithFlags(&s->stream, cudaStreamNonBlocking),
          "cudaStreamCreateWithFlags on " + dev_name(ctx));
    try {
      std::lock_guard lock(ctx->mu);
      ctx->streams.insert(s.get());
    } catch (...) {
      (void)cudaStreamDestroy(s->stream);
      throw;
    }
    *out = s.release();
  });
}

int cuda_stream_destroy(ps_device_ctx* ctx, ps_stream* stream) {
  return guarded([&] {
    require_ctx(ctx);
    require_stream(ctx, stream);
    use_device(ctx);
    {
      std::lock_guard lock(ctx->mu);
      ctx->streams.erase(stream);
    }
    std::unique_ptr<ps_stream> owned(stream);
    // Work still queued completes first; the runtime releases the stream after it.
    check(cudaStreamDestroy(stream->stream), "cudaStreamDestroy on " + dev_name(ctx));
  });
}

int cuda_stream_sync(ps_device_ctx* ctx, ps_stream* stream) {
  return guarded([&] {
    require_ctx(ctx);
    require_stream(ctx, stream);
    use_device(ctx);
    check(
        cudaStreamSynchronize(stream->stream),
        [ctx] { return "cudaStreamSynchronize on " + dev_name(ctx); }, PS_ERR_COPY_FAILED);
  });
}

int cuda_event_create(ps_device_ctx* ctx, ps_event** out) {
  return guarded([&] {
    require_ctx(ctx);
    require(out != nullptr, "event_create: output pointer is NULL");
    *out = nullptr;
    use_device(ctx);
    auto e = std::make_unique<ps_event>();
    // Timing off: these events only order work, and untimed events are cheaper.
    check(cudaEventCreateWithFlags(&e->event, cudaEventDisableTiming),
          "cudaEventCreateWithFlags on " + dev_name(ctx));
    try {
      std::lock_guard lock(ctx->mu);
      ctx->events.insert(e.get());
    } catch (...) {
      (void)cudaEventDestroy(e->event);
      throw;
    }
    *out = e.release();
  });
}

int cuda_event_destroy(ps_device_ctx* ctx, ps_event* event) {
  return guarded([&] {
    require_ctx(ctx);
    require_event(ctx, event);
    use_device(ctx);
    {
      std::lock_guard lock(ctx->mu);
      ctx->events.erase(event);
    }
    std::unique_ptr<ps_event> owned(event);
    check(cudaEventDestroy(event->event), "cudaEventDestroy on " + dev_name(ctx));
  });
}

int cuda_event_record(ps_device_ctx* ctx, ps_event* event, ps_stream* stream) {
  return guarded([&] {
    require_ctx(ctx);
    require_event(ctx, event);
    require_stream(ctx, stream);
    use_device(ctx);
    check(cudaEventRecord(event->event, stream->stream),
          [ctx] { return "cudaEventRecord on " + dev_name(ctx); });
  });
}

int cuda_event_sync(ps_device_ctx* ctx, ps_event* event) {
  return guarded([&] {
    require_ctx(ctx);
    require_event(ctx, event);
    use_device(ctx);
    check(
        cudaEventSynchronize(event->event),
        [ctx] { return "cudaEventSynchronize on " + dev_name(ctx); }, PS_ERR_COPY_FAILED);
  });
}

int cuda_host_alloc_pinned(ps_device_ctx* ctx, size_t bytes, void** out) {
  return guarded([&] {
    require_ctx(ctx);
    require(out != nullptr, "host_alloc_pinned: output pointer is NULL");
    *out = nullptr;
    require(bytes > 0, "host_alloc_pinned: cannot allocate 0 bytes");
    maybe_fault(ctx, PS_FAULT_HOST_ALLOC, "host_alloc_pinned");
    use_device(ctx);
    const PinnedMode mode = pinstage::cuda::choose_pinned_mode(ctx->config, bytes);
    const std::string desc = "pinning " + std::to_string(bytes) + " bytes for " + dev_name(ctx);
    ps_cuda_pin_stats last{};
    last.last_bytes = bytes;
    const auto t0 = std::chrono::steady_clock::now();
    HostBlock block;
    block.mode = mode;
    block.bytes = bytes;
    void* ptr = nullptr;
    if (mode == PinnedMode::alloc) {
      last.last_mode = PS_CUDA_PIN_ALLOC;
      // Portable, and deliberately not write-combined (Note [Two pinned modes]).
      check(cudaHostAlloc(&ptr, bytes, cudaHostAllocPortable), "cudaHostAlloc " + desc);
    } else {
      last.last_mode = PS_CUDA_PIN_REGISTER;
      pinstage::cuda::HostPagesOptions opts{ctx->config.prefault_threads, ctx->config.register_thp};
      pinstage::cuda::PrefaultReport report;
      std::string error;
      const auto status = pinstage::cuda::map_prefaulted(bytes, opts, block.pages, report, error);
      if (status != pinstage::cuda::PagesStatus::ok)
        fail(status == pinstage::cuda::PagesStatus::out_of_memory ? PS_ERR_OUT_OF_MEMORY
                                                                  : PS_ERR_BACKEND,
             desc + " (register mode): " + error);
      last.last_map_seconds = report.map_seconds;
      last.last_prefault_seconds = report.prefault_seconds;
      last.last_prefault_threads = report.threads;
      last.last_populate_write = report.populate_write ? 1 : 0;
      const auto t1 = std::chrono::steady_clock::now();
      const cudaError_t err =
          cudaHostRegister(block.pages.data, block.pages.bytes, cudaHostRegisterPortable);
      if (err != cudaSuccess) {
        std::string ignored;
        pinstage::cuda::unmap_pages(block.pages, ignored);
        check(err, "cudaHostRegister " + desc);
      }
      last.last_register_seconds = seconds_since(t1);
      ptr = block.pages.data;
    }
    last.last_seconds = seconds_since(t0);
    ps_cuda_pin_stats snapshot;
    try {
      std::lock_guard lock(ctx->mu);
      ctx->host_blocks.emplace(ptr, block);
      ps_cuda_pin_stats& s = ctx->pin_stats;
      if (mode == PinnedMode::alloc) {
        ++s.alloc_count;
        s.alloc_bytes += bytes;
        s.alloc_seconds += last.last_seconds;
      } else {
        ++s.register_count;
        s.register_bytes += bytes;
        s.register_seconds += last.last_seconds;
      }
      s.last_mode = last.last_mode;
      s.last_bytes = last.last_bytes;
      s.last_seconds = last.last_seconds;
      s.last_map_seconds = last.last_map_seconds;
      s.last_prefault_seconds = last.last_prefault_seconds;
      s.last_register_seconds = last.last_register_seconds;
      s.last_prefault_threads = last.last_prefault_threads;
      s.last_populate_write = last.last_populate_write;
      snapshot = s;
    } catch (...) {
      try {
        release_block(ctx, ptr, block);
      } catch (...) {
      }
      throw;
    }
    log_pinning(ctx, snapshot);
    *out = ptr;
  });
}

int cuda_host_free_pinned(ps_device_ctx* ctx, void* ptr) {
  return guarded([&] {
    require_ctx(ctx);
    require(ptr != nullptr, "host_free_pinned: pointer is NULL");
    maybe_fault(ctx, PS_FAULT_HOST_FREE, "host_free_pinned");
    use_device(ctx);
    HostBlock block;
    {
      std::lock_guard lock(ctx->mu);
      auto it = ctx->host_blocks.find(ptr);
      if (it == ctx->host_blocks.end())
        fail(PS_ERR_UNKNOWN_POINTER,
             "host_free_pinned: the pointer was not allocated by host_alloc_pinned of this cuda "
             "context");
      block = it->second;
      ctx->host_blocks.erase(it);
    }
    double seconds = 0;
    try {
      seconds = release_block(ctx, ptr, block);
    } catch (...) {
      std::lock_guard lock(ctx->mu);
      ctx->host_blocks.emplace(ptr, block);  // still owned: destroy_context retries
      throw;
    }
    std::lock_guard lock(ctx->mu);
    (block.mode == PinnedMode::reg ? ctx->pin_stats.register_free_seconds
                                   : ctx->pin_stats.alloc_free_seconds) += seconds;
  });
}

int cuda_host_register(ps_device_ctx* ctx, void* ptr, size_t bytes) {
  return guarded([&] {
    require_ctx(ctx);
    require(ptr != nullptr, "host_register: pointer is NULL");
    require(bytes > 0, "host_register: cannot register 0 bytes");
    use_device(ctx);
    {
      std::lock_guard lock(ctx->mu);
      require(ctx->registered.count(ptr) == 0 && ctx->host_blocks.count(ptr) == 0,
              "host_register: this memory is already page-locked by this cuda context");
    }
    check(cudaHostRegister(ptr, bytes, cudaHostRegisterPortable),
          "cudaHostRegister of " + std::to_string(bytes) + " bytes for " + dev_name(ctx));
    try {
      std::lock_guard lock(ctx->mu);
      ctx->registered.emplace(ptr, bytes);
    } catch (...) {
      (void)cudaHostUnregister(ptr);
      throw;
    }
  });
}

int cuda_host_unregister(ps_device_ctx* ctx, void* ptr) {
  return guarded([&] {
    require_ctx(ctx);
    require(ptr != nullptr, "host_unregister: pointer is NULL");
    use_device(ctx);
    size_t bytes = 0;
    {
      std::lock_guard lock(ctx->mu);
      auto it = ctx->registered.find(ptr);
      if (it == ctx->registered.end())
        fail(PS_ERR_UNKNOWN_POINTER,
             "host_unregister: the pointer was not registered by host_register of this cuda "
             "context");
      bytes = it->second;
      ctx->registered.erase(it);
    }
    const cudaError_t err = cudaHostUnregister(ptr);
    if (err != cudaSuccess) {
      std::lock_guard lock(ctx->mu);
      ctx->registered.emplace(ptr, bytes);
      check(err, "cudaHostUnregister on " + dev_name(ctx));
    }
  });
}

int cuda_mem_info(ps_device_ctx* ctx, uint64_t* capacity, uint64_t* committed) {
  return guarded([&] {
    require_ctx(ctx);
    require(capacity != nullptr && committed != nullptr, "mem_info: an output pointer is NULL");
    std::lock_guard lock(ctx->mu);
    *capacity = ctx->capacity;
    *committed = ctx->committed;
  });
}

int cuda_get_capabilities(ps_device_ctx* ctx, ps_capabilities* out) {
  return guarded([&] {
    require_ctx(ctx);
    require(out != nullptr, "get_capabilities: output pointer is NULL");
    *out = ps_capabilities{1, 1, 1, 0, 0};
  });
}

int cuda_inject_fault(ps_device_ctx* ctx, int kind, uint64_t nth) {
  return guarded([&] {
    require_ctx(ctx);
    if (kind < 0 || kind >= PS_FAULT_KIND_COUNT)
      fail(PS_ERR_INVALID_ARGUMENT, "inject_fault: unknown fault kind " + std::to_string(kind));
    std::lock_guard lock(ctx->mu);
    ctx->fault_countdown[kind] = nth;
  });
}

constexpr ps_platform_api kApi = {
    .api_version = PINSTAGE_PLATFORM_API_VERSION,
    .name = "cuda",
    .last_error = cuda_last_error,
    .create_context = cuda_create_context,
    .destroy_context = cuda_destroy_context,
    .device_malloc = cuda_device_malloc,
    .device_free = cuda_device_free,
    .copy_h2d = cuda_copy_h2d,
    .copy_d2h = cuda_copy_d2h,
    .stream_create = cuda_stream_create,
    .stream_destroy = cuda_stream_destroy,
    .stream_sync = cuda_stream_sync,
    .copy_h2d_async = cuda_copy_h2d_async,
    .copy_d2h_async = cuda_copy_d2h_async,
    .event_create = cuda_event_create,
    .event_destroy = cuda_event_destroy,
    .event_record = cuda_event_record,
    .event_sync = cuda_event_sync,
    .host_alloc_pinned = cuda_host_alloc_pinned,
    .host_free_pinned = cuda_host_free_pinned,
    .host_register = cuda_host_register,
    .host_unregister = cuda_host_unregister,
    .mem_info = cuda_mem_info,
    .get_capabilities = cuda_get_capabilities,
    .execute = nullptr,  // no callables: the cuda backend only stages data
    .inject_fault = cuda_inject_fault,
};

}  // namespace

extern "C" PINSTAGE_API const ps_platform_api* pinstage_platform_entry(void) { return &kApi; }

extern "C" PINSTAGE_API int pinstage_cuda_pin_stats(ps_device_ctx* ctx, ps_cuda_pin_stats* out) {
  return guarded([&] {
    require_ctx(ctx);
    require(out != nullptr, "pin_stats: output pointer is NULL");
    std::lock_guard lock(ctx->mu);
    *out = ctx->pin_stats;
  });
}
