// The cuda backend on a GPU (ctest label requires_gpu). Without a usable device every
// test is skipped with the reason, so ctest reports them as skipped, never passed.
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "backends/cuda/cuda_ext.h"
#include "backends/cuda/cuda_status.h"
#include "pinstage/bind.h"
#include "pinstage/platform_abi.h"
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

WorkerOptions with_config(const std::string& config, uint64_t capacity = 0) {
  WorkerOptions o;
  o.config = config;
  o.device_capacity_bytes = capacity;
  return o;
}

// Direct access to the plugin (pin statistics, host_register, destroy with leftovers).
struct RawPlugin {
  const ps_platform_api* api = nullptr;
  ps_cuda_pin_stats_fn pin_stats = nullptr;
};

const RawPlugin& raw() {
  static const RawPlugin plugin = [] {
    RawPlugin p;
    void* h = dlopen(PINSTAGE_CUDA_PLUGIN_PATH, RTLD_NOW | RTLD_LOCAL);
    if (h == nullptr) return p;
    auto entry = reinterpret_cast<ps_platform_entry_fn>(dlsym(h, PINSTAGE_PLATFORM_ENTRY_SYMBOL));
    p.api = entry ? entry() : nullptr;
    p.pin_stats = reinterpret_cast<ps_cuda_pin_stats_fn>(dlsym(h, PINSTAGE_CUDA_PIN_STATS_SYMBOL));
    return p;
  }();
  if (plugin.api == nullptr || plugin.pin_stats == nullptr)
    throw std::runtime_error("cannot load the cuda plugin");
  return plugin;
}

struct CtxDeleter {
  void operator()(ps_device_ctx* c) const { raw().api->destroy_context(c); }
};
using Ctx = std::unique_ptr<ps_device_ctx, CtxDeleter>;

Ctx make_ctx(const char* config, int device = 0) {
  const ps_context_options options{0, config};
  ps_device_ctx* c = nullptr;
  const int status = raw().api->create_context(device, &options, &c);
  if (status != PS_OK)
    throw std::runtime_error(std::string("create_context: ") + ps_status_str(status) + " " +
                             raw().api->last_error());
  return Ctx(c);
}

// Under the fake runtime (ctest "fake_cuda.*") every test must leave nothing allocated
// in the runtime: the fake counts what is live; the real runtime has no such symbol.
using FakeCounts = int (*)(size_t*, size_t*, size_t*, size_t*, size_t*);

class CudaGpu : public ::testing::Test {
 protected:
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
  }
};

// ---- pinned host memory ----

TEST_F(CudaGpu, PinnedAllocBothModesAndRelease) {
  REQUIRE_GPU();
  for (const char* config :
       {"pinned_mode=alloc", "pinned_mode=register", "pinned_mode=register;register_thp=1"}) {
    SCOPED_TRACE(config);
    Worker worker;
    worker.init("cuda", 0, with_config(config));
    EXPECT_TRUE(worker.capabilities().pinned_is_page_locked);
    EXPECT_FALSE(worker.capabilities().device_memory_is_host);
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
    }  // released here, each the way it was made
    EXPECT_EQ(worker.stats().pinned_count, 0u);
    for (const auto& [ptr, bytes] : seen)
      EXPECT_NE(memory_type(ptr), cudaMemoryTypeHost) << bytes << " bytes still page-locked";
  }
}

TEST_F(CudaGpu, AutoModeChoosesBySize) {
  REQUIRE_GPU();
  Ctx ctx = make_ctx("pinned_mode=auto;register_threshold_mb=2");
  const ps_platform_api& a = *raw().api;
  ps_cuda_pin_stats s{};
  void* small = nullptr;
  void* large = nullptr;
  ASSERT_EQ(a.host_alloc_pinned(ctx.get(), (size_t{2} << 20) - 1, &small), PS_OK);
  ASSERT_EQ(raw().pin_stats(ctx.get(), &s), PS_OK);
  EXPECT_EQ(s.last_mode, PS_CUDA_PIN_ALLOC);
  ASSERT_EQ(a.host_alloc_pinned(ctx.get(), size_t{2} << 20, &large), PS_OK);
  ASSERT_EQ(raw().pin_stats(ctx.get(), &s), PS_OK);
  EXPECT_EQ(s.last_mode, PS_CUDA_PIN_REGISTER);
  EXPECT_EQ(s.alloc_count, 1u);
  EXPECT_EQ(s.register_count, 1u);
  EXPECT_EQ(s.register_bytes, size_t{2} << 20);
  EXPECT_GE(s.last_prefault_threads, 1);
  EXPECT_GE(s.last_seconds, s.last_register_seconds);
  EXPECT_EQ(memory_type(small), cudaMemoryTypeHost);
  EXPECT_EQ(memory_type(large), cudaMemoryTypeHost);
  EXPECT_EQ(a.host_free_pinned(ctx.get(), small), PS_OK);
  EXPECT_EQ(a.host_free_pinned(ctx.get(), large), PS_OK);
  EXPECT_NE(memory_type(small), cudaMemoryTypeHost);
  EXPECT_NE(memory_type(large), cudaMemoryTypeHost);
}

