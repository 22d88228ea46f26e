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
  }
  cv_.notify_all();
}

void Stream::push_direct(bool up, const void* dst, size_t bytes, DirectStart start) {
  const auto begin = reinterpret_cast<uintptr_t>(dst);
  {
    std::lock_guard lock(mu_);
    queue_.push_back({nullptr, std::move(start), up, begin, begin + bytes});
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
  cv_.wait(lock, [this] { return queue_.empty() && !busy_; });
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

void Stream::loop() {
  std::unique_lock lock(mu_);
  for (;;) {
    if (queue_.empty() && busy_) {  // only chunks in flight: idle once they have landed
      lock.unlock();
      land();
      lock.lock();
      busy_ = false;
      cv_.notify_all();
      continue;
    }
    cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stop_ with nothing left
    Task task = std::move(queue_.front());
    queue_.pop_front();
    busy_ = true;
    lock.unlock();
    if (must_wait(task)) land();  // after the bytes of the copies before it
    if (task.start) {
      inflight_up_ = task.up;
      inflight_writes_.emplace_back(task.begin, task.end);
    }
    gate_->pass();
    const int status = task.start ? task.start(inflight_, chunks_) : task.run();
    std::string detail = status == PS_OK ? std::string() : last_error_();
    lock.lock();
    busy_ = static_cast<bool>(task.start);
    if (status != PS_OK && status_ == PS_OK) {  // keep the first failure for sync
      status_ = status;
      error_ = std::move(detail);
    }
    cv_.notify_all();
  }
}

}  // namespace pinstage::sim
