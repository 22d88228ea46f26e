// The sim plugin through its C table: argument checks, unknown pointers, the fault hook.
#include <gtest/gtest.h>

#include <cstdlib>
#include <vector>

#include "pinstage/platform_abi.h"
#include "runtime/plugin.h"

namespace pinstage {
namespace {

class SimAbiTest : public ::testing::Test {
 protected:
  void SetUp() override {
    plugin = detail::load_plugin("sim", detail::default_plugin_path("sim"));
    api = plugin.api;
    ps_context_options options{64 << 20, nullptr};
    ASSERT_EQ(api->create_context(0, &options, &ctx), PS_OK);
  }
  void TearDown() override { EXPECT_EQ(api->destroy_context(ctx), PS_OK); }
  detail::Plugin plugin;
  const ps_platform_api* api = nullptr;
  ps_device_ctx* ctx = nullptr;
};

TEST_F(SimAbiTest, FreeingAPointerTheBackendDoesNotOwnIsAnError) {
  int not_ours = 0;
  EXPECT_EQ(api->host_free_pinned(ctx, &not_ours), PS_ERR_UNKNOWN_POINTER);
  EXPECT_NE(std::string(api->last_error()).find("did not allocate"), std::string::npos);
  EXPECT_EQ(api->device_free(ctx, &not_ours), PS_ERR_UNKNOWN_POINTER);
  void* ptr = nullptr;
  ASSERT_EQ(api->host_alloc_pinned(ctx, 100, &ptr), PS_OK);
  EXPECT_EQ(api->host_free_pinned(ctx, ptr), PS_OK);
  EXPECT_EQ(api->host_free_pinned(ctx, ptr), PS_ERR_UNKNOWN_POINTER);  // double free
}

TEST_F(SimAbiTest, NullArgumentsAreRefused) {
  void* out = nullptr;
  EXPECT_EQ(api->device_malloc(nullptr, 10, &out), PS_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(api->device_malloc(ctx, 10, nullptr), PS_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(api->copy_h2d(ctx, nullptr, &out, 1), PS_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(api->mem_info(ctx, nullptr, nullptr), PS_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(api->create_context(0, nullptr, nullptr), PS_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(api->inject_fault(ctx, PS_FAULT_KIND_COUNT, 1), PS_ERR_INVALID_ARGUMENT);
  EXPECT_STREQ(ps_status_str(PS_ERR_OUT_OF_MEMORY), "PS_ERR_OUT_OF_MEMORY");
  EXPECT_STREQ(ps_status_str(-1234), "PS_ERR_UNKNOWN_STATUS");
}

TEST_F(SimAbiTest, CopiesMustTargetDeviceMemory) {
  std::vector<char> host(64);
  EXPECT_EQ(api->copy_h2d(ctx, host.data() + 32, host.data(), 16), PS_ERR_INVALID_ARGUMENT);
  void* dev = nullptr;
  ASSERT_EQ(api->device_malloc(ctx, 64, &dev), PS_OK);
  EXPECT_EQ(api->copy_h2d(ctx, dev, host.data(), 64), PS_OK);
  EXPECT_EQ(api->device_free(ctx, dev), PS_OK);
}

TEST_F(SimAbiTest, FaultHookFailsExactlyTheNthCall) {
  ASSERT_EQ(api->inject_fault(ctx, PS_FAULT_DEVICE_MALLOC, 2), PS_OK);
  void* a = nullptr;
  void* b = nullptr;
  void* c = nullptr;
  EXPECT_EQ(api->device_malloc(ctx, 10, &a), PS_OK);
  EXPECT_EQ(api->device_malloc(ctx, 10, &b), PS_ERR_INJECTED_FAULT);
  EXPECT_EQ(b, nullptr);
  EXPECT_EQ(api->device_malloc(ctx, 10, &c), PS_OK);
  uint64_t capacity = 0, committed = 0;
  ASSERT_EQ(api->mem_info(ctx, &capacity, &committed), PS_OK);
  EXPECT_EQ(committed, 2u * 4096);
  EXPECT_EQ(api->device_free(ctx, a), PS_OK);
  EXPECT_EQ(api->device_free(ctx, c), PS_OK);
}

TEST(SimAbiEnv, FaultEnvironmentVariableIsParsedAndValidated) {
  auto plugin = detail::load_plugin("sim", detail::default_plugin_path("sim"));
  ps_device_ctx* ctx = nullptr;
  setenv("PINSTAGE_SIM_FAULT", "copy_h2d:1", 1);
  ASSERT_EQ(plugin.api->create_context(0, nullptr, &ctx), PS_OK);
  void* dev = nullptr;
  char byte = 0;
  ASSERT_EQ(plugin.api->device_malloc(ctx, 1, &dev), PS_OK);
  EXPECT_EQ(plugin.api->copy_h2d(ctx, dev, &byte, 1), PS_ERR_INJECTED_FAULT);
  EXPECT_EQ(plugin.api->copy_h2d(ctx, dev, &byte, 1), PS_OK);
  EXPECT_EQ(plugin.api->destroy_context(ctx), PS_OK);  // also frees `dev`
  setenv("PINSTAGE_SIM_FAULT", "teleport:2", 1);
  EXPECT_EQ(plugin.api->create_context(0, nullptr, &ctx), PS_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(plugin.api->last_error()).find("teleport:2"), std::string::npos);
  unsetenv("PINSTAGE_SIM_FAULT");
}

TEST_F(SimAbiTest, RegisterLocksExistingMemoryAndUnregisterUndoesIt) {
  std::vector<char> host(1 << 16);
  EXPECT_EQ(api->host_register(ctx, host.data(), host.size()), PS_OK);
  EXPECT_EQ(api->host_register(ctx, host.data(), host.size()), PS_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(api->host_unregister(ctx, host.data()), PS_OK);
  EXPECT_EQ(api->host_unregister(ctx, host.data()), PS_ERR_UNKNOWN_POINTER);
}

}  // namespace
}  // namespace pinstage

namespace pinstage {
namespace {

TEST_F(SimAbiTest, CorruptFaultFlipsOneByteOfTheNthUpload) {
  void* dev = nullptr;
  ASSERT_EQ(api->device_malloc(ctx, 64, &dev), PS_OK);
  std::vector<unsigned char> host(64, 0x11), back(64);
  ASSERT_EQ(api->inject_fault(ctx, PS_FAULT_CORRUPT_H2D, 2), PS_OK);
  ASSERT_EQ(api->copy_h2d(ctx, dev, host.data(), 64), PS_OK);
  ASSERT_EQ(api->copy_d2h(ctx, back.data(), dev, 64), PS_OK);
  EXPECT_EQ(back, host);  // the first upload is intact
  ASSERT_EQ(api->copy_h2d(ctx, dev, host.data(), 64), PS_OK);
  ASSERT_EQ(api->copy_d2h(ctx, back.data(), dev, 64), PS_OK);
  EXPECT_EQ(back[32], 0x11 ^ 0x40);
  back[32] = 0x11;
  EXPECT_EQ(back, host);  // exactly one byte differs
  EXPECT_EQ(api->device_free(ctx, dev), PS_OK);
}

}  // namespace
}  // namespace pinstage
