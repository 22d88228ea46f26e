// Device memory and non-blocking copies for Python: Worker.alloc_device gives a
// DeviceBuffer; Worker.copy_to_device_async / copy_to_host_async queue a copy between it
// and pinned host memory on the worker's copy stream and return a CopyEvent (wait(),
// query()). See docs/python.md, "Device memory and non-blocking copies".
//
// Note [Pending copies]
// ~~~~~~~~~~~~~~~~~~~~~
// A queued copy reads (upload) or writes (download) pinned host memory and device memory
// after the call that queued it has returned, so until it is known to be complete:
//  - the CopyEvent holds a Lease (LeaseHolder::copy) on the PinnedHostBuffer under the
//    host side: the buffer's close() and the worker's finalize() refuse, naming the
//    pending copy (a pageable host side is refused: nothing would keep it alive);
//  - the CopyEvent holds the DeviceBuffer, whose close() refuses while copies are pending;
//  - the CopyEvent holds the Worker.
// "Known complete" is wait() returning (or raising the copy's error), query() answering
// True, or the CopyEvent being destroyed: its destructor waits for the copy, keeping the
// GIL (destructors never release it), then lets everything go. The GIL is released while
// a copy is queued and while wait() blocks; the copy itself runs on the backend's stream
// (sim: its stream thread; cuda: the DMA engine) and never needs the GIL.
#include <pybind11/stl.h>

#include <memory>
#include <string>
#include <utility>

#include "args.h"
#include "common.h"
#include "pinstage/backend/sim_ext.h"

namespace pinstage::python {

namespace {

std::string type_name(const py::handle& value) {
  return py::type::of(value).attr("__name__").cast<std::string>();
}

// Device memory of a worker as Python holds it. A ViewHolder: its DLPack exports are views
// that close() and the worker's finalize() wait for (BufferError naming them).
struct PyDeviceBuffer : ViewHolder {
  py::object worker_obj;  // declared first: released last
  PyWorker* worker = nullptr;
  DeviceBuffer buffer;
  uint64_t nbytes = 0;
  int64_t pending = 0;  // CopyEvents not yet known complete

  PyDeviceBuffer() = default;
  PyDeviceBuffer(const PyDeviceBuffer&) = delete;
  PyDeviceBuffer& operator=(const PyDeviceBuffer&) = delete;
  ~PyDeviceBuffer() override {
    if (worker != nullptr) worker->holders.erase(this);
  }
  std::string holder_name() const override { return "DeviceBuffer"; }

  bool open() const noexcept { return static_cast<bool>(buffer) && buffer.valid(); }
  void require_open(const char* what) const {
    if (!open())
      throw py::value_error(std::string(what) +
                            ": the DeviceBuffer is closed (close() or the worker's finalize() "
                            "released it)");
  }
  void close() {
    if (pending > 0)
      throw py::buffer_error("cannot close the DeviceBuffer: " + std::to_string(pending) +
                             " pending async copy(ies) use it; wait() their CopyEvents first");
    if (views > 0)
      throw py::buffer_error("cannot close the DeviceBuffer: " + std::to_string(views) +
                             " DLPack view(s) of it are alive (a torch tensor, say); delete "
                             "them first");
    DeviceBuffer dying = std::move(buffer);
    dying.reset();
  }
};

// One queued copy; see Note [Pending copies].
struct PyCopyEvent {
  py::object worker_obj;  // declared first: released last
  PyWorker* worker;
  py::object device_obj;         // the DeviceBuffer
  std::unique_ptr<Lease> lease;  // on the host side's PinnedHostBuffer (null for 0 bytes)
  Event event;
  std::string direction;  // "to_device" or "to_host"
  uint64_t nbytes = 0;
  bool done = false;

  PyCopyEvent() = default;
  PyCopyEvent(const PyCopyEvent&) = delete;
  PyCopyEvent& operator=(const PyCopyEvent&) = delete;

  // Under the GIL: the copy is over; let the host and device memory go.
  void finish() {
    if (done) return;
    done = true;
    worker->pending_copies -= 1;
    lease.reset();
    if (device_obj) device_obj.cast<PyDeviceBuffer&>().pending -= 1;
  }

