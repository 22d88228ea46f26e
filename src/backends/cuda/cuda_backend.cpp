// The cuda platform backend: the platform ABI (pinstage/backend/platform_abi.h) on the
// CUDA runtime API. Host C++ only, no kernels. See docs/cuda.md.
//
// Note [Pinning the runtime's memory]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The runtime makes, places and faults host memory (docs/worker.md, "Host sources"); this
// plugin pins it. host_register is cudaHostRegister(portable) over the range in pieces of
// at most register_chunk_mb (64 GiB: one registration of 512 GiB or more fails on current
// drivers, and a huge one holds driver locks for seconds), with cudaHostRegisterReadOnly for
// a read-only range (a checkpoint's page cache). Some platforms cannot register read-only
// memory at all (cudaDevAttrHostRegisterReadOnlySupported = 0, a B300 with CUDA 13.4: error
// 801 with the flag, cudaErrorInvalidValue without it), so create_context reads the
// attribute and a read-only host_register there is PS_ERR_UNSUPPORTED at once; the runtime
// then pins a private copy (file_private) with the default flags. host_alloc_pinned, the
// vendor source the runtime takes only where it cannot pin its own memory, is
// cudaHostAlloc(portable), never write-combined: the host reads these buffers back to
// check results, and WC reads are uncached and very slow.

// Note [Device per call]
// ~~~~~~~~~~~~~~~~~~~~~~
// Every slot that touches the device runs in a SlotScope: it makes the worker's device
// current on the calling thread (a worker may be driven from any thread, whose current
// device is whatever that thread last set) and restores the thread's previous device on
// the way out, so a pinstage call never moves the current device of a thread that also
// uses CUDA itself (PyTorch). cudaSetDevice runs only when the devices differ.
//
// Note [Streams of synchronous copies]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// copy_h2d/copy_d2h borrow a stream from the context's pool for the one copy and give it
// back after the synchronize; the pool grows to the number of synchronous copies ever in
// flight at once. So concurrent synchronous copies of one context (an upload on one
// thread, a download on another) run on streams of their own and may overlap, where one
// shared stream would serialize them.
//
// Note [Release waits for copies]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// cudaFreeHost and cudaHostUnregister do not wait for copies still queued on a stream
// (cudaFree does), and in register mode munmap would then return pages the copy engine
// still reads. So host_free_pinned and host_unregister first synchronize every stream of the
// context (the backend keeps a list of them for this alone; handles are still checked by the
// runtime's table). Copies of other contexts from a buffer are the caller's to finish.
//
// Note [Sticky errors]
// ~~~~~~~~~~~~~~~~~~~~
// Some CUDA errors (an illegal address, a failed launch, ...) leave the context
// unusable: every later call fails with the same error. After a failure the backend
// clears the runtime's error and peeks again (or knows the code as sticky); when the
// error is still there the context is marked unusable, and from then on every slot
// fails at once saying "the CUDA context is unusable" and which call broke it; releases
// are still attempted, and their messages say the same.
//
// Note [Devices without a context]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// device_count and device_props (ABI v6) list the devices without creating a context or
// making a device current: cudaGetDeviceCount, cudaGetDeviceProperties (name,
// totalGlobalMem; cudaMemGetInfo would need a context) and cudaDeviceGetPCIBusId, whose
// id is normalised to the form sysfs names devices by ("0000:3b:00.0"), so the host NUMA
// node is read from <sysfs_root>/bus/pci/devices/<id>/numa_node (-1 when missing or -1).
// A driver that is missing or sees no device fails device_count with PS_ERR_NO_DEVICE
// and create_context's text: list_devices then throws Error(no_device) saying why, where
// a count of 0 would leave its callers only "no usable device".
#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "backends/cuda/cuda_status.h"
#include "pinstage/backend/capacity.h"
#include "pinstage/backend/config.h"
#include "pinstage/backend/cuda_ext.h"
#include "pinstage/backend/device_slots.h"
#include "pinstage/backend/faults.h"
#include "pinstage/backend/pin_mode.h"
#include "pinstage/backend/platform_abi.h"
#include "pinstage/backend/slot.h"
#include "pinstage/clock.h"
#include "pinstage/error.h"
#include "pinstage/log.h"
#include "pinstage/pages.h"

using CudaConfig = pinstage::backend::PinConfig;  // the pinning keys (pin_mode.h)

struct ps_stream {
  cudaStream_t stream = nullptr;
};

struct ps_event {
  cudaEvent_t event = nullptr;
};

struct ps_device_ctx {
  int device = 0;
  CudaConfig config;
  pinstage::backend::CapacityLedger capacity;  // device memory (backend/capacity.h)

