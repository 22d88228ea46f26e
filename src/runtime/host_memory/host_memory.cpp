// The worker's side of the host memory provider: the pool (Note [Host memory pool] in
// host_pool.cpp) over the worker's pool source, the one pin verdict and the one pin step
// for every source (Note [Segment sources] in host_source.cpp), fills by their writers
// (HostFill), and the releases. Backend calls that can take long (making and pinning a
// segment, releasing one) run outside the worker's lock.
#include <algorithm>
#include <string>
#include <type_traits>
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

std::string WorkerState::pin_verdict(size_t& bytes, size_t minimum, size_t requested,
                                     const std::string& what) {
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
  std::vector<HostPool::Owned> idle;
  {
    std::lock_guard lock(mu);
    idle = host.take_free_segments(UINT64_MAX);
  }
  if (!idle.empty()) {
    release_segments(idle, false);
    budget = pin_budget();
    if (settle()) return {};
  }
  std::string refusal = pin_budget_refusal(requested, budget);  // names the caller's size
  if (setting_choice(Setting::pin_policy).value_or("strict") != "fallback")
    throw Error(ErrorCode::out_of_memory, name() + ": " + what + refusal);
  return refusal;  // acted on by the caller as it is: never read again (the race)
}

int WorkerState::pin_segment(const HostSegment& segment, uint32_t flags) {
  if (registered(segment.source)) {
    if (api().host_register == nullptr) return PS_ERR_UNSUPPORTED;
    const int status = api().host_register(
        ctx, segment.data, segment.bytes, flags | (segment.read_only ? PS_REGISTER_READ_ONLY : 0u));
    if (status == PS_ERR_UNSUPPORTED) return status;
    check(status, "host_register");
  }
  std::lock_guard lock(mu);
  if (!table.insert(entry_kind(segment.source), segment.allocation())) {
    if (registered(segment.source)) (void)api().host_unregister(ctx, segment.data, segment.bytes);
    throw Error(ErrorCode::internal, "a host segment was pinned at an address in use");
  }
  return PS_OK;
}

namespace {

// The pool's source refuses anonymous memory (acl's ACL_ERROR_RT_FEATURE_NOT_SUPPORT):
// from now on the pool takes the plugin's own allocation, said once.
void fall_back_to_vendor(WorkerState& s) {
  if (s.api().host_alloc_pinned == nullptr)
    throw Error(ErrorCode::unsupported, "the " + s.name() +
                                            " backend cannot pin anonymous host memory (" +
                                            s.api().last_error() +
                                            ") and has no allocation "
                                            "of its own");
  log(LogLevel::info, s.name() + ": host_register refused anonymous memory (" +
                          s.api().last_error() +
                          "); pinned memory comes from the backend's own allocation");
  std::lock_guard lock(s.mu);
  s.pool_source = SourceKind::vendor;
}

}  // namespace

std::string WorkerState::map_segment(size_t bytes, size_t minimum, size_t requested, bool fault,
                                     HostSegment* made) {
  if (std::string refusal = pin_verdict(bytes, minimum, requested, ""); !refusal.empty())
    return refusal;
  const Stopwatch watch;
  for (;;) {  // at most twice: the anonymous source, then the vendor one if it was refused
    SourceKind kind;
    {
      std::lock_guard lock(mu);
      kind = pool_source;
    }
    // Only anonymous memory can wait for its writers to fault it.
    const bool now = fault || kind != SourceKind::anonymous;
    HostSource& source = *sources[static_cast<size_t>(kind)];
    HostSegment seg = source.make(SegmentRequest{bytes, now, -1, ""});
    int status = PS_OK;
    try {
      // Faulted now: pinned now. Left to its writers: pinned as they fault it where the
      // backend can (PS_REGISTER_ON_FAULT), else by HostFill::finish after them.
      status = now ? pin_segment(seg) : pin_segment(seg, PS_REGISTER_ON_FAULT);
    } catch (...) {
      source.release(seg.allocation(), nullptr);
      throw;
    }
    if (status == PS_ERR_UNSUPPORTED && now) {
      source.release(seg.allocation(), nullptr);
      fall_back_to_vendor(*this);
      continue;
    }
    seg.on_fault = !now && status == PS_OK;
    if (made != nullptr) *made = seg;
    std::lock_guard lock(mu);
    host.add_segment(HostPool::Owned{seg.allocation(), seg.source, now || seg.on_fault},
                     watch.seconds(), !now);
    return {};
  }
}

