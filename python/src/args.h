// The module's own part of the args and scene bindings (tensors.cpp, scene_run.cpp,
// node.cpp, ...); PyArgs and Busy, which scenes use too, are in pinstage/python/binding.h.
#pragma once

#include <string>

#include "common.h"
#include "pinstage/tensor.h"

namespace pinstage::python {

// The Worker behind `obj`, or TypeError naming the caller.
inline PyWorker& as_worker(const py::object& obj, const char* who) {
  if (!py::isinstance<PyWorker>(obj))
    throw py::type_error(std::string(who) + " needs a pinstage.Worker, got " +
                         py::type::of(obj).attr("__name__").cast<std::string>());
  return obj.cast<PyWorker&>();
}

// The generic scene API (pinstage.scene_names, run_scene, ...) and every registered scene's
// submodule; called by bind_tensors.
void bind_scenes(py::module_& m);

}  // namespace pinstage::python
