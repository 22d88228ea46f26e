// The scene registry: a scene is a task with a reference result. Each scene registers
// itself (one folder under scenes/, see docs/scenes.md) with its name, its parameters,
// how to make its arguments in any HostAllocator, how to compute its golden, how to
// compare a run with it and which host callable executes it. The CLI (`pinstage scene`,
// `pinstage fixture`, `pinstage bench`), the A/B bench and Python's SceneTestCase
// iterate this registry instead of naming a scene.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "pinstage/bind.h"
#include "pinstage/export.h"
#include "pinstage/tensor.h"
#include "pinstage/worker.h"

namespace pinstage {

// One integer parameter of a scene: Python keyword `name`, CLI option --name with '_'
// written '-' (seq_len -> --seq-len).
struct SceneParam {
  std::string name;
  std::string help;
  int64_t default_value = 0;
  // The size knob: the A/B bench's automatic size picks the largest value in
  // [1, size_max] that fits in memory. At most one parameter of a scene is one.
  bool size = false;
  std::string unit;           // what one step of the size knob is: "layer"
  int64_t size_max = 0;       // the largest value the automatic size tries
  std::string size_max_note;  // said when size_max is chosen: "the whole model"
  // `pinstage scene`'s default when > 0, for a size knob whose default_value would take
  // too long or too much memory to run end to end there.
  int64_t scene_default = 0;
};

// Parameter values by name.
using SceneValues = std::map<std::string, int64_t>;

// "seq_len" -> "--seq-len".
PINSTAGE_API std::string param_flag(std::string_view name);

// One argument of a scene as the size-only mode describes it: nothing is allocated.
struct SceneTensor {
  std::string name;
  DType dtype = DType::bf16;
  std::vector<int64_t> shape;
  Direction dir = Direction::in;
  uint64_t nbytes = 0;
};

// Counts and byte totals of a task's arguments; inputs = IN + INOUT (what a bind uploads).
struct TaskSizes {
  size_t tensors = 0;
  size_t input_tensors = 0;
  uint64_t total_bytes = 0;
  uint64_t input_bytes = 0;
};
PINSTAGE_API TaskSizes task_sizes(const std::vector<SceneTensor>& tensors);
PINSTAGE_API TaskSizes task_sizes(const TaskArgs& args);

// The TensorComparison fields, listed once: X(type, name, default, doc), doc being the
// Python property's docstring. The worst element: the mismatch with the largest |a - b|
// (NaN counts as infinite), or the largest |a - b| of all when nothing mismatches.
#define PINSTAGE_TENSOR_COMPARISON_FIELDS(X)                                                 \
  X(uint64_t, worst_index, 0, "int: flat index of the worst element (the largest |a - b|).") \
  X(float, worst_actual, 0.0f, "float: the worst element's value.")                          \
  X(float, worst_expected, 0.0f, "float: the golden's value there.")                         \
  X(float, worst_diff, 0.0f, "float: |a - b| there.")                                        \
  X(std::string, tensor, std::string{}, "str: the tensor compared.")                         \
  X(uint64_t, checked, 0, "int: elements compared.")                                         \
  X(uint64_t, mismatches, 0, "int: elements outside the tolerance.")                         \
  X(uint64_t, differing, 0,                                                                  \
    "int: elements whose bits differ at all, within the tolerance or not.")                  \
  X(float, atol, 0.0f, "float: the absolute tolerance.")                                     \
  X(float, rtol, 0.0f, "float: the relative tolerance.")

// One output tensor of a run against the golden, with the tolerance
// |a - b| <= atol + rtol * |b| (a = actual, b = expected). NaN in either is a mismatch.
// The fields are the list above.
struct PINSTAGE_API TensorComparison {
  PINSTAGE_TENSOR_COMPARISON_FIELDS(PINSTAGE_FIELD_MEMBER)
  bool ok() const noexcept { return mismatches == 0; }
  // "out: ok, 81,920 elements, 0 differ, max |a-b| 0" or "k_cache: 3 of 262,144 elements
  // mismatch, worst |a-b| = 1.5 at index 12 (actual ..., expected ...; tolerance ...)".
  std::string message() const;
};

// The Comparison fields, listed once: X(type, name, default, doc), doc being the Python
// property's docstring. The flat fields repeat the first failing tensor's.
#define PINSTAGE_COMPARISON_FIELDS(X)                                              \
  X(uint64_t, worst_index, 0, "int: see TensorComparison.")                        \
  X(float, worst_actual, 0.0f, "float: see TensorComparison.")                     \
  X(float, worst_expected, 0.0f, "float: see TensorComparison.")                   \
  X(float, worst_diff, 0.0f, "float: see TensorComparison.")                       \
  X(bool, ok, true, "bool: every tensor matched.")                                 \
  X(std::string, tensor, std::string{},                                            \
    "str: the first mismatching tensor ('' when ok); the worst_* fields are its.") \
  X(uint64_t, mismatches, 0, "int: that tensor's elements outside the tolerance.") \
  X(std::vector<TensorComparison>, tensors, {}, "list[TensorComparison]: one per compared tensor.")

// A run's outputs against the golden: one entry per compared tensor, for short reports
// with the first failing tensor's figures; the fields are the list above.
struct PINSTAGE_API Comparison {
  PINSTAGE_COMPARISON_FIELDS(PINSTAGE_FIELD_MEMBER)
  std::string message() const;  // "ok (...)" or every failing tensor's message
  // Appends `t` and updates ok and the flat fields.
  void add(TensorComparison t);
};

// A byte range of one tensor: [offset, offset + bytes) of tensor `tensor`.
struct ByteRange {
  std::string tensor;
  uint64_t offset = 0;
  uint64_t bytes = 0;
};

// A scene's expected result; each scene derives its own.
struct PINSTAGE_API SceneGolden {
  virtual ~SceneGolden();
};

// Puts a run's INOUT tensors back between rounds (a decode writes rows into its caches)
// and says which came back changed where the run should not have written.
struct PINSTAGE_API RoundReset {
  virtual ~RoundReset();
  virtual std::vector<std::string> restore() const = 0;  // tensors changed elsewhere
};

// A scene. Implementations are stateless and registered once per process.
class PINSTAGE_API Scene {
 public:
  virtual ~Scene();
  virtual std::string name() const = 0;         // "qwen3-decode"
  virtual std::string description() const = 0;  // one line for --help
  virtual std::vector<SceneParam> params() const = 0;
  // Throws Error(invalid_argument) naming the bad parameter; `values` holds every
  // parameter (resolve_params fills the defaults first).
  virtual void validate(const SceneValues& values) const = 0;
  // The arguments for `values`, size only.
  virtual std::vector<SceneTensor> tensors(const SceneValues& values) const = 0;
  // Builds the arguments in `allocator`'s storage on `threads` threads (0 = all cores);
  // the bytes depend on `values` only.
  virtual TaskArgs make_args(HostAllocator& allocator, const SceneValues& values,
                             int threads) const = 0;
  // The reference result for `args` (read only).
  virtual std::unique_ptr<SceneGolden> compute_golden(const TaskArgs& args,
                                                      const SceneValues& values) const = 0;
  // The run's outputs (held in `result` after the bind) against the golden.
  virtual Comparison compare(const TaskArgs& result, const SceneGolden& golden) const = 0;
  // The host callable (register_host_callable) that executes the scene.
  virtual std::string callable() const = 0;
  // Writes the golden to a file; returns its size. Default: Error(unsupported).
  virtual uint64_t save_golden(const SceneGolden& golden, const std::string& path) const;
  // Made before the first round; null when rounds need no reset. Default: null.
  virtual std::unique_ptr<RoundReset> round_reset(const TaskArgs& args,
                                                  const SceneValues& values) const;
  // What generates the arguments, for reports ("avx512bf16 generator"); empty = nothing
  // worth saying. Default: empty.
  virtual std::string generator() const;
  // "2 layers, seq_len 3500": the values as a bench or scene header shows them.
  // Default: "name value" pairs in parameter order.
  virtual std::string describe(const SceneValues& values) const;

