// The cuda backend without a GPU: the plugin loads and passes the loader's checks, the
// no-device path fails clearly, and the CUDA-free pieces (config, error mapping) behave. GPUs are
// hidden from this process so the results are the same on a machine that has one.
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "backends/cuda/cuda_status.h"
#include "pinstage/backend/cuda_ext.h"
#include "pinstage/backend/pin_mode.h"
#include "pinstage/backend/platform_abi.h"
#include "pinstage/worker.h"

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
  // Every slot but host_execute (no host callables) is provided.
  EXPECT_NE(table->stream_create, nullptr);
  EXPECT_NE(table->copy_h2d_async, nullptr);
  EXPECT_NE(table->event_sync, nullptr);
  EXPECT_NE(table->inject_fault, nullptr);
  EXPECT_NE(table->get_proc_address, nullptr);
  EXPECT_EQ(table->host_execute, nullptr);
  EXPECT_NE(table->copy_d2d_async, nullptr);  // ABI v5: cudaMemcpyAsync(DeviceToDevice)
  EXPECT_NE(table->memset_async, nullptr);    // and cudaMemsetAsync
  EXPECT_NE(table->device_count, nullptr);    // ABI v6: the devices without a context
  EXPECT_NE(table->device_props, nullptr);
  // Only the entry leaves the plugin (the exports map): extensions go through
  // get_proc_address, not dlsym.
  EXPECT_EQ(dlsym(handle, "pinstage_cuda_pin_stats"), nullptr);
  EXPECT_EQ(dlsym(handle, "cuda_create_context"), nullptr);
}

TEST(CudaPlugin, GetProcAddressKnowsOnlyPinStats) {
  void* fn = api().get_proc_address(PS_CUDA_PIN_STATS_NAME);
  ASSERT_NE(fn, nullptr);
  EXPECT_STREQ(PS_CUDA_PIN_STATS_NAME, "cuda.pin_stats");  // the documented name
  for (const char* other : {"cuda.pin_stat", "pin_stats", "cuda.pin_stats ", "", "sim.x"})
    EXPECT_EQ(api().get_proc_address(other), nullptr) << "'" << other << "'";
  EXPECT_EQ(api().get_proc_address(nullptr), nullptr);
  // The extension is guarded like a slot.
  auto pin_stats = reinterpret_cast<ps_cuda_pin_stats_fn>(fn);
  ps_cuda_pin_stats stats{};
  EXPECT_EQ(pin_stats(nullptr, &stats), PS_ERR_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(api().last_error(), "NULL")) << api().last_error();
}

