#include "backends/sim/dma.h"

#include <sys/resource.h>

#include <sys/mman.h>

#include <algorithm>
#include <cstring>
#include <string>

#include "pinstage/pages.h"
#include "pinstage/parallel.h"

namespace pinstage::sim {

Transfer::~Transfer() {
  std::unique_lock lock(mu_);
  wanted_ = submitted_;
  cv_.wait(lock, [&] { return done_ >= submitted_; });
}

void Transfer::add_one() {
  std::lock_guard lock(mu_);
  ++submitted_;
}

void Transfer::complete_one() {
  std::lock_guard lock(mu_);
  // Only the completion the waiter asked for wakes it: a wake-up per chunk would take a
  // core from the engine's workers thousands of times per large copy.
  if (++done_ >= wanted_) cv_.notify_all();
}

void Transfer::wait_for(size_t chunks) {
  std::unique_lock lock(mu_);
  wanted_ = chunks;
  cv_.wait(lock, [&] { return done_ >= chunks; });
}

DmaEngine::DmaEngine(int64_t link_gbps, int threads)
    : ns_per_byte_(link_gbps > 0 ? 1.0 / static_cast<double>(link_gbps) : 0.0),
      thread_bytes_(std::make_unique<std::atomic<uint64_t>[]>(static_cast<size_t>(threads))) {
  workers_.reserve(static_cast<size_t>(threads));
  try {
    for (size_t w = 0; w < static_cast<size_t>(threads); ++w)
      workers_.emplace_back([this, w] { loop(w); });
  } catch (...) {
    stop_workers();
    throw;
  }
}

DmaEngine::~DmaEngine() { stop_workers(); }

void DmaEngine::stop_workers() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (std::thread& t : workers_) t.join();
}

size_t DmaEngine::slice_count(size_t bytes, size_t threads) {
  return std::clamp<size_t>(bytes / kMinSlice, 1, threads);
}

size_t DmaEngine::slice_begin(size_t bytes, size_t slices, size_t w) {
  if (w == 0) return 0;
  if (w >= slices) return bytes;
  return (bytes / slices * w + bytes % slices * w / slices) & ~size_t{63};
}

void DmaEngine::submit(void* dst, const void* src, size_t bytes, Transfer* transfer) {
  auto job = std::make_shared<Job>();
  job->dst = dst;
  job->src = src;
  job->bytes = bytes;
  job->slices = slice_count(bytes, workers_.size());
  job->transfer = transfer;
  job->left.store(workers_.size());
  {
    std::lock_guard lock(mu_);
    queue_.push_back(std::move(job));
    ++unstarted_;
    transfer->add_one();  // under mu_: the engine cannot complete it first
  }
  cv_.notify_all();
}

// The link as a per-chunk deadline, set when a chunk's first slice starts: while the
// engine stays busy each chunk starts when the previous one has left the link (so a late
// wake-up, a loaded host's scheduling delay, is made up by the next chunks and the average
// holds); after an idle spell the link starts afresh, earning no credit.
void DmaEngine::start(Job& job) {
  --unstarted_;
  ++in_flight_;
  if (ns_per_byte_ <= 0) return;
  const auto begin = link_idle_ ? Clock::now() : next_free_;
  link_idle_ = false;
  next_free_ = begin + std::chrono::nanoseconds(
                           static_cast<int64_t>(ns_per_byte_ * static_cast<double>(job.bytes)));
  job.deadline = next_free_;
}

// Every worker passes every job in order and copies its own slice of it; the last to
// finish a job completes it.
void DmaEngine::loop(size_t w) {
  uint64_t next = 0;  // sequence number of the next job this worker passes
  std::unique_lock lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stop_ || next < front_seq_ + queue_.size(); });
    if (next >= front_seq_ + queue_.size()) return;  // stopping, with nothing left for it
    const std::shared_ptr<Job> job = queue_[next - front_seq_];
    ++next;
    if (job->taken++ == 0) start(*job);
    if (job->taken == workers_.size()) {  // every worker has passed it: it is the front
      queue_.pop_front();
      ++front_seq_;
    }
    lock.unlock();
    const size_t begin = slice_begin(job->bytes, job->slices, w);
    const size_t end = slice_begin(job->bytes, job->slices, w + 1);
    if (end > begin) {
      // A DMA engine writes memory around the CPU caches: streaming stores, not memcpy.
      stream_copy(static_cast<char*>(job->dst) + begin, static_cast<const char*>(job->src) + begin,
                  end - begin);
      thread_bytes_[w] += end - begin;
    }
    if (job->left.fetch_sub(1, std::memory_order_acq_rel) == 1) finish(*job);
    lock.lock();
  }
}

// A chunk completes when it has crossed the link.
void DmaEngine::finish(Job& job) {
  if (ns_per_byte_ > 0) {
    const auto now = Clock::now();
    if (job.deadline > now) {
      std::this_thread::sleep_until(job.deadline);
      wait_ns_ += static_cast<uint64_t>(
          std::chrono::duration_cast<std::chrono::nanoseconds>(job.deadline - now).count());
    }
  }
  {
    std::lock_guard lock(mu_);
    if (--in_flight_ == 0 && unstarted_ == 0) link_idle_ = true;
  }
  job.transfer->complete_one();
}

Channel::Channel(size_t chunk, int buffers, int64_t link_gbps, int dma_threads)
    : chunk_(chunk), engine_(link_gbps, dma_threads) {
  const MappedPages pages = map_pages(chunk * static_cast<size_t>(buffers));
  map_ = pages.base;
  map_bytes_ = pages.map_bytes;
  // The driver's staging memory is page-locked, as the CUDA driver's is; where the OS
  // refuses, the copies still work and sim.stats says so. Under a small RLIMIT_MEMLOCK
  // (8 MiB is a common default) the buffers stay unlocked rather than take the budget
  // the worker's own pinned memory needs: they are locked only within a quarter of it.
  rlimit limit{};
  const bool fits = getrlimit(RLIMIT_MEMLOCK, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY ||
                    pages.bytes <= limit.rlim_cur / 4;
  locked_ = fits && mlock(pages.data, pages.bytes) == 0;
  for (int i = 0; i < buffers; ++i)
    buffers_.push_back(static_cast<char*>(pages.data) + static_cast<size_t>(i) * chunk);
}

Channel::~Channel() { munmap(map_, map_bytes_); }

size_t Channel::direct_start(void* dst, const void* src, size_t bytes, Transfer& transfer) {
  size_t chunks = 0;
  for (size_t off = 0; off < bytes; off += chunk_, ++chunks)
    engine_.submit(static_cast<char*>(dst) + off, static_cast<const char*>(src) + off,
                   std::min(chunk_, bytes - off), &transfer);
  return chunks;
}

void Channel::direct(void* dst, const void* src, size_t bytes) {
  Transfer transfer;
  transfer.wait_for(direct_start(dst, src, bytes, transfer));
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
    staged_bytes_ += n;
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
    const size_t n = std::min(chunk_, bytes - off);
    std::memcpy(static_cast<char*>(dst) + off, buffers_[i % depth], n);
    staged_bytes_ += n;
    if (i + depth < chunks) submit(i + depth);  // its buffer is free again
  }
}

}  // namespace pinstage::sim
