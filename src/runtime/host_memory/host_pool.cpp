// Note [Host memory pool]
// ~~~~~~~~~~~~~~~~~~~~~~~
// Pinning is the expensive part of pinned memory (faults, then a lock or a register), so a
// worker pays it once per byte and reuses it (docs/worker.md, "Host memory pool").
//  - Segments: a request that no cached range fits makes one segment through the worker's
//    pool source (Note [Segment sources]: anonymous pages placed and faulted by the runtime
//    and pinned by the plugin's host_register, or the plugin's own allocation where it has
//    none), sized to the request rounded up to 2 MiB, never to a power of two. reserve()
//    makes one segment of exactly what a load is about to ask for; a HostFill's segment is
//    faulted by the load's readers and pinned behind them (state `filling` until then).
//  - Blocks: carved from segments by the one best-fit allocator (free_ranges.h) in whole
//    pages, merged again on release, never across two segments (a fence at each segment
//    start) so that a whole segment can go back to the OS.
//  - The one table of pinned ranges is the set of live blocks: the copy path asks it and
//    tells the backend (PS_COPY_HOST_PINNED); a freed block is not pinned memory of the
//    user's any more, even while its segment stays locked.
//  - Reuse is safe against queued copies: every async copy notes its stream on the block it
//    touches; freeing such a block records an event on each of those streams and parks the
//    block until event_query says they are reached (ATen's HostBlock streams_). Without
//    event_query the free synchronizes those streams instead.
//  - Bounded: cached bytes above the limit (PINSTAGE_HOST_CACHE_MAX) go back to the OS,
//    whole free segments, least recently used first; empty_cache()/trim(bytes) do it on
//    request.
//  - Pageable fallbacks (PINSTAGE_PIN_POLICY=fallback) never enter the pool.
#include "runtime/host_memory/host_pool.h"

#include <algorithm>
#include <iterator>

#include "pinstage/pages.h"

