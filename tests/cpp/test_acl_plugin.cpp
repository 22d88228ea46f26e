// The acl backend over the libascendcl double (PINSTAGE_ACL_LIBRARY, set by ctest):
//  - DoubleRules.*: each rule of the double broken on purpose, straight through the ACL
//    functions, is answered with its error code and recorded as a violation.
//  - AclPlugin.*: the plugin through pinstage::Worker keeps every rule (no violation),
//    makes its context current on every thread, tears down in order even when a step
//    fails, pins the runtime's memory whole (aclrtHostRegister) where it lies and as it was
//    placed (the checks of host_source_checks.h, shared with cuda), falls back to
//    aclrtMallocHost where the runtime refuses, and names the failing call in its errors.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <initializer_list>
#include <string>
#include <thread>
#include <vector>

#include "extension_test_util.h"
#include "fake_acl_client.h"
#include "host_source_checks.h"
#include "pinstage/backend/acl_ext.h"
#include "pinstage/worker.h"
#include "tensor_test_util.h"

namespace pinstage {
namespace {

using namespace pinstage::acl;  // NOLINT: ACL names
using test::error_of;
using test::fake_acl;
using test::pattern;

bool has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// The double's defaults, and a clean record, for every test.
void reset_double() {
  fake_acl().reset();
  fake_acl().configure(2, uint64_t{1} << 30, 0, 1);
  fake_acl().trace_on(0);
}

// ---- the double's rules, broken on purpose ----

class DoubleRules : public ::testing::Test {
 protected:
  void SetUp() override {
    reset_double();
    ASSERT_EQ(rt.aclInit(nullptr), ACL_SUCCESS);
    ASSERT_EQ(rt.aclrtSetDevice(0), ACL_SUCCESS);
    ASSERT_EQ(rt.aclrtCreateContext(&ctx, 0), ACL_SUCCESS);
    ASSERT_EQ(rt.aclrtMalloc(&dev, 64, ACL_MEM_MALLOC_HUGE_FIRST), ACL_SUCCESS);
    ASSERT_EQ(rt.aclrtMallocHost(&pinned, 4096), ACL_SUCCESS);
  }
  void TearDown() override {
    rt.aclFinalize();  // releases whatever a test left (a leak there is not this test's)
    fake_acl().reset();
  }
  // dev's 64 bytes into `before` while `s` may still run, into `after` once it is synced.
  void read_around_sync(aclrtStream s, unsigned char* before, unsigned char* after) {
    ASSERT_EQ(rt.aclrtMemcpy(before, 64, dev, 64, ACL_MEMCPY_DEVICE_TO_HOST), ACL_SUCCESS);
    ASSERT_EQ(rt.aclrtSynchronizeStream(s), ACL_SUCCESS);
    ASSERT_EQ(rt.aclrtMemcpy(after, 64, dev, 64, ACL_MEMCPY_DEVICE_TO_HOST), ACL_SUCCESS);
  }
  // A copy from `pageable` the double refuses with `code`, reporting only `kind`.
  void expect_h2d_refused(void* dst, size_t dest_max, size_t count, aclError code,
                          fake_acl_violation kind) {
    EXPECT_EQ(rt.aclrtMemcpy(dst, dest_max, pageable.data(), count, ACL_MEMCPY_HOST_TO_DEVICE),
              code);
    expect_only(kind);
  }
  // Exactly one violation, of `kind`.
  void expect_only(fake_acl_violation kind) {
    EXPECT_EQ(fake_acl().violations(kind), 1u) << fake_acl().all_violations();
    EXPECT_EQ(fake_acl().violations(-1), 1u) << fake_acl().all_violations();
  }
  const Runtime& rt = *fake_acl().rt;
  aclrtContext ctx = nullptr;
  void* dev = nullptr;
  void* pinned = nullptr;
  std::vector<unsigned char> pageable = std::vector<unsigned char>(256, 7);
};

TEST_F(DoubleRules, ACallFromAThreadWithNoContextIsRefused) {
  aclError code = ACL_SUCCESS;
  std::thread([&] {
    code = rt.aclrtMemcpy(dev, 64, pageable.data(), 16, ACL_MEMCPY_HOST_TO_DEVICE);
  }).join();
  EXPECT_EQ(code, ACL_ERROR_RT_CONTEXT_NULL);
  expect_only(FAKE_ACL_NO_CONTEXT);
}

TEST_F(DoubleRules, ACopyOfMoreThanDestMaxIsRefused) {
  expect_h2d_refused(dev, 8, 16, ACL_ERROR_INVALID_PARAM, FAKE_ACL_COPY_OVERFLOW);
}

TEST_F(DoubleRules, ACopyLeavingItsAllocationIsRefused) {
  auto* mid = static_cast<char*>(dev) + 32;
  expect_h2d_refused(mid, 64, 64, ACL_ERROR_RT_PARAM_INVALID, FAKE_ACL_COPY_OUTSIDE);
}

TEST_F(DoubleRules, ADestMaxBeyondTheRealRoomIsRefused) {
  expect_h2d_refused(dev, 128, 16, ACL_ERROR_INVALID_PARAM, FAKE_ACL_DESTMAX_OVERSTATED);
}

TEST_F(DoubleRules, AnAsyncCopyFromPageableMemoryIsRefused) {
  aclrtStream s = nullptr;
  ASSERT_EQ(rt.aclrtCreateStream(&s), ACL_SUCCESS);
  EXPECT_EQ(rt.aclrtMemcpyAsync(dev, 64, pageable.data(), 64, ACL_MEMCPY_HOST_TO_DEVICE, s),
            ACL_ERROR_RT_PARAM_INVALID);
  expect_only(FAKE_ACL_ASYNC_PAGEABLE);
}

TEST_F(DoubleRules, AnUnalignedRegisterIsRefused) {
  void* base = std::aligned_alloc(4096, 8192);
  void* dev_ptr = nullptr;
  EXPECT_EQ(rt.aclrtHostRegister(static_cast<char*>(base) + 64, 4096, 0, &dev_ptr),
            ACL_ERROR_RT_DRV_INTERNAL_ERROR);
  expect_only(FAKE_ACL_REGISTER_UNALIGNED);
  std::free(base);
}

TEST_F(DoubleRules, UnregisteringWhatWasNeverRegisteredIsRefused) {
  EXPECT_EQ(rt.aclrtHostUnregister(pageable.data()), ACL_ERROR_RT_PARAM_INVALID);
  expect_only(FAKE_ACL_UNREGISTER_UNKNOWN);
}

TEST_F(DoubleRules, RegisteringTwiceIsRefused) {
  void* base = std::aligned_alloc(4096, 8192);
  void* dev_ptr = nullptr;
  ASSERT_EQ(rt.aclrtHostRegister(base, 8192, 0, &dev_ptr), ACL_SUCCESS);
  EXPECT_EQ(rt.aclrtHostRegister(base, 4096, 0, &dev_ptr), ACL_ERROR_RT_PARAM_INVALID);
  expect_only(FAKE_ACL_REGISTER_OVERLAP);
  EXPECT_EQ(rt.aclrtHostUnregister(base), ACL_SUCCESS);
  std::free(base);
}

TEST_F(DoubleRules, FreeingAnUnknownPointerIsRefused) {
  EXPECT_EQ(rt.aclrtFree(pageable.data()), ACL_ERROR_RT_MEMORY_FREE);
  expect_only(FAKE_ACL_FREE_UNKNOWN);
  EXPECT_EQ(rt.aclrtFree(static_cast<char*>(dev) + 1), ACL_ERROR_RT_MEMORY_FREE);  // not a start
  EXPECT_EQ(fake_acl().violations(FAKE_ACL_FREE_UNKNOWN), 2u);
}

TEST_F(DoubleRules, FreeHostOfMemoryMallocHostDidNotGiveIsRefused) {
  EXPECT_EQ(rt.aclrtFreeHost(dev), ACL_ERROR_RT_MEMORY_FREE);  // device memory
  expect_only(FAKE_ACL_FREEHOST_NOT_MALLOCHOST);
}

TEST_F(DoubleRules, ResettingADeviceWithLivePinnedMemoryIsRefused) {
  ASSERT_EQ(rt.aclrtFree(dev), ACL_SUCCESS);
  ASSERT_EQ(rt.aclrtDestroyContext(ctx), ACL_SUCCESS);
  // The pinned block is still alive: "the card would hang".
  EXPECT_EQ(rt.aclrtResetDevice(0), ACL_ERROR_RT_DRV_INTERNAL_ERROR);
  expect_only(FAKE_ACL_RESET_WITH_LIVE);
  EXPECT_TRUE(has(fake_acl().all_violations(), "1 aclrtMallocHost")) << fake_acl().all_violations();
  // Freed first, the reset goes through.
  ASSERT_EQ(rt.aclrtSetDevice(0), ACL_SUCCESS);  // the default context, to free from
  ASSERT_EQ(rt.aclrtFreeHost(pinned), ACL_SUCCESS);
  EXPECT_EQ(rt.aclrtResetDevice(0), ACL_SUCCESS);
  EXPECT_EQ(rt.aclrtResetDevice(0), ACL_SUCCESS);
  EXPECT_EQ(fake_acl().live(0).device_refs, 0u);
}

TEST_F(DoubleRules, FinalizingWithLiveObjectsIsALeak) {
  EXPECT_EQ(rt.aclFinalize(), ACL_ERROR_INTERNAL_ERROR);
  expect_only(FAKE_ACL_LEAK_AT_FINALIZE);
  EXPECT_TRUE(has(fake_acl().all_violations(), "1 aclrtMallocHost, 0 registered, 1 aclrtMalloc"))
      << fake_acl().all_violations();
  uint32_t count = 0;
  EXPECT_EQ(rt.aclrtGetDeviceCount(&count), ACL_ERROR_UNINITIALIZE);  // and it is final
  EXPECT_EQ(fake_acl().violations(FAKE_ACL_UNINITIALIZED), 1u);
}

TEST_F(DoubleRules, ReleasingMemoryAQueuedCopyUsesIsRefused) {
  aclrtStream s = nullptr;
  ASSERT_EQ(rt.aclrtCreateStream(&s), ACL_SUCCESS);
  ASSERT_EQ(rt.aclrtMemcpyAsync(dev, 64, pinned, 64, ACL_MEMCPY_HOST_TO_DEVICE, s), ACL_SUCCESS);
  EXPECT_EQ(rt.aclrtFreeHost(pinned), ACL_ERROR_RT_MEMORY_FREE);
  expect_only(FAKE_ACL_FREE_IN_USE);
}

TEST_F(DoubleRules, AsyncCopiesLandOnlyAtASynchronize) {
  aclrtStream s = nullptr;
  ASSERT_EQ(rt.aclrtCreateStream(&s), ACL_SUCCESS);
  std::memset(pinned, 0x33, 64);
  ASSERT_EQ(rt.aclrtMemcpy(dev, 64, pinned, 64, ACL_MEMCPY_HOST_TO_DEVICE), ACL_SUCCESS);
  std::memset(pinned, 0x44, 64);
  ASSERT_EQ(rt.aclrtMemcpyAsync(dev, 64, pinned, 64, ACL_MEMCPY_HOST_TO_DEVICE, s), ACL_SUCCESS);
  unsigned char before[64], back[64];
  ASSERT_NO_FATAL_FAILURE(read_around_sync(s, before, back));
  EXPECT_EQ(before[0], 0x33);  // not yet
  EXPECT_EQ(back[0], 0x44);
  EXPECT_EQ(fake_acl().violations(-1), 0u) << fake_acl().all_violations();
}

TEST_F(DoubleRules, DeviceMemoryUsedFromAnotherDevicesContextIsRefused) {
  ASSERT_EQ(rt.aclrtSetDevice(1), ACL_SUCCESS);  // device 1's default context is current
  expect_h2d_refused(dev, 64, 64, ACL_ERROR_RT_PARAM_INVALID, FAKE_ACL_WRONG_DEVICE);
}

TEST_F(DoubleRules, AnOverlappingDeviceToDeviceCopyIsRefused) {
  aclrtStream s = nullptr;
  ASSERT_EQ(rt.aclrtCreateStream(&s), ACL_SUCCESS);
  auto* d = static_cast<char*>(dev);
  EXPECT_EQ(rt.aclrtMemcpyAsync(d + 8, 56, d, 16, ACL_MEMCPY_DEVICE_TO_DEVICE, s),
            ACL_ERROR_INVALID_PARAM);
  expect_only(FAKE_ACL_COPY_OVERLAP);
  EXPECT_EQ(rt.aclrtMemcpy(d + 16, 48, d, 16, ACL_MEMCPY_DEVICE_TO_DEVICE), ACL_SUCCESS);
  EXPECT_EQ(fake_acl().violations(-1), 1u) << fake_acl().all_violations();  // adjacent: fine
}

TEST_F(DoubleRules, DeviceMemoryAsTheHostSideIsTheWrongKind) {
  EXPECT_EQ(rt.aclrtMemcpy(pageable.data(), 64, dev, 16, ACL_MEMCPY_HOST_TO_HOST),
            ACL_ERROR_INVALID_PARAM);
  expect_only(FAKE_ACL_HOST_SIDE_ON_DEVICE);
}

TEST_F(DoubleRules, AMemsetLeavingItsAllocationOrPastMaxCountIsRefused) {
  aclrtStream s = nullptr;
  ASSERT_EQ(rt.aclrtCreateStream(&s), ACL_SUCCESS);
  ASSERT_NE(rt.aclrtMemsetAsync, nullptr);
  auto* mid = static_cast<char*>(dev) + 32;
  EXPECT_EQ(rt.aclrtMemsetAsync(mid, 64, 0, 64, s), ACL_ERROR_RT_PARAM_INVALID);
  expect_only(FAKE_ACL_COPY_OUTSIDE);
  fake_acl().reset();
  EXPECT_EQ(rt.aclrtMemsetAsync(dev, 8, 0, 16, s), ACL_ERROR_INVALID_PARAM);
  expect_only(FAKE_ACL_COPY_OVERFLOW);
  fake_acl().reset();
  EXPECT_EQ(rt.aclrtMemsetAsync(pinned, 64, 0, 64, s), ACL_ERROR_RT_PARAM_INVALID);
  expect_only(FAKE_ACL_COPY_OUTSIDE);  // host memory is not device memory
}

TEST_F(DoubleRules, MemsetsLandOnlyAtASynchronizeInStreamOrder) {
  aclrtStream s = nullptr;
  ASSERT_EQ(rt.aclrtCreateStream(&s), ACL_SUCCESS);
  ASSERT_EQ(rt.aclrtMemcpy(dev, 64, pageable.data(), 64, ACL_MEMCPY_HOST_TO_DEVICE), ACL_SUCCESS);
  auto* d = static_cast<char*>(dev);
  ASSERT_EQ(rt.aclrtMemsetAsync(d, 64, 0x1ab, 32, s), ACL_SUCCESS);  // the low byte counts
  ASSERT_EQ(rt.aclrtMemcpyAsync(d + 32, 32, d, 16, ACL_MEMCPY_DEVICE_TO_DEVICE, s), ACL_SUCCESS);
  unsigned char before[64], back[64];
  ASSERT_NO_FATAL_FAILURE(read_around_sync(s, before, back));
  EXPECT_EQ(before[0], 7);  // not yet
  EXPECT_EQ(back[31], 0xab);
  EXPECT_EQ(back[47], 0xab);  // copied after the memset
  EXPECT_EQ(back[48], 7);
  EXPECT_EQ(fake_acl().violations(-1), 0u) << fake_acl().all_violations();
}

TEST_F(DoubleRules, InjectedFailuresHitTheNthCallOnceAndMemlockIsLimited) {
  fake_acl().fail_nth("aclrtMalloc", 2, ACL_ERROR_RT_MEMORY_ALLOCATION);
  void* a = nullptr;
  EXPECT_EQ(rt.aclrtMalloc(&a, 16, ACL_MEM_MALLOC_HUGE_FIRST), ACL_SUCCESS);
  EXPECT_EQ(rt.aclrtMalloc(&a, 16, ACL_MEM_MALLOC_HUGE_FIRST), ACL_ERROR_RT_MEMORY_ALLOCATION);
  EXPECT_EQ(rt.aclrtMalloc(&a, 16, ACL_MEM_MALLOC_HUGE_FIRST), ACL_SUCCESS);
  fake_acl().configure(2, uint64_t{1} << 30, 8192, 1);  // 4096 already locked
  void* p = nullptr;
  EXPECT_EQ(rt.aclrtMallocHost(&p, 8192), ACL_ERROR_RT_MEMORY_ALLOCATION);
  EXPECT_EQ(rt.aclrtMallocHost(&p, 4096), ACL_SUCCESS);
  EXPECT_EQ(fake_acl().violations(-1), 0u);  // limits and injections are errors, not rule breaks
}

// ---- the plugin over the double ----

class AclPlugin : public ::testing::Test {
 protected:
  void SetUp() override { reset_double(); }
  void TearDown() override {
    EXPECT_EQ(fake_acl().violations(-1), 0u) << fake_acl().all_violations();
    const fake_acl_live left = fake_acl().live();
    EXPECT_EQ(left.host_allocs + left.registrations + left.device_allocs + left.streams +
                  left.events + left.contexts + left.device_refs,
              0u);
  }
  // Tests of what the plugin is asked to pin: the worker's pool caches nothing, so each
  // request is exactly one segment, pinned once and released at its free.
  static WorkerOptions exact_segments() {
    WorkerOptions o;
    o.host_cache_limit_bytes = 0;
    return o;
  }
  static ps_acl_pin_stats pin_stats(const Worker& w) {
    return test::extension_stats<ps_acl_pin_stats>(w, PS_ACL_PIN_STATS_NAME);
  }
};

TEST_F(AclPlugin, EveryThreadOfACopyPoolGetsTheContext) {
  Worker worker;
  worker.init("acl");
  constexpr size_t kSlice = 64 << 10;
  constexpr int kThreads = 8;
  DeviceBuffer dev = worker.alloc_device(kSlice * kThreads);
  PinnedHostBuffer staging = worker.alloc_pinned_host(kSlice * kThreads);
  const uint64_t sets_before = fake_acl().calls("aclrtSetCurrentContext");
  std::vector<int> ok(kThreads, 0);
  std::vector<std::thread> pool;
  for (int t = 0; t < kThreads; ++t)
    pool.emplace_back([&, t] {
      const auto src = pattern(kSlice, static_cast<unsigned>(t + 1));
      auto* mine = static_cast<unsigned char*>(staging.data()) + t * kSlice;
      std::memcpy(mine, src.data(), kSlice);
      Stream stream = worker.create_stream();
      worker.copy_to_device_async(dev, t * kSlice, mine, kSlice, stream);  // pinned: async
      worker.synchronize(stream);
      std::vector<unsigned char> back(kSlice);
      worker.copy_to_host(back.data(), dev, t * kSlice, kSlice);  // pageable: sync
      ok[t] = back == src;
    });
  for (auto& th : pool) th.join();
  EXPECT_EQ(std::count(ok.begin(), ok.end(), 1), kThreads);  // the bytes arrived
  EXPECT_GE(fake_acl().calls("aclrtSetCurrentContext") - sets_before, 4u * kThreads);
  EXPECT_EQ(fake_acl().calls("aclrtMemcpyAsync"), static_cast<uint64_t>(kThreads));
}

// The releases and resets of a teardown, in the order they ran.
const std::vector<std::string> kTeardownCalls = {"aclrtSynchronizeStream",
                                                 "aclrtDestroyStream",
                                                 "aclrtDestroyEvent",
                                                 "aclrtFree",
                                                 "aclrtHostUnregister",
                                                 "aclrtFreeHost",
                                                 "aclrtDestroyContext",
                                                 "aclrtResetDevice",
                                                 "aclFinalize"};

// A worker holding one of everything, with a copy still queued: a device buffer, a stream,
// an event, and pinned memory from both sources, the runtime's own registered
// (aclrtHostRegister) and, once the double refuses registration, the vendor's
// aclrtMallocHost. The pool caches nothing: each request is one segment.
struct Holdings {
  PinnedHostBuffer registered, malloc_host;
  DeviceBuffer dev;
  Stream stream;
  Event event;
};

void hold_everything(Worker& w, Holdings& h) {
  h.dev = w.alloc_device(1 << 20);
  h.registered = w.alloc_pinned_host(1 << 20);
  fake_acl().configure(2, uint64_t{1} << 30, 0, 0);  // aclrtHostRegister: FEATURE_NOT_SUPPORT
  h.malloc_host = w.alloc_pinned_host(4096);
  ASSERT_EQ(w.host_placement().pool_source, "vendor");
  ASSERT_EQ(fake_acl().pinned(h.registered.data(), 1 << 20), FAKE_ACL_PINNED_REGISTERED);
  ASSERT_EQ(fake_acl().pinned(h.malloc_host.data(), 4096), FAKE_ACL_PINNED_MALLOC_HOST);
  h.stream = w.create_stream();
  h.event = w.create_event();
  w.copy_to_device_async(h.dev, 0, h.registered.data(), 1 << 20, h.stream);
  w.record(h.event, h.stream);
}

TEST_F(AclPlugin, TeardownRunsInOrderOnTheHealthyPath) {
  Worker worker;
  worker.init("acl", 0, exact_segments());
  Holdings h;
  ASSERT_NO_FATAL_FAILURE(hold_everything(worker, h));
  fake_acl().trace_on(1);
  worker.finalize();
  std::vector<std::string> calls = fake_acl().trace(kTeardownCalls);
  ASSERT_EQ(calls.size(), 9u) << testing::PrintToString(calls);
  // The two pinned ranges go in the runtime's table order; both after device memory.
  std::sort(calls.begin() + 4, calls.begin() + 6);
  EXPECT_EQ(calls, (std::vector<std::string>{
                       "aclrtSynchronizeStream=0", "aclrtDestroyStream=0", "aclrtDestroyEvent=0",
                       "aclrtFree=0", "aclrtFreeHost=0", "aclrtHostUnregister=0",
                       "aclrtDestroyContext=0", "aclrtResetDevice=0", "aclFinalize=0"}));
}

class AclTeardownFailure : public AclPlugin, public ::testing::WithParamInterface<const char*> {};

// One teardown call fails once: it is reported, retried before the reset, and the rest
// still runs, so nothing outlives the device (no violation, nothing alive afterwards:
// AclPlugin::TearDown checks both).
TEST_P(AclTeardownFailure, IsReportedAndEverythingIsStillReleasedBeforeTheReset) {
  const std::string failing = GetParam();
  Worker worker;
  worker.init("acl", 0, exact_segments());
  Holdings h;
  ASSERT_NO_FATAL_FAILURE(hold_everything(worker, h));
  fake_acl().fail_nth(failing.c_str(), 1, ACL_ERROR_INTERNAL_ERROR);
  fake_acl().trace_on(1);
  testing::internal::CaptureStderr();
  worker.finalize();
  const std::string log = testing::internal::GetCapturedStderr();
  EXPECT_TRUE(has(log, failing + " ") || has(log, failing + "(")) << log;
  EXPECT_TRUE(has(log, "500000 ACL_ERROR_INTERNAL_ERROR (fake ascendcl: " + failing)) << log;
  const auto calls = fake_acl().trace(kTeardownCalls);
  const auto failed = std::find(calls.begin(), calls.end(), failing + "=500000");
  ASSERT_NE(failed, calls.end()) << testing::PrintToString(calls);
  // Retried (a failed sync still destroys the stream), after the failure.
  const std::string redone =
      failing == "aclrtSynchronizeStream" ? "aclrtDestroyStream=0" : failing + "=0";
  EXPECT_NE(std::find(failed, calls.end(), redone), calls.end()) << testing::PrintToString(calls);
  // Pinned memory is gone before the device is reset.
  const auto reset = std::find(calls.begin(), calls.end(), "aclrtResetDevice=0");
  ASSERT_NE(reset, calls.end()) << testing::PrintToString(calls);
  for (const char* release : {"aclrtFreeHost=0", "aclrtHostUnregister=0", "aclrtFree=0",
                              "aclrtDestroyStream=0", "aclrtDestroyEvent=0"})
    EXPECT_LT(std::find(calls.begin(), calls.end(), release) - calls.begin(), reset - calls.begin())
        << release << " after the reset: " << testing::PrintToString(calls);
}

INSTANTIATE_TEST_SUITE_P(EachStep, AclTeardownFailure,
                         ::testing::Values("aclrtSynchronizeStream", "aclrtDestroyStream",
                                           "aclrtDestroyEvent", "aclrtFree", "aclrtHostUnregister",
                                           "aclrtFreeHost", "aclrtDestroyContext",
                                           "aclrtResetDevice"));

// ---- host sources (issue 46): the checks shared with cuda (host_source_checks.h) ----

// What the double holds pinned, from its own tables; "not supported" is its configuration
// without aclrtHostRegister (ACL_ERROR_RT_FEATURE_NOT_SUPPORT), until the next SetUp.
test::PinView acl_view() {
  test::PinView v;
  v.backend = "acl";
  v.pinned = [](const void* p, size_t n) {
    return fake_acl().pinned(p, n) != FAKE_ACL_PINNED_NONE;
  };
  v.registrations = [] { return static_cast<size_t>(fake_acl().live(0).registrations); };
  v.vendor_allocations = [] { return static_cast<size_t>(fake_acl().live(0).host_allocs); };
  v.refuse_registration = [] { fake_acl().configure(2, uint64_t{1} << 30, 0, 0); };
  return v;
}

TEST_F(AclPlugin, TheAnonymousSourceIsRegisteredAndRoundTrips) {
  test::check_anonymous_source(acl_view());
}

// The runtime's memory is refused (ACL_ERROR_RT_FEATURE_NOT_SUPPORT): the pool takes the
// vendor source, aclrtMallocHost, from then on, asking the runtime once.
TEST_F(AclPlugin, TheVendorSourceIsAclrtMallocHostWhereRegisterIsNotSupported) {
  test::check_vendor_source(acl_view(), [](const Worker& worker) {
    const ps_acl_pin_stats s = pin_stats(worker);
    EXPECT_EQ(s.unsupported_count, 1u);
    EXPECT_EQ(s.malloc_host_count, 2u);
    EXPECT_EQ(s.malloc_host_bytes, (1u << 20) + 4096);
    EXPECT_EQ(s.register_count, 0u);
    EXPECT_EQ(s.last_mode, PS_ACL_PIN_MALLOC_HOST);
  });
  EXPECT_EQ(fake_acl().calls("aclrtHostRegister"), 1u) << "the refusal was not remembered";
}

// A file mapping registered in place, whole (a copy must lie in one registration, and
// tensors cross any chunk boundary, so register_chunk_mb does not split it).
TEST_F(AclPlugin, TheFileSharedSourceIsRegisteredInPlaceWhole) {
  test::PinView v = acl_view();
  v.config = {{"register_chunk_mb", "1"}};
  test::check_file_shared_source(v);
}

TEST_F(AclPlugin, NumaPlacementIsReadBackFromTheKernel) { test::check_numa_placement(acl_view()); }

TEST_F(AclPlugin, HugePagesFollowTheOneSwitch) { test::check_huge_page_switch(acl_view()); }

// A runtime that answers ACL_ERROR_RT_FEATURE_NOT_SUPPORT for the page cache refuses a
// private copy of it too: the mapping is unpinned and says why (the loader copies), and
// the private copy it tried is gone again.
TEST_F(AclPlugin, AFileMappingTheRuntimeWillNotRegisterIsRefusedByName) {
  const test::PatternFile file((2 << 20) + 300, 4);
  Worker worker;
  worker.init("acl", 0, exact_segments());
  fake_acl().configure(2, uint64_t{1} << 30, 0, 0);  // aclrtHostRegister: FEATURE_NOT_SUPPORT
  {
    const std::shared_ptr<PinnedFileMapping> m =
        worker.map_file_pinned(file.path, file.bytes.size());
    EXPECT_FALSE(m->pinned());
    EXPECT_NE(m->refusal().find("aclrtHostRegister"), std::string::npos) << m->refusal();
    EXPECT_FALSE(worker.is_pinned_host(m->data(), 1));
    EXPECT_EQ(std::memcmp(m->data(), file.bytes.data(), file.bytes.size()), 0);
    EXPECT_EQ(fake_acl().calls("aclrtHostRegister"), 2u) << "read-only, then a private copy";
    EXPECT_EQ(pin_stats(worker).unsupported_count, 2u);
  }
  EXPECT_EQ(fake_acl().live(0).registrations, 0u);
  worker.finalize();
}

// aclrtHostRegister takes a range whole, never in chunks: the pool's segment is one
// registration of its whole pages, counted in the plugin's statistics.
TEST_F(AclPlugin, HostRegisterRegistersARangeWholeAndCountsIt) {
  WorkerOptions options = exact_segments();
  options.config = {{"register_chunk_mb", "1"}};
  Worker worker;
  worker.init("acl", 0, options);
  const size_t bytes = (3 << 20) + 5;
  PinnedHostBuffer a = worker.alloc_pinned_host(bytes);
  EXPECT_EQ(fake_acl().live(0).registrations, 1u);
  EXPECT_EQ(fake_acl().pinned(a.data(), bytes), FAKE_ACL_PINNED_REGISTERED);
  const ps_acl_pin_stats s = pin_stats(worker);
  EXPECT_EQ(s.register_count, 1u);
  EXPECT_EQ(s.register_bytes, (3u << 20) + 4096);  // whole pages
  EXPECT_EQ(s.malloc_host_count, 0u);
  EXPECT_EQ(s.last_mode, PS_ACL_PIN_REGISTER);
  a.reset();
  EXPECT_EQ(fake_acl().live(0).registrations, 0u);
}

// The failing call, its code and the runtime's own message, for both sources; the vendor's
// says what to raise.
TEST_F(AclPlugin, ErrorsNameTheCallTheCodeAndTheRuntimesMessage) {
  Worker worker;
  worker.init("acl", 0, exact_segments());
  // `call` fails with out_of_memory, its message holding each of `parts`.
  const auto out_of_memory = [](auto&& call, std::initializer_list<const char*> parts) {
    const Error e = error_of(call);
    EXPECT_EQ(e.code(), ErrorCode::out_of_memory);
    for (const char* part : parts) EXPECT_TRUE(has(e.what(), part)) << e.what();
  };
  fake_acl().fail_nth("aclrtMalloc", 1, ACL_ERROR_RT_MEMORY_ALLOCATION);
  out_of_memory([&] { worker.alloc_device(4096); },
                {"aclrtMalloc(4096 bytes, ACL_MEM_MALLOC_HUGE_FIRST) on device 0 failed: 207001 "
                 "ACL_ERROR_RT_MEMORY_ALLOCATION (fake ascendcl: aclrtMalloc: injected failure)"});
  fake_acl().configure(2, uint64_t{1} << 30, 1 << 20, 1);  // a 1 MiB memlock limit
  out_of_memory([&] { worker.alloc_pinned_host(2 << 20); },
                {"aclrtHostRegister of 2097152 bytes for device 0 failed: 207001 "
                 "ACL_ERROR_RT_MEMORY_ALLOCATION (fake ascendcl: aclrtHostRegister: over the "
                 "memlock limit)"});
  EXPECT_EQ(worker.host_placement().pool_source, "anonymous");  // a failure, not a refusal
  fake_acl().configure(2, uint64_t{1} << 30, 1 << 20, 0);       // and no aclrtHostRegister
  out_of_memory([&] { worker.alloc_pinned_host(2 << 20); },
                {"aclrtMallocHost of 2097152 bytes for device 0", "raise RLIMIT_MEMLOCK"});
  EXPECT_EQ(worker.stats().pinned_count, 0u);
}

// The keys of the old pinned modes are refused as gone, saying where their job went.
TEST_F(AclPlugin, TheGoneKeysAreRefusedAsGone) {
  for (const char* key :
       {"pinned_mode", "register_threshold_mb", "prefault_threads", "register_thp"}) {
    WorkerOptions options;
    options.config = {{key, "1"}};
    Worker worker;
    const Error e = error_of([&] { worker.init("acl", 0, options); });
    EXPECT_EQ(e.code(), ErrorCode::invalid_argument);
    EXPECT_TRUE(has(e.what(), std::string("key '") + key + "' is gone")) << e.what();
    EXPECT_TRUE(has(e.what(), "PINSTAGE_HOST_HUGE_PAGES")) << e.what();
  }
}

TEST_F(AclPlugin, InitOncePerProcessAndFinalizeAfterTheLastWorker) {
  Worker a, b;
  a.init("acl");
  b.init("acl", 1);
  EXPECT_EQ(fake_acl().calls("aclInit"), 1u);
  a.finalize();
  EXPECT_EQ(fake_acl().calls("aclFinalize"), 0u);
  EXPECT_EQ(fake_acl().live().initialized, 1);
  b.finalize();
  EXPECT_EQ(fake_acl().calls("aclFinalize"), 1u);
  EXPECT_EQ(fake_acl().live().initialized, 0);
}

TEST_F(AclPlugin, ARuntimeInitialisedElsewhereIsLeftToFinalizeIt) {
  ASSERT_EQ(fake_acl().rt->aclInit(nullptr), ACL_SUCCESS);  // someone else's (torch_npu's)
  for (int round = 0; round < 2; ++round) {  // the plugin's state stays right across workers
    Worker worker;
    worker.init("acl");  // answered ACL_ERROR_REPEAT_INITIALIZE: ACL is the other runtime's
    EXPECT_NO_THROW(worker.alloc_device(64));
    worker.finalize();
    EXPECT_EQ(fake_acl().calls("aclFinalize"), 0u) << "round " << round;
    EXPECT_EQ(fake_acl().live().initialized, 1);  // still initialised for its owner
  }
  uint32_t devices = 0;  // the other runtime goes on using ACL
  EXPECT_EQ(fake_acl().rt->aclrtGetDeviceCount(&devices), ACL_SUCCESS);
  EXPECT_EQ(fake_acl().rt->aclFinalize(), ACL_SUCCESS);  // and finalizes it itself
  Worker ours;  // ACL initialised by the plugin again: finalized by it after its last worker
  ours.init("acl");
  ours.finalize();
  EXPECT_EQ(fake_acl().calls("aclFinalize"), 2u);
  EXPECT_EQ(fake_acl().live().initialized, 0);
}

TEST_F(AclPlugin, DevicesAreCountedAndABadOneIsRefusedByName) {
  fake_acl().configure(1, uint64_t{1} << 30, 0, 1);
  Worker worker;
  const Error e = error_of([&] { worker.init("acl", 1); });
  EXPECT_EQ(e.code(), ErrorCode::no_device);
  EXPECT_TRUE(has(e.what(), "Ascend device 1 does not exist: 1 device(s) visible")) << e.what();
  EXPECT_EQ(fake_acl().live().initialized, 0);  // undone: aclFinalize after the failed init
  fake_acl().fail_nth("aclrtCreateContext", 1, ACL_ERROR_RT_NO_DEVICE);
  Worker again;
  const Error c = error_of([&] { again.init("acl", 0); });
  EXPECT_TRUE(has(c.what(), "aclrtCreateContext(0) failed: 207004 ACL_ERROR_RT_NO_DEVICE"))
      << c.what();
  EXPECT_EQ(fake_acl().live().device_refs, 0u);  // the device was reset again
}

// ---- devices without a context (ABI v6, Note [Devices without a context]) ----

// A listing initialises the runtime but never finalizes it; each test finalizes the
// double itself so the next one starts uninitialised.
class AclDevices : public AclPlugin {
 protected:
  void TearDown() override {
    if (fake_acl().live().initialized != 0) {
      EXPECT_EQ(fake_acl().rt->aclFinalize(), ACL_SUCCESS) << fake_acl().all_violations();
    }
    AclPlugin::TearDown();
  }
};

TEST_F(AclDevices, ListsEveryDeviceWithItsMemoryAndLeavesNoneOpen) {
  fake_acl().configure(3, uint64_t{1} << 30, 0, 1);
  fake_acl().set_device(1, uint64_t{64} << 30, 0);
  fake_acl().trace_on(1);
  const std::vector<DeviceInfo> devices = list_devices("acl");
  ASSERT_EQ(devices.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    const DeviceInfo& d = devices[static_cast<size_t>(i)];
    EXPECT_EQ(d.id, i);
    EXPECT_EQ(d.name, "Ascend device " + std::to_string(i));
    EXPECT_EQ(d.pci_bus_id, "");  // the facts map no device id to a PCI address
    EXPECT_EQ(d.numa_node, -1);
    EXPECT_TRUE(d.usable) << d.reason;
    EXPECT_EQ(d.reason, "");
  }
  EXPECT_EQ(devices[0].memory_bytes, uint64_t{1} << 30);
  EXPECT_EQ(devices[1].memory_bytes, uint64_t{64} << 30);  // each device's own
  EXPECT_EQ(devices[2].memory_bytes, uint64_t{1} << 30);
  // Each device opened for its call only, and closed again.
  const std::vector<std::string> opened =
      fake_acl().trace({"aclrtSetDevice", "aclrtGetMemInfo", "aclrtResetDevice"});
  ASSERT_EQ(opened.size(), 9u);
  for (size_t i = 0; i < opened.size(); ++i)
    EXPECT_EQ(opened[i], std::vector<std::string>({"aclrtSetDevice=0", "aclrtGetMemInfo=0",
                                                   "aclrtResetDevice=0"})[i % 3]);
  EXPECT_EQ(fake_acl().live().device_refs, 0u);
  EXPECT_EQ(fake_acl().calls("aclFinalize"), 0u);  // never by a listing
  EXPECT_EQ(fake_acl().live().initialized, 1);
  // A worker after it starts on the initialised runtime and finalizes it at its end.
  {
    Worker worker;
    worker.init("acl", 1);
    EXPECT_EQ(worker.device_info().memory_bytes, uint64_t{64} << 30);
  }
  EXPECT_EQ(fake_acl().calls("aclFinalize"), 1u);
  EXPECT_EQ(fake_acl().live().initialized, 0);
}

TEST_F(AclDevices, ADeviceThatWillNotOpenIsListedNotUsableWithTheReason) {
  fake_acl().set_device(1, 0, ACL_ERROR_RT_NO_DEVICE);
  const std::vector<DeviceInfo> devices = list_devices("acl");
  ASSERT_EQ(devices.size(), 2u);
  EXPECT_TRUE(devices[0].usable) << devices[0].reason;
  const DeviceInfo& bad = devices[1];
  EXPECT_FALSE(bad.usable);
  EXPECT_TRUE(has(bad.reason, "aclrtSetDevice(1) failed: 207004 ACL_ERROR_RT_NO_DEVICE"))
      << bad.reason;
  EXPECT_TRUE(has(bad.reason, "will not open")) << bad.reason;  // the runtime's message
  EXPECT_EQ(bad.name, "Ascend device 1");
  EXPECT_EQ(bad.memory_bytes, 0u);
  EXPECT_EQ(fake_acl().live().device_refs, 0u);
  // A memory query that fails makes the device not usable too, and it is closed again.
  fake_acl().set_device(1, 0, 0);
  fake_acl().fail_nth("aclrtGetMemInfo", 2, ACL_ERROR_RT_DRV_INTERNAL_ERROR);
  const std::vector<DeviceInfo> again = list_devices("acl");
  EXPECT_TRUE(again[0].usable);
  EXPECT_FALSE(again[1].usable);
  EXPECT_TRUE(has(again[1].reason, "aclrtGetMemInfo(ACL_HBM_MEM) on device 1 failed"))
      << again[1].reason;
  EXPECT_EQ(fake_acl().live().device_refs, 0u);
}

TEST_F(AclDevices, ListingWhileAWorkerRunsKeepsItsDeviceAndContext) {
  Worker worker;
  worker.init("acl", 0);
  DeviceBuffer dev = worker.alloc_device(64);
  const std::vector<DeviceInfo> devices = list_devices("acl");
  ASSERT_EQ(devices.size(), 2u);
  EXPECT_TRUE(devices[0].usable) << devices[0].reason;
  EXPECT_EQ(fake_acl().live(0).device_refs, 1u);  // the worker's, still open
  const std::vector<unsigned char> data(64, 3);
  EXPECT_NO_THROW(worker.copy_to_device(dev, 0, data.data(), data.size()));
  dev.reset();
  worker.finalize();
  EXPECT_EQ(fake_acl().calls("aclFinalize"), 1u);
}

TEST_F(AclDevices, ListingChecksTheConfigAndTheRuntimeLikeCreateContext) {
  WorkerOptions typo;
  typo.config = {{"pinned_mod", "alloc"}};
  const Error e = error_of([&] { list_devices("acl", typo); });
  EXPECT_EQ(e.code(), ErrorCode::invalid_argument);
  EXPECT_TRUE(has(e.what(), "unknown key 'pinned_mod'")) << e.what();
  EXPECT_EQ(fake_acl().calls("aclInit"), 0u);  // refused before the runtime is touched
  fake_acl().fail_nth("aclrtGetDeviceCount", 1, ACL_ERROR_RT_NO_DEVICE);
  const Error c = error_of([] { list_devices("acl"); });
  EXPECT_EQ(c.code(), ErrorCode::no_device);
  EXPECT_TRUE(has(c.what(), "aclrtGetDeviceCount failed: 207004")) << c.what();
  fake_acl().configure(0, uint64_t{1} << 30, 0, 1);
  EXPECT_TRUE(list_devices("acl").empty());  // the runtime sees none: 0, as the ABI says
}

TEST_F(AclPlugin, PageableAsyncCopiesTakeTheSynchronousPathInOrder) {
  Worker worker;
  worker.init("acl");
  DeviceBuffer dev = worker.alloc_device(4096);
  PinnedHostBuffer pinned = worker.alloc_pinned_host(4096);
  std::memset(pinned.data(), 1, 4096);
  const auto src = pattern(4096, 3);
  Stream stream = worker.create_stream();
  worker.copy_to_device_async(dev, 0, pinned.data(), 4096, stream);  // queued
  worker.copy_to_device_async(dev, 0, src.data(), 4096, stream);     // pageable: after it
  std::vector<unsigned char> back(4096);
  worker.copy_to_host(back.data(), dev, 0, 4096);
  EXPECT_EQ(back, src);  // the pageable copy landed last, as queued
  EXPECT_EQ(fake_acl().calls("aclrtMemcpyAsync"), 1u);
}

// ABI v5 through the Worker: the async forms queue aclrtMemcpyAsync(DEVICE_TO_DEVICE) and
// aclrtMemsetAsync on the stream; the synchronous ones take aclrtMemcpy and a stream of
// their own for the memset. destMax/maxCount is the count, never more than the room.
TEST_F(AclPlugin, DeviceCopiesAndFillsUseTheRuntimesDeviceCalls) {
  Worker worker;
  worker.init("acl");
  DeviceBuffer a = worker.alloc_device(4096), b = worker.alloc_device(4096);
  auto want_a = pattern(4096, 5);
  std::vector<unsigned char> want_b(4096, 0x77);
  worker.copy_to_device(a, 0, want_a.data(), 4096);
  worker.copy_to_device(b, 0, want_b.data(), 4096);
  Stream stream = worker.create_stream();
  fake_acl().trace_on(1);
  worker.copy_on_device_async(b, 10, a, 20, 1000, stream);
  std::copy_n(want_a.begin() + 20, 1000, want_b.begin() + 10);
  worker.fill_device_async(b, 500, 0xcd, 100, stream);
  std::fill_n(want_b.begin() + 500, 100, 0xcd);
  worker.synchronize(stream);
  worker.copy_on_device(a, 3000, a, 0, 1000);
  std::copy_n(want_a.begin(), 1000, want_a.begin() + 3000);
  worker.fill_device(a, 4095, 0, 1);
  want_a[4095] = 0;
  EXPECT_EQ(fake_acl().trace({"aclrtMemcpyAsync", "aclrtMemsetAsync", "aclrtMemcpy",
                              "aclrtCreateStream", "aclrtSynchronizeStream", "aclrtDestroyStream"}),
            (std::vector<std::string>{"aclrtMemcpyAsync=0", "aclrtMemsetAsync=0",
                                      "aclrtSynchronizeStream=0", "aclrtMemcpy=0",
                                      "aclrtCreateStream=0", "aclrtMemsetAsync=0",
                                      "aclrtSynchronizeStream=0", "aclrtDestroyStream=0"}));
  std::vector<unsigned char> back(4096);
  worker.copy_to_host(back.data(), a, 0, 4096);
  EXPECT_EQ(back, want_a);
  worker.copy_to_host(back.data(), b, 0, 4096);
  EXPECT_EQ(back, want_b);
  EXPECT_EQ(fake_acl().live().streams, 1u);  // the fill's own stream is gone
}

TEST_F(AclPlugin, AFailedDeviceFillNamesTheCallAndLeavesNoStream) {
  Worker worker;
  worker.init("acl");
  DeviceBuffer a = worker.alloc_device(4096);
  fake_acl().fail_nth("aclrtMemsetAsync", 1, ACL_ERROR_RT_PARAM_INVALID);
  const Error e = error_of([&] { worker.fill_device(a, 0, 1, 4096); });
  EXPECT_TRUE(has(e.what(), "aclrtMemsetAsync (device fill of 4096 bytes on device 0)"))
      << e.what();
  EXPECT_EQ(fake_acl().live().streams, 0u);
  worker.fill_device(a, 0, 1, 4096);  // only the nth failed
}

}  // namespace
}  // namespace pinstage
