// The pageable-vs-pinned A/B benchmark of the bind phase for any task that builds its
// arguments (`pinstage bench <scene>`, `pinstage bench synthetic`): arms, groups, rounds,
// the statistics, the automatic size, the runner and its table and JSON output. See
// docs/bind.md ("The A/B methodology").
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "pinstage/bind.h"
#include "pinstage/export.h"
#include "pinstage/run_info.h"
#include "pinstage/scene.h"
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

// sim's copy engines, as the model needs them: from backend_model and the host.
struct CopyModel {
  int cores = 1;           // CPUs this process may run on (usable_cpu_count)
  int dma_threads = 1;     // workers per copy engine (the dma_threads option)
  double link_gbps = 0.0;  // link pacing; 0 = none
};

// Raw round timings of one benchmark, [group][arm][round], rounds in run order (the first
// is the cold one). upload and baseline may be empty (not measured).
struct Timings {
  std::vector<std::string> arms;
  size_t reference = 0;      // arm the reductions are measured against (pageable)
  uint64_t input_bytes = 0;  // bytes one bind uploads
  bool keep_cold = false;    // false: round 0 of every arm in every group is dropped
  std::vector<std::vector<std::vector<double>>> latency;            // whole bind, seconds
  std::vector<std::vector<std::vector<double>>> upload;             // the bind's upload phase
  std::vector<std::vector<std::vector<double>>> alloc;              // the bind's device_alloc phase
  std::vector<std::vector<std::vector<double>>> baseline;           // plain all-cores memcpy
  std::vector<std::vector<std::vector<double>>> baseline_one_core;  // one thread; all kept
  // sim's copy-engine model, when the backend has one: the upload ratios are then also
  // predicted from the memcpy rates (predicted_upload_gbps).
  std::optional<CopyModel> model;
};

// The upload rate an arm reaches in sim's copy-engine model (docs/worker.md, "sim
// semantics"), from a one-thread and an all-core copy rate. The engine's workers copy at
// engine = all * min(1, dma_threads / cores); link is model.link_gbps (0 = no limit).
//  pinned:   min(engine, link): the engine carries it;
//  pageable: min(one, engine, cores / (1 / one + cores / all), link): the driver's staging
//            pass runs on one thread, and its CPU time and the engine's share the cores;
//  staged:   min(1 / (1 / all + 1 / engine), link): the ring copy, then the engine's pass.
// 0 when a rate is not positive.
PINSTAGE_API double predicted_upload_gbps(Arm arm, double one_core_gbps, double all_core_gbps,
                                          const CopyModel& model);

