// A fake CUDA runtime (libcudart.so.13) for running the cuda plugin's GPU tests on a
// machine without a GPU. Loaded instead of the real runtime through LD_LIBRARY_PATH by
// the ctest entries "fake_cuda.*" (label cuda); it is not a substitute for the GPU run.
//
// What it emulates, deliberately strictly:
//  - PINSTAGE_FAKE_CUDA_DEVICES devices (default 2) of PINSTAGE_FAKE_CUDA_MEM_MB device
//    memory each (default 1024); device memory is untouched host memory.
//  - A current device per thread (0 on a fresh thread). Allocations remember the device
//    current when they were made; stream and event calls fail with
//    cudaErrorInvalidResourceHandle unless the thread's current device is theirs, so a
//    plugin that relies on the calling thread's device state fails here.
//  - Streams run their copies on a thread of their own, later than queued, so a caller
//    that reuses a pinned buffer before its copy's event fires reads corrupted data.
//    Copies from or to pageable memory are synchronous, as with the real runtime.
//    cudaStreamDestroy returns at once and the stream finishes its copies afterwards,
//    as the real one does.
//  - cudaHostAlloc/cudaHostRegister/cudaPointerGetAttributes over tracked ranges, with
//    the real error codes for double registration and unknown pointers.
//  - cudaFreeHost or cudaHostUnregister of memory a queued copy still uses is a hazard:
//    counted (pinstage_fake_cuda_hazards) and printed, then the copy is waited for so
//    the test goes on. cudaFree synchronizes, like the real one.
// pinstage_fake_cuda_counts() reports what is still allocated (leak checks in tests).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <thread>
#include <utility>
#include <vector>

namespace {

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoi(v) : fallback;
}

const int kDevices = env_int("PINSTAGE_FAKE_CUDA_DEVICES", 2);
const size_t kDeviceBytes = static_cast<size_t>(env_int("PINSTAGE_FAKE_CUDA_MEM_MB", 1024)) << 20;

thread_local int t_device = 0;
thread_local cudaError_t t_last = cudaSuccess;

cudaError_t fail(cudaError_t e) {
  t_last = e;
  return e;
}

struct Range {
  size_t bytes;
  int device;
};

// One queued copy; it stays at the front of its stream's queue until it has run.
struct Copy {
  void* dst;
  const void* src;
  size_t bytes;
  bool touches(const void* p, size_t n) const {
    auto hit = [&](const void* q) {
      const auto a = reinterpret_cast<uintptr_t>(p), b = reinterpret_cast<uintptr_t>(q);
      return a < b + bytes && b < a + n;
    };
    return hit(dst) || hit(src);
  }
};

struct FakeStream {
  int device;
  std::mutex mu;
  std::condition_variable cv;
  std::deque<Copy> queue;
  uint64_t queued = 0;
  uint64_t done = 0;
  bool stop = false;
  std::thread worker;

  explicit FakeStream(int dev) : device(dev) {
    worker = std::thread([this] { run(); });
  }
  void run() {
    std::unique_lock lock(mu);
    for (;;) {
      cv.wait(lock, [this] { return stop || !queue.empty(); });
      if (queue.empty()) return;  // stop requested and drained
      const Copy op = queue.front();
      lock.unlock();
      // Later than queued: widens the window in which a careless caller overwrites a
      // source buffer before its copy ran.
      std::this_thread::sleep_for(std::chrono::microseconds(300));
      std::memcpy(op.dst, op.src, op.bytes);
      lock.lock();
      queue.pop_front();
      ++done;
      cv.notify_all();
    }
  }
  uint64_t enqueue(const Copy& op) {
    std::lock_guard lock(mu);
    queue.push_back(op);
    cv.notify_all();
    return ++queued;
  }
  void wait_for(uint64_t ticket) {
    std::unique_lock lock(mu);
    cv.wait(lock, [&] { return done >= ticket; });
  }
  void drain() {
    uint64_t ticket;
    {
      std::lock_guard lock(mu);
      ticket = queued;
    }
    wait_for(ticket);
  }
  bool idle() {
    std::lock_guard lock(mu);
    return queue.empty();
  }
  // True when a copy not yet finished reads or writes [p, p + n).
  bool uses(const void* p, size_t n) {
    std::lock_guard lock(mu);
    return std::any_of(queue.begin(), queue.end(), [&](const Copy& c) { return c.touches(p, n); });
  }
  ~FakeStream() {
    {
      std::lock_guard lock(mu);
      stop = true;
      cv.notify_all();
    }
    worker.join();
  }
};

