// Note [One allocation table]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A worker's AllocationTable is the only record of what its backend handed out: pinned
// host and device allocations (as the ps_allocation the backend returned, handle
// included), streams and events. Backends keep no per-pointer lists. Every pointer the
// runtime passes to a slot has been checked here first (a free of an unknown pointer is
// Error(unknown_pointer); a copy or execute argument must lie inside one live device
// allocation), and every entry goes back to the backend exactly once: on release, or at
// finalize, which frees through the backend once and then destroys the bare context.
// A release the backend refuses moves the entry to the failed list: no longer usable,
// still counted (WorkerStats::failed_free_*), and released again at finalize.
#include "runtime/allocation_table.h"

namespace pinstage::runtime {

bool AllocationTable::insert(EntryKind kind, const ps_allocation& entry) {
  auto& map = entries_[index(kind)];
  if (failed_[index(kind)].count(reinterpret_cast<uintptr_t>(entry.ptr)) != 0) return false;
  if (!map.emplace(reinterpret_cast<uintptr_t>(entry.ptr), entry).second) return false;
  bytes_[index(kind)] += entry.bytes;
  return true;
}

std::optional<ps_allocation> AllocationTable::erase(EntryKind kind, const void* ptr) {
  auto& map = entries_[index(kind)];
  auto it = map.find(reinterpret_cast<uintptr_t>(ptr));
  if (it == map.end()) return std::nullopt;
  const ps_allocation entry = it->second;
  map.erase(it);
  bytes_[index(kind)] -= entry.bytes;
  return entry;
}

bool AllocationTable::contains(EntryKind kind, const void* ptr, size_t bytes) const {
  const auto& map = entries_[index(kind)];
  const auto addr = reinterpret_cast<uintptr_t>(ptr);
  auto it = map.upper_bound(addr);
  if (it == map.begin()) return false;
  --it;
  const uintptr_t offset = addr - it->first;
  return offset < it->second.bytes && bytes <= it->second.bytes - offset;
}

bool AllocationTable::has(EntryKind kind, const void* ptr) const {
  return entries_[index(kind)].count(reinterpret_cast<uintptr_t>(ptr)) != 0;
}

namespace {

// Empties a list and its byte count, returning its entries in address order.
std::vector<ps_allocation> drain(std::map<uintptr_t, ps_allocation>& map, uint64_t& bytes) {
  std::vector<ps_allocation> all;
  all.reserve(map.size());
  for (const auto& [addr, entry] : map) all.push_back(entry);
  map.clear();
  bytes = 0;
  return all;
}

}  // namespace

std::vector<ps_allocation> AllocationTable::snapshot(EntryKind kind) const {
  std::vector<ps_allocation> all;
  for (const auto& [addr, entry] : entries_[index(kind)]) all.push_back(entry);
  return all;
}

std::vector<ps_allocation> AllocationTable::take_all(EntryKind kind) {
  return drain(entries_[index(kind)], bytes_[index(kind)]);
}

void AllocationTable::add_failed(EntryKind kind, const ps_allocation& entry) {
  if (failed_[index(kind)].emplace(reinterpret_cast<uintptr_t>(entry.ptr), entry).second)
    failed_bytes_[index(kind)] += entry.bytes;
}

std::vector<ps_allocation> AllocationTable::take_failed(EntryKind kind) {
  return drain(failed_[index(kind)], failed_bytes_[index(kind)]);
}

}  // namespace pinstage::runtime
