#include "backends/sim/stream.h"

#include <algorithm>

namespace pinstage::sim {

void StreamGate::set_held(bool held) {
  {
    std::lock_guard lock(mu_);
    held_ = held;
  }
  cv_.notify_all();
}

void StreamGate::pass() {
  std::unique_lock lock(mu_);
  cv_.wait(lock, [this] { return !held_; });
}

Stream::Stream(StreamGate* gate, const char* (*last_error)())
    : gate_(gate), last_error_(last_error), thread_([this] { loop(); }) {}

Stream::~Stream() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void Stream::push(std::function<int()> task) {
  {
    std::lock_guard lock(mu_);
    queue_.push_back({std::move(task), nullptr});
    ++pushed_;
  }
  cv_.notify_all();
}

void Stream::push_direct(bool up, const void* dst, size_t bytes, DirectStart start) {
  const auto begin = reinterpret_cast<uintptr_t>(dst);
  {
    std::lock_guard lock(mu_);
    queue_.push_back({nullptr, std::move(start), up, begin, begin + bytes});
    ++pushed_;
  }
  cv_.notify_all();
}

bool Stream::must_wait(const Task& task) const {
  // At most this many copies in flight: the overlap check stays short for a load of
  // thousands of small tensors.
  constexpr size_t kMaxCopiesInFlight = 64;
  if (!task.start || inflight_writes_.size() >= kMaxCopiesInFlight) return true;
  if (task.up != inflight_up_) return chunks_ > 0;
  return std::any_of(inflight_writes_.begin(), inflight_writes_.end(),
                     [&](const auto& w) { return task.begin < w.second && w.first < task.end; });
}

void Stream::land() {
  inflight_.wait_for(chunks_);
  inflight_writes_.clear();
}

int Stream::sync(std::string* error) {
  std::unique_lock lock(mu_);
  queue_.emplace_back();  // a barrier: it lands every chunk in flight and runs nothing
  const uint64_t ticket = ++pushed_;
  cv_.notify_all();
  cv_.wait(lock, [&] { return ran_ >= ticket; });
  const int status = status_;
  *error = error_;
  status_ = PS_OK;
  error_.clear();
  return status;
}

int Stream::pending_failure(std::string* error) {
  std::lock_guard lock(mu_);
  *error = error_;
  return status_;
}

// Idle, the thread waits for work, not for the chunks in flight: a pinned copy pushed
// while they fly goes straight to the engine (sync's barrier and the destructor land them).
void Stream::loop() {
  std::unique_lock lock(mu_);
  for (;;) {
    cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) break;  // stop_ with nothing left
    Task task = std::move(queue_.front());
    queue_.pop_front();
    lock.unlock();
    if (must_wait(task)) land();  // after the bytes of the copies before it
    int status = PS_OK;
    if (task.start) {
      inflight_up_ = task.up;
      inflight_writes_.emplace_back(task.begin, task.end);
      gate_->pass();
      status = task.start(inflight_, chunks_);
    } else if (task.run) {
      gate_->pass();
      status = task.run();
    }
    std::string detail = status == PS_OK ? std::string() : last_error_();
    lock.lock();
    ++ran_;
    if (status != PS_OK && status_ == PS_OK) {  // keep the first failure for sync
      status_ = status;
      error_ = std::move(detail);
    }
    cv_.notify_all();
  }
  lock.unlock();
  land();
}

}  // namespace pinstage::sim