struct FakeEvent {
  int device;
  std::shared_ptr<FakeStream> stream;  // where it was last recorded (null: never)
  uint64_t ticket = 0;
};

struct State {
  std::mutex mu;
  std::map<uintptr_t, Range> device;      // cudaMalloc
  std::map<uintptr_t, Range> host_alloc;  // cudaHostAlloc
  std::map<uintptr_t, Range> registered;  // cudaHostRegister
  std::vector<size_t> used;
  std::map<cudaStream_t, std::shared_ptr<FakeStream>> streams;
  // Destroyed streams whose copies may still run (cudaStreamDestroy does not wait).
  std::vector<std::shared_ptr<FakeStream>> retired;
  std::set<FakeEvent*> events;
  size_t hazards = 0;  // frees of memory a queued copy still used
  State() : used(static_cast<size_t>(std::max(kDevices, 0)), 0) {}
};

State& state() {
  static State* s = new State;  // never destroyed: stream threads may outlive statics
  return *s;
}

// The range of `m` containing [p, p + n), or end().
std::map<uintptr_t, Range>::iterator find_in(std::map<uintptr_t, Range>& m, const void* p,
                                             size_t n) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  auto it = m.upper_bound(a);
  if (it == m.begin()) return m.end();
  --it;
  if (a - it->first < it->second.bytes && n <= it->second.bytes - (a - it->first)) return it;
  return m.end();
}

bool overlaps(std::map<uintptr_t, Range>& m, const void* p, size_t n) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  auto it = m.upper_bound(a + n - 1);
  if (it == m.begin()) return false;
  --it;
  return it->first + it->second.bytes > a;
}

bool is_pinned(State& s, const void* p, size_t n) {
  return find_in(s.host_alloc, p, n) != s.host_alloc.end() ||
         find_in(s.registered, p, n) != s.registered.end();
}

// Every stream that may still run copies, live or destroyed. Caller holds s.mu.
std::vector<std::shared_ptr<FakeStream>> all_streams(State& s) {
  std::vector<std::shared_ptr<FakeStream>> out(s.retired);
  for (auto& [h, st] : s.streams) out.push_back(st);
  return out;
}

// A host free of [p, p + n): a queued copy still using it is a hazard in the caller.
// Counted and printed, then waited for so the memory can go. Caller holds s.mu.
void check_host_free(State& s, const char* call, const void* p, size_t n) {
  for (auto& st : all_streams(s)) {
    if (!st->uses(p, n)) continue;
    ++s.hazards;
    std::fprintf(stderr, "fake cuda: %s(%p) while a queued copy still uses that memory\n", call, p);
    st->drain();
  }
}

std::shared_ptr<FakeStream> lookup_stream(State& s, cudaStream_t st) {
  auto it = s.streams.find(st);
  return it == s.streams.end() ? nullptr : it->second;
}

}  // namespace