  std::mutex mu;                              // guards everything below up to streams_mu
  pinstage::backend::FaultCountdowns faults;  // the fault hook (backend/faults.h)
  ps_cuda_pin_stats pin_stats{};  // read_only_supported: Note [Pinning the runtime's memory]
  std::vector<cudaStream_t> idle_copy_streams;  // Note [Streams of synchronous copies]
  size_t copy_stream_count = 0;                 // made so far (idle or borrowed)
  std::string unusable;                         // Note [Sticky errors]: why, once set
  std::atomic<bool> is_unusable{false};

  // Note [Release waits for copies]: the context's streams. Shared while a release
  // synchronizes them, exclusive to add or remove one.
  std::shared_mutex streams_mu;
  std::vector<cudaStream_t> streams;
};

namespace {

// A range registered in pieces of chunk_bytes (the last shorter).
struct RegisteredRange {
  void* data = nullptr;
  size_t bytes = 0;
  size_t chunk_bytes = 0;
};

using pinstage::backend::fail;
using pinstage::backend::require;
namespace slots = pinstage::backend::slots;

thread_local pinstage::backend::LastError t_last_error;
// The context of the slot running on this thread (SlotScope), for check().
thread_local ps_device_ctx* t_ctx = nullptr;

constexpr const char* kUnusable = "the CUDA context is unusable";

// Runs a slot body: the one error style (pinstage/backend/slot.h), nothing unwinds
// through the C ABI.
template <class Body>
int guarded(Body&& body) noexcept {
  return pinstage::backend::guarded(t_last_error, "cuda", std::forward<Body>(body));
}

std::string dev_name(const ps_device_ctx* ctx) { return "device " + std::to_string(ctx->device); }

// What every message after a sticky error ends with.
std::string unusable_text(ps_device_ctx* ctx) {
  std::lock_guard lock(ctx->mu);
  return std::string("; ") + kUnusable + " (" + dev_name(ctx) + ", since " + ctx->unusable +
         "): finalize the worker and restart the process";
}

// Note [Sticky errors]: marks t_ctx unusable when `error` outlives clearing the
// runtime's error state; returns what the failure's message must add.
std::string note_failure(cudaError_t error, const std::string& text) {
  (void)cudaGetLastError();  // clear the runtime's non-sticky error state
  ps_device_ctx* ctx = t_ctx;
  if (ctx == nullptr) return "";
  if (pinstage::cuda::is_sticky(error) || cudaPeekAtLastError() != cudaSuccess) {
    std::lock_guard lock(ctx->mu);
    if (ctx->unusable.empty()) ctx->unusable = text;
    ctx->is_unusable = true;
  }
  return ctx->is_unusable ? unusable_text(ctx) : "";
}

// Fails with the CUDA error's status and text unless `error` is cudaSuccess. `what`
// names the call: a string, or (on hot paths) a callable returning one, so the text is
// built only on failure.
template <class What>
void check(cudaError_t error, What&& what, ps_status fallback = PS_ERR_BACKEND) {
  if (error == cudaSuccess) return;
  std::string text;
  if constexpr (std::is_invocable_v<What>)
    text = what();
  else
    text = what;
  text += ": " + pinstage::cuda::cuda_error_text(error);
  const std::string suffix = note_failure(error, text);
  fail(pinstage::cuda::status_from_cuda(error, fallback), text + suffix);
}

ps_device_ctx* require_ctx(ps_device_ctx* ctx) {
  require(ctx != nullptr, "device context is NULL");
  return ctx;
}

// Note [Device per call]: makes `device` current on this thread for the scope, then
// puts the thread's previous device back. `must`: a failed switch throws (else it is
// left to the CUDA calls that follow to fail, as releases want).
class DeviceSwitch {
 public:
  DeviceSwitch(int device, bool must) {
    int current = -1;
    const cudaError_t got = cudaGetDevice(&current);
    if (got == cudaSuccess && current == device) return;
    const cudaError_t set = cudaSetDevice(device);
    if (set == cudaSuccess) {
      restore_ = got == cudaSuccess ? current : -1;
    } else if (must) {
      check(
          set, [device] { return "cudaSetDevice(" + std::to_string(device) + ")"; },
          PS_ERR_NO_DEVICE);
    } else {
      (void)cudaGetLastError();
    }
  }
  DeviceSwitch(const DeviceSwitch&) = delete;
  DeviceSwitch& operator=(const DeviceSwitch&) = delete;
  ~DeviceSwitch() {
    if (restore_ >= 0 && cudaSetDevice(restore_) != cudaSuccess) (void)cudaGetLastError();
  }

