#include "backends/sim/device_pool.h"

#include <sys/mman.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "pinstage/clock.h"
#include "pinstage/error.h"
#include "pinstage/pages.h"

namespace pinstage::sim {

namespace {

uint64_t round_up(uint64_t value, uint64_t unit) { return (value + unit - 1) / unit * unit; }

std::string bytes_text(uint64_t bytes) { return std::to_string(bytes) + " bytes"; }

}  // namespace

DevicePool::DevicePool(uint64_t capacity) : span_(capacity / kAlignment * kAlignment) {
  reserved_ = round_up_to_pages(span_ == 0 ? 1 : span_);
  // Address space only: no memory is committed until back_up_to makes pages writable.
  void* p = mmap(nullptr, reserved_, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED)
    throw Error(ErrorCode::out_of_memory,
                "cannot reserve " + bytes_text(reserved_) +
                    " of address space for the device pool: " + std::strerror(errno));
  base_ = static_cast<char*>(p);
  if (span_ > 0) give(0, span_);
}

DevicePool::~DevicePool() { munmap(base_, reserved_); }

void DevicePool::take(uint64_t offset, uint64_t size, uint64_t block) {
  free_by_offset_.erase(offset);
  free_by_size_.erase({size, offset});
  if (size > block) {
    free_by_offset_[offset + block] = size - block;
    free_by_size_.insert({size - block, offset + block});
  }
}

// Inserts [offset, offset+block) into the free lists, merged with free neighbours.
void DevicePool::give(uint64_t offset, uint64_t block) {
  auto next = free_by_offset_.lower_bound(offset);
  if (next != free_by_offset_.end() && next->first == offset + block) {
    block += next->second;
    free_by_size_.erase({next->second, next->first});
    next = free_by_offset_.erase(next);
  }
  if (next != free_by_offset_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == offset) {
      offset = prev->first;
      block += prev->second;
      free_by_size_.erase({prev->second, prev->first});
      free_by_offset_.erase(prev);
    }
  }
  free_by_offset_[offset] = block;
  free_by_size_.insert({block, offset});
}

// Makes [backed_, end) writable and faults it in: the one time those pages cost anything.
void DevicePool::back_up_to(uint64_t end) {
  end = round_up_to_pages(end);
  if (end <= backed_) return;
  Stopwatch watch;
  char* from = base_ + backed_;
  const size_t bytes = end - backed_;
  if (mprotect(from, bytes, PROT_READ | PROT_WRITE) != 0)
    throw Error(ErrorCode::out_of_memory, "cannot back " + bytes_text(bytes) +
                                              " of the device pool: " + std::strerror(errno));
  try {
    prefault(from, bytes);
  } catch (...) {
    madvise(from, bytes, MADV_DONTNEED);
    mprotect(from, bytes, PROT_NONE);
    throw;
  }
  backed_ = end;
  backing_seconds_ += watch.seconds();
}

void* DevicePool::allocate(size_t bytes) {
  const uint64_t block = round_up(bytes, kAlignment);
  std::lock_guard lock(mu_);
  // Best fit; among equal sizes the lowest address, so the backed prefix is reused first.
  auto fit = free_by_size_.lower_bound({block, 0});
  if (bytes == 0 || block < bytes || fit == free_by_size_.end()) {
    const uint64_t largest = free_by_size_.empty() ? 0 : free_by_size_.rbegin()->first;
    throw Error(ErrorCode::out_of_memory,
                "device out of memory: asked for " + bytes_text(bytes) + ", " +
                    bytes_text(span_ - used_) + " of " + bytes_text(span_) +
                    " free, the largest free block is " + bytes_text(largest));
  }
  const auto [size, offset] = *fit;
  back_up_to(offset + block);  // throws before the lists change
  take(offset, size, block);
  used_ += block;
  return base_ + offset;
}

void DevicePool::release(void* ptr, size_t bytes) {
  const uint64_t block = round_up(bytes, kAlignment);
  std::lock_guard lock(mu_);
  give(static_cast<uint64_t>(static_cast<char*>(ptr) - base_), block);
  used_ -= block;
}

uint64_t DevicePool::used() const {
  std::lock_guard lock(mu_);
  return used_;
}

PoolStats DevicePool::stats() const {
  std::lock_guard lock(mu_);
  return PoolStats{.span = span_,
                   .used = used_,
                   .backed = backed_,
                   .free_blocks = free_by_offset_.size(),
                   .largest_free = free_by_size_.empty() ? 0 : free_by_size_.rbegin()->first,
                   .backing_seconds = backing_seconds_};
}

}  // namespace pinstage::sim
