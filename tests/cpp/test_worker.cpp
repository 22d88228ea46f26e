// Worker lifecycle, pinned and device buffers, copies and error paths on the sim backend.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <numeric>
#include <span>
#include <vector>

#include "lock_test_util.h"
#include "pinstage/log.h"
#include "pinstage/parallel.h"
#include "pinstage/worker.h"
#include "tensor_test_util.h"

namespace pinstage {
namespace {

using test::error_of;
using test::pattern;

class WorkerTest : public ::testing::Test {
 protected:
  void SetUp() override { worker.init("sim"); }
  Worker worker;
};

TEST_F(WorkerTest, PinnedAllocationIsTrackedAndReleased) {
  {
    PinnedHostBuffer a = worker.alloc_pinned_host(1 << 20);
    PinnedHostBuffer b = worker.alloc_pinned_host(12345);
    ASSERT_TRUE(a && b);
    EXPECT_EQ(a.size(), 1u << 20);
    EXPECT_EQ(b.size(), 12345u);
    std::memset(a.data(), 0xab, a.size());
    std::memset(b.data(), 0xcd, b.size());
    EXPECT_EQ(static_cast<unsigned char*>(a.data())[a.size() - 1], 0xab);
    WorkerStats s = worker.stats();
    EXPECT_EQ(s.pinned_count, 2u);
    EXPECT_EQ(s.pinned_bytes, (1u << 20) + 12345u);
    b.reset();
    EXPECT_FALSE(b);
    EXPECT_EQ(worker.stats().pinned_count, 1u);
    // A moved-from buffer owns nothing; the moved-to one releases exactly once.
    PinnedHostBuffer c = std::move(a);
    EXPECT_FALSE(a);
    EXPECT_TRUE(c.valid());
  }
  EXPECT_EQ(worker.stats().pinned_count, 0u);
  EXPECT_EQ(worker.stats().pinned_bytes, 0u);
}

// Pinned memory is really locked: VmLck of this process grows by exactly what the pool
// reserved (its segment, whole pages), requests the segment holds lock nothing more, a
// release keeps it locked for reuse, and empty_cache() unlocks it. The capability flag
// alone would pass an allocator that unlocks right after locking.
TEST_F(WorkerTest, PinnedMemoryIsReallyLockedToThePage) {
  if (!test::kVmLckTracksMlock) GTEST_SKIP() << "sanitizer build: mlock is a no-op";
  if (!test::can_lock(8 << 20)) GTEST_SKIP() << "no CAP_IPC_LOCK and a low RLIMIT_MEMLOCK";
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  const uint64_t base = test::vmlck_bytes();
  {
    PinnedHostBuffer one = worker.alloc_pinned_host(1);
    const uint64_t reserved = worker.host_memory_stats().reserved_bytes;
    EXPECT_EQ(reserved, uint64_t{2} << 20);  // the segment unit, not a power of two of 1 B
    EXPECT_EQ(test::vmlck_bytes(), base + reserved);
    PinnedHostBuffer odd = worker.alloc_pinned_host(3 * page + 1);
    PinnedHostBuffer big = worker.alloc_pinned_host(1 << 20);
    EXPECT_EQ(test::vmlck_bytes(), base + reserved);  // carved from the locked segment
    EXPECT_EQ(worker.host_memory_stats().reserved_bytes - worker.host_memory_stats().cached_bytes,
              page + 4 * page + (1 << 20));  // blocks are whole pages, nothing more
    EXPECT_TRUE(worker.capabilities().pinned_is_page_locked);
    EXPECT_EQ(locked_memory_bytes(), test::vmlck_bytes());  // the runtime reads the same
  }
  EXPECT_EQ(test::vmlck_bytes(), base + (uint64_t{2} << 20));  // cached, still locked
  EXPECT_EQ(worker.empty_cache(), uint64_t{2} << 20);
  EXPECT_EQ(test::vmlck_bytes(), base);
}

// Issue 14, defect 8: a release the backend refuses is not forgotten. It stays counted as
// failed (its memory is still locked), is retried at finalize, and free_failures keeps
// the count for the CLI's exit status after finalize.
TEST(WorkerFailedFree, StaysCountedAndIsRetriedAtFinalize) {
  const uint64_t before_init = test::vmlck_bytes();
  Worker worker;
  worker.init("sim");
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  const uint64_t base = test::vmlck_bytes();  // the context may lock memory of its own
  const bool locks = test::kVmLckTracksMlock && test::can_lock(8 << 20) &&
                     worker.capabilities().pinned_is_page_locked;
  PinnedHostBuffer host = worker.alloc_pinned_host(10000);
  DeviceBuffer device = worker.alloc_device(5000);
  worker.inject_fault(FaultKind::host_free, 1);
  worker.inject_fault(FaultKind::device_free, 1);
  host.reset();    // back to the pool: no backend call
  device.reset();  // logged, never thrown
  // The pool's segment goes back to the backend here, which refuses.
  EXPECT_EQ(error_of([&] { worker.empty_cache(); }).code(), ErrorCode::backend);
  const uint64_t segment = uint64_t{2} << 20;
  const WorkerStats s = worker.stats();
  EXPECT_EQ(s.failed_free_count, 2u);
  EXPECT_EQ(s.failed_free_bytes, segment + 5000u);
  EXPECT_EQ(s.free_failures, 2u);
  EXPECT_EQ(s.pinned_count, 0u);  // no longer handed out...
  EXPECT_EQ(s.device_count, 0u);
  EXPECT_GT(s.device_committed_bytes, 0u);  // ...but still the backend's
  if (locks) {
    EXPECT_EQ(test::vmlck_bytes(), base + segment);  // still locked
  }
  (void)page;
  // A later allocation works and is counted on its own.
  PinnedHostBuffer again = worker.alloc_pinned_host(100);
  EXPECT_EQ(worker.stats().pinned_count, 1u);
  EXPECT_EQ(worker.stats().failed_free_count, 2u);
  worker.finalize();                      // retries both releases; they succeed now
  EXPECT_EQ(worker.free_failures(), 2u);  // readable after finalize: the refusals happened
  if (locks) {
    EXPECT_EQ(test::vmlck_bytes(), before_init);
  }
}

TEST(WorkerFailedFree, ARetryThatFailsAtFinalizeIsCountedToo) {
  Worker worker;
  worker.init("sim");
  PinnedHostBuffer host = worker.alloc_pinned_host(4096);
  worker.inject_fault(FaultKind::host_free, 1);
  host.reset();
  EXPECT_THROW(worker.empty_cache(), Error);     // the segment's release is refused
  worker.inject_fault(FaultKind::host_free, 1);  // the retry at finalize fails as well
  EXPECT_EQ(worker.free_failures(), 1u);
  worker.finalize();
  EXPECT_EQ(worker.free_failures(), 2u);
  Worker fresh;  // the process goes on: nothing else is affected
  fresh.init("sim");
  EXPECT_EQ(fresh.free_failures(), 0u);
}

TEST_F(WorkerTest, SimReportsItsCapabilities) {
  const Capabilities caps = worker.capabilities();
  EXPECT_TRUE(caps.async_copy);
  EXPECT_TRUE(caps.execute);
  EXPECT_TRUE(caps.device_memory_is_host);  // the benchmark sizes by this
}

TEST(WorkerLifetime, BufferDestroyedAfterFinalizeIsHarmless) {
  Worker worker;
  worker.init("sim");
  PinnedHostBuffer host = worker.alloc_pinned_host(1 << 16);
  DeviceBuffer dev = worker.alloc_device(1 << 16);
  Stream stream = worker.create_stream();
  worker.finalize();
  EXPECT_FALSE(host.valid());
  EXPECT_FALSE(dev.valid());
  host.reset();  // no-op: the worker already reclaimed it (ASan would flag a double free)
  EXPECT_FALSE(host);
}

TEST(WorkerLifetime, WorkerDestroyedBeforeBuffer) {
  PinnedHostBuffer host;
  DeviceBuffer dev;
  {
    Worker worker;
    worker.init("sim");
    host = worker.alloc_pinned_host(1 << 16);
    dev = worker.alloc_device(1 << 16);
    EXPECT_TRUE(host.valid());
  }
  EXPECT_FALSE(host.valid());
  EXPECT_FALSE(dev.valid());
}  // buffers die here, after their worker

TEST(WorkerLifetime, FinalizeReclaimsAndReportsOutstandingAllocations) {
  Worker worker;
  worker.init("sim");
  std::vector<PinnedHostBuffer> pinned;
  for (int i = 0; i < 3; ++i) pinned.push_back(worker.alloc_pinned_host(1000 + i));
  DeviceBuffer dev1 = worker.alloc_device(1 << 20);
  DeviceBuffer dev2 = worker.alloc_device(1 << 20);
  EXPECT_EQ(worker.stats().device_count, 2u);
  const LogLevel before = log_level();
  set_log_level(LogLevel::info);
  testing::internal::CaptureStderr();
  worker.finalize();
  const std::string log_text = testing::internal::GetCapturedStderr();
  set_log_level(before);
  EXPECT_NE(log_text.find("reclaimed 3 outstanding pinned host allocation(s), 3003 bytes"),
            std::string::npos)
      << log_text;
  EXPECT_NE(log_text.find("reclaimed 2 outstanding device allocation(s)"), std::string::npos)
      << log_text;
}

TEST(WorkerLifetime, DoubleFinalizeIsANoOp) {
  Worker worker;
  worker.init("sim");
  worker.finalize();
  EXPECT_NO_THROW(worker.finalize());
  EXPECT_TRUE(worker.finalized());
  EXPECT_FALSE(worker.initialized());
}

TEST(WorkerLifetime, UseBeforeInitAndAfterFinalizeThrow) {
  Worker worker;
  EXPECT_FALSE(worker.finalized());
  Error before = error_of([&] { worker.alloc_pinned_host(10); });
  EXPECT_EQ(before.code(), ErrorCode::not_initialized);
  EXPECT_NE(std::string(before.what()).find("call init"), std::string::npos);
  EXPECT_EQ(error_of([&] { worker.stats(); }).code(), ErrorCode::not_initialized);
  worker.init("sim");
  EXPECT_EQ(error_of([&] { worker.init("sim"); }).code(), ErrorCode::invalid_argument);
  worker.finalize();
  Error after = error_of([&] { worker.alloc_device(10); });
  EXPECT_EQ(after.code(), ErrorCode::finalized);
  EXPECT_NE(std::string(after.what()).find("new Worker"), std::string::npos);
  EXPECT_EQ(error_of([&] { worker.init("sim"); }).code(), ErrorCode::finalized);
  EXPECT_EQ(error_of([&] { worker.create_stream(); }).code(), ErrorCode::finalized);
}

// Issue 14, defect 9: finalize() is terminal even on a worker never initialized.
TEST(WorkerLifetime, FinalizeBeforeInitIsTerminalToo) {
  Worker worker;
  worker.finalize();
  EXPECT_TRUE(worker.finalized());
  EXPECT_FALSE(worker.initialized());
  Error init = error_of([&] { worker.init("sim"); });
  EXPECT_EQ(init.code(), ErrorCode::finalized);
  EXPECT_NE(std::string(init.what()).find("finalize is terminal"), std::string::npos);
  EXPECT_EQ(error_of([&] { worker.alloc_pinned_host(10); }).code(), ErrorCode::finalized);
  EXPECT_EQ(error_of([&] { worker.stats(); }).code(), ErrorCode::finalized);
  worker.finalize();  // still idempotent
  EXPECT_TRUE(worker.finalized());
  EXPECT_FALSE(worker.initialized());
}

TEST_F(WorkerTest, ZeroAndAbsurdSizesAreRefused) {
  Error zero = error_of([&] { worker.alloc_pinned_host(0); });
  EXPECT_EQ(zero.code(), ErrorCode::invalid_argument);
  EXPECT_NE(std::string(zero.what()).find("0 bytes"), std::string::npos);
  Error huge = error_of([&] { worker.alloc_pinned_host(size_t{1} << 62); });
  EXPECT_EQ(huge.code(), ErrorCode::invalid_argument);
  EXPECT_NE(std::string(huge.what()).find("physical memory"), std::string::npos);
  EXPECT_EQ(error_of([&] { worker.alloc_device(0); }).code(), ErrorCode::invalid_argument);
  EXPECT_EQ(error_of([&] { worker.alloc_device(size_t{1} << 62); }).code(),
            ErrorCode::out_of_memory);
  EXPECT_EQ(worker.stats().pinned_count + worker.stats().device_count, 0u);
}

TEST(WorkerCapacity, DeviceCapacityExhaustionIsOutOfMemory) {
  Worker worker;
  WorkerOptions options;
  options.device_capacity_bytes = 8 << 20;
  worker.init("sim", 0, options);
  EXPECT_EQ(worker.stats().device_capacity_bytes, 8u << 20);
  DeviceBuffer a = worker.alloc_device(6 << 20);
  Error e = error_of([&] { worker.alloc_device(4 << 20); });
  EXPECT_EQ(e.code(), ErrorCode::out_of_memory);
  EXPECT_NE(std::string(e.what()).find("out of memory"), std::string::npos);
  EXPECT_EQ(worker.stats().device_committed_bytes, 6u << 20);
  a.reset();
  EXPECT_EQ(worker.stats().device_committed_bytes, 0u);
  EXPECT_NO_THROW(worker.alloc_device(4 << 20));
}

TEST(WorkerCapacity, EnvironmentSetsTheSimCapacity) {
  setenv("PINSTAGE_SIM_DEVICE_CAPACITY", "16M", 1);
  Worker worker;
  worker.init("sim");
  EXPECT_EQ(worker.stats().device_capacity_bytes, 16u << 20);
  for (const char* value : {"lots", "-1", " 16M", "99999999999G"}) {
    SCOPED_TRACE(value);
    setenv("PINSTAGE_SIM_DEVICE_CAPACITY", value, 1);
    Worker bad;
    Error e = error_of([&] { bad.init("sim"); });
    EXPECT_NE(
        std::string(e.what()).find(std::string("PINSTAGE_SIM_DEVICE_CAPACITY='") + value + "'"),
        std::string::npos)
        << e.what();
    EXPECT_FALSE(bad.initialized());
  }
  unsetenv("PINSTAGE_SIM_DEVICE_CAPACITY");
}

TEST_F(WorkerTest, InjectedFailureMidSequenceLeavesNothingLeaked) {
  // Each request fills its own 2 MiB-unit segment, so each is a backend call (a miss).
  worker.inject_fault(FaultKind::host_alloc, 3);
  std::vector<PinnedHostBuffer> got;
  int failures = 0;
  for (int i = 0; i < 5; ++i) {
    try {
      got.push_back(worker.alloc_pinned_host((size_t{2} << 20) * (i + 1)));
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::injected_fault);
      EXPECT_EQ(i, 2);
      ++failures;
    }
  }
  EXPECT_EQ(failures, 1);
  EXPECT_EQ(worker.stats().pinned_count, 4u);
  got.clear();
  EXPECT_EQ(worker.stats().pinned_count, 0u);

