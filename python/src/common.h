// Shared declarations of the _pinstage extension. See docs/python.md for the Python API
// and Note [Python view lifetime] in worker.cpp for how views keep memory alive.
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include "dlpack.h"
#include "pinstage/error.h"
#include "pinstage/python/binding.h"
#include "pinstage/report.h"
#include "pinstage/worker.h"

namespace pinstage {
class Binder;
class ResidentBinder;
struct BindOptions;
}  // namespace pinstage

namespace pinstage::python {

struct PyBuffer;

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
  std::unordered_set<std::unique_ptr<ResidentBinder>*> resident_binders;  // likewise
  // Calls running without the GIL that read or allocate this worker's pinned memory.
  int64_t busy = 0;
  // CopyEvents not yet known complete (device.cpp, Note [Pending copies]): finalize()
  // refuses while any are, and the stream they were queued on (made on first use).
  int64_t pending_copies = 0;
  std::unique_ptr<Stream> copy_stream;
  bool finalized() const { return worker.finalized(); }

  // Counts holders with live views and the views; finalize() refuses while any exist.
  void count_views(int64_t* holders_with_views, int64_t* views) const;
  // Raises BufferError (as a C++ exception pybind11 maps) naming what is alive.
  void require_no_views(const char* what) const;
  // "buffer 0x... (4096 bytes): 2 view(s); TaskArgs (3 tensors): 1 view(s)": the holders
  // with live views, for finalize()'s refusal.
  std::string describe_views() const;
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
  uint64_t nbytes;   // the size asked for; kept after close()
  std::string name;  // the tensor a load read into it ("" if none): finalize() names it
};

// Every PyWorker alive (is_pinned asks each one's table of pinned ranges). Under the GIL.
std::unordered_set<PyWorker*>& live_workers();
// Open buffers by start address (all workers), to find out whether memory is pinned.
// Touched only under the GIL. An entry is erased only by the buffer it names, so a stale
// entry can never remove another buffer's (see PyBuffer's constructor).
std::map<uintptr_t, PyBuffer*>& open_buffers();
// The open buffer holding [ptr, ptr + bytes), or null.
PyBuffer* find_pinned(const void* ptr, uint64_t bytes);

// Who holds a Lease, for the refusals that name it.
enum class LeaseHolder {
  view,  // a buffer-protocol consumer (memoryview, NumPy, torch.frombuffer)
  args,  // TaskArgs, for a tensor in pinned memory
  read,  // a checkpoint read writing into the buffer without the GIL (read_into)
  copy,  // a pending async copy (a CopyEvent not yet waited for)
};

// One counted view of a holder for as long as this object lives: what the buffer
// protocol hands out as Py_buffer.obj (consumers such as torch.frombuffer keep only that
// reference and release the Py_buffer at once), what TaskArgs holds for a tensor in
// pinned memory, and what a checkpoint read holds on its buffers while it writes them.
// Python type pinstage._pinstage.BufferExport.
struct Lease {
  Lease(py::object owner, ViewHolder* holder, LeaseHolder by, std::string label = {});
  ~Lease();
  Lease(const Lease&) = delete;
  Lease& operator=(const Lease&) = delete;

  py::object owner;  // keeps the holder (and its worker) alive
  ViewHolder* holder;
  LeaseHolder by;
  std::string label;  // the tensor name TaskArgs gave, for finalize()'s refusal
};
// A new Lease on `holder` (whose Python object is `owner`), as a Python object.
py::object make_lease(py::object owner, ViewHolder* holder, LeaseHolder by = LeaseHolder::view,
                      std::string label = {});

// The tensor names the live views of `holder` were given (a TaskArgs name, a DeviceLoad
// tensor), one per view, sorted: what finalize()'s refusal names instead of an address.
std::vector<std::string> view_labels(const ViewHolder* holder);

// How export_dlpack shares the memory.
struct DLPackRequest {
  bool versioned = false;  // DLPack >= 1.0 capsule ("dltensor_versioned")
  bool copy = false;       // a private copy (IS_COPIED); no view is counted
  bool read_only = false;
  std::string label;  // the tensor's name, if known (view_labels)
};

