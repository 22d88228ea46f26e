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
#include "bind_util.h"
#include "common.h"
#include "device_load.h"
#include "load_common.h"
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
  py::object host_obj;           // a map-mode tensor uploaded: it keeps its mapping alive
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
    host_obj = py::object();
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
// pointer, bytes): refused unless it lies in an open pinned buffer of `w`, or (mapped)
// in a map-mode tensor's pinned file mapping of `w` when `read_only_ok` (an upload reads it;
// the tensor keeps its mapping alive, so the copy holds the tensor).
struct HostRange {
  PyBuffer* buffer = nullptr;
  void* data = nullptr;
  uint64_t bytes = 0;
  bool mapped = false;
};

HostRange host_range(const py::object& host, PyWorker& w, const std::string& who,
                     bool read_only_ok = false) {
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
  if (r.buffer == nullptr && w.worker.is_pinned_host(r.data, static_cast<size_t>(r.bytes))) {
    // Pinned by this worker outside any PinnedHostBuffer: a map-mode tensor's file mapping.
    if (!read_only_ok)
      throw Error(ErrorCode::invalid_argument,
                  who + ": the host tensor is a read-only map-mode view of a checkpoint file " +
                      "(pinned, but the file's page cache): copy into writable pinned memory "
                      "instead, a PinnedTorchAllocator(worker) tensor");
    r.mapped = true;
    return r;
  }
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
  const HostRange h = host_range(host, w, who, to_device);
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
  if (h.mapped) ev->host_obj = host;
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

// The worker's backend as it describes itself (pinstage_add_backend, Note [Backend
// descriptions]): the one source of the DLPack and torch device of its memory.
const BackendDescription& description_of(const Worker& w) {
  return describe_plugin(w.backend().path);
}

// DLPack's name of a device type (dlpack.h), for messages.
std::string dlpack_type_name(int type) {
  switch (type) {
    case kDLCPU:
      return "kDLCPU";
    case kDLCUDA:
      return "kDLCUDA";
    case kDLCUDAHost:
      return "kDLCUDAHost";
    case kDLExtDev:
      return "kDLExtDev";
    default:
      return "device type " + std::to_string(type);
  }
}

// The DLPack device of the worker's device memory, as its backend describes it: with
// device id 0 where that memory is host RAM (kDLCPU: sim), else the worker's device id.
DLDevice dlpack_device_of(const Worker& w) {
  const auto type = static_cast<DLDeviceType>(description_of(w).dlpack_device_type);
  return DLDevice{type, type == kDLCPU ? 0 : w.device_id()};
}

// Refuses a typed torch view where the backend's description has no torch device: torch
// cannot import that memory (acl's kDLExtDev: docs/acl.md, "torch_npu").
void require_torch_device(const Worker& w, const std::string& who) {
  const BackendDescription& b = description_of(w);
  if (b.torch_device.empty())
    throw Error(ErrorCode::unsupported,
                who + ": " + b.name + " device memory is DLPack " +
                    dlpack_type_name(b.dlpack_device_type) +
                    ", which torch cannot import; use its device_ptr with the vendor's torch "
                    "extension or copy it to the host (docs/acl.md, \"torch_npu\")");
}

// A torch tensor of `dtype` and `shape` over the first bytes of a uint8 DLPack export
// (no copy): the export counts one view of its holder for as long as the tensor's storage
// lives.
py::object typed_tensor(const py::capsule& flat_export, const py::object& dtype,
                        const py::object& shape) {
  py::object torch = py::module_::import("torch");
  return torch.attr("from_dlpack")(flat_export).attr("view")(dtype).attr("view")(shape);
}

// A tensor of no bytes shares no memory: a fresh empty one on the worker's torch device
// (its description's type, with the device id unless it is host RAM). (An export of a null
// data pointer, which a 0-byte device tensor has, is never released by torch.)
py::object empty_tensor(const Worker& w, const py::object& dtype, const py::object& shape) {
  const DLDevice device = dlpack_device_of(w);
  std::string where = description_of(w).torch_device;
  if (device.device_type != kDLCPU) where += ":" + std::to_string(device.device_id);
  return py::module_::import("torch").attr("empty")(shape, py::arg("dtype") = dtype,
                                                    py::arg("device") = where);
}

// The bytes of `shape` elements of torch dtype `dtype`, checked (TypeError, ValueError).
uint64_t typed_bytes(const py::object& dtype, const py::object& shape, const std::string& who) {
  py::object torch = py::module_::import("torch");
  if (!py::isinstance(dtype, torch.attr("dtype")))
    throw py::type_error(who + ": dtype must be a torch.dtype, not " + type_name(dtype));
  const auto itemsize = torch.attr("empty")(py::tuple(), py::arg("dtype") = dtype)
                            .attr("element_size")()
                            .cast<uint64_t>();
  // The bytes, not only the count, stay under 2**62: (2**61 + 1,) float64 wrapped past
  // 2**64 to 8 bytes and passed the size check (issue 47).
  uint64_t bytes = itemsize;
  for (const py::handle d : shape) {
    const int64_t n = int_arg(d, who + ": shape");
    if (n < 0)
      throw Error(ErrorCode::invalid_argument,
                  who + ": shape " + py::repr(shape).cast<std::string>() + " has a negative size");
    if (n > 0 && bytes > (uint64_t{1} << 62) / static_cast<uint64_t>(n))
      throw Error(ErrorCode::invalid_argument,
                  who + ": shape " + py::repr(shape).cast<std::string>() + " of " +
                      py::str(dtype).cast<std::string>() + " is too large (over 2**62 bytes)");
    bytes *= static_cast<uint64_t>(n);
  }
  return bytes;
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
  const DLDevice device = dlpack_device_of(d.worker->worker);
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

// DeviceBuffer.as_tensor: the first bytes of the buffer as a typed tensor, no copy.
py::object device_as_tensor(py::object self, const py::object& dtype, const py::object& shape) {
  auto& d = self.cast<PyDeviceBuffer&>();
  const std::string who = "DeviceBuffer.as_tensor";
  d.require_open(who.c_str());
  const uint64_t bytes = typed_bytes(dtype, shape, who);
  if (bytes > d.nbytes)
    throw Error(ErrorCode::invalid_argument,
                who + ": " + py::str(dtype).cast<std::string>() + " " +
                    py::repr(shape).cast<std::string>() + " needs " + std::to_string(bytes) +
                    " bytes; the DeviceBuffer has " + std::to_string(d.nbytes));
  if (d.pending > 0)
    throw py::buffer_error(who + ": " + std::to_string(d.pending) +
                           " async copy(ies) to or from it are pending; wait() them first");
  require_torch_device(d.worker->worker, who);
  if (bytes == 0) return empty_tensor(d.worker->worker, dtype, shape);
  py::capsule flat =
      export_dlpack(self, &d, d.buffer.data(), DLDataType{kDLUInt, 8, 1},
                    {static_cast<int64_t>(bytes)}, dlpack_device_of(d.worker->worker));
  return typed_tensor(flat, dtype, shape);
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
  def_memory_properties(c, "device memory");
  c.def_property_readonly(
       "device_ptr",
       [](const PyDeviceBuffer& d) {
         d.require_open("DeviceBuffer.device_ptr");
         return reinterpret_cast<uintptr_t>(d.buffer.data());
       },
       "int: the address in the device's space.")
      .def_readonly("pending_copies", &PyDeviceBuffer::pending,
                    "int: async copies not yet known complete (close() refuses while any are).")
      .def(
          "__dlpack_device__",
          [](const PyDeviceBuffer& d) {
            d.require_open("DeviceBuffer.__dlpack_device__");
            const DLDevice device = dlpack_device_of(d.worker->worker);
            return py::make_tuple(device.device_type, device.device_id);
          },
          method_doc("__dlpack_device__() -> tuple[int, int]",
                     "As the backend describes itself (pinstage.backends()): (kDLCPU, 0) on "
                     "sim, (kDLCUDA, id) on cuda, (kDLExtDev, id) on acl."))
      .def("as_tensor", &device_as_tensor, py::arg("dtype"), py::arg("shape"),
           method_doc("as_tensor(dtype: torch.dtype, shape: Sequence[int]) -> torch.Tensor",
                      "The first bytes of the buffer as a torch tensor of dtype and shape on "
                      "the device's DLPack device (the CPU on sim), no copy; close() and "
                      "finalize() refuse while it lives. acl: pinstage.Error, code 'unsupported' "
                      "(torch has no "
                      "DLPack device for an NPU)."))
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

py::object download(py::object self, uintptr_t address, uint64_t nbytes, const py::object& host);

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
      .def("_download", &download, py::arg("address"), py::arg("nbytes"), py::arg("host"),
           method_doc("_download(address: int, nbytes: int, host: torch.Tensor) -> CopyEvent "
                      "| None",
                      "Worker.to_host's copy: device memory at address into host (pinned)."))
      .def("_hold_streams", &hold_streams, py::arg("hold"),
           method_doc("_hold_streams(hold: bool) -> None",
                      "Tests, sim only: while held, queued copies wait (sim.hold_streams)."))
      .def(
          "_require_torch_device",
          [](const PyWorker& w, const std::string& who) { require_torch_device(w.worker, who); },
          py::arg("who"),
          method_doc("_require_torch_device(who: str) -> None",
                     "to_device's check: Error(unsupported) naming `who` where torch cannot "
                     "import the backend's device memory (its description has no torch "
                     "device)."));
}

const DeviceTensor& load_tensor(const PyDeviceLoad& d, const std::string& name,
                                const std::string& who) {
  if (const DeviceTensor* t = d.find(name)) return *t;
  throw Error(ErrorCode::not_found,
              who + ": the device load has no tensor '" + name + "'" +
                  (d.load.tensors.empty() ? " (it is closed, or loaded nothing)" : ""));
}

// DeviceLoad.tensor(name): the checkpoint's dtype and shape over the tensor's device
// memory, no copy; the export is labelled with the name, which finalize() then names.
py::object load_tensor_view(py::object self, const std::string& name) {
  auto& d = self.cast<PyDeviceLoad&>();
  const std::string who = "DeviceLoad.tensor('" + name + "')";
  const DeviceTensor& t = load_tensor(d, name, who);
  if (t.info.bytes > 0 && !t.buffer.valid())
    throw Error(ErrorCode::finalized, who + ": the worker was finalized; its memory is gone");
  const py::object dtype =
      py::module_::import("pinstage.checkpoint").attr("_torch_dtype")(t.info.dtype, name);
  const py::tuple shape(py::cast(t.info.shape));
  require_torch_device(d.worker->worker, who);
  if (t.info.bytes == 0) return empty_tensor(d.worker->worker, dtype, shape);
  DLPackRequest request;
  request.label = name;
  py::capsule flat = export_dlpack(self, &d, t.buffer.data(), DLDataType{kDLUInt, 8, 1},
                                   {static_cast<int64_t>(t.info.bytes)},
                                   dlpack_device_of(d.worker->worker), request);
  return typed_tensor(flat, dtype, shape);
}

// Worker._download(address, nbytes, host): queues the copy of [address, address + nbytes)
// of this worker's device memory (a DeviceBuffer or a DeviceLoad tensor) into `host` (a
// tensor in its pinned memory). A DeviceBuffer's copy is async (its CopyEvent returned);
// a DeviceLoad's is done before returning (None).
py::object download(py::object self, uintptr_t address, uint64_t nbytes, const py::object& host) {
  auto& w = self.cast<PyWorker&>();
  const auto inside = [&](const void* data, uint64_t size) {
    const auto start = reinterpret_cast<uintptr_t>(data);
    return address >= start && address - start <= size && nbytes <= size - (address - start);
  };
  for (ViewHolder* h : w.holders) {
    if (auto* b = dynamic_cast<PyDeviceBuffer*>(h);
        b != nullptr && b->open() && inside(b->buffer.data(), b->nbytes)) {
      const auto offset = address - reinterpret_cast<uintptr_t>(b->buffer.data());
      return copy_async(self, py::cast(b, py::return_value_policy::reference), host,
                        py::int_(offset), false);
    }
    auto* l = dynamic_cast<PyDeviceLoad*>(h);
    if (l == nullptr) continue;
    for (const DeviceTensor& t : l->load.tensors) {
      if (!inside(t.buffer.data(), t.info.bytes)) continue;
      const HostRange r = host_range(host, w, "Worker.to_host");
      Busy busy(&w);
      GilReleased nogil;
      w.worker.copy_to_host(r.data, t.buffer,
                            address - reinterpret_cast<uintptr_t>(t.buffer.data()), nbytes);
      return py::none();
    }
  }
  throw Error(ErrorCode::invalid_argument,
              "Worker.to_host: the tensor's " + std::to_string(nbytes) +
                  " bytes are not inside one DeviceBuffer or DeviceLoad of this worker (make "
                  "device tensors with Worker.to_device, DeviceBuffer.as_tensor or "
                  "DeviceLoad.tensor)");
}

}  // namespace

void PyDeviceLoad::close() {
  if (views > 0)
    throw py::buffer_error("cannot close the DeviceLoad: " + std::to_string(views) +
                           " view(s) of it are alive (" + describe_live_tensors(this, nullptr, 0) +
                           "); delete them first");
  index.clear();
  std::vector<DeviceTensor> dying = std::move(load.tensors);
  load.tensors.clear();
}

const DeviceTensor* PyDeviceLoad::find(const std::string& name) const {
  if (index.empty())
    for (size_t i = 0; i < load.tensors.size(); ++i) index.emplace(load.tensors[i].info.name, i);
  const auto found = index.find(name);
  return found == index.end() ? nullptr : &load.tensors[found->second];
}

void bind_device_load_views(py::class_<PyDeviceLoad>& cls) {
  cls.def("tensor", &load_tensor_view, py::arg("name"),
          method_doc("tensor(name: str) -> torch.Tensor",
                     "Tensor name on the device as a torch tensor of the checkpoint's dtype "
                     "and shape, no copy (on sim a CPU tensor: sim's device memory is host "
                     "RAM). close() and the worker's finalize() refuse while it lives, naming "
                     "it. acl: pinstage.Error, code 'unsupported' (docs/acl.md, \"torch_npu\")."));
  // A read-only Mapping of name -> tensor(name) (collections.abc.Mapping registers it in
  // python/pinstage/__init__.py), so model.load_state_dict(load, assign=True) takes it.
  cls.def(
         "__getitem__",
         [](py::object self, const std::string& name) {
           if (self.cast<PyDeviceLoad&>().find(name) == nullptr) throw py::key_error(name);
           return load_tensor_view(self, name);
         },
         py::arg("name"),
         method_doc("__getitem__(name: str) -> torch.Tensor", "tensor(name); KeyError if absent."))
      .def(
          "__contains__",
          [](const PyDeviceLoad& d, const py::object& name) {
            return py::isinstance<py::str>(name) && d.find(name.cast<std::string>()) != nullptr;
          },
          py::arg("name"), method_doc("__contains__(name: object) -> bool"))
      .def(
          "__len__", [](const PyDeviceLoad& d) { return d.load.tensors.size(); },
          method_doc("__len__() -> int", "The tensors loaded (0 once closed)."))
      .def(
          "__iter__", [](const py::object& self) { return py::iter(self.attr("keys")()); },
          method_doc("__iter__() -> Iterator[str]", "The names, in checkpoint order."));
}

std::pair<const void*, uint64_t> device_range(const ViewHolder* holder) {
  if (const auto* d = dynamic_cast<const PyDeviceBuffer*>(holder); d != nullptr && d->open())
    return {d->buffer.data(), d->nbytes};
  return {nullptr, 0};
}

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
