#include "pinstage/free_ranges.h"

#include <iterator>

namespace pinstage {

void FreeRanges::erase(std::map<uint64_t, uint64_t>::iterator it) {
  by_size_.erase({it->second, it->first});
  free_bytes_ -= it->second;
  by_offset_.erase(it);
}

void FreeRanges::give(uint64_t offset, uint64_t size) {
  if (size == 0) return;
  auto next = by_offset_.lower_bound(offset);
  if (next != by_offset_.end() && next->first == offset + size && !fences_.contains(next->first)) {
    size += next->second;
    auto after = std::next(next);
    erase(next);
    next = after;
  }
  if (next != by_offset_.begin() && !fences_.contains(offset)) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == offset) {
      offset = prev->first;
      size += prev->second;
      erase(prev);
    }
  }
  by_offset_[offset] = size;
  by_size_.insert({size, offset});
  free_bytes_ += size;
}

std::optional<uint64_t> FreeRanges::take(uint64_t size) {
  if (size == 0) return std::nullopt;
  const auto fit = by_size_.lower_bound({size, 0});
  if (fit == by_size_.end()) return std::nullopt;
  const auto [have, offset] = *fit;
  erase(by_offset_.find(offset));
  if (have > size) {  // the rest stays free, where it was (no merge needed: neighbours are taken)
    by_offset_[offset + size] = have - size;
    by_size_.insert({have - size, offset + size});
    free_bytes_ += have - size;
  }
  return offset;
}

bool FreeRanges::remove(uint64_t offset, uint64_t size) {
  const auto it = by_offset_.find(offset);
  if (it == by_offset_.end() || it->second != size) return false;
  erase(it);
  return true;
}

}  // namespace pinstage
