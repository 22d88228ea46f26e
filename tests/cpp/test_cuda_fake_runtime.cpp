// A fake CUDA runtime (libcudart.so.13) for running the cuda plugin's GPU tests, the
// probe and the GPU check on a machine without a GPU. Loaded instead of the real runtime
// through LD_LIBRARY_PATH by the ctest entries of label cuda; it is not a substitute for
// the GPU run.
//
// What it emulates, deliberately at least as strictly as the real runtime:
//  - PINSTAGE_FAKE_CUDA_DEVICES devices (default 2) of PINSTAGE_FAKE_CUDA_MEM_MB device
//    memory each (default 1024).
//  - Device memory the host cannot read: cudaMalloc returns a PROT_NONE mapping (256-byte
//    aligned, not page aligned); the fake's copies reach it through a second, private
//    mapping of the same memfd. A host read of a device pointer crashes, as on a GPU.
//  - A current device per thread (0 on a fresh thread). Allocations remember the device
//    current when they were made; stream and event calls fail with
//    cudaErrorInvalidResourceHandle unless the thread's current device is theirs, and a
//    copy on a stream must touch device memory of that stream's device.
//  - Streams run their operations on a thread of their own, later than queued, so a
//    caller that reuses a pinned buffer before its copy's event fires reads corrupted
//    data. From pageable memory: host-to-device copies take a snapshot of the source
//    and land later, in stream order; device-to-host copies return when done (the real
//    runtime's documented behaviour). cudaStreamDestroy returns at once and the stream
//    finishes its copies afterwards, as the real one does.
//  - cudaHostAlloc/cudaHostRegister/cudaPointerGetAttributes over tracked ranges, with
//    the real error codes for double registration and unknown pointers. Registration
//    needs readable and writable pages (/proc/self/maps), or readable ones with
//    cudaHostRegisterReadOnly (a driver without it, pinstage_fake_cuda_set_read_only_register
//    (0) or PINSTAGE_FAKE_CUDA_READ_ONLY_REGISTER=0, answers cudaErrorNotSupported (801) and
//    reports cudaDevAttrHostRegisterReadOnlySupported = 0; read-only memory with the default
//    flags is cudaErrorInvalidValue, a writable private mapping registers), and at most
//    pinstage_fake_cuda_set_max_register() bytes per call (default: no limit).
//  - cudaFreeHost or cudaHostUnregister of memory a queued copy still uses is a hazard:
//    counted (pinstage_fake_cuda_hazards) and printed, then the copy is waited for so
//    the test goes on. cudaFree synchronizes, like the real one.
//  - Injected errors (pinstage_fake_cuda_inject): the nth next call of a function fails
//    with a given error; a sticky one makes every later call fail with it, as an
//    unrecoverable error does on a GPU, until pinstage_fake_cuda_clear_sticky().
//  - Device-side work: cudaMemcpyAsync(cudaMemcpyDeviceToDevice) and cudaMemsetAsync
//    need every byte inside one device allocation of the stream's device, and a
//    device-to-device copy whose ranges overlap is refused (undefined on a GPU). They run
//    on the stream like copies; pinstage_fake_cuda_device_ops() counts those accepted.
//  - Timed events (cudaEventCreate, cudaEventElapsedTime) and the version and PCI
//    queries the probe uses.
//  - Devices as a test models them (pinstage_fake_cuda_set_device): the name, memory and
//    PCI bus id cudaGetDeviceProperties and cudaDeviceGetPCIBusId report, or an error
//    cudaGetDeviceProperties fails with. cudaDeviceGetPCIBusId wants room for the 13
//    characters CUDA documents. pinstage_fake_cuda_calls counts the calls of a function
//    (a device listing must make no context: no cudaSetDevice, cudaMalloc, ...).
// pinstage_fake_cuda_counts() reports what is still allocated (leak checks in tests).
#include <cuda_runtime_api.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <sstream>
#include <string>
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
constexpr size_t kPage = 4096;
constexpr size_t kMallocOffset = 256;  // cudaMalloc's alignment, and no more

thread_local int t_device = 0;
thread_local cudaError_t t_last = cudaSuccess;

cudaError_t fail(cudaError_t e) {
  t_last = e;
  return e;
}

struct Range {
  size_t bytes;
  int device;
  unsigned char* shadow = nullptr;  // device memory: the fake's own view of it
  void* map = nullptr;              // device memory: the PROT_NONE mapping
  size_t map_bytes = 0;
};

