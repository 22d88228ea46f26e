// The cuda backend on a GPU (ctest label requires_gpu). Without a usable device every
// test is skipped with the reason, so ctest reports them as skipped, never passed.
// The same binary runs on the fake runtime as fake_cuda.* (see tests/cpp/cuda.cmake).
// Bookkeeping the runtime does for every backend (unknown pointers, ranges outside an
// allocation, what finalize releases) is tested here through pinstage::Worker.
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <future>
#include <initializer_list>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "backends/cuda/cuda_status.h"
#include "host_source_checks.h"
#include "pinstage/backend/cuda_ext.h"
#include "pinstage/backend/platform_abi.h"
#include "pinstage/bind.h"
#include "pinstage/tensor.h"
#include "pinstage/worker.h"

namespace {

using pinstage::Error;
using pinstage::ErrorCode;
using pinstage::Worker;
using pinstage::WorkerOptions;

// Why GPU tests cannot run here, or "" when a device is usable.
const std::string& gpu_skip_reason() {
  static const std::string reason = [] {
    int count = 0;
    const cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess)
      return "no usable CUDA device: cudaGetDeviceCount: " + pinstage::cuda::cuda_error_text(err);
    if (count == 0) return std::string("no CUDA device visible");
    return std::string();
  }();
  return reason;
}

#define REQUIRE_GPU()                                                  \
  do {                                                                 \
    if (!gpu_skip_reason().empty()) GTEST_SKIP() << gpu_skip_reason(); \
  } while (0)

int device_count() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// Deterministic bytes that differ per seed and per position (not a repeating pattern).
void fill(void* dst, size_t bytes, uint64_t seed) {
  auto* p = static_cast<unsigned char*>(dst);
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (size_t i = 0; i < bytes; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    p[i] = static_cast<unsigned char>(x >> 56);
  }
}

cudaMemoryType memory_type(const void* p, int* device = nullptr) {
  cudaPointerAttributes attr{};
  if (cudaPointerGetAttributes(&attr, p) != cudaSuccess) {
    (void)cudaGetLastError();
    return cudaMemoryTypeUnregistered;
  }
  if (device != nullptr) *device = attr.device;
  return attr.type;
}

// These tests pin down what the plugin is asked to pin, so the worker's pool caches
// nothing: each request is exactly one segment, pinned once and released at its free.
WorkerOptions with_config(pinstage::BackendConfig config, uint64_t capacity = 0) {
  WorkerOptions o;
  o.config = std::move(config);
  o.device_capacity_bytes = capacity;
  o.host_cache_limit_bytes = 0;
  return o;
}

// The worker's "cuda.pin_stats" extension, called on its own context.
ps_cuda_pin_stats pin_stats(const Worker& worker) {
  auto fn =
      reinterpret_cast<ps_cuda_pin_stats_fn>(worker.backend_extension(PS_CUDA_PIN_STATS_NAME));
  if (fn == nullptr) throw std::runtime_error("the cuda worker has no cuda.pin_stats");
  ps_cuda_pin_stats s{};
  if (fn(worker.native_context(), &s) != PS_OK) throw std::runtime_error("cuda.pin_stats failed");
  return s;
}

// Direct access to the plugin, for what the slots promise the runtime (what travels in
// ps_allocation, what destroy_context and stream_destroy do).
const ps_platform_api& raw() {
  static const ps_platform_api* api = [] {
    void* h = dlopen(PINSTAGE_CUDA_PLUGIN_PATH, RTLD_NOW | RTLD_LOCAL);
    if (h == nullptr) return static_cast<const ps_platform_api*>(nullptr);
    auto entry = reinterpret_cast<ps_platform_entry_fn>(dlsym(h, PINSTAGE_PLATFORM_ENTRY_SYMBOL));
    return entry ? entry() : nullptr;
  }();
  if (api == nullptr) throw std::runtime_error("cannot load the cuda plugin");
  return *api;
}

struct CtxDeleter {
  void operator()(ps_device_ctx* c) const { EXPECT_EQ(raw().destroy_context(c), PS_OK); }
};
using Ctx = std::unique_ptr<ps_device_ctx, CtxDeleter>;

Ctx make_ctx(std::initializer_list<ps_config_entry> config = {}, int device = 0) {
  const ps_context_options options{0, config.begin(), config.size(), -1};
  ps_device_ctx* c = nullptr;
  const int status = raw().create_context(device, &options, &c);
  if (status != PS_OK)
    throw std::runtime_error(std::string("create_context: ") + ps_status_str(status) + " " +
                             raw().last_error());
  return Ctx(c);
}

// Under the fake runtime (ctest "fake_cuda.*") every test must leave nothing allocated
// in the runtime and free no host memory a queued copy still uses: the fake counts both;
// the real runtime has no such symbols.
using FakeCounts = int (*)(size_t*, size_t*, size_t*, size_t*, size_t*);
using FakeHazards = size_t (*)();

FakeHazards fake_hazards() {
  return reinterpret_cast<FakeHazards>(dlsym(RTLD_DEFAULT, "pinstage_fake_cuda_hazards"));
}

// A symbol of the fake runtime (tests/cpp/test_cuda_fake_runtime.cpp), or null on a real
// one: tests that steer the fake skip on a GPU.
template <class Fn>
Fn fake_fn(const char* name) {
  return reinterpret_cast<Fn>(dlsym(RTLD_DEFAULT, name));
}

#define REQUIRE_FAKE(fn)                                                              \
  do {                                                                                \
    REQUIRE_GPU();                                                                    \
    if ((fn) == nullptr) GTEST_SKIP() << "needs the fake CUDA runtime (fake_cuda.*)"; \
  } while (0)

using FakeInject = void (*)(const char*, int, int, int);
using FakeVoid = void (*)();
using FakeSetMax = void (*)(size_t);
using FakeCount = size_t (*)();
using FakeHold = void (*)(const void*, int);

// Pinned memory of `bytes` filled from `seed` (the runtime's own, an anonymous mapping
// host_register pins, or the plugin's vendor allocation), a device buffer as large and a
// stream: where the tests of a release under queued copies start. `expect` is its bytes.
struct QueuedCopies {
  void set_up(ps_device_ctx* ctx, size_t bytes, uint64_t seed, bool registered) {
    const ps_platform_api& a = raw();
    this->registered = registered;
    if (registered) {
      void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      ASSERT_NE(p, MAP_FAILED);
      pinned = ps_allocation{p, bytes, nullptr};
      ASSERT_EQ(a.host_register(ctx, p, bytes, 0), PS_OK) << a.last_error();
    } else {
      ASSERT_EQ(a.host_alloc_pinned(ctx, bytes, &pinned), PS_OK) << a.last_error();
    }
    ASSERT_EQ(a.device_malloc(ctx, bytes, &dev), PS_OK) << a.last_error();
    fill(pinned.ptr, bytes, seed);
    expect.resize(bytes);
    fill(expect.data(), bytes, seed);
    ASSERT_EQ(a.stream_create(ctx, &stream), PS_OK);
  }
  // Releases the pinned memory the way it was made, with no wait of its own: the slot's
  // status (the runtime's memory is unmapped right after its host_unregister).
  int release(ps_device_ctx* ctx) {
    if (!registered) return raw().host_free_pinned(ctx, &pinned);
    const int status = raw().host_unregister(ctx, pinned.ptr, pinned.bytes);
    munmap(pinned.ptr, pinned.bytes);
    return status;
  }
  bool registered = false;
  ps_allocation pinned{}, dev{};
  ps_stream* stream = nullptr;
  std::vector<unsigned char> expect;
};

class CudaGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    if (auto hazards = fake_hazards()) hazards_before_ = hazards();
  }
  void TearDown() override {
    auto counts = reinterpret_cast<FakeCounts>(dlsym(RTLD_DEFAULT, "pinstage_fake_cuda_counts"));
    if (counts == nullptr || !gpu_skip_reason().empty()) return;
    size_t device = 0, host = 0, registered = 0, streams = 0, events = 0;
    counts(&device, &host, &registered, &streams, &events);
    EXPECT_EQ(device, 0u) << "device allocations left";
    EXPECT_EQ(host, 0u) << "cudaHostAlloc buffers left";
    EXPECT_EQ(registered, 0u) << "registered ranges left";
    EXPECT_EQ(streams, 0u) << "streams left";
    EXPECT_EQ(events, 0u) << "events left";
    if (auto hazards = fake_hazards()) {
      EXPECT_EQ(hazards() - hazards_before_, 0u)
          << "host memory freed while a queued copy still used it";
    }
  }

 private:
  size_t hazards_before_ = 0;
};

