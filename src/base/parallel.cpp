#include "pinstage/parallel.h"

#include <unistd.h>

#include <sched.h>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "pinstage/error.h"
#include "pinstage/settings.h"

namespace pinstage {
namespace {

// True on pool threads and on a caller while it runs a job: a nested parallel_for then
// runs inline instead of waiting on the pool it is part of.
thread_local bool t_in_job = false;

class Pool;
// The team whose run() this thread is inside (ThreadTeam), else null: the process pool.
thread_local Pool* t_team = nullptr;

// A fixed set of threads that run one job at a time; the caller works too.
class Pool {
 public:
  // All `workers` threads start, or none stay: a partial start joins the ones that did
  // and throws (unwinding with joinable threads would terminate or hang).
  explicit Pool(int workers) {
    try {
      threads_.reserve(static_cast<size_t>(workers));
      for (int i = 0; i < workers; ++i) threads_.emplace_back([this] { loop(); });
    } catch (const std::exception& e) {
      const size_t started = threads_.size();
      stop_all();
      throw Error(ErrorCode::out_of_memory, "the thread pool could not start thread " +
                                                std::to_string(started + 1) + " of " +
                                                std::to_string(workers) + " (" + e.what() +
                                                "); lower PINSTAGE_NUM_THREADS (now " +
                                                std::to_string(process_thread_count()) +
                                                " threads) or raise the memory or thread limit");
    }
  }
  ~Pool() { stop_all(); }
  int size() const { return static_cast<int>(threads_.size()) + 1; }
  void count_job() noexcept { jobs_.fetch_add(1, std::memory_order_relaxed); }
  uint64_t jobs() const noexcept { return jobs_.load(std::memory_order_relaxed); }

  void run(size_t chunks, const std::function<void(size_t)>& chunk_fn) {
    std::lock_guard submit(submit_mu_);  // one job at a time
    {
      std::lock_guard lock(mu_);
      job_ = &chunk_fn;
      chunks_ = chunks;
      next_ = 0;
      pending_ = chunks;
      error_ = nullptr;
      ++generation_;
    }
    wake_.notify_all();
    t_in_job = true;
    work();
    t_in_job = false;
    std::unique_lock lock(mu_);
    done_.wait(lock, [this] { return pending_ == 0; });
    job_ = nullptr;
    if (error_) std::rethrow_exception(error_);
  }

 private:
  void stop_all() noexcept {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    wake_.notify_all();
    for (auto& t : threads_) t.join();
    threads_.clear();
  }

  void loop() {
    t_in_job = true;
    uint64_t seen = 0;
    for (;;) {
      {
        std::unique_lock lock(mu_);
        wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
        if (stop_) return;
        seen = generation_;
      }
      work();
    }
  }

  // Claims chunks under the lock so a late thread can never pair a stale job with a new
  // job's chunk index; chunks are few (one per thread), so the lock is cheap.
  void work() {
    for (;;) {
      const std::function<void(size_t)>* job;
      size_t index;
      {
        std::lock_guard lock(mu_);
        if (job_ == nullptr || next_ >= chunks_) return;
        job = job_;
        index = next_++;
      }
      try {
        (*job)(index);
      } catch (...) {
        std::lock_guard lock(mu_);
        if (!error_) error_ = std::current_exception();
      }
      std::lock_guard lock(mu_);
      if (--pending_ == 0) done_.notify_all();
    }
  }

  std::vector<std::thread> threads_;
  std::mutex submit_mu_;
  std::mutex mu_;
  std::condition_variable wake_;
  std::condition_variable done_;
  const std::function<void(size_t)>* job_ = nullptr;
  size_t chunks_ = 0;
  size_t next_ = 0;
  size_t pending_ = 0;
  uint64_t generation_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
  std::atomic<uint64_t> jobs_{0};
};

// Never destroyed: at process exit, threads the program never joined (Python daemon
// threads in a bind) may still be inside run(); destroying the pool under them would
// join, or tear down locked mutexes, while they wait on it.
// A forked child has none of the parent's pool threads (and its mutex may have been held
// at the fork): it gets a pool of its own, and the copy of the parent's is left alone.
Pool& pool() {
  static std::atomic<Pool*> instance{nullptr};
  static std::atomic<pid_t> owner{0};
  static std::mutex create;
  const pid_t self = ::getpid();
  Pool* p = instance.load(std::memory_order_acquire);
  if (p != nullptr && owner.load(std::memory_order_acquire) == self) return *p;
  std::unique_lock lock(create, std::defer_lock);
  if (p == nullptr) lock.lock();  // a child skips the lock: its copy may be held
  p = instance.load(std::memory_order_acquire);
  if (p == nullptr || owner.load(std::memory_order_acquire) != self) {
    p = new Pool(process_thread_count() - 1);
    owner.store(self, std::memory_order_release);
    instance.store(p, std::memory_order_release);
  }
  return *p;
}

}  // namespace

int usable_cpu_count() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
}

