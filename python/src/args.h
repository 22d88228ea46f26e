// Task args as Python holds them, shared by tensors.cpp (TaskArgs, Binder) and the scene
// bindings (scene_run.cpp, scenes/*/python/). See Note [Python view lifetime] in worker.cpp.
#pragma once

#include <string>

#include "common.h"
#include "pinstage/tensor.h"

namespace pinstage::python {

// Task args as Python holds them.
struct PyArgs : ViewHolder {
  PyArgs() = default;
  PyArgs(TaskArgs args_, py::object worker_obj_, PyWorker* worker_)
      : args(std::move(args_)), worker_obj(std::move(worker_obj_)), worker(worker_) {
    if (worker != nullptr) worker->holders.insert(this);
  }
  ~PyArgs() override {
    if (worker != nullptr) worker->holders.erase(this);
  }

  // Error(finalized) when the args live in the pinned memory of a finalized worker.
  void require_usable(const std::string& what) const {
    if (worker != nullptr && !worker->worker.initialized())
      throw Error(ErrorCode::finalized,
                  what +
                      ": these task args were generated in the pinned memory of a worker that "
                      "has since been finalized; generate them again on a live worker");
  }

  TaskArgs args;
  py::object worker_obj = py::none();  // keeps the worker alive while these args live
  PyWorker* worker = nullptr;          // whose pinned memory the fixture wrote into, or null
};

// Counts a call that reads a worker's pinned memory without the GIL: construct it before
// releasing the GIL, so it is destroyed after the GIL is back.
class Busy {
 public:
  explicit Busy(PyWorker* worker) : worker_(worker) {
    if (worker_ != nullptr) ++worker_->busy;
  }
  ~Busy() {
    if (worker_ != nullptr) --worker_->busy;
  }
  Busy(const Busy&) = delete;
  Busy& operator=(const Busy&) = delete;

 private:
  PyWorker* worker_;
};

// The Worker behind `obj`, or TypeError naming the caller.
inline PyWorker& as_worker(const py::object& obj, const char* who) {
  if (!py::isinstance<PyWorker>(obj))
    throw py::type_error(std::string(who) + " needs a pinstage.Worker, got " +
                         py::type::of(obj).attr("__name__").cast<std::string>());
  return obj.cast<PyWorker&>();
}

// Scene bindings a scene's python/ folder adds (its submodule, e.g. pinstage.qwen3); each
// registers with a static PythonSceneBinder and bind_scenes runs them at import.
using PythonSceneBinder = void (*)(py::module_& m);
void register_python_scene(PythonSceneBinder binder);
struct PythonSceneRegistrar {
  explicit PythonSceneRegistrar(PythonSceneBinder binder) { register_python_scene(binder); }
};
// The generic scene API (pinstage.scene_names, run_scene, ...) and every registered scene's
// submodule; called by bind_tensors.
void bind_scenes(py::module_& m);

}  // namespace pinstage::python