 private:
  int restore_ = -1;
};

// Sets t_ctx for the scope.
struct CurrentCtx {
  explicit CurrentCtx(ps_device_ctx* ctx) { t_ctx = ctx; }
  CurrentCtx(const CurrentCtx&) = delete;
  CurrentCtx& operator=(const CurrentCtx&) = delete;
  ~CurrentCtx() { t_ctx = nullptr; }
};

// What every slot that touches the device runs in: the context checked (and, unless
// `release`, refused once unusable), the worker's device current until it ends.
class SlotScope {
 public:
  explicit SlotScope(ps_device_ctx* ctx, bool release = false)
      : current_(require_ctx(ctx)), device_(usable(ctx, release)->device, !release) {}

 private:
  static ps_device_ctx* usable(ps_device_ctx* ctx, bool release) {
    if (!release && ctx->is_unusable) {
      std::lock_guard lock(ctx->mu);
      fail(PS_ERR_BACKEND, dev_name(ctx) + ": " + kUnusable + " since " + ctx->unusable +
                               ": finalize the worker and restart the process");
    }
    return ctx;
  }
  CurrentCtx current_;
  DeviceSwitch device_;
};

// Note [Streams of synchronous copies]: a stream of the context's pool, borrowed for one
// synchronous copy.
class CopyStream {
 public:
  explicit CopyStream(ps_device_ctx* ctx) : ctx_(ctx) {
    {
      std::lock_guard lock(ctx->mu);
      if (!ctx->idle_copy_streams.empty()) {
        stream_ = ctx->idle_copy_streams.back();
        ctx->idle_copy_streams.pop_back();
        return;
      }
    }
    check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking),
          "cudaStreamCreateWithFlags (a copy stream) on " + dev_name(ctx));
    std::lock_guard lock(ctx->mu);
    ++ctx->copy_stream_count;
  }
  CopyStream(const CopyStream&) = delete;
  CopyStream& operator=(const CopyStream&) = delete;
  ~CopyStream() {
    std::lock_guard lock(ctx_->mu);
    try {
      ctx_->idle_copy_streams.push_back(stream_);
    } catch (...) {  // no memory: the stream is not reused, destroy_context misses it
    }
  }
  cudaStream_t get() const { return stream_; }

 private:
  ps_device_ctx* ctx_;
  cudaStream_t stream_ = nullptr;
};

// The fault hook: true on the nth call of `kind`, once.
bool fault_hits(ps_device_ctx* ctx, ps_fault_kind kind) { return ctx->faults.hits(kind); }

// Fails the nth call of `kind` once.
void maybe_fault(ps_device_ctx* ctx, ps_fault_kind kind, const char* what) {
  ctx->faults.maybe_fail(kind, what);
}

// The corrupt_h2d fault: once the upload on `s` is done, flip one bit of its middle byte
// (as sim does), so checks downstream can be shown to catch a bad upload.
void corrupt_middle_byte(void* dst, size_t bytes, cudaStream_t s) {
  unsigned char byte = 0;
  auto* where = static_cast<unsigned char*>(dst) + bytes / 2;
  check(cudaMemcpyAsync(&byte, where, 1, cudaMemcpyDeviceToHost, s), "corrupt_h2d fault read");
  check(cudaStreamSynchronize(s), "cudaStreamSynchronize (corrupt_h2d fault)");
  byte ^= 0x40;
  check(cudaMemcpyAsync(where, &byte, 1, cudaMemcpyHostToDevice, s), "corrupt_h2d fault write");
  check(cudaStreamSynchronize(s), "cudaStreamSynchronize (corrupt_h2d fault)");
}

// What the shared slot bodies (pinstage/backend/device_slots.h) need of this plugin.
struct CudaSlots {
  using Ctx = ps_device_ctx;
  using Scope = SlotScope;
  using PinStats = ps_cuda_pin_stats;
  using PinStatsFn = ps_cuda_pin_stats_fn;  // the documented signature
  static constexpr const char* kPinStatsName = PS_CUDA_PIN_STATS_NAME;
  static constexpr const char* kName = "cuda";
  PINSTAGE_DEVICE_SLOT_HOOKS  // the hooks, declared once; defined below
      static int
      event_query(ps_device_ctx* ctx, ps_event* event);
};

// A release slot's fault hook (the frees): its kind and the slot's name.
struct ReleaseFault {
  ps_fault_kind kind;
  const char* slot;
};

// The release slots: `message` when `ok` is false (a NULL argument), the fault hook, then
// `body` in the device's scope for releases (Note [Sticky errors]: a release is still
// attempted after one).
template <class Body>
int release_slot(ps_device_ctx* ctx, bool ok, const char* message, Body&& body,
                 std::optional<ReleaseFault> fault = std::nullopt) {
  return guarded([&] {
    require_ctx(ctx);
    require(ok, message);
    if (fault) maybe_fault(ctx, fault->kind, fault->slot);
    const SlotScope scope(ctx, true);
    body();
  });
}