namespace pinstage::runtime {

namespace {
uint64_t round_up(uint64_t value, uint64_t unit) { return (value + unit - 1) / unit * unit; }
}  // namespace

size_t HostPool::segment_bytes_for(size_t bytes) { return round_up(bytes, kSegmentUnit); }

size_t HostPool::block_bytes_for(size_t bytes) { return round_up_to_pages(bytes); }

std::optional<void*> HostPool::take(size_t bytes, bool retry) {
  const size_t span = block_bytes_for(bytes);
  const std::optional<uint64_t> at = free_.take(span);
  if (!at) {
    if (!retry) ++stats_.misses;
    return std::nullopt;
  }
  if (!retry) ++stats_.hits;
  auto seg = segments_.upper_bound(*at);  // the segment holding the block: recently used
  if (seg != segments_.begin()) std::prev(seg)->second.last_use = ++clock_;
  live_[*at] = Block{bytes, span, {}};
  stats_.allocated_bytes += bytes;
  stats_.allocations += 1;
  stats_.allocated_bytes_peak = std::max(stats_.allocated_bytes_peak, stats_.allocated_bytes);
  stats_.allocations_peak = std::max(stats_.allocations_peak, stats_.allocations);
  return reinterpret_cast<void*>(*at);
}

void HostPool::add_segment(const Owned& segment, double alloc_seconds, bool filling) {
  const auto base = reinterpret_cast<uintptr_t>(segment.allocation.ptr);
  const size_t bytes = block_bytes_for(segment.allocation.bytes);
  const State state = filling ? State::filling : segment.pinned ? State::pinned : State::unpinned;
  segments_[base] = Segment{segment, state, ++clock_};
  free_.add_fence(base);
  free_.give(base, bytes);
  stats_.reserved_bytes += bytes;
  stats_.segments += 1;
  stats_.reserved_bytes_peak = std::max(stats_.reserved_bytes_peak, stats_.reserved_bytes);
  stats_.segments_peak = std::max(stats_.segments_peak, stats_.segments);
  stats_.num_host_alloc += 1;
  stats_.host_alloc_seconds += alloc_seconds;
}

void HostPool::end_fill(const void* base, bool pinned) {
  const auto it = segments_.find(reinterpret_cast<uintptr_t>(base));
  if (it == segments_.end()) return;
  it->second.state = pinned ? State::pinned : State::unpinned;
  it->second.owned.pinned = pinned;
}

std::optional<HostPool::Released> HostPool::release(void* ptr) {
  const auto it = live_.find(reinterpret_cast<uintptr_t>(ptr));
  if (it == live_.end()) return std::nullopt;
  Released out{ptr, it->second.span, std::move(it->second.streams)};
  stats_.allocated_bytes -= it->second.bytes;
  stats_.allocations -= 1;
  live_.erase(it);
  return out;
}

void HostPool::recycle(void* ptr, size_t span) {
  free_.give(reinterpret_cast<uintptr_t>(ptr), span);
}

void HostPool::park(void* ptr, size_t span, std::vector<ps_event*> events) {
  parked_.push_back(Parked{ptr, span, std::move(events)});
  stats_.pending_bytes += span;
  stats_.pending_blocks += 1;
}

std::vector<ps_event*> HostPool::take_parked_events() {
  std::vector<ps_event*> events;
  for (Parked& p : parked_) events.insert(events.end(), p.events.begin(), p.events.end());
  parked_.clear();
  stats_.pending_bytes = 0;
  stats_.pending_blocks = 0;
  return events;
}

std::vector<HostPool::Owned> HostPool::take_free_segments(uint64_t bytes) {
  // Whole free segments: a free range that starts at a segment's base and spans it. A
  // segment being filled is never taken (its writers hold it); a failed fill's goes first.
  std::vector<std::pair<uint64_t, uintptr_t>> whole;  // (last use, base)
  for (const auto& [base, seg] : segments_) {
    if (seg.state == State::filling) continue;
    const uint64_t size = block_bytes_for(seg.owned.allocation.bytes);
    const auto it = free_.ranges().find(base);
    if (it != free_.ranges().end() && it->second == size)
      whole.emplace_back(seg.state == State::unpinned ? 0 : seg.last_use, base);
  }
  // Least recently used first: what a load or a bind just used is what it asks for next.
  std::sort(whole.begin(), whole.end());
  std::vector<Owned> out;
  uint64_t removed = 0;
  for (const auto& [last_use, base] : whole) {
    if (removed >= bytes && last_use != 0) break;
    const Segment& seg = segments_.at(base);
    const uint64_t size = block_bytes_for(seg.owned.allocation.bytes);
    free_.remove(base, size);
    free_.remove_fence(base);
    out.push_back(seg.owned);
    segments_.erase(base);
    stats_.reserved_bytes -= size;
    stats_.segments -= 1;
    removed += size;
  }
  return out;
}

std::vector<HostPool::Owned> HostPool::over_limit(uint64_t limit) {
  const uint64_t cached = free_.free_bytes();
  return take_free_segments(cached > limit ? cached - limit : 0);
}

std::vector<HostPool::Owned> HostPool::take_all_segments() {
  std::vector<Owned> out;
  for (const auto& [base, seg] : segments_) out.push_back(seg.owned);
  segments_.clear();
  live_.clear();
  free_ = FreeRanges{};
  stats_.reserved_bytes = 0;
  stats_.segments = 0;
  stats_.allocated_bytes = 0;
  stats_.allocations = 0;
  return out;
}

void HostPool::count_release(double seconds) {
  stats_.num_host_free += 1;
  stats_.host_free_seconds += seconds;
}

const HostPool::Block* HostPool::pinned_block(const void* ptr, size_t bytes) const {
  const auto p = reinterpret_cast<uintptr_t>(ptr);
  auto it = live_.upper_bound(p);
  if (it == live_.begin()) return nullptr;
  --it;
  const Block& b = it->second;
  if (p - it->first > b.bytes || bytes > b.bytes - (p - it->first)) return nullptr;
  auto seg = segments_.upper_bound(it->first);  // the segment holding the block
  if (seg == segments_.begin() || std::prev(seg)->second.state != State::pinned) return nullptr;
  return &b;
}

bool HostPool::contains(const void* ptr, size_t bytes) const {
  return pinned_block(ptr, bytes) != nullptr;
}

bool HostPool::note_use(const void* ptr, size_t bytes, ps_stream* stream) {
  auto* b = const_cast<Block*>(pinned_block(ptr, bytes));  // live_ is ours to change here
  if (b == nullptr) return false;
  if (stream != nullptr &&
      std::find(b->streams.begin(), b->streams.end(), stream) == b->streams.end())
    b->streams.push_back(stream);
  return true;
}

HostMemoryStats HostPool::stats() const {
  HostMemoryStats s = stats_;
  s.cached_bytes = free_.free_bytes();
  return s;
}

void HostPool::add_time(double alloc_seconds, double free_seconds) {
  stats_.alloc_seconds += alloc_seconds;
  stats_.free_seconds += free_seconds;
}

}  // namespace pinstage::runtime
