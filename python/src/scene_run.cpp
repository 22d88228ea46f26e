// pinstage.qwen3.run_scene: the C++ scene run (generate, golden once, rounds of bind,
// execute, read back and compare) with the GIL released. See docs/python.md.
#include <pybind11/stl.h>

#include "common.h"
#include "pinstage/qwen3_scene.h"

namespace pinstage::python {

namespace {

// The scene's BindOptions from a dict of the Binder's keywords (execute and verify_upload
// are the run's own).
BindOptions scene_bind_options(const py::object& bind) {
  const BindOptions defaults;
  std::string layout = device_layout_name(defaults.layout);
  std::string upload = upload_path_name(defaults.upload);
  auto staging_buffers = static_cast<int64_t>(defaults.staging_buffers);
  auto staging_buffer_bytes = static_cast<int64_t>(defaults.staging_buffer_bytes);
  auto chunk_bytes = static_cast<int64_t>(defaults.chunk_bytes);
  auto arena_alignment = static_cast<int64_t>(defaults.arena_alignment);
  auto copy_threads = static_cast<int64_t>(defaults.copy_threads);
  if (!bind.is_none()) {
    if (!py::isinstance<py::dict>(bind))
      throw py::type_error("run_scene: bind must be a dict of Binder options or None");
    for (auto item : bind.cast<py::dict>()) {
      const auto key = item.first.cast<std::string>();
      const py::handle value = item.second;
      if (key == "layout")
        layout = value.cast<std::string>();
      else if (key == "upload")
        upload = value.cast<std::string>();
      else if (key == "staging_buffers")
        staging_buffers = value.cast<int64_t>();
      else if (key == "staging_buffer_bytes")
        staging_buffer_bytes = value.cast<int64_t>();
      else if (key == "chunk_bytes")
        chunk_bytes = value.cast<int64_t>();
      else if (key == "arena_alignment")
        arena_alignment = value.cast<int64_t>();
      else if (key == "copy_threads")
        copy_threads = value.cast<int64_t>();
      else
        throw Error(ErrorCode::invalid_argument,
                    "run_scene: unknown bind option '" + key +
                        "' (layout, upload, staging_buffers, staging_buffer_bytes, chunk_bytes, "
                        "arena_alignment, copy_threads)");
    }
  }
  return make_bind_options(layout, upload, "", staging_buffers, staging_buffer_bytes, chunk_bytes,
                           arena_alignment, false, copy_threads);
}

}  // namespace

void bind_scene_run(py::module_& qwen3_module) {
  using qwen3::SceneReport;
  using qwen3::SceneRound;
  py::class_<SceneRound>(qwen3_module, "SceneRound", "One round of a scene run.")
      .def_readonly("index", &SceneRound::index)
      .def_readonly("bind", &SceneRound::bind)
      .def_readonly("comparison", &SceneRound::comparison)
      .def_readonly("caches_intact", &SceneRound::caches_intact)
      .def_readonly("failure", &SceneRound::failure)
      .def_readonly("check_seconds", &SceneRound::check_seconds)
      .def_property_readonly("ok", &SceneRound::ok)
      .def("__repr__", [](const SceneRound& r) {
        return "<pinstage.qwen3.SceneRound " + std::to_string(r.index) +
               (r.ok() ? " ok>" : " failed: " + r.failure + ">");
      });

  py::class_<SceneReport>(qwen3_module, "SceneReport", "What run_scene did.")
      .def_readonly("storage", &SceneReport::storage)
      .def_readonly("args_summary", &SceneReport::args_summary)
      .def_readonly("generate_seconds", &SceneReport::generate_seconds)
      .def_readonly("golden_seconds", &SceneReport::golden_seconds)
      .def_readonly("rounds", &SceneReport::rounds)
      .def_property_readonly("ok", &SceneReport::ok)
      .def("__repr__", [](const SceneReport& r) {
        return "<pinstage.qwen3.SceneReport " + r.storage + " " + std::to_string(r.rounds.size()) +
               " round(s) " + (r.ok() ? "ok" : "failed") + ">";
      });

  qwen3_module.def(
      "run_scene",
      [](const py::object& worker_obj, int64_t layers, int64_t seq_len, int64_t seed,
         int64_t threads, const std::string& storage, int64_t rounds, bool skip_golden,
         const std::string& save_golden, const std::string& callable, const py::object& bind) {
        if (!py::isinstance<PyWorker>(worker_obj))
          throw py::type_error("run_scene needs a pinstage.Worker, got " +
                               py::type::of(worker_obj).attr("__name__").cast<std::string>());
        auto& w = worker_obj.cast<PyWorker&>();
        qwen3::SceneOptions options;
        options.config = make_config(layers, seq_len, seed, threads);
        options.storage = qwen3::parse_host_storage(storage);
        if (rounds < 1 || rounds > INT32_MAX)
          throw Error(ErrorCode::invalid_argument,
                      "run_scene: rounds must be >= 1, got " + std::to_string(rounds));
        options.rounds = static_cast<int>(rounds);
        options.skip_golden = skip_golden;
        options.save_golden = save_golden;
        options.callable = callable;
        options.bind = scene_bind_options(bind);
        qwen3::validate(options);
        // The run's args live in the worker's pinned memory: finalize() must wait.
        ++w.busy;
        struct Done {
          PyWorker& w;
          ~Done() { --w.busy; }
        } done{w};
        py::gil_scoped_release nogil;
        return qwen3::run_scene(w.worker, options);
      },
      py::arg("worker"), py::arg("layers") = qwen3::kDefaultLayers,
      py::arg("seq_len") = qwen3::kDefaultSeqLen, py::arg("seed") = qwen3::kDefaultSeed,
      py::arg("threads") = 0, py::arg("storage") = "pinned", py::arg("rounds") = 1,
      py::arg("skip_golden") = false, py::arg("save_golden") = "",
      py::arg("callable") = "qwen3_decode", py::arg("bind") = py::none());
}

}  // namespace pinstage::python
