// Binder: allocate, upload (direct or through the staging ring), execute, download,
// release. See docs/bind.md for the pipeline and its failure rules.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <limits>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "pinstage/bind.h"
#include "pinstage/log.h"
#include "pinstage/parallel.h"

namespace pinstage {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

std::string describe_bytes(uint64_t bytes) { return format_thousands(bytes) + " bytes"; }

// Host copy into a staging buffer. A ring piece is a few MiB, so it is split finer than
// parallel_memcpy's grain: on a many-core host the copy into the ring must outrun the
// device link, which takes more than the two threads a 4 MiB grain would give 8 MiB.
void ring_copy(void* dst, const unsigned char* src, size_t bytes, int threads) {
  constexpr size_t kGrain = size_t{512} << 10;
  auto* d = static_cast<unsigned char*>(dst);
  parallel_for(
      bytes, kGrain,
      [&](size_t begin, size_t end) { std::memcpy(d + begin, src + begin, end - begin); }, threads);
}

// Where one tensor lives on the device: a buffer and an offset in it (null buffer for a
// tensor of zero bytes, which has no device memory).
struct Placement {
  const DeviceBuffer* buffer = nullptr;
  size_t offset = 0;
};

// Index of the first byte where a and b differ, or `bytes` when they are equal.
size_t first_difference(const unsigned char* a, const unsigned char* b, size_t bytes, int threads) {
  constexpr size_t kGrain = size_t{1} << 20;
  std::atomic<size_t> first{bytes};
  parallel_for(
      bytes, kGrain,
      [&](size_t begin, size_t end) {
        if (std::memcmp(a + begin, b + begin, end - begin) == 0) return;
        for (size_t j = begin; j < end; ++j) {
          if (a[j] == b[j]) continue;
          size_t seen = first.load();
          while (j < seen && !first.compare_exchange_weak(seen, j)) {
          }
          return;
        }
      },
      threads);
  return first.load();
}

}  // namespace

// The reusable parts of a Binder: its copy stream and the staging ring.
struct Binder::State {
  struct Slot {
    PinnedHostBuffer buffer;
    Event done;         // recorded after the slot's device copy
    bool busy = false;  // a copy from this slot may still be in flight
  };

  bool have_stream = false;
  Stream stream;
  std::vector<Slot> ring;
  size_t next_slot = 0;
};

void validate(const BindOptions& options) {
  constexpr size_t kMaxStagingBuffers = 64;
  constexpr size_t kMaxStagingBufferBytes = size_t{1} << 30;
  if (options.staging_buffers < 1 || options.staging_buffers > kMaxStagingBuffers)
    throw Error(ErrorCode::invalid_argument,
                "BindOptions.staging_buffers is " + std::to_string(options.staging_buffers) +
                    "; it must be in [1, 64] (2 or more let host and device copies overlap)");
  if (options.staging_buffer_bytes < 1 || options.staging_buffer_bytes > kMaxStagingBufferBytes)
    throw Error(ErrorCode::invalid_argument,
                "BindOptions.staging_buffer_bytes is " +
                    format_thousands(options.staging_buffer_bytes) +
                    "; it must be in [1, 1 GiB] (a few MiB is typical)");
  if (options.chunk_bytes < 1)
    throw Error(ErrorCode::invalid_argument,
                "BindOptions.chunk_bytes is 0; it must be at least 1 (default 1 GiB)");
  const size_t a = options.arena_alignment;
  if (a < 1 || a > 4096 || (a & (a - 1)) != 0)
    throw Error(ErrorCode::invalid_argument,
                "BindOptions.arena_alignment is " + std::to_string(a) +
                    "; it must be a power of two in [1, 4096] (default 256)");
  if (options.copy_threads < 0)
    throw Error(ErrorCode::invalid_argument, "BindOptions.copy_threads is " +
                                                 std::to_string(options.copy_threads) +
                                                 "; it must be >= 0 (0 = all cores)");
}

BindError::BindError(ErrorCode code, BindPhase phase, std::string tensor,
                     const std::string& message)
    : Error(code, message), phase_(phase), tensor_(std::move(tensor)) {}

