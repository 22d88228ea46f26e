// The sim "driver" between host memory and the device pool: copy engines (DMA) paced to
// an optional link rate, and the pinned bounce buffers that pageable copies are staged
// through. docs/worker.md ("sim semantics") says what each stands for.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

#include "pinstage/clock.h"

namespace pinstage::sim {

// Completion of one copy's chunks: the engine counts them, the copying thread waits.
class Transfer {
 public:
  Transfer() = default;
  Transfer(const Transfer&) = delete;
  Transfer& operator=(const Transfer&) = delete;
  // Waits for every submitted chunk, so no engine job outlives it (an early throw).
  ~Transfer();
  void add_one();  // a chunk was queued
  void complete_one();
  void wait_for(size_t chunks);  // until at least `chunks` chunks have completed

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  size_t submitted_ = 0;
  size_t done_ = 0;
};

// One copy engine: a thread that runs DMA chunks (memcpy) in submission order. With a
// link rate each chunk completes no earlier than the link could have carried it.
class DmaEngine {
 public:
  explicit DmaEngine(int64_t link_gbps);
  ~DmaEngine();  // runs what is queued, then joins
  DmaEngine(const DmaEngine&) = delete;
  DmaEngine& operator=(const DmaEngine&) = delete;

  void submit(void* dst, const void* src, size_t bytes, Transfer* transfer);
  double link_wait_seconds() const { return wait_ns_.load() * 1e-9; }

 private:
  struct Job {
    void* dst;
    const void* src;
    size_t bytes;
    Transfer* transfer;
  };
  void loop();
  void run(const Job& job, bool after_idle);

  const double ns_per_byte_;  // 0 = unpaced
  Clock::time_point next_free_{};
  std::atomic<uint64_t> wait_ns_{0};
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job> queue_;
  bool stop_ = false;
  std::thread thread_;  // last: starts after the members it uses exist
};

// One direction of the driver: its engine and its pinned bounce buffers.
class Channel {
 public:
  // `buffers` bounce buffers of `chunk` bytes each, mapped, pre-faulted and mlock'ed.
  Channel(size_t chunk, int buffers, int64_t link_gbps);
  ~Channel();
  Channel(const Channel&) = delete;
  Channel& operator=(const Channel&) = delete;

  // DMA straight between pinned host memory and the device, chunk by chunk.
  void direct(void* dst, const void* src, size_t bytes);
  // Host-to-device from pageable memory: the calling thread copies each chunk into a free
  // bounce buffer while the engine DMAs the previous ones to `dst`.
  void bounce_in(void* dst, const void* src, size_t bytes);
  // Device-to-host into pageable memory: the engine DMAs chunks into bounce buffers
  // ahead while the calling thread copies finished ones out to `dst`.
  void bounce_out(void* dst, const void* src, size_t bytes);

  bool locked() const { return locked_; }
  size_t chunk() const { return chunk_; }
  double link_wait_seconds() const { return engine_.link_wait_seconds(); }

 private:
  size_t chunk_;
  std::vector<char*> buffers_;
  void* map_ = nullptr;
  size_t map_bytes_ = 0;
  bool locked_ = false;
  std::mutex bounce_mu_;  // one pageable copy at a time owns the bounce buffers
  DmaEngine engine_;
};

}  // namespace pinstage::sim
