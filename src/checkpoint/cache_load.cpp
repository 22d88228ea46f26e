// Loads through the restart cache (CheckpointLoadOptions::cache, docs/cache.md "Using it"):
// the entry is looked up, filled when asked, and on a hit loaded in the source's stead:
// a host load in map mode maps it in place (read-only, pinned, nothing read or copied); in
// copy mode each file is a private copy-on-write copy pinned writable (file_private: the
// kernel copies the entry's pages as they are pinned, with no zero fill and no read); a
// device load uploads straight from the pinned mappings (map mode's device path, no ring).
#include <optional>
#include <string>

#include "checkpoint/load_internal.h"
#include "pinstage/cache.h"
#include "pinstage/checkpoint.h"
#include "pinstage/clock.h"
#include "pinstage/error.h"

namespace pinstage::detail {

namespace {

// Where a load goes: the entry's checkpoint on a hit or a fill, else the source.
struct CacheRoute {
  std::string state;
  std::string note;
  std::optional<Checkpoint> entry;
  std::string entry_path;
  CheckpointLoadOptions inner;  // the caller's options less the cache: the load it routes to
};

CacheRoute route(const Checkpoint& source, const CheckpointLoadOptions& o, const Worker& worker) {
  WeightCache cache = WeightCache::open();
  CacheLookup l = cache.lookup(source);
  CacheRoute r;
  r.inner = o;
  r.inner.cache = CacheUse::off;
  r.note = l.reason;
  if (o.cache == CacheUse::fill && l.state != "hit") {
    enter_phase(o, "fill");
    CacheFillOptions fill;
    fill.threads = o.threads;
    fill.numa_node = worker.host_numa_node();  // the node of the worker's pinned memory
    l = cache.fill(source, fill);
  }
  r.state = l.state;
  if (l.state != "hit" && l.state != "filled") return r;
  try {
    r.entry = Checkpoint::open(l.entry_path);
    r.entry_path = l.entry_path;
  } catch (const Error& e) {  // removed or refilled since the lookup: the source is there
    r.state = "stale";
    r.note = std::string("the entry could not be opened (") + e.what() + "); loaded the source";
  }
  return r;
}

// The route's outcome in the report; total_s from the lookup on (the routed load timed only
// itself), so it stays the wall time of the whole load.
void stamp(const CacheRoute& r, const Stopwatch& whole, LoadReport& report) {
  report.total_s = whole.seconds();
  report.cache = r.state;
  report.cache_entry = r.entry_path;
  report.cache_note = r.note;
}

// The entry loaded: map mode in place; copy mode as writable private copies, or, where
// they do not fit the pin budget, copied from the entry as copy mode copies.
HostLoad load_entry(const Checkpoint& entry, Worker& worker, const CheckpointLoadOptions& o,
                    const std::vector<std::string>* names) {
  if (o.mode == LoadMode::map) return load_to_host(entry, worker, o, names);
  CheckpointLoadOptions mapped = o;
  mapped.direct = false;  // the entry is memory: there is no page cache to bypass
  try {
    HostLoad out = map_to_host(entry, selected(entry, names, "load_to_host"), worker, mapped, true);
    out.report.mode = "copy";
    out.report.map_note =
        "a cache hit: each file mapped as a private copy-on-write copy (file_private), pinned "
        "writable, with nothing read";
    return out;
  } catch (const Error& e) {
    // Over the pin budget, or no memory for the copies (a hugetlbfs entry's private copy
    // takes huge pages of the reservation): copy mode's reads from the entry instead.
    if (e.code() != ErrorCode::out_of_memory && e.code() != ErrorCode::io) throw;
    HostLoad out = load_to_host(entry, worker, o, names);
    const std::string why = e.what();
    out.report.map_note = "a cache hit, read from the entry: no private copy could be mapped (" +
                          why.substr(0, why.find(". ")) + ")";
    return out;
  }
}

}  // namespace

HostLoad load_host_through_cache(const Checkpoint& source, Worker& worker,
                                 const CheckpointLoadOptions& options,
                                 const std::vector<std::string>* names) {
  const Stopwatch whole;
  const CacheRoute r = route(source, options, worker);
  HostLoad out = r.entry ? load_entry(*r.entry, worker, r.inner, names)
                         : load_to_host(source, worker, r.inner, names);
  stamp(r, whole, out.report);
  return out;
}

DeviceLoad load_device_through_cache(const Checkpoint& source, Worker& worker,
                                     const CheckpointLoadOptions& options,
                                     const std::vector<std::string>* names) {
  const Stopwatch whole;
  const CacheRoute r = route(source, options, worker);
  CheckpointLoadOptions inner = r.inner;
  const Checkpoint& from = r.entry ? *r.entry : source;
  if (r.entry) {  // straight from the pinned mappings of the entry
    inner.mode = LoadMode::map;
    inner.direct = false;
  }
  DeviceLoad out = names != nullptr ? load_to_device(from, worker, inner, *names)
                                    : load_to_device(from, worker, inner);
  stamp(r, whole, out.report);
  return out;
}

}  // namespace pinstage::detail
