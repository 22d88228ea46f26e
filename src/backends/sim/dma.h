// The sim "driver" between host memory and the device pool: copy engines (DMA) paced to
// an optional link rate, and the pinned bounce buffers that pageable copies are staged
// through. docs/worker.md ("sim semantics") says what each stands for.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "pinstage/backend/sim_ext.h"
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
  size_t wanted_ = SIZE_MAX;  // the count the waiter waits for (none: no wake-ups)
};

// One copy engine: `threads` workers that run DMA chunks in submission order, each
// chunk split across them (worker w copies the w-th slice of every chunk, a DMA channel
// striping a transfer), so a direct copy moves at the host's all-core copy rate, as a
// card's engines move bytes faster than one core can. With a link rate each chunk
// completes no earlier than the link could have carried it.
class DmaEngine {
 public:
  // Most workers an engine runs (the dma_threads option's bound).
  static constexpr int kMaxThreads = PS_SIM_DMA_THREADS_MAX;
  // Smallest slice a worker copies: a smaller chunk is split across fewer workers.
  static constexpr size_t kMinSlice = size_t{64} << 10;

  DmaEngine(int64_t link_gbps, int threads);
  ~DmaEngine();  // runs what is queued, then joins
  DmaEngine(const DmaEngine&) = delete;
  DmaEngine& operator=(const DmaEngine&) = delete;

  void submit(void* dst, const void* src, size_t bytes, Transfer* transfer);
  double link_wait_seconds() const { return wait_ns_.load() * 1e-9; }
  int threads() const { return static_cast<int>(workers_.size()); }
  // Bytes worker w has copied, over the engine's life: what proves the split.
  uint64_t thread_bytes(int w) const { return thread_bytes_[static_cast<size_t>(w)].load(); }

  // Slice w of `slices` of a chunk of `bytes`: [begin, end), cut at 64-byte boundaries.
  static size_t slice_begin(size_t bytes, size_t slices, size_t w);
  static size_t slice_count(size_t bytes, size_t threads);

 private:
  struct Job {
    void* dst;
    const void* src;
    size_t bytes;
    size_t slices;  // workers that copy part of it; the others only pass it
    Transfer* transfer;
    Clock::time_point deadline{};  // when the link has carried it (paced engines)
    std::atomic<size_t> left{0};   // workers still to finish it
    size_t taken = 0;              // workers that have passed it (under mu_)
  };
  void loop(size_t w);
  void start(Job& job);  // under mu_
  void finish(Job& job);
  void stop_workers();

  const double ns_per_byte_;  // 0 = unpaced
  Clock::time_point next_free_{};
  size_t in_flight_ = 0;   // jobs started and not completed (under mu_)
  size_t unstarted_ = 0;   // jobs queued that no worker has passed yet (under mu_)
  bool link_idle_ = true;  // nothing was queued when the last job completed (under mu_)
  std::atomic<uint64_t> wait_ns_{0};
  std::unique_ptr<std::atomic<uint64_t>[]> thread_bytes_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Job>> queue_;  // jobs not yet passed by every worker
  uint64_t front_seq_ = 0;                  // sequence number of queue_.front()
  bool stop_ = false;
  std::vector<std::thread> workers_;  // last: start after the members they use exist
};

// One direction of the driver: its engine and its pinned bounce buffers.
class Channel {
 public:
  // `buffers` bounce buffers of `chunk` bytes each, mapped, pre-faulted and mlock'ed, and
  // an engine of `dma_threads` workers.
  Channel(size_t chunk, int buffers, int64_t link_gbps, int dma_threads);
  ~Channel();
  Channel(const Channel&) = delete;
  Channel& operator=(const Channel&) = delete;

  // DMA straight between pinned host memory and the device, chunk by chunk.
  void direct(void* dst, const void* src, size_t bytes);
  // The same, queued on `transfer` and not waited for: returns the chunks it queued (a
  // stream's queued copies, which its thread waits for only before work of another kind).
  size_t direct_start(void* dst, const void* src, size_t bytes, Transfer& transfer);
  // Host-to-device from pageable memory: the calling thread alone copies each chunk into a
  // free bounce buffer (the driver's one staging pass) while the engine DMAs the previous
  // ones to `dst`.
  void bounce_in(void* dst, const void* src, size_t bytes);
  // Device-to-host into pageable memory: the engine DMAs chunks into bounce buffers
  // ahead while the calling thread copies finished ones out to `dst`.
  void bounce_out(void* dst, const void* src, size_t bytes);

  bool locked() const { return locked_; }
  size_t chunk() const { return chunk_; }
  double link_wait_seconds() const { return engine_.link_wait_seconds(); }
  const DmaEngine& engine() const { return engine_; }
  // Bytes the calling threads copied through the bounce buffers (one pass per pageable
  // byte).
  uint64_t staged_bytes() const { return staged_bytes_.load(); }

 private:
  size_t chunk_;
  std::vector<char*> buffers_;
  void* map_ = nullptr;
  size_t map_bytes_ = 0;
  bool locked_ = false;
  std::mutex bounce_mu_;  // one pageable copy at a time owns the bounce buffers
  std::atomic<uint64_t> staged_bytes_{0};
  DmaEngine engine_;
};

}  // namespace pinstage::sim
