// The one table of what a worker's backend handed out. See Note [One allocation table].
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <vector>

#include "pinstage/backend/platform_abi.h"

namespace pinstage::runtime {

// What an entry is. Streams and events are entries too (ptr = the handle, bytes = 0), so
// finalize can release them before the context without the backend keeping a list.
enum class EntryKind { pinned_host, device, stream, event };
inline constexpr size_t kEntryKindCount = 4;

// Not thread-safe by itself: WorkerState guards it with its mutex.
class AllocationTable {
 public:
  // False when `entry.ptr` is already live for `kind` (a backend reusing an address).
  bool insert(EntryKind kind, const ps_allocation& entry);
  // The entry for exactly `ptr`, now removed; nullopt when it is not live.
  std::optional<ps_allocation> erase(EntryKind kind, const void* ptr);
  // The one range check: [ptr, ptr + bytes) lies inside one live entry of `kind`.
  bool contains(EntryKind kind, const void* ptr, size_t bytes) const;
  bool has(EntryKind kind, const void* ptr) const;
  // Every live entry of `kind`, leaving none (finalize's reclaim).
  std::vector<ps_allocation> take_all(EntryKind kind);
  uint64_t bytes(EntryKind kind) const noexcept { return bytes_[index(kind)]; }
  uint64_t count(EntryKind kind) const noexcept { return entries_[index(kind)].size(); }

 private:
  static size_t index(EntryKind kind) { return static_cast<size_t>(kind); }
  // Ordered by address so a range finds its allocation with one lookup.
  std::array<std::map<uintptr_t, ps_allocation>, kEntryKindCount> entries_;
  std::array<uint64_t, kEntryKindCount> bytes_{};
};

}  // namespace pinstage::runtime