// ---- pinned host memory ----

// The pool's memory is the runtime's own, registered (cudaHostRegister) for every size,
// with huge pages or not (the one switch, PINSTAGE_HOST_HUGE_PAGES), and unregistered at
// its free.
TEST_F(CudaGpu, PinnedAllocRegistersTheRuntimesMemoryAndReleasesIt) {
  REQUIRE_GPU();
  for (const char* huge : {"off", "thp"}) {
    SCOPED_TRACE(std::string("PINSTAGE_HOST_HUGE_PAGES=") + huge);
    const pinstage::test::ScopedEnv env("PINSTAGE_HOST_HUGE_PAGES", huge);
    Worker worker;
    worker.init("cuda", 0, with_config({}));
    EXPECT_TRUE(worker.capabilities().pinned_is_page_locked);
    EXPECT_FALSE(worker.capabilities().device_memory_is_host);
    EXPECT_FALSE(worker.capabilities().execute);
    EXPECT_EQ(worker.host_placement().pool_source, "anonymous");
    std::vector<std::pair<void*, size_t>> seen;
    {
      std::vector<pinstage::PinnedHostBuffer> buffers;
      for (size_t bytes : {size_t{1}, size_t{4097}, (size_t{3} << 20) + 5, size_t{64} << 20}) {
        buffers.push_back(worker.alloc_pinned_host(bytes));
        auto& b = buffers.back();
        ASSERT_TRUE(b);
        EXPECT_EQ(b.size(), bytes);
        EXPECT_EQ(memory_type(b.data()), cudaMemoryTypeHost) << bytes << " bytes not page-locked";
        fill(b.data(), bytes, bytes);  // the host can write and read it all
        std::vector<unsigned char> expect(bytes);
        fill(expect.data(), bytes, bytes);
        EXPECT_EQ(std::memcmp(b.data(), expect.data(), bytes), 0);
        seen.emplace_back(b.data(), bytes);
      }
      EXPECT_EQ(worker.stats().pinned_count, 4u);
      const ps_cuda_pin_stats s = pin_stats(worker);
      EXPECT_EQ(s.register_count, 4u);
      EXPECT_EQ(s.alloc_count, 0u);
      EXPECT_EQ(s.last_mode, PS_CUDA_PIN_REGISTER);
    }  // unregistered and unmapped here
    EXPECT_EQ(worker.stats().pinned_count, 0u);
    for (const auto& [ptr, bytes] : seen)
      EXPECT_NE(memory_type(ptr), cudaMemoryTypeHost) << bytes << " bytes still page-locked";
  }
}

// The plugin pins the runtime's memory (host_register); its own allocation, the vendor
// source, is cudaHostAlloc, taken only where the runtime cannot use its own memory.
TEST_F(CudaGpu, TheRuntimesMemoryIsRegisteredAndTheVendorSlotIsCudaHostAlloc) {
  REQUIRE_GPU();
  Worker worker;
  worker.init("cuda", 0, with_config({}));
  auto large = worker.alloc_pinned_host(size_t{2} << 20);
  const ps_cuda_pin_stats s = pin_stats(worker);
  EXPECT_EQ(s.last_mode, PS_CUDA_PIN_REGISTER);
  EXPECT_EQ(s.alloc_count, 0u);
  EXPECT_EQ(s.register_count, 1u);
  EXPECT_EQ(s.register_bytes, size_t{2} << 20);
  EXPECT_EQ(memory_type(large.data()), cudaMemoryTypeHost);
  void* large_ptr = large.data();
  large.reset();
  EXPECT_NE(memory_type(large_ptr), cudaMemoryTypeHost);
  Ctx ctx = make_ctx();
  ps_allocation vendor{};
  ASSERT_EQ(raw().host_alloc_pinned(ctx.get(), 4096, &vendor), PS_OK) << raw().last_error();
  EXPECT_EQ(memory_type(vendor.ptr), cudaMemoryTypeHost);
  EXPECT_EQ(raw().host_free_pinned(ctx.get(), &vendor), PS_OK);
}

// What a slot needs to release pinned memory travels in the call (no table in the
// backend): the vendor source's cudaHostAlloc carries no handle, and a range the runtime
// made is unregistered by the same (ptr, bytes) it was registered with.
TEST_F(CudaGpu, PinnedAllocationsCarryWhatReleasesThem) {
  REQUIRE_GPU();
  Ctx ctx = make_ctx();
  const ps_platform_api& a = raw();
  ps_allocation vendor{};
  ASSERT_EQ(a.host_alloc_pinned(ctx.get(), 4096, &vendor), PS_OK) << a.last_error();
  EXPECT_EQ(vendor.bytes, 4096u);
  EXPECT_EQ(vendor.handle, nullptr);
  const size_t bytes = size_t{1} << 20;
  void* mine = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(mine, MAP_FAILED);
  ASSERT_EQ(a.host_register(ctx.get(), mine, bytes, 0), PS_OK) << a.last_error();
  EXPECT_EQ(memory_type(vendor.ptr), cudaMemoryTypeHost);
  EXPECT_EQ(memory_type(mine), cudaMemoryTypeHost);
  ps_allocation device{};
  ASSERT_EQ(a.device_malloc(ctx.get(), 4096, &device), PS_OK);
  EXPECT_EQ(device.handle, nullptr);
  EXPECT_EQ(a.host_free_pinned(ctx.get(), &vendor), PS_OK);
  EXPECT_EQ(a.host_unregister(ctx.get(), mine, bytes), PS_OK) << a.last_error();
  EXPECT_EQ(a.device_free(ctx.get(), &device), PS_OK);
  EXPECT_NE(memory_type(vendor.ptr), cudaMemoryTypeHost);
  EXPECT_NE(memory_type(mine), cudaMemoryTypeHost);
  EXPECT_EQ(munmap(mine, bytes), 0);
  uint64_t capacity = 0, committed = 1;
  ASSERT_EQ(a.mem_info(ctx.get(), &capacity, &committed), PS_OK);
  EXPECT_EQ(committed, 0u);
}

// ---- copies ----

struct Case {
  size_t bytes;
  size_t offset;
};
const Case kOddCases[] = {
    {1, 0}, {3, 1}, {4097, 7}, {(size_t{1} << 20) + 3, 4095}, {(size_t{5} << 20) + 1, 123}};

TEST_F(CudaGpu, CopyRoundTripsAreBitExactForOddSizesAndOffsets) {
  REQUIRE_GPU();
  Worker worker;
  worker.init("cuda", 0);
  auto dev = worker.alloc_device((size_t{6} << 20) + 13);
  auto pinned = worker.alloc_pinned_host((size_t{6} << 20) + 1);
  auto stream = worker.create_stream();
  uint64_t seed = 1;
  for (const Case& c : kOddCases) {
    for (int variant = 0; variant < 4; ++variant) {
      SCOPED_TRACE(std::to_string(c.bytes) + " bytes at offset " + std::to_string(c.offset) +
                   ", variant " + std::to_string(variant));
      const bool from_pinned = variant & 1;
      const bool async = variant & 2;
      // Pageable sources start one byte into a heap block: not even 2-byte aligned.
      std::vector<unsigned char> pageable(c.bytes + 1);
      unsigned char* src =
          from_pinned ? static_cast<unsigned char*>(pinned.data()) + 1 : pageable.data() + 1;
      fill(src, c.bytes, ++seed);
      std::vector<unsigned char> back(c.bytes + 2, 0xEE);
      if (async) {
        worker.copy_to_device_async(dev, c.offset, src, c.bytes, stream);
        worker.copy_to_host_async(back.data() + 1, dev, c.offset, c.bytes, stream);
        worker.synchronize(stream);
      } else {
        worker.copy_to_device(dev, c.offset, src, c.bytes);
        worker.copy_to_host(back.data() + 1, dev, c.offset, c.bytes);
      }
      ASSERT_EQ(std::memcmp(back.data() + 1, src, c.bytes), 0);
      EXPECT_EQ(back.front(), 0xEE);  // nothing written outside the range
      EXPECT_EQ(back.back(), 0xEE);
    }
  }
}

