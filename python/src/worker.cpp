// Note [Python view lifetime]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~
// No Python view may ever point at released memory:
//  - A PinnedHostBuffer holds a reference to its Python Worker, so the worker (and the
//    plugin that allocated the memory) outlives every buffer: `del worker` while tensors
//    exist is safe; the worker finalizes when the last buffer and the user's reference go.
//  - Every view is counted on its holder (ViewHolder::views): the buffer protocol
//    (memoryview, NumPy) counts from getbuffer to releasebuffer, DLPack (torch) from the
//    export to the consumer's deleter. A view also holds a reference to its holder.
//  - close() with live views raises BufferError naming the count, like mmap.close().
//  - Worker.finalize() with live views anywhere in its pinned memory refuses with
//    BufferError naming the holders and views; otherwise it closes the open buffers and
//    finalizes the C++ worker. Holders without views are reclaimed (their later use is an
//    error, never a read of released memory).
//  - Releases go through the C++ Buffer: a failed release is logged to stderr, never thrown.
// Counts and the registries change only under the GIL; the DLPack deleter takes the GIL.
#include <Python.h>

#include <pybind11/stl.h>

#include <sstream>

#include "common.h"
#include "pinstage/bind.h"

namespace pinstage::python {

// ---- registries ----

std::map<uintptr_t, PyBuffer*>& open_buffers() {
  static auto* buffers = new std::map<uintptr_t, PyBuffer*>();  // never destroyed: used at exit
  return *buffers;
}

PyBuffer* find_pinned(const void* ptr, uint64_t bytes) {
  const auto address = reinterpret_cast<uintptr_t>(ptr);
  auto& buffers = open_buffers();
  auto it = buffers.upper_bound(address);
  if (it == buffers.begin()) return nullptr;
  --it;
  PyBuffer* buffer = it->second;
  const uint64_t offset = address - it->first;
  if (!buffer->open() || offset > buffer->nbytes || bytes > buffer->nbytes - offset) return nullptr;
  return buffer;
}

// ---- PyWorker ----

PyWorker::PyWorker(WorkerLevel level, std::string backend, int device_id_, WorkerOptions options_)
    : backend_name(std::move(backend)),
      device_id(device_id_),
      options(std::move(options_)),
      worker(level) {}

PyWorker::~PyWorker() {
  py::gil_scoped_release nogil;
  worker.finalize();
}

void PyWorker::count_views(int64_t* holders_with_views, int64_t* views) const {
  *holders_with_views = 0;
  *views = 0;
  auto add = [&](const ViewHolder* holder) {
    if (holder->views > 0) {
      ++*holders_with_views;
      *views += holder->views;
    }
  };
  for (const PyBuffer* buffer : buffers) add(buffer);
  for (const ViewHolder* holder : holders) add(holder);
}

void PyWorker::require_no_views(const char* what) const {
  int64_t holders_with_views = 0, views = 0;
  count_views(&holders_with_views, &views);
  if (views > 0)
    throw py::buffer_error(std::string("cannot ") + what + ": " +
                           std::to_string(holders_with_views) + " pinned buffer(s) still have " +
                           std::to_string(views) +
                           " live view(s) (memoryview, NumPy array, torch tensor or DLPack "
                           "capsule); delete them first (del, then gc.collect() for cycles)");
  if (busy > 0)
    throw py::buffer_error(std::string("cannot ") + what + ": " + std::to_string(busy) +
                           " call(s) on other threads are still reading this worker's pinned "
                           "memory; wait for them first");
}

// ---- PyBuffer ----

PyBuffer::PyBuffer(py::object worker_obj_, PyWorker* worker_, PinnedHostBuffer buffer_)
    : worker_obj(std::move(worker_obj_)),
      worker(worker_),
      buffer(std::move(buffer_)),
      nbytes(buffer.size()) {
  worker->buffers.insert(this);
  open_buffers()[reinterpret_cast<uintptr_t>(buffer.data())] = this;
}

// Unregisters (under the GIL) and empties the buffer; the caller releases what it returns,
// without the GIL, so no other thread can see a half-released buffer.
static PinnedHostBuffer take(PyBuffer& b) {
  if (b.buffer) open_buffers().erase(reinterpret_cast<uintptr_t>(b.buffer.data()));
  b.worker->buffers.erase(&b);
  return std::move(b.buffer);
}

PyBuffer::~PyBuffer() {
  PinnedHostBuffer dying = take(*this);
  py::gil_scoped_release nogil;
  dying.reset();  // logs a failed release, never throws
}

void PyBuffer::require_open(const char* what) const {
  if (!open())
    throw py::value_error(std::string(what) +
                          ": the PinnedHostBuffer is closed (close() or the worker's "
                          "finalize() released it)");
}

void PyBuffer::close() {
  if (!buffer) return;
  if (views > 0)
    throw py::buffer_error("cannot close the PinnedHostBuffer: " + std::to_string(views) +
                           " live view(s) (memoryview, NumPy array, torch tensor or DLPack "
                           "capsule) still use it; delete them first");
  PinnedHostBuffer dying = take(*this);
  py::gil_scoped_release nogil;
  dying.reset();
}

namespace {

// ---- the buffer protocol: writable 1-D unsigned bytes, counted as a view ----

PyBuffer* as_buffer(PyObject* self) {
  try {
    return py::cast<PyBuffer*>(py::handle(self));
  } catch (const std::exception&) {
    return nullptr;
  }
}

int get_buffer(PyObject* self, Py_buffer* view, int flags) {
  view->obj = nullptr;
  PyBuffer* buffer = as_buffer(self);
  if (buffer == nullptr) {
    PyErr_SetString(PyExc_BufferError, "not a PinnedHostBuffer");
    return -1;
  }
  if (!buffer->open()) {
    PyErr_SetString(PyExc_ValueError,
                    "the PinnedHostBuffer is closed (close() or the worker's finalize() "
                    "released it)");
    return -1;
  }
  if (PyBuffer_FillInfo(view, self, buffer->buffer.data(), static_cast<Py_ssize_t>(buffer->nbytes),
                        0, flags) != 0)
    return -1;
  ++buffer->views;
  return 0;
}

void release_buffer(PyObject* self, Py_buffer*) {
  if (PyBuffer* buffer = as_buffer(self)) --buffer->views;
}

FaultKind parse_fault_kind(const std::string& name) {
  std::string valid;
  for (int k = 0; k < PS_FAULT_KIND_COUNT; ++k) {
    if (name == ps_fault_kind_name(k)) return static_cast<FaultKind>(k);
    valid += valid.empty() ? "" : ", ";
    valid += ps_fault_kind_name(k);
  }
  throw Error(ErrorCode::invalid_argument,
              "unknown fault kind '" + name + "' (valid: " + valid + ")");
}

// A dict of str -> str/int as the backend's key/value settings.
BackendConfig backend_config(const py::handle& value) {
  if (!py::isinstance<py::dict>(value))
    throw Error(ErrorCode::invalid_argument,
                "option config must be a dict of backend settings, e.g. "
                "{'pinned_mode': 'register'}");
  BackendConfig config;
  for (auto item : value.cast<py::dict>())
    config.emplace_back(py::str(item.first).cast<std::string>(),
                        py::str(item.second).cast<std::string>());
  return config;
}

// An int argument as int64: Error(invalid_argument) for a non-int (bool included) and for
// a value outside int64.
int64_t int_arg(const py::handle& value, const std::string& what) {
  if (!py::isinstance<py::int_>(value) || py::isinstance<py::bool_>(value))
    throw Error(
        ErrorCode::invalid_argument,
        what + " must be an int, got " + py::type::of(value).attr("__name__").cast<std::string>());
  int overflow = 0;
  const long long v = PyLong_AsLongLongAndOverflow(value.ptr(), &overflow);
  if (overflow != 0)
    throw Error(ErrorCode::invalid_argument,
                what + " = " + py::repr(value).cast<std::string>() + " is out of range");
  return v;
}

uint64_t non_negative(const py::handle& value, const char* name) {
  const int64_t v = int_arg(value, std::string("option ") + name);
  if (v < 0)
    throw Error(ErrorCode::invalid_argument,
                std::string("option ") + name + " must be >= 0, got " + std::to_string(v));
  return static_cast<uint64_t>(v);
}

WorkerOptions parse_options(const py::kwargs& kwargs) {
  WorkerOptions options;
  for (auto item : kwargs) {
    const auto key = item.first.cast<std::string>();
    if (key == "device_capacity_bytes")
      options.device_capacity_bytes = non_negative(item.second, "device_capacity_bytes");
    else if (key == "plugin_path")
      options.plugin_path = item.second.cast<std::string>();
    else if (key == "config")
      options.config = backend_config(item.second);
    else
      throw py::type_error("Worker() got an unexpected option '" + key +
                           "' (options: device_capacity_bytes, plugin_path, config)");
  }
  return options;
}

// Holds the GIL: the C++ init() must not race with any other call on the same worker.
void init_worker(PyWorker& w) { w.worker.init(w.backend_name, w.device_id, w.options); }

void finalize_worker(PyWorker& w) {
  if (!w.worker.initialized()) return;  // idempotent, like the C++ finalize()
  w.require_no_views("finalize the worker");
  // Buffers without views are released one by one (so they read as closed), then the
  // worker reclaims whatever else it handed out.
  std::vector<PyBuffer*> open(w.buffers.begin(), w.buffers.end());
  for (PyBuffer* buffer : open) buffer->close();
  for (auto* binder : w.binders) binder->reset();
  py::gil_scoped_release nogil;
  w.worker.finalize();
}

std::string stats_repr(const WorkerStats& s) {
  std::ostringstream out;
  out << "WorkerStats(pinned_bytes=" << s.pinned_bytes << ", pinned_count=" << s.pinned_count
      << ", device_bytes=" << s.device_bytes << ", device_count=" << s.device_count
      << ", device_committed_bytes=" << s.device_committed_bytes
      << ", device_capacity_bytes=" << s.device_capacity_bytes << ")";
  return out.str();
}

}  // namespace

void bind_worker(py::module_& m) {
  py::class_<Capabilities>(m, "Capabilities", "What the worker's backend can do.")
      .def_readonly("pinned_is_page_locked", &Capabilities::pinned_is_page_locked)
      .def_readonly("async_copy", &Capabilities::async_copy)
      .def_readonly("device_memory_is_host", &Capabilities::device_memory_is_host)
      .def_readonly("execute", &Capabilities::execute)
      .def("__repr__", [](const Capabilities& c) {
        auto b = [](bool v) { return v ? "True" : "False"; };
        return std::string("Capabilities(pinned_is_page_locked=") + b(c.pinned_is_page_locked) +
               ", async_copy=" + b(c.async_copy) + ", execute=" + b(c.execute) +
               ", device_memory_is_host=" + b(c.device_memory_is_host) + ")";
      });

  py::class_<WorkerStats>(m, "WorkerStats", "Outstanding allocations of a worker.")
      .def_readonly("pinned_bytes", &WorkerStats::pinned_bytes)
      .def_readonly("pinned_count", &WorkerStats::pinned_count)
      .def_readonly("device_bytes", &WorkerStats::device_bytes)
      .def_readonly("device_count", &WorkerStats::device_count)
      .def_readonly("device_committed_bytes", &WorkerStats::device_committed_bytes)
      .def_readonly("device_capacity_bytes", &WorkerStats::device_capacity_bytes)
      .def("__repr__", &stats_repr);

  py::class_<PyWorker>(m, "Worker", "One device through a backend plugin, and its pinned memory.")
      .def(py::init([](const std::string& level, const std::string& backend, int device_id,
                       bool initialize, const py::kwargs& kwargs) {
             auto w = std::make_unique<PyWorker>(parse_worker_level(level), backend, device_id,
                                                 parse_options(kwargs));
             if (initialize) init_worker(*w);
             return w;
           }),
           py::arg("level") = "chip", py::arg("backend") = "sim", py::arg("device_id") = 0,
           py::kw_only(), py::arg("initialize") = true)
      .def("init", &init_worker)
      .def("finalize", &finalize_worker)
      .def("__enter__",
           [](py::object self) {
             auto& w = self.cast<PyWorker&>();
             if (!w.worker.initialized() && !w.worker.finalized()) init_worker(w);
             return self;
           })
      .def("__exit__",
           [](PyWorker& w, py::handle exc_type, py::handle, py::handle) {
             // With an exception already on its way, leave a worker whose memory is still
             // viewed alone (it finalizes when its last reference goes) rather than hide
             // that exception behind a BufferError.
             int64_t holders = 0, views = 0;
             w.count_views(&holders, &views);
             if (!exc_type.is_none() && (views > 0 || w.busy > 0)) return false;
             finalize_worker(w);
             return false;
           })
      .def_property_readonly("initialized",
                             [](const PyWorker& w) { return w.worker.initialized(); })
      .def_property_readonly("finalized", [](const PyWorker& w) { return w.worker.finalized(); })
      .def_property_readonly("level",
                             [](const PyWorker& w) { return worker_level_name(w.worker.level()); })
      .def_property_readonly("backend",
                             [](const PyWorker& w) {
                               return w.worker.initialized() ? w.worker.backend().name
                                                             : w.backend_name;
                             })
      .def_property_readonly("backend_path",
                             [](const PyWorker& w) { return w.worker.backend().path; })
      .def_property_readonly("device_id", [](const PyWorker& w) { return w.device_id; })
      .def_property_readonly("capabilities",
                             [](const PyWorker& w) { return w.worker.capabilities(); })
      .def("stats", [](const PyWorker& w) { return w.worker.stats(); })
      .def_property_readonly("live_views",
                             [](const PyWorker& w) {
                               int64_t holders = 0, views = 0;
                               w.count_views(&holders, &views);
                               return views;
                             })
      .def_property_readonly("open_buffers", [](const PyWorker& w) { return w.buffers.size(); })
      .def(
          "alloc_pinned_host",
          [](py::object self, const py::object& nbytes) {
            auto& w = self.cast<PyWorker&>();
            const int64_t n = int_arg(nbytes, "alloc_pinned_host: nbytes");
            if (n < 1)
              throw Error(ErrorCode::invalid_argument,
                          "alloc_pinned_host: nbytes must be >= 1, got " + std::to_string(n));
            const auto bytes = static_cast<size_t>(n);
            PinnedHostBuffer buffer;
            {
              py::gil_scoped_release nogil;  // pre-faulting and locking take time
              buffer = w.worker.alloc_pinned_host(bytes);
            }
            return std::make_unique<PyBuffer>(self, &w, std::move(buffer));
          },
          py::arg("nbytes"))
      .def(
          "inject_fault",
          [](PyWorker& w, const std::string& kind, uint64_t nth) {
            w.worker.inject_fault(parse_fault_kind(kind), nth);
          },
          py::arg("kind"), py::arg("nth") = 1)
      .def("__repr__", [](const PyWorker& w) {
        const char* state = w.worker.initialized() ? "initialized"
                            : w.worker.finalized() ? "finalized"
                                                   : "not initialized";
        return std::string("<pinstage.Worker level=") + worker_level_name(w.worker.level()) +
               " backend=" + w.backend_name + " device_id=" + std::to_string(w.device_id) + " " +
               state + ">";
      });

  auto buffer_class =
      py::class_<PyBuffer>(m, "PinnedHostBuffer", py::buffer_protocol(),
                           "Pinned host memory of a Worker: writable 1-D bytes through the "
                           "buffer protocol and DLPack.")
          .def_property_readonly("nbytes", [](const PyBuffer& b) { return b.nbytes; })
          .def("__len__", [](const PyBuffer& b) { return b.nbytes; })
          .def_property_readonly("closed", [](const PyBuffer& b) { return !b.open(); })
          .def_property_readonly("live_views", [](const PyBuffer& b) { return b.views; })
          .def_property_readonly("worker", [](const PyBuffer& b) { return b.worker_obj; })
          .def("close", &PyBuffer::close)
          .def("__enter__", [](py::object self) { return self; })
          .def("__exit__",
               [](PyBuffer& b, py::handle exc_type, py::handle, py::handle) {
                 if (!exc_type.is_none() && b.views > 0) return false;
                 b.close();
                 return false;
               })
          .def(
              "__dlpack__",
              [](py::object self, py::object stream, py::object max_version, py::object dl_device,
                 py::object copy) {
                (void)stream;       // host memory: nothing is queued, so no stream to order against
                (void)max_version;  // always the unversioned capsule, which every consumer takes
                auto& b = self.cast<PyBuffer&>();
                b.require_open("__dlpack__");
                if (!copy.is_none() && copy.cast<bool>())
                  throw py::buffer_error("PinnedHostBuffer exports are zero-copy only (copy=True)");
                DLDevice device{kDLCPU, 0};
                if (!dl_device.is_none()) {
                  const auto wanted = dl_device.cast<std::pair<int, int>>();
                  const bool cuda_host = wanted.first == kDLCUDAHost &&
                                         !b.worker->worker.capabilities().device_memory_is_host &&
                                         b.worker->worker.capabilities().pinned_is_page_locked;
                  if (wanted.first == kDLCUDAHost && cuda_host)
                    device = DLDevice{kDLCUDAHost, 0};
                  else if (wanted.first != kDLCPU)
                    throw py::buffer_error(
                        "cannot export a PinnedHostBuffer of backend '" +
                        b.worker->worker.backend().name + "' to DLPack device type " +
                        std::to_string(wanted.first) +
                        " (kDLCPU = 1 always; kDLCUDAHost = 3 for the cuda backend)");
                }
                return export_dlpack(self, &b, b.buffer.data(), DLDataType{kDLUInt, 8, 1},
                                     {static_cast<int64_t>(b.nbytes)}, device);
              },
              py::arg("stream") = py::none(), py::kw_only(), py::arg("max_version") = py::none(),
              py::arg("dl_device") = py::none(), py::arg("copy") = py::none())
          .def("__dlpack_device__",
               [](const PyBuffer& b) {
                 b.require_open("__dlpack_device__");
                 return py::make_tuple(static_cast<int>(kDLCPU), 0);
               })
          .def("__repr__", [](const PyBuffer& b) {
            return std::string("<pinstage.PinnedHostBuffer nbytes=") + std::to_string(b.nbytes) +
                   (b.open() ? "" : " closed") + " views=" + std::to_string(b.views) + ">";
          });
  // pybind11's buffer slots only serve def_buffer(); these count views and refuse a
  // closed buffer.
  auto* type = reinterpret_cast<PyTypeObject*>(buffer_class.ptr());
  type->tp_as_buffer->bf_getbuffer = &get_buffer;
  type->tp_as_buffer->bf_releasebuffer = &release_buffer;
  PyType_Modified(type);

  // The Worker whose open buffer holds [address, address + nbytes), or None (internal:
  // how is_pinned() and TaskArgs tell pinned tensors apart).
  m.def("_pinned_owner", [](uintptr_t address, uint64_t nbytes) -> py::object {
    PyBuffer* buffer = find_pinned(reinterpret_cast<const void*>(address), nbytes);
    return buffer ? buffer->worker_obj : py::object(py::none());
  });

  m.def(
      "require_chip_worker",
      [](const PyWorker& w, const std::string& who) { require_chip_worker(w.worker, who); },
      py::arg("worker"), py::arg("who"));
}

}  // namespace pinstage::python
