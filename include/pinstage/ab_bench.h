// The pageable-vs-pinned A/B benchmark of the bind phase (`pinstage bench qwen3-decode`):
// arms, groups, rounds, the statistics, the automatic layer count, the runner and its
// table and JSON output. See docs/bind.md ("The A/B methodology").
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "pinstage/bind.h"
#include "pinstage/export.h"
#include "pinstage/qwen3_decode.h"
#include "pinstage/worker.h"

namespace pinstage::ab {

// One way of holding and uploading the arguments.
//  pageable: args in pageable heap memory, direct upload.
//  pinned:   args in the worker's pinned memory, direct upload.
//  staged:   args in pageable memory, uploaded through the pinned staging ring.
enum class Arm { pageable, pinned, staged };

PINSTAGE_API const char* arm_name(Arm arm);
// "pageable,pinned[,staged]" in run order; throws Error(invalid_argument) on an unknown,
// duplicate or missing arm, naming it and the valid arms.
PINSTAGE_API std::vector<Arm> parse_arms(std::string_view list);

// ---------------------------------------------------------------------------------------
// Statistics: pure functions of raw timings (tested on synthetic numbers).

// Smallest value; throws Error(invalid_argument) when empty.
PINSTAGE_API double min_of(const std::vector<double>& values);
// Median (mean of the two middle values for an even count); throws when empty.
PINSTAGE_API double median_of(std::vector<double> values);
// Latency reduction of `seconds` versus `reference_seconds`: 1 - seconds / reference.
// Positive = faster than the reference; 0 when the reference is not positive.
PINSTAGE_API double reduction(double reference_seconds, double seconds);

// Raw round timings of one benchmark, [group][arm][round], rounds in run order (the first
// is the cold one). upload and baseline may be empty (not measured).
struct Timings {
  std::vector<std::string> arms;
  size_t reference = 0;       // arm the reductions are measured against (pageable)
  uint64_t staged_bytes = 0;  // bytes one bind uploads
  bool keep_cold = false;     // false: round 0 of every arm in every group is dropped
  std::vector<std::vector<std::vector<double>>> latency;   // whole bind, seconds
  std::vector<std::vector<std::vector<double>>> upload;    // the bind's upload phase
  std::vector<std::vector<std::vector<double>>> baseline;  // plain all-cores memcpy
};

// One arm in one group.
struct GroupArmStats {
  size_t rounds_used = 0;    // rounds after the cold drop
  double min_seconds = 0.0;  // min bind latency
  double gbps = 0.0;         // effective: staged bytes / min latency
  double reduction = 0.0;    // vs the reference arm's min in the same group
  double upload_min_seconds = 0.0;
  double upload_gbps = 0.0;  // staged bytes / min upload phase
  double memcpy_min_seconds = 0.0;
  double memcpy_gbps = 0.0;       // staged bytes / min memcpy; 0 when not measured
  double upload_vs_memcpy = 0.0;  // upload_gbps / memcpy_gbps; 0 when not measured
};

// One arm across the groups.
struct ArmSummary {
  std::string arm;
  double min_seconds = 0.0;  // range of the per-group min latencies
  double max_seconds = 0.0;
  double min_gbps = 0.0;  // effective GB/s range (from max_seconds and min_seconds)
  double max_gbps = 0.0;
  double median_reduction = 0.0;  // median over groups of the paired (same-group) reduction
  double worst_reduction = 0.0;   // the paired reduction least in the median's direction
  // Cross-range, most conservative: this arm's worst group min against the reference's
  // best group min (1 - max_seconds / reference min_seconds).
  double conservative_reduction = 0.0;
  size_t groups_agreeing = 0;            // groups whose reduction has the median's sign
  bool direction_agrees = false;         // every group agrees in direction
  double median_upload_vs_memcpy = 0.0;  // 0 when not measured
  double worst_upload_vs_memcpy = 0.0;
};

struct Stats {
  size_t reference = 0;
  size_t rounds_used = 0;                          // per arm per group
  std::vector<std::vector<GroupArmStats>> groups;  // [group][arm]
  std::vector<ArmSummary> arms;
};

// Throws Error(invalid_argument) when the timings are ragged or the cold drop leaves no
// round.
PINSTAGE_API Stats compute_stats(const Timings& timings);

// ---------------------------------------------------------------------------------------
// Configuration and the automatic layer count.

struct BenchConfig {
  std::string backend = "sim";
  int layers = 0;  // 0 = automatic
  int seq_len = qwen3::kDefaultSeqLen;
  uint64_t seed = qwen3::kDefaultSeed;
  std::vector<Arm> arms = {Arm::pageable, Arm::pinned};
  int groups = 5;
  int rounds = 6;
  bool keep_cold = false;
  bool baseline = true;  // measure the memcpy baseline next to every arm
  size_t staging_buffers = 4;
  size_t staging_buffer_bytes = size_t{8} << 20;
};

// Checks everything that needs no memory figures; throws Error(invalid_argument) naming
// the option (--groups, --rounds, --arms, --layers, --seq-len) and what to use instead.
PINSTAGE_API void validate(const BenchConfig& config);

// What the machine offers.
struct MemoryBudget {
  uint64_t host_available = 0;   // MemAvailable
  bool device_is_host = false;   // Capabilities::device_memory_is_host of the backend
  uint64_t device_capacity = 0;  // what the device may commit (0 = unknown)
};

// MemAvailable from /proc/meminfo in bytes; Error(io) when it cannot be read.
PINSTAGE_API uint64_t read_mem_available();

// Memory one arm needs at `layers` (only one arm's args exist at a time).
struct MemoryNeed {
  uint64_t host_args = 0;   // the 20 tensors in host memory
  uint64_t device = 0;      // the device arena
  uint64_t staging = 0;     // the staging ring (when a staged arm runs)
  uint64_t host_total = 0;  // host_args + staging (+ device when device_is_host)
};
PINSTAGE_API MemoryNeed memory_need(const BenchConfig& config, int layers,
                                    const MemoryBudget& budget);

struct LayerPlan {
  int layers = 0;
  bool automatic = false;
  MemoryNeed need;
  uint64_t host_budget = 0;  // half of MemAvailable when automatic, all of it otherwise
  std::string reason;        // one line saying what was chosen and why
};

// The layer count to run: config.layers when it fits (all of MemAvailable, and device
// capacity), else the largest count whose need fits in half of MemAvailable (and the
// device capacity). Throws Error(out_of_memory) before anything is allocated when even
// the requested (or one) layer does not fit, saying how much is needed and available.
PINSTAGE_API LayerPlan plan_layers(const BenchConfig& config, const MemoryBudget& budget);

// ---------------------------------------------------------------------------------------
// The runner.

// One bind round.
struct RoundRecord {
  double seconds = 0.0;                                 // Binder::run wall time
  std::array<double, kBindPhaseCount> phase_seconds{};  // from the BindReport
  bool cold = false;                                    // first round of its arm/group
};

// One arm's turn in one group.
struct ArmRun {
  Arm arm = Arm::pageable;
  double generate_seconds = 0.0;  // building the args in the arm's storage
  std::vector<RoundRecord> binds;
  std::vector<double> memcpy_seconds;  // baseline rounds (empty when off)
  std::string bind_summary;            // BindReport::summary() of the last round
};

struct PINSTAGE_API BenchResult {
  BenchConfig config;
  LayerPlan plan;
  std::string backend;        // the loaded backend's name
  std::string baseline_kind;  // what the memcpy baseline copies into
  int threads = 0;            // copy threads (all cores)
  qwen3::Sizes sizes;         // of the task's arguments (measured from the built args)
  std::vector<std::vector<ArmRun>> groups;  // [group][arm]
  Stats stats;

