#include "backends/sim/dma.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstring>
#include <string>

#include "pinstage/pages.h"

namespace pinstage::sim {

Transfer::~Transfer() {
  std::unique_lock lock(mu_);
  cv_.wait(lock, [&] { return done_ >= submitted_; });
}

void Transfer::add_one() {
  std::lock_guard lock(mu_);
  ++submitted_;
}

void Transfer::complete_one() {
  std::lock_guard lock(mu_);
  ++done_;
  cv_.notify_all();
}

void Transfer::wait_for(size_t chunks) {
  std::unique_lock lock(mu_);
  cv_.wait(lock, [&] { return done_ >= chunks; });
}

DmaEngine::DmaEngine(int64_t link_gbps)
    : ns_per_byte_(link_gbps > 0 ? 1.0 / static_cast<double>(link_gbps) : 0.0),
      thread_([this] { loop(); }) {}

DmaEngine::~DmaEngine() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void DmaEngine::submit(void* dst, const void* src, size_t bytes, Transfer* transfer) {
  {
    std::lock_guard lock(mu_);
    queue_.push_back(Job{dst, src, bytes, transfer});
    transfer->add_one();  // under mu_: the engine cannot complete it first
  }
  cv_.notify_all();
}

void DmaEngine::loop() {
  std::unique_lock lock(mu_);
  for (;;) {
    const bool idle = queue_.empty();  // the link had nothing to carry until now
    cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stop_ with nothing left
    const Job job = queue_.front();
    queue_.pop_front();
    lock.unlock();
    run(job, idle);
    lock.lock();
  }
}

// The link as a per-chunk deadline: while the engine stays busy each chunk starts when the
// previous one has left the link (so a late wake-up, a loaded host's scheduling delay, is
// made up by the next chunks and the average holds); after an idle spell the link starts
// afresh, earning no credit. A chunk completes when it has crossed the link.
void DmaEngine::run(const Job& job, bool after_idle) {
  if (ns_per_byte_ > 0) {
    const auto start = after_idle ? Clock::now() : next_free_;
    next_free_ = start + std::chrono::nanoseconds(
                             static_cast<int64_t>(ns_per_byte_ * static_cast<double>(job.bytes)));
  }
  std::memcpy(job.dst, job.src, job.bytes);
  if (ns_per_byte_ > 0) {
    const auto now = Clock::now();
    if (next_free_ > now) {
      std::this_thread::sleep_until(next_free_);
      wait_ns_ += static_cast<uint64_t>(
          std::chrono::duration_cast<std::chrono::nanoseconds>(next_free_ - now).count());
    }
  }
  job.transfer->complete_one();
}

Channel::Channel(size_t chunk, int buffers, int64_t link_gbps) : chunk_(chunk), engine_(link_gbps) {
  const MappedPages pages = map_pages(chunk * static_cast<size_t>(buffers));
  map_ = pages.base;
  map_bytes_ = pages.map_bytes;
  // The driver's staging memory is page-locked, as the CUDA driver's is; where the OS
  // refuses, the copies still work and sim.stats says so.
  locked_ = mlock(pages.data, pages.bytes) == 0;
  for (int i = 0; i < buffers; ++i)
    buffers_.push_back(static_cast<char*>(pages.data) + static_cast<size_t>(i) * chunk);
}

Channel::~Channel() { munmap(map_, map_bytes_); }

void Channel::direct(void* dst, const void* src, size_t bytes) {
  Transfer transfer;
  size_t chunks = 0;
  for (size_t off = 0; off < bytes; off += chunk_, ++chunks)
    engine_.submit(static_cast<char*>(dst) + off, static_cast<const char*>(src) + off,
                   std::min(chunk_, bytes - off), &transfer);
  transfer.wait_for(chunks);
}

void Channel::bounce_in(void* dst, const void* src, size_t bytes) {
  std::lock_guard lock(bounce_mu_);
  Transfer transfer;
  const size_t depth = buffers_.size();
  size_t i = 0;
  for (size_t off = 0; off < bytes; off += chunk_, ++i) {
    if (i >= depth) transfer.wait_for(i - depth + 1);  // chunk i-depth has left its buffer
    char* buffer = buffers_[i % depth];
    const size_t n = std::min(chunk_, bytes - off);
    std::memcpy(buffer, static_cast<const char*>(src) + off, n);
    engine_.submit(static_cast<char*>(dst) + off, buffer, n, &transfer);
  }
  transfer.wait_for(i);
}

void Channel::bounce_out(void* dst, const void* src, size_t bytes) {
  std::lock_guard lock(bounce_mu_);
  Transfer transfer;
  const size_t depth = buffers_.size();
  const size_t chunks = (bytes + chunk_ - 1) / chunk_;
  const auto submit = [&](size_t i) {
    const size_t off = i * chunk_;
    engine_.submit(buffers_[i % depth], static_cast<const char*>(src) + off,
                   std::min(chunk_, bytes - off), &transfer);
  };
  for (size_t i = 0; i < std::min(depth, chunks); ++i) submit(i);
  for (size_t i = 0; i < chunks; ++i) {
    transfer.wait_for(i + 1);
    const size_t off = i * chunk_;
    std::memcpy(static_cast<char*>(dst) + off, buffers_[i % depth], std::min(chunk_, bytes - off));
    if (i + depth < chunks) submit(i + depth);  // its buffer is free again
  }
}

}  // namespace pinstage::sim