// Moved from the plugin to the runtime's one allocation table: a copy whose device
// side is not inside one allocation of this worker is refused before the backend runs.
TEST_F(CudaGpu, WorkerRefusesCopiesOutsideTheBuffer) {
  REQUIRE_GPU();
  Worker worker;
  worker.init("cuda", 0);
  auto dev = worker.alloc_device(4096);
  std::vector<unsigned char> host(8192, 0x11);
  worker.copy_to_device(dev, 0, host.data(), 4096);
  std::vector<unsigned char> other(8192, 0x22);
  auto refused = [&](auto&& call) {
    try {
      call();
      ADD_FAILURE() << "the copy was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::invalid_argument) << e.what();
    }
  };
  refused([&] { worker.copy_to_device(dev, 1, other.data(), 4096); });
  refused([&] { worker.copy_to_device(dev, 4097, other.data(), 0); });
  refused([&] { worker.copy_to_host(other.data(), dev, 0, 4097); });
  refused([&] { worker.copy_to_host(other.data(), dev, SIZE_MAX, 2); });
  auto stream = worker.create_stream();
  refused([&] { worker.copy_to_device_async(dev, 4000, other.data(), 97, stream); });
  worker.synchronize(stream);
  // Nothing was written by the refusals.
  std::vector<unsigned char> back(4096, 0);
  worker.copy_to_host(back.data(), dev, 0, 4096);
  EXPECT_EQ(std::memcmp(back.data(), host.data(), 4096), 0);
  // A released buffer is empty and refused too.
  dev.reset();
  refused([&] { worker.copy_to_device(dev, 0, host.data(), 16); });
}

// Moved from the plugin (it refused pointers it had not handed out): now the runtime
// refuses another worker's buffer, stream and event, and leaves them alone.
TEST_F(CudaGpu, WorkerRefusesAnotherWorkersBufferStreamAndEvent) {
  REQUIRE_GPU();
  Worker mine, theirs;
  mine.init("cuda", 0);
  theirs.init("cuda", device_count() - 1);
  auto their_dev = theirs.alloc_device(4096);
  auto their_stream = theirs.create_stream();
  auto their_event = theirs.create_event();
  std::vector<unsigned char> host(4096, 0x33);
  theirs.copy_to_device(their_dev, 0, host.data(), host.size());
  std::vector<unsigned char> other(4096, 0x44);
  EXPECT_THROW(mine.copy_to_device(their_dev, 0, other.data(), 16), Error);
  EXPECT_THROW(mine.copy_to_host(other.data(), their_dev, 0, 16), Error);
  auto my_dev = mine.alloc_device(4096);
  EXPECT_THROW(mine.copy_to_device_async(my_dev, 0, other.data(), 16, their_stream), Error);
  auto my_stream = mine.create_stream();
  EXPECT_THROW(mine.record(their_event, my_stream), Error);
  EXPECT_EQ(other[0], 0x44);
  // Their memory is untouched and still theirs.
  EXPECT_EQ(memory_type(their_dev.data()), cudaMemoryTypeDevice);
  std::vector<unsigned char> back(4096, 0);
  theirs.copy_to_host(back.data(), their_dev, 0, back.size());
  EXPECT_EQ(back, host);
  EXPECT_EQ(mine.stats().device_count, 1u);
  EXPECT_EQ(theirs.stats().device_count, 1u);
}

// The staging ring pattern on the worker's async API: fill buffer k+1 while buffer k is
// copying; reuse of a buffer waits on its event.
void ring_upload(Worker& w, const pinstage::DeviceBuffer& dst, const unsigned char* src,
                 size_t bytes, size_t chunk, size_t count) {
  std::vector<pinstage::PinnedHostBuffer> ring;
  std::vector<pinstage::Event> done;
  std::vector<bool> used(count, false);
  for (size_t i = 0; i < count; ++i) {
    ring.push_back(w.alloc_pinned_host(chunk));
    done.push_back(w.create_event());
  }
  auto stream = w.create_stream();
  for (size_t off = 0, k = 0; off < bytes; off += chunk, k = (k + 1) % count) {
    const size_t n = std::min(chunk, bytes - off);
    if (used[k]) w.wait(done[k]);
    std::memcpy(ring[k].data(), src + off, n);
    w.copy_to_device_async(dst, off, ring[k].data(), n, stream);
    w.record(done[k], stream);
    used[k] = true;
  }
  w.synchronize(stream);
}

TEST_F(CudaGpu, StagingRingIsBitExactAroundTheChunkSize) {
  REQUIRE_GPU();
  Worker worker;
  worker.init("cuda", 0);
  const size_t chunk = size_t{1} << 20;
  uint64_t seed = 100;
  for (size_t bytes : {chunk - 1, chunk, chunk + 1, 2 * chunk, 3 * chunk + 17, 9 * chunk + 5}) {
    SCOPED_TRACE(std::to_string(bytes) + " bytes");
    std::vector<unsigned char> src(bytes);
    fill(src.data(), bytes, ++seed);
    auto dev = worker.alloc_device(bytes);
    ring_upload(worker, dev, src.data(), bytes, chunk, 3);
    std::vector<unsigned char> back(bytes, 0);
    worker.copy_to_host(back.data(), dev, 0, bytes);
    ASSERT_EQ(std::memcmp(back.data(), src.data(), bytes), 0);
  }
  EXPECT_EQ(worker.stats().pinned_count, 0u);
}

TEST_F(CudaGpu, BinderStagedPathIsBitExactAroundTheChunkSize) {
  REQUIRE_GPU();
  Worker worker;
  worker.init("cuda", 0);
  pinstage::BindOptions options;
  options.upload = pinstage::UploadPath::staged;
  options.staging_buffers = 3;
  options.staging_buffer_bytes = size_t{1} << 20;
  pinstage::Binder binder(worker, options);
  pinstage::PageableAllocator pageable;
  const size_t chunk = options.staging_buffer_bytes;
  uint64_t seed = 200;
  // bf16 elements (2 bytes): tensors of chunk - 2, chunk, chunk + 2, ... bytes.
  const size_t half = chunk / 2;
  for (size_t numel : {half - 1, half, half + 1, 3 * half + 17, 7 * half + 3}) {
    SCOPED_TRACE(std::to_string(numel) + " bf16 elements");
    pinstage::TaskArgs args;
    // INOUT: uploaded through the ring, then read back over the host copy. A fresh seed
    // per tensor means stale device memory from an earlier case cannot pass for the data.
    for (const char* name : {"x", "y"})
      args.add(pinstage::Tensor::empty(name, pinstage::DType::bf16, {static_cast<int64_t>(numel)},
                                       pinstage::Direction::inout, pageable));
    std::vector<std::vector<unsigned char>> expect;
    for (const pinstage::Tensor& t : args) {
      fill(t.data(), t.nbytes(), ++seed);
      expect.emplace_back(static_cast<unsigned char*>(t.data()),
                          static_cast<unsigned char*>(t.data()) + t.nbytes());
    }
    const pinstage::BindReport report = binder.run(args);
    EXPECT_EQ(report.ring_count, 2u);
    EXPECT_EQ(report.ring_bytes, 2 * numel * 2);
    for (size_t i = 0; i < args.size(); ++i)
      ASSERT_EQ(std::memcmp(args.at(i).data(), expect[i].data(), expect[i].size()), 0)
          << args.at(i).name();
  }
  EXPECT_LE(binder.staging_bytes(), 3 * chunk);
  EXPECT_EQ(worker.stats().device_count, 0u);
}

// ---- device memory ----

TEST_F(CudaGpu, CapacityLimitIsAClearOutOfMemory) {
  REQUIRE_GPU();
  Worker worker;
  worker.init("cuda", 0, with_config({}, uint64_t{64} << 20));
  EXPECT_EQ(worker.stats().device_capacity_bytes, uint64_t{64} << 20);
  auto a = worker.alloc_device(size_t{40} << 20);
  try {
    worker.alloc_device(size_t{30} << 20);
    FAIL() << "allocation past the capacity succeeded";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::out_of_memory);
    EXPECT_TRUE(contains(e.what(), "exceeds the capacity")) << e.what();
  }
  const auto stats = worker.stats();
  EXPECT_EQ(stats.device_count, 1u);
  EXPECT_EQ(stats.device_committed_bytes, uint64_t{40} << 20);
}