extern "C" {

__attribute__((visibility("default"))) int pinstage_fake_cuda_counts(size_t* device_allocs,
                                                                     size_t* host_allocs,
                                                                     size_t* registered,
                                                                     size_t* streams,
                                                                     size_t* events) {
  State& s = state();
  std::lock_guard lock(s.mu);
  *device_allocs = s.device.size();
  *host_allocs = s.host_alloc.size();
  *registered = s.registered.size();
  *streams = s.streams.size();
  *events = s.events.size();
  return 0;
}

// Frees of host memory that a queued copy still used, since the process started.
__attribute__((visibility("default"))) size_t pinstage_fake_cuda_hazards(void) {
  State& s = state();
  std::lock_guard lock(s.mu);
  return s.hazards;
}

cudaError_t cudaGetLastError(void) { return std::exchange(t_last, cudaSuccess); }
cudaError_t cudaPeekAtLastError(void) { return t_last; }

const char* cudaGetErrorName(cudaError_t e) {
  switch (e) {
    case cudaSuccess:
      return "cudaSuccess";
    case cudaErrorInvalidValue:
      return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation:
      return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidDevice:
      return "cudaErrorInvalidDevice";
    case cudaErrorNoDevice:
      return "cudaErrorNoDevice";
    case cudaErrorInvalidResourceHandle:
      return "cudaErrorInvalidResourceHandle";
    case cudaErrorHostMemoryAlreadyRegistered:
      return "cudaErrorHostMemoryAlreadyRegistered";
    case cudaErrorHostMemoryNotRegistered:
      return "cudaErrorHostMemoryNotRegistered";
    default:
      return "cudaErrorUnknown";
  }
}

const char* cudaGetErrorString(cudaError_t e) {
  switch (e) {
    case cudaSuccess:
      return "no error";
    case cudaErrorMemoryAllocation:
      return "out of memory";
    case cudaErrorNoDevice:
      return "no CUDA-capable device is detected";
    case cudaErrorInvalidDevice:
      return "invalid device ordinal";
    case cudaErrorInvalidResourceHandle:
      return "invalid resource handle";
    default:
      return "fake CUDA runtime error";
  }
}

cudaError_t cudaGetDeviceCount(int* count) {
  if (count == nullptr) return fail(cudaErrorInvalidValue);
  *count = kDevices;
  return kDevices > 0 ? cudaSuccess : fail(cudaErrorNoDevice);
}

cudaError_t cudaSetDevice(int device) {
  if (device < 0 || device >= kDevices) return fail(cudaErrorInvalidDevice);
  t_device = device;
  return cudaSuccess;
}

cudaError_t cudaGetDevice(int* device) {
  if (device == nullptr) return fail(cudaErrorInvalidValue);
  *device = t_device;
  return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  if (prop == nullptr || device < 0 || device >= kDevices) return fail(cudaErrorInvalidValue);
  std::memset(prop, 0, sizeof *prop);
  std::snprintf(prop->name, sizeof prop->name, "pinstage fake GPU %d", device);
  prop->totalGlobalMem = kDeviceBytes;
  return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total) {
  if (free_bytes == nullptr || total == nullptr) return fail(cudaErrorInvalidValue);
  State& s = state();
  std::lock_guard lock(s.mu);
  *total = kDeviceBytes;
  *free_bytes = kDeviceBytes - s.used[static_cast<size_t>(t_device)];
  return cudaSuccess;
}

cudaError_t cudaMalloc(void** p, size_t bytes) {
  if (p == nullptr) return fail(cudaErrorInvalidValue);
  *p = nullptr;
  if (bytes == 0) return cudaSuccess;
  State& s = state();
  std::lock_guard lock(s.mu);
  size_t& used = s.used[static_cast<size_t>(t_device)];
  if (bytes > kDeviceBytes - used) return fail(cudaErrorMemoryAllocation);
  void* mem = std::malloc(bytes);  // never touched unless copied to: costs no memory
  if (mem == nullptr) return fail(cudaErrorMemoryAllocation);
  s.device.emplace(reinterpret_cast<uintptr_t>(mem), Range{bytes, t_device});
  used += bytes;
  *p = mem;
  return cudaSuccess;
}

cudaError_t cudaFree(void* p) {
  if (p == nullptr) return cudaSuccess;
  State& s = state();
  std::unique_lock lock(s.mu);
  auto it = s.device.find(reinterpret_cast<uintptr_t>(p));
  if (it == s.device.end()) return fail(cudaErrorInvalidValue);
  s.used[static_cast<size_t>(it->second.device)] -= it->second.bytes;
  s.device.erase(it);
  // cudaFree synchronizes the device: no queued copy may still touch the memory.
  auto streams = all_streams(s);
  lock.unlock();
  for (auto& st : streams) st->drain();
  std::free(p);
  return cudaSuccess;
}

cudaError_t cudaHostAlloc(void** p, size_t bytes, unsigned int flags) {
  if (p == nullptr || bytes == 0) return fail(cudaErrorInvalidValue);
  if (flags & cudaHostAllocWriteCombined) return fail(cudaErrorInvalidValue);  // never wanted
  void* mem = std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096);
  if (mem == nullptr) return fail(cudaErrorMemoryAllocation);
  State& s = state();
  std::lock_guard lock(s.mu);
  s.host_alloc.emplace(reinterpret_cast<uintptr_t>(mem), Range{bytes, t_device});
  *p = mem;
  return cudaSuccess;
}

