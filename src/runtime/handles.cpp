// The handles a Worker hands out: buffers, streams and events, each holding the worker's
// state as its owner token (Note [Pinned memory lifecycle] in worker.cpp).
#include <utility>

#include "pinstage/log.h"
#include "runtime/worker_state.h"

namespace pinstage {

// ---- Buffer ----

template <MemoryKind Kind>
Buffer<Kind>::Buffer(std::shared_ptr<runtime::WorkerState> owner, void* data, size_t size) noexcept
    : owner_(std::move(owner)), data_(data), size_(size) {}

template <MemoryKind Kind>
Buffer<Kind>::Buffer(Buffer&& other) noexcept
    : owner_(std::move(other.owner_)),
      data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)) {}

template <MemoryKind Kind>
Buffer<Kind>& Buffer<Kind>::operator=(Buffer&& other) noexcept {
  if (this != &other) {
    reset();
    owner_ = std::move(other.owner_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

template <MemoryKind Kind>
Buffer<Kind>::~Buffer() {
  reset();
}

template <MemoryKind Kind>
bool Buffer<Kind>::valid() const noexcept {
  if (!owner_ || data_ == nullptr) return false;
  std::lock_guard lock(owner_->mu);
  return owner_->live;
}

template <MemoryKind Kind>
void Buffer<Kind>::reset() noexcept {
  if (data_ == nullptr) return;
  void* ptr = std::exchange(data_, nullptr);
  size_ = 0;
  auto owner = std::move(owner_);
  try {
    owner->free(Kind, ptr);
  } catch (const std::exception& e) {
    log(LogLevel::error, std::string("releasing a buffer failed: ") + e.what());
  }
}

template class PINSTAGE_API Buffer<MemoryKind::pinned_host>;
template class PINSTAGE_API Buffer<MemoryKind::device>;

// ---- Stream and Event ----

using runtime::entry_kind;

template <QueueKind Kind>
QueueHandle<Kind>::QueueHandle(QueueHandle&& other) noexcept {
  *this = std::move(other);
}

template <QueueKind Kind>
QueueHandle<Kind>& QueueHandle<Kind>::operator=(QueueHandle&& other) noexcept {
  if (this == &other) return *this;
  if (owner_ && handle_ != nullptr) owner_->destroy_handle(entry_kind(Kind), handle_);
  owner_ = std::move(other.owner_);
  handle_ = std::exchange(other.handle_, nullptr);
  return *this;
}

template <QueueKind Kind>
QueueHandle<Kind>::~QueueHandle() {
  if (owner_ && handle_ != nullptr) owner_->destroy_handle(entry_kind(Kind), handle_);
}

template class PINSTAGE_API QueueHandle<QueueKind::stream>;
template class PINSTAGE_API QueueHandle<QueueKind::event>;

}  // namespace pinstage