TEST_F(CudaGpu, DeviceOutOfMemoryIsClearAndLeaksNothing) {
  REQUIRE_GPU();
  Worker worker;
  worker.init("cuda", 0);
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  size_t free0 = 0, total = 0;
  ASSERT_EQ(cudaMemGetInfo(&free0, &total), cudaSuccess);
  // Someone else holds half the free memory, so a request within the worker's capacity
  // (the device's total) still fails inside cudaMalloc.
  void* foreign = nullptr;
  ASSERT_EQ(cudaMalloc(&foreign, free0 / 2), cudaSuccess);
  const size_t big = free0 / 4 * 3;
  {
    auto held = worker.alloc_device(4096);
    try {
      worker.alloc_device(big);
      FAIL() << "allocation of " << big << " bytes succeeded with " << free0 / 2 << " free";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::out_of_memory);
      EXPECT_TRUE(contains(e.what(), "cudaMalloc")) << e.what();
      EXPECT_TRUE(contains(e.what(), "cudaErrorMemoryAllocation")) << e.what();
    }
    const auto stats = worker.stats();
    EXPECT_EQ(stats.device_count, 1u);
    EXPECT_EQ(stats.device_committed_bytes, 4096u);
    // A failed allocation leaves no error behind for the next call.
    auto small = worker.alloc_device(4096);
    std::vector<char> host(4096, 7);
    worker.copy_to_device(small, 0, host.data(), host.size());
  }
  ASSERT_EQ(cudaFree(foreign), cudaSuccess);
  EXPECT_EQ(worker.stats().device_committed_bytes, 0u);
  // A leaked `big` would show; the slack absorbs other processes' contexts (ctest -j).
  size_t free1 = 0;
  ASSERT_EQ(cudaMemGetInfo(&free1, &total), cudaSuccess);
  EXPECT_GE(free1 + std::min(size_t{1} << 30, big / 2), free0) << "device memory was not returned";
}

TEST_F(CudaGpu, InjectedFaultsFailOnceAndTakeNothing) {
  REQUIRE_GPU();
  Worker worker;
  worker.init("cuda", 0);
  worker.inject_fault(pinstage::FaultKind::device_malloc, 2);
  auto first = worker.alloc_device(1024);
  EXPECT_THROW(
      {
        try {
          worker.alloc_device(1024);
        } catch (const Error& e) {
          EXPECT_EQ(e.code(), ErrorCode::injected_fault);
          throw;
        }
      },
      Error);
  EXPECT_EQ(worker.stats().device_count, 1u);
  EXPECT_EQ(worker.stats().device_committed_bytes, 1024u);
  auto third = worker.alloc_device(1024);  // the fault fired once
  worker.inject_fault(pinstage::FaultKind::host_alloc, 1);
  EXPECT_THROW(worker.alloc_pinned_host(1024), Error);
  EXPECT_EQ(worker.stats().pinned_count, 0u);
}

// destroy_context releases only the context: the runtime's finalize destroys streams
// and events, frees every allocation and unpins every range first (platform_abi.h).
// Through the worker, everything left outstanding is gone afterwards, the pool's
// registered segments, a file mapping still held and (on the fake) the vendor source's
// cudaHostAlloc alike, and the fake counts nothing left (TearDown).
TEST_F(CudaGpu, FinalizeReleasesEverythingLeft) {
  REQUIRE_GPU();
  const pinstage::test::PatternFile file(3 * 4096 + 100);
  Worker worker;
  worker.init("cuda", 0, with_config({}));
  auto dev = worker.alloc_device(size_t{256} << 20);
  auto small = worker.alloc_pinned_host(4096);
  auto large = worker.alloc_pinned_host(size_t{8} << 20);
  const auto mapping = worker.map_file_pinned(file.path, file.bytes.size());
  ASSERT_TRUE(mapping->pinned()) << mapping->refusal();
  pinstage::PinnedHostBuffer vendor;
  if (const auto inject = fake_fn<FakeInject>("pinstage_fake_cuda_inject")) {
    inject("cudaHostRegister", 1, cudaErrorNotSupported, 0);  // the pool takes cudaHostAlloc
    vendor = worker.alloc_pinned_host(4096);
    EXPECT_EQ(worker.host_placement().pool_source, "vendor");
  }
  auto stream = worker.create_stream();
  auto event = worker.create_event();
  // A copy still queued when finalize runs: it must finish before its buffer goes.
  fill(large.data(), large.size(), 5);
  worker.copy_to_device_async(dev, 0, large.data(), large.size(), stream);
  worker.record(event, stream);
  std::vector<const void*> host = {small.data(), large.data(), mapping->data()};
  if (vendor) host.push_back(vendor.data());
  EXPECT_EQ(memory_type(dev.data()), cudaMemoryTypeDevice);
  for (const void* p : host) EXPECT_EQ(memory_type(p), cudaMemoryTypeHost);
  worker.finalize();
  EXPECT_NE(memory_type(dev.data()), cudaMemoryTypeDevice);
  for (const void* p : host) EXPECT_NE(memory_type(p), cudaMemoryTypeHost);
  // The mapping outlives its worker, unpinned, its bytes still readable.
  EXPECT_EQ(std::memcmp(mapping->data(), file.bytes.data(), file.bytes.size()), 0);
}

// For each source of pinned memory (the runtime's, registered; the vendor's): a fresh
// context, a QueuedCopies of 1 MiB from `seed` with four uploads of it queued, then `body`.
template <class Body>
void with_queued_copies(uint64_t seed, Body&& body) {
  for (const bool registered : {true, false}) {
    SCOPED_TRACE(registered ? "host_register" : "host_alloc_pinned");
    Ctx ctx = make_ctx();
    QueuedCopies q;
    ASSERT_NO_FATAL_FAILURE(q.set_up(ctx.get(), size_t{1} << 20, seed, registered));
    for (int i = 0; i < 4; ++i)
      ASSERT_EQ(raw().copy_h2d_async(ctx.get(), q.dev.ptr, q.pinned.ptr, q.pinned.bytes,
                                     PS_COPY_HOST_PINNED, q.stream),
                PS_OK);
    body(ctx.get(), q);
  }
}

// The device's bytes of `q` equal what was uploaded.
void expect_uploaded(ps_device_ctx* ctx, const QueuedCopies& q) {
  std::vector<unsigned char> back(q.expect.size(), 0);
  ASSERT_EQ(raw().copy_d2h(ctx, back.data(), q.dev.ptr, back.size(), 0), PS_OK);
  EXPECT_EQ(back, q.expect);
}

// stream_destroy waits for the stream's copies (cudaStreamDestroy alone does not), so
// the runtime may release their pinned memory right after it, whichever source made it.
TEST_F(CudaGpu, StreamDestroyWaitsForItsCopies) {
  REQUIRE_GPU();
  with_queued_copies(9, [](ps_device_ctx* ctx, QueuedCopies& q) {
    const ps_platform_api& a = raw();
    ASSERT_EQ(a.stream_destroy(ctx, q.stream), PS_OK) << a.last_error();
    ASSERT_EQ(q.release(ctx), PS_OK) << a.last_error();
    expect_uploaded(ctx, q);
    EXPECT_EQ(a.device_free(ctx, &q.dev), PS_OK);
  });
}

// ---- the worker's device, whatever the calling thread's ----

TEST_F(CudaGpu, CallsUseTheWorkersDeviceFromAnyThread) {
  REQUIRE_GPU();
  const int n = device_count();
  const int mine = n - 1;  // the last device: on several GPUs, not the default one
  Worker worker;
  worker.init("cuda", mine);
  auto check_on_thread = [&](int thread_device) {
    // A fresh thread whose current device is not (necessarily) the worker's.
    ASSERT_EQ(cudaSetDevice(thread_device), cudaSuccess);
    auto dev = worker.alloc_device(size_t{1} << 20);
    int where = -1;
    EXPECT_EQ(memory_type(dev.data(), &where), cudaMemoryTypeDevice);
    EXPECT_EQ(where, mine);
    auto pinned = worker.alloc_pinned_host(size_t{1} << 20);
    fill(pinned.data(), pinned.size(), 77 + thread_device);
    worker.copy_to_device(dev, 0, pinned.data(), pinned.size());
    std::vector<unsigned char> back(pinned.size());
    auto stream = worker.create_stream();
    worker.copy_to_host_async(back.data(), dev, 0, back.size(), stream);
    worker.synchronize(stream);
    EXPECT_EQ(std::memcmp(back.data(), pinned.data(), back.size()), 0);
    int current = -1;
    ASSERT_EQ(cudaGetDevice(&current), cudaSuccess);
    EXPECT_EQ(current, thread_device);  // Note [Device per call]: the thread's own again
  };
  for (int d = 0; d < n; ++d) std::thread(check_on_thread, d).join();
  std::thread([&] {
    // No cudaSetDevice at all on this one.
    auto dev = worker.alloc_device(4096);
    int where = -1;
    EXPECT_EQ(memory_type(dev.data(), &where), cudaMemoryTypeDevice);
    EXPECT_EQ(where, mine);
  }).join();
}