std::string fmt(const char* format, double value) {
  char buf[64];
  std::snprintf(buf, sizeof buf, format, value);
  return buf;
}

void log_pinning(const ps_device_ctx* ctx, const ps_cuda_pin_stats& s) {
  if (pinstage::log_level() > pinstage::LogLevel::info) return;
  const double mib = static_cast<double>(s.last_bytes) / (1 << 20);
  pinstage::log(pinstage::LogLevel::info,
                "cuda: pinned " + fmt("%.1f", mib) + " MiB for " + dev_name(ctx) + " by " +
                    (s.last_mode == PS_CUDA_PIN_REGISTER ? "cudaHostRegister" : "cudaHostAlloc") +
                    " in " + fmt("%.3f", s.last_seconds) + " s (" +
                    fmt("%.2f", mib / 1024 / std::max(s.last_seconds, 1e-9)) + " GiB/s)");
}

// The number of visible CUDA devices; PS_ERR_NO_DEVICE when the driver is missing or
// sees none (the text create_context and device_count share).
int visible_devices() {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    fail(PS_ERR_NO_DEVICE, "cudaGetDeviceCount: " + pinstage::cuda::cuda_error_text(err) +
                               ": no usable NVIDIA GPU or driver here (check nvidia-smi, or "
                               "use the sim backend)");
  }
  return count;
}

// Fails with PS_ERR_NO_DEVICE unless `device_id` names a visible CUDA device.
void require_device(int device_id) {
  const int count = visible_devices();
  if (count == 0) fail(PS_ERR_NO_DEVICE, "cudaGetDeviceCount: no CUDA-capable device is detected");
  if (device_id < 0 || device_id >= count)
    fail(PS_ERR_NO_DEVICE, "CUDA device " + std::to_string(device_id) + " does not exist: " +
                               std::to_string(count) + " device(s) visible (ids 0.." +
                               std::to_string(count - 1) + "; see CUDA_VISIBLE_DEVICES)");
}

// The backend's keys: the pinning ones (pin_mode.h) and sysfs_root, where the NUMA
// node of a device is read (Note [Devices without a context]; tests point it at a tree
// of their own).
struct CudaOptions {
  CudaConfig pin;
  std::string sysfs_root = "/sys";
};

// Parses the context options' config strictly (backend/config.h); the defaults without
// options. Checked before any GPU is looked for: a typo fails the same everywhere.
CudaOptions parse_options(const ps_context_options* options, const char* slot) {
  CudaOptions out;
  if (options == nullptr) return out;
  if (options->config == nullptr && options->config_count != 0)
    fail(PS_ERR_INVALID_ARGUMENT, std::string(slot) + ": config is NULL but config_count is not 0");
  static const std::string keys = std::string(pinstage::backend::kPinConfigKeys) + ", sysfs_root";
  pinstage::backend::for_each_config_entry(
      {options->config, options->config_count}, keys.c_str(),
      [&](std::string_view key, std::string_view value) {
        if (key == "sysfs_root") {
          if (value.empty() || value.front() != '/')
            pinstage::backend::config_bad_value(key, value, "an absolute path (default /sys)");
          out.sysfs_root = value;
        } else if (pinstage::backend::is_pin_config_key(key) ||
                   pinstage::backend::is_gone_pin_key(key)) {
          pinstage::backend::detail::apply_pin_option(out.pin, key, value);
        } else {
          pinstage::backend::config_refuse("unknown key '" + std::string(key) + "' (keys: " + keys +
                                           ")");
        }
      });
  return out;
}

// ---- slots ----

const char* CudaSlots::last_error() { return t_last_error.c_str(); }