  worker.inject_fault(FaultKind::device_malloc, 2);
  DeviceBuffer first = worker.alloc_device(1 << 20);
  EXPECT_EQ(error_of([&] { worker.alloc_device(1 << 20); }).code(), ErrorCode::injected_fault);
  first.reset();
  const WorkerStats s = worker.stats();
  EXPECT_EQ(s.device_count, 0u);
  EXPECT_EQ(s.device_committed_bytes, 0u);
}

TEST_F(WorkerTest, ExecuteRunsNamedCallablesAndRefusesUnknownOnes) {
  DeviceBuffer a = worker.alloc_device(300);
  DeviceBuffer b = worker.alloc_device(10);
  const ExecArg args[] = {{"a", a.data(), 300}, {"b", b.data(), 10}};
  worker.execute("sim.fill_index", args);
  std::vector<unsigned char> back(300);
  worker.copy_to_host(back.data(), a, 0, 300);
  for (size_t j = 0; j < 300; ++j) ASSERT_EQ(back[j], j & 0xff);
  worker.copy_to_host(back.data(), b, 0, 10);
  for (size_t j = 0; j < 10; ++j) ASSERT_EQ(back[j], (j + 7) & 0xff);
  Error e = error_of([&] { worker.execute("no_such_kernel", args); });
  EXPECT_EQ(e.code(), ErrorCode::not_found);
  EXPECT_NE(std::string(e.what()).find("no_such_kernel"), std::string::npos);
  std::vector<char> host(16);
  const ExecArg not_device[] = {{"host", host.data(), host.size()}};
  EXPECT_EQ(error_of([&] { worker.execute("sim.fill_index", not_device); }).code(),
            ErrorCode::invalid_argument);
}

TEST(WorkerExecute, HostCallablesAreRegisteredOnceByName) {
  EXPECT_EQ(error_of([] { register_host_callable("sim.fill_index", [](auto) {}); }).code(),
            ErrorCode::invalid_argument);
  EXPECT_EQ(error_of([] { register_host_callable("", [](auto) {}); }).code(),
            ErrorCode::invalid_argument);
  register_host_callable("test.double_first", [](std::span<const ExecArg> args) {
    auto* p = static_cast<unsigned char*>(args[0].device_ptr);
    for (uint64_t i = 0; i < args[0].bytes; ++i) p[i] = static_cast<unsigned char>(p[i] * 2);
  });
  const auto names = host_callable_names();
  EXPECT_NE(std::find(names.begin(), names.end(), "test.double_first"), names.end());
  Worker worker;
  worker.init("sim");
  DeviceBuffer dev = worker.alloc_device(3);
  const unsigned char in[3] = {1, 2, 100};
  worker.copy_to_device(dev, 0, in, 3);
  const ExecArg args[] = {{"x", dev.data(), 3}};
  worker.execute("test.double_first", args);
  unsigned char out[3] = {};
  worker.copy_to_host(out, dev, 0, 3);
  EXPECT_EQ(out[0], 2);
  EXPECT_EQ(out[2], 200);
  // The fault hook covers the execute step, and a callable's own error comes back as is.
  worker.inject_fault(FaultKind::execute, 1);
  EXPECT_EQ(error_of([&] { worker.execute("test.double_first", args); }).code(),
            ErrorCode::injected_fault);
  register_host_callable("test.throws",
                         [](auto) { throw Error(ErrorCode::mismatch, "test.throws ran"); });
  Error e = error_of([&] { worker.execute("test.throws", args); });
  EXPECT_EQ(e.code(), ErrorCode::mismatch);
  // An argument past the end of its allocation is refused before anything runs.
  const ExecArg past_end[] = {{"x", dev.data(), 4}};
  EXPECT_EQ(error_of([&] { worker.execute("test.double_first", past_end); }).code(),
            ErrorCode::invalid_argument);
}

TEST(WorkerFaults, SimFaultEnvironmentVariableFailsTheNthCall) {
  setenv("PINSTAGE_SIM_FAULT", "copy_h2d:1", 1);
  Worker worker;
  worker.init("sim");
  unsetenv("PINSTAGE_SIM_FAULT");
  DeviceBuffer dev = worker.alloc_device(1);
  const char byte = 0;
  EXPECT_EQ(error_of([&] { worker.copy_to_device(dev, 0, &byte, 1); }).code(),
            ErrorCode::injected_fault);
  EXPECT_NO_THROW(worker.copy_to_device(dev, 0, &byte, 1));
}

TEST(WorkerConfig, BackendOptionsAreKeyValuePairsWithoutRepeats) {
  BackendConfig config;
  add_backend_option(config, "pinned_mode=register");
  add_backend_option(config, "empty=");
  ASSERT_EQ(config.size(), 2u);
  EXPECT_EQ(config[0], (std::pair<std::string, std::string>{"pinned_mode", "register"}));
  EXPECT_EQ(config[1].second, "");
  for (const char* bad : {"pinned_mode=alloc", "novalue", "=x"}) {
    SCOPED_TRACE(bad);
    EXPECT_EQ(error_of([&] { add_backend_option(config, bad); }).code(),
              ErrorCode::invalid_argument);
  }
  Worker worker;
  WorkerOptions options;
  options.config = {{"a", "1"}, {"a", "2"}};
  Error e = error_of([&] { worker.init("sim", 0, options); });
  EXPECT_NE(std::string(e.what()).find("given twice"), std::string::npos) << e.what();
}

TEST(WorkerInit, BadParametersAreRefusedClearly) {
  Worker worker;
  EXPECT_EQ(error_of([&] { worker.init("sim", 1); }).code(), ErrorCode::no_device);
  Worker w2;
  EXPECT_EQ(error_of([&] { w2.init("sim", -1); }).code(), ErrorCode::invalid_argument);
  Worker w3;
  EXPECT_EQ(error_of([&] { w3.init("../etc"); }).code(), ErrorCode::invalid_argument);
  EXPECT_EQ(error_of([] { parse_worker_level("rack"); }).code(), ErrorCode::invalid_argument);
  EXPECT_EQ(parse_worker_level("chip"), WorkerLevel::chip);
  EXPECT_EQ(parse_worker_level("node"), WorkerLevel::node);
  // The node level is a WorkerGroup's; a Worker refuses it by name.
  const Error node = error_of([] { Worker w(WorkerLevel::node); });
  EXPECT_EQ(node.code(), ErrorCode::invalid_argument);
  EXPECT_NE(std::string(node.what()).find("WorkerGroup"), std::string::npos) << node.what();
}

TEST(WorkerInit, ChipGuardRejectsAnUninitializedWorker) {
  Worker worker;
  Error e = error_of([&] { require_chip_worker(worker, "PinnedAllocator"); });
  EXPECT_EQ(e.code(), ErrorCode::invalid_argument);
  EXPECT_NE(std::string(e.what()).find("PinnedAllocator needs an initialized chip-level worker"),
            std::string::npos);
  EXPECT_NE(std::string(e.what()).find("worker that is not initialized"), std::string::npos)
      << e.what();
  worker.init("sim");
  EXPECT_NO_THROW(require_chip_worker(worker, "PinnedAllocator"));
}

TEST(WorkerInit, ChipGuardNamesAFinalizedWorkerFinalized) {
  for (const bool init_first : {true, false}) {
    Worker worker;
    if (init_first) worker.init("sim");
    worker.finalize();
    Error e = error_of([&] { require_chip_worker(worker, "load_file"); });
    EXPECT_EQ(e.code(), ErrorCode::invalid_argument);
    EXPECT_NE(std::string(e.what()).find("worker that was finalized; finalize is terminal"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace pinstage

namespace pinstage {
namespace {

// fork() after a sim Worker ran copies on a stream: in the child the parent's worker is a
// clear error and releases nothing, the thread pool and a new Worker work, and the child
// exits normally (the worker's destructor, then static destructors) with its own status.
TEST(WorkerFork, AChildRefusesTheParentsWorkerAndExitsCleanly) {
  auto worker = std::make_unique<Worker>();
  worker->init("sim");
  PinnedHostBuffer host = worker->alloc_pinned_host(1 << 20);
  DeviceBuffer dev = worker->alloc_device(1 << 20);
  Stream stream = worker->create_stream();
  std::memset(host.data(), 7, host.size());
  worker->copy_to_device_async(dev, 0, host.data(), host.size(), stream);
  worker->synchronize(stream);
  std::vector<int> v(1 << 16, 1);
  parallel_for(v.size(), 1024,
               [&](size_t b, size_t e) { std::fill(v.begin() + b, v.begin() + e, 2); });
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    int code = 0;
    try {
      worker->alloc_pinned_host(4096);
      code = 10;  // the parent's worker served the child
    } catch (const Error& e) {
      if (e.code() != ErrorCode::invalid_argument ||
          std::string(e.what()).find("after fork() the child cannot use it") == std::string::npos)
        code = 11;
    }
    if (code == 0 && worker->initialized()) code = 12;
    std::vector<int> w(1 << 16, 1);  // the pool's threads are the parent's: a new pool
    parallel_for(w.size(), 1024,
                 [&](size_t b, size_t e) { std::fill(w.begin() + b, w.begin() + e, 3); });
    if (code == 0 && std::count(w.begin(), w.end(), 3) != static_cast<long>(w.size())) code = 13;
    if (code == 0) {
      Worker mine;
      mine.init("sim");
      PinnedHostBuffer h = mine.alloc_pinned_host(4096);
      DeviceBuffer d = mine.alloc_device(4096);
      std::memset(h.data(), 9, 4096);
      mine.copy_to_device(d, 0, h.data(), 4096);
      std::vector<unsigned char> back(4096);
      mine.copy_to_host(back.data(), d, 0, 4096);
      if (back[4095] != 9) code = 14;
    }
    {  // the parent's buffers and worker go out of scope in the child: no release, no hang
      PinnedHostBuffer gone = std::move(host);
      DeviceBuffer gone_too = std::move(dev);
      Stream gone_stream = std::move(stream);
    }
    worker.reset();
#if defined(PINSTAGE_TEST_SANITIZED)
    // LeakSanitizer would report what the child leaks on purpose (the parent's state,
    // the old pool, the parent's thread states): the exit code must be the test's.
    ::_exit(code);
#else
    std::exit(code);  // static destructors run too
#endif
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status)) << "the child died of signal " << WTERMSIG(status);
  EXPECT_EQ(WEXITSTATUS(status), 0) << "10: served, 11: wrong error, 12: initialized, "
                                       "13: pool, 14: new worker";
  // The parent's worker is untouched by what the child did.
  EXPECT_EQ(worker->stats().pinned_count, 1u);
  std::vector<unsigned char> back(1 << 20);
  worker->copy_to_host(back.data(), dev, 0, back.size());
  EXPECT_EQ(back[12345], 7);
}

}  // namespace
}  // namespace pinstage

namespace pinstage {
namespace {

size_t mapping_count() {
  std::ifstream in("/proc/self/maps");
  size_t n = 0;
  for (std::string line; std::getline(in, line);) ++n;
  return n;
}

// More pinned buffers than vm.max_map_count (65530) allows mappings: the pool packs them
// into segments, so 70,000 small buffers take a handful of mappings, not one each.
TEST(WorkerPool, SeventyThousandPinnedBuffersTakeAFewMappings) {
  Worker worker;
  worker.init("sim");
  const size_t before = mapping_count();
  std::vector<PinnedHostBuffer> buffers;
  buffers.reserve(70000);
  for (int i = 0; i < 70000; ++i) {
    buffers.push_back(worker.alloc_pinned_host(4096));
    static_cast<unsigned char*>(buffers.back().data())[4095] = static_cast<unsigned char>(i);
  }
  EXPECT_LT(mapping_count(), before + 1000) << "one mapping per buffer would pass 65530";
  EXPECT_EQ(worker.stats().pinned_count, 70000u);
  EXPECT_EQ(static_cast<unsigned char*>(buffers[69999].data())[4095],
            static_cast<unsigned char>(69999));
}

}  // namespace
}  // namespace pinstage
