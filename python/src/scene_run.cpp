// The scene registry for Python: pinstage.scene_names(), scene_params, scene_make_args,
// scene_compute_golden, scene_compare, run_scene (the C++ scene run with the GIL released)
// and the report types; then every registered scene's own submodule. See docs/python.md.
#include <pybind11/stl.h>

#include <cstdint>
#include <vector>

#include "args.h"
#include "bind_options.h"
#include "bind_util.h"
#include "common.h"
#include "pinstage/scene.h"

namespace pinstage::python {

namespace {

using namespace py::literals;

// The scene's BindOptions from a dict of the Binder's keywords (execute and verify_upload
// are the run's own).
BindOptions scene_bind_options(const py::object& bind) {
  if (bind.is_none()) return BindOptions{};
  if (!py::isinstance<py::dict>(bind))
    throw py::type_error("run_scene: bind must be a dict of Binder options or None");
  return bind_options_from(bind.cast<py::dict>(), "run_scene", UnknownBindOption::invalid_argument,
                           {"execute", "verify_upload"});
}

std::vector<PythonSceneBinder>& python_scenes() {
  static std::vector<PythonSceneBinder> binders;
  return binders;
}

// A dict of ints -> SceneValues (the scene checks names and ranges).
SceneValues scene_values(const py::object& params) {
  SceneValues values;
  if (params.is_none()) return values;
  if (!py::isinstance<py::dict>(params))
    throw py::type_error("scene params must be a dict of name -> int or None");
  for (auto item : params.cast<py::dict>()) {
    if (!py::isinstance<py::str>(item.first))
      throw py::type_error("scene params: a parameter name must be a str, got " +
                           py::repr(item.first).cast<std::string>());
    const auto name = item.first.cast<std::string>();
    values[name] = int_arg(item.second, "scene parameter " + name);
  }
  return values;
}

// A golden as Python holds it: opaque, tied to its scene.
struct PyGolden {
  std::shared_ptr<const Scene> scene;
  std::shared_ptr<const SceneGolden> golden;
};

// TensorComparison and Comparison: outputs against a golden.
void bind_comparisons(py::module_& m) {
  py::class_<TensorComparison> tensor(m, "TensorComparison", "One tensor against the golden.");
  PINSTAGE_PY_DEF_FIELDS(tensor, PINSTAGE_TENSOR_COMPARISON_FIELDS);
  tensor.def_property_readonly("ok", &TensorComparison::ok, "bool: no mismatches.")
      .def("message", &TensorComparison::message,
           method_doc("message() -> str",
                      "'out: ok, 81,920 elements, 0 differ, ...' or what "
                      "mismatched, where and by how much."))
      .def("__repr__", &TensorComparison::message);
  py::class_<Comparison> comparison(m, "Comparison", "A run's outputs against the golden.");
  PINSTAGE_PY_DEF_FIELDS(comparison, PINSTAGE_COMPARISON_FIELDS);
  comparison
      .def("message", &Comparison::message,
           method_doc("message() -> str", "'ok (...)' or every failing tensor's message."))
      .def(
          "__bool__", [](const Comparison& c) { return c.ok; },
          method_doc("__bool__() -> bool", "ok."))
      .def("__repr__", &Comparison::message);
}

// SceneRound, SceneReport and SceneGolden: what a scene run did.
void bind_scene_reports(py::module_& m) {
  py::class_<SceneRound> round(m, "SceneRound", "One round of a scene run.");
  PINSTAGE_PY_DEF_FIELDS(round, PINSTAGE_SCENE_ROUND_FIELDS);
  round.def_property_readonly("ok", &SceneRound::ok, "bool: the round passed.")
      .def("__repr__", [](const SceneRound& r) {
        return "<pinstage.SceneRound " + std::to_string(r.index) +
               (r.ok() ? " ok>" : " failed: " + r.failure + ">");
      });
  py::class_<SceneReport> report(m, "SceneReport", "What run_scene did.");
  PINSTAGE_PY_DEF_FIELDS(report, PINSTAGE_SCENE_REPORT_FIELDS);
  report.def_property_readonly("ok", &SceneReport::ok, "bool: every round passed.")
      .def("__repr__", [](const SceneReport& r) {
        return "<pinstage.SceneReport " + r.scene + " " + r.storage + " " +
               std::to_string(r.rounds.size()) + " round(s) " + (r.ok() ? "ok" : "failed") + ">";
      });
  py::class_<PyGolden>(m, "SceneGolden", "A scene's golden (opaque; pass it to scene_compare).")
      .def("__repr__",
           [](const PyGolden& g) { return "<pinstage.SceneGolden " + g.scene->name() + ">"; });
}

void bind_reports(py::module_& m) {
  bind_comparisons(m);
  bind_scene_reports(m);
}

py::list params_of(const std::string& name) {
  py::list out;
  for (const SceneParam& p : find_scene(name)->params())
    out.append(py::dict("name"_a = p.name, "help"_a = p.help, "default"_a = p.default_value,
                        "size"_a = p.size));
  return out;
}

std::unique_ptr<PyArgs> make_args(const std::string& name, const py::object& params,
                                  int64_t threads, const py::object& worker_obj) {
  const auto scene = find_scene(name);
  const SceneValues values = resolve_params(*scene, scene_values(params));
  if (threads < 0 || threads > 4096)
    throw Error(ErrorCode::invalid_argument,
                "threads must be in [0, 4096] (0 = all cores), got " + std::to_string(threads));
  std::unique_ptr<HostAllocator> allocator;
  PyWorker* w = nullptr;
  if (worker_obj.is_none()) {
    allocator = std::make_unique<PageableAllocator>();
  } else {
    w = &as_worker(worker_obj, "make_args");
    allocator = std::make_unique<PinnedAllocator>(w->worker);  // the chip-worker guard
  }
  TaskArgs args;
  {
    // Busy: the generator writes into the worker's pinned memory without the GIL, so the
    // worker's finalize() must refuse until it is done.
    Busy busy(w);
    GilReleased nogil;
    args = scene->make_args(*allocator, values, static_cast<int>(threads));
  }
  return std::make_unique<PyArgs>(std::move(args), w ? worker_obj : py::none(), w);
}

PyGolden compute_golden(const std::string& name, const PyArgs& a, const py::object& params) {
  const auto scene = find_scene(name);
  const SceneValues values = resolve_params(*scene, scene_values(params));
  a.require_usable("scene_compute_golden");
  Busy busy(a.worker);
  GilReleased nogil;
  return PyGolden{scene, scene->compute_golden(a.args, values)};
}

Comparison compare(const PyArgs& a, const PyGolden& golden) {
  a.require_usable("scene_compare");
  Busy busy(a.worker);
  GilReleased nogil;
  return golden.scene->compare(a.args, *golden.golden);
}

// A count >= 1 that fits an int (rounds, steps, a step); `what` names it in the error.
int count_arg(int64_t n, const char* what) {
  if (n < 1 || n > INT32_MAX)
    throw Error(ErrorCode::invalid_argument,
                std::string(what) + " must be >= 1, got " + std::to_string(n));
  return static_cast<int>(n);
}

SceneReport run(const py::object& worker_obj, const std::string& name, const py::object& params,
                int64_t threads, const std::string& storage, int64_t rounds, bool skip_golden,
                const std::string& save_golden, const std::string& callable, const py::object& bind,
                int64_t steps, bool resident) {
  auto& w = as_worker(worker_obj, "run_scene");
  const auto scene = find_scene(name);
  SceneRunOptions options;
  options.values = scene_values(params);
  if (threads < 0 || threads > 4096)
    throw Error(ErrorCode::invalid_argument,
                "threads must be in [0, 4096] (0 = all cores), got " + std::to_string(threads));
  options.threads = static_cast<int>(threads);
  options.storage = parse_host_storage(storage);
  options.rounds = count_arg(rounds, "run_scene: rounds");
  options.skip_golden = skip_golden;
  require_no_nul(save_golden, "run_scene: save_golden");
  options.save_golden = save_golden;
  options.callable = callable;
  options.bind = scene_bind_options(bind);
  options.steps = count_arg(steps, "run_scene: steps");
  options.resident = resident;
  validate(*scene, options);
  // The run's args live in the worker's pinned memory: finalize() must wait.
  Busy busy(&w);
  GilReleased nogil;
  return run_scene(w.worker, *scene, options);
}

}  // namespace

void register_python_scene(PythonSceneBinder binder) { python_scenes().push_back(binder); }

void bind_scene_run(py::module_& m) {
  bind_reports(m);
  m.def(
      "scene_names",
      [] { return list_of(registered_scenes(), [](const auto& s) { return s->name(); }); },
      function_doc("scene_names() -> list[str]", "The registered scenes."));
  m.def("scene_params", &params_of, py::arg("scene"),
        function_doc("scene_params(scene: str) -> list[dict[str, Any]]",
                     "The parameters the scene declares: name, help, default, size."));
  m.def(
      "scene_describe",
      [](const std::string& name, const py::object& params) {
        const auto scene = find_scene(name);
        return scene->describe(resolve_params(*scene, scene_values(params)));
      },
      py::arg("scene"), py::arg("params") = py::none(),
      function_doc("scene_describe(scene: str, params: Mapping[str, int] | None = None) -> str",
                   "One line: the scene with these parameters and its argument sizes."));
  m.def(
      "scene_callable", [](const std::string& name) { return find_scene(name)->callable(); },
      py::arg("scene"),
      function_doc("scene_callable(scene: str) -> str", "The scene's own callable's name."));
  m.def("scene_make_args", &make_args, py::arg("scene"), py::arg("params") = py::none(),
        py::arg("threads") = 0, py::arg("worker") = py::none(),
        function_doc("scene_make_args(scene: str, params: Mapping[str, int] | None = None, "
                     "threads: int = 0, worker: Worker | None = None) -> TaskArgs",
                     "The scene's arguments, generated deterministically; into worker's "
                     "pinned memory when a worker is given, else pageable. threads=0: all "
                     "cores. The GIL is released meanwhile."));
  m.def("scene_compute_golden", &compute_golden, py::arg("scene"), py::arg("args"),
        py::arg("params") = py::none(),
        function_doc("scene_compute_golden(scene: str, args: TaskArgs, "
                     "params: Mapping[str, int] | None = None) -> SceneGolden",
                     "The expected outputs for args, computed on the host."));
  m.def("scene_compare", &compare, py::arg("result"), py::arg("golden"),
        function_doc("scene_compare(result: TaskArgs, golden: SceneGolden) -> Comparison",
                     "The outputs of result against the golden, within the scene's "
                     "tolerance."));
  m.def("run_scene", &run, py::arg("worker"), py::arg("scene"), py::arg("params") = py::none(),
        py::arg("threads") = 0, py::arg("storage") = "pinned", py::arg("rounds") = 1,
        py::arg("skip_golden") = false, py::arg("save_golden") = "", py::arg("callable") = "",
        py::arg("bind") = py::none(), py::arg("steps") = 1, py::arg("resident") = true,
        function_doc("run_scene(worker: Worker, scene: str, params: Mapping[str, int] | None = "
                     "None, threads: int = 0, storage: str = 'pinned', rounds: int = 1, "
                     "skip_golden: bool = False, save_golden: str = '', callable: str = '', "
                     "bind: Mapping[str, Any] | None = None, steps: int = 1, resident: bool = "
                     "True) -> SceneReport",
                     "Generates the args, binds them `rounds` times and checks each round "
                     "against the golden (docs/scenes.md). bind: Binder options. steps > 1 "
                     "runs a loop of decode steps instead, each compared with its own golden; "
                     "resident keeps the inputs on the device (ResidentBinder), False binds "
                     "everything every step."));
  m.def(
      "scene_advance",
      [](const std::string& name, const PyArgs& a, int64_t step, const py::object& params) {
        const auto scene = find_scene(name);
        const int n = count_arg(step, "scene_advance: step");
        a.require_usable("scene_advance");
        return scene->advance(a.args, resolve_params(*scene, scene_values(params)), n);
      },
      py::arg("scene"), py::arg("args"), py::arg("step"), py::arg("params") = py::none(),
      function_doc("scene_advance(scene: str, args: TaskArgs, step: int, params: Mapping[str, "
                   "int] | None = None) -> list[str]",
                   "Makes args (holding step - 1's results) the inputs of step `step`, in "
                   "place; returns the names it wrote (pass each to "
                   "ResidentBinder.mark_changed)."));
}

void bind_scenes(py::module_& m) {
  bind_scene_run(m);
  for (PythonSceneBinder binder : python_scenes()) binder(m);
}

}  // namespace pinstage::python