Binder::Binder(Worker& worker, BindOptions options)
    : worker_(&worker), options_(std::move(options)) {
  require_chip_worker(worker, "Binder");
  validate(options_);
  state_ = std::make_unique<State>();
}

Binder::~Binder() = default;

uint64_t Binder::staging_bytes() const noexcept {
  uint64_t total = 0;
  for (const auto& slot : state_->ring) total += slot.buffer.size();
  return total;
}

BindReport Binder::run(const TaskArgs& args) {
  const auto run_start = Clock::now();
  Worker& worker = *worker_;
  State& st = *state_;
  require_chip_worker(worker, "Binder::run");

  BindReport report;
  report.layout = options_.layout;
  const size_t n = args.size();
  report.tensors.reserve(n);

  // Check every tensor before taking anything, so bad input leaves nothing allocated.
  bool need_ring = false;
  for (size_t i = 0; i < n; ++i) {
    const Tensor& t = args.at(i);
    const auto& storage = t.storage();
    if (!storage || storage->bytes() < t.nbytes() || (t.nbytes() > 0 && t.data() == nullptr))
      throw Error(ErrorCode::invalid_argument,
                  "Binder::run: tensor '" + t.name() + "' (" + std::to_string(i + 1) + " of " +
                      std::to_string(n) + ") needs " + describe_bytes(t.nbytes()) +
                      " of host storage but has " + describe_bytes(storage ? storage->bytes() : 0) +
                      "; build it with Tensor::empty or a storage of the right size");
    TensorBindReport tr;
    tr.name = t.name();
    tr.direction = t.direction();
    tr.pinned = t.pinned();
    tr.bytes = t.nbytes();
    if (tr.uploaded() && !tr.pinned && options_.upload == UploadPath::staged && tr.bytes > 0) {
      tr.path = UploadPath::staged;
      need_ring = true;
    }
    if (tr.uploaded() && tr.bytes > 0 && options_.verify_upload) need_ring = true;
    if (tr.uploaded()) {
      ++report.uploaded_count;
      report.uploaded_bytes += tr.bytes;
    }
    if (tr.downloaded()) {
      ++report.downloaded_count;
      report.downloaded_bytes += tr.bytes;
    }
    if (tr.path == UploadPath::staged) {
      ++report.ring_count;
      report.ring_bytes += tr.bytes;
    }
    report.tensors.push_back(std::move(tr));
  }

  // Everything this run takes; released on every exit path.
  DeviceBuffer arena;
  std::vector<DeviceBuffer> per_tensor;
  per_tensor.reserve(n);
  std::vector<Placement> place(n);

  BindPhase phase = BindPhase::device_alloc;
  size_t current = n;  // index of the tensor being worked on; n = none
  auto phase_start = Clock::now();
  auto end_phase = [&](BindPhase p) {
    report.phase_seconds[static_cast<size_t>(p)] = seconds_since(phase_start);
    phase_start = Clock::now();
  };

  // Waits for every queued copy so no buffer is freed under an in-flight copy.
  auto quiesce = [&]() noexcept {
    if (!st.have_stream) return;
    try {
      worker.synchronize(st.stream);
    } catch (const std::exception& e) {
      log(LogLevel::warn, std::string("Binder: synchronizing after a failure: ") + e.what());
    }
    for (auto& slot : st.ring) slot.busy = false;
  };

  try {
    // --- device_alloc -------------------------------------------------------------
    if (need_ring && st.ring.empty()) {
      std::vector<State::Slot> ring(options_.staging_buffers);
      for (auto& slot : ring) {
        slot.buffer = worker.alloc_pinned_host(options_.staging_buffer_bytes);
        slot.done = worker.create_event();
      }
      st.ring = std::move(ring);
      st.next_slot = 0;
    }
    if (!st.have_stream) {
      st.stream = worker.create_stream();
      st.have_stream = true;
    }
    if (options_.layout == DeviceLayout::arena) {
      const size_t align = options_.arena_alignment;
      size_t size = 0;
      for (size_t i = 0; i < n; ++i) {
        const uint64_t bytes = report.tensors[i].bytes;
        if (bytes == 0) continue;
        if (size > std::numeric_limits<size_t>::max() - bytes - align)
          throw Error(ErrorCode::invalid_argument,
                      "the task's tensors add up to more bytes than an address space holds");
        size = (size + align - 1) & ~(align - 1);
        place[i].offset = size;
        report.tensors[i].device_offset = size;
        size += bytes;
      }
      if (size > 0) {
        arena = worker.alloc_device(size);
        report.device_bytes = size;
        report.device_allocations = 1;
        for (size_t i = 0; i < n; ++i)
          if (report.tensors[i].bytes > 0) place[i].buffer = &arena;
      }
    } else {
      for (size_t i = 0; i < n; ++i) {
        const uint64_t bytes = report.tensors[i].bytes;
        if (bytes == 0) continue;
        current = i;
        per_tensor.push_back(worker.alloc_device(bytes));
        place[i].buffer = &per_tensor.back();
        report.device_bytes += bytes;
        ++report.device_allocations;
      }
      current = n;
    }
    end_phase(BindPhase::device_alloc);

    // --- upload ---------------------------------------------------------------------
    phase = BindPhase::upload;
    for (size_t i = 0; i < n; ++i) {
      TensorBindReport& tr = report.tensors[i];
      if (!tr.uploaded() || tr.bytes == 0) continue;
      current = i;
      const auto start = Clock::now();
      const auto* src = static_cast<const unsigned char*>(args.at(i).data());
      const DeviceBuffer& dst = *place[i].buffer;
      const size_t base = place[i].offset;
      if (tr.path == UploadPath::staged) {
        // Fill slot k while slots k-1, k-2, ... are in flight; reuse waits on its event.
        const size_t piece = options_.staging_buffer_bytes;
        for (size_t off = 0; off < tr.bytes; off += piece) {
          const size_t len = std::min<size_t>(piece, tr.bytes - off);
          State::Slot& slot = st.ring[st.next_slot];
          st.next_slot = (st.next_slot + 1) % st.ring.size();
          if (slot.busy) {
            worker.wait(slot.done);
            slot.busy = false;
          }
          ring_copy(slot.buffer.data(), src + off, len, options_.copy_threads);
          worker.copy_to_device_async(dst, base + off, slot.buffer.data(), len, st.stream);
          worker.record(slot.done, st.stream);
          slot.busy = true;
        }
        // Draining the stream both times the tensor and surfaces any failed copy (an
        // event only says "reached", a stream sync also says whether the copies worked).
        worker.synchronize(st.stream);
        for (auto& slot : st.ring) slot.busy = false;
      } else {
        const size_t piece = options_.chunk_bytes;
        for (size_t off = 0; off < tr.bytes; off += piece) {
          const size_t len = std::min<size_t>(piece, tr.bytes - off);
          worker.copy_to_device_async(dst, base + off, src + off, len, st.stream);
        }
        worker.synchronize(st.stream);
      }
      tr.upload_seconds = seconds_since(start);
    }
    current = n;
    end_phase(BindPhase::upload);

    // --- verify ---------------------------------------------------------------------
    // Pieces come back into the ring slots in turn; a slot's piece is compared when the
    // slot is needed again or at the end of the tensor, so reads overlap comparisons.
    phase = BindPhase::verify;
    if (options_.verify_upload) {
      struct Pending {
        size_t slot;
        size_t offset;
        size_t len;
      };
      std::vector<Pending> pending;  // in issue order; a slot appears at most once
      for (size_t i = 0; i < n; ++i) {
        const TensorBindReport& tr = report.tensors[i];
        if (!tr.uploaded() || tr.bytes == 0) continue;
        current = i;
        const auto* host = static_cast<const unsigned char*>(args.at(i).data());
        const DeviceBuffer& dev = *place[i].buffer;
        const size_t base = place[i].offset;
        auto check = [&](const Pending& p) {
          const auto* got = static_cast<const unsigned char*>(st.ring[p.slot].buffer.data());
          const size_t bad = first_difference(host + p.offset, got, p.len, options_.copy_threads);
          if (bad < p.len)
            throw Error(ErrorCode::mismatch,
                        "the device copy differs from the host bytes at byte " +
                            format_thousands(p.offset + bad) + " of " + describe_bytes(tr.bytes) +
                            " (host " + std::to_string(host[p.offset + bad]) + ", device " +
                            std::to_string(got[bad]) + "): the upload was corrupted");
        };
        const size_t piece = options_.staging_buffer_bytes;
        for (size_t off = 0; off < tr.bytes; off += piece) {
          const size_t len = std::min<size_t>(piece, tr.bytes - off);
          const size_t k = st.next_slot;
          st.next_slot = (st.next_slot + 1) % st.ring.size();
          if (st.ring[k].busy) {
            worker.wait(st.ring[k].done);
            st.ring[k].busy = false;
            for (auto it = pending.begin(); it != pending.end(); ++it)
              if (it->slot == k) {
                check(*it);
                pending.erase(it);
                break;
              }
          }
          worker.copy_to_host_async(st.ring[k].buffer.data(), dev, base + off, len, st.stream);
          worker.record(st.ring[k].done, st.stream);
          st.ring[k].busy = true;
          pending.push_back({k, off, len});
        }
        // The sync also surfaces a failed read-back; then the rest is compared.
        worker.synchronize(st.stream);
        for (auto& slot : st.ring) slot.busy = false;
        for (const Pending& p : pending) check(p);
        pending.clear();
      }
      current = n;
    }
    end_phase(BindPhase::verify);

    // --- execute --------------------------------------------------------------------
    phase = BindPhase::execute;
    if (!options_.execute_callable.empty()) {
      std::vector<ExecArg> exec_args(n);
      for (size_t i = 0; i < n; ++i) {
        exec_args[i].name = report.tensors[i].name;
        exec_args[i].bytes = report.tensors[i].bytes;
        if (place[i].buffer)
          exec_args[i].device_ptr =
              static_cast<unsigned char*>(place[i].buffer->data()) + place[i].offset;
      }
      worker.execute(options_.execute_callable, exec_args);
      report.executed = true;
    }
    end_phase(BindPhase::execute);

    // --- download -------------------------------------------------------------------
    phase = BindPhase::download;
    for (size_t i = 0; i < n; ++i) {
      TensorBindReport& tr = report.tensors[i];
      if (!tr.downloaded() || tr.bytes == 0) continue;
      current = i;
      const auto start = Clock::now();
      auto* dst = static_cast<unsigned char*>(args.at(i).data());
      const DeviceBuffer& src = *place[i].buffer;
      const size_t base = place[i].offset;
      const size_t piece = options_.chunk_bytes;
      for (size_t off = 0; off < tr.bytes; off += piece) {
        const size_t len = std::min<size_t>(piece, tr.bytes - off);
        worker.copy_to_host_async(dst + off, src, base + off, len, st.stream);
      }
      worker.synchronize(st.stream);
      tr.download_seconds = seconds_since(start);
    }
    current = n;
    end_phase(BindPhase::download);
  } catch (const std::exception& e) {
    quiesce();
    arena.reset();
    per_tensor.clear();
    ErrorCode code = ErrorCode::internal;
    if (const auto* pe = dynamic_cast<const Error*>(&e))
      code = pe->code();
    else if (dynamic_cast<const std::bad_alloc*>(&e))
      code = ErrorCode::out_of_memory;
    std::string what = std::string("bind failed at step ") + bind_phase_name(phase);
    std::string tensor;
    if (current < n) {
      tensor = report.tensors[current].name;
      what += " of tensor '" + tensor + "' (" + std::to_string(current + 1) + " of " +
              std::to_string(n) + ", " + direction_name(report.tensors[current].direction) + ", " +
              describe_bytes(report.tensors[current].bytes) + ")";
    } else if (phase == BindPhase::execute) {
      what += " (callable '" + options_.execute_callable + "')";
    }
    what += ": " + std::string(e.what()) + ". Everything the bind took was released; ";
    if (phase == BindPhase::download)
      what += "IN tensors were not written, earlier INOUT/OUT tensors hold their results and '" +
              tensor + "' may be partly written.";
    else
      what += "no host tensor was written.";
    throw BindError(code, phase, std::move(tensor), what);
  }

  // --- release ----------------------------------------------------------------------
  arena.reset();
  per_tensor.clear();
  end_phase(BindPhase::release);
  report.total_seconds = seconds_since(run_start);
  return report;
}

}  // namespace pinstage
