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
  if (span_ > 0) free_.give(0, span_);
}

DevicePool::~DevicePool() { munmap(base_, reserved_); }

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

void DevicePool::back(uint64_t bytes) {
  if (bytes > span_)
    throw Error(ErrorCode::invalid_argument,
                "cannot back " + bytes_text(bytes) + " of a device pool of " + bytes_text(span_) +
                    ": config backed_bytes is at most the device's capacity");
  std::lock_guard lock(mu_);
  back_up_to(bytes);
}

void* DevicePool::allocate(size_t bytes) {
  const uint64_t block = round_up(bytes, kAlignment);
  std::lock_guard lock(mu_);
  // Best fit; among equal sizes the lowest address, so the backed prefix is reused first.
  const std::optional<uint64_t> offset =
      bytes == 0 || block < bytes ? std::nullopt : free_.take(block);
  if (!offset)
    throw Error(ErrorCode::out_of_memory,
                "device out of memory: asked for " + bytes_text(bytes) + ", " +
                    bytes_text(span_ - used_) + " of " + bytes_text(span_) +
                    " free, the largest free block is " + bytes_text(free_.largest()));
  try {
    back_up_to(*offset + block);
  } catch (...) {
    free_.give(*offset, block);  // the pool is unchanged
    throw;
  }
  used_ += block;
  return base_ + *offset;
}

void DevicePool::release(void* ptr, size_t bytes) {
  const uint64_t block = round_up(bytes, kAlignment);
  std::lock_guard lock(mu_);
  free_.give(static_cast<uint64_t>(static_cast<char*>(ptr) - base_), block);
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
                   .free_blocks = free_.count(),
                   .largest_free = free_.largest(),
                   .backing_seconds = backing_seconds_};
}

}  // namespace pinstage::sim
