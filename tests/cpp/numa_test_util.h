// Test helpers for NUMA placement, asked of the kernel directly (not through pinstage):
// the memory policy of an address and the node of every page of a range.
#pragma once

#include <sys/syscall.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "pinstage/pages.h"

namespace pinstage::test {

constexpr int kMpolDefault = 0, kMpolBind = 2;

// The policy get_mempolicy(MPOL_F_ADDR) reports for the range holding `addr`: its mode
// and the first word of its node mask (node k = bit k).
struct NumaPolicy {
  int mode = -1;
  unsigned long mask = 0;
  bool operator==(const NumaPolicy&) const = default;
};

inline NumaPolicy numa_policy_of(const void* addr) {
  NumaPolicy policy;
  unsigned long mask[16] = {};  // 1024 nodes
  if (syscall(SYS_get_mempolicy, &policy.mode, mask, 1024 + 1, addr, 2 /*MPOL_F_ADDR*/) != 0)
    return NumaPolicy{};
  policy.mask = mask[0];
  return policy;
}

// The node of every page of [data, data + bytes), by move_pages(0, n, pages, NULL,
// status, 0): a node id, or a negative errno (-ENOENT: not resident).
inline std::vector<int> page_nodes(const void* data, size_t bytes) {
  const uintptr_t page = page_size();
  const uintptr_t first = reinterpret_cast<uintptr_t>(data) & ~(page - 1);
  const uintptr_t end = reinterpret_cast<uintptr_t>(data) + bytes;
  std::vector<void*> pages;
  for (uintptr_t p = first; p < end; p += page) pages.push_back(reinterpret_cast<void*>(p));
  std::vector<int> status(pages.size(), -1);
  if (syscall(SYS_move_pages, 0, pages.size(), pages.data(), nullptr, status.data(), 0) != 0)
    return {};
  return status;
}

}  // namespace pinstage::test