// The capacity from cudaMemGetInfo's free memory (slots::set_capacity), logged with the
// device's name.
void plan_capacity(ps_device_ctx* ctx, const ps_context_options* options) {
  size_t free_bytes = 0, total_bytes = 0;
  check(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo on " + dev_name(ctx));
  slots::set_capacity(ctx, options != nullptr ? options->device_capacity_bytes : 0, free_bytes,
                      total_bytes, "cuda", [ctx] {
                        cudaDeviceProp prop{};
                        if (cudaGetDeviceProperties(&prop, ctx->device) == cudaSuccess)
                          return std::string("is ") + prop.name + ", ";
                        (void)cudaGetLastError();
                        return std::string("has ");
                      });
}

std::unique_ptr<ps_device_ctx> CudaSlots::open_context(int device_id,
                                                       const ps_context_options* options) {
  const CudaOptions parsed = parse_options(options, "create_context");
  require_device(device_id);

  auto ctx = std::make_unique<ps_device_ctx>();
  ctx->device = device_id;
  ctx->config = parsed.pin;
  const DeviceSwitch device(device_id, true);
  plan_capacity(ctx.get(), options);
  // Note [Pinning the runtime's memory]: read once, so a read-only pin is refused at once.
  int read_only = 0;
  if (cudaDeviceGetAttribute(&read_only, cudaDevAttrHostRegisterReadOnlySupported, device_id) !=
      cudaSuccess) {
    (void)cudaGetLastError();
    read_only = 0;
  }
  ctx->pin_stats.read_only_supported = read_only;
  return ctx;
}

// ---- topology (ABI v6, Note [Devices without a context]) ----

// A CUDA bus id ("0000:3B:00.0", or NVML's "00000000:3B:00.0") in sysfs's form: domain
// %04x, lower case. "" when it does not parse.
std::string normalise_pci_id(const char* id) {
  unsigned domain = 0, bus = 0, slot = 0, function = 0;
  char extra = 0;
  if (std::sscanf(id, "%8x:%2x:%2x.%1x%c", &domain, &bus, &slot, &function, &extra) != 4 ||
      slot > 0x1f || function > 7)
    return "";
  char out[PS_DEVICE_PCI_ID_MAX];
  std::snprintf(out, sizeof out, "%04x:%02x:%02x.%x", domain, bus, slot, function);
  return out;
}

// The host NUMA node of PCI device `pci_id` (sysfs form); -1 when unknown: no id, no
// numa_node file (no NUMA in the kernel), -1 in it, or not a number.
int numa_node_of(const std::string& sysfs_root, const std::string& pci_id) {
  if (pci_id.empty()) return -1;
  std::ifstream in(sysfs_root + "/bus/pci/devices/" + pci_id + "/numa_node");
  long node = -1;
  if (!(in >> node) || node < 0 || node > 1 << 20) return -1;
  return static_cast<int>(node);
}

template <size_t N>
void put_text(char (&field)[N], const std::string& text) {
  std::snprintf(field, N, "%s", text.c_str());
}

// Fills `out` for a visible device. A device whose properties CUDA will not give is
// listed, not usable, with CUDA's reason; its PCI id and node are still looked up.
void describe_device(int id, const std::string& sysfs_root, ps_device_props& out) {
  cudaDeviceProp prop{};
  const cudaError_t got = cudaGetDeviceProperties(&prop, id);
  if (got == cudaSuccess) {
    prop.name[sizeof prop.name - 1] = '\0';
    put_text(out.name, prop.name);
    out.memory_bytes = prop.totalGlobalMem;
    out.usable = 1;
  } else {
    (void)cudaGetLastError();
    put_text(out.name, "CUDA device " + std::to_string(id));
    put_text(out.reason, "cudaGetDeviceProperties(" + std::to_string(id) +
                             "): " + pinstage::cuda::cuda_error_text(got));
  }
  char bus[PS_DEVICE_PCI_ID_MAX] = {};
  if (cudaDeviceGetPCIBusId(bus, static_cast<int>(sizeof bus), id) == cudaSuccess) {
    bus[sizeof bus - 1] = '\0';
    put_text(out.pci_bus_id, normalise_pci_id(bus));
  } else {
    (void)cudaGetLastError();  // no id: "" and node -1, the device may still be usable
  }
  out.numa_node = numa_node_of(sysfs_root, out.pci_bus_id);
}

int CudaSlots::device_count(const ps_context_options* options, int* out) {
  return guarded([&] {
    require(out != nullptr, "device_count: output pointer is NULL");
    *out = 0;
    parse_options(options, "device_count");
    *out = visible_devices();
  });
}

int CudaSlots::device_props(int device_id, const ps_context_options* options,
                            ps_device_props* out) {
  return guarded([&] {
    require(out != nullptr, "device_props: output pointer is NULL");
    *out = ps_device_props{};
    out->numa_node = -1;
    const CudaOptions parsed = parse_options(options, "device_props");
    require_device(device_id);
    describe_device(device_id, parsed.sysfs_root, *out);
  });
}

// The runtime has destroyed every stream and event and freed every allocation first
// (platform_abi.h): only the pool of copy streams is left.
int CudaSlots::destroy_context(ps_device_ctx* ctx) {
  return guarded([&] {
    std::unique_ptr<ps_device_ctx> owned(::require_ctx(ctx));
    const SlotScope scope(ctx, true);
    cudaError_t first = cudaSuccess;
    for (cudaStream_t s : ctx->idle_copy_streams) {
      const cudaError_t synced = cudaStreamSynchronize(s);
      const cudaError_t destroyed = cudaStreamDestroy(s);  // even when sync failed
      if (first == cudaSuccess) first = synced != cudaSuccess ? synced : destroyed;
    }
    check(first, "destroying the cuda context of " + dev_name(ctx) + ": its copy streams");
  });
}

// The ledger has reserved `bytes` (slots::device_malloc).
void* CudaSlots::device_alloc(ps_device_ctx* ctx, size_t bytes) {
  void* ptr = nullptr;
  check(cudaMalloc(&ptr, bytes),
        "cudaMalloc of " + std::to_string(bytes) + " bytes on " + dev_name(ctx));
  return ptr;
}

// The runtime hands each allocation back exactly once: `allocation` is one this context
// made, with the size it asked for. cudaFree waits for the device's queued work.
int CudaSlots::device_free(ps_device_ctx* ctx, const ps_allocation* allocation) {
  return release_slot(
      ctx, allocation != nullptr && allocation->ptr != nullptr,
      "device_free: allocation or its pointer is NULL",
      [&] {
        // On failure the memory may still be held: it stays committed.
        check(cudaFree(allocation->ptr), [&] {
          return "cudaFree of " + std::to_string(allocation->bytes) + " bytes on " + dev_name(ctx);
        });
        ctx->capacity.release(allocation->bytes);
      },
      ReleaseFault{PS_FAULT_DEVICE_FREE, "device_free"});
}

// One copy: queued on `stream`, or (null) on a stream borrowed from the pool and waited
// for (Note [Streams of synchronous copies]). The runtime has checked that the device
// side lies inside one allocation of this context. `flags` are not needed: the CUDA
// driver finds pinned ranges itself.
void CudaSlots::copy_body(ps_device_ctx* ctx, void* dst, const void* src, size_t bytes,
                          uint32_t /*flags*/, ps_stream* stream, bool to_device, const char* what) {
  std::optional<CopyStream> borrowed;
  if (stream == nullptr) borrowed.emplace(ctx);
  const cudaStream_t s = stream != nullptr ? stream->stream : borrowed->get();
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
  if (to_device && fault_hits(ctx, PS_FAULT_CORRUPT_H2D)) corrupt_middle_byte(dst, bytes, s);
}

// Device-side work (ABI v5): `enqueue(s)` queues it on `stream`, or (null) on a stream
// borrowed from the pool and waited for, as the synchronous copies do. The runtime has
// checked the ranges (inside allocations of this context, not overlapping, bytes > 0).
template <class Enqueue>
void device_work(ps_device_ctx* ctx, ps_stream* stream, const char* call, const char* what,
                 size_t bytes, Enqueue&& enqueue) {
  const SlotScope scope(ctx);
  std::optional<CopyStream> borrowed;
  if (stream == nullptr) borrowed.emplace(ctx);
  const cudaStream_t s = stream != nullptr ? stream->stream : borrowed->get();
  auto desc = [&] {
    return std::string(what) + " of " + std::to_string(bytes) + " bytes on " + dev_name(ctx);
  };
  check(
      enqueue(s), [&] { return std::string(call) + " " + desc(); }, PS_ERR_COPY_FAILED);
  if (stream == nullptr)
    check(
        cudaStreamSynchronize(s), [&] { return "cudaStreamSynchronize after " + desc(); },
        PS_ERR_COPY_FAILED);
}

void CudaSlots::copy_d2d(ps_device_ctx* ctx, void* dst, const void* src, size_t bytes,
                         ps_stream* stream) {
  device_work(ctx, stream, "cudaMemcpyAsync", "device-to-device copy", bytes, [&](cudaStream_t s) {
    return cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, s);
  });
}