// DLPack export of [data, ...) owned by `owner` (a Python object whose C++ side is
// `holder`): one more view until the consumer's deleter runs.
py::capsule export_dlpack(py::object owner, ViewHolder* holder, void* data, DLDataType dtype,
                          std::vector<int64_t> shape, DLDevice device, DLPackRequest request = {});
// True when a consumer's max_version asks for DLPack >= 1.0 (a (major, minor) pair or None).
bool wants_versioned(const py::object& max_version);
// The bytes of one element of `dtype`.
uint64_t dl_itemsize(DLDataType dtype);

// False at interpreter shutdown, when Python objects must no longer be touched from a
// deleter (the process is about to release everything anyway).
inline bool interpreter_usable() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsInitialized() && !Py_IsFinalizing();
#else
  return Py_IsInitialized() && !_Py_IsFinalizing();
#endif
}

// An int argument (anything with __index__: int, NumPy integers; never bool) as int64:
// Error(invalid_argument) naming `what` for another type or a value outside int64.
int64_t int_arg(const py::handle& value, const std::string& what);

// A library report's fields (pinstage/report.h) as a dict, in their order.
py::dict fields_dict(const ReportFields& fields);

// A path argument: a str, or an os.PathLike whose fspath is a str (TypeError naming `what`
// otherwise: "load_file(): path must be str or os.PathLike, not int"). A NUL in it is
// Error(invalid_argument) (require_no_nul).
std::string path_arg(const py::handle& value, const std::string& what);
// Error(invalid_argument) naming `what` and the value when `path` holds a NUL character:
// the C file API would silently cut the path there ("m.safetensors\0.other" would open
// m.safetensors).
void require_no_nul(const std::string& path, const std::string& what);

// __dlpack__(stream=None, *, max_version=None, dl_device=None, copy=None), the array API's
// keywords, on `cls` (PinnedHostBuffer, DeviceBuffer); `text` says what `fn` exports.
template <class Class, class Fn>
void def_dlpack(Class& cls, Fn&& fn, const char* text) {
  cls.def("__dlpack__", std::forward<Fn>(fn), py::arg("stream") = py::none(), py::kw_only(),
          py::arg("max_version") = py::none(), py::arg("dl_device") = py::none(),
          py::arg("copy") = py::none(),
          method_doc("__dlpack__(stream: Any = None, *, max_version: tuple[int, int] | None = "
                     "None, dl_device: tuple[int, int] | None = None, copy: bool | None = "
                     "None) -> types.CapsuleType",
                     text));
}

// Exception classes (pinstage.Error and its subclasses), created at import.
void register_errors(py::module_& m);

void bind_worker(py::module_& m);
void bind_lease(py::module_& m);    // BufferExport, before bind_worker
void bind_tensors(py::module_& m);  // TaskArgs and Binder; scenes via bind_scene_run

void bind_scene_run(py::module_& m);  // the scene registry's Python side (run_scene, ...)
// DeviceBuffer, CopyEvent and the Worker's alloc_device and async copies (device.cpp),
// after bind_worker.
void bind_device(py::module_& m);
// "tensor 'a' (bfloat16 [4, 4])": the live views of holder, whose memory is [data, data +
// nbytes) (nbytes 0: unknown), by their names (view_labels, `name`) and the dtype and shape
// of the torch tensors and NumPy arrays over that memory; "" when nothing is known.
std::string describe_live_tensors(const ViewHolder* holder, const void* data, uint64_t nbytes,
                                  const std::string& name = {});
// The device memory of a DeviceBuffer holder (device.cpp), or {nullptr, 0} for another holder.
std::pair<const void*, uint64_t> device_range(const ViewHolder* holder);
void bind_node(py::module_& m);  // node.cpp: WorkerGroup, group bind, load to devices
// A Python DeviceBuffer owning `buffer`, device memory of the Worker `worker_obj`
// (device.cpp): what Worker.alloc_device returns.
py::object make_device_buffer(const py::object& worker_obj, DeviceBuffer buffer);

}  // namespace pinstage::python
