// Internal state of the sim backend (see sim_backend.cpp for what sim does).
#pragma once

#include <array>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>

#include "pinstage/platform_abi.h"

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

struct PinnedEntry {
  size_t mapped = 0;
  bool locked = false;
};

struct Context {
  uint64_t capacity = 0;
  uint64_t committed = 0;              // page-rounded bytes of live device allocations
  std::mutex mu;                       // guards the tables below and committed
  std::map<uintptr_t, size_t> device;  // ordered: copies check ranges by address
  std::unordered_map<void*, PinnedEntry> pinned;
  std::unordered_map<void*, size_t> registered;
  std::unordered_map<Stream*, std::unique_ptr<Stream>> streams;
  std::unordered_map<Event*, std::unique_ptr<Event>> events;
  std::atomic<bool> lock_refused{false};
  std::array<std::atomic<uint64_t>, PS_FAULT_KIND_COUNT> faults{};  // countdown; 0 = off

  bool should_fail(ps_fault_kind kind);
  // True when [ptr, ptr+bytes) lies inside one live device allocation.
  bool device_range_ok(const void* ptr, size_t bytes);
};

// Runs a named callable on device buffers (sim_callables.cpp). PS_ERR_NOT_FOUND for an
// unknown name; *error gets the detail on failure.
int run_callable(const char* name, const ps_exec_arg* args, size_t n_args, std::string* error);

}  // namespace pinstage::sim
