// The two allocation strategies: pageable (page-aligned, untouched) and pinned (a
// chip-level worker's PinnedHostBuffers).
#include <sys/mman.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "pinstage/error.h"
#include "pinstage/pages.h"
#include "pinstage/tensor.h"
#include "pinstage/worker.h"

namespace pinstage {

namespace {

// At and above this size a storage is its own anonymous mapping: fresh zero pages that
// nobody has touched, returned to the OS on release.
constexpr size_t kMapThreshold = size_t{1} << 20;

std::string oom_message(size_t bytes, const char* how, int err) {
  return "PageableAllocator: cannot allocate " + format_thousands(bytes) + " bytes (" + how + ": " +
         std::strerror(err) + "); free memory or ask for fewer layers";
}

}  // namespace

std::shared_ptr<Storage> PageableAllocator::allocate(size_t bytes) {
  if (bytes == 0) return std::make_shared<Storage>(nullptr, 0, false, nullptr);
  if (bytes > SIZE_MAX - page_size())
    throw Error(ErrorCode::out_of_memory, oom_message(bytes, "size", ENOMEM));
  const size_t rounded = round_up_to_pages(bytes);
  if (rounded >= kMapThreshold) {
    void* ptr = mmap(nullptr, rounded, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (ptr == MAP_FAILED) throw Error(ErrorCode::out_of_memory, oom_message(bytes, "mmap", errno));
    std::shared_ptr<void> owner(ptr, [rounded](void* p) { munmap(p, rounded); });
    return std::make_shared<Storage>(ptr, bytes, false, std::move(owner));
  }
  void* ptr = std::aligned_alloc(page_size(), rounded);
  if (ptr == nullptr)
    throw Error(ErrorCode::out_of_memory, oom_message(bytes, "aligned_alloc", ENOMEM));
  std::shared_ptr<void> owner(ptr, [](void* p) { std::free(p); });
  return std::make_shared<Storage>(ptr, bytes, false, std::move(owner));
}

PinnedAllocator::PinnedAllocator(Worker& worker) : worker_(&worker) {
  require_chip_worker(worker, "PinnedAllocator");
}

void PinnedAllocator::reserve(std::span<const size_t> sizes) {
  size_t total = 0;
  for (size_t bytes : sizes)
    if (bytes > 0) total += round_up_to_pages(bytes);
  fill_ = std::make_unique<HostFill>(worker_->reserve_host_fill(total));
}

void PinnedAllocator::prepare(void* data, size_t bytes) {
  if (fill_) fill_->prepare(data, bytes);
}

void PinnedAllocator::finish() {
  if (fill_) fill_->finish();
}

void PinnedAllocator::abandon() noexcept {
  if (fill_) fill_->abandon();
}

PinnedAllocator::~PinnedAllocator() = default;

std::shared_ptr<Storage> PinnedAllocator::allocate(size_t bytes) {
  if (bytes == 0) return std::make_shared<Storage>(nullptr, 0, true, nullptr);
  // The buffer's own release is a no-op once the worker has reclaimed its memory.
  auto buffer = std::make_shared<PinnedHostBuffer>(worker_->alloc_pinned_host(bytes));
  void* data = buffer->data();
  return std::make_shared<Storage>(data, bytes, true, std::move(buffer));
}

}  // namespace pinstage