cudaError_t cudaFreeHost(void* p) {
  if (p == nullptr) return cudaSuccess;
  State& s = state();
  std::lock_guard lock(s.mu);
  auto it = s.host_alloc.find(reinterpret_cast<uintptr_t>(p));
  if (it == s.host_alloc.end()) return fail(cudaErrorInvalidValue);
  check_host_free(s, "cudaFreeHost", p, it->second.bytes);
  s.host_alloc.erase(it);
  std::free(p);
  return cudaSuccess;
}

cudaError_t cudaHostRegister(void* p, size_t bytes, unsigned int) {
  if (p == nullptr || bytes == 0) return fail(cudaErrorInvalidValue);
  State& s = state();
  std::lock_guard lock(s.mu);
  if (overlaps(s.registered, p, bytes) || overlaps(s.host_alloc, p, bytes))
    return fail(cudaErrorHostMemoryAlreadyRegistered);
  // Like page-locking, every page must be mapped: read one byte per page.
  for (size_t off = 0; off < bytes; off += 4096)
    (void)*static_cast<volatile char*>(static_cast<char*>(p) + off);
  s.registered.emplace(reinterpret_cast<uintptr_t>(p), Range{bytes, t_device});
  return cudaSuccess;
}

cudaError_t cudaHostUnregister(void* p) {
  State& s = state();
  std::lock_guard lock(s.mu);
  auto it = s.registered.find(reinterpret_cast<uintptr_t>(p));
  if (it == s.registered.end()) return fail(cudaErrorHostMemoryNotRegistered);
  check_host_free(s, "cudaHostUnregister", p, it->second.bytes);
  s.registered.erase(it);
  return cudaSuccess;
}

cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* attr, const void* p) {
  if (attr == nullptr) return fail(cudaErrorInvalidValue);
  std::memset(attr, 0, sizeof *attr);
  attr->type = cudaMemoryTypeUnregistered;
  attr->device = -1;
  State& s = state();
  std::lock_guard lock(s.mu);
  if (auto it = find_in(s.device, p, 1); it != s.device.end()) {
    attr->type = cudaMemoryTypeDevice;
    attr->device = it->second.device;
    attr->devicePointer = const_cast<void*>(p);
  } else if (is_pinned(s, p, 1)) {
    attr->type = cudaMemoryTypeHost;
    attr->hostPointer = const_cast<void*>(p);
  }
  return cudaSuccess;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* out, unsigned int) {
  if (out == nullptr) return fail(cudaErrorInvalidValue);
  auto st = std::make_shared<FakeStream>(t_device);
  auto handle = reinterpret_cast<cudaStream_t>(st.get());
  State& s = state();
  std::lock_guard lock(s.mu);
  s.streams.emplace(handle, std::move(st));
  *out = handle;
  return cudaSuccess;
}