// The runtime's loader checks the entry, api_version and slots before any context is
// made: getting as far as no_device (not plugin_load) means the table passed.
TEST(CudaPlugin, PassesTheRuntimeLoader) {
  pinstage::Worker worker;
  pinstage::WorkerOptions options;
  options.plugin_path = kPluginPath;
  try {
    worker.init("cuda", 0, options);
    FAIL() << "init succeeded without a visible GPU";
  } catch (const pinstage::Error& e) {
    EXPECT_EQ(e.code(), pinstage::ErrorCode::no_device) << e.what();
  }
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
  const ps_config_entry entries[] = {{"register_chunk_mb", "fast"}};
  ps_context_options options{0, entries, 1, -1};
  ps_device_ctx* ctx = nullptr;
  EXPECT_EQ(api().create_context(0, &options, &ctx), PS_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(ctx, nullptr);
  const std::string msg = api().last_error();
  EXPECT_TRUE(contains(msg, "register_chunk_mb='fast'")) << msg;
  EXPECT_TRUE(contains(msg, "1 to 65536 MiB")) << msg;
  // A count without entries is refused, not read.
  options = ps_context_options{0, nullptr, 2, -1};
  EXPECT_EQ(api().create_context(0, &options, &ctx), PS_ERR_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(api().last_error(), "config_count")) << api().last_error();
}

TEST(CudaPlugin, WorkerInitForwardsTheConfigError) {
  pinstage::Worker worker;
  pinstage::WorkerOptions options;
  options.config = {{"sysfs_root", "/sys"}, {"register_chunk_mb", "0"}};
  try {
    worker.init("cuda", 0, options);
    FAIL() << "init accepted a bad config";
  } catch (const pinstage::Error& e) {
    EXPECT_TRUE(contains(e.what(), "register_chunk_mb='0'")) << e.what();
    EXPECT_TRUE(contains(e.what(), "PS_ERR_INVALID_ARGUMENT")) << e.what();
  }
  EXPECT_FALSE(worker.initialized());
}

// The keys of the old pinned modes reach the plugin's own parser too (create_context,
// Worker::init): refused as gone, saying where their job went, not as unknown keys.
TEST(CudaPlugin, TheGoneKeysAreRefusedAsGoneByCreateContext) {
  for (const char* key :
       {"pinned_mode", "register_threshold_mb", "prefault_threads", "register_thp"}) {
    const ps_config_entry entries[] = {{key, "1"}};
    const ps_context_options options{0, entries, 1, -1};
    ps_device_ctx* ctx = nullptr;
    EXPECT_EQ(api().create_context(0, &options, &ctx), PS_ERR_INVALID_ARGUMENT) << key;
    const std::string msg = api().last_error();
    EXPECT_TRUE(contains(msg, std::string("key '") + key + "' is gone")) << msg;
    EXPECT_TRUE(contains(msg, "PINSTAGE_HOST_HUGE_PAGES")) << msg;
  }
}

TEST(CudaPlugin, EverySlotRejectsANullContext) {
  const ps_platform_api& a = api();
  ps_allocation allocation{};
  uint64_t u1 = 0, u2 = 0;
  ps_capabilities caps{};
  ps_stream* stream = nullptr;
  ps_event* event = nullptr;
  char host[8] = {};
  const ps_allocation some{host, sizeof host, nullptr};
  const int statuses[] = {
      a.destroy_context(nullptr),
      a.device_malloc(nullptr, 16, &allocation),
      a.device_free(nullptr, &some),
      a.copy_h2d(nullptr, host, host, 8, 0),
      a.copy_d2h(nullptr, host, host, 8, 0),
      a.stream_create(nullptr, &stream),
      a.stream_destroy(nullptr, stream),
      a.stream_sync(nullptr, stream),
      a.copy_h2d_async(nullptr, host, host, 8, 0, reinterpret_cast<ps_stream*>(host)),
      a.copy_d2h_async(nullptr, host, host, 8, 0, reinterpret_cast<ps_stream*>(host)),
      a.event_create(nullptr, &event),
      a.event_destroy(nullptr, event),
      a.event_record(nullptr, event, stream),
      a.event_sync(nullptr, event),
      a.host_alloc_pinned(nullptr, 16, &allocation),
      a.host_free_pinned(nullptr, &some),
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

// ---- devices (ABI v6): listed without a context ----

// With GPUs hidden, counting fails as create_context does: PS_ERR_NO_DEVICE with the
// driver's text, so list_devices says why there is nothing (a count of 0 could not).
TEST(CudaPlugin, DeviceCountWithoutDeviceIsNoDeviceLikeCreateContext) {
  ASSERT_NE(api().device_count, nullptr);
  ASSERT_NE(api().device_props, nullptr);
  int count = 7;
  EXPECT_EQ(api().device_count(nullptr, &count), PS_ERR_NO_DEVICE);
  EXPECT_EQ(count, 0);
  const std::string msg = api().last_error();
  EXPECT_TRUE(contains(msg, "cudaGetDeviceCount")) << msg;
  EXPECT_TRUE(contains(msg, "sim backend")) << msg;
  ps_device_props props{};
  EXPECT_EQ(api().device_props(0, nullptr, &props), PS_ERR_NO_DEVICE);
  EXPECT_EQ(api().device_count(nullptr, nullptr), PS_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(api().device_props(0, nullptr, nullptr), PS_ERR_INVALID_ARGUMENT);
  pinstage::WorkerOptions options;
  options.plugin_path = kPluginPath;
  try {
    pinstage::list_devices("cuda", options);
    FAIL() << "listed devices without a visible GPU";
  } catch (const pinstage::Error& e) {
    EXPECT_EQ(e.code(), pinstage::ErrorCode::no_device) << e.what();
    EXPECT_TRUE(contains(e.what(), "count its devices")) << e.what();
    EXPECT_TRUE(contains(e.what(), "cudaGetDeviceCount")) << e.what();
  }
}

// The config is checked before any GPU is looked for, as in create_context: the listing
// takes the same keys (sysfs_root too) and refuses the same typos.
TEST(CudaPlugin, DeviceListingChecksTheConfigFirst) {
  int count = 0;
  ps_device_props props{};
  const ps_config_entry typo[] = {{"sysfs_rot", "/tmp"}};
  ps_context_options options{0, typo, 1, -1};
  EXPECT_EQ(api().device_count(&options, &count), PS_ERR_INVALID_ARGUMENT);
  std::string msg = api().last_error();
  EXPECT_TRUE(contains(msg, "unknown key 'sysfs_rot'")) << msg;
  EXPECT_TRUE(contains(msg, pinstage::backend::kPinConfigKeys)) << msg;
  EXPECT_TRUE(contains(msg, "sysfs_root")) << msg;
  const ps_config_entry relative[] = {{"sysfs_root", "sys"}};
  options = ps_context_options{0, relative, 1, -1};
  EXPECT_EQ(api().device_props(0, &options, &props), PS_ERR_INVALID_ARGUMENT);
  msg = api().last_error();
  EXPECT_TRUE(contains(msg, "sysfs_root='sys'")) << msg;
  EXPECT_TRUE(contains(msg, "an absolute path")) << msg;
  const ps_config_entry bad_chunk[] = {{"register_chunk_mb", "fast"}};
  options = ps_context_options{0, bad_chunk, 1, -1};
  EXPECT_EQ(api().device_count(&options, &count), PS_ERR_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(api().last_error(), "register_chunk_mb='fast'")) << api().last_error();
  // A good sysfs_root gets as far as the missing GPU, in create_context too.
  const ps_config_entry good[] = {{"sysfs_root", "/sys"}};
  options = ps_context_options{0, good, 1, -1};
  EXPECT_EQ(api().device_count(&options, &count), PS_ERR_NO_DEVICE);
  ps_device_ctx* ctx = nullptr;
  EXPECT_EQ(api().create_context(0, &options, &ctx), PS_ERR_NO_DEVICE);
}

// The listing needs devices, which this process (GPUs hidden, the real runtime) has none
// of: CudaOnFakeRuntime.* run again in a child with the fake runtime first on
// LD_LIBRARY_PATH, as the fake_cuda.* tests run (docs/cuda.md). The fake is
// <build>/fake_cuda; the plugin is <build>/lib/libpinstage_backend_cuda.so.
std::string fake_cuda_dir() {
#ifdef PINSTAGE_FAKE_CUDA_DIR
  return PINSTAGE_FAKE_CUDA_DIR;
#else
  return (std::filesystem::path(kPluginPath).parent_path().parent_path() / "fake_cuda").string();
#endif
}

TEST(CudaPlugin, ListsTheDevicesOfTheFakeRuntime) {
  const std::string fake = fake_cuda_dir();
  ASSERT_TRUE(std::filesystem::exists(fake + "/libcudart.so.13"))
      << "no fake runtime at " << fake << " (build the pinstage_fake_cudart target)";
  char self[4096] = {};
  const ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  ASSERT_GT(n, 0);
  const std::string command = "env -u GTEST_OUTPUT LD_LIBRARY_PATH='" + fake +
                              "' PINSTAGE_FAKE_CUDA_DEVICES=3 PINSTAGE_TEST_ON_FAKE_CUDA=1 '" +
                              self + "' --gtest_filter='CudaOnFakeRuntime.*' 2>&1";
  FILE* child = popen(command.c_str(), "r");
  ASSERT_NE(child, nullptr);
  std::string output;
  char buf[4096];
  for (size_t got; (got = fread(buf, 1, sizeof buf, child)) > 0;) output.append(buf, got);
  const int status = pclose(child);
  EXPECT_EQ(status, 0) << output;
  EXPECT_TRUE(contains(output, "[  PASSED  ] 3 tests.")) << output;
  EXPECT_FALSE(contains(output, "[  FAILED  ]")) << output;
}

// The fake's controls (tests/cpp/test_cuda_fake_runtime.cpp), found in the process.
template <class Fn>
Fn fake_fn(const char* name) {
  return reinterpret_cast<Fn>(dlsym(RTLD_DEFAULT, name));
}
using SetDeviceFn = void (*)(int, const char*, size_t, const char*, int);

// A sysfs tree of its own: <root>/bus/pci/devices/<id>/numa_node for each (id, node),
// node "" = the device's folder without the file.
class SysfsTree {
 public:
  explicit SysfsTree(std::initializer_list<std::pair<const char*, const char*>> devices) {
    char tmpl[] = "/tmp/pinstage-sysfs-XXXXXX";
    root_ = mkdtemp(tmpl) ? tmpl : "";
    for (const auto& [id, node] : devices) {
      const auto dir = std::filesystem::path(root_) / "bus/pci/devices" / id;
      std::filesystem::create_directories(dir);
      if (*node != '\0') std::ofstream(dir / "numa_node") << node << "\n";
    }
  }
  SysfsTree(const SysfsTree&) = delete;
  SysfsTree& operator=(const SysfsTree&) = delete;
  ~SysfsTree() {
    std::error_code ignored;
    if (!root_.empty()) std::filesystem::remove_all(root_, ignored);
  }
  const std::string& root() const { return root_; }

 private:
  std::string root_;
};

// The tests of the child of ListsTheDevicesOfTheFakeRuntime, registered only there
// (PINSTAGE_TEST_ON_FAKE_CUDA set; see kFakeRuntimeTests), so ctest lists none of them.
class CudaOnFakeRuntime : public ::testing::Test {
 public:
  using Body = void (CudaOnFakeRuntime::*)();
  explicit CudaOnFakeRuntime(Body body) : body_(body) {}
  void TestBody() override { (this->*body_)(); }
  void lists_every_device();
  void failed_properties_make_a_device_unusable();
  void raw_slots_and_a_worker();

 protected:
  void SetUp() override {
    set_device = fake_fn<SetDeviceFn>("pinstage_fake_cuda_set_device");
    reset_devices = fake_fn<void (*)()>("pinstage_fake_cuda_reset_devices");
    calls = fake_fn<size_t (*)(const char*)>("pinstage_fake_cuda_calls");
    ASSERT_TRUE(set_device && reset_devices && calls) << "not the fake CUDA runtime";
    reset_devices();
  }
  void TearDown() override {
    if (reset_devices != nullptr) reset_devices();
  }
  static pinstage::WorkerOptions with_sysfs(const SysfsTree& tree) {
    pinstage::WorkerOptions options;
    options.plugin_path = kPluginPath;
    options.config = {{"sysfs_root", tree.root()}};
    return options;
  }
  SetDeviceFn set_device = nullptr;
  void (*reset_devices)() = nullptr;
  size_t (*calls)(const char*) = nullptr;

 private:
  Body body_;
};

void CudaOnFakeRuntime::lists_every_device() {
  set_device(0, "NVIDIA H200", size_t{141} << 30, "0000:3B:00.0", 0);
  set_device(1, "NVIDIA H100 PCIe", size_t{80} << 30, "00000001:AF:00.0", 0);
  set_device(2, nullptr, 0, "0000:5E:00.0", 0);  // default name and memory
  const SysfsTree tree({{"0000:3b:00.0", "1"}, {"0001:af:00.0", "-1"}, {"0000:5e:00.0", ""}});
  const char* const context_calls[] = {"cudaSetDevice", "cudaMalloc", "cudaMemGetInfo",
                                       "cudaStreamCreateWithFlags"};
  std::vector<size_t> before;
  for (const char* c : context_calls) before.push_back(calls(c));
  const auto devices = pinstage::list_devices("cuda", with_sysfs(tree));
  ASSERT_EQ(devices.size(), 3u);
  EXPECT_EQ(devices[0].name, "NVIDIA H200");
  EXPECT_EQ(devices[0].memory_bytes, uint64_t{141} << 30);
  EXPECT_EQ(devices[0].pci_bus_id, "0000:3b:00.0");  // lower case
  EXPECT_EQ(devices[0].numa_node, 1);
  EXPECT_EQ(devices[1].name, "NVIDIA H100 PCIe");
  EXPECT_EQ(devices[1].pci_bus_id, "0001:af:00.0");  // NVML's 8-digit domain, as sysfs has it
  EXPECT_EQ(devices[1].numa_node, -1);               // the kernel says -1
  EXPECT_EQ(devices[2].name, "pinstage fake GPU 2");
  EXPECT_EQ(devices[2].memory_bytes, uint64_t{1} << 30);
  EXPECT_EQ(devices[2].numa_node, -1);  // no numa_node file
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(devices[i].id, i);
    EXPECT_TRUE(devices[i].usable) << devices[i].reason;
    EXPECT_EQ(devices[i].reason, "");
  }
  // No context was made: nothing that would create one on a GPU ran.
  for (size_t i = 0; i < std::size(context_calls); ++i)
    EXPECT_EQ(calls(context_calls[i]), before[i]) << context_calls[i];
  // The default: the fake's own PCI ids, on the default sysfs_root of /sys.
  reset_devices();
  pinstage::WorkerOptions plain;
  plain.plugin_path = kPluginPath;
  EXPECT_EQ(pinstage::list_devices("cuda", plain)[2].pci_bus_id, "0000:12:00.0");
}

void CudaOnFakeRuntime::failed_properties_make_a_device_unusable() {
  set_device(1, nullptr, 0, "0000:AF:00.0", cudaErrorDevicesUnavailable);
  const SysfsTree tree({{"0000:af:00.0", "0"}});
  const auto devices = pinstage::list_devices("cuda", with_sysfs(tree));
  ASSERT_EQ(devices.size(), 3u);
  EXPECT_TRUE(devices[0].usable);
  EXPECT_TRUE(devices[2].usable);
  const pinstage::DeviceInfo& bad = devices[1];
  EXPECT_FALSE(bad.usable);
  EXPECT_TRUE(contains(bad.reason, "cudaGetDeviceProperties(1)")) << bad.reason;
  EXPECT_TRUE(contains(bad.reason, "cudaErrorDevicesUnavailable")) << bad.reason;
  EXPECT_EQ(bad.name, "CUDA device 1");
  EXPECT_EQ(bad.memory_bytes, 0u);
  EXPECT_EQ(bad.pci_bus_id, "0000:af:00.0");  // still looked up
  EXPECT_EQ(bad.numa_node, 0);
}

void CudaOnFakeRuntime::raw_slots_and_a_worker() {
  ps_device_props props{};
  EXPECT_EQ(api().device_props(3, nullptr, &props), PS_ERR_NO_DEVICE);
  EXPECT_TRUE(contains(api().last_error(), "CUDA device 3 does not exist")) << api().last_error();
  EXPECT_EQ(api().device_props(-1, nullptr, &props), PS_ERR_NO_DEVICE);
  int count = 0;
  EXPECT_EQ(api().device_count(nullptr, &count), PS_OK);
  EXPECT_EQ(count, 3);
  set_device(1, "NVIDIA H200", 0, "0000:3B:00.0", 0);
  const SysfsTree tree({{"0000:3b:00.0", "1"}});
  pinstage::Worker worker;
  worker.init("cuda", 1, with_sysfs(tree));
  const pinstage::DeviceInfo mine = worker.device_info();
  EXPECT_EQ(mine.id, 1);
  EXPECT_EQ(mine.name, "NVIDIA H200");
  EXPECT_EQ(mine.numa_node, 1);
}

const bool kFakeRuntimeTests = [] {
  if (std::getenv("PINSTAGE_TEST_ON_FAKE_CUDA") == nullptr) return false;
  const std::pair<const char*, CudaOnFakeRuntime::Body> tests[] = {
      {"ListsEveryDeviceWithItsNameMemoryPciIdAndNode", &CudaOnFakeRuntime::lists_every_device},
      {"ADeviceWhosePropertiesFailIsListedNotUsableWithTheReason",
       &CudaOnFakeRuntime::failed_properties_make_a_device_unusable},
      {"TheRawSlotsCheckTheDeviceIdAndAWorkerTakesSysfsRoot",
       &CudaOnFakeRuntime::raw_slots_and_a_worker},
  };
  for (const auto& [name, body] : tests)
    ::testing::RegisterTest(
        "CudaOnFakeRuntime", name, nullptr, nullptr, __FILE__, __LINE__,
        [body = body]() -> CudaOnFakeRuntime* { return new CudaOnFakeRuntime(body); });
  return true;
}();

// ---- config ----

using CudaConfig = pinstage::backend::PinConfig;
using Entries = std::initializer_list<ps_config_entry>;

CudaConfig parse(Entries entries) { return pinstage::backend::parse_pin_config(entries); }

// The message of the invalid_argument a bad config throws ("" when it parses).
std::string parse_error(Entries entries) {
  try {
    parse(entries);
  } catch (const pinstage::Error& e) {
    EXPECT_EQ(e.code(), pinstage::ErrorCode::invalid_argument) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "the config parsed";
  return "";
}

TEST(CudaConfig, DefaultsWhenEmpty) {
  EXPECT_EQ(parse({}).register_chunk_bytes, uint64_t{64} << 30);  // 64 GiB pieces
}

TEST(CudaConfig, TheChunkKey) {
  EXPECT_EQ(parse({{"register_chunk_mb", "1"}}).register_chunk_bytes, uint64_t{1} << 20);
  EXPECT_EQ(parse({{"register_chunk_mb", "65536"}}).register_chunk_bytes, uint64_t{64} << 30);
}

TEST(CudaConfig, UnknownAndRepeatedKeysNameTheKeyAndListTheAcceptedOnes) {
  const std::string unknown = parse_error({{"register_chunk", "1"}});
  EXPECT_TRUE(contains(unknown, "unknown key 'register_chunk'")) << unknown;
  EXPECT_TRUE(contains(unknown, pinstage::backend::kPinConfigKeys)) << unknown;
  const std::string twice = parse_error({{"register_chunk_mb", "1"}, {"register_chunk_mb", "2"}});
  EXPECT_TRUE(contains(twice, "'register_chunk_mb' is given twice")) << twice;
  // Keys are exact: no trimming, no case folding.
  EXPECT_TRUE(
      contains(parse_error({{" register_chunk_mb", "1"}}), "unknown key ' register_chunk_mb'"));
  EXPECT_TRUE(contains(parse_error({{"Register_Chunk_MB", "1"}}), "unknown key"));
  EXPECT_TRUE(contains(parse_error({{nullptr, "1"}}), "NULL key"));
  EXPECT_TRUE(contains(parse_error({{"register_chunk_mb", nullptr}}), "NULL value"));
}

// PinConfig, the accepted-keys message and the parser come from PINSTAGE_PIN_CONFIG_FIELDS:
// every key of the list is named in kPinConfigKeys, accepted, and sets its member.
TEST(CudaConfig, EveryKeyOfTheListIsParsedIntoItsMember) {
  std::string keys;
#define PINSTAGE_TEST_PIN_KEY_(type, member, value, key, min, max, shift, doc)              \
  {                                                                                         \
    keys += std::string(keys.empty() ? "" : ", ") + key;                                    \
    EXPECT_TRUE(pinstage::backend::is_pin_config_key(key)) << key;                          \
    EXPECT_EQ(CudaConfig{}.member, static_cast<type>(value)) << key;                        \
    const std::string text = std::to_string(min);                                           \
    EXPECT_EQ(parse({{key, text.c_str()}}).member, static_cast<type>(min) << shift) << key; \
  }
  PINSTAGE_PIN_CONFIG_FIELDS(PINSTAGE_TEST_PIN_KEY_)
#undef PINSTAGE_TEST_PIN_KEY_
  EXPECT_EQ(keys, pinstage::backend::kPinConfigKeys);
  EXPECT_FALSE(pinstage::backend::is_pin_config_key("sysfs_root"));   // cuda's own
  EXPECT_FALSE(pinstage::backend::is_pin_config_key("pinned_mode"));  // gone
}

// The keys of the backends that made host memory themselves are refused saying where their
// job went (the runtime's placement), not as a typo.
TEST(CudaConfig, TheKeysOfTheOldPinnedModesSayTheRuntimeDoesItNow) {
  for (const char* key :
       {"pinned_mode", "register_threshold_mb", "prefault_threads", "register_thp"}) {
    const std::string msg = parse_error({{key, "1"}});
    EXPECT_TRUE(contains(msg, std::string("key '") + key + "' is gone")) << msg;
    EXPECT_TRUE(contains(msg, "PINSTAGE_HOST_HUGE_PAGES")) << msg;
  }
}

TEST(CudaConfig, BadValuesNameTheKeyValueAndWhatIsExpected) {
  for (const char* value : {"0", "65537", "1g", "", "-1"}) {
    const std::string msg = parse_error({{"register_chunk_mb", value}});
    EXPECT_TRUE(contains(msg, std::string("register_chunk_mb='") + value + "'")) << msg;
    EXPECT_TRUE(contains(msg, "1 to 65536 MiB")) << msg;
  }
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

TEST(CudaStatus, StickyErrorsAreThoseThatBreakTheContext) {
  using pinstage::cuda::is_sticky;
  for (cudaError_t e : {cudaErrorIllegalAddress, cudaErrorLaunchFailure, cudaErrorECCUncorrectable,
                        cudaErrorMisalignedAddress, cudaErrorHardwareStackError})
    EXPECT_TRUE(is_sticky(e)) << e;
  for (cudaError_t e : {cudaSuccess, cudaErrorMemoryAllocation, cudaErrorInvalidValue,
                        cudaErrorNoDevice, cudaErrorHostMemoryNotRegistered, cudaErrorNotReady})
    EXPECT_FALSE(is_sticky(e)) << e;
}

TEST(CudaStatus, TextHasTheRuntimeStringAndName) {
  const std::string text = pinstage::cuda::cuda_error_text(cudaErrorMemoryAllocation);
  EXPECT_TRUE(contains(text, cudaGetErrorString(cudaErrorMemoryAllocation))) << text;
  EXPECT_TRUE(contains(text, "(cudaErrorMemoryAllocation)")) << text;
}

}  // namespace
