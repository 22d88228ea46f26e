// What the checkpoint bindings share (checkpoint.cpp: safe_open, load_file, slices;
// load_tp.cpp: tensor-parallel loads): the report as a dict, the options, and the relay
// that runs a load without the GIL while Python's progress callable sees it.
#pragma once

#include <cstdint>
#include <exception>
#include <memory>
#include <utility>

#include "common.h"
#include "pinstage/checkpoint.h"

namespace pinstage::python {

// A LoadReport as a dict: its report_fields() (docs/loading.md, "The load report").
py::dict report_dict(const LoadReport& r);

// The reading options every Python load takes, as CheckpointLoadOptions.
CheckpointLoadOptions load_options(int threads, uint64_t chunk_bytes, bool verify,
                                   bool verify_if_present, bool direct, uint64_t ring_bytes);

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