bool WorkerState::probe_anonymous_register() {
  {
    std::lock_guard lock(mu);
    if (pool_source != SourceKind::anonymous) return false;
    if (anonymous_registers) return true;
  }
  // One page, before any data is written into a segment that might then not be pinnable.
  HostSegment page = sources[static_cast<size_t>(SourceKind::anonymous)]->make(
      SegmentRequest{page_size(), true, -1, ""});
  int status = PS_ERR_UNSUPPORTED;
  if (api().host_register != nullptr) {
    status = api().host_register(ctx, page.data, page.bytes, 0);
    if (status == PS_OK) (void)api().host_unregister(ctx, page.data, page.bytes);
  }
  sources[static_cast<size_t>(SourceKind::anonymous)]->release(page.allocation(), nullptr);
  if (status == PS_ERR_UNSUPPORTED) {
    fall_back_to_vendor(*this);
    return false;
  }
  check(status, "host_register");
  std::lock_guard lock(mu);
  anonymous_registers = true;
  return true;
}

PinBudget WorkerState::pin_budget() const {
  PinBudget budget = detail::current_pin_budget(pins_with_mlock);
  if (pins_with_mlock) {
    std::lock_guard lock(mu);
    for (size_t k = 0; k < kSourceKindCount; ++k)  // every pinned segment, pooled or mapped
      budget.worker_locked_bytes += table.bytes(entry_kind(static_cast<SourceKind>(k)));
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
    // A miss: a new segment, made and pinned without the lock (it can take seconds). With
    // no cache (limit 0) a segment is the request alone, as asked: it goes back at the
    // free, so the backend sees exactly what an allocator without a pool would ask for.
    const size_t exact = host_cache_limit > 0 ? HostPool::block_bytes_for(bytes) : bytes;
    const size_t segment =
        attempt == 0 && host_cache_limit > 0 ? HostPool::segment_bytes_for(bytes) : exact;
    if (const std::string refusal = map_segment(segment, exact, bytes); !refusal.empty())
      return pageable_fallback(bytes, refusal);
  }
}

std::string WorkerState::release_host(SourceKind source, const ps_allocation& segment, bool unpin,
                                      bool release) noexcept {
  try {
    if (unpin && registered(source)) {
      const int status = api().host_unregister(ctx, segment.ptr, segment.bytes);
      if (status != PS_OK)
        return std::string(ps_status_str(status)) + " (" + api().last_error() + ")";
    }
    std::string why;
    if (release && !sources[static_cast<size_t>(source)]->release(segment, &why)) return why;
    return {};
  } catch (...) {
    return "out of memory while releasing";
  }
}

