// Shared declarations of the _pinstage extension. See docs/python.md for the Python API
// and Note [Python view lifetime] in worker.cpp for how views keep memory alive.
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <unordered_set>
#include <vector>

#include "dlpack.h"
#include "pinstage/error.h"
#include "pinstage/worker.h"

namespace py = pybind11;

namespace pinstage {
class Binder;
struct BindOptions;
}  // namespace pinstage

namespace pinstage::python {

struct PyBuffer;

// Something that hands out views of a worker's pinned memory: a PinnedHostBuffer, or task
// args generated into pinned memory. Its views are counted (under the GIL) so finalize()
// and close() can refuse while any view could still point at the memory.
struct ViewHolder {
  virtual ~ViewHolder() = default;
  int64_t views = 0;
};

// The Python Worker: the C++ Worker plus what Python holds of its memory.
struct PyWorker {
  PyWorker(WorkerLevel level, std::string backend, int device_id, WorkerOptions options);
  ~PyWorker();

  std::string backend_name;  // as asked for; backend().name once initialized
  int device_id;
  WorkerOptions options;
  Worker worker;
  std::unordered_set<PyBuffer*> buffers;    // open buffers made by this worker
  std::unordered_set<ViewHolder*> holders;  // other holders of this worker's pinned memory
  // Binders on this worker: finalize() releases them first (their staging ring and
  // stream), so a Binder kept in Python never outlives its worker's context.
  std::unordered_set<std::unique_ptr<Binder>*> binders;
  int64_t busy = 0;  // calls running without the GIL that read this worker's pinned memory

  // Counts holders with live views and the views; finalize() refuses while any exist.
  void count_views(int64_t* holders_with_views, int64_t* views) const;
  // Raises BufferError (as a C++ exception pybind11 maps) naming what is alive.
  void require_no_views(const char* what) const;
};

// A PinnedHostBuffer as Python sees it. Holds a reference to its Python Worker, so the
// worker lives (and stays initialized) as long as any buffer does.
struct PyBuffer : ViewHolder {
  PyBuffer(py::object worker_obj, PyWorker* worker, PinnedHostBuffer buffer);
  ~PyBuffer() override;

  bool open() const noexcept { return static_cast<bool>(buffer) && buffer.valid(); }
  // Throws ValueError when closed (or reclaimed by the worker's finalize()).
  void require_open(const char* what) const;
  // Releases the memory now; BufferError while views exist. Idempotent.
  void close();

  py::object worker_obj;  // declared first: released last
  PyWorker* worker;
  PinnedHostBuffer buffer;
  uint64_t nbytes;  // the size asked for; kept after close()
};

// Open buffers by start address (all workers), to find out whether memory is pinned.
// Touched only under the GIL.
std::map<uintptr_t, PyBuffer*>& open_buffers();
// The open buffer holding [ptr, ptr + bytes), or null.
PyBuffer* find_pinned(const void* ptr, uint64_t bytes);

// DLPack export of [data, ...) owned by `owner` (a Python object whose C++ side is
// `holder`): one more view until the consumer's deleter runs.
py::capsule export_dlpack(py::object owner, ViewHolder* holder, void* data, DLDataType dtype,
                          std::vector<int64_t> shape, DLDevice device);

// False at interpreter shutdown, when Python objects must no longer be touched from a
// deleter (the process is about to release everything anyway).
inline bool interpreter_usable() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsInitialized() && !Py_IsFinalizing();
#else
  return Py_IsInitialized() && !_Py_IsFinalizing();
#endif
}

// Exception classes (pinstage.Error and its subclasses), created at import.
void register_errors(py::module_& m);

void bind_worker(py::module_& m);
void bind_tensors(py::module_& m);  // TaskArgs and Binder; scenes via bind_scene_run

void bind_scene_run(py::module_& m);  // the scene registry's Python side (run_scene, ...)

}  // namespace pinstage::python
