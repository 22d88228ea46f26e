// What the checkpoint bindings share (checkpoint.cpp: safe_open, load_file, slices;
// load_tp.cpp: tensor-parallel loads): the report as a dict, the options, their keywords,
// the pinned allocator of the host loads, and the relay that runs a load without the GIL
// while Python's progress callable sees it.
#pragma once

#include <algorithm>
#include <cstdint>
#include <exception>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "common.h"
#include "pinstage/checkpoint.h"
#include "pinstage/tensor.h"

namespace pinstage::python {

// A LoadReport as a dict: its report_fields() (docs/loading.md, "The load report").
py::dict report_dict(const LoadReport& r);

// The reading options every Python load takes, as CheckpointLoadOptions.
CheckpointLoadOptions load_options(int threads, uint64_t chunk_bytes, bool verify,
                                   bool verify_if_present, bool direct, uint64_t ring_bytes);

// "head, threads: int = 0, chunk_bytes: int = 8388608, verify: bool = False,
// verify_if_present: bool = False, direct: bool = False, tail": the typed docstring line of
// a def_load binding, its reading keywords written once (defaults: CheckpointLoadOptions').
std::string load_signature(std::string_view head, std::string_view tail);

// target.def(name, fn, lead..., threads, chunk_bytes, verify, verify_if_present, direct,
// rest...): a load binding's own leading arguments, then the reading keywords every load
// takes (in load_options' order, CheckpointLoadOptions' defaults), then its own trailing
// arguments and docstring (load_signature).
template <class Target, class Fn, class... Lead, class... Rest>
Target& def_load(Target& target, const char* name, Fn&& fn, std::tuple<Lead...> lead,
                 Rest&&... rest) {
  const CheckpointLoadOptions d;
  return std::apply(
      [&](auto&&... l) -> Target& {
        return target.def(name, std::forward<Fn>(fn), std::move(l)...,
                          py::arg("threads") = d.threads, py::arg("chunk_bytes") = d.chunk_bytes,
                          py::arg("verify") = d.verify,
                          py::arg("verify_if_present") = d.verify_if_present,
                          py::arg("direct") = d.direct, std::forward<Rest>(rest)...);
      },
      std::move(lead));
}

// The allocator of the host loads into PinnedHostBuffers (load_pinned's copy mode,
// _load_tp): each storage a PinnedHostBuffer of the worker, kept here until the load
// succeeded and Python wraps them (a failed load releases them with this object). An empty
// storage gets one byte, so that every tensor has a buffer; reserve(), prepare() and the
// fill are PinnedAllocator's (one segment for the whole load), for those sizes.
class BufferAllocator final : public HostAllocator {
 public:
  explicit BufferAllocator(Worker& worker) : worker_(worker), pinned_(worker) {}
  std::shared_ptr<Storage> allocate(size_t bytes) override {
    buffers.push_back(worker_.alloc_pinned_host(held_bytes(bytes)));
    return std::make_shared<Storage>(buffers.back().data(), bytes, true, nullptr);
  }
  void reserve(std::span<const size_t> sizes) override {
    std::vector<size_t> held(sizes.size());
    std::transform(sizes.begin(), sizes.end(), held.begin(), &held_bytes);
    pinned_.reserve(held);
  }
  void prepare(void* data, size_t bytes) override { pinned_.prepare(data, bytes); }
  void finish() override { pinned_.finish(); }
  void abandon() noexcept override { pinned_.abandon(); }
  bool pinned() const override { return true; }
  std::string name() const override { return "pinned"; }
  // The pages reserve()'s segment took (HostFill::pages; "" before any reserve()).
  std::string fill_pages() const { return pinned_.fill() ? pinned_.fill()->pages() : ""; }

  std::vector<PinnedHostBuffer> buffers;  // one per allocate(), in order

 private:
  static size_t held_bytes(size_t bytes) { return std::max<size_t>(bytes, 1); }
  Worker& worker_;
  PinnedAllocator pinned_;
};

// A Python progress callable called from the loader's reader threads (the caller's among
// them, its GIL released): each call takes the GIL. When it has a phase(name) method (the
// progress bar of progress=True), that is called as each phase begins
// (CheckpointLoadOptions::phase). The first exception either raises is kept and stops the
// load (ProgressStopped through the readers, as a failed read); the binding then raises
// that exception itself once the GIL is back. Lives in the binding's frame, destroyed with
// the GIL held.
struct ProgressStopped : std::exception {
  const char* what() const noexcept override { return "the progress callback raised"; }
};
struct ProgressRelay {
  explicit ProgressRelay(py::object callable) : fn(std::move(callable)) {}
  py::object fn;        // None: no callback
  py::object phase_fn;  // fn.phase, or None
  std::unique_ptr<py::error_already_set> error;

  void attach(CheckpointLoadOptions& o) {
    if (fn.is_none()) return;
    o.progress = [this](uint64_t done, uint64_t total) { call(fn, done, total); };
    phase_fn = py::getattr(fn, "phase", py::none());
    if (!phase_fn.is_none()) o.phase = [this](const char* name) { call(phase_fn, name); };
  }
  // From a loader thread, its GIL released: fn(args...) with the GIL taken.
  template <typename... Args>
  void call(const py::object& f, Args... args) {
    const py::gil_scoped_acquire gil;
    if (error) throw ProgressStopped();  // another reader's call already raised
    try {
      f(args...);
    } catch (py::error_already_set& e) {
      error = std::make_unique<py::error_already_set>(std::move(e));
      throw ProgressStopped();
    }
  }
  // With the GIL: raises the callback's exception when it stopped the load.
  [[noreturn]] void rethrow() {
    if (error) throw std::move(*error);
    throw;
  }
};

// Runs load(options) without the GIL with Python's `progress` callable (None: none)
// relayed; when the callable raised, that exception is raised here, the GIL back.
template <typename Load>
auto run_with_progress(CheckpointLoadOptions o, const py::object& progress, Load&& load) {
  ProgressRelay relay(progress);
  relay.attach(o);
  try {
    const GilReleased nogil;
    return load(static_cast<const CheckpointLoadOptions&>(o));
  } catch (const ProgressStopped&) {
    relay.rethrow();
  }
}

}  // namespace pinstage::python