TEST_F(CudaGpu, FreeingForeignPointersIsUnknownPointer) {
  REQUIRE_GPU();
  Ctx ctx = make_ctx(nullptr);
  const ps_platform_api& a = *raw().api;
  std::vector<char> pageable(4096);
  void* foreign_pinned = nullptr;
  ASSERT_EQ(cudaHostAlloc(&foreign_pinned, 4096, cudaHostAllocPortable), cudaSuccess);
  void* foreign_device = nullptr;
  ASSERT_EQ(cudaMalloc(&foreign_device, 4096), cudaSuccess);
  EXPECT_EQ(a.host_free_pinned(ctx.get(), pageable.data()), PS_ERR_UNKNOWN_POINTER);
  EXPECT_EQ(a.host_free_pinned(ctx.get(), foreign_pinned), PS_ERR_UNKNOWN_POINTER);
  EXPECT_TRUE(contains(a.last_error(), "not allocated by host_alloc_pinned"));
  EXPECT_EQ(a.device_free(ctx.get(), foreign_device), PS_ERR_UNKNOWN_POINTER);
  EXPECT_EQ(a.host_unregister(ctx.get(), pageable.data()), PS_ERR_UNKNOWN_POINTER);
  // The foreign memory is untouched by the refusals.
  EXPECT_EQ(memory_type(foreign_pinned), cudaMemoryTypeHost);
  EXPECT_EQ(memory_type(foreign_device), cudaMemoryTypeDevice);
  cudaFreeHost(foreign_pinned);
  cudaFree(foreign_device);
}

TEST_F(CudaGpu, HostRegisterAndUnregister) {
  REQUIRE_GPU();
  Ctx ctx = make_ctx(nullptr);
  const ps_platform_api& a = *raw().api;
  const size_t bytes = size_t{1} << 20;
  void* mem = std::aligned_alloc(4096, bytes);
  ASSERT_NE(mem, nullptr);
  fill(mem, bytes, 42);
  ASSERT_EQ(a.host_register(ctx.get(), mem, bytes), PS_OK) << a.last_error();
  EXPECT_EQ(memory_type(mem), cudaMemoryTypeHost);
  EXPECT_EQ(a.host_register(ctx.get(), mem, bytes), PS_ERR_INVALID_ARGUMENT);
  void* dev = nullptr;
  ASSERT_EQ(a.device_malloc(ctx.get(), bytes, &dev), PS_OK);
  ASSERT_EQ(a.copy_h2d(ctx.get(), dev, mem, bytes), PS_OK);
  std::vector<unsigned char> back(bytes);
  ASSERT_EQ(a.copy_d2h(ctx.get(), back.data(), dev, bytes), PS_OK);
  EXPECT_EQ(std::memcmp(back.data(), mem, bytes), 0);
  EXPECT_EQ(a.device_free(ctx.get(), dev), PS_OK);
  EXPECT_EQ(a.host_unregister(ctx.get(), mem), PS_OK);
  EXPECT_NE(memory_type(mem), cudaMemoryTypeHost);
  EXPECT_EQ(a.host_unregister(ctx.get(), mem), PS_ERR_UNKNOWN_POINTER);
  std::free(mem);
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

TEST_F(CudaGpu, CopiesOutsideADeviceAllocationAreRefused) {
  REQUIRE_GPU();
  Ctx ctx = make_ctx(nullptr);
  const ps_platform_api& a = *raw().api;
  void* dev = nullptr;
  ASSERT_EQ(a.device_malloc(ctx.get(), 4096, &dev), PS_OK);
  std::vector<char> host(8192);
  EXPECT_EQ(a.copy_h2d(ctx.get(), static_cast<char*>(dev) + 1, host.data(), 4096),
            PS_ERR_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(a.last_error(), "not inside one device allocation"));
  EXPECT_EQ(a.copy_d2h(ctx.get(), host.data(), host.data(), 16), PS_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(a.copy_h2d(ctx.get(), dev, host.data(), 4096), PS_OK);
  EXPECT_EQ(a.device_free(ctx.get(), dev), PS_OK);
  EXPECT_EQ(a.copy_h2d(ctx.get(), dev, host.data(), 16), PS_ERR_INVALID_ARGUMENT);  // freed
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
  worker.init("cuda", 0, with_config("", uint64_t{64} << 20));
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

TEST_F(CudaGpu, DestroyContextReleasesEverythingLeft) {
  REQUIRE_GPU();
  const ps_platform_api& a = *raw().api;
  void* dev = nullptr;
  void* alloc_mode = nullptr;
  void* reg_mode = nullptr;
  ps_event* event = nullptr;
  ps_stream* stream = nullptr;
  {
    Ctx ctx = make_ctx("register_threshold_mb=4");
    ASSERT_EQ(a.device_malloc(ctx.get(), size_t{256} << 20, &dev), PS_OK);
    ASSERT_EQ(a.host_alloc_pinned(ctx.get(), 4096, &alloc_mode), PS_OK);
    ASSERT_EQ(a.host_alloc_pinned(ctx.get(), size_t{8} << 20, &reg_mode), PS_OK);
    ASSERT_EQ(a.stream_create(ctx.get(), &stream), PS_OK);
    ASSERT_EQ(a.event_create(ctx.get(), &event), PS_OK);
    EXPECT_EQ(memory_type(dev), cudaMemoryTypeDevice);
    EXPECT_EQ(memory_type(alloc_mode), cudaMemoryTypeHost);
    EXPECT_EQ(memory_type(reg_mode), cudaMemoryTypeHost);
  }  // destroy_context with all of it outstanding
  EXPECT_NE(memory_type(dev), cudaMemoryTypeDevice);
  EXPECT_NE(memory_type(alloc_mode), cudaMemoryTypeHost);
  EXPECT_NE(memory_type(reg_mode), cudaMemoryTypeHost);
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
    EXPECT_EQ(current, mine);  // Note [Device per call]: left on the worker's device
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

}  // namespace