  Timings timings() const;  // the raw timings behind stats
};

// Progress after each step (generation, bind round, memcpy round).
struct Progress {
  size_t done = 0;
  size_t total = 0;
  int group = 0;  // 0-based
  Arm arm = Arm::pageable;
  std::string step;  // "generate", "bind 3/6", "memcpy 3/6"
};
using ProgressFn = std::function<void(const Progress&)>;

// Builds one arm's arguments in `allocator`'s storage; called once per arm per group and
// must build the same tensors every time.
using ArgsFactory = std::function<TaskArgs(HostAllocator& allocator)>;

// Runs the A/B benchmark of any task on an initialized chip worker: for each group, each
// arm in order builds its args, binds them config.rounds times, runs as many memcpy
// baseline rounds, and frees them before the next arm starts. config.layers is not used.
PINSTAGE_API BenchResult run_ab(Worker& worker, const BenchConfig& config,
                                const ArgsFactory& make_args, const ProgressFn& progress = {});

// The Qwen3 decode benchmark: run_ab with qwen3::make_args at plan.layers layers.
PINSTAGE_API BenchResult run_bench(Worker& worker, const BenchConfig& config, const LayerPlan& plan,
                                   const ProgressFn& progress = {});

// The readable group table and the summary lines.
PINSTAGE_API std::string format_table(const BenchResult& result);
// Everything, including every raw round timing, as a JSON document.
PINSTAGE_API std::string to_json(const BenchResult& result);

}  // namespace pinstage::ab
