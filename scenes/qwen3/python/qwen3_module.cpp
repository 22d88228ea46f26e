// pinstage.qwen3: the Qwen3-14B decode scene's own Python submodule (constants, fixture,
// golden, comparison, run_scene), compiled into the _pinstage extension
// (pinstage_add_python_scene in CMakeLists.txt) and registered with it when the extension
// loads. It uses only the module's public binding header. See docs/python.md.
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <climits>

#include "pinstage/names.h"
#include "pinstage/python/binding.h"
#include "pinstage/qwen3/scene.h"

namespace pinstage::python {

// A validated qwen3::Config from Python ints (InvalidArgumentError when out of range).
qwen3::Config make_config(int64_t layers, int64_t seq_len, int64_t seed, int64_t threads) {
  if (threads < 0 || threads > INT_MAX)
    throw Error(ErrorCode::invalid_argument,
                "threads = " + std::to_string(threads) + " is out of range (0 = all cores)");
  qwen3::Config config = qwen3::config_of(
      {{"layers", layers}, {"seq_len", seq_len}, {"seed", seed}}, static_cast<int>(threads));
  qwen3::validate(config);
  return config;
}

namespace {

using namespace py::literals;

// In qwen3::Fill order.
constexpr const char* kFillNames[] = {"normal",   "seq_lens", "block_table", "slot_mapping",
                                      "rope_cos", "rope_sin", "zeros"};

void bind_constants(py::module_& m) {
  m.attr("NUM_HEADS") = qwen3::kNumHeads;
  m.attr("NUM_KV_HEADS") = qwen3::kNumKvHeads;
  m.attr("HEAD_DIM") = qwen3::kHeadDim;
  m.attr("HIDDEN") = qwen3::kHidden;
  m.attr("INTERMEDIATE") = qwen3::kIntermediate;
  m.attr("BATCH") = qwen3::kBatch;
  m.attr("MAX_SEQ") = qwen3::kMaxSeq;
  m.attr("BLOCK_SIZE") = qwen3::kBlockSize;
  m.attr("CACHE_ROWS") = qwen3::kCacheRows;
  m.attr("DEFAULT_LAYERS") = qwen3::kDefaultLayers;
  m.attr("DEFAULT_SEQ_LEN") = qwen3::kDefaultSeqLen;
  m.attr("DEFAULT_SEED") = qwen3::kDefaultSeed;
  m.attr("RTOL") = qwen3::kRtol;
  m.attr("ATOL") = qwen3::kAtol;
  m.attr("SCENE") = qwen3::kSceneName;
  m.attr("CALLABLE") = qwen3::kCallable;
}

py::list specs_list(int64_t layers, int64_t seq_len, int64_t seed) {
  py::list out;
  for (const auto& s : qwen3::tensor_specs(make_config(layers, seq_len, seed, 0)))
    out.append(py::dict("name"_a = s.name, "dtype"_a = dtype_name(s.dtype),
                        "shape"_a = py::tuple(py::cast(s.shape)),
                        "direction"_a = direction_name(s.dir),
                        "fill"_a = enum_name(s.fill, kFillNames, "unknown"), "std"_a = s.std,
                        "bias"_a = s.bias, "layers"_a = s.layers, "nbytes"_a = s.nbytes));
  return out;
}

py::dict sizes_dict(int64_t layers, int64_t seq_len, int64_t seed) {
  const auto s = qwen3::sizes(make_config(layers, seq_len, seed, 0));
  py::dict d;
  d["tensors"] = s.tensors;
  d["input_tensors"] = s.input_tensors;
  d["total_bytes"] = s.total_bytes;
  d["input_bytes"] = s.input_bytes;
  return d;
}

void bind_golden(py::module_& m) {
  py::class_<qwen3::Golden>(m, "Golden", "The reference decode's result for one set of args.")
      .def_readonly("layers", &qwen3::Golden::n_layers, "int: the layers decoded.")
      .def_property_readonly(
          "out_bits",
          [](const qwen3::Golden& g) {
            py::array_t<uint16_t> a({qwen3::kBatch, qwen3::kHidden});
            std::copy(g.out.begin(), g.out.end(), a.mutable_data());
            return a;
          },
          "numpy.ndarray: the expected output's bf16 bits, uint16 of shape (batch, hidden).")
      .def_property_readonly(
          "kv_rows", [](const qwen3::Golden& g) { return g.kv_rows.size(); },
          "int: the KV-cache rows the decode writes (checked after a run).")
      .def("__repr__", [](const qwen3::Golden& g) {
        return "<pinstage.qwen3.Golden layers=" + std::to_string(g.n_layers) +
               " kv_rows=" + std::to_string(g.kv_rows.size()) + ">";
      });
  m.def(
      "compute_golden",
      [](const PyArgs& a, int64_t layers) {
        a.require_usable("compute_golden");
        if (layers < 1 || layers > INT_MAX)
          throw Error(ErrorCode::invalid_argument,
                      "compute_golden: layers must be >= 1, got " + std::to_string(layers));
        Busy busy(a.worker);
        GilReleased nogil;
        return qwen3::compute_golden(a.args, static_cast<int>(layers));
      },
      py::arg("args"), py::arg("layers"),
      function_doc("compute_golden(args: TaskArgs, layers: int) -> Golden",
                   "The reference decode of args on the host."));
  m.def(
      "compare",
      [](const PyArgs& a, const qwen3::Golden& golden) {
        a.require_usable("compare");
        Busy busy(a.worker);
        GilReleased nogil;
        return qwen3::compare(a.args, golden);
      },
      py::arg("result"), py::arg("golden"),
      function_doc("compare(result: TaskArgs, golden: Golden) -> Comparison",
                   "The outputs of result against the golden."));
}

void bind_qwen3(py::module_& parent) {
  auto m = parent.def_submodule("qwen3", "The Qwen3-14B decode scene: fixture and golden.");
  bind_constants(m);
  const auto layers = py::arg("layers") = qwen3::kDefaultLayers;
  const auto seq_len = py::arg("seq_len") = qwen3::kDefaultSeqLen;
  const auto seed = py::arg("seed") = qwen3::kDefaultSeed;
  // The shared "layers: int = 40, seq_len: int = ..., seed: int = ..." of the typed lines.
  const std::string config = "layers: int = " + std::to_string(qwen3::kDefaultLayers) +
                             ", seq_len: int = " + std::to_string(qwen3::kDefaultSeqLen) +
                             ", seed: int = " + std::to_string(qwen3::kDefaultSeed);
  m.def(
      "validate", [](int64_t l, int64_t s, int64_t sd) { make_config(l, s, sd, 0); }, layers,
      seq_len, seed,
      function_doc("validate(" + config + ") -> None",
                   "InvalidArgumentError naming the first bad parameter."));
  m.def("tensor_specs", &specs_list, layers, seq_len, seed,
        function_doc("tensor_specs(" + config + ") -> list[dict[str, Any]]",
                     "The tensors make_args builds: name, dtype, shape, direction, fill, std, "
                     "bias, layers, nbytes."));
  m.def("sizes", &sizes_dict, layers, seq_len, seed,
        function_doc("sizes(" + config + ") -> dict[str, int]",
                     "tensors, input_tensors, total_bytes and input_bytes."));
  // qwen3.make_args(layers, ...): pinstage.scene_make_args on this scene.
  py::object make = parent.attr("scene_make_args");
  m.def(
      "make_args",
      [make](int64_t l, int64_t s, int64_t sd, int64_t threads, const py::object& worker) {
        make_config(l, s, sd, threads);  // the messages name the Python keywords' values
        py::dict params;
        params["layers"] = l;
        params["seq_len"] = s;
        params["seed"] = sd;
        return make(qwen3::kSceneName, params, threads, worker);
      },
      layers, seq_len, seed, py::arg("threads") = 0, py::arg("worker") = py::none(),
      function_doc(
          "make_args(" + config + ", threads: int = 0, worker: Worker | None = None) -> TaskArgs",
          "scene_make_args('" + std::string(qwen3::kSceneName) + "', ...)."));
  // The comparison and report types are the generic ones (pinstage.Comparison, ...).
  for (const char* name : {"TensorComparison", "Comparison", "SceneRound", "SceneReport"})
    m.attr(name) = parent.attr(name);
  bind_golden(m);
  // qwen3.run_scene(worker, layers=..., ...): pinstage.run_scene on this scene.
  py::object run = parent.attr("run_scene");
  m.def(
      "run_scene",
      [run](const py::object& worker, int64_t l, int64_t s, int64_t sd, int64_t threads,
            const std::string& storage, int64_t rounds, bool skip_golden,
            const std::string& save_golden, const std::string& callable, const py::object& bind) {
        py::dict params;
        params["layers"] = l;
        params["seq_len"] = s;
        params["seed"] = sd;
        return run(worker, qwen3::kSceneName, params, threads, storage, rounds, skip_golden,
                   save_golden, callable, bind);
      },
      py::arg("worker"), layers, seq_len, seed, py::arg("threads") = 0,
      py::arg("storage") = "pinned", py::arg("rounds") = 1, py::arg("skip_golden") = false,
      py::arg("save_golden") = "", py::arg("callable") = qwen3::kCallable,
      py::arg("bind") = py::none(),
      function_doc("run_scene(worker: Worker, " + config +
                       ", threads: int = 0, storage: str = 'pinned', rounds: int = 1, "
                       "skip_golden: bool = False, save_golden: str = '', callable: str = '" +
                       qwen3::kCallable +
                       "', bind: Mapping[str, Any] | None = None) -> "
                       "SceneReport",
                   "pinstage.run_scene on this scene."));
}

const PythonSceneRegistrar registrar(bind_qwen3);

}  // namespace
}  // namespace pinstage::python