int process_thread_count() {
  static const int count = [] {
    if (const auto n = setting_num_threads()) return *n;
    return usable_cpu_count();
  }();
  return count;
}

int default_thread_count() { return t_team != nullptr ? t_team->size() : process_thread_count(); }

struct ThreadTeam::State {
  explicit State(int threads) : pool(threads - 1) {}
  Pool pool;
};

ThreadTeam::ThreadTeam(int threads) {
  if (threads < 1 || threads > 1024)
    throw Error(ErrorCode::invalid_argument,
                "a thread team takes 1..1024 threads, not " + std::to_string(threads));
  state_ = std::make_unique<State>(threads);
}

ThreadTeam::~ThreadTeam() = default;

int ThreadTeam::size() const noexcept { return state_->pool.size(); }

uint64_t ThreadTeam::jobs() const noexcept { return state_->pool.jobs(); }

void ThreadTeam::run(const std::function<void()>& fn) {
  Pool* const outer = t_team;
  t_team = &state_->pool;
  struct Restore {
    Pool* outer;
    ~Restore() { t_team = outer; }
  } restore{outer};
  fn();
}

void parallel_for(size_t n, size_t grain, const std::function<void(size_t, size_t)>& fn,
                  int threads) {
  if (n == 0) return;
  grain = std::max<size_t>(grain, 1);
  const size_t want = threads > 0 ? static_cast<size_t>(threads) : default_thread_count();
  const size_t chunks = std::min(want, (n + grain - 1) / grain);
  if (chunks <= 1 || t_in_job) {
    fn(0, n);
    return;
  }
  Pool& p = t_team != nullptr ? *t_team : pool();
  if (t_team != nullptr) p.count_job();
  // More chunks than threads would only add hand-offs; fewer keeps `threads` honoured.
  const size_t used = std::min<size_t>(chunks, p.size());
  const size_t step = (n + used - 1) / used;
  p.run(used, [&](size_t i) {
    const size_t begin = i * step;
    const size_t end = std::min(n, begin + step);
    if (begin < end) fn(begin, end);
  });
}

void stream_copy(void* dst, const void* src, size_t bytes) {
#if defined(__SSE2__)
  auto* d = static_cast<char*>(dst);
  const auto* s = static_cast<const char*>(src);
  // Up to the destination's first cache line with memcpy, then whole lines streamed.
  const size_t head = std::min(bytes, (64 - (reinterpret_cast<uintptr_t>(d) & 63)) & 63);
  std::memcpy(d, s, head);
  d += head;
  s += head;
  bytes -= head;
  const size_t lines = bytes & ~size_t{63};
  for (size_t i = 0; i < lines; i += 64) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 16));
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 32));
    const __m128i e = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 48), e);
  }
  _mm_sfence();  // streaming stores are weakly ordered: publish them before returning
  std::memcpy(d + lines, s + lines, bytes - lines);
#else
  std::memcpy(dst, src, bytes);
#endif
}

void parallel_memcpy(void* dst, const void* src, size_t bytes, int threads) {
  // Below a few MiB a thread hand-off costs more than it saves.
  constexpr size_t kGrain = size_t{4} << 20;
  constexpr size_t kStreamFrom = size_t{1} << 20;  // smaller pieces may stay in cache
  auto* d = static_cast<char*>(dst);
  const auto* s = static_cast<const char*>(src);
  parallel_for(
      bytes, kGrain,
      [&](size_t begin, size_t end) {
        if (end - begin >= kStreamFrom)
          stream_copy(d + begin, s + begin, end - begin);
        else
          std::memcpy(d + begin, s + begin, end - begin);
      },
      threads);
}

}  // namespace pinstage
