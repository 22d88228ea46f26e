// StagingRing on sim: bytes bit-exact both ways across wrap-around, buffers reused, copy
// faults surfacing with nothing leaked, misuse refused; and the for_each_chunk loop.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <set>
#include <stdexcept>
#include <utility>
#include <vector>

#include "pinstage/staging_ring.h"
#include "pinstage/worker.h"

namespace pinstage {
namespace {

std::vector<unsigned char> pattern(size_t bytes, size_t salt) {
  std::vector<unsigned char> v(bytes);
  for (size_t j = 0; j < bytes; ++j)
    v[j] = static_cast<unsigned char>((j * 131 + salt * 7 + 1) >> 1);
  return v;
}

// A ring of `count` buffers of `buffer` bytes on a stream of its own, a device buffer of
// `bytes`, and `bytes` of pattern(salt) to move: where the fault tests start.
struct RingSetup {
  RingSetup(Worker& w, size_t count, size_t buffer, size_t bytes, size_t salt)
      : stream(w.create_stream()),
        ring(w, stream, count, buffer),
        dev(w.alloc_device(bytes)),
        src(pattern(bytes, salt)) {}
  Stream stream;
  StagingRing ring;
  DeviceBuffer dev;
  const std::vector<unsigned char> src;
};

class StagingRingTest : public ::testing::Test {
 protected:
  void SetUp() override { worker.init("sim"); }
  void expect_nothing_held() {
    const WorkerStats s = worker.stats();
    EXPECT_EQ(s.pinned_count, 0u);
    EXPECT_EQ(s.pinned_bytes, 0u);
    EXPECT_EQ(s.device_count, 0u);
    EXPECT_EQ(s.device_bytes, 0u);
  }
  Worker worker;
};

TEST(StagingRingChunks, ForEachChunkTilesTheRangeInOrder) {
  std::vector<std::pair<size_t, size_t>> seen;
  auto record = [&](size_t off, size_t len) { seen.emplace_back(off, len); };
  for_each_chunk(10, 4, record);
  EXPECT_EQ(seen, (std::vector<std::pair<size_t, size_t>>{{0, 4}, {4, 4}, {8, 2}}));
  seen.clear();
  for_each_chunk(0, 4, record);
  EXPECT_TRUE(seen.empty());
  for_each_chunk(5, SIZE_MAX, record);  // a chunk larger than anything: one piece
  EXPECT_EQ(seen, (std::vector<std::pair<size_t, size_t>>{{0, 5}}));
}

// Odd sizes, odd offsets, buffers of 1 byte up: every size wraps the ring several times.
TEST_F(StagingRingTest, BytesArriveBitExactAcrossWrapAroundBothWays) {
  Stream stream = worker.create_stream();
  for (size_t count : {size_t{1}, size_t{2}, size_t{3}}) {
    for (size_t buffer : {size_t{1}, size_t{7}, size_t{64}, size_t{1000}}) {
      StagingRing ring(worker, stream, count, buffer);
      for (size_t bytes : {size_t{1}, size_t{5}, size_t{999}, size_t{4097}}) {
        const size_t offset = 3;
        DeviceBuffer dev = worker.alloc_device(bytes + offset + 5);
        const auto src = pattern(bytes, bytes + buffer);
        ring.upload(src.data(), bytes, dev, offset);
        ring.drain();
        std::vector<unsigned char> direct(bytes);
        worker.copy_to_host(direct.data(), dev, offset, bytes);
        ASSERT_EQ(direct, src) << count << " x " << buffer << ", " << bytes << " bytes up";

        std::vector<unsigned char> back(bytes, 0);
        size_t next = 0;  // pieces come in order and tile the range
        ring.readback(dev, offset, bytes, [&](size_t off, const unsigned char* data, size_t len) {
          ASSERT_EQ(off, next);
          ASSERT_LE(len, buffer);
          std::memcpy(back.data() + off, data, len);
          next = off + len;
        });
        ring.drain();
        EXPECT_EQ(next, bytes);
        ASSERT_EQ(back, src) << count << " x " << buffer << ", " << bytes << " bytes back";
      }
    }
  }
  expect_nothing_held();
}

// The ring takes its k buffers once: however many turns, the worker's pinned memory stays
// k x buffer bytes, and advance() cycles through the same k buffers in order.
TEST_F(StagingRingTest, ReusesItsBuffersAndHoldsExactlyKTimesTheBufferSize) {
  Stream stream = worker.create_stream();
  {
    StagingRing ring(worker, stream, 3, 100);
    EXPECT_EQ(ring.buffer_count(), 3u);
    EXPECT_EQ(ring.buffer_bytes(), 100u);
    EXPECT_EQ(ring.pinned_bytes(), 300u);
    EXPECT_EQ(worker.stats().pinned_count, 3u);
    EXPECT_EQ(worker.stats().pinned_bytes, 300u);

    DeviceBuffer dev = worker.alloc_device(10'001);
    const auto src = pattern(10'001, 1);
    for (int round = 0; round < 3; ++round) {  // 101 pieces a round: 33+ turns
      ring.upload(src.data(), src.size(), dev, 0);
      ring.drain();
      EXPECT_EQ(worker.stats().pinned_count, 3u);
      EXPECT_EQ(worker.stats().pinned_bytes, 300u);
    }
    std::vector<void*> order;
    for (int i = 0; i < 7; ++i) {
      order.push_back(ring.advance());
      ring.enqueue_to_device(dev, 0, 1);
    }
    ring.drain();
    EXPECT_EQ(std::set<void*>(order.begin(), order.end()).size(), 3u);
    for (size_t i = 3; i < order.size(); ++i) EXPECT_EQ(order[i], order[i - 3]) << i;
  }
  expect_nothing_held();
}

// A failing copy surfaces as the worker's Error; after reset() the ring works again, and
// once ring and memory are gone the worker holds nothing.
TEST_F(StagingRingTest, InjectedCopyFaultSurfacesAndLeaksNothing) {
  {
    RingSetup setup(worker, 2, 64, 1000, 2);
    auto& [stream, ring, dev, src] = setup;

    worker.inject_fault(FaultKind::copy_h2d, 5);  // the 5th of 16 pieces
    try {
      ring.upload(src.data(), src.size(), dev, 0);
      ring.drain();
      FAIL() << "the injected upload fault did not surface";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::injected_fault) << e.what();
    }
    ring.reset();
    ring.upload(src.data(), src.size(), dev, 0);
    ring.drain();

    worker.inject_fault(FaultKind::copy_d2h, 3);
    int arrived = 0;
    try {
      ring.readback(dev, 0, src.size(), [&](size_t, const unsigned char*, size_t) { ++arrived; });
      ring.drain();
      FAIL() << "the injected read-back fault did not surface";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::injected_fault) << e.what();
    }
    EXPECT_LT(arrived, 16);
    ring.reset();
    std::vector<unsigned char> back(src.size());
    ring.readback(dev, 0, src.size(), [&](size_t off, const unsigned char* data, size_t len) {
      std::memcpy(back.data() + off, data, len);
    });
    ring.drain();
    EXPECT_EQ(back, src);  // uploaded intact after the failed attempt
  }
  expect_nothing_held();

  // A buffer that cannot be allocated: the constructor throws and keeps nothing. Buffers
  // of 2 MiB from an emptied pool each map a segment, so the third is a backend call.
  Stream stream = worker.create_stream();
  worker.empty_cache();
  worker.inject_fault(FaultKind::host_alloc, 3);
  EXPECT_THROW(StagingRing(worker, stream, 4, size_t{2} << 20), Error);
  expect_nothing_held();
}

// An arrival callback that throws stops drain(); the pieces still pending are dropped,
// not handed to anyone later, and the ring goes on working.
TEST_F(StagingRingTest, AThrowingArrivalDropsThePendingOnes) {
  RingSetup setup(worker, 4, 10, 40, 3);
  auto& [stream, ring, dev, src] = setup;
  worker.copy_to_device(dev, 0, src.data(), src.size());
  int calls = 0;
  auto throw_on_second = [&](size_t, const unsigned char*, size_t) {
    if (++calls == 2) throw std::runtime_error("mismatch");
  };
  ring.readback(dev, 0, 40, throw_on_second);  // 4 pieces, all pending: none arrived yet
  EXPECT_EQ(calls, 0);
  EXPECT_THROW(ring.drain(), std::runtime_error);
  EXPECT_EQ(calls, 2);
  ring.drain();  // nothing left to hand out
  EXPECT_EQ(calls, 2);
  ring.upload(src.data(), 40, dev, 0);
  ring.drain();
  EXPECT_EQ(calls, 2);
}

TEST_F(StagingRingTest, MisuseIsRefused) {
  Stream stream = worker.create_stream();
  auto code_of = [](auto&& fn) {
    try {
      fn();
    } catch (const Error& e) {
      return e.code();
    }
    return ErrorCode::internal;
  };
  EXPECT_EQ(code_of([&] { StagingRing(worker, stream, 0, 8); }), ErrorCode::invalid_argument);
  EXPECT_EQ(code_of([&] { StagingRing(worker, stream, 2, 0); }), ErrorCode::invalid_argument);
  Worker idle;
  EXPECT_EQ(code_of([&] { StagingRing(idle, stream, 2, 8); }), ErrorCode::invalid_argument);

  StagingRing ring(worker, stream, 2, 8);
  DeviceBuffer dev = worker.alloc_device(64);
  EXPECT_EQ(code_of([&] { ring.enqueue_to_device(dev, 0, 8); }), ErrorCode::invalid_argument);
  ring.advance();
  EXPECT_EQ(code_of([&] { ring.enqueue_to_device(dev, 0, 9); }), ErrorCode::invalid_argument);
  ring.enqueue_to_device(dev, 0, 8);
  EXPECT_EQ(code_of([&] { ring.enqueue_to_host(dev, 0, 8, nullptr); }),
            ErrorCode::invalid_argument);  // one copy per advance()
  ring.drain();
  EXPECT_EQ(worker.stats().pinned_count, 2u);
}

}  // namespace
}  // namespace pinstage
