#include "tensor/memory.h"

#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>

#include "pinstage/parallel.h"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14
#endif

namespace pinstage::detail {

namespace {
std::atomic<bool> g_populate_supported{true};
}

void populate_for_write(void* data, size_t bytes) noexcept {
  if (!g_populate_supported.load(std::memory_order_relaxed) || data == nullptr) return;
  const auto begin = reinterpret_cast<uintptr_t>(data);
  const uintptr_t first = (begin + kPageSize - 1) & ~(uintptr_t{kPageSize} - 1);
  const uintptr_t last = (begin + bytes) & ~(uintptr_t{kPageSize} - 1);
  if (last <= first) return;
  if (madvise(reinterpret_cast<void*>(first), last - first, MADV_POPULATE_WRITE) != 0 &&
      errno == EINVAL)
    g_populate_supported.store(false, std::memory_order_relaxed);  // an older kernel
}

double first_touch(void* data, size_t bytes, int threads) {
  auto* base = static_cast<volatile unsigned char*>(data);
  const size_t pages = (bytes + kPageSize - 1) / kPageSize;
  const auto t0 = std::chrono::steady_clock::now();
  parallel_for(
      pages, 256,
      [&](size_t begin, size_t end) {
        for (size_t p = begin; p < end; ++p) base[p * kPageSize] = 0;
      },
      threads);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double populate_all(void* data, size_t bytes, int threads) {
  constexpr size_t kPiece = size_t{256} << 10;
  auto* base = static_cast<unsigned char*>(data);
  const size_t pieces = (bytes + kPiece - 1) / kPiece;
  const auto t0 = std::chrono::steady_clock::now();
  parallel_for(
      pieces, 16,
      [&](size_t begin, size_t end) {
        for (size_t p = begin; p < end; ++p)
          populate_for_write(base + p * kPiece, std::min(kPiece, bytes - p * kPiece));
      },
      threads);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace pinstage::detail