// One arm in one group.
struct GroupArmStats {
  size_t rounds_used = 0;    // rounds after the cold drop
  double min_seconds = 0.0;  // min bind latency
  double gbps = 0.0;         // effective: input bytes / min latency
  double reduction = 0.0;    // vs the reference arm's min in the same group
  double upload_min_seconds = 0.0;
  double upload_gbps = 0.0;        // input bytes / min upload phase
  double alloc_min_seconds = 0.0;  // min device_alloc phase: allocation, apart from transport
  double memcpy_min_seconds = 0.0;
  double memcpy_gbps = 0.0;           // input bytes / min memcpy; 0 when not measured
  double upload_vs_memcpy = 0.0;      // upload_gbps / memcpy_gbps; 0 when not measured
  double memcpy_one_core_gbps = 0.0;  // input bytes / min one-thread memcpy; 0 = not measured
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
  size_t worst_group = 0;         // 0-based group of worst_reduction
  // The worst case across groups: this arm's slowest group min against the reference's
  // fastest group min (1 - max_seconds / reference min_seconds); JSON key
  // worst_case_reduction (conservative_reduction until issue 42).
  double worst_case_reduction = 0.0;
  size_t groups_agreeing = 0;     // groups whose reduction has the median's sign
  bool direction_agrees = false;  // every group agrees in direction
  // At least 3 groups and at least 4 in 5 of them agree with the median's direction
  // (a paired sign test that one noisy group cannot overturn).
  bool conclusive = false;
  double median_alloc_seconds = 0.0;     // median over groups of alloc_min_seconds
  double median_upload_gbps = 0.0;       // median over groups of upload_gbps
  double median_upload_vs_memcpy = 0.0;  // 0 when not measured
  double worst_upload_vs_memcpy = 0.0;
  double median_memcpy_gbps = 0.0;           // 0 when not measured
  double median_memcpy_one_core_gbps = 0.0;  // 0 when not measured
  // Median over groups of this arm's upload GB/s over the reference's in the same group.
  double upload_ratio = 0.0;
  // The same ratio as the model predicts it from the medians of the memcpy rates (the
  // reference's one-core rate, each arm's all-core rate); 0 when the model does not apply.
  double predicted_upload_ratio = 0.0;
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

// The one way the bench words a reduction against the reference: "12.3% faster" or
// "4.0% slower" (of bind latency); "no change" at 0.
PINSTAGE_API std::string describe_reduction(double reduction);

// ---------------------------------------------------------------------------------------
// The task, the configuration and the automatic size.

// What the bench binds: a task that builds its arguments in any allocator and says
// beforehand how big they are. `size` is the value of the task's size knob (ignored when
// it has none).
struct BenchTask {
  std::string name;  // "qwen3-decode", "synthetic"
  // The size knob the automatic size chooses (name, unit, size_max); an empty name means
  // the size is fixed by the other parameters.
  SceneParam size;
  std::function<TaskSizes(int64_t size)> sizes;  // size only: allocates nothing
  std::function<TaskArgs(HostAllocator& allocator, int64_t size)> make_args;
  std::function<std::string(int64_t size)> describe;  // "2 layers, seq_len 3500, seed 1234"
  SceneValues params;  // the other parameters, for the JSON configuration
};

// A registered scene as a bench task. `values` are the scene's parameters; the size
// knob's value there is ignored (the plan chooses it). Validates `values` (with the knob
// at 1) before anything is allocated.
PINSTAGE_API BenchTask scene_task(const Scene& scene, const SceneValues& values);

// The synthetic task: `tensors` IN tensors of `bytes` bytes each (i32, so `bytes` must be
// a multiple of 4), filled with a fixed pattern. Error(invalid_argument) naming --tensors or
// --bytes when out of range.
PINSTAGE_API BenchTask synthetic_task(int64_t tensors, uint64_t bytes);

struct BenchConfig {
  std::string backend = "sim";
  int64_t size = 0;  // the task's size knob (--layers for qwen3-decode); 0 = automatic
  std::vector<Arm> arms = {Arm::pageable, Arm::pinned};
  int groups = 5;
  int rounds = 6;
  bool keep_cold = false;
  bool baseline = true;  // measure the memcpy baseline next to every arm
  // The binds' options (the staging ring's size, copy threads, ...); each arm sets the
  // upload path itself (direct, or staged for the staged arm).
  BindOptions bind;
};

// Checks everything that needs no memory figures; throws Error(invalid_argument) naming
// the option (--groups, --rounds, --arms, the size knob) and what to use instead.
PINSTAGE_API void validate(const BenchConfig& config);

// What the machine offers.
struct MemoryBudget {
  uint64_t host_available = 0;   // MemAvailable (available_memory_bytes() in pages.h)
  bool device_is_host = false;   // Capabilities::device_memory_is_host of the backend
  uint64_t device_capacity = 0;  // what the device may commit (0 = unknown)
};

// Memory one arm needs at `size` (only one arm's args exist at a time).
struct MemoryNeed {
  uint64_t host_args = 0;   // the task's tensors in host memory
  uint64_t device = 0;      // the device arena
  uint64_t staging = 0;     // the staging ring (when a staged arm runs)
  uint64_t host_total = 0;  // host_args + staging (+ device when device_is_host)
};
PINSTAGE_API MemoryNeed memory_need(const BenchConfig& config, const BenchTask& task, int64_t size,
                                    const MemoryBudget& budget);

struct SizePlan {
  int64_t size = 0;  // the size knob's value (1 for a task without one)
  bool automatic = false;
  MemoryNeed need;
  uint64_t host_budget = 0;  // half of MemAvailable when automatic, all of it otherwise
  std::string reason;        // one line saying what was chosen and why
};

// The size to run: config.size when it fits (all of MemAvailable, and device capacity),
// else the largest value up to task.size.size_max whose need fits in half of MemAvailable
// (and the device capacity). A task without a size knob must fit in all of MemAvailable.
// Throws Error(out_of_memory) before anything is allocated when even the requested (or
// the smallest) size does not fit, saying how much is needed and available.
PINSTAGE_API SizePlan plan_size(const BenchConfig& config, const BenchTask& task,
                                const MemoryBudget& budget);

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
  std::vector<double> memcpy_seconds;           // baseline rounds (empty when off)
  std::vector<double> memcpy_one_core_seconds;  // one one-thread baseline round (empty when off)
  std::string bind_summary;                     // BindReport::summary() of the last round
  std::vector<TensorBindReport> tensors;        // per-tensor rows of the last timed round
  // The untimed verification bind after the timed rounds read every input back and found
  // it identical (a mismatch throws instead, failing the bench).
  bool verified = false;
};

