// Binder: allocate, upload (direct or through the staging ring), verify, execute,
// download, release: one function per phase. See docs/bind.md for the pipeline and its
// failure rules.
#include <atomic>
#include <cstring>
#include <limits>
#include <memory>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "bind/bind_run.h"
#include "pinstage/bind.h"
#include "pinstage/clock.h"
#include "pinstage/log.h"
#include "pinstage/parallel.h"
#include "pinstage/staging_ring.h"

namespace pinstage {

namespace detail {
namespace {

std::string describe_bytes(uint64_t bytes) { return format_thousands(bytes) + " bytes"; }

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

BindReport BindRun::run(const Stopwatch& total) {
  plan();  // bad input throws here, before anything is taken
  placed_before_ = dev_.placed;
  phase_clock_.restart();
  try {
    step(BindPhase::device_alloc, &BindRun::device_alloc);
    step(BindPhase::upload, &BindRun::upload);
    step(BindPhase::verify, &BindRun::verify);
    step(BindPhase::execute, &BindRun::execute);
    step(BindPhase::download, &BindRun::download);
  } catch (const std::exception& e) {
    fail(e);
  }
  report_.device_bytes = dev_.bytes;
  report_.device_allocations = dev_.allocations;
  if (resident_.changed == nullptr) dev_.release();  // a resident step keeps it
  report_.phase_seconds[static_cast<size_t>(BindPhase::release)] = phase_clock_.restart();
  report_.total_seconds = total.seconds();
  return std::move(report_);
}

void BindRun::step(BindPhase phase, Step fn) {
  phase_ = phase;
  (this->*fn)();
  current_ = n_;
  const double seconds = phase_clock_.restart();
  // A skipped phase records exactly 0 (docs/bind.md), not the time of its early return.
  const bool skipped = (phase == BindPhase::verify && !opt_.verify_upload) ||
                       (phase == BindPhase::execute && opt_.execute_callable.empty()) ||
                       (phase == BindPhase::device_alloc && placed_before_);
  report_.phase_seconds[static_cast<size_t>(phase)] = skipped ? 0.0 : seconds;
}

template <class Fn>
void BindRun::each_tensor(bool (TensorBindReport::*wanted)() const noexcept, Fn&& fn) {
  for (size_t i = 0; i < n_; ++i) {
    const TensorBindReport& tr = report_.tensors[i];
    if (!(tr.*wanted)() || tr.bytes == 0) continue;
    current_ = i;
    fn(i);
  }
}

unsigned char* BindRun::device_ptr(size_t i) const {
  return static_cast<unsigned char*>(dev_.place[i].buffer->data()) + dev_.place[i].offset;
}

// Checks every tensor and fills the report's rows and totals.
void BindRun::plan() {
  report_.layout = opt_.layout;
  report_.step = resident_.number;
  report_.tensors.reserve(n_);
  for (size_t i = 0; i < n_; ++i) {
    const Tensor& t = args_.at(i);
    const auto& storage = t.storage();
    if (!storage || storage->bytes() < t.nbytes() || (t.nbytes() > 0 && t.data() == nullptr))
      throw Error(ErrorCode::invalid_argument,
                  "Binder::run: tensor '" + t.name() + "' (" + std::to_string(i + 1) + " of " +
                      std::to_string(n_) + ") needs " + describe_bytes(t.nbytes()) +
                      " of host storage but has " + describe_bytes(storage ? storage->bytes() : 0) +
                      "; build it with Tensor::empty or a storage of the right size");
    TensorBindReport tr;
    tr.name = t.name();
    tr.direction = t.direction();
    tr.pinned = t.pinned();
    tr.bytes = t.nbytes();
    if (resident_.changed != nullptr && tr.direction != Direction::out) {
      tr.resident = true;
      tr.stayed = !(*resident_.changed)[i];
    }
    const bool input = tr.uploaded() && tr.bytes > 0;
    if (input && !tr.pinned && opt_.upload == UploadPath::staged) tr.path = UploadPath::staged;
    need_ring_ = need_ring_ || tr.path == UploadPath::staged || (input && opt_.verify_upload);
    if (tr.uploaded()) {
      ++report_.uploaded_count;
      report_.uploaded_bytes += tr.bytes;
    }
    if (tr.downloaded()) {
      ++report_.downloaded_count;
      report_.downloaded_bytes += tr.bytes;
    }
    if (tr.stayed) {
      ++report_.stayed_count;
      report_.stayed_bytes += tr.bytes;
    }
    if (tr.path == UploadPath::staged) {
      ++report_.ring_count;
      report_.ring_bytes += tr.bytes;
    }
    report_.tensors.push_back(std::move(tr));
  }
}

// The stream and ring on first use (kept by the Binder), then the task's device memory.
void BindRun::device_alloc() {
  if (!kept_.have_stream) {
    kept_.stream = worker_.create_stream();
    kept_.have_stream = true;
  }
  if (need_ring_ && !kept_.ring)
    kept_.ring = std::make_unique<StagingRing>(worker_, kept_.stream, opt_.staging_buffers,
                                               opt_.staging_buffer_bytes, opt_.copy_threads);
  if (dev_.placed) return;  // a resident step after the first
  dev_.place.assign(n_, Placement{});
  if (opt_.layout == DeviceLayout::arena)
    place_in_arena();
  else
    place_per_tensor();
  dev_.placed = true;
}

void BindRun::place_in_arena() {
  const size_t align = opt_.arena_alignment;
  size_t size = 0;
  for (size_t i = 0; i < n_; ++i) {
    const uint64_t bytes = report_.tensors[i].bytes;
    if (bytes == 0) continue;
    if (size > std::numeric_limits<size_t>::max() - bytes - align)
      throw Error(ErrorCode::invalid_argument,
                  "the task's tensors add up to more bytes than an address space holds");
    size = (size + align - 1) & ~(align - 1);
    dev_.place[i].offset = size;
    report_.tensors[i].device_offset = size;
    size += bytes;
  }
  if (size == 0) return;
  dev_.arena = worker_.alloc_device(size);
  dev_.bytes = size;
  dev_.allocations = 1;
  for (size_t i = 0; i < n_; ++i)
    if (report_.tensors[i].bytes > 0) dev_.place[i].buffer = &dev_.arena;
}

void BindRun::place_per_tensor() {
  dev_.per_tensor.reserve(n_);  // no reallocation: place points into it
  for (size_t i = 0; i < n_; ++i) {
    const uint64_t bytes = report_.tensors[i].bytes;
    if (bytes == 0) continue;
    current_ = i;
    dev_.per_tensor.push_back(worker_.alloc_device(bytes));
    dev_.place[i].buffer = &dev_.per_tensor.back();
    dev_.bytes += bytes;
    ++dev_.allocations;
  }
}

// Inputs host to device, in argument order. Staged tensors flow through the ring one
// after the other and the ring is drained once, after the last: draining after each
// tensor stalled the copy engine once per tensor (about 520 times per Qwen3 bind) while
// the host refilled an empty ring. A direct tensor is queued in pieces and the stream
// drained after it: that times it and surfaces a failed copy at the tensor it belongs to
// (an Event only says "reached", a stream sync also says whether the copies worked). A
// staged tensor's time is that of queuing it (plus the final drain for the last one), and
// a failed staged copy surfaces at the tensor being queued when it shows, or at the last.
void BindRun::upload() {
  bool ring_in_flight = false;
  each_tensor(&TensorBindReport::uploaded, [&](size_t i) {
    TensorBindReport& tr = report_.tensors[i];
    const Stopwatch clock;
    const auto* src = static_cast<const unsigned char*>(args_.at(i).data());
    const DeviceBuffer& dst = *dev_.place[i].buffer;
    const size_t base = dev_.place[i].offset;
    if (tr.path == UploadPath::staged) {
      kept_.ring->upload(src, tr.bytes, dst, base);
      ring_in_flight = true;
    } else {
      for_each_chunk(tr.bytes, opt_.chunk_bytes, [&](size_t off, size_t len) {
        worker_.copy_to_device_async(dst, base + off, src + off, len, kept_.stream);
      });
      worker_.synchronize(kept_.stream);  // the ring's copies before it are done too
    }
    tr.upload_seconds = clock.seconds();
  });
  if (!ring_in_flight) return;
  const Stopwatch clock;
  kept_.ring->drain();
  report_.tensors[current_].upload_seconds += clock.seconds();
}

// Every input read back through the ring and compared with its host bytes; a piece is
// compared when its buffer comes round again or at the end, so reads overlap compares.
void BindRun::verify() {
  if (!opt_.verify_upload) return;
  each_tensor(&TensorBindReport::uploaded, [&](size_t i) {
    const uint64_t bytes = report_.tensors[i].bytes;
    const auto* host = static_cast<const unsigned char*>(args_.at(i).data());
    auto check = [&](size_t off, const unsigned char* got, size_t len) {
      const size_t bad = first_difference(host + off, got, len, opt_.copy_threads);
      if (bad < len)
        throw Error(ErrorCode::mismatch,
                    "the device copy differs from the host bytes at byte " +
                        format_thousands(off + bad) + " of " + describe_bytes(bytes) + " (host " +
                        std::to_string(host[off + bad]) + ", device " + std::to_string(got[bad]) +
                        "): the upload was corrupted");
    };
    kept_.ring->readback(*dev_.place[i].buffer, dev_.place[i].offset, bytes, check);
    kept_.ring->drain();  // surfaces a failed read-back, then compares the rest
  });
}

void BindRun::execute() {
  if (opt_.execute_callable.empty()) return;
  std::vector<ExecArg> exec_args(n_);
  for (size_t i = 0; i < n_; ++i) {
    exec_args[i].name = report_.tensors[i].name;
    exec_args[i].bytes = report_.tensors[i].bytes;
    if (dev_.place[i].buffer) exec_args[i].device_ptr = device_ptr(i);
  }
  worker_.execute(opt_.execute_callable, exec_args);
  report_.executed = true;
}

// INOUT and OUT tensors device to host, into their own storage.
void BindRun::download() {
  each_tensor(&TensorBindReport::downloaded, [&](size_t i) {
    const Stopwatch clock;
    auto* dst = static_cast<unsigned char*>(args_.at(i).data());
    const DeviceBuffer& src = *dev_.place[i].buffer;
    const size_t base = dev_.place[i].offset;
    for_each_chunk(report_.tensors[i].bytes, opt_.chunk_bytes, [&](size_t off, size_t len) {
      worker_.copy_to_host_async(dst + off, src, base + off, len, kept_.stream);
    });
    worker_.synchronize(kept_.stream);
    report_.tensors[i].download_seconds = clock.seconds();
  });
}

// Waits for every queued copy (no buffer is freed under one), releases what the run
// took and throws the BindError naming the step and the tensor.
void BindRun::fail(const std::exception& e) {
  if (kept_.have_stream) {
    try {
      worker_.synchronize(kept_.stream);
    } catch (const std::exception& sync_error) {
      log(LogLevel::warn,
          std::string("Binder: synchronizing after a failure: ") + sync_error.what());
    }
  }
  if (kept_.ring) kept_.ring->reset();
  dev_.release();
  ErrorCode code = ErrorCode::internal;
  if (const auto* pe = dynamic_cast<const Error*>(&e))
    code = pe->code();
  else if (dynamic_cast<const std::bad_alloc*>(&e))
    code = ErrorCode::out_of_memory;
  std::string what = resident_.number > 0
                         ? "resident step " + std::to_string(resident_.number) +
                               " failed at phase " + bind_phase_name(phase_)
                         : std::string("bind failed at step ") + bind_phase_name(phase_);
  std::string tensor;
  if (current_ < n_) {
    const TensorBindReport& tr = report_.tensors[current_];
    tensor = tr.name;
    what += " of tensor '" + tensor + "' (" + std::to_string(current_ + 1) + " of " +
            std::to_string(n_) + ", " + direction_name(tr.direction) + ", " +
            describe_bytes(tr.bytes) + ")";
  } else if (phase_ == BindPhase::execute) {
    what += " (callable '" + opt_.execute_callable + "')";
  }
  what += ": " + std::string(e.what()) + ". Everything the bind took was released; ";
  if (resident_.number > 0)
    what +=
        "the resident binder freed its device memory and is closed; no host input was "
        "written.";
  else if (phase_ == BindPhase::download)
    what += "IN tensors were not written, earlier INOUT/OUT tensors hold their results and '" +
            tensor + "' may be partly written.";
  else
    what += "no host tensor was written.";
  throw BindError(code, phase_, std::move(tensor), what);
}

}  // namespace detail

void validate(const BindOptions& options) {
  if (options.staging_buffers < 1 || options.staging_buffers > kBindMaxStagingBuffers)
    throw Error(ErrorCode::invalid_argument,
                "BindOptions.staging_buffers is " + std::to_string(options.staging_buffers) +
                    "; it must be in [1, 64] (2 or more let host and device copies overlap)");
  if (options.staging_buffer_bytes < 1 || options.staging_buffer_bytes > kBindMaxStagingBufferBytes)
    throw Error(ErrorCode::invalid_argument,
                "BindOptions.staging_buffer_bytes is " +
                    format_thousands(options.staging_buffer_bytes) +
                    "; it must be in [1, 1 GiB] (a few MiB is typical)");
  if (options.chunk_bytes < 1)
    throw Error(ErrorCode::invalid_argument,
                "BindOptions.chunk_bytes is 0; it must be at least 1 (default 1 GiB)");
  const size_t a = options.arena_alignment;
  if (a < 1 || a > kBindMaxArenaAlignment || (a & (a - 1)) != 0)
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

struct Binder::State : detail::BinderKept {};

Binder::Binder(Worker& worker, BindOptions options)
    : worker_(&worker), options_(std::move(options)) {
  require_chip_worker(worker, "Binder");
  validate(options_);
  state_ = std::make_unique<State>();
}

Binder::~Binder() = default;

uint64_t Binder::staging_bytes() const noexcept {
  return state_->ring ? state_->ring->pinned_bytes() : 0;
}

BindReport Binder::run(const TaskArgs& args) {
  const Stopwatch total;
  require_chip_worker(*worker_, "Binder::run");
  detail::DevicePlacement device;
  return detail::BindRun(*worker_, options_, *state_, args, device).run(total);
}

}  // namespace pinstage
