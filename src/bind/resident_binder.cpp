// ResidentBinder: a task's inputs kept on the device across the steps of a loop.
//
// Note [Resident args]
// A decode step reuses almost everything the last one had: the weights, the RoPE tables
// and the KV caches. A one-shot bind (Binder::run) pays for all of it every time: device
// allocation, 40.86 GB up at 40 layers, the caches back, release. A resident binder runs
// the same phases (BindRun, bind_run.h) over a placement it keeps from its first step to
// close(), and each step moves only what its report rows select:
//  - inputs (IN, INOUT) go up on the first step and again only when marked changed;
//  - OUT tensors come back every step; INOUT tensors stay on the device, where the execute
//    step writes them, and come back only through download();
//  - nothing is released between steps; a failed step releases everything and closes.
// Changes are declared, not detected: a write through a raw pointer or a zero-copy view
// leaves no trace a version counter could see. The debug check (check_writes) makes an
// undeclared write visible at the next step, by digest, before anything moves.
#include <string>
#include <utility>
#include <vector>

#include "bind/bind_run.h"
#include "pinstage/bind.h"
#include "pinstage/clock.h"
#include "pinstage/safetensors.h"
#include "pinstage/settings.h"

namespace pinstage {

struct ResidentBinder::State {
  TaskArgs args;
  BindOptions options;
  bool check_writes = false;
  detail::BinderKept kept;
  detail::DevicePlacement device;
  std::vector<char> changed;     // per tensor: upload at the next step
  std::vector<uint64_t> digest;  // check_writes: per IN tensor, at its last upload
  std::vector<int> uploaded_at;  // step of each input's last upload (0 = never)
  int steps = 0;
  bool closed = false;
  std::string closed_why = "close() was called";
};

namespace {

bool check_writes_default() { return setting_choice(Setting::resident_check) == "on"; }

// Index of `name` in `args`; Error(not_found) naming the binder's tensors.
size_t index_of(const TaskArgs& args, std::string_view name, const char* who) {
  for (size_t i = 0; i < args.size(); ++i)
    if (args.at(i).name() == name) return i;
  throw Error(ErrorCode::not_found, std::string(who) + ": no tensor named '" + std::string(name) +
                                        "' among the binder's " + std::to_string(args.size()) +
                                        " tensors");
}

// What download and copy_on_device need: an open binder whose first step placed the task.
void require_placed(bool closed, const std::string& closed_why, bool placed,
                    const std::string& who) {
  if (closed)
    throw Error(ErrorCode::invalid_argument, who + ": the binder is closed (" + closed_why + ")");
  if (!placed)
    throw Error(ErrorCode::invalid_argument,
                who + ": nothing is on the device before the first step()");
}

}  // namespace

ResidentBinder::ResidentBinder(Worker& worker, TaskArgs args, BindOptions options,
                               std::optional<bool> check_writes)
    : worker_(&worker) {
  require_chip_worker(worker, "ResidentBinder");
  validate(options);
  state_ = std::make_unique<State>();
  state_->args = std::move(args);
  state_->options = std::move(options);
  state_->check_writes = check_writes ? *check_writes : check_writes_default();
  const size_t n = state_->args.size();
  state_->changed.assign(n, 1);  // the first step uploads every input
  state_->digest.assign(n, 0);
  state_->uploaded_at.assign(n, 0);
}

ResidentBinder::~ResidentBinder() { close(); }

void ResidentBinder::mark_changed(std::string_view name) {
  State& s = *state_;
  if (s.closed)
    throw Error(ErrorCode::invalid_argument, "ResidentBinder::mark_changed('" + std::string(name) +
                                                 "'): the binder is closed (" + s.closed_why + ")");
  const size_t i = index_of(s.args, name, "ResidentBinder::mark_changed");
  if (s.args.at(i).direction() == Direction::out)
    throw Error(ErrorCode::invalid_argument,
                "ResidentBinder::mark_changed('" + std::string(name) +
                    "'): an OUT tensor is never uploaded; it is read back every step");
  s.changed[i] = 1;
}

BindReport ResidentBinder::step() {
  const Stopwatch total;
  State& s = *state_;
  const int number = s.steps + 1;
  if (s.closed)
    throw Error(ErrorCode::invalid_argument, "ResidentBinder::step " + std::to_string(number) +
                                                 ": the binder is closed (" + s.closed_why + ")");
  require_chip_worker(*worker_, "ResidentBinder::step");
  // The debug check: an IN tensor that stays must hold the bytes it was uploaded with.
  if (s.check_writes) {
    for (size_t i = 0; i < s.args.size(); ++i) {
      const Tensor& t = s.args.at(i);
      if (s.changed[i] || t.direction() != Direction::in) continue;
      if (content_digest(t.data(), t.nbytes(), s.options.copy_threads) != s.digest[i])
        throw Error(ErrorCode::mismatch,
                    "ResidentBinder step " + std::to_string(number) +
                        ": the host bytes of IN "
                        "tensor '" +
                        t.name() + "' changed since its upload at step " +
                        std::to_string(s.uploaded_at[i]) +
                        " but it was not marked changed (call mark_changed('" + t.name() +
                        "') after writing it); the device still holds the old bytes. Nothing "
                        "moved; the binder stays open");
    }
  }
  BindReport report;
  try {
    report = detail::BindRun(*worker_, s.options, s.kept, s.args, s.device,
                             detail::ResidentStep{&s.changed, number})
                 .run(total);
  } catch (...) {
    // A failed phase has waited for its copies and released the device memory; a task
    // refused before its first phase has nothing queued. Either way the binder closes.
    s.device.release();
    s.kept.ring.reset();
    s.closed = true;
    s.closed_why = "step " + std::to_string(number) + " failed";
    throw;
  }
  for (size_t i = 0; i < s.args.size(); ++i) {
    if (!s.changed[i]) continue;
    const Tensor& t = s.args.at(i);
    if (s.check_writes && t.direction() == Direction::in)
      s.digest[i] = content_digest(t.data(), t.nbytes(), s.options.copy_threads);
    s.uploaded_at[i] = number;
    s.changed[i] = 0;
  }
  s.steps = number;
  return report;
}

void ResidentBinder::download(std::string_view name) {
  const size_t i = index_of(state_->args, name, "ResidentBinder::download");
  const uint64_t bytes = state_->args.at(i).nbytes();
  if (bytes > 0) download(name, 0, bytes);
}

void ResidentBinder::download(std::string_view name, uint64_t offset, uint64_t bytes) {
  State& s = *state_;
  const std::string who = "ResidentBinder::download('" + std::string(name) + "')";
  const size_t i = index_of(s.args, name, "ResidentBinder::download");
  require_placed(s.closed, s.closed_why, s.device.placed, who);
  const Tensor& t = s.args.at(i);
  if (bytes == 0 || offset > t.nbytes() || bytes > t.nbytes() - offset)
    throw Error(ErrorCode::invalid_argument,
                who + ": the range [" + std::to_string(offset) + ", " + std::to_string(offset) +
                    " + " + std::to_string(bytes) + ") is not a non-empty range inside its " +
                    format_thousands(t.nbytes()) + " bytes");
  require_chip_worker(*worker_, "ResidentBinder::download");
  const detail::Placement& at = s.device.place[i];
  worker_->copy_to_host_async(static_cast<unsigned char*>(t.data()) + offset, *at.buffer,
                              at.offset + offset, bytes, s.kept.stream);
  worker_->synchronize(s.kept.stream);
}

void ResidentBinder::copy_on_device(std::string_view from, std::string_view to) {
  State& s = *state_;
  const std::string who =
      "ResidentBinder::copy_on_device('" + std::string(from) + "', '" + std::string(to) + "')";
  const size_t i = index_of(s.args, from, "ResidentBinder::copy_on_device");
  const size_t j = index_of(s.args, to, "ResidentBinder::copy_on_device");
  require_placed(s.closed, s.closed_why, s.device.placed, who);
  const Tensor& src = s.args.at(i);
  const Tensor& dst = s.args.at(j);
  if (dst.direction() == Direction::out)
    throw Error(ErrorCode::invalid_argument, who + ": '" + dst.name() +
                                                 "' is an OUT tensor; it is written by the "
                                                 "execute step, not fed");
  if (i == j)
    throw Error(ErrorCode::invalid_argument,
                who +
                    ": the source and the destination are the same tensor; give two tensors "
                    "of the same size");
  if (src.nbytes() != dst.nbytes())
    throw Error(ErrorCode::invalid_argument, who + ": the tensors must be two of the same size (" +
                                                 format_thousands(src.nbytes()) + " and " +
                                                 format_thousands(dst.nbytes()) + " bytes)");
  require_chip_worker(*worker_, "ResidentBinder::copy_on_device");
  if (src.nbytes() == 0) return;
  const detail::Placement& a = s.device.place[i];
  const detail::Placement& b = s.device.place[j];
  worker_->copy_on_device_async(*b.buffer, b.offset, *a.buffer, a.offset, src.nbytes(),
                                s.kept.stream);
  worker_->synchronize(s.kept.stream);
  s.changed[j] = 0;  // the device holds what `to` should; nothing to upload
}

void ResidentBinder::close() noexcept {
  if (!state_ || state_->closed) return;
  State& s = *state_;
  // Copies are synchronous per step and download; nothing is queued here. A finalized
  // worker already reclaimed the memory, and the buffers' releases are then no-ops.
  s.device.release();
  s.kept.ring.reset();
  s.closed = true;
}

bool ResidentBinder::is_open() const noexcept { return !state_->closed; }
int ResidentBinder::steps() const noexcept { return state_->steps; }
uint64_t ResidentBinder::device_bytes() const noexcept { return state_->device.bytes; }
bool ResidentBinder::check_writes() const noexcept { return state_->check_writes; }
const TaskArgs& ResidentBinder::args() const noexcept { return state_->args; }
const BindOptions& ResidentBinder::options() const noexcept { return state_->options; }

}  // namespace pinstage
