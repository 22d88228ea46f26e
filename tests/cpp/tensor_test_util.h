// Test helpers of the tensor area: an allocator that counts what it hands out and can be
// told to fail, and a helper that returns the pinstage::Error a call throws.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "pinstage/error.h"
#include "pinstage/tensor.h"

namespace pinstage::test {

// Pageable memory whose storages are counted while alive; allocation number
// `fail_at` (1-based; 0 = never) throws Error(out_of_memory).
class CountingAllocator final : public HostAllocator {
 public:
  std::shared_ptr<Storage> allocate(size_t bytes) override {
    const int n = ++calls_;
    if (fail_at_ != 0 && n == fail_at_)
      throw Error(ErrorCode::out_of_memory,
                  "CountingAllocator: allocation " + std::to_string(n) + " fails");
    auto inner = base_.allocate(bytes);
    ++*live_;
    auto counter = live_;
    // The owner keeps the real storage alive and counts its release.
    std::shared_ptr<void> owner(new std::shared_ptr<Storage>(inner), [counter](void* p) {
      delete static_cast<std::shared_ptr<Storage>*>(p);
      --*counter;
    });
    return std::make_shared<Storage>(inner->data(), bytes, false, std::move(owner));
  }
  bool pinned() const override { return false; }
  std::string name() const override { return "counting"; }

  int calls() const { return calls_; }
  int live() const { return *live_; }
  void fail_at(int n) { fail_at_ = n; }

 private:
  PageableAllocator base_;
  int calls_ = 0;
  int fail_at_ = 0;
  std::shared_ptr<std::atomic<int>> live_ = std::make_shared<std::atomic<int>>(0);
};

// n bytes of a fixed pseudo-random pattern (a different one per seed).
inline std::vector<unsigned char> pattern(size_t n, unsigned seed) {
  std::vector<unsigned char> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<unsigned char>((i * 2654435761u + seed) >> 7);
  return v;
}

// A sparse file at `p` whose 8-byte length claims a safetensors header of `header_bytes`
// and whose size holds it: the header limit's test without writing the header. False when
// the file could not be sized.
inline bool write_claimed_header(const std::string& p, uint64_t header_bytes) {
  std::string len(8, '\0');
  for (int i = 0; i < 8; ++i) len[i] = static_cast<char>((header_bytes >> (8 * i)) & 0xff);
  std::ofstream(p, std::ios::binary | std::ios::trunc) << len;
  return ::truncate(p.c_str(), static_cast<off_t>(8 + header_bytes)) == 0;
}

// The Error `fn` throws; fails the test when it throws none.
template <typename F>
Error error_of(F&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e;
  }
  ADD_FAILURE() << "expected a pinstage::Error";
  return Error(ErrorCode::internal, "no error thrown");
}

}  // namespace pinstage::test
