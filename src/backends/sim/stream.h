// A sim device's streams: queues that run their tasks in order on a thread each, and the
// gate that holds them (docs/worker.md, "sim semantics"). Internal to the sim backend and
// its tests.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "backends/sim/dma.h"
#include "pinstage/backend/platform_abi.h"

namespace pinstage::sim {

// Holds every stream of a context before its next task while closed (the sim.hold_streams
// test seam): a latch that keeps queued copies queued, so tests open race windows without
// sleeps.
class StreamGate {
 public:
  void set_held(bool held);
  void pass();  // returns once the gate is open

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool held_ = false;
};

// A copy queue: one thread runs its tasks in order; the first failure is kept for sync.
class Stream {
 public:
  // A pinned copy's start: queues its DMA chunks on `inflight` and adds their count to
  // `chunks`, without waiting for them.
  using DirectStart = std::function<int(Transfer& inflight, size_t& chunks)>;

  // `last_error`: the calling thread's text of the failure a task just returned.
  Stream(StreamGate* gate, const char* (*last_error)());
  ~Stream();                             // drains the queue and the chunks in flight, then joins
  void push(std::function<int()> task);  // runs once every earlier task's bytes have landed
  // Queued pinned copies go to the copy engine back to back, as a card's copy engine runs
  // its queue with no round trip through the host between copies: the thread waits for
  // the chunks in flight only before a task pushed with push(), before a pinned copy the
  // other way (another engine) or into bytes one in flight writes (the engine's workers
  // split each chunk, so two writes of one byte could land out of order), and before
  // sync reports idle. `up`: host to device; [dst, dst + bytes): what the copy writes.
  void push_direct(bool up, const void* dst, size_t bytes, DirectStart start);
  int sync(std::string* error);
  // The first failure not yet reported by sync (PS_OK if none), left in place: an event
  // recorded after a failed copy reports it, as CUDA's event waits report earlier async
  // errors.
  int pending_failure(std::string* error);

 private:
  struct Task {                // neither run nor start: sync's barrier
    std::function<int()> run;  // or, for a pinned copy:
    DirectStart start;
    bool up = false;
    uintptr_t begin = 0, end = 0;  // the bytes it writes
  };
  void loop();
  bool must_wait(const Task& task) const;  // the chunks in flight must land before it
  void land();                             // waits for every chunk in flight
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Task> queue_;
  StreamGate* gate_;
  const char* (*last_error_)();
  // The loop thread's own: the pinned copies' chunks queued so far, and their transfer.
  Transfer inflight_;
  size_t chunks_ = 0;
  bool inflight_up_ = false;
  std::vector<std::pair<uintptr_t, uintptr_t>> inflight_writes_;  // since the last wait
  uint64_t pushed_ = 0, ran_ = 0;  // tasks queued and tasks done: sync waits for its own
  bool stop_ = false;
  int status_ = PS_OK;
  std::string error_;
  std::thread thread_;  // last: starts after the members it uses exist
};

}  // namespace pinstage::sim