  // Keeps the GIL (a destructor never releases it); a failed copy is reported as
  // unraisable, never thrown from here.
  ~PyCopyEvent() {
    if (done) return;
    try {
      if (worker->worker.initialized()) worker->worker.wait(event);
    } catch (const std::exception& e) {
      if (interpreter_usable() &&
          PyErr_WarnFormat(PyExc_RuntimeWarning, 1,
                           "pinstage: a CopyEvent collected without wait() ended in an error: %s",
                           e.what()) < 0)
        PyErr_WriteUnraisable(nullptr);  // warnings turned into errors: report, never throw
    }
    finish();
  }
};

// The pinned host range a torch tensor or PinnedHostBuffer `host` covers, as (buffer,
// pointer, bytes): refused unless it lies in an open pinned buffer of `w`.
struct HostRange {
  PyBuffer* buffer = nullptr;
  void* data = nullptr;
  uint64_t bytes = 0;
};

HostRange host_range(const py::object& host, PyWorker& w, const std::string& who) {
  HostRange r;
  if (py::isinstance<PyBuffer>(host)) {
    auto& b = host.cast<PyBuffer&>();
    b.require_open(who.c_str());
    r.data = b.buffer.data();
    r.bytes = b.nbytes;
  } else {
    py::object torch = py::module_::import("torch");
    if (!py::isinstance(host, torch.attr("Tensor")))
      throw py::type_error(who +
                           ": the host side must be a torch.Tensor or a "
                           "pinstage.PinnedHostBuffer, not " +
                           type_name(host));
    if (host.attr("device").attr("type").cast<std::string>() != "cpu" ||
        !host.attr("layout").equal(torch.attr("strided")))
      throw Error(ErrorCode::invalid_argument,
                  who + ": the host tensor must be a dense CPU tensor, got " +
                      py::str(host.attr("device")).cast<std::string>());
    if (!host.attr("is_contiguous")().cast<bool>())
      throw Error(ErrorCode::invalid_argument, who + ": the host tensor is not contiguous");
    r.bytes = host.attr("numel")().cast<uint64_t>() * host.attr("element_size")().cast<uint64_t>();
    r.data = reinterpret_cast<void*>(host.attr("data_ptr")().cast<uintptr_t>());
  }
  if (r.bytes == 0) return r;
  r.buffer = find_pinned(r.data, r.bytes);
  if (r.buffer == nullptr || r.buffer->worker != &w)
    throw Error(ErrorCode::invalid_argument,
                who + ": the host memory (" + std::to_string(r.bytes) +
                    " bytes) is not inside one open pinned buffer of this worker " +
                    (r.buffer == nullptr ? "(pageable memory could be freed while the copy runs)"
                                         : "(it is another worker's pinned memory)") +
                    "; make it with pinstage.PinnedTorchAllocator(worker)");
  return r;
}

PyDeviceBuffer& device_arg(const py::object& obj, PyWorker& w, const std::string& who) {
  if (!py::isinstance<PyDeviceBuffer>(obj))
    throw py::type_error(who + ": the device side must be a pinstage.DeviceBuffer, not " +
                         type_name(obj));
  auto& d = obj.cast<PyDeviceBuffer&>();
  if (d.worker != &w)
    throw Error(ErrorCode::invalid_argument, who + ": the DeviceBuffer belongs to another worker");
  d.require_open(who.c_str());
  return d;
}

Stream& copy_stream(PyWorker& w) {
  if (!w.copy_stream) w.copy_stream = std::make_unique<Stream>(w.worker.create_stream());
  return *w.copy_stream;
}

// Queues one copy of the whole host side between it and [offset, offset + its bytes) of
// the device buffer, then records the event after it.
py::object copy_async(const py::object& self, const py::object& device, const py::object& host,
                      const py::object& offset_obj, bool to_device) {
  auto& w = self.cast<PyWorker&>();
  const std::string who = to_device ? "copy_to_device_async" : "copy_to_host_async";
  require_chip_worker(w.worker, "Worker." + who);
  PyDeviceBuffer& d = device_arg(device, w, who);
  const HostRange h = host_range(host, w, who);
  const int64_t offset = int_arg(offset_obj, who + ": offset");
  if (offset < 0 || static_cast<uint64_t>(offset) > d.nbytes ||
      h.bytes > d.nbytes - static_cast<uint64_t>(offset))
    throw Error(ErrorCode::invalid_argument, who + ": " + std::to_string(h.bytes) +
                                                 " bytes at offset " + std::to_string(offset) +
                                                 " do not fit the DeviceBuffer of " +
                                                 std::to_string(d.nbytes) + " bytes");
  auto ev = std::make_unique<PyCopyEvent>();
  ev->worker_obj = self;
  ev->worker = &w;
  ev->direction = to_device ? "to_device" : "to_host";
  ev->nbytes = h.bytes;
  if (h.buffer != nullptr)
    ev->lease = std::make_unique<Lease>(py::cast(h.buffer, py::return_value_policy::reference),
                                        h.buffer, LeaseHolder::copy);
  Stream& stream = copy_stream(w);
  ev->event = w.worker.create_event();
  // Counted pending from here: finish() undoes both counts if queueing fails.
  ev->device_obj = device;
  d.pending += 1;
  w.pending_copies += 1;
  try {
    Busy busy(&w);
    GilReleased nogil;
    if (h.bytes > 0) {
      if (to_device)
        w.worker.copy_to_device_async(d.buffer, static_cast<size_t>(offset), h.data, h.bytes,
                                      stream);
      else
        w.worker.copy_to_host_async(h.data, d.buffer, static_cast<size_t>(offset), h.bytes, stream);
    }
    w.worker.record(ev->event, stream);
  } catch (...) {
    // Nothing of this copy is queued (a copy the backend refused is not queued): the
    // stream may still run earlier copies, which their own CopyEvents hold for.
    ev->finish();
    throw;
  }
  return py::cast(std::move(ev));
}

void wait_event(PyCopyEvent& e) {
  if (e.done) return;
  try {
    Busy busy(e.worker);
    GilReleased nogil;
    e.worker->worker.wait(e.event);
  } catch (...) {
    e.finish();  // the copy is over either way: its error is raised once, here
    throw;
  }
  e.finish();
}

bool query_event(PyCopyEvent& e) {
  if (e.done) return true;
  bool reached = false;
  try {
    reached = e.worker->worker.query(e.event);
  } catch (...) {
    e.finish();
    throw;
  }
  if (reached) e.finish();
  return reached;
}

void hold_streams(PyWorker& w, bool hold) {
  require_chip_worker(w.worker, "Worker._hold_streams");
  auto fn = reinterpret_cast<ps_sim_hold_streams_fn>(
      w.worker.backend_extension(PS_SIM_HOLD_STREAMS_NAME));
  if (fn == nullptr)
    throw Error(ErrorCode::unsupported, "Worker._hold_streams: backend '" +
                                            w.worker.backend().name +
                                            "' has no sim.hold_streams (sim only)");
  if (fn(w.worker.native_context(), hold ? 1 : 0) != PS_OK)
    throw Error(ErrorCode::backend, "Worker._hold_streams: sim.hold_streams failed");
}

// The DLPack device of the buffer's memory: sim's device memory is host RAM (kDLCPU),
// cuda's is kDLCUDA and acl's kDLExtDev (DLPack names no Ascend NPU), with the worker's
// device id.
DLDevice dlpack_device_of(const PyDeviceBuffer& d) {
  const Worker& w = d.worker->worker;
  if (w.capabilities().device_memory_is_host) return DLDevice{kDLCPU, 0};
  const std::string& name = w.backend().name;
  if (name == "cuda") return DLDevice{kDLCUDA, w.device_id()};
  if (name == "acl") return DLDevice{kDLExtDev, w.device_id()};
  throw py::buffer_error("a DeviceBuffer of backend '" + name +
                         "' has no DLPack device type pinstage knows");
}

// DeviceBuffer.__dlpack__: the device memory itself, as uint8 [nbytes], no copy.
py::capsule device_dlpack(py::object self, const py::object& stream, const py::object& max_version,
                          const py::object& dl_device, const py::object& copy) {
  (void)stream;  // pinstage's copies are done (no pending one, below) before an export
  auto& d = self.cast<PyDeviceBuffer&>();
  d.require_open("DeviceBuffer.__dlpack__");
  if (d.pending > 0)
    throw py::buffer_error("DeviceBuffer.__dlpack__: " + std::to_string(d.pending) +
                           " async copy(ies) to or from it are pending; wait() them first");
  const DLDevice device = dlpack_device_of(d);
  if (!dl_device.is_none()) {
    if (!py::isinstance<py::tuple>(dl_device) || py::len(dl_device) != 2)
      throw py::type_error("DeviceBuffer.__dlpack__: dl_device must be a (type, id) tuple");
    const auto t = dl_device.cast<py::tuple>();
    if (int_arg(t[0], "dl_device type") != device.device_type ||
        int_arg(t[1], "dl_device id") != device.device_id)
      throw py::buffer_error("DeviceBuffer.__dlpack__: the memory is on DLPack device (" +
                             std::to_string(device.device_type) + ", " +
                             std::to_string(device.device_id) + "); it is never moved");
  }
  if (!copy.is_none() && (!py::isinstance<py::bool_>(copy) || copy.cast<bool>()))
    throw py::buffer_error(
        "DeviceBuffer.__dlpack__: copy must be None or False: device "
        "memory is exported as it is (copy it with the consumer)");
  DLPackRequest request;
  request.versioned = wants_versioned(max_version);
  return export_dlpack(self, &d, d.buffer.data(), DLDataType{kDLUInt, 8, 1},
                       {static_cast<int64_t>(d.nbytes)}, device, request);
}

// DeviceBuffer: a worker's device memory.
void bind_device_buffer(py::module_& m) {
  py::class_<PyDeviceBuffer> c(m, "DeviceBuffer",
                               "Device memory of a Worker (Worker.alloc_device); the source or "
                               "target of copy_to_device_async and copy_to_host_async.");
  def_dlpack(c, &device_dlpack,
             "The device memory as a DLPack uint8 tensor, no copy: on cuda a torch CUDA tensor "
             "(torch.from_dlpack), on sim a CPU one (its device memory is host RAM), on acl "
             "kDLExtDev. BufferError while async copies are pending; close() refuses while a "
             "view lives.");
  c.def_readonly("nbytes", &PyDeviceBuffer::nbytes, "int: the size asked for (kept after close()).")
      .def_property_readonly(
          "device_ptr",
          [](const PyDeviceBuffer& d) {
            d.require_open("DeviceBuffer.device_ptr");
            return reinterpret_cast<uintptr_t>(d.buffer.data());
          },
          "int: the address in the device's space.")
      .def_property_readonly(
          "closed", [](const PyDeviceBuffer& d) { return !d.open(); },
          "bool: the memory was released (close(), or the worker's finalize()).")
      .def_readonly("pending_copies", &PyDeviceBuffer::pending,
                    "int: async copies not yet known complete (close() refuses while any are).")
      .def_readonly("worker", &PyDeviceBuffer::worker_obj,
                    "Worker: the worker whose device memory this is.")
      .def(
          "__dlpack_device__",
          [](const PyDeviceBuffer& d) {
            d.require_open("DeviceBuffer.__dlpack_device__");
            const DLDevice device = dlpack_device_of(d);
            return py::make_tuple(device.device_type, device.device_id);
          },
          method_doc("__dlpack_device__() -> tuple[int, int]",
                     "(kDLCPU, 0) on sim, (kDLCUDA, id) on cuda, (kDLExtDev, id) on acl."))
      .def("close", &PyDeviceBuffer::close,
           method_doc("close() -> None",
                      "Frees the device memory now; idempotent. BufferError while async "
                      "copies are pending."))
      .def("__repr__", [](const PyDeviceBuffer& d) {
        return "<pinstage.DeviceBuffer nbytes=" + std::to_string(d.nbytes) +
               (d.open() ? "" : " closed") + " pending=" + std::to_string(d.pending) + ">";
      });
}

// CopyEvent: a queued async copy.
void bind_copy_event(py::module_& m) {
  py::class_<PyCopyEvent>(m, "CopyEvent",
                          "A queued copy (Worker.copy_to_device_async, copy_to_host_async): "
                          "the point on the worker's copy stream after it.")
      .def("wait", &wait_event,
           method_doc("wait() -> None",
                      "Blocks (GIL released) until this copy and every copy queued on the "
                      "worker before it are complete; raises the copy's error, once. Then "
                      "the host and device memory are free to use."))
      .def("query", &query_event,
           method_doc("query() -> bool",
                      "True when the copy is complete, without waiting (then as after "
                      "wait()); raises the copy's error."))
      .def_readonly("done", &PyCopyEvent::done,
                    "bool: wait() returned or query() said True: the memory is free to use.")
      .def_readonly("direction", &PyCopyEvent::direction, "str: 'to_device' or 'to_host'.")
      .def_readonly("nbytes", &PyCopyEvent::nbytes, "int: the bytes copied.")
      .def("__repr__", [](const PyCopyEvent& e) {
        return "<pinstage.CopyEvent " + e.direction + " " + std::to_string(e.nbytes) + " bytes " +
               (e.done ? "done" : "pending") + ">";
      });
}

// The Worker's device-memory and async-copy methods.
void bind_worker_copies(py::module_& m) {
  auto worker = py::reinterpret_borrow<py::class_<PyWorker>>(m.attr("Worker"));
  worker
      .def(
          "alloc_device",
          [](py::object self, const py::object& nbytes) {
            auto& w = self.cast<PyWorker&>();
            const int64_t n = int_arg(nbytes, "alloc_device: nbytes");
            if (n < 1)
              throw Error(ErrorCode::invalid_argument,
                          "alloc_device: nbytes must be >= 1, got " + std::to_string(n));
            require_chip_worker(w.worker, "Worker.alloc_device");
            return make_device_buffer(self, w.worker.alloc_device(static_cast<size_t>(n)));
          },
          py::arg("nbytes"),
          method_doc("alloc_device(nbytes: int) -> DeviceBuffer",
                     "A new DeviceBuffer of nbytes (>= 1) bytes of device memory."))
      .def(
          "copy_to_device_async",
          [](py::object self, const py::object& dst, const py::object& src,
             const py::object& dst_offset) { return copy_async(self, dst, src, dst_offset, true); },
          py::arg("dst"), py::arg("src"), py::arg("dst_offset") = 0,
          method_doc("copy_to_device_async(dst: DeviceBuffer, src: torch.Tensor | "
                     "PinnedHostBuffer, dst_offset: int = 0) -> CopyEvent",
                     "Queues the upload of all of src (contiguous, in this worker's pinned "
                     "memory) to dst at dst_offset and returns at once; the CopyEvent "
                     "holds src's buffer and dst until the copy is known complete."))
      .def(
          "copy_to_host_async",
          [](py::object self, const py::object& dst, const py::object& src,
             const py::object& src_offset) {
            return copy_async(self, src, dst, src_offset, false);
          },
          py::arg("dst"), py::arg("src"), py::arg("src_offset") = 0,
          method_doc("copy_to_host_async(dst: torch.Tensor | PinnedHostBuffer, src: "
                     "DeviceBuffer, src_offset: int = 0) -> CopyEvent",
                     "Queues the download of len(dst) bytes of src from src_offset into dst "
                     "(contiguous, in this worker's pinned memory) and returns at once."))
      .def("_hold_streams", &hold_streams, py::arg("hold"),
           method_doc("_hold_streams(hold: bool) -> None",
                      "Tests, sim only: while held, queued copies wait (sim.hold_streams)."));
}

}  // namespace

void bind_device(py::module_& m) {
  bind_device_buffer(m);
  bind_copy_event(m);
  bind_worker_copies(m);
}

py::object make_device_buffer(const py::object& worker_obj, DeviceBuffer buffer) {
  auto& w = worker_obj.cast<PyWorker&>();
  auto d = std::make_unique<PyDeviceBuffer>();
  d->worker_obj = worker_obj;
  d->worker = &w;
  w.holders.insert(d.get());
  d->nbytes = buffer.size();
  d->buffer = std::move(buffer);
  return py::cast(std::move(d));
}

}  // namespace pinstage::python
