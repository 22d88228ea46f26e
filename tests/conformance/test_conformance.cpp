// The backend ABI contract, run against every backend (ctest -L conformance). Built once
// per backend with PINSTAGE_CONFORMANCE_BACKEND naming it; ctest prefixes each test with
// "conformance.<backend>.". sim is the reference; cuda runs on the fake libcudart.
// Everything goes through pinstage::Worker, since the runtime's one allocation table is
// part of the contract (backends keep no lists), plus the raw table for argument checks.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "numa_test_util.h"
#include "pinstage/backend/platform_abi.h"
#include "pinstage/worker.h"
#include "tensor_test_util.h"

namespace pinstage {
namespace {

const std::string kBackend = PINSTAGE_CONFORMANCE_BACKEND;

using test::error_of;
using test::pattern;

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

class Conformance : public ::testing::Test {
 protected:
  void SetUp() override {
    WorkerOptions options;
    options.device_capacity_bytes = 64 << 20;
    worker.init(kBackend, 0, options);
  }
  Worker worker;
};

// The raw table, for the slots' own argument checks.
const ps_platform_api& raw_api() {
  static const ps_platform_api* api = [] {
    void* h = dlopen(default_backend_path(kBackend).c_str(), RTLD_NOW | RTLD_NODELETE);
    auto entry =
        h ? reinterpret_cast<ps_platform_entry_fn>(dlsym(h, PINSTAGE_PLATFORM_ENTRY_SYMBOL))
          : nullptr;
    return entry ? entry() : nullptr;
  }();
  if (api == nullptr) throw std::runtime_error("cannot load the " + kBackend + " plugin");
  return *api;
}

TEST_F(Conformance, NameAndVersion) {
  EXPECT_EQ(worker.backend().name, kBackend);
  EXPECT_EQ(worker.backend().api_version, PINSTAGE_PLATFORM_API_VERSION);
}

TEST_F(Conformance, AllocationsAreTrackedAtTheirRequestedSizeAndReleased) {
  PinnedHostBuffer host = worker.alloc_pinned_host(10'000);
  DeviceBuffer dev = worker.alloc_device(3'000);
  ASSERT_TRUE(host && dev);
  std::memset(host.data(), 0x5a, host.size());  // writable to the last byte
  WorkerStats s = worker.stats();
  EXPECT_EQ(s.pinned_bytes, 10'000u);  // exactly as requested, never rounded up
  EXPECT_EQ(s.pinned_count, 1u);
  EXPECT_EQ(s.device_bytes, 3'000u);
  EXPECT_GE(s.device_committed_bytes, 3'000u);
  host.reset();
  dev.reset();
  s = worker.stats();
  EXPECT_EQ(s.pinned_count + s.device_count, 0u);
  EXPECT_EQ(s.device_committed_bytes, 0u);
}

TEST_F(Conformance, ZeroSizesAndCapacityAreRefusedClearly) {
  EXPECT_EQ(error_of([&] { worker.alloc_device(0); }).code(), ErrorCode::invalid_argument);
  EXPECT_EQ(error_of([&] { worker.alloc_pinned_host(0); }).code(), ErrorCode::invalid_argument);
  EXPECT_EQ(worker.stats().device_capacity_bytes, 64u << 20);
  DeviceBuffer most = worker.alloc_device(48 << 20);
  Error e = error_of([&] { worker.alloc_device(32 << 20); });
  EXPECT_EQ(e.code(), ErrorCode::out_of_memory) << e.what();
  most.reset();
  EXPECT_NO_THROW(worker.alloc_device(32 << 20));
  EXPECT_EQ(worker.stats().device_committed_bytes, 0u);
}

TEST_F(Conformance, RoundTripIsBitExactForOddSizesAndOffsets) {
  DeviceBuffer dev = worker.alloc_device(1 << 20);
  PinnedHostBuffer pinned = worker.alloc_pinned_host(1 << 20);
  for (size_t size : {size_t{1}, size_t{4097}, size_t{300'001}}) {
    const auto src = pattern(size, static_cast<unsigned>(size));
    const size_t offset = (1 << 20) - size - 3;
    worker.copy_to_device(dev, offset, src.data(), size);  // pageable source
    std::vector<unsigned char> back(size);
    worker.copy_to_host(back.data(), dev, offset, size);
    ASSERT_EQ(back, src) << size;
    std::memcpy(pinned.data(), src.data(), size);  // pinned source
    worker.copy_to_device(dev, 1, pinned.data(), size);
    worker.copy_to_host(back.data(), dev, 1, size);
    ASSERT_EQ(back, src) << size;
  }
}

TEST_F(Conformance, CopiesOutsideAnAllocationOfThisWorkerAreRefused) {
  DeviceBuffer dev = worker.alloc_device(4096);
  std::vector<unsigned char> host(8192);
  Error e = error_of([&] { worker.copy_to_device(dev, 4000, host.data(), 100); });
  EXPECT_EQ(e.code(), ErrorCode::invalid_argument);
  EXPECT_TRUE(contains(e.what(), "outside the device buffer")) << e.what();
  Worker other;
  other.init(kBackend);
  DeviceBuffer theirs = other.alloc_device(4096);
  e = error_of([&] { worker.copy_to_device(theirs, 0, host.data(), 16); });
  EXPECT_EQ(e.code(), ErrorCode::invalid_argument);
  EXPECT_TRUE(contains(e.what(), "not inside one device allocation of this worker")) << e.what();
  EXPECT_EQ(error_of([&] { worker.copy_to_host(nullptr, dev, 0, 16); }).code(),
            ErrorCode::invalid_argument);
  EXPECT_EQ(error_of([&] { worker.copy_to_device(dev, 0, nullptr, 10); }).code(),
            ErrorCode::invalid_argument);
  EXPECT_EQ(error_of([&] { worker.copy_to_host(host.data(), dev, 4097, 0); }).code(),
            ErrorCode::invalid_argument);  // past the end, even for 0 bytes
  EXPECT_NO_THROW(worker.copy_to_host(host.data(), dev, 4096, 0));  // at the end: a no-op
}

TEST_F(Conformance, AsyncCopiesCompleteInOrderAtEvents) {
  DeviceBuffer dev = worker.alloc_device(1 << 20);
  PinnedHostBuffer up = worker.alloc_pinned_host(1 << 20);
  PinnedHostBuffer down = worker.alloc_pinned_host(1 << 20);
  const auto src = pattern(1 << 20, 7);
  std::memcpy(up.data(), src.data(), src.size());
  Stream stream = worker.create_stream();
  Event done = worker.create_event();
  worker.copy_to_device_async(dev, 0, up.data(), src.size(), stream);
  worker.copy_to_host_async(down.data(), dev, 0, src.size(), stream);
  worker.record(done, stream);
  worker.wait(done);
  EXPECT_EQ(std::memcmp(down.data(), src.data(), src.size()), 0);
  worker.synchronize(stream);
  Worker other;
  other.init(kBackend);
  Stream foreign = other.create_stream();
  EXPECT_EQ(error_of([&] { worker.synchronize(foreign); }).code(), ErrorCode::invalid_argument);
}

// The whole of a device buffer, read back.
std::vector<unsigned char> read_back(Worker& worker, const DeviceBuffer& dev) {
  std::vector<unsigned char> out(dev.size());
  worker.copy_to_host(out.data(), dev, 0, out.size());
  return out;
}

// ABI v5: device-to-device copies (between buffers and within one) and fills change
// exactly their ranges; the bytes just outside each range keep their old values.
TEST_F(Conformance, DeviceCopiesAndFillsChangeExactlyTheirRanges) {
  DeviceBuffer a = worker.alloc_device(4096);
  DeviceBuffer b = worker.alloc_device(4096);
  auto want_a = pattern(4096, 11), want_b = pattern(4096, 12);
  worker.copy_to_device(a, 0, want_a.data(), 4096);
  worker.copy_to_device(b, 0, want_b.data(), 4096);

  worker.copy_on_device(b, 101, a, 203, 1000);  // another buffer, odd offsets
  std::copy_n(want_a.begin() + 203, 1000, want_b.begin() + 101);
  worker.copy_on_device(a, 3001, a, 9, 500);  // within one buffer, not overlapping
  std::copy_n(want_a.begin() + 9, 500, want_a.begin() + 3001);
  worker.copy_on_device(a, 600, a, 100, 500);  // adjacent ranges: [100, 600) -> [600, 1100)
  std::copy_n(want_a.begin() + 100, 500, want_a.begin() + 600);
  worker.fill_device(a, 1501, 0xab, 700);
  std::fill_n(want_a.begin() + 1501, 700, 0xab);
  worker.fill_device(b, 4000, 255, 96);  // to the last byte, the largest value
  std::fill_n(want_b.begin() + 4000, 96, 255);
  worker.fill_device(b, 0, 0, 1);  // the first byte alone, the smallest value
  want_b[0] = 0;
  worker.copy_on_device(b, 4096, a, 0, 0);  // 0 bytes at the end: a no-op
  worker.fill_device(b, 4096, 1, 0);

  EXPECT_EQ(read_back(worker, a), want_a);
  EXPECT_EQ(read_back(worker, b), want_b);
}

// The async forms run in the stream's order: each step reads what the one before wrote.
TEST_F(Conformance, AsyncDeviceCopiesAndFillsRunInStreamOrder) {
  DeviceBuffer a = worker.alloc_device(1 << 20);
  DeviceBuffer b = worker.alloc_device(1 << 20);
  PinnedHostBuffer up = worker.alloc_pinned_host(1 << 20);
  PinnedHostBuffer down = worker.alloc_pinned_host(1 << 20);
  auto want_a = pattern(1 << 20, 21);
  std::vector<unsigned char> want_b(1 << 20, 0x5c);
  std::memcpy(up.data(), want_a.data(), want_a.size());
  worker.fill_device(b, 0, 0x5c, 1 << 20);
  Stream stream = worker.create_stream();
  Event done = worker.create_event();
  worker.copy_to_device_async(a, 0, up.data(), 1 << 20, stream);
  worker.copy_on_device_async(b, 7, a, 0, 300'000, stream);  // reads the upload
  std::copy_n(want_a.begin(), 300'000, want_b.begin() + 7);
  worker.fill_device_async(b, 1000, 0x01, 5000, stream);  // over part of that copy
  std::fill_n(want_b.begin() + 1000, 5000, 0x01);
  worker.copy_on_device_async(a, 600'000, b, 0, 400'000, stream);  // reads both above
  std::copy_n(want_b.begin(), 400'000, want_a.begin() + 600'000);
  worker.copy_to_host_async(down.data(), b, 0, 1 << 20, stream);
  worker.record(done, stream);
  worker.wait(done);
  EXPECT_EQ(std::memcmp(down.data(), want_b.data(), want_b.size()), 0);
  worker.copy_to_host_async(down.data(), a, 0, 1 << 20, stream);
  worker.synchronize(stream);
  EXPECT_EQ(std::memcmp(down.data(), want_a.data(), want_a.size()), 0);
}

TEST_F(Conformance, DeviceCopiesAndFillsRefuseBadRangesAndValues) {
  DeviceBuffer a = worker.alloc_device(4096);
  DeviceBuffer b = worker.alloc_device(4096);
  const auto want = pattern(4096, 31);
  worker.copy_to_device(a, 0, want.data(), 4096);
  worker.copy_to_device(b, 0, want.data(), 4096);
  Stream stream = worker.create_stream();
  auto refused = [](auto&& call, const std::string& says) {
    const Error e = error_of(call);
    EXPECT_EQ(e.code(), ErrorCode::invalid_argument) << e.what();
    EXPECT_TRUE(contains(e.what(), says)) << e.what();
  };
  refused([&] { worker.copy_on_device(a, 50, a, 0, 100); }, "overlaps the source");
  refused([&] { worker.copy_on_device(a, 0, a, 99, 100); }, "overlaps the source");
  refused([&] { worker.copy_on_device_async(a, 10, a, 10, 1, stream); }, "overlaps the source");
  refused([&] { worker.copy_on_device(b, 4000, a, 0, 97); }, "outside the device buffer");
  refused([&] { worker.copy_on_device(b, 0, a, 4000, 97); }, "outside the device buffer");
  refused([&] { worker.copy_on_device(b, 4097, a, 0, 0); }, "outside the device buffer");
  refused([&] { worker.fill_device(a, 4090, 1, 7); }, "outside the device buffer");
  refused([&] { worker.fill_device_async(a, 0, 300, 16, stream); }, "value 300 is not a byte");
  refused([&] { worker.fill_device(a, 0, -1, 16); }, "value -1 is not a byte");
  refused([&] { worker.fill_device(a, 0, 256, 0); }, "value 256 is not a byte");
  DeviceBuffer empty;
  refused([&] { worker.fill_device(empty, 0, 1, 1); }, "device buffer is empty");
  Worker other;
  other.init(kBackend);
  DeviceBuffer theirs = other.alloc_device(4096);
  Stream foreign = other.create_stream();
  refused([&] { worker.copy_on_device(a, 0, theirs, 0, 16); },
          "not inside one device allocation of this worker");
  refused([&] { worker.copy_on_device(theirs, 0, a, 0, 16); },
          "not inside one device allocation of this worker");
  refused([&] { worker.fill_device(theirs, 0, 1, 16); },
          "not inside one device allocation of this worker");
  refused([&] { worker.fill_device_async(a, 0, 1, 16, foreign); }, "not created by this worker");
  refused([&] { worker.copy_on_device_async(b, 0, a, 0, 16, foreign); },
          "not created by this worker");
  worker.synchronize(stream);
  EXPECT_EQ(read_back(worker, a), want);  // nothing refused touched a byte
  EXPECT_EQ(read_back(worker, b), want);
}

// ABI v7: a read-only file mapping pinned in place is this worker's pinned memory (copies
// from it are bit-exact, is_pinned_host sees it) until it goes; every in-tree backend has
// host_register, and a register fault (kind host_alloc) leaves the mapping unpinned.
TEST_F(Conformance, AReadOnlyFileMappingIsPinnedInPlaceUntilItGoes) {
  ASSERT_NE(raw_api().host_register, nullptr) << kBackend << " has no host_register (ABI v7)";
  const std::string path = ::testing::TempDir() + "pinstage_conf_map_" + kBackend;
  const std::vector<unsigned char> bytes = pattern(3 * 4096 + 77, 5);
  {
    FILE* f = std::fopen(path.c_str(), "wb");
    ASSERT_NE(f, nullptr);
    ASSERT_EQ(std::fwrite(bytes.data(), 1, bytes.size(), f), bytes.size());
    std::fclose(f);
  }
  const void* at = nullptr;
  {
    const std::shared_ptr<PinnedFileMapping> m = worker.map_file_pinned(path, bytes.size());
    ASSERT_TRUE(m->pinned()) << m->refusal();
    at = m->data();
    EXPECT_TRUE(worker.is_pinned_host(m->data() + 100, bytes.size() - 100));
    DeviceBuffer dev = worker.alloc_device(bytes.size());
    worker.copy_to_device(dev, 0, m->data(), bytes.size());
    std::vector<unsigned char> back(bytes.size());
    worker.copy_to_host(back.data(), dev, 0, back.size());
    EXPECT_EQ(back, bytes);
  }
  EXPECT_FALSE(worker.is_pinned_host(at, 1)) << "still pinned after its last owner went";
  worker.inject_fault(FaultKind::host_alloc, 1);
  EXPECT_EQ(error_of([&] { (void)worker.map_file_pinned(path, bytes.size()); }).code(),
            ErrorCode::injected_fault);
  std::remove(path.c_str());
}

TEST_F(Conformance, FaultHookFailsExactlyTheNthCallOfEachKind) {
  worker.inject_fault(FaultKind::device_malloc, 2);
  DeviceBuffer a = worker.alloc_device(4096);
  EXPECT_EQ(error_of([&] { worker.alloc_device(4096); }).code(), ErrorCode::injected_fault);
  DeviceBuffer c = worker.alloc_device(4096);
  EXPECT_EQ(worker.stats().device_count, 2u);
  worker.inject_fault(FaultKind::host_alloc, 1);
  EXPECT_EQ(error_of([&] { worker.alloc_pinned_host(4096); }).code(), ErrorCode::injected_fault);
  EXPECT_EQ(worker.stats().pinned_count, 0u);
  std::vector<unsigned char> host(64, 1);
  worker.inject_fault(FaultKind::copy_h2d, 1);
  EXPECT_EQ(error_of([&] { worker.copy_to_device(a, 0, host.data(), 64); }).code(),
            ErrorCode::injected_fault);
  worker.copy_to_device(a, 0, host.data(), 64);  // only the nth fails
  worker.inject_fault(FaultKind::copy_d2h, 1);
  EXPECT_EQ(error_of([&] { worker.copy_to_host(host.data(), a, 0, 64); }).code(),
            ErrorCode::injected_fault);
  EXPECT_EQ(
      error_of([&] { worker.inject_fault(static_cast<FaultKind>(PS_FAULT_KIND_COUNT), 1); }).code(),
      ErrorCode::invalid_argument);
}

TEST_F(Conformance, AsyncCopyFailureSurfacesAtSynchronize) {
  DeviceBuffer dev = worker.alloc_device(4096);
  PinnedHostBuffer host = worker.alloc_pinned_host(4096);
  Stream stream = worker.create_stream();
  worker.inject_fault(FaultKind::copy_h2d, 1);
  bool failed = false;
  try {
    worker.copy_to_device_async(dev, 0, host.data(), 4096, stream);
    worker.synchronize(stream);
  } catch (const Error& e) {
    failed = e.code() == ErrorCode::injected_fault;
  }
  EXPECT_TRUE(failed);
  worker.copy_to_device_async(dev, 0, host.data(), 4096, stream);
  EXPECT_NO_THROW(worker.synchronize(stream));
}

TEST_F(Conformance, CorruptFaultFlipsOneByteOfTheNthUpload) {
  DeviceBuffer dev = worker.alloc_device(64);
  std::vector<unsigned char> host(64, 0x11), back(64);
  worker.inject_fault(FaultKind::corrupt_h2d, 2);
  worker.copy_to_device(dev, 0, host.data(), 64);
  worker.copy_to_host(back.data(), dev, 0, 64);
  EXPECT_EQ(back, host);  // the first upload is intact
  worker.copy_to_device(dev, 0, host.data(), 64);
  worker.copy_to_host(back.data(), dev, 0, 64);
  EXPECT_EQ(back[32], 0x11 ^ 0x40);
  back[32] = 0x11;
  EXPECT_EQ(back, host);  // exactly one byte differs
}

TEST_F(Conformance, FailedReleaseIsReportedAndRetriedAtFinalize) {
  PinnedHostBuffer host = worker.alloc_pinned_host(4096);
  const uint64_t segment = worker.host_memory_stats().reserved_bytes;
  worker.inject_fault(FaultKind::host_free, 1);
  host.reset();  // back to the pool's cache; the backend is asked at empty_cache()
  const Error e = error_of([&] { worker.empty_cache(); });
  EXPECT_EQ(e.code(), ErrorCode::backend);
  EXPECT_TRUE(contains(e.what(), "pinned host free failed")) << e.what();
  // Still the backend's and still locked: counted as failed to free, retried at finalize.
  EXPECT_EQ(worker.stats().pinned_count, 0u);
  EXPECT_EQ(worker.stats().failed_free_count, 1u);
  EXPECT_EQ(worker.stats().failed_free_bytes, segment);
  EXPECT_EQ(worker.free_failures(), 1u);
  testing::internal::CaptureStderr();
  worker.finalize();
  const std::string at_finalize = testing::internal::GetCapturedStderr();
  EXPECT_FALSE(contains(at_finalize, "failed")) << at_finalize;  // the retry succeeded
  EXPECT_EQ(worker.free_failures(), 1u);  // still answers after finalize, for exit codes
}

TEST(ConformanceTeardown, FinalizeReleasesEverythingOnceAndLateReleasesAreHarmless) {
  Worker worker;
  worker.init(kBackend);
  PinnedHostBuffer host = worker.alloc_pinned_host(1 << 20);
  DeviceBuffer dev = worker.alloc_device(1 << 20);
  Stream stream = worker.create_stream();
  Event event = worker.create_event();
  worker.copy_to_device_async(dev, 0, host.data(), 1 << 20, stream);
  worker.record(event, stream);
  testing::internal::CaptureStderr();
  worker.finalize();  // queued copy, stream, event, both allocations
  const std::string text = testing::internal::GetCapturedStderr();
  EXPECT_FALSE(contains(text, "failed")) << text;
  EXPECT_FALSE(host.valid());
  host.reset();  // no-ops: the worker reclaimed them
  dev.reset();
  EXPECT_EQ(error_of([&] { worker.alloc_device(1); }).code(), ErrorCode::finalized);
}

TEST(ConformanceInit, UnknownDeviceAndUnknownOptionAreRefused) {
  Worker worker;
  EXPECT_EQ(error_of([&] { worker.init(kBackend, 4096); }).code(), ErrorCode::no_device);
  Worker configured;
  WorkerOptions options;
  options.config = {{"no_such_option", "1"}};
  Error e = error_of([&] { configured.init(kBackend, 0, options); });
  EXPECT_EQ(e.code(), ErrorCode::invalid_argument);
  EXPECT_TRUE(contains(e.what(), "no_such_option")) << e.what();
  EXPECT_FALSE(configured.initialized());
}

TEST(ConformanceAbi, EverySlotRefusesNullArguments) {
  const ps_platform_api& api = raw_api();
  ps_allocation a{};
  EXPECT_EQ(api.create_context(0, nullptr, nullptr), PS_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(api.destroy_context(nullptr), PS_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(api.device_malloc(nullptr, 10, &a), PS_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(api.device_free(nullptr, &a), PS_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(api.host_alloc_pinned(nullptr, 10, &a), PS_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(api.host_free_pinned(nullptr, &a), PS_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(api.copy_h2d(nullptr, &a, &a, 1, 0), PS_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(api.copy_d2h(nullptr, &a, &a, 1, 0), PS_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(api.mem_info(nullptr, nullptr, nullptr), PS_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(api.get_capabilities(nullptr, nullptr), PS_ERR_INVALID_ARGUMENT);
  EXPECT_STRNE(api.last_error(), "");  // the detail of the last failure, never NULL
  if (api.inject_fault != nullptr) {
    EXPECT_EQ(api.inject_fault(nullptr, 0, 1), PS_ERR_INVALID_ARGUMENT);
  }
  if (api.copy_d2d_async != nullptr) {
    EXPECT_EQ(api.copy_d2d_async(nullptr, &a, &a, 1, nullptr), PS_ERR_INVALID_ARGUMENT);
  }
  if (api.memset_async != nullptr) {
    EXPECT_EQ(api.memset_async(nullptr, &a, 0, 1, nullptr), PS_ERR_INVALID_ARGUMENT);
  }
  if (api.stream_create != nullptr) {
    EXPECT_EQ(api.stream_create(nullptr, nullptr), PS_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(api.event_create(nullptr, nullptr), PS_ERR_INVALID_ARGUMENT);
  }
  if (api.host_register != nullptr) {
    EXPECT_EQ(api.host_register(nullptr, &a, 4096, 0), PS_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(api.host_unregister(nullptr, &a, 4096), PS_ERR_INVALID_ARGUMENT);
  }
  EXPECT_STREQ(ps_status_str(PS_ERR_OUT_OF_MEMORY), "PS_ERR_OUT_OF_MEMORY");
  EXPECT_STREQ(ps_status_str(-1234), "PS_ERR_UNKNOWN_STATUS");
}

// Topology (ABI v6): the devices are listed without a context, ids 0..n-1, each with a
// name; the worker's own device is the listed one; a device id past the count is refused
// by the slot and by init. The raw slots accept NULL options (the defaults).
TEST(ConformanceAbi, DevicesAreListedAndTheWorkersIsOneOfThem) {
  const std::vector<DeviceInfo> devices = list_devices(kBackend);
  ASSERT_FALSE(devices.empty());
  for (size_t i = 0; i < devices.size(); ++i) {
    EXPECT_EQ(devices[i].id, static_cast<int>(i));
    EXPECT_FALSE(devices[i].name.empty());
    EXPECT_GE(devices[i].numa_node, -1);
    EXPECT_EQ(devices[i].reason.empty(), devices[i].usable) << devices[i].reason;
  }
  Worker worker;
  worker.init(kBackend);
  const DeviceInfo mine = worker.device_info();
  EXPECT_EQ(mine.id, 0);
  EXPECT_EQ(mine.name, devices[0].name);
  EXPECT_EQ(mine.pci_bus_id, devices[0].pci_bus_id);
  EXPECT_EQ(mine.numa_node, devices[0].numa_node);
  const ps_platform_api& api = raw_api();
  if (api.device_count == nullptr) {
    EXPECT_EQ(devices.size(), 1u);  // no topology slots: one device of unknown properties
    return;
  }
  int count = -1;
  EXPECT_EQ(api.device_count(nullptr, &count), PS_OK);
  EXPECT_EQ(count, static_cast<int>(devices.size()));
  EXPECT_EQ(api.device_count(nullptr, nullptr), PS_ERR_INVALID_ARGUMENT);
  ps_device_props props{};
  EXPECT_EQ(api.device_props(0, nullptr, nullptr), PS_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(api.device_props(count, nullptr, &props), PS_ERR_NO_DEVICE);
  EXPECT_EQ(api.device_props(-1, nullptr, &props), PS_ERR_NO_DEVICE);
  EXPECT_EQ(api.device_props(0, nullptr, &props), PS_OK);
  EXPECT_EQ(std::string(props.name), devices[0].name);
  Worker past;
  EXPECT_EQ(error_of([&] { past.init(kBackend, count); }).code(), ErrorCode::no_device);
  EXPECT_FALSE(past.initialized());
}

// host_numa_node reaches the backend's pinned allocations: with node 0 (where the host
// has it) every page of a pinned buffer is on node 0, as move_pages reports it. (One
// node here: the 2-node proof is tests/cpp/test_numa_placement.cpp, through the seam.)
TEST(ConformanceAbi, PinnedMemoryIsPlacedOnTheAskedNode) {
  WorkerOptions options;
  options.host_numa_node = 0;
  Worker worker;
  worker.init(kBackend, 0, options);
  if (worker.host_numa_node() != 0) GTEST_SKIP() << "no NUMA node 0 on this host";
  PinnedHostBuffer buffer = worker.alloc_pinned_host(3 << 20);
  std::memset(buffer.data(), 1, buffer.size());
  const std::vector<int> nodes = test::page_nodes(buffer.data(), buffer.size());
  ASSERT_FALSE(nodes.empty()) << "move_pages failed";
  EXPECT_EQ(std::count(nodes.begin(), nodes.end(), 0), static_cast<long>(nodes.size()));
}

TEST(ConformanceAbi, CapabilitiesMatchTheSlots) {
  Worker worker;
  worker.init(kBackend);
  const Capabilities caps = worker.capabilities();
  const ps_platform_api& api = raw_api();
  EXPECT_EQ(caps.async_copy, api.copy_h2d_async != nullptr);
  EXPECT_EQ(caps.execute, api.host_execute != nullptr);
  if (!caps.execute) {
    EXPECT_EQ(error_of([&] { worker.execute("sim.fill_index", {}); }).code(),
              ErrorCode::unsupported);
  }
  // Every in-tree backend has the ABI v5 device-side slots (tests/cpp/plugins/
  // no_device_ops.cpp covers a backend without them).
  EXPECT_NE(api.copy_d2d_async, nullptr);
  EXPECT_NE(api.memset_async, nullptr);
}

// The description pinstage_add_backend wrote (what Python and the CLI read) is this
// backend's, and says of its memory what the plugin says: DLPack kDLCPU, as a torch CPU
// tensor, exactly where device memory is host RAM.
TEST(ConformanceDescription, TheBackendDescribesItselfAsItIs) {
  const std::vector<BackendDescription>& all = described_backends();
  const auto it = std::find_if(all.begin(), all.end(),
                               [](const BackendDescription& b) { return b.name == kBackend; });
  ASSERT_NE(it, all.end()) << kBackend << " is not among the described backends";
  EXPECT_EQ(std::filesystem::weakly_canonical(it->plugin_path),
            std::filesystem::weakly_canonical(default_backend_path(kBackend)));
  const BackendDescription& one = describe_plugin(default_backend_path(kBackend));
  EXPECT_EQ(&one, &describe_plugin(default_backend_path(kBackend)));  // read once
  EXPECT_EQ(std::tie(one.name, one.dlpack_device_type, one.torch_device),
            std::tie(it->name, it->dlpack_device_type, it->torch_device));
  Worker worker;
  worker.init(kBackend);
  EXPECT_EQ(worker.backend().name, it->name);  // the plugin table's name
  constexpr int kDLCPU = 1;                    // DLPack's DLDeviceType
  EXPECT_EQ(it->dlpack_device_type == kDLCPU, worker.capabilities().device_memory_is_host);
  EXPECT_EQ(it->torch_device == "cpu", it->dlpack_device_type == kDLCPU);
}

}  // namespace
}  // namespace pinstage