void CudaSlots::fill(ps_device_ctx* ctx, void* dst, int value, size_t bytes, ps_stream* stream) {
  device_work(ctx, stream, "cudaMemsetAsync", "device fill", bytes,
              [&](cudaStream_t s) { return cudaMemsetAsync(dst, value, bytes, s); });
}

std::unique_ptr<ps_stream> CudaSlots::new_stream(ps_device_ctx* ctx) {
  auto s = std::make_unique<ps_stream>();
  check(cudaStreamCreateWithFlags(&s->stream, cudaStreamNonBlocking),
        "cudaStreamCreateWithFlags on " + dev_name(ctx));
  try {
    std::unique_lock lock(ctx->streams_mu);
    ctx->streams.push_back(s->stream);
  } catch (...) {
    (void)cudaStreamDestroy(s->stream);
    throw;
  }
  return s;
}

int CudaSlots::stream_destroy(ps_device_ctx* ctx, ps_stream* stream) {
  return release_slot(ctx, stream != nullptr, "stream_destroy: stream is NULL", [&] {
    std::unique_ptr<ps_stream> owned(stream);
    // cudaStreamDestroy returns before queued copies ran; the ABI promises they are done
    // (the runtime frees their buffers next), so wait here.
    const cudaError_t synced = cudaStreamSynchronize(stream->stream);
    {
      std::unique_lock lock(ctx->streams_mu);
      std::erase(ctx->streams, stream->stream);
    }
    const cudaError_t destroyed = cudaStreamDestroy(stream->stream);
    check(synced, "cudaStreamSynchronize before destroying a stream on " + dev_name(ctx),
          PS_ERR_COPY_FAILED);
    check(destroyed, "cudaStreamDestroy on " + dev_name(ctx));
  });
}