// One queued operation; it stays at the front of its stream's queue until it has run.
// A copy (dst, src already translated to memory the fake can touch; `host` is the host
// side the caller sees, for hazard checks) or an event marker (stamp set).
struct Op {
  void* dst = nullptr;
  const void* src = nullptr;
  size_t bytes = 0;
  const void* host = nullptr;
  std::shared_ptr<std::vector<unsigned char>> snapshot;  // a pageable source's bytes
  std::shared_ptr<std::atomic<int64_t>> stamp;           // event marker: completion time
  int fill = -1;  // cudaMemsetAsync: the byte dst is set to (src unused)
  bool touches(const void* p, size_t n) const {
    if (host == nullptr) return false;
    const auto a = reinterpret_cast<uintptr_t>(p), b = reinterpret_cast<uintptr_t>(host);
    return a < b + bytes && b < a + n;
  }
};

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Held host addresses (pinstage_fake_cuda_hold): copies touching them wait.
std::mutex g_hold_mu;
std::condition_variable g_hold_cv;
std::set<const void*> g_held;
std::atomic<size_t> g_held_waiting{0};  // copies waiting on a hold now

void wait_while_held(const Op& op) {
  auto free_to_run = [&] {
    return std::none_of(g_held.begin(), g_held.end(),
                        [&](const void* p) { return op.touches(p, 1); });
  };
  std::unique_lock lock(g_hold_mu);
  if (free_to_run()) return;
  ++g_held_waiting;
  g_hold_cv.wait(lock, free_to_run);
  --g_held_waiting;
}

