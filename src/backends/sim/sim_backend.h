// Internal state of the sim backend (see sim_backend.cpp for what sim does).
#pragma once

#include <array>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "pinstage/backend/platform_abi.h"

namespace pinstage::sim {

// A copy queue: one thread runs its tasks in order; the first failure is kept for sync.
class Stream {
 public:
  Stream();
  ~Stream();  // drains the queue, then joins
  void push(std::function<int()> task);
  int sync(std::string* error);

 private:
  void loop();
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<int()>> queue_;
  bool busy_ = false;
  bool stop_ = false;
  int status_ = PS_OK;
  std::string error_;
  std::thread thread_;  // last: starts after the members it uses exist
};

struct Event {
  void mark(bool done);
  void wait();
  std::mutex mu;
  std::condition_variable cv;
  bool done = true;  // never recorded = complete, as on CUDA
};

// The device. No per-pointer lists: the runtime's table owns that bookkeeping and checks
// every pointer before a slot sees it (platform_abi.h).
struct Context {
  uint64_t capacity = 0;
  std::atomic<uint64_t> committed{0};  // page-rounded bytes of live device allocations
  std::atomic<bool> lock_refused{false};
  std::array<std::atomic<uint64_t>, PS_FAULT_KIND_COUNT> faults{};  // countdown; 0 = off

  bool should_fail(ps_fault_kind kind);
};

}  // namespace pinstage::sim
