// The worker's side of the host memory pool (Note [Host memory pool] in host_pool.cpp):
// the backend calls around HostPool, made outside the worker's lock where they can take
// long (mapping and pinning a segment, releasing one).
//
// Note [Segment sources]
// ~~~~~~~~~~~~~~~~~~~~~~
// Where pinned memory comes from is the runtime's decision; a plugin pins (kvikio's
// BounceBufferPool<Allocator>, ATen's host allocator hooks):
//  - vendor: host_alloc_pinned, the backend's own allocation: the pool's segments.
//  - file: a file's page cache mapped read-only and pinned in place by host_register
//    (ABI v7; file_source.cpp): map-mode loads. Entered as EntryKind::registered_host.
// The pin budget's verdict is made once per request (pin_verdict) and acted on, so a
// refusal is never read again into a "fits" (the old over_budget race). docs/worker.md,
// "Segment sources", lists what is not moved yet (anonymous, shared).
#include <algorithm>
#include <string>
#include <vector>

#include "pinstage/clock.h"
#include "pinstage/log.h"
#include "pinstage/pages.h"
#include "pinstage/settings.h"
#include "runtime/worker_state.h"

namespace pinstage {
namespace runtime {

void WorkerState::recycle_reached_locked() {
  if (api().event_query == nullptr) return;  // parked blocks only exist with event_query
  const std::vector<ps_event*> done =
      host.poll([this](ps_event* e) { return api().event_query(ctx, e) != PS_ERR_NOT_READY; });
  for (ps_event* e : done) api().event_destroy(ctx, e);
}

std::string WorkerState::pin_verdict(size_t& bytes, size_t minimum, size_t requested) {
  PinBudget budget = pin_budget();
  const auto fits = [&](size_t n) { return pin_budget_refusal(n, budget).empty(); };
  const auto settle = [&] {
    if (fits(bytes)) return true;
    if (minimum < bytes && fits(minimum)) {
      bytes = minimum;  // the 2 MiB rounding does not fit, the request itself does
      return true;
    }
    return false;
  };
  if (settle()) return {};
  // Cached segments nobody uses are given back before anyone is refused: they hold the
  // budget for nothing. Only then is the budget read again.
  std::vector<ps_allocation> idle;
  {
    std::lock_guard lock(mu);
    idle = host.take_free_segments(UINT64_MAX);
  }
  if (!idle.empty()) {
    release_segments(idle, false);
    budget = pin_budget();
    if (settle()) return {};
  }
  return pin_budget_refusal(requested, budget);  // names what the caller asked for
}

std::string WorkerState::map_segment(size_t bytes, size_t minimum, size_t requested) {
  std::string refusal = pin_verdict(bytes, minimum, requested);
  if (!refusal.empty()) {
    if (setting_choice(Setting::pin_policy).value_or("strict") != "fallback")
      throw Error(ErrorCode::out_of_memory, name() + ": " + refusal);
    return refusal;  // acted on by the caller as it is: never read again (the race)
  }
  ps_allocation seg{nullptr, bytes, nullptr};
  const Stopwatch watch;
  check(api().host_alloc_pinned(ctx, bytes, &seg), "pinned host alloc");
  seg.bytes = bytes;  // the runtime's record, whatever the backend wrote
  if (seg.ptr == nullptr)
    throw Error(ErrorCode::internal, name() + " returned a null pinned segment");
  std::lock_guard lock(mu);
  host.add_segment(seg, watch.seconds());
  return {};
}

PinBudget WorkerState::pin_budget() const {
  PinBudget budget = detail::current_pin_budget(pins_with_mlock);
  if (pins_with_mlock) {
    std::lock_guard lock(mu);
    budget.worker_locked_bytes = host.stats().reserved_bytes;
  }
  return budget;
}

void* WorkerState::alloc_pinned(size_t bytes) {
  const Stopwatch watch;
  // A block another thread takes between the mapping and our take sends us round again.
  for (int attempt = 0;; ++attempt) {
    {
      std::lock_guard lock(mu);
      recycle_reached_locked();
      if (const std::optional<void*> hit = host.take(bytes, attempt > 0)) {
        host.add_time(watch.seconds(), 0);
        return *hit;
      }
    }
    // A miss: a new segment, pinned by the backend without the lock (it can take seconds).
    // With no cache (limit 0) a segment is the request alone, as asked: it goes back at the
    // free, so the backend sees exactly what an allocator without a pool would ask for.
    const size_t exact = host_cache_limit > 0 ? HostPool::block_bytes_for(bytes) : bytes;
    const size_t segment =
        attempt == 0 && host_cache_limit > 0 ? HostPool::segment_bytes_for(bytes) : exact;
    if (const std::string refusal = map_segment(segment, exact, bytes); !refusal.empty())
      return pageable_fallback(bytes, refusal);
  }
}

uint64_t WorkerState::release_segments(const std::vector<ps_allocation>& segments, bool strict) {
  uint64_t released = 0;
  uint64_t failed = 0;
  std::string why;
  for (const ps_allocation& seg : segments) {
    const Stopwatch watch;
    const int status = api().host_free_pinned(ctx, &seg);
    std::lock_guard lock(mu);
    host.count_release(watch.seconds());
    if (status == PS_OK) {
      released += HostPool::block_bytes_for(seg.bytes);
      continue;
    }
    // Still the backend's (and locked): counted as failed, released again at finalize.
    table.add_failed(EntryKind::pinned_host, seg);
    ++free_failures;
    ++failed;
    if (why.empty()) why = std::string(ps_status_str(status)) + " (" + api().last_error() + ")";
  }
  if (failed > 0) {
    const std::string message = name() + " pinned host free failed: " + why + "; " +
                                std::to_string(failed) + " segment(s) kept for finalize";
    if (strict) throw Error(ErrorCode::backend, message);
    log(LogLevel::error, message);
  }
  return released;
}

bool WorkerState::free_pinned(void* ptr) {
  const Stopwatch watch;
  std::optional<HostPool::Released> block;
  {
    std::lock_guard lock(mu);
    block = host.release(ptr);
    if (block && block->streams.empty()) host.recycle(block->ptr, block->span);
  }
  if (!block) return false;
  if (!block->streams.empty()) {
    // A queued copy may still read it: an event on each stream that touched it, or, without
    // event_query, a sync of those streams (Note [Host memory pool]).
    std::vector<ps_event*> events;
    for (ps_stream* s : block->streams) {
      {
        std::lock_guard lock(mu);
        if (!table.has(EntryKind::stream, s)) continue;  // destroyed: its work is done
      }
      ps_event* e = nullptr;
      if (api().event_query != nullptr && api().event_create(ctx, &e) == PS_OK) {
        if (api().event_record(ctx, e, s) == PS_OK) {
          events.push_back(e);
          continue;
        }
        api().event_destroy(ctx, e);
      }
      api().stream_sync(ctx, s);  // a failed copy was reported to its own waiter
    }
    std::lock_guard lock(mu);
    if (events.empty())
      host.recycle(block->ptr, block->span);
    else
      host.park(block->ptr, block->span, std::move(events));
  }
  std::vector<ps_allocation> over;
  {
    std::lock_guard lock(mu);
    over = host.over_limit(host_cache_limit);
    host.add_time(0, watch.seconds());  // the pool's own work; a trim counts as host_free
  }
  if (!over.empty()) release_segments(over, false);
  return true;
}

uint32_t WorkerState::host_flags(const void* host_ptr, size_t bytes, ps_stream* stream) {
  std::lock_guard lock(mu);
  if (host.note_use(host_ptr, bytes, stream)) return PS_COPY_HOST_PINNED;
  // A file mapping pinned in place (file_source.cpp): its release syncs every stream.
  return table.contains(EntryKind::registered_host, host_ptr, bytes) ? PS_COPY_HOST_PINNED : 0u;
}

}  // namespace runtime

HostMemoryStats Worker::host_memory_stats() const {
  const runtime::CallGuard guard = enter();
  std::lock_guard lock(state_->mu);
  state_->recycle_reached_locked();
  HostMemoryStats stats = state_->host.stats();
  stats.cache_limit_bytes = state_->host_cache_limit;
  return stats;
}

uint64_t Worker::trim_host_cache(uint64_t bytes) {
  const runtime::CallGuard guard = enter();
  std::vector<ps_allocation> segments;
  {
    std::lock_guard lock(state_->mu);
    state_->recycle_reached_locked();
    segments = state_->host.take_free_segments(bytes);
  }
  return state_->release_segments(segments, true);
}

uint64_t Worker::empty_cache() { return trim_host_cache(UINT64_MAX); }

void Worker::reserve_pinned_host(size_t bytes) {
  const runtime::CallGuard guard = enter();
  if (bytes == 0) return;
  const size_t want = runtime::HostPool::block_bytes_for(bytes);
  size_t shortfall = 0;
  {
    std::lock_guard lock(state_->mu);
    state_->recycle_reached_locked();
    // One free block that fits, not the cache's total: a load carves its tensors from one
    // range, and scattered free pages would leave it mapping anyway.
    if (state_->host.largest_cached() >= want) return;  // what a load freed, it asks for again
    shortfall = want;
  }
  // Over the budget with PINSTAGE_PIN_POLICY=fallback nothing is reserved: each request
  // then takes its own way.
  (void)state_->map_segment(shortfall, shortfall, bytes);
}

bool Worker::is_pinned_host(const void* ptr, size_t bytes) const {
  const runtime::CallGuard guard = enter();
  std::lock_guard lock(state_->mu);
  return state_->host.contains(ptr, bytes) ||
         state_->table.contains(runtime::EntryKind::registered_host, ptr, bytes);
}

}  // namespace pinstage
