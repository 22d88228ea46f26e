// The public binding header of the _pinstage extension: all that a scene's Python part
// (scenes/<name>/python/, compiled into the extension by pinstage_add_python_scene) may
// use of the module. The rest of python/src is private to the module. See docs/python.md,
// "A scene's Python part", and Note [Python view lifetime] in python/src/worker.cpp.
#pragma once

#include <cxxabi.h>
#include <pybind11/pybind11.h>
#include <unistd.h>

#include <cstdint>
#include <string>
#include <string_view>

#include "pinstage/tensor.h"

namespace py = pybind11;

namespace pinstage::python {

struct PyWorker;  // the module's Python Worker (private)

// Something that hands out views of a worker's pinned memory: a PinnedHostBuffer, or task
// args generated into pinned memory. Its views are counted (under the GIL) so finalize()
// and close() can refuse while any view could still point at the memory.
struct ViewHolder {
  virtual ~ViewHolder() = default;
  int64_t views = 0;
  int64_t args_views = 0;  // of `views`, those TaskArgs hold (named by finalize()'s refusal)
  int64_t read_views = 0;  // of `views`, those running checkpoint reads hold (named too)
  int64_t copy_views = 0;  // of `views`, those pending async copies hold (named too)
  // What finalize()'s refusal calls this holder.
  virtual std::string holder_name() const { return "TaskArgs"; }
};

// Task args as Python holds them: pinstage.TaskArgs. A scene's binding takes one as
// `const PyArgs&`, calls require_usable, then reads `args` under a Busy of `worker`.
struct PyArgs : ViewHolder {
  PyArgs() = default;
  PyArgs(TaskArgs args_, py::object worker_obj_, PyWorker* worker_);
  ~PyArgs() override;

  // Error(finalized) when the args live in the pinned memory of a finalized worker.
  void require_usable(const std::string& what) const;

  TaskArgs args;
  py::object worker_obj = py::none();  // keeps the worker alive while these args live
  PyWorker* worker = nullptr;          // whose pinned memory the fixture wrote into, or null
};

// Counts a call that reads a worker's pinned memory without the GIL: construct it before
// releasing the GIL, so it is destroyed after the GIL is back. A null worker counts nothing.
class Busy {
 public:
  explicit Busy(PyWorker* worker);
  ~Busy();
  Busy(const Busy&) = delete;
  Busy& operator=(const Busy&) = delete;

 private:
  PyWorker* worker_;
};

// Releases the GIL for a C++ call. A daemon thread that takes the GIL back while the
// interpreter finalizes is ended by CPython (< 3.14) with pthread_exit, a forced unwind.
// Unwinding would run the caller's destructors (py::object references, busy counts)
// without the GIL, racing with finalization (TSan saw it), so the thread is parked
// instead, as CPython 3.14 does itself; the process exits around it. Never use it in a
// destructor: destructors keep the GIL instead.
//
// Tests can hold a call inside that GIL-free window on a latch: the hook that
// pinstage._pinstage._set_gil_release_hook installs runs (the GIL taken back for it) right
// after every release, in the releasing thread, so a race is opened deterministically.
class GilReleased {
 public:
  GilReleased() : hook_(gil_release_hook()), state_(PyEval_SaveThread()) {
    if (hook_ != nullptr) run_gil_release_hook(hook_);
  }
  ~GilReleased() {
    try {
      PyEval_RestoreThread(state_);
    } catch (abi::__forced_unwind&) {
      for (;;) pause();
    }
  }
  GilReleased(const GilReleased&) = delete;
  GilReleased& operator=(const GilReleased&) = delete;

 private:
  // A new reference to the installed hook, or null (read under the GIL).
  static PyObject* gil_release_hook();
  // Calls the hook with the GIL taken back, then drops the reference; an exception it
  // raises is reported as unraisable, never thrown into the C++ call.
  static void run_gil_release_hook(PyObject* hook);

  PyObject* hook_;
  PyThreadState* state_;
};

// Docstrings. pybind11's own signature lines are off (module.cpp): they name C++ types
// and inspect cannot read them. Each def passes method_doc/function_doc instead, from a
// typed line "name(a: int, b: str = 'x') -> T" and a text. The result starts with the
// untyped signature in CPython's __text_signature__ form ("name(self, a, b='x')\n--\n\n"),
// which inspect.signature() and help() read, then the typed line, then the text.
// The text lives as long as the process (pybind11 takes a const char*; module init runs
// once, under the GIL).
const char* signed_doc(std::string_view typed, std::string_view text, bool method);
inline const char* method_doc(std::string_view typed, std::string_view text = {}) {
  return signed_doc(typed, text, true);
}
inline const char* function_doc(std::string_view typed, std::string_view text = {}) {
  return signed_doc(typed, text, false);
}

// A scene's Python part binds its submodule of `m` (pinstage._pinstage, e.g.
// pinstage.qwen3) when the extension loads, after the generic scene API (run_scene,
// scene_make_args, Comparison, ...), which it may reach as attributes of `m`. It registers
// with a static PythonSceneRegistrar.
using PythonSceneBinder = void (*)(py::module_& m);
void register_python_scene(PythonSceneBinder binder);
struct PythonSceneRegistrar {
  explicit PythonSceneRegistrar(PythonSceneBinder binder) { register_python_scene(binder); }
};

}  // namespace pinstage::python
