// The caching pool of pinned host memory a worker hands out. See Note [Host memory pool]
// in host_pool.cpp. Not thread-safe by itself: WorkerState's mutex guards it, and the
// backend calls (segments, events) run in WorkerState, mostly outside that lock.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <vector>

#include "pinstage/backend/platform_abi.h"
#include "pinstage/free_ranges.h"
#include "pinstage/worker.h"
#include "runtime/host_memory/host_source.h"

namespace pinstage::runtime {

class HostPool {
 public:
  // Blocks are carved in whole pages (the page is the one rounding, never a power of
  // two); a segment made for a miss is the request rounded up to kSegmentUnit.
  static constexpr size_t kSegmentUnit = size_t{2} << 20;

  // The segment to map for a request of `bytes` that missed the cache.
  static size_t segment_bytes_for(size_t bytes);
  // `bytes` in whole blocks.
  static size_t block_bytes_for(size_t bytes);

  // A cached block for `bytes` (> 0), now live; nullopt when none fits. Counted as a hit
  // or a miss unless `retry` (the take after a miss mapped its segment).
  std::optional<void*> take(size_t bytes, bool retry = false);
  // A segment of the pool as it is handed back for release: what the source made, and
  // whether it is pinned (in the table) yet.
  struct Owned {
    ps_allocation allocation;
    SourceKind source = SourceKind::anonymous;
    bool pinned = true;
  };
  // Enters a segment a source just made; its bytes become cached. `segment.pinned`: it is
  // registered (or vendor) and in the table. `filling`: a HostFill's, faulted by its writers
  // (pinned as they fault it, or after them): its blocks are not pinned memory until
  // end_fill, and no trim takes it meanwhile.
  void add_segment(const Owned& segment, double alloc_seconds, bool filling = false);
  // The fill of the segment at `base` is over: pinned (and in the table), or (false) left
  // unpinned and out of the table, to be released once wholly free.
  void end_fill(const void* base, bool pinned);

  // A live block, taken out of the live set by release().
  struct Released {
    void* ptr = nullptr;
    size_t span = 0;                  // block bytes (whole pages)
    std::vector<ps_stream*> streams;  // streams whose copies read or wrote it
  };
  // Takes the live block at exactly `ptr` out of the live set; nullopt when none.
  std::optional<Released> release(void* ptr);
  // Makes a released block reusable now.
  void recycle(void* ptr, size_t span);
  // Holds a released block until every event has been reached (poll).
  void park(void* ptr, size_t span, std::vector<ps_event*> events);
  // The parked blocks whose events `reached` says are all complete become reusable;
  // returns their events for the caller to destroy.
  template <class Reached>
  std::vector<ps_event*> poll(Reached&& reached);
  // Every parked event (finalize), leaving none parked.
  std::vector<ps_event*> take_parked_events();

  // Removes whole free segments, least recently used first, until at least `bytes` are
  // removed or none is left (bytes = UINT64_MAX: all of them), and returns them for
  // release.
  // Wholly free segments whose fill failed come first, whatever `bytes`.
  std::vector<Owned> take_free_segments(uint64_t bytes);
  // The same, down to `limit` cached bytes.
  std::vector<Owned> over_limit(uint64_t limit);
  // Every segment (finalize), leaving the pool empty; the live blocks are dropped.
  std::vector<Owned> take_all_segments();
  void count_release(double seconds);  // one segment released, in `seconds`

  // The one range query: [ptr, ptr + bytes) lies inside one live block of a pinned
  // segment (a block of a segment still being filled is not pinned memory yet).
  bool contains(const void* ptr, size_t bytes) const;
  // As contains(), and notes that `stream` may touch the block (Note [Host memory pool]).
  bool note_use(const void* ptr, size_t bytes, ps_stream* stream);

  uint64_t cached_bytes() const noexcept { return free_.free_bytes(); }
  uint64_t largest_cached() const noexcept { return free_.largest(); }
  uint64_t live_count() const noexcept { return live_.size(); }
  uint64_t live_bytes() const noexcept { return stats_.allocated_bytes; }
  HostMemoryStats stats() const;
  void add_time(double alloc_seconds, double free_seconds);

 private:
  struct Block {
    size_t bytes = 0;  // as requested
    size_t span = 0;   // whole pages
    std::vector<ps_stream*> streams;
  };
  enum class State { pinned, filling, unpinned };
  struct Segment {
    Owned owned;  // the source's record
    State state = State::pinned;
    uint64_t last_use = 0;  // the pool's clock when a block was last carved from it
  };
  // The live block holding [ptr, ptr + bytes) in a pinned segment, or nullptr.
  const Block* pinned_block(const void* ptr, size_t bytes) const;
  struct Parked {
    void* ptr;
    size_t span;
    std::vector<ps_event*> events;
  };

  FreeRanges free_;
  std::map<uintptr_t, Segment> segments_;  // by base address
  uint64_t clock_ = 0;
  std::map<uintptr_t, Block> live_;
  std::vector<Parked> parked_;
  HostMemoryStats stats_;
};

template <class Reached>
std::vector<ps_event*> HostPool::poll(Reached&& reached) {
  std::vector<ps_event*> done;
  for (size_t i = 0; i < parked_.size();) {
    bool all = true;
    for (ps_event* e : parked_[i].events) all = all && reached(e);
    if (!all) {
      ++i;
      continue;
    }
    done.insert(done.end(), parked_[i].events.begin(), parked_[i].events.end());
    stats_.pending_bytes -= parked_[i].span;
    --stats_.pending_blocks;
    recycle(parked_[i].ptr, parked_[i].span);
    parked_[i] = std::move(parked_.back());
    parked_.pop_back();
  }
  return done;
}

}  // namespace pinstage::runtime
