// The sim driver (src/backends/sim/dma.h): pageable copies staged through pinned bounce
// buffers, pinned ones DMA'd directly, both bit-exact at odd sizes, offsets and chunk
// boundaries, in stream order, with the fault hook working on both paths; and the strict
// parsing of the backend options (src/backends/sim/sim_config.h).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "backends/sim/dma.h"
#include "backends/sim/sim_config.h"
#include "backends/sim/stream.h"
#include "extension_test_util.h"
#include "lock_test_util.h"
#include "pinstage/backend/sim_ext.h"
#include "pinstage/error.h"
#include "pinstage/parallel.h"
#include "pinstage/worker.h"
#include "tensor_test_util.h"

namespace pinstage {
namespace {

using test::error_of;
using test::pattern;

constexpr size_t kChunk = 4096;  // small chunks: many boundaries in small copies
constexpr size_t kDevice = 1 << 20;

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

class SimDriver : public ::testing::Test {
 protected:
  void SetUp() override { init({{"bounce_chunk", "4K"}, {"bounce_buffers", "3"}}); }
  void init(const BackendConfig& config) {
    owned.reset();  // the previous worker first: its locked memory goes
    owned = std::make_unique<Worker>();
    WorkerOptions options;
    options.device_capacity_bytes = 64 << 20;
    options.config = config;
    owned->init("sim", 0, options);
  }
  Worker& w() { return *owned; }
  ps_sim_stats stats() { return test::sim_stats(w()); }
  // The device bytes as they are (sim device memory is host memory).
  const unsigned char* device_bytes(const DeviceBuffer& dev) {
    return static_cast<const unsigned char*>(dev.data());
  }
  std::unique_ptr<Worker> owned;
};

// Sizes around the 4 KiB chunk and the 3-buffer ring, at device offsets that are not
// aligned; the bytes around the copied range must stay as they were.
const size_t kSizes[] = {1, 4095, 4096, 4097, 3 * 4096, 3 * 4096 + 1, 7 * 4096 - 1, 300'001};
const size_t kOffsets[] = {0, 1, 255, 4095};

TEST_F(SimDriver, PageableUploadAndDownloadAreBitExactAroundChunkBoundaries) {
  DeviceBuffer dev = w().alloc_device(kDevice);
  for (size_t size : kSizes) {
    for (size_t off : kOffsets) {
      SCOPED_TRACE("size " + std::to_string(size) + " offset " + std::to_string(off));
      std::memset(dev.data(), 0xee, kDevice);
      const auto src = pattern(size + 3, static_cast<unsigned>(size + off));
      w().copy_to_device(dev, off, src.data() + 3, size);  // odd host address too
      ASSERT_EQ(std::memcmp(device_bytes(dev) + off, src.data() + 3, size), 0);
      if (off > 0) ASSERT_EQ(device_bytes(dev)[off - 1], 0xee);
      ASSERT_EQ(device_bytes(dev)[off + size], 0xee);
      std::vector<unsigned char> back(size + 5, 0x11);
      w().copy_to_host(back.data() + 3, dev, off, size);
      ASSERT_EQ(std::memcmp(back.data() + 3, src.data() + 3, size), 0);
      ASSERT_EQ(back[2], 0x11);
      ASSERT_EQ(back[size + 3], 0x11);
    }
  }
  const ps_sim_stats s = stats();
  const uint64_t n = std::size(kSizes) * std::size(kOffsets);
  EXPECT_EQ(s.h2d_bounced_count, n);
  EXPECT_EQ(s.d2h_bounced_count, n);
  EXPECT_EQ(s.h2d_direct_count + s.d2h_direct_count, 0u);
}

TEST_F(SimDriver, PinnedCopiesAreDmaedDirectlyAndBitExact) {
  DeviceBuffer dev = w().alloc_device(kDevice);
  PinnedHostBuffer pinned = w().alloc_pinned_host(kDevice);
  auto* host = static_cast<unsigned char*>(pinned.data());
  uint64_t bytes = 0;
  for (size_t size : kSizes) {
    const auto src = pattern(size, static_cast<unsigned>(size));
    std::memcpy(host + 7, src.data(), size);  // a range inside the pinned buffer
    w().copy_to_device(dev, 1, host + 7, size);
    ASSERT_EQ(std::memcmp(device_bytes(dev) + 1, src.data(), size), 0) << size;
    std::memset(host, 0, kDevice);
    w().copy_to_host(host + 5, dev, 1, size);
    ASSERT_EQ(std::memcmp(host + 5, src.data(), size), 0) << size;
    ASSERT_EQ(host[4], 0);
    ASSERT_EQ(host[5 + size], 0);
    bytes += size;
  }
  const ps_sim_stats s = stats();
  EXPECT_EQ(s.h2d_direct_count, std::size(kSizes));
  EXPECT_EQ(s.d2h_direct_count, std::size(kSizes));
  EXPECT_EQ(s.h2d_direct_bytes, bytes);
  EXPECT_EQ(s.d2h_direct_bytes, bytes);
  EXPECT_EQ(s.h2d_bounced_count + s.d2h_bounced_count, 0u);
}

// The copy engine's workers (dma_threads): 256 KiB chunks split into up to four 64 KiB
// slices, at sizes and offsets that cut slices, chunks and cache lines anywhere.
TEST_F(SimDriver, CopiesAreBitExactWithOneTwoAndThreeDmaThreads) {
  const size_t sizes[] = {1,
                          63,
                          65,
                          (64 << 10) + 1,
                          (128 << 10) - 1,
                          (192 << 10) + 63,
                          (256 << 10) + 7,
                          (3 << 20) + 13};
  for (const char* threads : {"1", "2", "3"}) {
    SCOPED_TRACE(std::string("dma_threads=") + threads);
    init({{"bounce_chunk", "256K"}, {"dma_threads", threads}});
    ASSERT_EQ(stats().dma_threads, std::stoi(threads));
    DeviceBuffer dev = w().alloc_device(4 << 20);
    PinnedHostBuffer pinned = w().alloc_pinned_host(4 << 20);
    auto* host = static_cast<unsigned char*>(pinned.data());
    for (size_t size : sizes) {
      for (size_t offset : {size_t{0}, size_t{1}, size_t{4095}}) {
        SCOPED_TRACE(std::to_string(size) + " at " + std::to_string(offset));
        const auto src = pattern(size, static_cast<unsigned>(size + offset));
        std::memset(dev.data(), 0xee, 4 << 20);
        std::memcpy(host + 3, src.data(), size);
        w().copy_to_device(dev, offset, host + 3, size);  // direct
        ASSERT_EQ(std::memcmp(device_bytes(dev) + offset, src.data(), size), 0);
        if (offset > 0) {
          ASSERT_EQ(device_bytes(dev)[offset - 1], 0xee);
        }
        ASSERT_EQ(device_bytes(dev)[offset + size], 0xee);
        std::memset(host, 0, 4 << 20);
        w().copy_to_host(host + 1, dev, offset, size);  // direct
        ASSERT_EQ(std::memcmp(host + 1, src.data(), size), 0);
        ASSERT_EQ(host[0], 0);
        ASSERT_EQ(host[1 + size], 0);
        std::vector<unsigned char> back(size + 2, 0);          // pageable: bounced, the engine's
        w().copy_to_host(back.data() + 1, dev, offset, size);  // slices into the bounce
        ASSERT_EQ(std::memcmp(back.data() + 1, src.data(), size), 0);
        ASSERT_EQ(back[0] | back[size + 1], 0);
      }
    }
  }
}

// What the engine recorded: each of its three workers copied exactly its 64 KiB slice of
// every 192 KiB chunk, both ways; a chunk too small to split is carried by one worker.
TEST_F(SimDriver, EveryDmaThreadCarriesItsSliceOfEachChunk) {
  init({{"bounce_chunk", "192K"}, {"dma_threads", "3"}});
  DeviceBuffer dev = w().alloc_device(1 << 20);
  PinnedHostBuffer pinned = w().alloc_pinned_host(1 << 20);
  std::memset(pinned.data(), 0x5a, 1 << 20);
  w().copy_to_device(dev, 0, pinned.data(), 4 * (192 << 10));  // four chunks
  w().copy_to_host(pinned.data(), dev, 0, 2 * (192 << 10));    // two chunks
  ps_sim_stats s = stats();
  ASSERT_EQ(s.dma_threads, 3);
  for (int t = 0; t < 3; ++t) {
    EXPECT_EQ(s.h2d_dma_thread_bytes[t], 4u * (64 << 10)) << "worker " << t;
    EXPECT_EQ(s.d2h_dma_thread_bytes[t], 2u * (64 << 10)) << "worker " << t;
  }
  for (int t = 3; t < PS_SIM_DMA_THREADS_MAX; ++t)
    EXPECT_EQ(s.h2d_dma_thread_bytes[t] + s.d2h_dma_thread_bytes[t], 0u) << t;
  w().copy_to_device(dev, 0, pinned.data(), (64 << 10) - 1);  // under two slices: one worker
  s = stats();
  EXPECT_EQ(s.h2d_dma_thread_bytes[0], 4u * (64 << 10) + (64 << 10) - 1);
  EXPECT_EQ(s.h2d_dma_thread_bytes[1], 4u * (64 << 10));
  EXPECT_EQ(s.h2d_staged_bytes + s.d2h_staged_bytes, 0u) << "pinned copies stage nothing";
}

// A pageable copy moves through the bounce buffers once: the calling thread stages each
// byte exactly once, and the engine's workers carry each byte once between the bounce
// buffers and the device.
TEST_F(SimDriver, PageableCopiesTakeExactlyOneStagingPass) {
  init({{"bounce_chunk", "128K"}, {"bounce_buffers", "2"}, {"dma_threads", "2"}});
  DeviceBuffer dev = w().alloc_device(1 << 20);
  const size_t up = 5 * (128 << 10) + 4097, down = 3 * (128 << 10) + 1;
  const auto src = pattern(up, 3);
  w().copy_to_device(dev, 0, src.data(), up);
  std::vector<unsigned char> back(down);
  w().copy_to_host(back.data(), dev, 0, down);
  ASSERT_EQ(std::memcmp(back.data(), src.data(), down), 0);
  const ps_sim_stats s = stats();
  EXPECT_EQ(s.h2d_staged_bytes, up);
  EXPECT_EQ(s.d2h_staged_bytes, down);
  EXPECT_EQ(s.h2d_dma_thread_bytes[0] + s.h2d_dma_thread_bytes[1], up);
  EXPECT_EQ(s.d2h_dma_thread_bytes[0] + s.d2h_dma_thread_bytes[1], down);
  EXPECT_GT(s.h2d_dma_thread_bytes[1], 0u) << "the engine's second worker took its slices";
  EXPECT_EQ(s.h2d_bounced_bytes, up);
  EXPECT_EQ(s.h2d_direct_count + s.d2h_direct_count, 0u);
}

// ---- a stream's pinned copies in flight (sim::Stream::push_direct) ----

void* at(uintptr_t address) { return reinterpret_cast<void*>(address); }

// A stream whose first task is a pinned upload writing [0x10000, 0x11000) with one chunk
// in flight that lands only when the test says (a latch, not an engine's timing); `second`
// queues what follows and returns a future of whether the first had landed when it ran.
// True when it ran before that chunk landed: it is given `window` to do so, then the chunk
// lands. What must wait gets 200 ms (a loaded machine can only hide a bug, not fail a
// correct stream); what must not wait gets as long as it takes (it returns when it runs).
bool runs_before_the_first_lands(
    const std::function<std::future<bool>(sim::Stream&, const std::atomic<bool>&)>& second,
    std::chrono::milliseconds window = std::chrono::milliseconds(200)) {
  sim::StreamGate gate;
  sim::Stream stream(&gate, [] { return "a task failed"; });
  std::promise<sim::Transfer*> chunk;
  std::atomic<bool> landed{false};
  stream.push_direct(true, at(0x10000), 0x1000, [&](sim::Transfer& t, size_t& chunks) {
    t.add_one();
    ++chunks;
    chunk.set_value(&t);
    return PS_OK;
  });
  sim::Transfer* first = chunk.get_future().get();
  std::future<bool> ran = second(stream, landed);  // after the first started: the thread
                                                   // may already be idle, its chunk in flight
  (void)ran.wait_for(window);
  landed = true;
  first->complete_one();
  return !ran.get();
}

// A pinned copy after it: the future of the value of `landed` when its start ran.
std::function<std::future<bool>(sim::Stream&, const std::atomic<bool>&)> pinned_copy(
    bool up, uintptr_t dst) {
  return [=](sim::Stream& stream, const std::atomic<bool>& landed) {
    auto ran = std::make_shared<std::promise<bool>>();
    stream.push_direct(up, at(dst), 0x1000, [ran, &landed](sim::Transfer&, size_t&) {
      ran->set_value(landed.load());
      return PS_OK;
    });
    return ran->get_future();
  };
}

TEST(SimStream, APinnedCopyTheSameWayIntoOtherBytesGoesWithoutWaiting) {
  EXPECT_TRUE(runs_before_the_first_lands(pinned_copy(true, 0x20000), std::chrono::minutes(2)));
}

TEST(SimStream, WhatMustComeAfterTheFirstCopysBytesWaitsForThem) {
  EXPECT_FALSE(runs_before_the_first_lands(pinned_copy(true, 0x10800)))
      << "a copy into bytes the first one writes";
  EXPECT_FALSE(runs_before_the_first_lands(pinned_copy(false, 0x20000)))
      << "a copy the other way (the other engine)";
  EXPECT_FALSE(runs_before_the_first_lands([](sim::Stream& stream, const std::atomic<bool>& l) {
    auto ran = std::make_shared<std::promise<bool>>();
    stream.push([ran, &l] {
      ran->set_value(l.load());
      return PS_OK;
    });
    return ran->get_future();
  })) << "work of another kind (a pageable copy, a device copy or fill, an event)";
  EXPECT_FALSE(runs_before_the_first_lands([](sim::Stream& stream, const std::atomic<bool>& l) {
    return std::async(std::launch::async, [&stream, &l] {
      std::string error;
      EXPECT_EQ(stream.sync(&error), PS_OK);
      return l.load();
    });
  })) << "a sync";
}

// Through the worker: pinned uploads queued back to back, one overwriting another's bytes
// and a pinned download of them (the other engine) after, with chunks split across three
// DMA threads; every byte is the last upload's.
TEST_F(SimDriver, QueuedPinnedCopiesKeepTheStreamsOrder) {
  init({{"bounce_chunk", "256K"}, {"dma_threads", "3"}});
  const size_t n = 1 << 20;
  DeviceBuffer dev = w().alloc_device(n);
  PinnedHostBuffer up_buffer = w().alloc_pinned_host(3 * n);
  PinnedHostBuffer down_buffer = w().alloc_pinned_host(n);
  auto* up = static_cast<unsigned char*>(up_buffer.data());
  auto* down = static_cast<unsigned char*>(down_buffer.data());
  for (unsigned k = 0; k < 3; ++k) std::memcpy(up + k * n, pattern(n, k + 5).data(), n);
  Stream stream = w().create_stream();
  for (size_t piece = 0; piece < 16; ++piece)  // the first pattern, in 16 copies
    w().copy_to_device_async(dev, piece * n / 16, up + piece * n / 16, n / 16, stream);
  w().copy_to_device_async(dev, 0, up + n, n, stream);  // all of it again: the second
  w().copy_to_device_async(dev, n / 3, up + 2 * n + n / 3, n / 3, stream);  // part: the third
  w().copy_to_host_async(down, dev, 0, n, stream);
  w().synchronize(stream);
  std::vector<unsigned char> want(up + n, up + 2 * n);
  std::memcpy(want.data() + n / 3, up + 2 * n + n / 3, n / 3);
  EXPECT_EQ(std::memcmp(down, want.data(), n), 0);
  EXPECT_EQ(stats().h2d_direct_count, 18u);
  EXPECT_EQ(stats().d2h_direct_count, 1u);
}

// The slices of a chunk tile it exactly, in order, cut at 64-byte boundaries.
TEST(SimDmaSlices, SlicesTileEveryChunk) {
  for (size_t bytes :
       {size_t{1}, size_t{64}, size_t{65} << 10, size_t{1} << 20, (size_t{1} << 30) + 12345}) {
    for (size_t threads : {1, 2, 3, 7, 64}) {
      const size_t slices = sim::DmaEngine::slice_count(bytes, threads);
      ASSERT_GE(slices, 1u);
      ASSERT_LE(slices, threads);
      ASSERT_LE(slices, std::max<size_t>(1, bytes / sim::DmaEngine::kMinSlice));
      size_t prev = 0;
      for (size_t w = 1; w <= threads; ++w) {
        const size_t b = sim::DmaEngine::slice_begin(bytes, slices, w);
        ASSERT_GE(b, prev) << bytes << "/" << threads;
        if (w < slices) {
          ASSERT_EQ(b % 64, 0u);
          ASSERT_GT(b, prev) << "no empty slice";
        }
        prev = b;
      }
      ASSERT_EQ(prev, bytes) << "the last slice ends at the chunk's end";
    }
  }
}

TEST_F(SimDriver, OnlyThisWorkersPinnedMemoryIsDirect) {
  DeviceBuffer dev = w().alloc_device(4096);
  Worker other;
  other.init("sim");
  PinnedHostBuffer theirs = other.alloc_pinned_host(4096);
  std::memset(theirs.data(), 0x42, 4096);
  w().copy_to_device(dev, 0, theirs.data(), 4096);
  EXPECT_EQ(stats().h2d_bounced_count, 1u);  // pinned by another context: staged
  PinnedHostBuffer mine = w().alloc_pinned_host(4096);
  void* address = mine.data();
  w().copy_to_device(dev, 0, address, 4096);
  EXPECT_EQ(stats().h2d_direct_count, 1u) << "a live block of this worker is direct";
  mine.reset();  // freed: no longer pinned for copies, though its segment stays cached
  std::vector<unsigned char> pageable(4096, 1);
  w().copy_to_device(dev, 0, pageable.data(), 4096);
  EXPECT_EQ(stats().h2d_bounced_count, 2u);
  // The freed range itself: still mapped (the pool keeps the segment) but no block of
  // this worker any more, so a copy from it is staged, not handed to the engine.
  ASSERT_GE(w().host_memory_stats().cached_bytes, 4096u) << "the segment stays cached";
  w().copy_to_device(dev, 0, address, 4096);
  EXPECT_EQ(stats().h2d_bounced_count, 3u);
  EXPECT_EQ(stats().h2d_direct_count, 1u);
}

TEST_F(SimDriver, AsyncCopiesOnBothPathsKeepStreamOrder) {
  DeviceBuffer dev = w().alloc_device(kDevice);
  PinnedHostBuffer pinned = w().alloc_pinned_host(kDevice);
  const size_t size = 5 * kChunk + 17;
  const auto a = pattern(size, 1), b = pattern(size, 2);
  std::vector<unsigned char> got_a(size), got_b(size);
  Stream stream = w().create_stream();
  Event done = w().create_event();
  // upload a (pageable) -> download -> upload b (pinned) -> download: each sees the last.
  w().copy_to_device_async(dev, 3, a.data(), size, stream);
  w().copy_to_host_async(got_a.data(), dev, 3, size, stream);
  std::memcpy(pinned.data(), b.data(), size);
  w().copy_to_device_async(dev, 3, pinned.data(), size, stream);
  w().copy_to_host_async(got_b.data(), dev, 3, size, stream);
  w().record(done, stream);
  w().wait(done);
  EXPECT_EQ(got_a, a);
  EXPECT_EQ(got_b, b);
  const ps_sim_stats s = stats();
  EXPECT_EQ(s.h2d_bounced_count, 1u);
  EXPECT_EQ(s.h2d_direct_count, 1u);
  EXPECT_EQ(s.d2h_bounced_count, 2u);
}

// ABI v5 on sim: async device-to-device copies and fills are queued on the stream's
// thread (held by the sim.hold_streams latch, nothing has landed), run in order once it
// opens, and take neither engine (device memory is host RAM; no copy is counted).
TEST_F(SimDriver, AsyncDeviceCopiesAndFillsAreQueuedOnTheStream) {
  DeviceBuffer a = w().alloc_device(4096), b = w().alloc_device(4096);
  const auto want = pattern(4096, 8);
  w().copy_to_device(a, 0, want.data(), 4096);
  w().fill_device(b, 0, 0x10, 4096);
  const ps_sim_stats before = stats();
  auto hold =
      reinterpret_cast<ps_sim_hold_streams_fn>(w().backend_extension(PS_SIM_HOLD_STREAMS_NAME));
  ASSERT_NE(hold, nullptr);
  Stream stream = w().create_stream();
  ASSERT_EQ(hold(w().native_context(), 1), PS_OK);
  w().copy_on_device_async(b, 0, a, 0, 4096, stream);
  w().fill_device_async(b, 100, 0xee, 10, stream);
  EXPECT_EQ(device_bytes(b)[0], 0x10);  // still queued behind the latch
  EXPECT_EQ(device_bytes(b)[100], 0x10);
  ASSERT_EQ(hold(w().native_context(), 0), PS_OK);
  w().synchronize(stream);
  std::vector<unsigned char> expect = want;
  std::fill_n(expect.begin() + 100, 10, 0xee);
  EXPECT_EQ(std::memcmp(device_bytes(b), expect.data(), 4096), 0);
  const ps_sim_stats after = stats();
  EXPECT_EQ(after.h2d_direct_count + after.h2d_bounced_count,
            before.h2d_direct_count + before.h2d_bounced_count);
  EXPECT_EQ(after.d2h_direct_count + after.d2h_bounced_count,
            before.d2h_direct_count + before.d2h_bounced_count);
}

TEST_F(SimDriver, ConcurrentPageableCopiesShareTheBounceBuffersSafely) {
  DeviceBuffer dev = w().alloc_device(kDevice);
  std::vector<std::thread> threads;
  std::vector<int> ok(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      const size_t part = kDevice / 4, size = part - 13;
      const auto src = pattern(size, static_cast<unsigned>(t));
      std::vector<unsigned char> back(size);
      for (int round = 0; round < 5; ++round) {
        w().copy_to_device(dev, t * part, src.data(), size);
        w().copy_to_host(back.data(), dev, t * part, size);
      }
      ok[t] = back == src;
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(ok, std::vector<int>(4, 1));
}

TEST_F(SimDriver, FaultsWorkOnBothPaths) {
  DeviceBuffer dev = w().alloc_device(kDevice);
  PinnedHostBuffer pinned = w().alloc_pinned_host(3 * kChunk);
  std::vector<unsigned char> pageable(3 * kChunk, 0);
  for (void* host : {static_cast<void*>(pageable.data()), pinned.data()}) {
    std::memset(host, 0, 3 * kChunk);
    w().inject_fault(FaultKind::copy_h2d, 1);
    EXPECT_EQ(error_of([&] { w().copy_to_device(dev, 0, host, 3 * kChunk); }).code(),
              ErrorCode::injected_fault);
    w().inject_fault(FaultKind::copy_d2h, 1);
    EXPECT_EQ(error_of([&] { w().copy_to_host(host, dev, 0, 3 * kChunk); }).code(),
              ErrorCode::injected_fault);
    // corrupt_h2d: the upload succeeds, then the middle byte is flipped, sync and async.
    w().inject_fault(FaultKind::corrupt_h2d, 1);
    w().copy_to_device(dev, 0, host, 3 * kChunk);
    EXPECT_EQ(device_bytes(dev)[3 * kChunk / 2], 0x40);
    w().inject_fault(FaultKind::corrupt_h2d, 2);
    Stream stream = w().create_stream();
    w().copy_to_device_async(dev, 0, host, 3 * kChunk, stream);  // clean: restores it
    w().copy_to_device_async(dev, 0, host, 3 * kChunk, stream);
    w().synchronize(stream);
    EXPECT_EQ(device_bytes(dev)[3 * kChunk / 2], 0x40);
    EXPECT_EQ(device_bytes(dev)[3 * kChunk / 2 + 1], 0);
  }
}

uint64_t locked_kib() { return test::vmlck_bytes() / 1024; }

TEST_F(SimDriver, OptionsShapeTheDriverAndTheBounceBuffersAreLocked) {
  owned.reset();
  const uint64_t before = locked_kib();
  init({{"bounce_chunk", "64K"}, {"bounce_buffers", "4"}, {"link_gbps", "55"}});
  const ps_sim_stats s = stats();
  EXPECT_EQ(s.bounce_chunk_bytes, 64u << 10);
  EXPECT_EQ(s.bounce_buffers, 4);
  EXPECT_EQ(s.link_gbps, 55);
  if (!test::kVmLckTracksMlock) GTEST_SKIP() << "sanitizer build: mlock is a no-op, VmLck stays 0";
  if (s.bounce_locked == 1) {  // two directions x 4 buffers x 64 KiB, really locked
    EXPECT_GE(locked_kib() - before, 2u * 4 * 64);
  } else {
    GTEST_SKIP() << "mlock refused here (RLIMIT_MEMLOCK): bounce buffers unlocked";
  }
  init({});  // the documented defaults
  const ps_sim_stats d = stats();
  EXPECT_EQ(d.bounce_chunk_bytes, 2u << 20);
  EXPECT_EQ(d.bounce_buffers, 2);
  EXPECT_EQ(d.link_gbps, 0);
  EXPECT_EQ(d.dma_threads, std::min(default_thread_count(), PS_SIM_DMA_THREADS_MAX));
}

TEST_F(SimDriver, PacedCopiesStayBitExact) {
  init({{"bounce_chunk", "4K"}, {"link_gbps", "1"}});
  DeviceBuffer dev = w().alloc_device(kDevice);
  const auto src = pattern(kDevice - 1, 9);
  std::vector<unsigned char> back(src.size());
  w().copy_to_device(dev, 1, src.data(), src.size());
  w().copy_to_host(back.data(), dev, 1, back.size());
  EXPECT_EQ(back, src);
}

TEST(SimOptions, BadOptionsAreRefusedNamingTheKey) {
  // Each bad value of a known key alone: refused as KEY='VALUE' is not valid.
  const std::pair<const char*, std::vector<const char*>> bad_values[] = {
      {"bounce_chunk", {"2X", "1K", "2G", "0"}},
      {"bounce_buffers", {"0", "65", " 2"}},
      {"link_gbps", {"-1", "55.5", "10001", ""}},
      {"dma_threads", {"0", "65", "0x2"}}};
  std::vector<std::pair<BackendConfig, std::string>> cases = {
      {{{"bounce_chnk", "2M"}}, "unknown key 'bounce_chnk'"}};
  for (const auto& [key, values] : bad_values)
    for (const char* v : values)
      cases.push_back({{{key, v}}, std::string(key) + "='" + v + "' is not valid"});
  for (const auto& [config, message] : cases) {
    SCOPED_TRACE(message);
    Worker worker;
    WorkerOptions options;
    options.config = config;
    const Error e = error_of([&] { worker.init("sim", 0, options); });
    EXPECT_EQ(e.code(), ErrorCode::invalid_argument);
    EXPECT_TRUE(contains(e.what(), message)) << e.what();
    EXPECT_FALSE(worker.initialized());
  }
}

TEST(SimOptions, TheParserRefusesRepeatsAndNulls) {
  const ps_config_entry twice[] = {{"link_gbps", "1"}, {"link_gbps", "2"}};
  Error e = error_of([&] { sim::parse_config(twice); });
  EXPECT_EQ(e.code(), ErrorCode::invalid_argument);
  EXPECT_TRUE(contains(e.what(), "key 'link_gbps' is given twice")) << e.what();
  const ps_config_entry null_value[] = {{"link_gbps", nullptr}};
  e = error_of([&] { sim::parse_config(null_value); });
  EXPECT_TRUE(contains(e.what(), "NULL value")) << e.what();
  const ps_config_entry good[] = {{"bounce_chunk", "1M"}, {"bounce_buffers", "3"}};
  const sim::SimConfig c = sim::parse_config(good);
  EXPECT_EQ(c.bounce_chunk, 1u << 20);
  EXPECT_EQ(c.bounce_buffers, 3);
  EXPECT_EQ(c.link_gbps, 0);
}

}  // namespace
}  // namespace pinstage
