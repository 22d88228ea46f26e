// WorkerGroup: the node level (Note [Node level] in docs/node.md). One chip Worker and one
// ThreadTeam per device; run_each starts one thread per device inside its team, so a
// device's parallel loops (pre-fault, copies, reads) split over its own threads.
#include "pinstage/worker_group.h"

#include <algorithm>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "pinstage/settings.h"
#include "runtime/given_once.h"

namespace pinstage {

GroupError::GroupError(ErrorCode code, size_t index, int device, const std::string& message)
    : Error(code, "device " + std::to_string(device) + ": " + message),
      index_(index),
      device_(device) {}

namespace {

const DeviceInfo& find_device(const std::vector<DeviceInfo>& devices, int id) {
  for (const DeviceInfo& d : devices)
    if (d.id == id) return d;
  throw Error(ErrorCode::invalid_argument,
              "device " + std::to_string(id) + " does not exist: the backend has " +
                  std::to_string(devices.size()) + " device" + (devices.size() == 1 ? "" : "s") +
                  (devices.empty() ? "" : " (ids 0.." + std::to_string(devices.size() - 1) + ")"));
}

void check_usable(const DeviceInfo& d) {
  if (!d.usable)
    throw Error(ErrorCode::invalid_argument,
                "device " + std::to_string(d.id) + " (" + d.name + ") is not usable: " + d.reason);
}

}  // namespace

std::vector<int> parse_device_list(std::string_view text, const std::vector<DeviceInfo>& devices) {
  std::vector<int> ids;
  if (text == "all") {
    for (const DeviceInfo& d : devices)
      if (d.usable) ids.push_back(d.id);
    if (ids.empty())
      throw Error(ErrorCode::invalid_argument,
                  "--devices all: the backend has no usable device" +
                      (devices.empty() ? std::string() : " (device 0: " + devices[0].reason + ")"));
    return ids;
  }
  if (text.empty()) throw Error(ErrorCode::invalid_argument, "the device list is empty");
  size_t begin = 0;
  for (;;) {
    const size_t comma = text.find(',', begin);
    const std::string_view item = text.substr(
        begin, comma == std::string_view::npos ? std::string_view::npos : comma - begin);
    const int id = static_cast<int>(
        parse_integer(item, 0, 1 << 20, "device list '" + std::string(text) + "': item"));
    detail::check_given_once(
        ids, [&](int seen) { return seen == id; },
        "device list '" + std::string(text) + "': device " + std::to_string(id));
    check_usable(find_device(devices, id));
    ids.push_back(id);
    if (comma == std::string_view::npos) break;
    begin = comma + 1;
  }
  return ids;
}

// A thread count as every thread option takes it: 0 (the process's) or more.
static void check_thread_total(int total, const char* what) {
  if (total < 0)
    throw Error(ErrorCode::invalid_argument,
                std::string(what) + " is " + std::to_string(total) +
                    "; it must be >= 0 (0 = the process's thread count)");
}

std::vector<int> split_threads(int total, size_t devices) {
  check_thread_total(total, "split_threads: total");
  if (devices == 0) return {};
  if (total <= 0) total = process_thread_count();
  const auto n = static_cast<int>(devices);
  std::vector<int> split(devices);
  for (int i = 0; i < n; ++i)
    split[static_cast<size_t>(i)] = std::max(1, total / n + (i < total % n ? 1 : 0));
  return split;
}

struct WorkerGroup::State {
  std::vector<int> ids;
  std::vector<Worker*> workers;
  std::vector<std::unique_ptr<Worker>> owned;  // the workers this group made
  std::vector<std::unique_ptr<ThreadTeam>> teams;
  std::mutex run_mu;  // run_each: one at a time
};

WorkerGroup::WorkerGroup(const std::string& backend, const std::vector<int>& devices,
                         const WorkerGroupOptions& options)
    : state_(std::make_unique<State>()) {
  const std::vector<DeviceInfo> listed = list_devices(backend, options.worker);
  std::vector<int> ids = devices;
  if (ids.empty()) ids = parse_device_list("all", listed);
  for (size_t i = 0; i < ids.size(); ++i)
    detail::check_given_once(
        std::span(ids.data(), i), [&](int seen) { return seen == ids[i]; },
        "WorkerGroup: device " + std::to_string(ids[i]));
  check_thread_total(options.threads, "WorkerGroup: threads");
  const std::vector<int> threads = split_threads(options.threads, ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    try {
      const DeviceInfo& d = find_device(listed, ids[i]);
      check_usable(d);
      WorkerOptions wo = options.worker;
      if (!wo.host_numa_node && d.numa_node >= 0) wo.host_numa_node = d.numa_node;
      state_->teams.push_back(std::make_unique<ThreadTeam>(threads[i]));
      auto w = std::make_unique<Worker>();
      // The worker's first pre-fault runs on its team, as its later work does.
      state_->teams.back()->run([&] { w->init(backend, ids[i], wo); });
      state_->workers.push_back(w.get());
      state_->owned.push_back(std::move(w));
      state_->ids.push_back(ids[i]);
    } catch (const Error& e) {
      finalize();
      throw GroupError(e.code(), i, ids[i], e.what());
    }
  }
}

WorkerGroup::WorkerGroup(const std::vector<Worker*>& members, int threads)
    : state_(std::make_unique<State>()) {
  check_thread_total(threads, "WorkerGroup: threads");
  for (size_t i = 0; i < members.size(); ++i) {
    if (members[i] == nullptr)
      throw Error(ErrorCode::invalid_argument,
                  "WorkerGroup: member " + std::to_string(i) + " is null");
    require_chip_worker(*members[i], "WorkerGroup");
    const Worker& w = *members[i];
    detail::check_given_once(
        std::span(members.data(), i),
        [&](const Worker* m) {
          return m->device_id() == w.device_id() && m->backend().name == w.backend().name;
        },
        "WorkerGroup: device " + std::to_string(w.device_id()) + " of '" + w.backend().name + "'");
  }
  const std::vector<int> split = split_threads(threads, members.size());
  for (size_t i = 0; i < members.size(); ++i) {
    state_->teams.push_back(std::make_unique<ThreadTeam>(split[i]));
    state_->workers.push_back(members[i]);
    state_->ids.push_back(members[i]->device_id());
  }
}

WorkerGroup::~WorkerGroup() { finalize(); }

size_t WorkerGroup::size() const noexcept { return state_->workers.size(); }

Worker& WorkerGroup::worker(size_t index) {
  return const_cast<Worker&>(static_cast<const WorkerGroup&>(*this).worker(index));
}

const Worker& WorkerGroup::worker(size_t index) const {
  if (index >= state_->workers.size())
    throw Error(ErrorCode::invalid_argument, "WorkerGroup: member " + std::to_string(index) +
                                                 " of " + std::to_string(state_->workers.size()));
  return *state_->workers[index];
}

int WorkerGroup::device_id(size_t index) const {
  (void)worker(index);
  return state_->ids[index];
}

const std::vector<int>& WorkerGroup::device_ids() const noexcept { return state_->ids; }

int WorkerGroup::team_threads(size_t index) const {
  (void)worker(index);
  return state_->teams[index]->size();
}

uint64_t WorkerGroup::team_jobs(size_t index) const {
  (void)worker(index);
  return state_->teams[index]->jobs();
}

void WorkerGroup::run_each(const std::function<void(size_t, Worker&)>& fn) {
  std::lock_guard lock(state_->run_mu);
  const size_t n = state_->workers.size();
  std::vector<std::exception_ptr> errors(n);
  // Every member waits at the gate until all threads exist, so they start together (their
  // uploads overlap); a thread that cannot start opens it as "abort" instead.
  std::mutex gate_mu;
  std::condition_variable gate_cv;
  int gate = 0;  // 0 closed, 1 go, -1 abort
  auto member = [&](size_t i) {
    {
      std::unique_lock gl(gate_mu);
      gate_cv.wait(gl, [&] { return gate != 0; });
      if (gate < 0) return;
    }
    try {
      state_->teams[i]->run([&] { fn(i, *state_->workers[i]); });
    } catch (...) {
      errors[i] = std::current_exception();
    }
  };
  auto open_gate = [&](int how) {
    {
      std::lock_guard gl(gate_mu);
      gate = how;
    }
    gate_cv.notify_all();
  };
  std::vector<std::thread> threads;
  threads.reserve(n);
  try {
    for (size_t i = 1; i < n; ++i) threads.emplace_back(member, i);
  } catch (const std::exception& e) {
    open_gate(-1);
    for (auto& t : threads) t.join();
    throw Error(ErrorCode::out_of_memory,
                std::string("WorkerGroup: could not start a thread per device: ") + e.what());
  }
  open_gate(1);
  if (n > 0) member(0);  // the caller drives the first device
  for (auto& t : threads) t.join();
  for (size_t i = 0; i < n; ++i) {
    if (!errors[i]) continue;
    try {
      std::rethrow_exception(errors[i]);
    } catch (const GroupError&) {
      throw;
    } catch (const Error& e) {
      throw GroupError(e.code(), i, state_->ids[i], e.what());
    } catch (const std::exception& e) {
      throw GroupError(ErrorCode::internal, i, state_->ids[i], e.what());
    } catch (...) {
      throw GroupError(ErrorCode::internal, i, state_->ids[i], "an unknown exception");
    }
  }
}

void WorkerGroup::finalize() noexcept {
  if (!state_) return;
  for (auto& w : state_->owned) w->finalize();
}

}  // namespace pinstage
