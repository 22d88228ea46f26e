// ResidentBinder: only declared changes go up (counted by sim's own copy stats), INOUT
// tensors stay on the device and are updated there, an undeclared write is caught by the
// debug check, bad calls are refused with their reason, a binder outliving its worker is
// harmless, and every injected fault leaves nothing held.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "extension_test_util.h"
#include "pinstage/backend/sim_ext.h"
#include "pinstage/bind.h"
#include "pinstage/tensor.h"
#include "pinstage/worker.h"
#include "tensor_test_util.h"

namespace pinstage {
namespace {

constexpr const char* kCallable = "resident_test.step";

// y[i] = x[i] + w[i % |w|] (bytewise); acc[i] += 1: a step whose OUT depends on both inputs
// and whose INOUT counts the steps it saw on the device.
void run_step(std::span<const ExecArg> args) {
  const auto* x = static_cast<const unsigned char*>(args[0].device_ptr);
  const auto* w = static_cast<const unsigned char*>(args[1].device_ptr);
  auto* acc = static_cast<unsigned char*>(args[2].device_ptr);
  auto* y = static_cast<unsigned char*>(args[3].device_ptr);
  for (uint64_t i = 0; i < args[3].bytes; ++i)
    y[i] = static_cast<unsigned char>(x[i] + w[i % args[1].bytes]);
  for (uint64_t i = 0; i < args[2].bytes; ++i) acc[i] = static_cast<unsigned char>(acc[i] + 1);
}

const bool registered = [] {
  register_host_callable(kCallable, run_step);
  return true;
}();

constexpr uint64_t kX = 4000, kW = 1 << 20, kAcc = 3000;

TaskArgs make_task(HostAllocator& alloc) {
  TaskArgs args;
  Tensor x = Tensor::empty("x", DType::u8, {int64_t{kX}}, Direction::in, alloc);
  Tensor w = Tensor::empty("w", DType::u8, {int64_t{kW}}, Direction::in, alloc);
  Tensor acc = Tensor::empty("acc", DType::u8, {int64_t{kAcc}}, Direction::inout, alloc);
  Tensor y = Tensor::empty("y", DType::u8, {int64_t{kX}}, Direction::out, alloc);
  for (uint64_t i = 0; i < kX; ++i) x.data_as<unsigned char>()[i] = static_cast<unsigned char>(i);
  for (uint64_t i = 0; i < kW; ++i)
    w.data_as<unsigned char>()[i] = static_cast<unsigned char>(i * 7 + 3);
  for (uint64_t i = 0; i < kAcc; ++i)
    acc.data_as<unsigned char>()[i] = static_cast<unsigned char>(i * 5);
  std::memset(y.data(), 0, kX);
  args.add(std::move(x));
  args.add(std::move(w));
  args.add(std::move(acc));
  args.add(std::move(y));
  return args;
}

BindOptions with_callable() {
  BindOptions o;
  o.execute_callable = kCallable;
  return o;
}

// sim's own count of bytes copied each way (both paths), not the report's.
struct Moved {
  uint64_t h2d = 0, d2h = 0;
};
Moved sim_moved(const Worker& w) {
  const ps_sim_stats s = test::sim_stats(w);
  return {s.h2d_direct_bytes + s.h2d_bounced_bytes, s.d2h_direct_bytes + s.d2h_bounced_bytes};
}

class ResidentTest : public ::testing::Test {
 protected:
  void SetUp() override { worker.init("sim"); }
  void expect_nothing_on_device() {
    EXPECT_EQ(worker.stats().device_count, 0u);
    EXPECT_EQ(worker.stats().device_bytes, 0u);
  }
  Worker worker;
};

TEST_F(ResidentTest, OnlyDeclaredChangesGoUpAndTheCachesStayOnTheDevice) {
  PinnedAllocator pinned(worker);
  TaskArgs args = make_task(pinned);
  const Tensor& x = args.get("x");
  const Tensor& y = args.get("y");
  const Tensor& acc = args.get("acc");
  ResidentBinder rb(worker, args, with_callable(), false);
  EXPECT_EQ(worker.stats().device_count, 0u);  // nothing before the first step

  Moved before = sim_moved(worker);
  BindReport r1 = rb.step();
  Moved after = sim_moved(worker);
  EXPECT_EQ(r1.step, 1);
  EXPECT_EQ(r1.uploaded_bytes, kX + kW + kAcc);
  EXPECT_EQ(after.h2d - before.h2d, kX + kW + kAcc);  // the backend agrees
  EXPECT_EQ(after.d2h - before.d2h, kX);              // y only: acc stays on the device
  EXPECT_EQ(r1.downloaded_bytes, kX);
  EXPECT_EQ(r1.stayed_count, 0u);

  // Step 2 with nothing declared: nothing goes up, y comes back.
  before = after;
  BindReport r2 = rb.step();
  after = sim_moved(worker);
  EXPECT_EQ(r2.uploaded_count, 0u);
  EXPECT_EQ(r2.uploaded_bytes, 0u);
  EXPECT_EQ(after.h2d - before.h2d, 0u);
  EXPECT_EQ(after.d2h - before.d2h, kX);
  EXPECT_EQ(r2.stayed_count, 3u);
  EXPECT_EQ(r2.stayed_bytes, kX + kW + kAcc);
  EXPECT_EQ(r2.phase(BindPhase::device_alloc), 0.0);  // nothing allocated again
  EXPECT_EQ(worker.stats().device_count, 1u);         // one arena, kept

  // Step 3 after a declared change of x: only x goes up, and y shows it arrived.
  for (uint64_t i = 0; i < kX; ++i) x.data_as<unsigned char>()[i] = 200;
  rb.mark_changed("x");
  before = after;
  BindReport r3 = rb.step();
  after = sim_moved(worker);
  EXPECT_EQ(r3.uploaded_bytes, kX);
  EXPECT_EQ(after.h2d - before.h2d, kX);
  ASSERT_EQ(r3.tensors[0].name, "x");
  EXPECT_TRUE(r3.tensors[0].uploaded());
  EXPECT_TRUE(r3.tensors[1].stayed);
  for (uint64_t i = 0; i < kX; i += 997)
    ASSERT_EQ(y.data_as<unsigned char>()[i], static_cast<unsigned char>(200 + i * 7 + 3)) << i;

  // acc was updated on the device by each of the 3 steps; its host copy was not touched.
  EXPECT_EQ(acc.data_as<unsigned char>()[10], 50);
  rb.download("acc");
  for (uint64_t i = 0; i < kAcc; i += 101)
    ASSERT_EQ(acc.data_as<unsigned char>()[i], static_cast<unsigned char>(i * 5 + 3)) << i;
  // A range lands at its own offset and nowhere else.
  acc.data_as<unsigned char>()[100] = acc.data_as<unsigned char>()[101] = 0;
  rb.download("acc", 101, 1);
  EXPECT_EQ(acc.data_as<unsigned char>()[100], 0);
  EXPECT_EQ(acc.data_as<unsigned char>()[101], static_cast<unsigned char>(101 * 5 + 3));

  EXPECT_EQ(rb.steps(), 3);
  rb.close();
  EXPECT_FALSE(rb.is_open());
  expect_nothing_on_device();
}

TEST_F(ResidentTest, WithoutTheDebugCheckAnUndeclaredWriteNeverReachesTheDevice) {
  PinnedAllocator pinned(worker);
  TaskArgs args = make_task(pinned);
  ResidentBinder rb(worker, args, with_callable(), false);
  rb.step();
  args.get("x").data_as<unsigned char>()[0] = 99;  // not declared
  rb.step();
  EXPECT_EQ(args.get("y").data_as<unsigned char>()[0], 3);  // 0 + w[0]: the old x
}

TEST_F(ResidentTest, TheDebugCheckNamesAnUndeclaredWriteAndMovesNothing) {
  PinnedAllocator pinned(worker);
  TaskArgs args = make_task(pinned);
  ResidentBinder rb(worker, args, with_callable(), true);
  EXPECT_TRUE(rb.check_writes());
  rb.step();
  args.get("w").data_as<unsigned char>()[kW - 1] ^= 1;  // one byte of the big input
  const Moved before = sim_moved(worker);
  const Error e = test::error_of([&] { rb.step(); });
  EXPECT_EQ(e.code(), ErrorCode::mismatch);
  EXPECT_NE(std::string(e.what()).find("IN tensor 'w' changed since its upload at step 1"),
            std::string::npos)
      << e.what();
  EXPECT_NE(std::string(e.what()).find("mark_changed('w')"), std::string::npos);
  const Moved after = sim_moved(worker);
  EXPECT_EQ(after.h2d, before.h2d);
  EXPECT_EQ(after.d2h, before.d2h);
  EXPECT_TRUE(rb.is_open());
  EXPECT_EQ(rb.steps(), 1);
  rb.mark_changed("w");  // declared now: the step goes through and the byte arrives
  const BindReport r = rb.step();
  EXPECT_EQ(r.uploaded_bytes, kW);
  EXPECT_EQ(r.step, 2);
}

// An output fed back as the next step's input on the device: nothing goes up for it, and
// the step computes with the fed bytes.
TEST_F(ResidentTest, AnOutputFedOnTheDeviceIsTheNextStepsInput) {
  PinnedAllocator pinned(worker);
  TaskArgs args = make_task(pinned);
  ResidentBinder rb(worker, args, with_callable(), false);
  EXPECT_EQ(test::error_of([&] { rb.copy_on_device("y", "x"); }).code(),
            ErrorCode::invalid_argument);  // before the first step
  rb.step();                               // y[i] = x[i] + w[i] = i + 7i + 3 (bytewise)
  std::vector<unsigned char> y1(args.get("y").data_as<unsigned char>(),
                                args.get("y").data_as<unsigned char>() + kX);
  const Moved before = sim_moved(worker);
  rb.copy_on_device("y", "x");  // x <- y on the device; the host x stays
  const BindReport r = rb.step();
  EXPECT_EQ(r.uploaded_bytes, 0u);
  EXPECT_EQ(sim_moved(worker).h2d, before.h2d);
  EXPECT_EQ(args.get("x").data_as<unsigned char>()[5], 5);  // the host copy untouched
  for (uint64_t i = 0; i < kX; i += 331)
    ASSERT_EQ(args.get("y").data_as<unsigned char>()[i],
              static_cast<unsigned char>(y1[i] + i * 7 + 3))
        << i;
  EXPECT_NE(
      std::string(test::error_of([&] { rb.copy_on_device("x", "y"); }).what()).find("OUT tensor"),
      std::string::npos);
  EXPECT_NE(std::string(test::error_of([&] { rb.copy_on_device("w", "x"); }).what())
                .find("the same size"),
            std::string::npos);
  EXPECT_EQ(test::error_of([&] { rb.copy_on_device("nope", "x"); }).code(), ErrorCode::not_found);
}

TEST_F(ResidentTest, TheCheckDefaultsToPinstageResidentCheck) {
  PinnedAllocator pinned(worker);
  TaskArgs args = make_task(pinned);
  EXPECT_FALSE(ResidentBinder(worker, args).check_writes());
  ASSERT_EQ(setenv("PINSTAGE_RESIDENT_CHECK", "on", 1), 0);
  EXPECT_TRUE(ResidentBinder(worker, args).check_writes());
  EXPECT_FALSE(ResidentBinder(worker, args, {}, false).check_writes());  // the argument wins
  ASSERT_EQ(setenv("PINSTAGE_RESIDENT_CHECK", "yes", 1), 0);
  EXPECT_EQ(test::error_of([&] { ResidentBinder(worker, args); }).code(),
            ErrorCode::invalid_argument);
  ASSERT_EQ(unsetenv("PINSTAGE_RESIDENT_CHECK"), 0);
}

TEST_F(ResidentTest, BadCallsAreRefusedWithTheirReason) {
  PinnedAllocator pinned(worker);
  ResidentBinder rb(worker, make_task(pinned), with_callable(), false);
  EXPECT_EQ(test::error_of([&] { rb.mark_changed("nope"); }).code(), ErrorCode::not_found);
  const Error out = test::error_of([&] { rb.mark_changed("y"); });
  EXPECT_EQ(out.code(), ErrorCode::invalid_argument);
  EXPECT_NE(std::string(out.what()).find("OUT tensor is never uploaded"), std::string::npos);
  const Error early = test::error_of([&] { rb.download("acc"); });
  EXPECT_NE(std::string(early.what()).find("before the first step"), std::string::npos);
  rb.step();
  for (auto [offset, bytes] : {std::pair<uint64_t, uint64_t>{0, 0}, {kAcc, 1}, {1, kAcc}}) {
    const Error range = test::error_of([&, at = offset, n = bytes] { rb.download("acc", at, n); });
    EXPECT_EQ(range.code(), ErrorCode::invalid_argument) << offset << "+" << bytes;
  }
  rb.close();
  rb.close();  // idempotent
  const Error closed = test::error_of([&] { rb.step(); });
  EXPECT_NE(std::string(closed.what()).find("the binder is closed (close() was called)"),
            std::string::npos)
      << closed.what();
  EXPECT_EQ(test::error_of([&] { rb.mark_changed("x"); }).code(), ErrorCode::invalid_argument);
  expect_nothing_on_device();
  BindOptions bad;
  bad.staging_buffers = 0;
  EXPECT_EQ(test::error_of([&] { ResidentBinder(worker, TaskArgs{}, bad); }).code(),
            ErrorCode::invalid_argument);
}

TEST(ResidentLifetime, ABinderOutlivingItsWorkerIsRefusedCleanly) {
  std::optional<ResidentBinder> rb;
  uint64_t failures = 0;
  {
    Worker worker;
    worker.init("sim");
    PinnedAllocator pinned(worker);
    rb.emplace(worker, make_task(pinned), with_callable(), false);
    rb->step();
    worker.finalize();  // reclaims the arena and the pinned args under the binder
    const Error e = test::error_of([&] { rb->step(); });
    EXPECT_EQ(e.code(), ErrorCode::invalid_argument);
    EXPECT_NE(std::string(e.what()).find("finalized"), std::string::npos) << e.what();
    EXPECT_THROW(rb->download("acc"), Error);
    failures = worker.free_failures();
  }
  EXPECT_EQ(failures, 0u);
  rb->close();  // frees nothing twice: the worker reclaimed it
  rb.reset();
}

TEST_F(ResidentTest, ACorruptedFirstUploadFailsStepOneAndReleasesEverything) {
  PinnedAllocator pinned(worker);
  BindOptions o = with_callable();
  o.verify_upload = true;
  ResidentBinder rb(worker, make_task(pinned), o, false);
  worker.inject_fault(FaultKind::corrupt_h2d, 2);  // w, the second input
  try {
    rb.step();
    FAIL() << "the corrupted upload passed";
  } catch (const BindError& e) {
    EXPECT_EQ(e.phase(), BindPhase::verify);
    EXPECT_EQ(e.tensor(), "w");
    EXPECT_NE(std::string(e.what()).find("resident step 1 failed"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(rb.is_open());
  expect_nothing_on_device();
}

// Every fault kind at every call index of a three-step loop: the failing step names itself,
// nothing stays on the device, the pinned ring and arena are gone, and a new binder on the
// same worker runs.
TEST_F(ResidentTest, FaultSweepLeavesNothingHeld) {
  PinnedAllocator pinned(worker);
  TaskArgs args = make_task(pinned);
  BindOptions o = with_callable();
  o.verify_upload = true;  // takes the staging ring: a pinned allocation to give back
  const uint64_t pinned_before = worker.stats().pinned_count;
  int failures_seen = 0;
  for (FaultKind kind : {FaultKind::device_malloc, FaultKind::copy_h2d, FaultKind::copy_d2h,
                         FaultKind::execute, FaultKind::host_alloc, FaultKind::corrupt_h2d}) {
    for (uint64_t nth = 1; nth <= 12; ++nth) {
      {
        ResidentBinder rb(worker, args, o, false);
        worker.inject_fault(kind, nth);
        try {
          for (int s = 0; s < 3; ++s) {
            rb.mark_changed("x");
            rb.step();
          }
        } catch (const BindError& e) {
          ++failures_seen;
          EXPECT_FALSE(rb.is_open()) << fault_kind_name(kind) << " " << nth;
          EXPECT_NE(std::string(e.what()).find("resident step"), std::string::npos);
          expect_nothing_on_device();
          EXPECT_EQ(worker.stats().pinned_count, pinned_before) << fault_kind_name(kind) << nth;
        }
        worker.inject_fault(kind, 0);
      }
      expect_nothing_on_device();
      EXPECT_EQ(worker.stats().pinned_count, pinned_before);
    }
  }
  EXPECT_GT(failures_seen, 20);
  EXPECT_EQ(worker.stats().free_failures, 0u);
  ResidentBinder again(worker, args, o, false);
  EXPECT_EQ(again.step().uploaded_bytes, kX + kW + kAcc);
}

}  // namespace
}  // namespace pinstage
