#include "runtime/registry.h"

namespace pinstage::detail {

bool AllocationRegistry::insert(void* ptr, size_t bytes) {
  if (!entries_.emplace(ptr, bytes).second) return false;
  bytes_ += bytes;
  return true;
}

std::optional<size_t> AllocationRegistry::erase(void* ptr) {
  auto it = entries_.find(ptr);
  if (it == entries_.end()) return std::nullopt;
  const size_t bytes = it->second;
  entries_.erase(it);
  bytes_ -= bytes;
  return bytes;
}

std::vector<std::pair<void*, size_t>> AllocationRegistry::take_all() {
  std::vector<std::pair<void*, size_t>> all(entries_.begin(), entries_.end());
  entries_.clear();
  bytes_ = 0;
  return all;
}

}  // namespace pinstage::detail