struct FakeStream {
  int device;
  std::mutex mu;
  std::condition_variable cv;
  std::deque<Op> queue;
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
      const Op op = queue.front();
      lock.unlock();
      if (op.stamp) {
        op.stamp->store(now_ns());
      } else {
        wait_while_held(op);
        // Later than queued: widens the window in which a careless caller overwrites a
        // source buffer before its copy ran.
        std::this_thread::sleep_for(std::chrono::microseconds(300));
        if (op.fill >= 0)
          std::memset(op.dst, op.fill, op.bytes);
        else
          std::memcpy(op.dst, op.src, op.bytes);
      }
      lock.lock();
      queue.pop_front();
      ++done;
      cv.notify_all();
    }
  }
  uint64_t enqueue(Op op) {
    std::lock_guard lock(mu);
    queue.push_back(std::move(op));
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
  // True when a copy not yet finished reads or writes host memory [p, p + n).
  bool uses(const void* p, size_t n) {
    std::lock_guard lock(mu);
    return std::any_of(queue.begin(), queue.end(), [&](const Op& c) { return c.touches(p, n); });
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
  bool timing;
  std::shared_ptr<FakeStream> stream;  // where it was last recorded (null: never)
  uint64_t ticket = 0;
  std::shared_ptr<std::atomic<int64_t>> stamp;  // set when the marker ran
};

// A device as a test set it (pinstage_fake_cuda_set_device); empty/0 = the default.
struct DeviceModel {
  std::string name;
  size_t bytes = 0;
  std::string pci_bus_id;
  cudaError_t props_error = cudaSuccess;
};

struct Injection {
  std::string call;
  int countdown;
  cudaError_t error;
  bool sticky;
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
  size_t register_calls = 0;
  size_t d2d_copies = 0;  // accepted cudaMemcpyAsync(cudaMemcpyDeviceToDevice)
  size_t memsets = 0;     // accepted cudaMemsetAsync
  size_t max_register = SIZE_MAX;
  // cudaDevAttrHostRegisterReadOnlySupported; PINSTAGE_FAKE_CUDA_READ_ONLY_REGISTER=0 models a
  // driver without it for a whole process (the CLI, Python).
  bool read_only_register = env_int("PINSTAGE_FAKE_CUDA_READ_ONLY_REGISTER", 1) != 0;
  size_t read_only_registrations = 0;
  std::vector<Injection> injections;
  cudaError_t sticky = cudaSuccess;
  std::map<int, DeviceModel> models;
  std::map<std::string, size_t> calls;  // by function, since the process started
  State() : used(static_cast<size_t>(std::max(kDevices, 0)), 0) {}
};

State& state() {
  static State* s = new State;  // never destroyed: stream threads may outlive statics
  return *s;
}

// The error `call` fails with now (a sticky error, or an injected one), else success.
cudaError_t entry(const char* call) {
  State& s = state();
  std::lock_guard lock(s.mu);
  ++s.calls[call];
  if (s.sticky != cudaSuccess) return s.sticky;
  for (auto it = s.injections.begin(); it != s.injections.end(); ++it) {
    if (it->call != call || --it->countdown > 0) continue;
    const Injection hit = *it;
    s.injections.erase(it);
    if (hit.sticky) s.sticky = hit.error;
    return hit.error;
  }
  return cudaSuccess;
}

#define FAKE_ENTER(call)                                                        \
  do {                                                                          \
    if (const cudaError_t e_ = entry(call); e_ != cudaSuccess) return fail(e_); \
  } while (0)

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

// Device memory of `device`: its model's, else PINSTAGE_FAKE_CUDA_MEM_MB. Caller holds s.mu.
size_t device_bytes(State& s, int device) {
  auto it = s.models.find(device);
  return it != s.models.end() && it->second.bytes != 0 ? it->second.bytes : kDeviceBytes;
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

// Ends the host range of `ranges` that starts at `p` (cudaFreeHost's, cudaHostUnregister's)
// once no queued copy uses it; false when none starts there. Caller holds s.mu.
bool end_host_range(State& s, std::map<uintptr_t, Range>& ranges, const char* call, void* p) {
  auto it = ranges.find(reinterpret_cast<uintptr_t>(p));
  if (it == ranges.end()) return false;
  check_host_free(s, call, p, it->second.bytes);
  ranges.erase(it);
  return true;
}

std::shared_ptr<FakeStream> lookup_stream(State& s, cudaStream_t st) {
  auto it = s.streams.find(st);
  return it == s.streams.end() ? nullptr : it->second;
}

// True when every byte of [p, p + n) lies in mappings that are readable and writable
// (what page-locking needs; the real driver refuses read-only memory unless asked).
// Every page of [p, p + n) is mapped readable (and writable when `write`).
bool accessible(const void* p, size_t n, bool write) {
  std::ifstream maps("/proc/self/maps");
  uintptr_t need = reinterpret_cast<uintptr_t>(p);
  const uintptr_t end = need + n;
  std::string line;
  while (need < end && std::getline(maps, line)) {
    std::istringstream in(line);
    uintptr_t lo = 0, hi = 0;
    char dash = 0;
    std::string perms;
    in >> std::hex >> lo >> dash >> hi >> perms;
    if (hi <= need) continue;
    if (lo > need || perms.size() < 2 || perms[0] != 'r' || (write && perms[1] != 'w'))
      return false;
    need = hi;
  }
  return need >= end;
}

// Maps `bytes` of device memory: a PROT_NONE view for the caller, a private one for the
// fake's copies.
bool map_device(size_t bytes, Range& r) {
  r.map_bytes = (bytes + kMallocOffset + kPage - 1) / kPage * kPage;
  const int fd = memfd_create("pinstage-fake-device", MFD_CLOEXEC);
  if (fd < 0) return false;
  bool ok = ftruncate(fd, static_cast<off_t>(r.map_bytes)) == 0;
  void* shadow = MAP_FAILED;
  if (ok) r.map = mmap(nullptr, r.map_bytes, PROT_NONE, MAP_SHARED | MAP_NORESERVE, fd, 0);
  if (ok && r.map != MAP_FAILED)
    shadow = mmap(nullptr, r.map_bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, fd, 0);
  close(fd);
  if (!ok || r.map == MAP_FAILED || shadow == MAP_FAILED) {
    if (ok && r.map != MAP_FAILED) munmap(r.map, r.map_bytes);
    return false;
  }
  r.shadow = static_cast<unsigned char*>(shadow) + kMallocOffset;
  return true;
}

// Device pointer -> the fake's view of it. Caller holds s.mu; `it` is its range.
unsigned char* shadow_of(std::map<uintptr_t, Range>::iterator it, const void* p) {
  return it->second.shadow + (reinterpret_cast<uintptr_t>(p) - it->first);
}

// The errors the fake names (cudaGetErrorName), each with the real runtime's text where
// the fake gives it (cudaGetErrorString; NULL: the fake's generic text).
struct FakeError {
  cudaError_t code;
  const char* name;
  const char* text;
};
constexpr FakeError kFakeErrors[] = {
    {cudaSuccess, "cudaSuccess", "no error"},
    {cudaErrorInvalidValue, "cudaErrorInvalidValue", nullptr},
    {cudaErrorMemoryAllocation, "cudaErrorMemoryAllocation", "out of memory"},
    {cudaErrorInvalidDevice, "cudaErrorInvalidDevice", "invalid device ordinal"},
    {cudaErrorNoDevice, "cudaErrorNoDevice", "no CUDA-capable device is detected"},
    {cudaErrorDevicesUnavailable, "cudaErrorDevicesUnavailable",
     "CUDA-capable device(s) is/are busy or unavailable"},
    {cudaErrorInvalidResourceHandle, "cudaErrorInvalidResourceHandle", "invalid resource handle"},
    {cudaErrorHostMemoryAlreadyRegistered, "cudaErrorHostMemoryAlreadyRegistered", nullptr},
    {cudaErrorHostMemoryNotRegistered, "cudaErrorHostMemoryNotRegistered", nullptr},
    {cudaErrorIllegalAddress, "cudaErrorIllegalAddress",
     "an illegal memory access was encountered"},
    {cudaErrorNotReady, "cudaErrorNotReady", nullptr},
    {cudaErrorLaunchFailure, "cudaErrorLaunchFailure", nullptr},
};

const FakeError* fake_error(cudaError_t e) {
  for (const FakeError& known : kFakeErrors)
    if (known.code == e) return &known;
  return nullptr;
}

}  // namespace

extern "C" {

#define FAKE_API __attribute__((visibility("default")))

FAKE_API int pinstage_fake_cuda_counts(size_t* device_allocs, size_t* host_allocs,
                                       size_t* registered, size_t* streams, size_t* events) {
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
FAKE_API size_t pinstage_fake_cuda_hazards(void) {
  State& s = state();
  std::lock_guard lock(s.mu);
  return s.hazards;
}

// Successful cudaHostRegister calls since the process started.
FAKE_API size_t pinstage_fake_cuda_register_calls(void) {
  State& s = state();
  std::lock_guard lock(s.mu);
  return s.register_calls;
}

// Accepted device-to-device copies and memsets since the process started.
FAKE_API void pinstage_fake_cuda_device_ops(size_t* d2d_copies, size_t* memsets) {
  State& s = state();
  std::lock_guard lock(s.mu);
  *d2d_copies = s.d2d_copies;
  *memsets = s.memsets;
}

// The largest range one cudaHostRegister accepts (the real driver's limit, scaled down).
FAKE_API void pinstage_fake_cuda_set_max_register(size_t bytes) {
  State& s = state();
  std::lock_guard lock(s.mu);
  s.max_register = bytes;
}

// Whether cudaHostRegisterReadOnly is supported (default: yes); and how many read-only
// registrations were made.
FAKE_API void pinstage_fake_cuda_set_read_only_register(int supported) {
  State& s = state();
  std::lock_guard lock(s.mu);
  s.read_only_register = supported != 0;
}
FAKE_API size_t pinstage_fake_cuda_read_only_registrations() {
  State& s = state();
  std::lock_guard lock(s.mu);
  return s.read_only_registrations;
}

// The nth next call of the runtime function `call` (e.g. "cudaMemcpyAsync") fails with
// `error`; when `sticky`, that call and every later one fail with it.
FAKE_API void pinstage_fake_cuda_inject(const char* call, int nth, int error, int sticky) {
  State& s = state();
  std::lock_guard lock(s.mu);
  s.injections.push_back(Injection{call, nth, static_cast<cudaError_t>(error), sticky != 0});
}

// Models device `device`: the name, memory and PCI bus id its queries report (NULL or 0
// keeps the default: "pinstage fake GPU N", PINSTAGE_FAKE_CUDA_MEM_MB,
// "00000000:<0x10 + N>:00.0"); props_error != 0 makes cudaGetDeviceProperties of it
// fail with that error.
FAKE_API void pinstage_fake_cuda_set_device(int device, const char* name, size_t bytes,
                                            const char* pci_bus_id, int props_error) {
  State& s = state();
  std::lock_guard lock(s.mu);
  s.models[device] = DeviceModel{name ? name : "", bytes, pci_bus_id ? pci_bus_id : "",
                                 static_cast<cudaError_t>(props_error)};
}

// Every device back to the default model.
FAKE_API void pinstage_fake_cuda_reset_devices(void) {
  State& s = state();
  std::lock_guard lock(s.mu);
  s.models.clear();
}

// Calls of the runtime function `call` since the process started.
FAKE_API size_t pinstage_fake_cuda_calls(const char* call) {
  State& s = state();
  std::lock_guard lock(s.mu);
  auto it = s.calls.find(call != nullptr ? call : "");
  return it == s.calls.end() ? 0 : it->second;
}

// Ends a sticky error (no real runtime can; tests use it to clean up).
FAKE_API void pinstage_fake_cuda_clear_sticky(void) {
  State& s = state();
  std::lock_guard lock(s.mu);
  s.sticky = cudaSuccess;
  s.injections.clear();
}

// Copies whose host side touches `p` wait while it is held (on != 0).
FAKE_API void pinstage_fake_cuda_hold(const void* p, int on) {
  {
    std::lock_guard lock(g_hold_mu);
    if (on)
      g_held.insert(p);
    else
      g_held.erase(p);
  }
  g_hold_cv.notify_all();
}

// Copies waiting on a hold now.
FAKE_API size_t pinstage_fake_cuda_held_waiting(void) { return g_held_waiting.load(); }

cudaError_t cudaGetLastError(void) {
  const cudaError_t sticky = entry("cudaGetLastError");
  if (sticky != cudaSuccess) return sticky;  // not cleared: it is sticky
  return std::exchange(t_last, cudaSuccess);
}
cudaError_t cudaPeekAtLastError(void) {
  const cudaError_t sticky = entry("cudaPeekAtLastError");
  return sticky != cudaSuccess ? sticky : t_last;
}

const char* cudaGetErrorName(cudaError_t e) {
  const FakeError* known = fake_error(e);
  return known != nullptr ? known->name : "cudaErrorUnknown";
}

const char* cudaGetErrorString(cudaError_t e) {
  const FakeError* known = fake_error(e);
  return known != nullptr && known->text != nullptr ? known->text : "fake CUDA runtime error";
}

cudaError_t cudaDriverGetVersion(int* version) {
  FAKE_ENTER("cudaDriverGetVersion");
  if (version == nullptr) return fail(cudaErrorInvalidValue);
  *version = 13000;
  return cudaSuccess;
}

cudaError_t cudaRuntimeGetVersion(int* version) {
  FAKE_ENTER("cudaRuntimeGetVersion");
  if (version == nullptr) return fail(cudaErrorInvalidValue);
  *version = CUDART_VERSION;
  return cudaSuccess;
}

cudaError_t cudaGetDeviceCount(int* count) {
  FAKE_ENTER("cudaGetDeviceCount");
  if (count == nullptr) return fail(cudaErrorInvalidValue);
  *count = kDevices;
  return kDevices > 0 ? cudaSuccess : fail(cudaErrorNoDevice);
}

cudaError_t cudaSetDevice(int device) {
  FAKE_ENTER("cudaSetDevice");
  if (device < 0 || device >= kDevices) return fail(cudaErrorInvalidDevice);
  t_device = device;
  return cudaSuccess;
}

cudaError_t cudaGetDevice(int* device) {
  FAKE_ENTER("cudaGetDevice");
  if (device == nullptr) return fail(cudaErrorInvalidValue);
  *device = t_device;
  return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  FAKE_ENTER("cudaGetDeviceProperties");
  if (prop == nullptr || device < 0 || device >= kDevices) return fail(cudaErrorInvalidValue);
  State& s = state();
  std::lock_guard lock(s.mu);
  const DeviceModel& model = s.models[device];
  if (model.props_error != cudaSuccess) return fail(model.props_error);
  std::memset(prop, 0, sizeof *prop);
  if (model.name.empty())
    std::snprintf(prop->name, sizeof prop->name, "pinstage fake GPU %d", device);
  else
    std::snprintf(prop->name, sizeof prop->name, "%s", model.name.c_str());
  prop->totalGlobalMem = device_bytes(s, device);
  prop->asyncEngineCount = 2;
  return cudaSuccess;
}

// cudaDevAttrHostRegisterReadOnlySupported follows the fake's read-only registration
// (a B300 with CUDA 13.4 reports 0); every other attribute is unknown here.
cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
  FAKE_ENTER("cudaDeviceGetAttribute");
  if (value == nullptr || device < 0 || device >= kDevices) return fail(cudaErrorInvalidValue);
  if (attr != cudaDevAttrHostRegisterReadOnlySupported) return fail(cudaErrorInvalidValue);
  State& s = state();
  std::lock_guard lock(s.mu);
  *value = s.read_only_register ? 1 : 0;
  return cudaSuccess;
}

cudaError_t cudaDeviceGetPCIBusId(char* bus, int len, int device) {
  FAKE_ENTER("cudaDeviceGetPCIBusId");
  // CUDA documents room for 13 characters ("0000:3B:00.0" and its NUL).
  if (bus == nullptr || len < 13 || device < 0 || device >= kDevices)
    return fail(cudaErrorInvalidValue);
  State& s = state();
  std::lock_guard lock(s.mu);
  const std::string& model = s.models[device].pci_bus_id;
  if (model.empty())
    std::snprintf(bus, static_cast<size_t>(len), "00000000:%02X:00.0", 0x10 + device);
  else
    std::snprintf(bus, static_cast<size_t>(len), "%s", model.c_str());
  return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total) {
  FAKE_ENTER("cudaMemGetInfo");
  if (free_bytes == nullptr || total == nullptr) return fail(cudaErrorInvalidValue);
  State& s = state();
  std::lock_guard lock(s.mu);
  *total = device_bytes(s, t_device);
  *free_bytes = *total - s.used[static_cast<size_t>(t_device)];
  return cudaSuccess;
}

cudaError_t cudaMalloc(void** p, size_t bytes) {
  FAKE_ENTER("cudaMalloc");
  if (p == nullptr) return fail(cudaErrorInvalidValue);
  *p = nullptr;
  if (bytes == 0) return cudaSuccess;
  State& s = state();
  std::lock_guard lock(s.mu);
  size_t& used = s.used[static_cast<size_t>(t_device)];
  if (bytes > device_bytes(s, t_device) - used) return fail(cudaErrorMemoryAllocation);
  Range r{bytes, t_device};
  if (!map_device(bytes, r)) return fail(cudaErrorMemoryAllocation);
  void* mem = static_cast<unsigned char*>(r.map) + kMallocOffset;
  s.device.emplace(reinterpret_cast<uintptr_t>(mem), r);
  used += bytes;
  *p = mem;
  return cudaSuccess;
}

cudaError_t cudaFree(void* p) {
  FAKE_ENTER("cudaFree");
  if (p == nullptr) return cudaSuccess;
  State& s = state();
  std::unique_lock lock(s.mu);
  auto it = s.device.find(reinterpret_cast<uintptr_t>(p));
  if (it == s.device.end()) return fail(cudaErrorInvalidValue);
  const Range r = it->second;
  s.used[static_cast<size_t>(r.device)] -= r.bytes;
  s.device.erase(it);
  // cudaFree synchronizes the device: no queued copy may still touch the memory.
  auto streams = all_streams(s);
  lock.unlock();
  for (auto& st : streams) st->drain();
  munmap(r.map, r.map_bytes);
  munmap(r.shadow - kMallocOffset, r.map_bytes);
  return cudaSuccess;
}

cudaError_t cudaHostAlloc(void** p, size_t bytes, unsigned int flags) {
  FAKE_ENTER("cudaHostAlloc");
  if (p == nullptr || bytes == 0) return fail(cudaErrorInvalidValue);
  if (flags & cudaHostAllocWriteCombined) return fail(cudaErrorInvalidValue);  // never wanted
  void* mem = std::aligned_alloc(kPage, (bytes + kPage - 1) / kPage * kPage);
  if (mem == nullptr) return fail(cudaErrorMemoryAllocation);
  State& s = state();
  std::lock_guard lock(s.mu);
  s.host_alloc.emplace(reinterpret_cast<uintptr_t>(mem), Range{bytes, t_device});
  *p = mem;
  return cudaSuccess;
}

cudaError_t cudaFreeHost(void* p) {
  FAKE_ENTER("cudaFreeHost");
  if (p == nullptr) return cudaSuccess;
  State& s = state();
  std::lock_guard lock(s.mu);
  if (!end_host_range(s, s.host_alloc, "cudaFreeHost", p)) return fail(cudaErrorInvalidValue);
  std::free(p);
  return cudaSuccess;
}

cudaError_t cudaHostRegister(void* p, size_t bytes, unsigned int flags) {
  FAKE_ENTER("cudaHostRegister");
  if (p == nullptr || bytes == 0) return fail(cudaErrorInvalidValue);
  State& s = state();
  std::lock_guard lock(s.mu);
  const bool read_only = (flags & cudaHostRegisterReadOnly) != 0;
  if (read_only && !s.read_only_register) return fail(cudaErrorNotSupported);
  if (bytes > s.max_register) return fail(cudaErrorInvalidValue);
  if (overlaps(s.registered, p, bytes) || overlaps(s.host_alloc, p, bytes))
    return fail(cudaErrorHostMemoryAlreadyRegistered);
  if (!accessible(p, bytes, !read_only)) return fail(cudaErrorInvalidValue);
  s.registered.emplace(reinterpret_cast<uintptr_t>(p), Range{bytes, t_device});
  ++s.register_calls;
  if (read_only) ++s.read_only_registrations;
  return cudaSuccess;
}

cudaError_t cudaHostUnregister(void* p) {
  FAKE_ENTER("cudaHostUnregister");
  State& s = state();
  std::lock_guard lock(s.mu);
  if (!end_host_range(s, s.registered, "cudaHostUnregister", p))
    return fail(cudaErrorHostMemoryNotRegistered);
  return cudaSuccess;
}

cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* attr, const void* p) {
  FAKE_ENTER("cudaPointerGetAttributes");
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
  FAKE_ENTER("cudaStreamCreateWithFlags");
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
  FAKE_ENTER("cudaStreamDestroy");
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
  FAKE_ENTER("cudaStreamSynchronize");
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

// Device-side work on `handle`: a copy from device `src` (fill < 0) or a memset to `fill`.
// Every range lies in one device allocation of the stream's device, a copy's ranges do
// not overlap, and the thread's current device is the stream's. Runs in stream order.
static cudaError_t device_op(void* dst, const void* src, int fill, size_t bytes,
                             cudaStream_t handle) {
  State& s = state();
  std::shared_ptr<FakeStream> st;
  Op op;
  op.bytes = bytes;
  op.fill = fill;
  {
    std::lock_guard lock(s.mu);
    auto to = find_in(s.device, dst, bytes);
    if (to == s.device.end()) return fail(cudaErrorInvalidValue);
    op.dst = shadow_of(to, dst);
    int device = to->second.device;
    if (fill < 0) {
      auto from = find_in(s.device, src, bytes);
      if (from == s.device.end() || from->second.device != device)
        return fail(cudaErrorInvalidValue);
      const auto a = reinterpret_cast<uintptr_t>(dst), b = reinterpret_cast<uintptr_t>(src);
      if (a < b + bytes && b < a + bytes) return fail(cudaErrorInvalidValue);  // overlap
      op.src = shadow_of(from, src);
    }
    if (handle != nullptr) {
      st = lookup_stream(s, handle);
      if (!st || st->device != t_device) return fail(cudaErrorInvalidResourceHandle);
      if (device != st->device) return fail(cudaErrorInvalidValue);
    }
    ++(fill < 0 ? s.d2d_copies : s.memsets);
  }
  if (!st) {  // legacy stream: done when the call returns
    if (fill >= 0)
      std::memset(op.dst, fill, bytes);
    else
      std::memcpy(op.dst, op.src, bytes);
    return cudaSuccess;
  }
  st->enqueue(std::move(op));
  return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void* dst, int value, size_t bytes, cudaStream_t handle) {
  FAKE_ENTER("cudaMemsetAsync");
  if (dst == nullptr) return fail(cudaErrorInvalidValue);
  return device_op(dst, nullptr, value & 0xff, bytes, handle);
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t handle) {
  FAKE_ENTER("cudaMemcpyAsync");
  if (dst == nullptr || src == nullptr) return fail(cudaErrorInvalidValue);
  if (kind == cudaMemcpyDeviceToDevice) return device_op(dst, src, -1, bytes, handle);
  if (kind != cudaMemcpyHostToDevice && kind != cudaMemcpyDeviceToHost)
    return fail(cudaErrorInvalidMemcpyDirection);
  const bool h2d = kind == cudaMemcpyHostToDevice;
  State& s = state();
  std::shared_ptr<FakeStream> st;
  Op op;
  bool host_pinned;
  {
    std::lock_guard lock(s.mu);
    const void* dev = h2d ? dst : src;
    op.host = h2d ? src : dst;
    auto range = find_in(s.device, dev, bytes);
    if (range == s.device.end()) return fail(cudaErrorInvalidValue);
    host_pinned = is_pinned(s, op.host, bytes);
    if (handle != nullptr) {
      st = lookup_stream(s, handle);
      if (!st) return fail(cudaErrorInvalidResourceHandle);
      // A stream's copies touch its own device's memory.
      if (range->second.device != st->device) return fail(cudaErrorInvalidValue);
    }
    op.dst = h2d ? shadow_of(range, dst) : dst;
    op.src = h2d ? src : shadow_of(range, src);
    op.bytes = bytes;
  }
  if (st && st->device != t_device) return fail(cudaErrorInvalidResourceHandle);
  if (!st || (!host_pinned && !h2d)) {
    // Legacy stream, or pageable destination: done when the call returns.
    if (st) st->drain();
    std::memcpy(op.dst, op.src, bytes);
    return cudaSuccess;
  }
  if (!host_pinned) {
    // Pageable source: after the stream's earlier work, staged now, landing later.
    st->drain();
    op.snapshot = std::make_shared<std::vector<unsigned char>>(
        static_cast<const unsigned char*>(src), static_cast<const unsigned char*>(src) + bytes);
    op.src = op.snapshot->data();
    op.host = nullptr;  // the caller may reuse its buffer at once
  }
  st->enqueue(std::move(op));
  return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* out, unsigned int flags) {
  FAKE_ENTER("cudaEventCreateWithFlags");
  if (out == nullptr) return fail(cudaErrorInvalidValue);
  auto* e = new FakeEvent{t_device, (flags & cudaEventDisableTiming) == 0, nullptr, 0, nullptr};
  State& s = state();
  std::lock_guard lock(s.mu);
  s.events.insert(e);
  *out = reinterpret_cast<cudaEvent_t>(e);
  return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t* out) { return cudaEventCreateWithFlags(out, 0); }

cudaError_t cudaEventDestroy(cudaEvent_t handle) {
  FAKE_ENTER("cudaEventDestroy");
  auto* e = reinterpret_cast<FakeEvent*>(handle);
  State& s = state();
  std::lock_guard lock(s.mu);
  if (s.events.erase(e) == 0) return fail(cudaErrorInvalidResourceHandle);
  delete e;
  return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t handle, cudaStream_t stream) {
  FAKE_ENTER("cudaEventRecord");
  auto* e = reinterpret_cast<FakeEvent*>(handle);
  State& s = state();
  std::lock_guard lock(s.mu);
  if (s.events.count(e) == 0) return fail(cudaErrorInvalidResourceHandle);
  auto st = lookup_stream(s, stream);
  if (!st || st->device != t_device || e->device != t_device)
    return fail(cudaErrorInvalidResourceHandle);
  e->stream = st;
  e->stamp = std::make_shared<std::atomic<int64_t>>(0);
  Op marker;
  marker.stamp = e->stamp;
  e->ticket = st->enqueue(std::move(marker));
  return cudaSuccess;
}

// The stream and ticket an event was last recorded at (a null stream: never recorded).
static cudaError_t event_mark(cudaEvent_t handle, std::shared_ptr<FakeStream>* st,
                              uint64_t* ticket) {
  auto* e = reinterpret_cast<FakeEvent*>(handle);
  State& s = state();
  std::lock_guard lock(s.mu);
  if (s.events.count(e) == 0) return fail(cudaErrorInvalidResourceHandle);
  *st = e->stream;
  *ticket = e->ticket;
  return cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t handle) {
  FAKE_ENTER("cudaEventQuery");
  std::shared_ptr<FakeStream> st;
  uint64_t ticket = 0;
  if (const cudaError_t e = event_mark(handle, &st, &ticket); e != cudaSuccess) return e;
  if (!st) return cudaSuccess;  // never recorded: complete, as on a GPU
  std::lock_guard lock(st->mu);
  return st->done >= ticket ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t cudaEventSynchronize(cudaEvent_t handle) {
  FAKE_ENTER("cudaEventSynchronize");
  std::shared_ptr<FakeStream> st;
  uint64_t ticket = 0;
  if (const cudaError_t e = event_mark(handle, &st, &ticket); e != cudaSuccess) return e;
  if (st) st->wait_for(ticket);
  return cudaSuccess;
}

cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t stop) {
  FAKE_ENTER("cudaEventElapsedTime");
  if (ms == nullptr) return fail(cudaErrorInvalidValue);
  auto* a = reinterpret_cast<FakeEvent*>(start);
  auto* b = reinterpret_cast<FakeEvent*>(stop);
  State& s = state();
  std::lock_guard lock(s.mu);
  if (s.events.count(a) == 0 || s.events.count(b) == 0 || !a->timing || !b->timing)
    return fail(cudaErrorInvalidResourceHandle);
  if (!a->stamp || !b->stamp) return fail(cudaErrorInvalidResourceHandle);  // never recorded
  const int64_t t0 = a->stamp->load(), t1 = b->stamp->load();
  if (t0 == 0 || t1 == 0) return fail(cudaErrorNotReady);
  *ms = static_cast<float>(static_cast<double>(t1 - t0) / 1e6);
  return cudaSuccess;
}

}  // extern "C"