uint64_t WorkerState::release_segments(const std::vector<HostPool::Owned>& segments, bool strict) {
  uint64_t released = 0;
  uint64_t failed = 0;
  std::string why;
  for (const HostPool::Owned& seg : segments) {
    const Stopwatch watch;
    if (seg.pinned) {
      std::lock_guard lock(mu);
      table.erase(entry_kind(seg.source), seg.allocation.ptr);
    }
    const std::string error = release_host(seg.source, seg.allocation, seg.pinned, true);
    std::lock_guard lock(mu);
    host.count_release(watch.seconds());
    if (error.empty()) {
      released += HostPool::block_bytes_for(seg.allocation.bytes);
      continue;
    }
    // Still pinned (or the backend's): counted as failed, released again at finalize.
    if (seg.pinned) table.add_failed(entry_kind(seg.source), seg.allocation);
    ++free_failures;
    ++failed;
    if (why.empty()) why = error;
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
  std::vector<HostPool::Owned> over;
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
  for (SourceKind k : {SourceKind::file_shared, SourceKind::file_private, SourceKind::shared_named})
    if (table.contains(entry_kind(k), host_ptr, bytes)) return PS_COPY_HOST_PINNED;
  return 0u;
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

ReportFields report_fields(const HostMemoryStats& s) {
  ReportFields fields;
#define PINSTAGE_HOST_STAT_(type, name, value, key, doc)                             \
  if constexpr (std::is_floating_point_v<type>)                                      \
    fields.push_back({key, s.name * 1e6}); /* seconds, in microseconds as torch's */ \
  else                                                                               \
    fields.push_back({key, report_value(s.name)});
  PINSTAGE_HOST_MEMORY_STATS_FIELDS(PINSTAGE_HOST_STAT_)
#undef PINSTAGE_HOST_STAT_
  return fields;
}

uint64_t Worker::trim_host_cache(uint64_t bytes) {
  const runtime::CallGuard guard = enter();
  std::vector<runtime::HostPool::Owned> segments;
  {
    std::lock_guard lock(state_->mu);
    state_->recycle_reached_locked();
    segments = state_->host.take_free_segments(bytes);
  }
  return state_->release_segments(segments, true);
}

uint64_t Worker::empty_cache() { return trim_host_cache(UINT64_MAX); }

namespace {

// The bytes `want` are cached in one free block already: a load's second run.
bool cached_already(runtime::WorkerState& s, size_t want) {
  std::lock_guard lock(s.mu);
  s.recycle_reached_locked();
  // One free block that fits, not the cache's total: a load carves its tensors from one
  // range, and scattered free pages would leave it mapping anyway.
  return s.host.largest_cached() >= want;
}

}  // namespace

void Worker::reserve_pinned_host(size_t bytes) {
  const runtime::CallGuard guard = enter();
  if (bytes == 0) return;
  const size_t want = runtime::HostPool::block_bytes_for(bytes);
  if (cached_already(*state_, want)) return;  // what a load freed, it asks for again
  // Over the budget with PINSTAGE_PIN_POLICY=fallback nothing is reserved: each request
  // then takes its own way.
  (void)state_->map_segment(want, want, bytes);
}

HostFill Worker::reserve_host_fill(size_t bytes) {
  const runtime::CallGuard guard = enter();
  HostFill fill;
  if (bytes == 0) return fill;
  const size_t want = runtime::HostPool::block_bytes_for(bytes);
  if (cached_already(*state_, want)) return fill;
  const bool defer = state_->probe_anonymous_register();
  runtime::HostSegment seg;
  if (!state_->map_segment(want, want, bytes, !defer, &seg).empty()) return fill;  // fallback
  if (!defer) return fill;  // made and pinned by the backend (vendor)
  fill.owner_ = state_;
  fill.data_ = static_cast<unsigned char*>(seg.data);
  fill.bytes_ = seg.bytes;
  fill.huge_ = seg.huge;
  fill.on_fault_ = seg.on_fault;
  fill.plan_ = std::make_unique<FaultPlan>();
  fill.plan_->method = state_->placement.method;
  fill.plan_->threads = 1;  // each writer faults its own range
  fill.plan_->huge = seg.huge;
  fill.plan_->stall_seconds = state_->placement.stall_seconds;
  fill.plan_->segment = seg.data;
  fill.plan_->segment_bytes = seg.bytes;
  fill.fault_ns_ = std::make_unique<std::atomic<int64_t>>(0);
  return fill;
}

HostPlacementInfo Worker::host_placement() const {
  const runtime::WorkerState& s = state();
  std::lock_guard lock(s.mu);
  return HostPlacementInfo{s.placement.numa_node, s.placement.huge_pages, s.placement.huge_reason,
                           s.placement.stall_seconds, runtime::source_name(s.pool_source)};
}

bool Worker::is_pinned_host(const void* ptr, size_t bytes) const {
  const runtime::CallGuard guard = enter();
  return state_->host_flags(ptr, bytes, nullptr) != 0;
}

// ---- HostFill ----

HostFill::HostFill(HostFill&& other) noexcept { *this = std::move(other); }

HostFill& HostFill::operator=(HostFill&& other) noexcept {
  if (this == &other) return *this;
  if (active()) {
    try {
      finish();
    } catch (const std::exception& e) {
      log(LogLevel::error, std::string("an unfinished pinned-memory fill: ") + e.what());
    }
  }
  owner_ = std::move(other.owner_);
  data_ = std::exchange(other.data_, nullptr);
  bytes_ = std::exchange(other.bytes_, 0);
  huge_ = other.huge_;
  on_fault_ = other.on_fault_;
  finished_ = std::exchange(other.finished_, false);
  plan_ = std::move(other.plan_);
  fault_ns_ = std::move(other.fault_ns_);
  pin_seconds_ = other.pin_seconds_;
  return *this;
}

HostFill::~HostFill() {
  if (!active()) return;
  try {
    finish();
  } catch (const std::exception& e) {
    log(LogLevel::error, std::string("an unfinished pinned-memory fill: ") + e.what());
  }
}

void HostFill::prepare(void* data, size_t bytes) {
  if (!active() || bytes == 0) return;
  // The part of [data, data + bytes) inside the segment, out to whole pages.
  const auto seg = reinterpret_cast<uintptr_t>(data_);
  const auto begin = std::max(reinterpret_cast<uintptr_t>(data), seg);
  const auto end = std::min(reinterpret_cast<uintptr_t>(data) + bytes, seg + bytes_);
  if (begin >= end) return;
  const uintptr_t page = page_size();
  const uintptr_t first = begin & ~(page - 1);
  const uintptr_t last = std::min((end + page - 1) & ~(page - 1), seg + bytes_);
  const Stopwatch watch;
  prefault(reinterpret_cast<void*>(first), last - first, *plan_);
  fault_ns_->fetch_add(static_cast<int64_t>(watch.seconds() * 1e9));
}

void HostFill::finish() {
  if (!active()) return;
  runtime::WorkerState& s = *owner_;
  runtime::CallGuard guard(s);
  finished_ = true;
  if (!guard.entered()) return;  // finalize released it already
  const Stopwatch watch;
  if (on_fault_) {  // pinned already, page by page as the writers faulted it
    std::lock_guard lock(s.mu);
    s.host.end_fill(data_, true);
    pin_seconds_ = watch.seconds();
    return;
  }
  runtime::HostSegment seg;
  seg.source = runtime::SourceKind::anonymous;
  seg.data = data_;
  seg.bytes = bytes_;
  int status = PS_ERR_INTERNAL;
  try {
    status = s.pin_segment(seg);
  } catch (...) {
    std::lock_guard lock(s.mu);
    s.host.end_fill(data_, false);  // released once its blocks are freed
    throw;
  }
  pin_seconds_ = watch.seconds();
  std::lock_guard lock(s.mu);
  s.host.end_fill(data_, status == PS_OK);
  if (status != PS_OK)
    throw Error(ErrorCode::unsupported,
                s.name() + " refused to pin a filled host segment: " + s.api().last_error());
}

void HostFill::abandon() noexcept {
  if (!active()) return;
  finished_ = true;
  runtime::WorkerState& s = *owner_;
  runtime::CallGuard guard(s);
  if (!guard.entered()) return;  // finalize released it already
  try {
    if (on_fault_) {  // registered before its writers: out of the table, unpinned again
      {
        std::lock_guard lock(s.mu);
        s.table.erase(runtime::entry_kind(runtime::SourceKind::anonymous), data_);
      }
      const std::string why =
          s.release_host(runtime::SourceKind::anonymous, {data_, bytes_, nullptr}, true, false);
      if (!why.empty()) log(LogLevel::error, "unpinning an abandoned fill failed: " + why);
    }
    std::vector<runtime::HostPool::Owned> free_now;
    {
      std::lock_guard lock(s.mu);
      s.host.end_fill(data_, false);
      free_now = s.host.take_free_segments(0);  // wholly free already: back now
    }
    if (!free_now.empty()) s.release_segments(free_now, false);
  } catch (...) {  // no memory for a log line: the segment stays for finalize
  }
}

double HostFill::fault_seconds() const noexcept {
  return fault_ns_ ? static_cast<double>(fault_ns_->load()) / 1e9 : 0;
}

std::string HostFill::pages() const {
  if (data_ == nullptr) return "";
  if (!huge_) return "base";
  if (!plan_ || !plan_->abandoned.load()) return "huge";
  return "huge, then base after a stall of " +
         std::to_string(static_cast<int>(plan_->slowest_ns.load() / 1000000)) + " ms";
}

}  // namespace pinstage
