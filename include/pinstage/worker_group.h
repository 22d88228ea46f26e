// pinstage::WorkerGroup: the node level, one process driving several devices of a host.
// One chip Worker per device, each with its pinned memory on its device's NUMA node and a
// thread team of its own. See docs/node.md.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "pinstage/error.h"
#include "pinstage/export.h"
#include "pinstage/parallel.h"
#include "pinstage/worker.h"

namespace pinstage {

// "all" (every usable device, in id order) or ids separated by commas ("0,1,3", in the
// order given) -> device ids, checked against `devices` (list_devices). Strict:
// Error(invalid_argument) for an empty list or item, a non-number, a repeated id, an id
// the backend does not have, and (with "all" too) a device that is not usable, naming it
// and why.
PINSTAGE_API std::vector<int> parse_device_list(std::string_view text,
                                                const std::vector<DeviceInfo>& devices);

// How the threads of a group are split (docs/node.md, "Threads"): `total` threads (0 =
// process_thread_count(): PINSTAGE_NUM_THREADS, else the affinity mask) over `devices`
// teams, the first total % devices teams one thread more, and at least one each.
// Error(invalid_argument) for a negative total (WorkerGroup's threads likewise).
PINSTAGE_API std::vector<int> split_threads(int total, size_t devices);

struct WorkerGroupOptions {
  // Every worker's options. host_numa_node unset = each device's own node
  // (DeviceInfo::numa_node, none when unknown); set = that node for every worker.
  WorkerOptions worker;
  // Threads for the whole group, split by split_threads; 0 = process_thread_count().
  int threads = 0;
};

// A failure in one device of a group: which one (its position in the group and its id).
// code() is the cause's code; what() starts with "device <id>: ".
class PINSTAGE_API GroupError : public Error {
 public:
  GroupError(ErrorCode code, size_t index, int device, const std::string& message);
  size_t index() const noexcept { return index_; }
  int device() const noexcept { return device_; }

 private:
  size_t index_;
  int device_;
};

// The node level: one initialized chip Worker per device id, in the order given. Workers
// are made one after another; when one fails to initialize, those made are finalized and
// GroupError names the device. Methods are thread-safe as the Workers' are; run_each is
// one at a time.
class PINSTAGE_API WorkerGroup {
 public:
  // `devices`: ids as parse_device_list returns them; empty = every usable device. An id
  // given twice is Error(invalid_argument).
  WorkerGroup(const std::string& backend, const std::vector<int>& devices,
              const WorkerGroupOptions& options = {});
  // A group over workers the caller owns and keeps alive (initialized chip workers, no
  // device twice; Error(invalid_argument) otherwise), with teams of split_threads(threads):
  // Python's WorkerGroup. finalize() leaves them to their owner.
  WorkerGroup(const std::vector<Worker*>& members, int threads = 0);
  WorkerGroup(const WorkerGroup&) = delete;
  WorkerGroup& operator=(const WorkerGroup&) = delete;
  ~WorkerGroup();  // finalize(); never throws

  WorkerLevel level() const noexcept { return WorkerLevel::node; }
  size_t size() const noexcept;
  Worker& worker(size_t index);  // Error(invalid_argument) past size()
  const Worker& worker(size_t index) const;
  int device_id(size_t index) const;
  const std::vector<int>& device_ids() const noexcept;
  // Threads of each member's team (split_threads of the options' total).
  int team_threads(size_t index) const;
  // Parallel jobs each member's team has run (ThreadTeam::jobs).
  uint64_t team_jobs(size_t index) const;

  // Calls fn(index, worker) for every member at once, each on a thread of its own inside
  // its member's ThreadTeam (the caller's thread drives member 0); the members start
  // together, once every thread exists. Returns when all have returned. When any threw, the
  // others still ran to their end; then the first failure in group order is rethrown as a
  // GroupError naming its device (an Error's code kept, anything else internal).
  void run_each(const std::function<void(size_t, Worker&)>& fn);
  // Finalizes every worker the group made (each reclaims its memory); idempotent.
  void finalize() noexcept;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace pinstage
