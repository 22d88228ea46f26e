// One bind, phase by phase: what Binder::run and ResidentBinder::step share. A one-shot bind
// places the task on the device, moves everything and releases it; a resident step keeps the
// placement across steps and moves only what its report rows select (Note [Resident args]
// in resident_binder.cpp).
#pragma once

#include <cstddef>
#include <exception>
#include <memory>
#include <vector>

#include "pinstage/bind.h"
#include "pinstage/clock.h"
#include "pinstage/staging_ring.h"

namespace pinstage::detail {

// What a binder keeps between runs: its copy stream and, once needed, the staging ring
// (declared after the stream: it borrows it, so it goes first).
struct BinderKept {
  bool have_stream = false;
  Stream stream;
  std::unique_ptr<StagingRing> ring;
};

// Where one tensor lives on the device: a buffer and an offset in it (null buffer for a
// tensor of zero bytes, which has no device memory).
struct Placement {
  const DeviceBuffer* buffer = nullptr;
  size_t offset = 0;
};

// The device memory of a task and where each tensor lies in it. A one-shot bind owns one
// for its run; a ResidentBinder keeps one from its first step to close().
struct DevicePlacement {
  DeviceBuffer arena;
  std::vector<DeviceBuffer> per_tensor;
  std::vector<Placement> place;  // one per tensor; empty until placed
  bool placed = false;
  uint64_t bytes = 0;      // device memory taken (arena padding included)
  size_t allocations = 0;  // backend allocations made
  void release() noexcept {
    arena.reset();
    per_tensor.clear();
    place.clear();
    placed = false;
    bytes = 0;
    allocations = 0;
  }
};

// Which tensors a resident step moves: `changed[i]` uploads input i this step. Null for a
// one-shot bind, which moves everything.
struct ResidentStep {
  const std::vector<char>* changed = nullptr;
  int number = 0;  // 1-based
};

class BindRun {
 public:
  BindRun(Worker& worker, const BindOptions& options, BinderKept& kept, const TaskArgs& args,
          DevicePlacement& device, ResidentStep resident = {})
      : worker_(worker),
        opt_(options),
        kept_(kept),
        args_(args),
        n_(args.size()),
        dev_(device),
        resident_(resident),
        current_(n_) {}
  // On failure every queued copy is waited for, `device` is released and BindError names
  // the step and the tensor.
  BindReport run(const Stopwatch& total);

 private:
  using Step = void (BindRun::*)();
  void plan();
  void step(BindPhase phase, Step fn);
  void device_alloc();
  void place_in_arena();
  void place_per_tensor();
  void upload();
  void verify();
  void execute();
  void download();
  [[noreturn]] void fail(const std::exception& e);
  // fn(i) for each non-empty tensor that `wanted` selects, with current_ set to it.
  template <class Fn>
  void each_tensor(bool (TensorBindReport::*wanted)() const noexcept, Fn&& fn);
  unsigned char* device_ptr(size_t i) const;

  Worker& worker_;
  const BindOptions& opt_;
  BinderKept& kept_;
  const TaskArgs& args_;
  const size_t n_;
  DevicePlacement& dev_;
  const ResidentStep resident_;
  BindReport report_;
  bool need_ring_ = false;
  bool placed_before_ = false;  // a resident step after the first: nothing to allocate
  BindPhase phase_ = BindPhase::device_alloc;
  size_t current_;  // index of the tensor being worked on; n_ = none
  Stopwatch phase_clock_;
};

}  // namespace pinstage::detail
