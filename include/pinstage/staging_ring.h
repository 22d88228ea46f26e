// StagingRing: a few pinned host buffers that bytes pass through on their way between
// pageable host memory and device memory, so that the host fills buffer k+1 while buffer
// k's device copy is in flight. Used by the Binder's staged uploads and upload
// verification, and meant for any streaming to the device (e.g. file chunks). See
// docs/bind.md, "The staging ring".
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "pinstage/export.h"
#include "pinstage/worker.h"

namespace pinstage {

// Calls fn(offset, length) for consecutive pieces of [0, bytes), each of at most `chunk`
// bytes (chunk >= 1), in order; the last piece may be shorter. No call when bytes is 0.
// The one chunk loop of the bind phase: direct copies, ring uploads and read-backs.
template <class Fn>
void for_each_chunk(size_t bytes, size_t chunk, Fn&& fn) {
  for (size_t offset = 0; offset < bytes;) {
    const size_t length = std::min(chunk, bytes - offset);
    fn(offset, length);
    offset += length;  // never past `bytes`, so no overflow for a huge chunk
  }
}

// A ring of `buffer_count` pinned buffers of `buffer_bytes` each, taken from a Worker
// once and reused, with one Event per buffer recorded after the buffer's device copy.
// All copies go on one Stream, borrowed from the caller.
//
// The primitives: advance() hands out the next buffer in turn (first waiting on its Event
// if its previous copy may still be in flight); enqueue_to_device() / enqueue_to_host()
// queue that buffer's copy; drain() waits for everything queued. upload() and readback()
// are the chunked loops over them. Not thread-safe: one user at a time.
//
// Failures: a failed copy surfaces as the Worker's Error from the enqueue call or from
// drain()/advance() (an Event only says a point was reached; drain()'s stream sync also
// says whether the copies before it worked). After any failure call reset() before
// reusing the ring; the destructor does it too, so no buffer is freed under a copy.
class PINSTAGE_API StagingRing {
 public:
  // Called with a read-back piece once it is in host memory: its bytes (valid only during
  // the call) and length.
  using ArrivalFn = std::function<void(const unsigned char* data, size_t length)>;
  // readback()'s callback: the piece's offset in the range read back, its bytes, length.
  using PieceFn = std::function<void(size_t offset, const unsigned char* data, size_t length)>;

  // Takes buffer_count pinned buffers of buffer_bytes each and their Events from
  // `worker` (require_chip_worker guard). Error(invalid_argument) for a count or size of
  // 0; a failed allocation throws the Worker's Error with nothing kept. `worker` and
  // `stream` must outlive the ring. copy_threads: threads for the host copies of
  // upload() (0 = all cores).
  StagingRing(Worker& worker, Stream& stream, size_t buffer_count, size_t buffer_bytes,
              int copy_threads = 0);
  StagingRing(const StagingRing&) = delete;
  StagingRing& operator=(const StagingRing&) = delete;
  ~StagingRing();  // reset(), then the buffers go back to the worker

  size_t buffer_count() const noexcept { return slots_.size(); }
  size_t buffer_bytes() const noexcept { return buffer_bytes_; }
  // Pinned bytes the ring holds: buffer_count() x buffer_bytes(), for its whole life.
  uint64_t pinned_bytes() const noexcept;

  // The next buffer in turn (buffer_bytes() writable bytes), free to overwrite: when its
  // previous copy may still be in flight, waits on its Event first, and a read-back that
  // copy made is handed to its ArrivalFn before the buffer is returned.
  void* advance();
  // Queues a copy of the first `bytes` of the buffer advance() returned to
  // dst[dst_offset, +bytes) and records the buffer's Event. Error(invalid_argument) when
  // advance() was not called since the last enqueue or bytes > buffer_bytes().
  void enqueue_to_device(const DeviceBuffer& dst, size_t dst_offset, size_t bytes);
  // Queues a copy of src[src_offset, +bytes) into the buffer advance() returned and
  // records its Event; on_arrival gets the bytes from advance() (when the buffer comes
  // round again) or drain(), in the order the reads were queued. Same checks as above.
  void enqueue_to_host(const DeviceBuffer& src, size_t src_offset, size_t bytes,
                       ArrivalFn on_arrival);
  // Waits for every queued copy (a stream sync, which also reports a failed one), then
  // hands the read-backs still pending to their ArrivalFns in queue order. If one of them
  // throws, the rest are dropped and the exception propagates.
  void drain();
  // After a failure: waits for the stream when a copy may be in flight (a sync error is
  // logged, not thrown), marks every buffer free and drops pending ArrivalFns uncalled.
  void reset() noexcept;

  // Host to device: src[0, bytes) to dst[dst_offset, +bytes) in pieces of buffer_bytes(),
  // each copied into the next buffer (split across copy_threads) while earlier pieces'
  // device copies run. Returns once the last piece is queued; drain() waits for it.
  // Uploads may follow each other without a drain() between them: the ring keeps
  // flowing from one to the next (the Binder drains once per bind).
  void upload(const void* src, size_t bytes, const DeviceBuffer& dst, size_t dst_offset);
  // Device to host: src[src_offset, +bytes) in pieces of buffer_bytes(); on_piece(offset,
  // data, length) for each piece once it arrived, in order, the last ones from drain().
  // Reads of later pieces overlap the callbacks of earlier ones.
  void readback(const DeviceBuffer& src, size_t src_offset, size_t bytes, const PieceFn& on_piece);

 private:
  struct Slot {
    PinnedHostBuffer buffer;
    Event done;                // recorded after the slot's last copy
    bool busy = false;         // that copy may still be in flight
    ArrivalFn on_arrival;      // set while a read-back into the slot is pending
    size_t arrival_bytes = 0;  // its length
  };
  Slot& ready_slot(size_t bytes, const char* who);
  void arrive(Slot& slot);

  Worker* worker_;
  Stream* stream_;
  size_t buffer_bytes_;
  int copy_threads_;
  std::vector<Slot> slots_;
  size_t next_ = 0;            // the slot advance() hands out next
  size_t current_ = 0;         // the slot advance() handed out last
  bool have_current_ = false;  // advance() was called and not yet enqueued
};

}  // namespace pinstage