cudaError_t cudaStreamDestroy(cudaStream_t handle) {
  State& s = state();
  std::lock_guard lock(s.mu);
  auto st = lookup_stream(s, handle);
  if (!st || st->device != t_device) return fail(cudaErrorInvalidResourceHandle);
  s.streams.erase(handle);
  // Like the real call, returns at once: queued copies run later. Idle ones go now.
  s.retired.push_back(std::move(st));
  std::erase_if(s.retired, [](const std::shared_ptr<FakeStream>& r) { return r->idle(); });
  return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t handle) {
  State& s = state();
  std::shared_ptr<FakeStream> st;
  {
    std::lock_guard lock(s.mu);
    st = lookup_stream(s, handle);
  }
  if (!st || st->device != t_device) return fail(cudaErrorInvalidResourceHandle);
  st->drain();
  return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t handle) {
  if (dst == nullptr || src == nullptr) return fail(cudaErrorInvalidValue);
  if (kind != cudaMemcpyHostToDevice && kind != cudaMemcpyDeviceToHost)
    return fail(cudaErrorInvalidMemcpyDirection);
  State& s = state();
  std::shared_ptr<FakeStream> st;
  bool host_pinned;
  {
    std::lock_guard lock(s.mu);
    const void* dev = kind == cudaMemcpyHostToDevice ? dst : src;
    const void* host = kind == cudaMemcpyHostToDevice ? src : dst;
    if (find_in(s.device, dev, bytes) == s.device.end()) return fail(cudaErrorInvalidValue);
    host_pinned = is_pinned(s, host, bytes);
    if (handle != nullptr) {
      st = lookup_stream(s, handle);
      if (!st) return fail(cudaErrorInvalidResourceHandle);
    }
  }
  if (st && st->device != t_device) return fail(cudaErrorInvalidResourceHandle);
  if (!st || !host_pinned) {
    // Pageable memory (or the legacy stream): the copy is done when the call returns.
    if (st) st->drain();
    std::memcpy(dst, src, bytes);
    return cudaSuccess;
  }
  st->enqueue(Copy{dst, src, bytes});
  return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* out, unsigned int) {
  if (out == nullptr) return fail(cudaErrorInvalidValue);
  auto* e = new FakeEvent{t_device, nullptr, 0};
  State& s = state();
  std::lock_guard lock(s.mu);
  s.events.insert(e);
  *out = reinterpret_cast<cudaEvent_t>(e);
  return cudaSuccess;
}

cudaError_t cudaEventDestroy(cudaEvent_t handle) {
  auto* e = reinterpret_cast<FakeEvent*>(handle);
  State& s = state();
  std::lock_guard lock(s.mu);
  if (s.events.erase(e) == 0) return fail(cudaErrorInvalidResourceHandle);
  delete e;
  return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t handle, cudaStream_t stream) {
  auto* e = reinterpret_cast<FakeEvent*>(handle);
  State& s = state();
  std::lock_guard lock(s.mu);
  if (s.events.count(e) == 0) return fail(cudaErrorInvalidResourceHandle);
  auto st = lookup_stream(s, stream);
  if (!st || st->device != t_device || e->device != t_device)
    return fail(cudaErrorInvalidResourceHandle);
  std::lock_guard slock(st->mu);
  e->stream = st;
  e->ticket = st->queued;
  return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t handle) {
  auto* e = reinterpret_cast<FakeEvent*>(handle);
  std::shared_ptr<FakeStream> st;
  uint64_t ticket;
  {
    State& s = state();
    std::lock_guard lock(s.mu);
    if (s.events.count(e) == 0) return fail(cudaErrorInvalidResourceHandle);
    st = e->stream;
    ticket = e->ticket;
  }
  if (st) st->wait_for(ticket);
  return cudaSuccess;
}

}  // extern "C"