struct PINSTAGE_API BenchResult {
  BenchConfig config;
  SizePlan plan;
  std::string task;                // the task's name; empty for run_ab
  std::string description;         // BenchTask::describe at the planned size
  std::string size_name;           // the task's size knob ("layers"); empty when it has none
  SceneValues params;              // the task's other parameters
  std::string backend;             // the loaded backend's name
  std::string baseline_kind;       // what the memcpy baseline copies into
  int threads = 0;                 // copy threads (all cores)
  std::optional<CopyModel> model;  // the backend's copy-engine model (sim), else none
  TaskSizes sizes;                 // of the task's arguments (measured from the built args)
  RunInfo run;                     // where and how it ran (the report's "run" block)
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
// Called after each group with the result so far (stats over the groups done), so that a
// caller can save partial results: a run cut short keeps what it measured.
using GroupDoneFn = std::function<void(const BenchResult&)>;

// Builds one arm's arguments in `allocator`'s storage; called once per arm per group and
// must build the same tensors every time.
using ArgsFactory = std::function<TaskArgs(HostAllocator& allocator)>;

// Runs the A/B benchmark of any task on an initialized chip worker: for each group, each
// arm in order builds its args, binds them config.rounds times, verifies the uploaded
// bytes once (an untimed bind with verify_upload; a difference throws Error(mismatch)
// naming the arm, group and tensor), runs as many memcpy baseline rounds, and frees the
// args before the next arm starts. config.size is not used. The result starts as `seed`
// (say, with its `run` block filled), so that group_done's partial results carry what
// the caller knows without a copy per group.
PINSTAGE_API BenchResult run_ab(Worker& worker, const BenchConfig& config,
                                const ArgsFactory& make_args, const ProgressFn& progress = {},
                                const GroupDoneFn& group_done = {}, BenchResult seed = {});

// run_ab on `task` at plan.size (a plan from plan_size); the task's facts are in the
// result from the first group on.
PINSTAGE_API BenchResult run_bench(Worker& worker, const BenchConfig& config, const BenchTask& task,
                                   const SizePlan& plan, const ProgressFn& progress = {},
                                   const GroupDoneFn& group_done = {}, BenchResult seed = {});

// The readable group table and the summary lines. quiet (the CLI's --quiet) leaves out the
// chatter: the header (what ran, the sizes) and the notes; the tables, verdicts and targets stay.
PINSTAGE_API std::string format_table(const BenchResult& result, bool quiet = false);
// Everything, including every raw round timing, as a JSON document.
PINSTAGE_API std::string to_json(const BenchResult& result);

// ---------------------------------------------------------------------------------------
// Decode steps: resident args against a full bind per step (`pinstage bench <scene>
// --steps N`, docs/bind.md "Resident args").

// The two ways of running N steps.
//  resident: a ResidentBinder; the first step uploads every input, later ones only what
//            Scene::advance changed.
//  full:     a one-shot Binder::run per step (allocate, upload all, execute, download the
//            caches and out, release): the seed's way.
enum class StepMode { resident, full };
PINSTAGE_API const char* step_mode_name(StepMode mode);  // "resident", "full"

struct StepsBenchConfig {
  int steps = 8;     // >= 2: step 1 is the cold one, 2..N what a decode loop pays
  int groups = 2;    // each runs both modes, alternating which goes first
  BindOptions bind;  // execute_callable is the scene's; verify_upload is off
};
// Throws Error(invalid_argument) naming --steps or --groups.
PINSTAGE_API void validate(const StepsBenchConfig& config);

// One step of one mode in one group, from its BindReport.
struct StepRecord {
  int group = 0;  // 0-based
  StepMode mode = StepMode::resident;
  int step = 0;                  // 1-based
  double staging_seconds = 0.0;  // BindReport::staging_seconds(): all but execute
  double execute_seconds = 0.0;
  uint64_t uploaded_bytes = 0;
  uint64_t downloaded_bytes = 0;
};

struct PINSTAGE_API StepsBenchResult {
  StepsBenchConfig config;
  std::string scene;
  std::string description;  // Scene::describe
  TaskSizes sizes;
  RunInfo run;
  std::vector<StepRecord> records;  // in run order
  // Medians over steps 2..N of every group, per mode (StepMode order), and their ratios.
  std::array<double, 2> median_staging_seconds{};
  std::array<double, 2> median_execute_seconds{};
  std::array<double, 2> median_moved_bytes{};  // uploaded + downloaded
  double staging_speedup = 0.0;                // full / resident staging
  double moved_fraction = 0.0;                 // resident / full bytes moved
};

// Builds the scene's args once in the worker's pinned memory, then for each group runs
// config.steps steps in each mode (Scene::advance between steps, the scene's callable as
// the execute step, no golden) and fills the medians. `progress` gets "group 1/2 resident
// step 3/8" after each step.
PINSTAGE_API StepsBenchResult run_steps_bench(
    Worker& worker, const Scene& scene, const SceneValues& values, const StepsBenchConfig& config,
    const std::function<void(const std::string&)>& progress = {});
// The per-step table (medians over the groups), the medians and the targets (staging at
// least 20x lower resident, under 0.1% of the bytes moved) with met / not met.
PINSTAGE_API std::string format_steps_table(const StepsBenchResult& result);
// Every record, the medians and the "run" block, as a JSON document.
PINSTAGE_API std::string steps_to_json(const StepsBenchResult& result);

}  // namespace pinstage::ab