void CudaSlots::sync_stream(ps_device_ctx* ctx, ps_stream* stream) {
  check(
      cudaStreamSynchronize(stream->stream),
      [ctx] { return "cudaStreamSynchronize on " + dev_name(ctx); }, PS_ERR_COPY_FAILED);
}

std::unique_ptr<ps_event> CudaSlots::new_event(ps_device_ctx* ctx) {
  auto e = std::make_unique<ps_event>();
  // Timing off: these events only order work, and untimed events are cheaper.
  check(cudaEventCreateWithFlags(&e->event, cudaEventDisableTiming),
        "cudaEventCreateWithFlags on " + dev_name(ctx));
  return e;
}

int CudaSlots::event_destroy(ps_device_ctx* ctx, ps_event* event) {
  return release_slot(ctx, event != nullptr, "event_destroy: event is NULL", [&] {
    std::unique_ptr<ps_event> owned(event);
    check(cudaEventDestroy(event->event), "cudaEventDestroy on " + dev_name(ctx));
  });
}

void CudaSlots::record_event(ps_device_ctx* ctx, ps_event* event, ps_stream* stream) {
  check(cudaEventRecord(event->event, stream->stream),
        [ctx] { return "cudaEventRecord on " + dev_name(ctx); });
}

void CudaSlots::sync_event(ps_device_ctx* ctx, ps_event* event) {
  check(
      cudaEventSynchronize(event->event),
      [ctx] { return "cudaEventSynchronize on " + dev_name(ctx); }, PS_ERR_COPY_FAILED);
}

int CudaSlots::event_query(ps_device_ctx* ctx, ps_event* event) {
  if (ctx == nullptr || event == nullptr) return PS_ERR_INVALID_ARGUMENT;
  int status = PS_OK;
  const int guard = guarded([&] {
    const SlotScope scope(ctx);
    const cudaError_t e = cudaEventQuery(event->event);
    if (e == cudaErrorNotReady) {
      status = PS_ERR_NOT_READY;
      return;
    }
    check(
        e, [ctx] { return "cudaEventQuery on " + dev_name(ctx); }, PS_ERR_COPY_FAILED);
  });
  return guard != PS_OK ? guard : status;
}

// ---- pinned host memory (Note [Pinning the runtime's memory]) ----

// Adds one pinning to the context's statistics and logs it. Never throws: the memory is
// already pinned, and a failed slot would leak it.
void record_pinning(ps_device_ctx* ctx, ps_cuda_pin_mode mode, size_t bytes, double seconds,
                    bool read_only) noexcept {
  ps_cuda_pin_stats snapshot;
  {
    std::lock_guard lock(ctx->mu);
    ps_cuda_pin_stats& s = ctx->pin_stats;
    if (mode == PS_CUDA_PIN_ALLOC) {
      ++s.alloc_count;
      s.alloc_bytes += bytes;
      s.alloc_seconds += seconds;
    } else {
      ++s.register_count;
      s.register_bytes += bytes;
      s.register_seconds += seconds;
      if (read_only) ++s.read_only_count;
    }
    s.last_mode = mode;
    s.last_bytes = bytes;
    s.last_seconds = seconds;
    snapshot = s;
  }
  try {
    log_pinning(ctx, snapshot);
  } catch (...) {  // no memory for the log line: the pinning itself succeeded
  }
}

// Unregisters the first `registered` bytes of `range`, piece by piece; the first failure,
// or cudaSuccess.
cudaError_t unregister_pieces(const RegisteredRange& range, size_t registered) {
  cudaError_t first = cudaSuccess;
  auto* data = static_cast<unsigned char*>(range.data);
  for (size_t off = 0; off < registered; off += range.chunk_bytes) {
    const cudaError_t err = cudaHostUnregister(data + off);
    if (first == cudaSuccess) first = err;
  }
  return first;
}

