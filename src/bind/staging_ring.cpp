// StagingRing: k pinned buffers cycled between host copies and device copies. See
// include/pinstage/staging_ring.h and docs/bind.md.
#include "pinstage/staging_ring.h"

#include <cstring>
#include <exception>
#include <string>
#include <utility>

#include "pinstage/log.h"
#include "pinstage/parallel.h"

namespace pinstage {

namespace {

// Host copy into a staging buffer. A piece is a few MiB, so it is split finer than
// parallel_memcpy's grain: on a many-core host the copy into the ring must outrun the
// device link, which takes more than the two threads a 4 MiB grain would give 8 MiB. The
// CPU never reads a staging buffer again (the device does), so its lines are streamed.
void ring_copy(void* dst, const unsigned char* src, size_t bytes, int threads) {
  constexpr size_t kGrain = size_t{512} << 10;
  auto* d = static_cast<unsigned char*>(dst);
  parallel_for(
      bytes, kGrain,
      [&](size_t begin, size_t end) { stream_copy(d + begin, src + begin, end - begin); }, threads);
}

}  // namespace

StagingRing::StagingRing(Worker& worker, Stream& stream, size_t buffer_count, size_t buffer_bytes,
                         int copy_threads)
    : worker_(&worker), stream_(&stream), buffer_bytes_(buffer_bytes), copy_threads_(copy_threads) {
  require_chip_worker(worker, "StagingRing");
  if (buffer_count == 0 || buffer_bytes == 0)
    throw Error(ErrorCode::invalid_argument,
                "StagingRing needs at least one buffer of at least one byte, got " +
                    std::to_string(buffer_count) + " x " + std::to_string(buffer_bytes) + " bytes");
  // Built aside and moved in: a failed allocation releases the buffers taken so far.
  std::vector<Slot> slots(buffer_count);
  for (auto& slot : slots) {
    slot.buffer = worker.alloc_pinned_host(buffer_bytes);
    slot.done = worker.create_event();
  }
  slots_ = std::move(slots);
}

StagingRing::~StagingRing() { reset(); }

uint64_t StagingRing::pinned_bytes() const noexcept {
  uint64_t total = 0;
  for (const auto& slot : slots_) total += slot.buffer.size();
  return total;
}

void StagingRing::arrive(Slot& slot) {
  if (!slot.on_arrival) return;
  // Taken out first: a callback that throws must not run again on the next turn.
  ArrivalFn fn = std::exchange(slot.on_arrival, nullptr);
  fn(static_cast<const unsigned char*>(slot.buffer.data()), slot.arrival_bytes);
}

void* StagingRing::advance() {
  Slot& slot = slots_[next_];
  current_ = next_;
  next_ = (next_ + 1) % slots_.size();
  have_current_ = false;
  if (slot.busy) {
    worker_->wait(slot.done);
    slot.busy = false;
  }
  arrive(slot);
  have_current_ = true;
  return slot.buffer.data();
}

StagingRing::Slot& StagingRing::ready_slot(size_t bytes, const char* who) {
  if (!have_current_)
    throw Error(ErrorCode::invalid_argument, std::string("StagingRing::") + who +
                                                 ": call advance() first; each buffer " +
                                                 "advance() hands out takes one copy");
  if (bytes > buffer_bytes_)
    throw Error(ErrorCode::invalid_argument, std::string("StagingRing::") + who + ": " +
                                                 std::to_string(bytes) + " bytes exceed the " +
                                                 std::to_string(buffer_bytes_) + "-byte buffer");
  have_current_ = false;
  return slots_[current_];
}

void StagingRing::enqueue_to_device(const DeviceBuffer& dst, size_t dst_offset, size_t bytes) {
  Slot& slot = ready_slot(bytes, "enqueue_to_device");
  worker_->copy_to_device_async(dst, dst_offset, slot.buffer.data(), bytes, *stream_);
  worker_->record(slot.done, *stream_);
  slot.busy = true;
}

void StagingRing::enqueue_to_host(const DeviceBuffer& src, size_t src_offset, size_t bytes,
                                  ArrivalFn on_arrival) {
  Slot& slot = ready_slot(bytes, "enqueue_to_host");
  worker_->copy_to_host_async(slot.buffer.data(), src, src_offset, bytes, *stream_);
  worker_->record(slot.done, *stream_);
  slot.busy = true;
  slot.on_arrival = std::move(on_arrival);
  slot.arrival_bytes = bytes;
}

void StagingRing::drain() {
  worker_->synchronize(*stream_);
  for (auto& slot : slots_) slot.busy = false;
  // The oldest pending read sits at next_: slots are handed out in turn.
  for (size_t k = 0; k < slots_.size(); ++k) {
    Slot& slot = slots_[(next_ + k) % slots_.size()];
    try {
      arrive(slot);
    } catch (...) {
      for (auto& s : slots_) s.on_arrival = nullptr;
      throw;
    }
  }
}

void StagingRing::reset() noexcept {
  // Only with a copy in flight: an idle ring may outlive its worker's finalize().
  bool in_flight = false;
  for (const auto& slot : slots_) in_flight = in_flight || slot.busy;
  if (in_flight) {
    try {
      worker_->synchronize(*stream_);
    } catch (const std::exception& e) {
      log(LogLevel::warn, std::string("StagingRing: synchronizing after a failure: ") + e.what());
    }
  }
  for (auto& slot : slots_) {
    slot.busy = false;
    slot.on_arrival = nullptr;
  }
  have_current_ = false;
}

void StagingRing::upload(const void* src, size_t bytes, const DeviceBuffer& dst,
                         size_t dst_offset) {
  const auto* from = static_cast<const unsigned char*>(src);
  for_each_chunk(bytes, buffer_bytes_, [&](size_t offset, size_t length) {
    void* buffer = advance();
    ring_copy(buffer, from + offset, length, copy_threads_);
    enqueue_to_device(dst, dst_offset + offset, length);
  });
}

void StagingRing::readback(const DeviceBuffer& src, size_t src_offset, size_t bytes,
                           const PieceFn& on_piece) {
  for_each_chunk(bytes, buffer_bytes_, [&](size_t offset, size_t length) {
    advance();
    enqueue_to_host(
        src, src_offset + offset, length,
        [on_piece, offset](const unsigned char* data, size_t n) { on_piece(offset, data, n); });
  });
}

}  // namespace pinstage