  // Steps: a scene whose task runs as a loop (a decode) overrides the three below
  // (docs/scenes.md, "Steps"). Throws Error(invalid_argument) naming why `steps` steps
  // cannot run with `values`, before any memory is taken. Default: only 1 step runs.
  virtual void validate_steps(const SceneValues& values, int steps) const;
  // Makes `args`, which hold step `step - 1`'s results, the inputs of step `step` (>= 1),
  // in place; returns the names of the tensors it wrote (what a resident run uploads
  // again). Default: Error(unsupported).
  virtual std::vector<std::string> advance(const TaskArgs& args, const SceneValues& values,
                                           int step) const;
  // The ranges of INOUT tensors that one step writes on the device, for `args` as they are
  // now: what a resident run reads back to compare the step. Default: every INOUT whole.
  virtual std::vector<ByteRange> written_ranges(const TaskArgs& args,
                                                const SceneValues& values) const;
  // (from, to) pairs: after advance, input `to` equals step - 1's `from` byte for byte (a
  // decode feeds out back as hidden_states). A resident run copies them on the device
  // (ResidentBinder::copy_on_device) instead of uploading `to`, where the backend can.
  // Default: none.
  virtual std::vector<std::pair<std::string, std::string>> device_feeds(
      const SceneValues& values) const;
};

// Registers `scene` under scene->name(). Error(invalid_argument) for an empty or taken name.
PINSTAGE_API void register_scene(std::shared_ptr<const Scene> scene);
// Every registered scene, sorted by name.
PINSTAGE_API std::vector<std::shared_ptr<const Scene>> registered_scenes();
// The scene called `name`; Error(not_found) listing the registered names.
PINSTAGE_API std::shared_ptr<const Scene> find_scene(std::string_view name);

// `given` completed with the defaults, then scene.validate(). Error(invalid_argument) for a
// name the scene does not take (listing those it does).
PINSTAGE_API SceneValues resolve_params(const Scene& scene, const SceneValues& given);
// The scene's size parameter, or nullopt when it has none.
PINSTAGE_API std::optional<SceneParam> size_param(const Scene& scene);

// Registers a scene (and anything else) when the library holding it is loaded:
//   static const pinstage::SceneRegistrar registrar([] { pinstage::register_scene(...); });
struct SceneRegistrar {
  explicit SceneRegistrar(const std::function<void()>& fn) { fn(); }
};

// ---------------------------------------------------------------------------------------
// The scene run: generate, golden once, then rounds of bind, execute, read back, compare.

// Where the scene's host arguments live.
enum class HostStorage { pageable, pinned };
PINSTAGE_API const char* host_storage_name(HostStorage storage);  // "pageable", "pinned"
// Throws Error(invalid_argument) listing the valid names.
PINSTAGE_API HostStorage parse_host_storage(std::string_view name);

struct SceneRunOptions {
  SceneValues values;  // resolved by run_scene
  int threads = 0;     // generation threads (0 = all cores)
  HostStorage storage = HostStorage::pinned;
  int rounds = 1;  // >= 1
  // Steps of a loop (>= 1; more than 1 needs a scene with steps and rounds = 1): step s
  // feeds on step s - 1's results (Scene::advance) and each step is compared with the
  // golden of its own inputs.
  int steps = 1;
  // With steps > 1: keep the inputs on the device (ResidentBinder, only changes go up), or
  // bind everything every step as a one-shot Binder does (false: the seed's way).
  bool resident = true;
  bool skip_golden = false;  // run and check byte integrity only
  std::string save_golden;   // write the golden here when not empty
  std::string callable;      // empty = the scene's own
  BindOptions bind;          // execute_callable and verify_upload are set by the run
};

// Throws Error(invalid_argument) naming the bad option before anything is allocated.
PINSTAGE_API void validate(const Scene& scene, const SceneRunOptions& options);

// The SceneRound fields, listed once: X(type, name, default, doc), doc being the Python
// property's docstring.
#define PINSTAGE_SCENE_ROUND_FIELDS(X)                                                          \
  X(int, index, 0, "int: 1-based.")                                                             \
  X(BindReport, bind, {}, "BindReport: the round's bind.")                                      \
  X(std::optional<Comparison>, comparison, std::nullopt,                                        \
    "Comparison | None: against the golden; None with skip_golden.")                            \
  X(bool, caches_intact, true,                                                                  \
    "bool: the inout tensors read back equal their initial bytes outside what the run writes.") \
  X(std::string, failure, std::string{}, "str: why it failed; '' when it passed.")              \
  X(double, check_seconds, 0.0, "float: time of the checks after the bind.")

// One round, or one step of a run with steps (SceneReport::steps > 1); the fields are the
// list above.
struct SceneRound {
  PINSTAGE_SCENE_ROUND_FIELDS(PINSTAGE_FIELD_MEMBER)
  bool ok() const noexcept { return failure.empty(); }
};

// The SceneReport fields Python reads, listed once: X(type, name, default, doc), doc being
// the Python property's docstring.
#define PINSTAGE_SCENE_REPORT_FIELDS(X)                                                     \
  X(std::string, scene, std::string{}, "str: the scene's name.")                            \
  X(std::string, storage, std::string{},                                                    \
    "str: where the args were generated: 'pinned' or 'pageable'.")                          \
  X(std::string, args_summary, std::string{}, "str: TaskArgs.summary().")                   \
  X(double, generate_seconds, 0.0, "float: time to generate the args.")                     \
  X(double, golden_seconds, 0.0, "float: time to compute the golden (0 with skip_golden).") \
  /* steps > 1: one entry per step */                                                       \
  X(std::vector<SceneRound>, rounds, {},                                                    \
    "list[SceneRound]: the rounds run, or the steps when steps > 1; the run stops at the "  \
    "first failing one.")                                                                   \
  X(int, steps, 1, "int: decode steps asked for (1 = rounds).")                             \
  X(bool, resident, false, "bool: the steps ran on a ResidentBinder.")

// What run_scene did; the fields Python reads are the list above.
struct PINSTAGE_API SceneReport {
  PINSTAGE_SCENE_REPORT_FIELDS(PINSTAGE_FIELD_MEMBER)
  TaskSizes sizes;
  // The backend runs no host callables (Capabilities::execute is false, e.g. acl): no
  // execute step and no golden comparison, only the uploads read back and compared byte
  // for byte and the caches checked intact.
  bool integrity_only = false;
  bool ok() const noexcept;
};

// Makes `args` the inputs of step `step` (Scene::advance). With a resident binder, marks
// what changed for upload, except the inputs the scene feeds from the last step's outputs
// (Scene::device_feeds), which it copies on the device where the backend can
// (Capabilities::device_copy) and marks changed where it cannot.
PINSTAGE_API void advance_scene_step(Worker& worker, const Scene& scene, const SceneValues& values,
                                     const TaskArgs& args, int step, ResidentBinder* resident);

// Runs `scene` on `worker` (chip level); stops at the first failing round or step.
// `on_round` is called after each. With steps > 1 a resident run reads back each step's
// written_ranges into the host args before comparing, so the golden of the next step
// reads the rows the device wrote.
PINSTAGE_API SceneReport run_scene(Worker& worker, const Scene& scene,
                                   const SceneRunOptions& options,
                                   const std::function<void(const SceneRound&)>& on_round = {});

}  // namespace pinstage