TEST_F(CudaGpu, NonexistentDeviceIsNoDevice) {
  REQUIRE_GPU();
  Worker worker;
  try {
    worker.init("cuda", device_count());
    FAIL() << "init on a device that does not exist succeeded";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::no_device);
    EXPECT_TRUE(contains(e.what(), "does not exist")) << e.what();
  }
}

// ---- issue 16: what only hardware would have shown ----

// Item 2: pinned memory released while copies from it are still queued on a stream of the
// context: the release (host_free_pinned of the vendor's, host_unregister of the runtime's)
// waits for them (the fake counts a release under a queued copy as a hazard), and the data
// arrives whole.
TEST_F(CudaGpu, PinnedReleaseWaitsForQueuedCopies) {
  REQUIRE_GPU();
  with_queued_copies(21, [](ps_device_ctx* ctx, QueuedCopies& q) {
    const ps_platform_api& a = raw();
    const size_t hazards = fake_hazards() ? fake_hazards()() : 0;
    ASSERT_EQ(q.release(ctx), PS_OK) << a.last_error();  // no sync
    if (fake_hazards()) {
      EXPECT_EQ(fake_hazards()() - hazards, 0u) << "released under a queued copy";
    }
    expect_uploaded(ctx, q);
    ASSERT_EQ(a.stream_destroy(ctx, q.stream), PS_OK);
    EXPECT_EQ(a.device_free(ctx, &q.dev), PS_OK);
  });
}

// Item 3: host_register registers the runtime's memory in pieces of register_chunk_mb and
// host_unregister unregisters each; the fake refuses one registration larger than its
// limit, as drivers refuse 512 GiB.
TEST_F(CudaGpu, HostRegisterRegistersInPieces) {
  const auto set_max = fake_fn<FakeSetMax>("pinstage_fake_cuda_set_max_register");
  const auto calls = fake_fn<FakeCount>("pinstage_fake_cuda_register_calls");
  REQUIRE_FAKE(set_max);
  set_max(size_t{1} << 20);
  const std::shared_ptr<void> no_limit_after(nullptr, [set_max](void*) { set_max(SIZE_MAX); });
  const size_t bytes = (size_t{7} << 19) + 5;  // 3.5 MiB + 5: four pieces
  {
    Worker worker;
    worker.init("cuda", 0, with_config({{"register_chunk_mb", "1"}}));
    const size_t before = calls();
    auto b = worker.alloc_pinned_host(bytes);
    EXPECT_EQ(calls() - before, 4u);
    auto* p = static_cast<unsigned char*>(b.data());
    EXPECT_EQ(memory_type(p), cudaMemoryTypeHost);
    EXPECT_EQ(memory_type(p + bytes - 1), cudaMemoryTypeHost);
    fill(p, bytes, 3);
    auto dev = worker.alloc_device(bytes);
    worker.copy_to_device(dev, 0, p, bytes);  // one copy across every piece
    std::vector<unsigned char> back(bytes);
    worker.copy_to_host(back.data(), dev, 0, bytes);
    EXPECT_EQ(std::memcmp(back.data(), p, bytes), 0);
    b.reset();  // every piece unregistered: TearDown finds no registered range
    EXPECT_NE(memory_type(p), cudaMemoryTypeHost);
    EXPECT_NE(memory_type(p + bytes - 1), cudaMemoryTypeHost);
  }
  {
    // One piece larger than the limit fails clearly and leaves nothing registered.
    Worker worker;
    worker.init("cuda", 0, with_config({{"register_chunk_mb", "2"}}));
    try {
      worker.alloc_pinned_host(bytes);
      ADD_FAILURE() << "a registration past the limit succeeded";
    } catch (const Error& e) {
      EXPECT_TRUE(contains(e.what(), "cudaHostRegister")) << e.what();
      EXPECT_TRUE(contains(e.what(), "pieces of 2 MiB")) << e.what();
    }
    EXPECT_EQ(worker.stats().pinned_count, 0u);
  }
}

// Item 3: a piece that fails after others were registered: they are unregistered again at
// once, and the pool does not take the failure for "not supported" (no vendor fallback).
TEST_F(CudaGpu, RegisterFailureInTheMiddleUndoesThePiecesDone) {
  const auto inject = fake_fn<FakeInject>("pinstage_fake_cuda_inject");
  const auto counts = fake_fn<FakeCounts>("pinstage_fake_cuda_counts");
  REQUIRE_FAKE(inject);
  Worker worker;
  worker.init("cuda", 0, with_config({{"register_chunk_mb", "1"}}));
  inject("cudaHostRegister", 3, cudaErrorMemoryAllocation, 0);
  const Error e = pinstage::test::error_of([&] { worker.alloc_pinned_host(size_t{4} << 20); });
  EXPECT_EQ(e.code(), ErrorCode::out_of_memory) << e.what();
  EXPECT_TRUE(contains(e.what(), "cudaErrorMemoryAllocation")) << e.what();
  size_t device = 0, host = 0, registered = 0, streams = 0, events = 0;
  counts(&device, &host, &registered, &streams, &events);
  EXPECT_EQ(registered, 0u) << "pieces left registered after the failure";
  EXPECT_EQ(worker.stats().pinned_count, 0u);
  auto ok = worker.alloc_pinned_host(size_t{4} << 20);  // nothing sticky
  EXPECT_EQ(memory_type(ok.data()), cudaMemoryTypeHost);
  EXPECT_EQ(worker.host_placement().pool_source, "anonymous");
}

// Item 4: a pinstage call leaves the calling thread on the device it had chosen.
TEST_F(CudaGpu, CallsRestoreTheCallersDevice) {
  REQUIRE_GPU();
  if (device_count() < 2) GTEST_SKIP() << "needs two devices";
  std::thread([] {
    Worker worker;
    worker.init("cuda", 0);
    ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
    auto still_one = [](const char* after) {
      int current = -1;
      ASSERT_EQ(cudaGetDevice(&current), cudaSuccess);
      EXPECT_EQ(current, 1) << "after " << after;
    };
    auto dev = worker.alloc_device(4096);
    still_one("alloc_device");
    auto pinned = worker.alloc_pinned_host(4096);
    still_one("alloc_pinned_host");
    worker.copy_to_device(dev, 0, pinned.data(), 4096);
    still_one("copy_to_device");
    worker.copy_to_host(pinned.data(), dev, 0, 4096);
    still_one("copy_to_host");
    auto stream = worker.create_stream();
    auto event = worker.create_event();
    worker.copy_to_device_async(dev, 0, pinned.data(), 4096, stream);
    worker.record(event, stream);
    worker.wait(event);
    worker.synchronize(stream);
    still_one("the stream and event calls");
    pinned.reset();
    dev.reset();
    still_one("the frees");
    worker.finalize();
    still_one("finalize");
  }).join();
}

