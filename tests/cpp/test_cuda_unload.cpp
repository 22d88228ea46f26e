// The cuda plugin is never unloaded (issue 16, item 1). This binary links libpinstage
// but not the CUDA runtime, like the CLI and the Python module: libcudart is mapped only
// because the plugin pulls it in, so it would go with the plugin. Runs on the fake
// runtime (label cuda, LD_LIBRARY_PATH=<build>/fake_cuda).
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <string>

#include "pinstage/worker.h"

namespace {

const char* const kPluginPath = PINSTAGE_CUDA_PLUGIN_PATH;
const char* const kCudart = "libcudart.so.13";

// True when `name` is loaded in this process (RTLD_NOLOAD loads nothing).
bool mapped(const char* name) {
  void* h = dlopen(name, RTLD_NOW | RTLD_NOLOAD);
  if (h == nullptr) return false;
  dlclose(h);  // drops only the reference RTLD_NOLOAD took
  return true;
}

// Before anything else in the process: a plain dlopen/dlclose pair, as any host program
// might do, must not unmap the plugin (-z nodelete in its own dynamic section) nor the
// runtime it pulled in.
TEST(CudaUnload, PluginAndRuntimeStayAfterAPlainDlclose) {
  ASSERT_FALSE(mapped(kPluginPath)) << "run this test in a process of its own";
  ASSERT_FALSE(mapped(kCudart)) << "this binary must not link the CUDA runtime";
  void* h = dlopen(kPluginPath, RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(h, nullptr) << dlerror();
  EXPECT_TRUE(mapped(kCudart));
  ASSERT_EQ(dlclose(h), 0);
  EXPECT_TRUE(mapped(kPluginPath)) << "the plugin was unmapped by dlclose";
  EXPECT_TRUE(mapped(kCudart)) << "the CUDA runtime went with the plugin";
}

// Finalizing the last Worker leaves the runtime loaded, and the next Worker works.
TEST(CudaUnload, RuntimeStaysLoadedAfterTheLastWorkerFinalizes) {
  for (int round = 0; round < 2; ++round) {
    pinstage::Worker worker;
    pinstage::WorkerOptions options;
    options.plugin_path = kPluginPath;
    worker.init("cuda", 0, options);
    auto dev = worker.alloc_device(4096);
    dev.reset();
    worker.finalize();
    EXPECT_TRUE(mapped(kPluginPath)) << "round " << round;
    EXPECT_TRUE(mapped(kCudart)) << "round " << round;
  }
}

}  // namespace
