// The cuda backend without a GPU: the plugin loads and passes the loader's checks, the
// no-device path fails clearly, and the CUDA-free pieces (config, pre-faulting, error
// mapping) behave. GPUs are hidden from this process so the results are the same on a
// machine that has one.
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "backends/cuda/cuda_config.h"
#include "backends/cuda/cuda_ext.h"
#include "backends/cuda/cuda_status.h"
#include "backends/cuda/host_pages.h"
#include "pinstage/platform_abi.h"
#include "pinstage/worker.h"
#include "runtime/plugin.h"

namespace {

// Before any CUDA call in this process (static initialisation runs before main).
const bool kGpusHidden = [] { return setenv("CUDA_VISIBLE_DEVICES", "", 1) == 0; }();

const char* const kPluginPath = PINSTAGE_CUDA_PLUGIN_PATH;

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// The plugin's table, loaded once for the process (never unloaded: the CUDA runtime it
// pulls in is not meant to be torn down and reloaded).
const ps_platform_api& api() {
  static const ps_platform_api* table = [] {
    void* handle = dlopen(kPluginPath, RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) return static_cast<const ps_platform_api*>(nullptr);
    auto entry =
        reinterpret_cast<ps_platform_entry_fn>(dlsym(handle, PINSTAGE_PLATFORM_ENTRY_SYMBOL));
    return entry ? entry() : nullptr;
  }();
  if (table == nullptr) throw std::runtime_error(std::string("cannot load ") + kPluginPath);
  return *table;
}

// ---- loading ----

TEST(CudaPlugin, LoadsWithEntryVersionAndName) {
  ASSERT_TRUE(kGpusHidden);
  void* handle = dlopen(kPluginPath, RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(handle, nullptr) << dlerror();
  auto entry =
      reinterpret_cast<ps_platform_entry_fn>(dlsym(handle, PINSTAGE_PLATFORM_ENTRY_SYMBOL));
  ASSERT_NE(entry, nullptr);
  const ps_platform_api* table = entry();
  ASSERT_NE(table, nullptr);
  EXPECT_EQ(table->api_version, PINSTAGE_PLATFORM_API_VERSION);
  EXPECT_STREQ(table->name, "cuda");
  // Every slot but execute (no callables) is provided.
  EXPECT_NE(table->stream_create, nullptr);
  EXPECT_NE(table->copy_h2d_async, nullptr);
  EXPECT_NE(table->event_sync, nullptr);
  EXPECT_NE(table->host_register, nullptr);
  EXPECT_NE(table->host_unregister, nullptr);
  EXPECT_NE(table->inject_fault, nullptr);
  EXPECT_EQ(table->execute, nullptr);
  EXPECT_NE(dlsym(handle, PINSTAGE_CUDA_PIN_STATS_SYMBOL), nullptr);
  // Nothing else leaks out of the plugin (the exports map).
  EXPECT_EQ(dlsym(handle, "cuda_create_context"), nullptr);
}

TEST(CudaPlugin, PassesTheRuntimeLoader) {
  const pinstage::detail::Plugin plugin = pinstage::detail::load_plugin("cuda", kPluginPath);
  EXPECT_EQ(plugin.info.name, "cuda");
  EXPECT_EQ(plugin.info.api_version, PINSTAGE_PLATFORM_API_VERSION);
  EXPECT_EQ(plugin.info.path, kPluginPath);
}

// ---- no device ----

TEST(CudaPlugin, CreateContextWithoutDeviceIsNoDevice) {
  ps_device_ctx* ctx = reinterpret_cast<ps_device_ctx*>(0x1);  // must be reset to NULL
  const int status = api().create_context(0, nullptr, &ctx);
  EXPECT_EQ(status, PS_ERR_NO_DEVICE) << ps_status_str(status);
  EXPECT_EQ(ctx, nullptr);
  const std::string msg = api().last_error();
  EXPECT_TRUE(contains(msg, "cudaGetDeviceCount")) << msg;
  EXPECT_TRUE(contains(msg, "sim backend")) << msg;
}

TEST(CudaPlugin, WorkerInitWithoutDeviceThrowsNoDevice) {
  pinstage::Worker worker;
  try {
    worker.init("cuda", 0);
    FAIL() << "init succeeded without a visible GPU";
  } catch (const pinstage::Error& e) {
    EXPECT_EQ(e.code(), pinstage::ErrorCode::no_device) << e.what();
    EXPECT_TRUE(contains(e.what(), "cudaGetDeviceCount")) << e.what();
    EXPECT_TRUE(contains(e.what(), "device 0")) << e.what();
  }
  EXPECT_FALSE(worker.initialized());
  EXPECT_FALSE(worker.finalized());
}

TEST(CudaPlugin, BadArgumentsToCreateContext) {
  ps_device_ctx* ctx = nullptr;
  EXPECT_EQ(api().create_context(0, nullptr, nullptr), PS_ERR_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(api().last_error(), "output pointer is NULL"));
  EXPECT_EQ(api().create_context(-1, nullptr, &ctx), PS_ERR_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(api().last_error(), "-1"));
  EXPECT_EQ(ctx, nullptr);
}

TEST(CudaPlugin, BadConfigIsRejectedBeforeLookingForADevice) {
  ps_context_options options{0, "pinned_mode=fast"};
  ps_device_ctx* ctx = nullptr;
  EXPECT_EQ(api().create_context(0, &options, &ctx), PS_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(ctx, nullptr);
  const std::string msg = api().last_error();
  EXPECT_TRUE(contains(msg, "pinned_mode='fast'")) << msg;
  EXPECT_TRUE(contains(msg, "auto, alloc or register")) << msg;
}

TEST(CudaPlugin, WorkerInitForwardsTheConfigError) {
  pinstage::Worker worker;
  pinstage::WorkerOptions options;
  options.config = "pinned_mode=alloc;register_thp=2";
  try {
    worker.init("cuda", 0, options);
    FAIL() << "init accepted a bad config";
  } catch (const pinstage::Error& e) {
    EXPECT_TRUE(contains(e.what(), "register_thp='2'")) << e.what();
    EXPECT_TRUE(contains(e.what(), "PS_ERR_INVALID_ARGUMENT")) << e.what();
  }
  EXPECT_FALSE(worker.initialized());
}

TEST(CudaPlugin, EverySlotRejectsANullContext) {
  const ps_platform_api& a = api();
  void* p = nullptr;
  uint64_t u1 = 0, u2 = 0;
  ps_capabilities caps{};
  ps_stream* stream = nullptr;
  ps_event* event = nullptr;
  char host[8] = {};
  const int statuses[] = {
      a.destroy_context(nullptr),
      a.device_malloc(nullptr, 16, &p),
      a.device_free(nullptr, host),
      a.copy_h2d(nullptr, host, host, 8),
      a.copy_d2h(nullptr, host, host, 8),
      a.stream_create(nullptr, &stream),
      a.stream_destroy(nullptr, stream),
      a.stream_sync(nullptr, stream),
      a.copy_h2d_async(nullptr, host, host, 8, reinterpret_cast<ps_stream*>(host)),
      a.copy_d2h_async(nullptr, host, host, 8, reinterpret_cast<ps_stream*>(host)),
      a.event_create(nullptr, &event),
      a.event_destroy(nullptr, event),
      a.event_record(nullptr, event, stream),
      a.event_sync(nullptr, event),
      a.host_alloc_pinned(nullptr, 16, &p),
      a.host_free_pinned(nullptr, host),
      a.host_register(nullptr, host, 8),
      a.host_unregister(nullptr, host),
      a.mem_info(nullptr, &u1, &u2),
      a.get_capabilities(nullptr, &caps),
      a.inject_fault(nullptr, PS_FAULT_DEVICE_MALLOC, 1),
  };
  for (size_t i = 0; i < std::size(statuses); ++i)
    EXPECT_EQ(statuses[i], PS_ERR_INVALID_ARGUMENT) << "slot #" << i;
  EXPECT_STRNE(a.last_error(), "");
}

TEST(CudaPlugin, LastErrorIsPerThread) {
  ASSERT_EQ(api().create_context(-7, nullptr, nullptr), PS_ERR_INVALID_ARGUMENT);
  const std::string mine = api().last_error();
  EXPECT_FALSE(mine.empty());
  std::string other = "unset";
  std::thread([&] { other = api().last_error(); }).join();
  EXPECT_EQ(other, "");
  EXPECT_EQ(api().last_error(), mine);
}

// ---- config ----

using pinstage::cuda::CudaConfig;
using pinstage::cuda::PinnedMode;

CudaConfig parse_ok(const std::string& text) {
  CudaConfig config;
  std::string error;
  EXPECT_TRUE(pinstage::cuda::parse_config(text, config, error)) << text << ": " << error;
  return config;
}

std::string parse_error(const std::string& text) {
  CudaConfig config;
  config.prefault_threads = 77;  // must survive a failed parse
  std::string error;
  EXPECT_FALSE(pinstage::cuda::parse_config(text, config, error)) << text;
  EXPECT_EQ(config.prefault_threads, 77) << "a failed parse changed the output";
  return error;
}

TEST(CudaConfig, DefaultsWhenEmpty) {
  for (const char* text : {"", " ", ";", " ; ;"}) {
    const CudaConfig c = parse_ok(text);
    EXPECT_EQ(c.pinned_mode, PinnedMode::auto_select);
    EXPECT_EQ(c.register_threshold_bytes, uint64_t{64} << 20);
    EXPECT_EQ(c.prefault_threads, 0);
    EXPECT_FALSE(c.register_thp);
  }
}

TEST(CudaConfig, EveryKey) {
  const CudaConfig c = parse_ok(
      " pinned_mode = register ; register_threshold_mb=3;prefault_threads=5; "
      "register_thp=1;");
  EXPECT_EQ(c.pinned_mode, PinnedMode::reg);
  EXPECT_EQ(c.register_threshold_bytes, uint64_t{3} << 20);
  EXPECT_EQ(c.prefault_threads, 5);
  EXPECT_TRUE(c.register_thp);
  EXPECT_EQ(parse_ok("pinned_mode=alloc").pinned_mode, PinnedMode::alloc);
  EXPECT_EQ(parse_ok("pinned_mode=auto").pinned_mode, PinnedMode::auto_select);
  EXPECT_TRUE(parse_ok("register_thp=on").register_thp);
  EXPECT_FALSE(parse_ok("register_thp=off").register_thp);
  EXPECT_EQ(parse_ok("register_threshold_mb=0").register_threshold_bytes, 0u);
}

TEST(CudaConfig, ErrorsNameTheProblem) {
  EXPECT_TRUE(contains(parse_error("pinned_mod=alloc"), "unknown cuda config key 'pinned_mod'"));
  EXPECT_TRUE(contains(parse_error("pinned_mod=alloc"), "register_threshold_mb"));
  EXPECT_TRUE(contains(parse_error("pinned_mode"), "not key=value"));
  EXPECT_TRUE(contains(parse_error("pinned_mode=alloc;pinned_mode=register"), "given twice"));
  EXPECT_TRUE(contains(parse_error("register_threshold_mb=-1"), "whole number"));
  EXPECT_TRUE(contains(parse_error("register_threshold_mb=12x"), "whole number"));
  EXPECT_TRUE(contains(parse_error("register_threshold_mb=99999999999999999999"), "whole number"));
  EXPECT_TRUE(contains(parse_error("prefault_threads=5000"), "1024"));
  EXPECT_TRUE(contains(parse_error("register_thp=maybe"), "0 or 1"));
  EXPECT_TRUE(contains(parse_error("pinned_mode="), "auto, alloc or register"));
}

TEST(CudaConfig, ChooseModeBySizeOrForce) {
  CudaConfig c = parse_ok("register_threshold_mb=2");
  const size_t two_mib = size_t{2} << 20;
  EXPECT_EQ(pinstage::cuda::choose_pinned_mode(c, 1), PinnedMode::alloc);
  EXPECT_EQ(pinstage::cuda::choose_pinned_mode(c, two_mib - 1), PinnedMode::alloc);
  EXPECT_EQ(pinstage::cuda::choose_pinned_mode(c, two_mib), PinnedMode::reg);
  c.pinned_mode = PinnedMode::alloc;
  EXPECT_EQ(pinstage::cuda::choose_pinned_mode(c, size_t{1} << 40), PinnedMode::alloc);
  c.pinned_mode = PinnedMode::reg;
  EXPECT_EQ(pinstage::cuda::choose_pinned_mode(c, 1), PinnedMode::reg);
  EXPECT_STREQ(pinstage::cuda::pinned_mode_name(PinnedMode::reg), "register");
}

// ---- pre-faulted mappings ----

using pinstage::cuda::HostPagesOptions;
using pinstage::cuda::MappedPages;
using pinstage::cuda::PagesStatus;
using pinstage::cuda::PrefaultReport;

// Pages resident in [p, p + bytes), counted with mincore.
size_t resident_pages(void* p, size_t bytes) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  std::vector<unsigned char> vec((bytes + page - 1) / page);
  if (mincore(p, bytes, vec.data()) != 0) return 0;
  size_t n = 0;
  for (unsigned char v : vec) n += v & 1;
  return n;
}

TEST(HostPages, MapsPrefaultedZeroedPagesOnSeveralThreads) {
  const size_t bytes = (size_t{96} << 20) + 5;  // not a whole number of pages
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  MappedPages pages;
  PrefaultReport report;
  std::string error;
  ASSERT_EQ(pinstage::cuda::map_prefaulted(bytes, HostPagesOptions{3, true}, pages, report, error),
            PagesStatus::ok)
      << error;
  EXPECT_EQ(pages.bytes, (bytes + page - 1) / page * page);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(pages.data) % (size_t{2} << 20), 0u);
  EXPECT_EQ(report.threads, 3);
  EXPECT_GE(report.prefault_seconds, 0.0);
  // Every page is resident before anyone touches it, and reads as zero.
  EXPECT_EQ(resident_pages(pages.data, pages.bytes), pages.bytes / page);
  const auto* bytes_ptr = static_cast<const unsigned char*>(pages.data);
  for (size_t off = 0; off < pages.bytes; off += page + 1) ASSERT_EQ(bytes_ptr[off], 0u) << off;
  std::memset(pages.data, 0xab, pages.bytes);  // all of it is writable
  ASSERT_TRUE(pinstage::cuda::unmap_pages(pages, error)) << error;
}

TEST(HostPages, WithoutHugePagesTheMappingIsExact) {
  MappedPages pages;
  PrefaultReport report;
  std::string error;
  ASSERT_EQ(pinstage::cuda::map_prefaulted(10000, HostPagesOptions{0, false}, pages, report, error),
            PagesStatus::ok)
      << error;
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  EXPECT_EQ(pages.data, pages.base);
  EXPECT_EQ(pages.map_bytes, (10000 + page - 1) / page * page);
  EXPECT_EQ(report.threads, 1);  // too small to split
  EXPECT_EQ(resident_pages(pages.data, pages.bytes), pages.bytes / page);
  ASSERT_TRUE(pinstage::cuda::unmap_pages(pages, error)) << error;
}

TEST(HostPages, BadSizesFailWithNothingMapped) {
  MappedPages pages;
  PrefaultReport report;
  std::string error;
  EXPECT_EQ(pinstage::cuda::map_prefaulted(0, {}, pages, report, error), PagesStatus::failed);
  EXPECT_TRUE(contains(error, "0 bytes"));
  error.clear();
  EXPECT_EQ(pinstage::cuda::map_prefaulted(SIZE_MAX - 10, {}, pages, report, error),
            PagesStatus::out_of_memory);
  EXPECT_FALSE(error.empty());
  EXPECT_EQ(pages.base, nullptr);  // untouched on failure
}

TEST(HostPages, ThreadCountFollowsSizeAndOption) {
  EXPECT_EQ(pinstage::cuda::prefault_thread_count(1, {8, true}), 1);
  EXPECT_EQ(pinstage::cuda::prefault_thread_count(size_t{64} << 20, {8, true}), 2);
  EXPECT_EQ(pinstage::cuda::prefault_thread_count(size_t{8} << 30, {8, true}), 8);
  const int automatic = pinstage::cuda::prefault_thread_count(size_t{64} << 30, {0, true});
  EXPECT_GE(automatic, 1);
  EXPECT_LE(automatic, 32);
  EXPECT_LE(automatic, static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
}

// ---- CUDA error mapping ----

TEST(CudaStatus, MapsErrorsToStatuses) {
  using pinstage::cuda::status_from_cuda;
  EXPECT_EQ(status_from_cuda(cudaSuccess, PS_ERR_BACKEND), PS_OK);
  EXPECT_EQ(status_from_cuda(cudaErrorMemoryAllocation, PS_ERR_BACKEND), PS_ERR_OUT_OF_MEMORY);
  EXPECT_EQ(status_from_cuda(cudaErrorNoDevice, PS_ERR_BACKEND), PS_ERR_NO_DEVICE);
  EXPECT_EQ(status_from_cuda(cudaErrorInsufficientDriver, PS_ERR_BACKEND), PS_ERR_NO_DEVICE);
  EXPECT_EQ(status_from_cuda(cudaErrorInvalidDevice, PS_ERR_BACKEND), PS_ERR_NO_DEVICE);
  EXPECT_EQ(status_from_cuda(cudaErrorInvalidValue, PS_ERR_BACKEND), PS_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(status_from_cuda(cudaErrorHostMemoryAlreadyRegistered, PS_ERR_BACKEND),
            PS_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(status_from_cuda(cudaErrorHostMemoryNotRegistered, PS_ERR_BACKEND),
            PS_ERR_UNKNOWN_POINTER);
  EXPECT_EQ(status_from_cuda(cudaErrorNotSupported, PS_ERR_BACKEND), PS_ERR_UNSUPPORTED);
  EXPECT_EQ(status_from_cuda(cudaErrorIllegalAddress, PS_ERR_COPY_FAILED), PS_ERR_COPY_FAILED);
  EXPECT_EQ(status_from_cuda(cudaErrorIllegalAddress, PS_ERR_BACKEND), PS_ERR_BACKEND);
}

TEST(CudaStatus, TextHasTheRuntimeStringAndName) {
  const std::string text = pinstage::cuda::cuda_error_text(cudaErrorMemoryAllocation);
  EXPECT_TRUE(contains(text, cudaGetErrorString(cudaErrorMemoryAllocation))) << text;
  EXPECT_TRUE(contains(text, "(cudaErrorMemoryAllocation)")) << text;
}

}  // namespace