// cudaHostRegister of the range in pieces of at most chunk_bytes (`flags` added to
// cudaHostRegisterPortable); on a failure the pieces done are unregistered again and the
// error returned.
cudaError_t register_pieces(const RegisteredRange& range, unsigned int flags) {
  auto* data = static_cast<unsigned char*>(range.data);
  for (size_t off = 0; off < range.bytes; off += range.chunk_bytes) {
    const size_t length = std::min(range.chunk_bytes, range.bytes - off);
    const cudaError_t err = cudaHostRegister(data + off, length, cudaHostRegisterPortable | flags);
    if (err == cudaSuccess) continue;
    (void)cudaGetLastError();
    if (unregister_pieces(range, off) != cudaSuccess) (void)cudaGetLastError();
    return err;
  }
  return cudaSuccess;
}

void wait_for_streams(ps_device_ctx* ctx);

// ABI v7: the runtime's memory registered in place, in pieces (the driver takes seconds for
// one huge call). A read-only range needs cudaHostRegisterReadOnly: the driver refuses to pin
// it writable; a device without it refuses at once (Note [Pinning the runtime's memory]).
void CudaSlots::register_range(ps_device_ctx* ctx, void* ptr, size_t bytes, bool read_only) {
  const auto what = [&] {
    return std::string("cudaHostRegister") + (read_only ? "(ReadOnly)" : "") + " of " +
           std::to_string(bytes) + " bytes on " + dev_name(ctx) + " (in pieces of " +
           std::to_string(ctx->config.register_chunk_bytes >> 20) + " MiB)";
  };
  if (read_only && ctx->pin_stats.read_only_supported == 0)
    fail(PS_ERR_UNSUPPORTED,
         "cuda: " + what() + ": cudaDevAttrHostRegisterReadOnlySupported is 0 on this device");
  const pinstage::Stopwatch watch;
  const RegisteredRange range{ptr, bytes, ctx->config.register_chunk_bytes};
  const cudaError_t err = register_pieces(range, read_only ? cudaHostRegisterReadOnly : 0);
  if (err == cudaErrorNotSupported) fail(PS_ERR_UNSUPPORTED, "cuda: " + what() + ": not supported");
  check(err, what);
  record_pinning(ctx, PS_CUDA_PIN_REGISTER, bytes, watch.seconds(), read_only);
}

void CudaSlots::unregister_range(ps_device_ctx* ctx, void* ptr, size_t bytes) {
  wait_for_streams(ctx);  // a queued copy may still read it (Note [Release waits for copies])
  const pinstage::Stopwatch watch;
  check(unregister_pieces(RegisteredRange{ptr, bytes, ctx->config.register_chunk_bytes}, bytes),
        [&] { return "cudaHostUnregister of " + std::to_string(bytes) + " bytes"; });
  std::lock_guard lock(ctx->mu);
  ctx->pin_stats.register_free_seconds += watch.seconds();
}

// The vendor source: one cudaHostAlloc, portable and deliberately not write-combined.
void CudaSlots::pin(ps_device_ctx* ctx, size_t bytes, ps_allocation& out) {
  const pinstage::Stopwatch watch;
  check(cudaHostAlloc(&out.ptr, bytes, cudaHostAllocPortable), [&] {
    return "cudaHostAlloc of " + std::to_string(bytes) + " bytes for " + dev_name(ctx);
  });
  record_pinning(ctx, PS_CUDA_PIN_ALLOC, bytes, watch.seconds(), false);
}

// Note [Release waits for copies]: every stream of the context has finished.
// After a sticky error nothing runs any more, and the syncs would only fail.
void wait_for_streams(ps_device_ctx* ctx) {
  if (ctx->is_unusable) return;
  std::shared_lock lock(ctx->streams_mu);
  for (cudaStream_t s : ctx->streams)
    check(
        cudaStreamSynchronize(s),
        [ctx] {
          return "cudaStreamSynchronize before releasing a pinned buffer on " + dev_name(ctx);
        },
        PS_ERR_COPY_FAILED);
}

int CudaSlots::host_free_pinned(ps_device_ctx* ctx, const ps_allocation* allocation) {
  return release_slot(
      ctx, allocation != nullptr && allocation->ptr != nullptr,
      "host_free_pinned: allocation or its pointer is NULL",
      [&] {
        wait_for_streams(ctx);
        const pinstage::Stopwatch watch;
        check(cudaFreeHost(allocation->ptr), [&] {
          return "cudaFreeHost of a " + std::to_string(allocation->bytes) +
                 " byte pinned buffer on " + dev_name(ctx);
        });
        std::lock_guard lock(ctx->mu);
        ctx->pin_stats.alloc_free_seconds += watch.seconds();
      },
      ReleaseFault{PS_FAULT_HOST_FREE, "host_free_pinned"});
}

constexpr ps_platform_api kApi = slots::device_api<CudaSlots>();

}  // namespace

extern "C" PINSTAGE_PLUGIN_EXPORT const ps_platform_api* pinstage_platform_entry(void) {
  return &kApi;
}
