// The one table of what a worker's backend handed out. See Note [One allocation table].
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <vector>

#include "pinstage/backend/platform_abi.h"
#include "runtime/host_memory/host_source.h"

namespace pinstage::runtime {

// What an entry is. Streams and events are entries too (ptr = the handle, bytes = 0), so
// finalize can release them before the context without the backend keeping a list.
// pageable_host: a pinned request served with pageable memory the runtime mapped itself
// (PINSTAGE_PIN_POLICY=fallback); it never goes to the backend. Then one kind per host
// source (host_source.h), in SourceKind order, derived by entry_kind(): every pinned segment,
// whoever made it, pooled or a file mapping, is in the table once it is pinned.
enum class EntryKind {
  device,
  stream,
  event,
  pageable_host,
  host_segment,  // the first of kSourceKindCount kinds, one per source: entry_kind(source)
};
inline constexpr size_t kEntryKindCount =
    static_cast<size_t>(EntryKind::host_segment) + kSourceKindCount;

// The table kind of a source's pinned segments, and back.
constexpr EntryKind entry_kind(SourceKind source) {
  return static_cast<EntryKind>(static_cast<size_t>(EntryKind::host_segment) +
                                static_cast<size_t>(source));
}
constexpr bool is_host_segment(EntryKind kind) { return kind >= EntryKind::host_segment; }
constexpr SourceKind source_of(EntryKind kind) {
  return static_cast<SourceKind>(static_cast<size_t>(kind) -
                                 static_cast<size_t>(EntryKind::host_segment));
}

// Not thread-safe by itself: WorkerState guards it with its mutex.
class AllocationTable {
 public:
  // False when `entry.ptr` is already live or awaiting a retried free for `kind` (a
  // backend reusing an address).
  bool insert(EntryKind kind, const ps_allocation& entry);
  // Records an entry whose release the backend refused: no longer live (no copy may use
  // it), still the backend's, released again at finalize (take_failed).
  void add_failed(EntryKind kind, const ps_allocation& entry);
  std::vector<ps_allocation> take_failed(EntryKind kind);
  uint64_t failed_bytes(EntryKind kind) const noexcept { return failed_bytes_[index(kind)]; }
  uint64_t failed_count(EntryKind kind) const noexcept { return failed_[index(kind)].size(); }
  // The entry for exactly `ptr`, now removed; nullopt when it is not live.
  std::optional<ps_allocation> erase(EntryKind kind, const void* ptr);
  // The one range check: [ptr, ptr + bytes) lies inside one live entry of `kind`.
  bool contains(EntryKind kind, const void* ptr, size_t bytes) const;
  bool has(EntryKind kind, const void* ptr) const;
  // Every live entry of `kind`, left in place.
  std::vector<ps_allocation> snapshot(EntryKind kind) const;
  // Every live entry of `kind`, leaving none (finalize's reclaim).
  std::vector<ps_allocation> take_all(EntryKind kind);
  uint64_t bytes(EntryKind kind) const noexcept { return bytes_[index(kind)]; }
  uint64_t count(EntryKind kind) const noexcept { return entries_[index(kind)].size(); }

 private:
  static size_t index(EntryKind kind) { return static_cast<size_t>(kind); }
  // Ordered by address so a range finds its allocation with one lookup.
  std::array<std::map<uintptr_t, ps_allocation>, kEntryKindCount> entries_;
  std::array<uint64_t, kEntryKindCount> bytes_{};
  std::array<std::map<uintptr_t, ps_allocation>, kEntryKindCount> failed_;
  std::array<uint64_t, kEntryKindCount> failed_bytes_{};
};

}  // namespace pinstage::runtime