// Item 5: two synchronous copies of one context run on streams of their own: one held
// up in the copy engine does not hold up the other.
TEST_F(CudaGpu, ConcurrentSynchronousCopiesDoNotWaitForEachOther) {
  const auto hold = fake_fn<FakeHold>("pinstage_fake_cuda_hold");
  const auto waiting = fake_fn<FakeCount>("pinstage_fake_cuda_held_waiting");
  REQUIRE_FAKE(hold);
  Worker worker;
  worker.init("cuda", 0);
  const size_t bytes = size_t{1} << 20;
  auto a = worker.alloc_pinned_host(bytes), b = worker.alloc_pinned_host(bytes);
  auto dev_a = worker.alloc_device(bytes), dev_b = worker.alloc_device(bytes);
  fill(a.data(), bytes, 1);
  fill(b.data(), bytes, 2);
  worker.copy_to_device(dev_b, 0, b.data(), bytes);  // a copy stream exists before the race
  hold(a.data(), 1);
  std::thread held([&] { worker.copy_to_device(dev_a, 0, a.data(), bytes); });
  while (waiting() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  // Not a speed check: a copy queued behind the held one would never finish.
  auto other =
      std::async(std::launch::async, [&] { worker.copy_to_device(dev_b, 0, b.data(), bytes); });
  const bool overlapped = other.wait_for(std::chrono::seconds(20)) == std::future_status::ready;
  hold(a.data(), 0);
  held.join();
  other.get();
  EXPECT_TRUE(overlapped) << "the second synchronous copy waited for the first";
  std::vector<unsigned char> back(bytes);
  worker.copy_to_host(back.data(), dev_b, 0, bytes);
  EXPECT_EQ(std::memcmp(back.data(), b.data(), bytes), 0);
  worker.copy_to_host(back.data(), dev_a, 0, bytes);
  EXPECT_EQ(std::memcmp(back.data(), a.data(), bytes), 0);
}

// The host memory pool over the strict fake: a block freed while a queued async copy still
// reads it (held in the fake's copy engine, a latch) is parked behind an event
// (cudaEventQuery), not handed out again; the same-sized request that follows gets other
// memory, and the device receives the original bytes.
TEST_F(CudaGpu, ThePoolDoesNotReuseABlockAQueuedCopyStillReads) {
  const auto hold = fake_fn<FakeHold>("pinstage_fake_cuda_hold");
  REQUIRE_FAKE(hold);
  Worker worker;
  worker.init("cuda", 0);
  const size_t bytes = size_t{1} << 20;
  auto dev = worker.alloc_device(bytes);
  pinstage::Stream stream = worker.create_stream();
  auto a = worker.alloc_pinned_host(bytes);
  void* const a_ptr = a.data();
  fill(a.data(), bytes, 1);
  std::vector<unsigned char> want(bytes);
  fill(want.data(), bytes, 1);
  hold(a_ptr, 1);
  worker.copy_to_device_async(dev, 0, a.data(), bytes, stream);
  a.reset();
  EXPECT_EQ(worker.host_memory_stats().pending_blocks, 1u);
  auto b = worker.alloc_pinned_host(bytes);
  EXPECT_NE(b.data(), a_ptr) << "handed out again while a queued copy reads it";
  std::memset(b.data(), 0x77, bytes);
  hold(a_ptr, 0);
  worker.synchronize(stream);
  std::vector<unsigned char> back(bytes);
  worker.copy_to_host(back.data(), dev, 0, bytes);
  EXPECT_EQ(back, want);
  auto c = worker.alloc_pinned_host(bytes);
  EXPECT_EQ(c.data(), a_ptr) << "reusable once its copy ran";
  EXPECT_EQ(worker.host_memory_stats().pending_blocks, 0u);
}

// Item 6: the capacity is the free memory, so a size the worker approves fits.
TEST_F(CudaGpu, CapacityIsTheFreeMemory) {
  REQUIRE_GPU();
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  size_t free0 = 0, total = 0;
  ASSERT_EQ(cudaMemGetInfo(&free0, &total), cudaSuccess);
  void* foreign = nullptr;
  ASSERT_EQ(cudaMalloc(&foreign, free0 / 2), cudaSuccess);
  {
    Worker worker;
    worker.init("cuda", 0);
    const uint64_t capacity = worker.stats().device_capacity_bytes;
    EXPECT_LE(capacity, free0 - free0 / 2) << "capacity counts memory someone else holds";
    EXPECT_GT(capacity, 0u);
    // A request for all of it is accepted by the capacity check and by cudaMalloc (on a
    // GPU other processes could take some in between, so only the fake asks for all).
    const size_t ask = fake_hazards() ? capacity : capacity / 2;
    auto all = worker.alloc_device(ask);
    EXPECT_EQ(memory_type(all.data()), cudaMemoryTypeDevice);
  }
  ASSERT_EQ(cudaFree(foreign), cudaSuccess);
}

// Item 7: after a sticky error every message says the context is unusable; an ordinary
// error does not.
TEST_F(CudaGpu, StickyErrorMakesEveryLaterCallSayTheContextIsUnusable) {
  const auto inject = fake_fn<FakeInject>("pinstage_fake_cuda_inject");
  REQUIRE_FAKE(inject);
  Worker worker;
  worker.init("cuda", 0);
  auto dev = worker.alloc_device(4096);
  std::vector<unsigned char> host(4096, 1);
  inject("cudaMemcpyAsync", 1, cudaErrorInvalidValue, 0);  // ordinary: the next call works
  try {
    worker.copy_to_device(dev, 0, host.data(), host.size());
    ADD_FAILURE() << "the injected error did not fail the copy";
  } catch (const Error& e) {
    EXPECT_FALSE(contains(e.what(), "unusable")) << e.what();
  }
  worker.copy_to_device(dev, 0, host.data(), host.size());
  inject("cudaMemcpyAsync", 1, cudaErrorIllegalAddress, 1);
  auto says_unusable = [](auto&& call, const char* what) {
    try {
      call();
      ADD_FAILURE() << what << " succeeded after a sticky error";
    } catch (const Error& e) {
      EXPECT_TRUE(contains(e.what(), "the CUDA context is unusable")) << what << ": " << e.what();
    }
  };
  says_unusable([&] { worker.copy_to_device(dev, 0, host.data(), host.size()); }, "the copy");
  says_unusable([&] { worker.alloc_device(4096); }, "alloc_device");
  says_unusable([&] { worker.alloc_pinned_host(4096); }, "alloc_pinned_host");
  says_unusable([&] { worker.copy_to_host(host.data(), dev, 0, 16); }, "copy_to_host");
  says_unusable([&] { worker.create_stream(); }, "create_stream");
  // The first message names the call that broke it.
  try {
    worker.alloc_device(16);
  } catch (const Error& e) {
    EXPECT_TRUE(contains(e.what(), "cudaMemcpyAsync")) << e.what();
    EXPECT_TRUE(contains(e.what(), "cudaErrorIllegalAddress")) << e.what();
  }
  // The fake only: lets the releases below succeed for TearDown's leak check.
  fake_fn<FakeVoid>("pinstage_fake_cuda_clear_sticky")();
  says_unusable([&] { worker.alloc_device(4096); }, "alloc_device after the error cleared");
  dev.reset();
  worker.finalize();
}

// True when a forked child that reads `p` dies of SIGSEGV (the page is not in it).
// The child restores the default action first: a sanitizer's SEGV handler would
// report and exit(1) instead of letting the signal kill it.
bool child_cannot_read(const void* p) {
  const pid_t pid = fork();
  if (pid == 0) {
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    sigaction(SIGSEGV, &dfl, nullptr);
    (void)*static_cast<const volatile char*>(p);
    _exit(0);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFSIGNALED(status) && WTERMSIG(status) == SIGSEGV;
}

// Item 8: the pool's memory is MADV_DONTFORK (the runtime's placement, for every backend
// whose device memory is not host memory): a forked child does not get the pages (a child
// writing them would otherwise copy-on-write away from the pinned copy).
TEST_F(CudaGpu, ThePoolsMemoryIsNotInheritedByFork) {
  REQUIRE_GPU();
  Worker worker;
  worker.init("cuda", 0, with_config({}));
  auto b = worker.alloc_pinned_host(size_t{2} << 20);
  fill(b.data(), b.size(), 8);
  ASSERT_EQ(worker.host_placement().pool_source, "anonymous");
  // "dc" (VM_DONTCOPY) is what MADV_DONTFORK sets ("dd" would be MADV_DONTDUMP).
  const std::string flags = pinstage::test::smaps_field(b.data(), "VmFlags:").value_or("");
  EXPECT_TRUE(contains(flags, " dc ")) << "VmFlags:" << flags;
  EXPECT_TRUE(child_cannot_read(b.data()));
}

// ---- ABI v5: device-to-device copies and fills ----

using FakeDeviceOps = void (*)(size_t*, size_t*);

// The fake's accepted cudaMemcpyAsync(DeviceToDevice) and cudaMemsetAsync calls; {0, 0}
// on a real runtime.
std::pair<size_t, size_t> fake_device_ops() {
  size_t copies = 0, memsets = 0;
  if (auto fn = fake_fn<FakeDeviceOps>("pinstage_fake_cuda_device_ops")) fn(&copies, &memsets);
  return {copies, memsets};
}

// The runtime's forms reach cudaMemcpyAsync(DeviceToDevice) and cudaMemsetAsync (the fake
// counts them: no trip through the host), land bit-exact, and leave the bytes around
// their ranges alone.
TEST_F(CudaGpu, DeviceCopiesAndFillsUseTheRuntimesDeviceCalls) {
  REQUIRE_GPU();
  Worker worker;
  worker.init("cuda", 0);
  const size_t n = (size_t{1} << 20) + 77;
  auto a = worker.alloc_device(n);
  auto b = worker.alloc_device(n);
  std::vector<unsigned char> want_a(n), want_b(n, 0x42);
  fill(want_a.data(), n, 99);
  worker.copy_to_device(a, 0, want_a.data(), n);
  worker.copy_to_device(b, 0, want_b.data(), n);
  const auto before = fake_device_ops();
  auto stream = worker.create_stream();
  std::vector<unsigned char> back(n);
  // Each read is on the worker's stream, not the pool's copy stream the synchronous forms
  // use: only their own wait makes their bytes visible there (the fake lands work late).
  auto read = [&](const pinstage::DeviceBuffer& dev) {
    worker.copy_to_host_async(back.data(), dev, 0, n, stream);
    worker.synchronize(stream);
    return back;
  };
  worker.copy_on_device(b, 3, a, 1, 500'001);
  std::copy_n(want_a.begin() + 1, 500'001, want_b.begin() + 3);
  EXPECT_TRUE(read(b) == want_b);
  worker.fill_device(b, 100, 0xfe, 1000);
  std::fill_n(want_b.begin() + 100, 1000, 0xfe);
  EXPECT_TRUE(read(b) == want_b);
  worker.copy_on_device_async(a, 600'000, a, 5, 400'000, stream);  // within one buffer
  std::copy_n(want_a.begin() + 5, 400'000, want_a.begin() + 600'000);
  worker.fill_device_async(a, 601'000, 0, 17, stream);  // ordered after that copy
  std::fill_n(want_a.begin() + 601'000, 17, 0);
  EXPECT_TRUE(read(a) == want_a);
  if (fake_hazards()) {
    const auto after = fake_device_ops();
    EXPECT_EQ(after.first - before.first, 2u) << "device-to-device copies the fake ran";
    EXPECT_EQ(after.second - before.second, 2u) << "memsets the fake ran";
  }
}

TEST_F(CudaGpu, DeviceFillFailureNamesTheCudaCall) {
  const auto inject = fake_fn<FakeInject>("pinstage_fake_cuda_inject");
  REQUIRE_FAKE(inject);
  Worker worker;
  worker.init("cuda", 0);
  auto a = worker.alloc_device(4096);
  inject("cudaMemsetAsync", 1, cudaErrorInvalidValue, 0);
  const Error e = [&] {
    try {
      worker.fill_device(a, 0, 1, 4096);
    } catch (const Error& error) {
      return error;
    }
    return Error(ErrorCode::internal, "no error");
  }();
  EXPECT_TRUE(contains(e.what(), "cudaMemsetAsync device fill of 4096 bytes on device 0"))
      << e.what();
  inject("cudaMemcpyAsync", 1, cudaErrorInvalidValue, 0);
  auto b = worker.alloc_device(4096);
  try {
    worker.copy_on_device(b, 0, a, 0, 4096);
    ADD_FAILURE() << "the injected failure was not reported";
  } catch (const Error& error) {
    EXPECT_TRUE(contains(error.what(), "cudaMemcpyAsync device-to-device copy")) << error.what();
  }
  worker.fill_device(a, 0, 1, 4096);  // only the nth failed
}

// ---- the fake runtime is as strict as the real one where it matters ----

TEST_F(CudaGpu, FakeDeviceMemoryIsNotHostMemory) {
  REQUIRE_FAKE(fake_hazards());
  void* p = nullptr;
  ASSERT_EQ(cudaMalloc(&p, 1000), cudaSuccess);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 256, 0u);
  EXPECT_NE(reinterpret_cast<uintptr_t>(p) % 512, 0u) << "aligned past what cudaMalloc promises";
  EXPECT_TRUE(child_cannot_read(p));
  EXPECT_EQ(cudaFree(p), cudaSuccess);
}

// ---- host sources (issue 46): the checks shared with acl (host_source_checks.h) ----

// What the CUDA runtime says of host memory: cudaPointerGetAttributes (a GPU's runtime has
// it too) and, on the fake, its counts and its "not supported" answer to cudaHostRegister.
pinstage::test::PinView cuda_view() {
  pinstage::test::PinView v;
  v.backend = "cuda";
  v.pinned = [](const void* p, size_t n) {
    return memory_type(p) == cudaMemoryTypeHost &&
           memory_type(static_cast<const char*>(p) + n - 1) == cudaMemoryTypeHost;
  };
  if (const auto counts = fake_fn<FakeCounts>("pinstage_fake_cuda_counts")) {
    const auto live = [counts](bool registered) {
      size_t device = 0, host = 0, reg = 0, streams = 0, events = 0;
      counts(&device, &host, &reg, &streams, &events);
      return registered ? reg : host;
    };
    v.registrations = [live] { return live(true); };
    v.vendor_allocations = [live] { return live(false); };
  }
  v.read_only_registrations = fake_fn<FakeCount>("pinstage_fake_cuda_read_only_registrations");
  if (const auto inject = fake_fn<FakeInject>("pinstage_fake_cuda_inject"))
    v.refuse_registration = [inject] { inject("cudaHostRegister", 1, cudaErrorNotSupported, 0); };
  return v;
}

// The fake as a driver without read-only registration (a B300 with CUDA 13.4,
// cudaDevAttrHostRegisterReadOnlySupported = 0) for a scope. The plugin reads the attribute
// at create_context: a worker started inside the scope sees it.
class NoReadOnlyRegistration {
 public:
  // The fake's switch, or null on a real runtime.
  static void (*set())(int) {
    return fake_fn<void (*)(int)>("pinstage_fake_cuda_set_read_only_register");
  }
  NoReadOnlyRegistration() { set()(0); }
  ~NoReadOnlyRegistration() { set()(1); }
  NoReadOnlyRegistration(const NoReadOnlyRegistration&) = delete;
  NoReadOnlyRegistration& operator=(const NoReadOnlyRegistration&) = delete;
};

TEST_F(CudaGpu, TheAnonymousSourceIsRegisteredAndRoundTrips) {
  REQUIRE_GPU();
  pinstage::test::check_anonymous_source(cuda_view());
}

// cudaHostRegister answers cudaErrorNotSupported: the pool takes cudaHostAlloc, asking once.
TEST_F(CudaGpu, TheVendorSourceIsCudaHostAllocWhereRegisterIsNotSupported) {
  const auto calls = fake_fn<size_t (*)(const char*)>("pinstage_fake_cuda_calls");
  REQUIRE_FAKE(calls);
  const size_t registers = calls("cudaHostRegister"), allocs = calls("cudaHostAlloc");
  pinstage::test::check_vendor_source(cuda_view(), [](const Worker& worker) {
    const ps_cuda_pin_stats s = pin_stats(worker);
    EXPECT_EQ(s.alloc_count, 2u);
    EXPECT_EQ(s.alloc_bytes, (size_t{1} << 20) + 4096);
    EXPECT_EQ(s.register_count, 0u);
    EXPECT_EQ(s.last_mode, PS_CUDA_PIN_ALLOC);
  });
  EXPECT_EQ(calls("cudaHostRegister") - registers, 1u) << "the refusal was not remembered";
  EXPECT_EQ(calls("cudaHostAlloc") - allocs, 2u);
}

TEST_F(CudaGpu, TheFileSharedSourceIsRegisteredReadOnlyInPlace) {
  REQUIRE_GPU();
  int read_only = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&read_only, cudaDevAttrHostRegisterReadOnlySupported, 0),
            cudaSuccess);
  if (read_only == 0) GTEST_SKIP() << "this device cannot register read-only memory";
  pinstage::test::check_file_shared_source(cuda_view());
}

// Where the driver cannot register read-only memory: the copy, pinned writable.
TEST_F(CudaGpu, TheFilePrivateSourceIsAWritableCopyWhereReadOnlyRegistrationIsMissing) {
  REQUIRE_FAKE(NoReadOnlyRegistration::set());
  const NoReadOnlyRegistration b300;
  pinstage::test::check_file_private_source(cuda_view());
}

// With the device's own read-only registration (the fake's default: file_shared), then,
// on the fake, without it: the file mapping is a file_private copy, which is placed too.
TEST_F(CudaGpu, NumaPlacementIsReadBackFromTheKernel) {
  REQUIRE_GPU();
  pinstage::test::check_numa_placement(cuda_view());
  if (NoReadOnlyRegistration::set() == nullptr || IsSkipped()) return;
  SCOPED_TRACE("a driver without read-only registration");
  const NoReadOnlyRegistration b300;
  pinstage::test::check_numa_placement(cuda_view());
}

// PINSTAGE_HOST_HUGE_PAGES=thp and =off on the pool's memory cudaHostRegister pins.
TEST_F(CudaGpu, HugePagesFollowTheOneSwitch) {
  REQUIRE_GPU();
  pinstage::test::check_huge_page_switch(cuda_view());
}

TEST_F(CudaGpu, FakeRegistrationNeedsWritablePages) {
  REQUIRE_FAKE(fake_hazards());
  void* ro = mmap(nullptr, 8192, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(ro, MAP_FAILED);
  EXPECT_NE(cudaHostRegister(ro, 8192, cudaHostRegisterPortable), cudaSuccess);
  (void)cudaGetLastError();
  ASSERT_EQ(mprotect(ro, 8192, PROT_READ | PROT_WRITE), 0);
  EXPECT_EQ(cudaHostRegister(ro, 8192, cudaHostRegisterPortable), cudaSuccess);
  EXPECT_EQ(cudaHostUnregister(ro), cudaSuccess);
  munmap(ro, 8192);
}

TEST_F(CudaGpu, FakePageableUploadLandsLaterInStreamOrderFromASnapshot) {
  REQUIRE_FAKE(fake_hazards());
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  cudaStream_t s = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  void* dev = nullptr;
  ASSERT_EQ(cudaMalloc(&dev, 4096), cudaSuccess);
  std::vector<unsigned char> src(4096, 1), later(4096, 2), back(4096, 0);
  ASSERT_EQ(cudaMemcpyAsync(dev, src.data(), 4096, cudaMemcpyHostToDevice, s), cudaSuccess);
  std::fill(src.begin(), src.end(), 9);  // the copy took its bytes when it was queued
  ASSERT_EQ(cudaMemcpyAsync(dev, later.data(), 16, cudaMemcpyHostToDevice, s), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(back.data(), dev, 4096, cudaMemcpyDeviceToHost, s), cudaSuccess);
  EXPECT_EQ(back[0], 2);  // device-to-pageable returns done, after the stream's uploads
  EXPECT_EQ(back[16], 1);
  ASSERT_EQ(cudaFree(dev), cudaSuccess);
  ASSERT_EQ(cudaStreamDestroy(s), cudaSuccess);
}

TEST_F(CudaGpu, FakeStreamCopiesMustTargetTheStreamsDevice) {
  REQUIRE_FAKE(fake_hazards());
  if (device_count() < 2) GTEST_SKIP() << "needs two devices";
  ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
  void* dev1 = nullptr;
  ASSERT_EQ(cudaMalloc(&dev1, 4096), cudaSuccess);
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  cudaStream_t s = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  std::vector<unsigned char> host(4096, 3);
  EXPECT_NE(cudaMemcpyAsync(dev1, host.data(), 4096, cudaMemcpyHostToDevice, s), cudaSuccess);
  (void)cudaGetLastError();
  ASSERT_EQ(cudaStreamDestroy(s), cudaSuccess);
  ASSERT_EQ(cudaFree(dev1), cudaSuccess);
}

// Device-to-device copies and memsets: every byte inside one allocation of the stream's
// device, a copy's ranges not overlapping; they run in stream order.
TEST_F(CudaGpu, FakeDeviceOpsAreCheckedAndRunInStreamOrder) {
  REQUIRE_FAKE(fake_hazards());
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  cudaStream_t s = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  void *a = nullptr, *b = nullptr;
  ASSERT_EQ(cudaMalloc(&a, 4096), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&b, 4096), cudaSuccess);
  auto* pa = static_cast<unsigned char*>(a);
  std::vector<unsigned char> host(4096, 7), back(4096, 0);
  const auto refused = [](cudaError_t e) {
    (void)cudaGetLastError();
    return e == cudaErrorInvalidValue;
  };
  EXPECT_TRUE(refused(cudaMemsetAsync(pa + 4000, 1, 97, s))) << "past the allocation";
  EXPECT_TRUE(refused(cudaMemsetAsync(host.data(), 1, 16, s))) << "host memory";
  EXPECT_TRUE(refused(cudaMemcpyAsync(b, host.data(), 16, cudaMemcpyDeviceToDevice, s)));
  EXPECT_TRUE(refused(cudaMemcpyAsync(b, pa + 4090, 16, cudaMemcpyDeviceToDevice, s)));
  EXPECT_TRUE(refused(cudaMemcpyAsync(pa + 8, pa, 16, cudaMemcpyDeviceToDevice, s)))
      << "overlapping ranges";
  ASSERT_EQ(cudaMemsetAsync(a, 0x11, 4096, s), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(b, a, 4096, cudaMemcpyDeviceToDevice, s), cudaSuccess);
  ASSERT_EQ(cudaMemsetAsync(pa + 16, 0x22, 16, s), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(pa + 32, pa + 16, 16, cudaMemcpyDeviceToDevice, s), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(back.data(), b, 4096, cudaMemcpyDeviceToHost, s), cudaSuccess);
  EXPECT_EQ(back, std::vector<unsigned char>(4096, 0x11));  // copied after the first memset
  ASSERT_EQ(cudaMemcpyAsync(back.data(), a, 64, cudaMemcpyDeviceToHost, s), cudaSuccess);
  EXPECT_EQ(back[15], 0x11);
  EXPECT_EQ(back[16], 0x22);
  EXPECT_EQ(back[47], 0x22);
  EXPECT_EQ(back[48], 0x11);
  if (device_count() >= 2) {  // another device's memory on this stream
    ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
    void* other = nullptr;
    ASSERT_EQ(cudaMalloc(&other, 4096), cudaSuccess);
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    EXPECT_TRUE(refused(cudaMemsetAsync(other, 0, 16, s)));
    EXPECT_TRUE(refused(cudaMemcpyAsync(other, a, 16, cudaMemcpyDeviceToDevice, s)));
    ASSERT_EQ(cudaFree(other), cudaSuccess);
  }
  ASSERT_EQ(cudaFree(a), cudaSuccess);
  ASSERT_EQ(cudaFree(b), cudaSuccess);
  ASSERT_EQ(cudaStreamDestroy(s), cudaSuccess);
}

TEST_F(CudaGpu, FakeTimedEventsAndTheProbesQueries) {
  REQUIRE_FAKE(fake_hazards());
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  cudaEvent_t start = nullptr, stop = nullptr;
  ASSERT_EQ(cudaEventCreate(&start), cudaSuccess);
  ASSERT_EQ(cudaEventCreate(&stop), cudaSuccess);
  cudaStream_t s = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(start, s), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(stop, s), cudaSuccess);
  ASSERT_EQ(cudaEventSynchronize(stop), cudaSuccess);
  float ms = -1;
  EXPECT_EQ(cudaEventElapsedTime(&ms, start, stop), cudaSuccess);
  EXPECT_GE(ms, 0.0f);
  int driver = 0, runtime = 0;
  EXPECT_EQ(cudaDriverGetVersion(&driver), cudaSuccess);
  EXPECT_EQ(cudaRuntimeGetVersion(&runtime), cudaSuccess);
  EXPECT_GT(driver, 0);
  char bus[32] = {};
  EXPECT_EQ(cudaDeviceGetPCIBusId(bus, sizeof bus, 0), cudaSuccess);
  EXPECT_GT(std::strlen(bus), 0u);
  ASSERT_EQ(cudaEventDestroy(start), cudaSuccess);
  ASSERT_EQ(cudaEventDestroy(stop), cudaSuccess);
  ASSERT_EQ(cudaStreamDestroy(s), cudaSuccess);
}

}  // namespace
