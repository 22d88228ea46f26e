// TaskArgs and Binder for Python; the scenes' parts come from bind_scenes (scene_run.cpp
// and each scene's python/ folder). Task args a scene generates in a worker's pinned
// memory are a ViewHolder of that worker: their zero-copy torch tensors count as views
// (Note [Python view lifetime] in worker.cpp), and using them after the worker is
// finalized is Error(finalized).
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <climits>
#include <iterator>
#include <optional>
#include <type_traits>
#include <utility>
#include <variant>

#include "args.h"
#include "bind_options.h"
#include "bind_util.h"
#include "common.h"
#include "pinstage/bind.h"
#include "pinstage/random.h"
#include "pinstage/tensor.h"

namespace pinstage::python {

PyArgs::PyArgs(TaskArgs args_, py::object worker_obj_, PyWorker* worker_)
    : args(std::move(args_)), worker_obj(std::move(worker_obj_)), worker(worker_) {
  if (worker != nullptr) worker->holders.insert(this);
}

PyArgs::~PyArgs() {
  if (worker != nullptr) worker->holders.erase(this);
}

void PyArgs::require_usable(const std::string& what) const {
  if (worker != nullptr && !worker->worker.initialized())
    throw Error(ErrorCode::finalized,
                what +
                    ": these task args were generated in the pinned memory of a worker that "
                    "has since been finalized; generate them again on a live worker");
}

namespace {

// Keeps a Python object alive from C++ (a Storage owner); takes the GIL to let it go.
std::shared_ptr<void> python_owner(py::object object) {
  return std::shared_ptr<void>(new py::object(std::move(object)), [](void* p) {
    if (!interpreter_usable()) return;  // shutdown: leave it
    const PyGILState_STATE gil = PyGILState_Ensure();
    delete static_cast<py::object*>(p);
    PyGILState_Release(gil);
  });
}

// Each dtype as torch names it (str(dtype) without "torch.") and as DLPack codes it: the
// allocator's set, which TaskArgs takes and hands out. fp8 goes out as uint8, raw storage:
// DLPack 1.0 has no fp8 code.
struct DTypeNames {
  DType dtype;
  const char* torch;
  DLDataType dl;
};
constexpr DTypeNames kDTypes[] = {
    {DType::f32, "float32", {kDLFloat, 32, 1}},
    {DType::f64, "float64", {kDLFloat, 64, 1}},
    {DType::f16, "float16", {kDLFloat, 16, 1}},
    {DType::bf16, "bfloat16", {kDLBfloat, 16, 1}},
    {DType::i8, "int8", {kDLInt, 8, 1}},
    {DType::i16, "int16", {kDLInt, 16, 1}},
    {DType::i32, "int32", {kDLInt, 32, 1}},
    {DType::i64, "int64", {kDLInt, 64, 1}},
    {DType::u8, "uint8", {kDLUInt, 8, 1}},
    {DType::boolean, "bool", {kDLBool, 8, 1}},
    {DType::f8_e4m3, "float8_e4m3fn", {kDLUInt, 8, 1}},
    {DType::f8_e5m2, "float8_e5m2", {kDLUInt, 8, 1}},
    {DType::u16, "uint16", {kDLUInt, 16, 1}},
    {DType::u32, "uint32", {kDLUInt, 32, 1}},
    {DType::u64, "uint64", {kDLUInt, 64, 1}},
};

// A row for every DType (u64 is the last): a new dtype fails here until it has one.
static_assert(std::size(kDTypes) == static_cast<size_t>(DType::u64) + 1);

DLDataType dl_dtype(DType dtype) {
  for (const DTypeNames& d : kDTypes)
    if (d.dtype == dtype) return d.dl;
  throw Error(ErrorCode::internal, "unknown dtype");
}

std::optional<DType> dtype_from_torch(const std::string& name) {
  for (const DTypeNames& d : kDTypes)
    if (name == std::string("torch.") + d.torch) return d.dtype;
  return std::nullopt;
}

// "float32, float64, ...": the dtypes this torch has of kDTypes, for the refusal.
std::string torch_dtype_names(const py::object& torch) {
  std::string out;
  for (const DTypeNames& d : kDTypes) {
    if (!py::hasattr(torch, d.torch)) continue;  // float8, uint16..64: newer torch only
    out += out.empty() ? "" : ", ";
    out += d.torch;
  }
  return out;
}

py::object torch_module() { return py::module_::import("torch"); }

std::string type_name(const py::handle& value) {
  return py::type::of(value).attr("__name__").cast<std::string>();
}

// A tensor name as the safetensors format can store it: a non-empty str without NUL,
// not the header's reserved key.
std::string tensor_name(const py::object& name) {
  if (!py::isinstance<py::str>(name))
    throw py::type_error("TaskArgs.add: name must be a str, got " + type_name(name));
  auto text = name.cast<std::string>();
  if (text.empty() || text.find('\0') != std::string::npos || text == "__metadata__")
    throw Error(ErrorCode::invalid_argument,
                "TaskArgs.add: tensor name " + py::repr(name).cast<std::string>() +
                    " is not allowed (empty, a NUL character, or the reserved '__metadata__')");
  return text;
}

void add_tensor(PyArgs& a, const py::object& name_obj, const py::object& tensor,
                const py::object& direction_obj) {
  const std::string name = tensor_name(name_obj);
  if (!py::isinstance<py::str>(direction_obj))
    throw py::type_error("TaskArgs.add: direction must be a str ('in', 'inout', 'out'), got " +
                         type_name(direction_obj));
  const auto direction = direction_obj.cast<std::string>();
  const std::optional<Direction> dir = parse_direction(direction);
  if (!dir)
    throw Error(ErrorCode::invalid_argument,
                "unknown direction '" + direction + "' (valid: 'in', 'inout', 'out')");
  py::object torch = torch_module();
  if (!py::isinstance(tensor, torch.attr("Tensor")))
    throw py::type_error("TaskArgs.add: '" + name + "' must be a torch.Tensor, got " +
                         type_name(tensor));
  if (!tensor.attr("layout").equal(torch.attr("strided")))
    throw Error(ErrorCode::invalid_argument,
                "TaskArgs.add: '" + name + "' has layout " +
                    py::str(tensor.attr("layout")).cast<std::string>() +
                    "; dense (torch.strided) tensors only: pass tensor.to_dense()");
  const auto device = tensor.attr("device").attr("type").cast<std::string>();
  if (device != "cpu")
    throw Error(ErrorCode::invalid_argument,
                "TaskArgs.add: '" + name + "' is on device '" + device +
                    "'; host tensors only (use .cpu(), or PinnedTorchAllocator.copy())");
  if (!tensor.attr("is_contiguous")().cast<bool>())
    throw Error(ErrorCode::invalid_argument,
                "TaskArgs.add: '" + name + "' is not contiguous; pass tensor.contiguous()");
  const auto dtype_name = py::str(tensor.attr("dtype")).cast<std::string>();
  const auto dtype = dtype_from_torch(dtype_name);
  if (!dtype)
    throw Error(ErrorCode::invalid_argument,
                "TaskArgs.add: '" + name + "' has dtype " + dtype_name +
                    "; supported: " + torch_dtype_names(torch) + "; convert it with .to()");
  std::vector<int64_t> shape;
  for (auto d : tensor.attr("shape")) shape.push_back(d.cast<int64_t>());
  const auto address = tensor.attr("data_ptr")().cast<uintptr_t>();
  const auto nbytes =
      tensor.attr("numel")().cast<uint64_t>() * tensor.attr("element_size")().cast<uint64_t>();
  void* data = nbytes == 0 ? nullptr : reinterpret_cast<void*>(address);
  PyBuffer* buffer = nbytes > 0 ? find_pinned(data, nbytes) : nullptr;
  // The storage holds the tensor and, for pinned bytes, a Lease on their buffer: however
  // the tensor was made (DLPack, frombuffer, a raw pointer), the buffer cannot be closed
  // nor its worker finalized while these args hold it, so "pinned" stays true.
  py::object owner = tensor;
  if (buffer != nullptr) {
    py::object buffer_obj = py::cast(buffer, py::return_value_policy::reference);
    owner = py::make_tuple(tensor, make_lease(buffer_obj, buffer, LeaseHolder::args, name));
  }
  // A map-mode tensor's memory is the page cache mapped PROT_READ: TaskArgs refuses it
  // as OUT or INOUT (ReadOnlyError) instead of letting a run write it back.
  const bool read_only =
      py::isinstance(tensor, py::module_::import("pinstage._readonly").attr("ReadOnlyTensor"));
  auto storage =
      std::make_shared<Storage>(data, nbytes, buffer != nullptr, python_owner(owner), read_only);
  a.args.add(Tensor(name, *dtype, std::move(shape), *dir, std::move(storage)));
}

py::object tensor_view(py::object self, const std::string& name) {
  auto& a = self.cast<PyArgs&>();
  a.require_usable("TaskArgs['" + name + "']");
  const Tensor* t = a.args.find(name);
  if (t == nullptr) throw py::key_error("no tensor named '" + name + "' in these task args");
  py::object torch = torch_module();
  return torch.attr("from_dlpack")(export_dlpack(self, &a, t->data(), dl_dtype(t->dtype()),
                                                 t->shape(), DLDevice{kDLCPU, 0},
                                                 DLPackRequest{.label = name}));
}

py::dict describe_tensor(const Tensor& t) {
  py::dict d;
  d["name"] = t.name();
  d["dtype"] = dtype_name(t.dtype());
  d["shape"] = py::tuple(py::cast(t.shape()));
  d["direction"] = direction_name(t.direction());
  d["nbytes"] = t.nbytes();
  d["pinned"] = t.pinned();
  return d;
}

// ---- Binder ----

// A Binder or ResidentBinder in Python. Registered with its worker, whose finalize()
// releases the C++ binder (device memory, staging ring, stream) first; a call afterwards is
// Error(finalized).
template <class B>
struct PyBinderOf {
  using Set = std::unordered_set<std::unique_ptr<B>*> PyWorker::*;
  PyBinderOf(py::object worker_obj_, PyWorker* worker_, std::unique_ptr<B> binder_, Set set_)
      : worker_obj(std::move(worker_obj_)), worker(worker_), binder(std::move(binder_)), set(set_) {
    (worker->*set).insert(&binder);
  }
  ~PyBinderOf() {
    binder.reset();
    (worker->*set).erase(&binder);
  }
  PyBinderOf(const PyBinderOf&) = delete;
  PyBinderOf& operator=(const PyBinderOf&) = delete;

  B& get(const char* what) const {
    if (!binder)
      throw Error(ErrorCode::finalized,
                  std::string(what) +
                      ": the binder's worker was finalized; create and init a new Worker and " +
                      (std::is_same_v<B, Binder> ? "Binder" : "ResidentBinder"));
    return *binder;
  }

  py::object worker_obj;  // keeps the worker alive for the binder's life
  PyWorker* worker;
  std::unique_ptr<B> binder;
  Set set;
  // ResidentBinder: the worker whose pinned memory holds its args (or null). The C++ binder
  // keeps the tensors' storage itself, so a Python TaskArgs may go (its views with it) and
  // the worker's finalize() then releases binder and storage together.
  PyWorker* args_worker = nullptr;
};
using PyBinder = PyBinderOf<Binder>;
using PyResidentBinder = PyBinderOf<ResidentBinder>;

// ResidentBinder's reads and copies of its device-side tensors.
void def_resident_copies(py::class_<PyResidentBinder>& c) {
  c.def(
       "download",
       [](PyResidentBinder& b, const std::string& name, const py::object& offset_obj,
          const py::object& nbytes_obj) {
         // Python ints of any size or sign: InvalidArgumentError naming the argument.
         const int64_t at = int_arg(offset_obj, "ResidentBinder.download: offset");
         if (at < 0)
           throw Error(ErrorCode::invalid_argument,
                       "ResidentBinder.download: offset must be >= 0, got " + std::to_string(at));
         std::optional<uint64_t> nbytes;
         if (!nbytes_obj.is_none()) {
           const int64_t n = int_arg(nbytes_obj, "ResidentBinder.download: nbytes");
           if (n < 0)
             throw Error(ErrorCode::invalid_argument,
                         "ResidentBinder.download: nbytes must be >= 1 (None: to the end), got " +
                             std::to_string(n));
           nbytes = static_cast<uint64_t>(n);
         }
         const auto offset = static_cast<uint64_t>(at);
         ResidentBinder& binder = b.get("ResidentBinder.download");
         Busy args_busy(b.args_worker);
         GilReleased nogil;
         if (nbytes)
           binder.download(name, offset, *nbytes);
         else if (offset == 0)
           binder.download(name);
         else
           binder.download(name, offset,
                           binder.args().get(name).nbytes() -
                               std::min(offset, binder.args().get(name).nbytes()));
       },
       py::arg("name"), py::arg("offset") = 0, py::arg("nbytes") = py::none(),
       method_doc("download(name: str, offset: int = 0, nbytes: int | None = None) -> None",
                  "Copies [offset, offset + nbytes) of the tensor's device copy (to its end "
                  "when nbytes is None) into its host memory at the same offset."))
      .def(
          "copy_on_device",
          [](PyResidentBinder& b, const std::string& from, const std::string& to) {
            ResidentBinder& binder = b.get("ResidentBinder.copy_on_device");
            GilReleased nogil;
            binder.copy_on_device(from, to);
          },
          py::arg("src"), py::arg("dst"),
          method_doc("copy_on_device(src: str, dst: str) -> None",
                     "Copies tensor src's device bytes over input dst's on the device (a "
                     "decode's out fed back as the next hidden_states); dst is then not "
                     "uploaded. Error (code 'unsupported') where the backend has no device "
                     "copy."));
}

// ResidentBinder's read-only properties.
void def_resident_properties(py::class_<PyResidentBinder>& c) {
  c.def_property_readonly(
       "is_open", [](const PyResidentBinder& b) { return b.binder && b.binder->is_open(); },
       "bool: not closed (by close(), a failed step or the worker's finalize).")
      .def_property_readonly(
          "steps", [](const PyResidentBinder& b) { return b.binder ? b.binder->steps() : 0; },
          "int: steps run so far.")
      .def_property_readonly(
          "device_bytes",
          [](const PyResidentBinder& b) { return b.binder ? b.binder->device_bytes() : 0; },
          "int: device memory held now (0 before the first step and after close).")
      .def_property_readonly(
          "check_writes",
          [](const PyResidentBinder& b) { return b.binder && b.binder->check_writes(); },
          "bool: the undeclared-write check is on.")
      .def_readonly("worker", &PyResidentBinder::worker_obj, "Worker: the binder's worker.");
}

// ResidentBinder(worker, args, check_writes=None, **options).
std::unique_ptr<PyResidentBinder> make_resident_binder(py::object worker_obj, py::object args_obj,
                                                       const py::object& check_writes,
                                                       const py::kwargs& options) {
  auto& w = as_worker(worker_obj, "ResidentBinder");
  if (!py::isinstance<PyArgs>(args_obj))
    throw py::type_error("ResidentBinder: args must be a pinstage.TaskArgs");
  const auto& a = args_obj.cast<const PyArgs&>();
  a.require_usable("ResidentBinder");
  if (a.worker != nullptr && a.worker != &w)
    throw Error(ErrorCode::invalid_argument,
                "ResidentBinder: the args live in another worker's pinned memory; "
                "generate them on this worker (or in pageable memory)");
  std::optional<bool> check;
  if (!check_writes.is_none()) {
    if (!py::isinstance<py::bool_>(check_writes))
      throw py::type_error("ResidentBinder: check_writes must be a bool or None");
    check = check_writes.cast<bool>();
  }
  auto binder = std::make_unique<ResidentBinder>(
      w.worker, a.args, bind_options_from(options, "ResidentBinder"), check);
  auto py_binder = std::make_unique<PyResidentBinder>(worker_obj, &w, std::move(binder),
                                                      &PyWorker::resident_binders);
  py_binder->args_worker = a.worker;
  return py_binder;
}

void bind_resident(py::module_& m) {
  static const std::string doc =
      "Keeps a task's inputs on the device across the steps of a loop (docs/bind.md, "
      "'Resident args'): ResidentBinder(worker, args, check_writes=None, **options). The first "
      "step() uploads every 'in' and 'inout' tensor; later steps upload only those passed to "
      "mark_changed(), execute, and read back the 'out' tensors. 'inout' tensors stay on the "
      "device; download() reads them back. check_writes (None = PINSTAGE_RESIDENT_CHECK) "
      "compares a digest of every unchanged 'in' tensor each step and raises pinstage.Error "
      "naming one written without mark_changed(). Options as Binder's:\n" +
      bind_options_doc();
  py::class_<PyResidentBinder> c(m, "ResidentBinder", doc.c_str());
  c.def(py::init(&make_resident_binder), py::arg("worker"), py::arg("args"), py::kw_only(),
        py::arg("check_writes") = py::none(),
        method_doc("__init__(worker: Worker, args: TaskArgs, *, check_writes: bool | None = "
                   "None, **options: Any) -> None",
                   "A resident binder of `args` on `worker`; nothing is taken on the device "
                   "until the first step()."))
      .def(
          "mark_changed",
          [](PyResidentBinder& b, const std::string& name) {
            b.get("ResidentBinder.mark_changed").mark_changed(name);
          },
          py::arg("name"),
          method_doc("mark_changed(name: str) -> None",
                     "The host bytes of 'in' or 'inout' tensor `name` changed: the next step "
                     "uploads it. NotFoundError for an unknown name, InvalidArgumentError for an "
                     "'out' tensor or a closed binder."))
      .def(
          "step",
          [](PyResidentBinder& b) {
            ResidentBinder& binder = b.get("ResidentBinder.step");
            Busy args_busy(b.args_worker);
            Busy worker_busy(b.worker);
            GilReleased nogil;
            return binder.step();
          },
          method_doc("step() -> BindReport",
                     "One step (the GIL is released): upload what changed, execute, read back "
                     "the 'out' tensors. BindError names the step, phase and tensor of a "
                     "failure; the binder then frees its device memory and closes."))
      .def(
          "close",
          [](PyResidentBinder& b) {
            if (b.binder) b.binder->close();
          },
          method_doc("close() -> None", "Frees the device memory; idempotent."))
      .def(
          "__enter__", [](py::object self) { return self; },
          method_doc("__enter__() -> ResidentBinder"))
      .def(
          "__exit__",
          [](PyResidentBinder& b, py::handle, py::handle, py::handle) {
            if (b.binder) b.binder->close();
            return false;
          },
          py::arg("exc_type"), py::arg("exc"), py::arg("tb"),
          method_doc("__exit__(exc_type: Any, exc: Any, tb: Any) -> bool", "close()."));
  def_resident_copies(c);
  def_resident_properties(c);
}

// TaskArgs: a task's named tensors.
void bind_task_args(py::module_& m) {
  py::class_<PyArgs>(m, "TaskArgs", "The ordered, named arguments of one task.")
      .def(py::init<>(), method_doc("__init__() -> None", "Empty arguments."))
      .def("add", &add_tensor, py::arg("name"), py::arg("tensor"), py::arg("direction") = "in",
           method_doc("add(name: str, tensor: torch.Tensor, direction: str = 'in') -> None",
                      "Appends a contiguous, dense CPU tensor ('in', 'inout' or 'out'); no "
                      "copy."))
      .def("__getitem__", &tensor_view, py::arg("name"),
           method_doc("__getitem__(name: str) -> torch.Tensor",
                      "The tensor named `name`, a view of its memory; KeyError if none."))
      .def(
          "__getattr__",
          [](py::object self, const std::string& name) -> py::object {
            if (self.cast<PyArgs&>().args.find(name) == nullptr)
              throw py::attribute_error("TaskArgs has no tensor or attribute '" + name + "'");
            return tensor_view(self, name);
          },
          py::arg("name"),
          method_doc("__getattr__(name: str) -> torch.Tensor", "args.name is args['name']."))
      .def(
          "__contains__",
          [](const PyArgs& a, const std::string& name) { return a.args.find(name) != nullptr; },
          py::arg("name"), method_doc("__contains__(name: str) -> bool"))
      .def(
          "__len__", [](const PyArgs& a) { return a.args.size(); },
          method_doc("__len__() -> int", "The number of tensors."))
      .def_property_readonly(
          "names",
          [](const PyArgs& a) { return list_of(a.args, [](const auto& t) { return t.name(); }); },
          "list[str]: the tensor names, in order.")
      .def(
          "describe",
          [](const PyArgs& a) {
            py::list out;
            for (const auto& t : a.args) out.append(describe_tensor(t));
            return out;
          },
          method_doc("describe() -> list[dict[str, Any]]",
                     "One dict per tensor: name, dtype, shape, direction, nbytes, pinned."))
      .def_property_readonly(
          "total_bytes", [](const PyArgs& a) { return a.args.total_bytes(); },
          "int: the bytes of all tensors.")
      .def_property_readonly(
          "input_bytes", [](const PyArgs& a) { return a.args.input_bytes(); },
          "int: the bytes of the tensors a bind uploads ('in' and 'inout').")
      .def_property_readonly(
          "input_count", [](const PyArgs& a) { return a.args.input_count(); },
          "int: the number of tensors a bind uploads.")
      .def_readonly("worker", &PyArgs::worker_obj,
                    "Worker | None: the worker whose pinned memory holds the tensors, if any.")
      .def_readonly("live_views", &PyArgs::views,
                    "int: views of this TaskArgs' pinned memory still alive.")
      .def(
          "summary", [](const PyArgs& a) { return a.args.summary(); },
          method_doc("summary() -> str", "'20 tensors, 19 inputs, 40,859,999,040 bytes'."))
      .def("__repr__",
           [](const PyArgs& a) { return "<pinstage.TaskArgs " + a.args.summary() + ">"; });
}

// TensorBindReport: one tensor's part in a bind.
void bind_tensor_bind_report(py::module_& m) {
  py::class_<TensorBindReport> c(m, "TensorBindReport", "One tensor's part in a bind.");
  PINSTAGE_PY_DEF_FIELDS(c, PINSTAGE_TENSOR_BIND_REPORT_FIELDS);
  c.def_property_readonly("uploaded", &TensorBindReport::uploaded,
                          "bool: moved host to device in this bind or step.")
      .def_property_readonly("downloaded", &TensorBindReport::downloaded,
                             "bool: read back at its end.");
  def_rates(c, "float: bytes / upload_seconds, in GB/s (0 when not uploaded).",
            "float: bytes / download_seconds, in GB/s.")
      .def("__repr__", [](const TensorBindReport& r) {
        return "<pinstage.TensorBindReport " + r.name + " " + std::to_string(r.bytes) + " bytes>";
      });
}

// One read-only property per entry of PINSTAGE_BIND_REPORT_FIELDS, in its order, the
// list's doc its docstring (the layout by its name), so Python names exactly the keys
// report_fields, the CLI's JSON, writes.
void def_bind_report_fields(py::class_<BindReport>& c) {
  PINSTAGE_PY_DEF_FIELDS_COMPUTED(c, PINSTAGE_BIND_REPORT_FIELDS);
}

// BindReport: the phases and totals of one bind or step.
void bind_bind_report(py::module_& m) {
  py::class_<BindReport> c(m, "BindReport", "What one Binder.run did and how long each part took.");
  c.def_property_readonly(
       "phase_seconds",
       [](const BindReport& r) { return fields_dict(phase_fields(r.phase_seconds)); },
       "dict[str, float]: seconds per phase (docs/bind.md); 0 for a phase that did not run.")
      .def_readonly("tensors", &BindReport::tensors,
                    "list[TensorBindReport]: one per tensor, in argument order.")
      .def("summary", &BindReport::summary,
           method_doc("summary() -> str",
                      "'19 of 20 tensors uploaded (inputs), 40,859,999,040 bytes'."))
      .def("__str__", &BindReport::to_string,
           method_doc("__str__() -> str", "The per-tensor table and the phases."))
      .def("__repr__",
           [](const BindReport& r) { return "<pinstage.BindReport " + r.summary() + ">"; });
  def_bind_report_fields(c);
}

// Binder, and the generator behind PinnedTorchAllocator.randn.
void bind_binder(py::module_& m) {
  static const std::string binder_doc =
      "Binds TaskArgs on one chip-level Worker: Binder(worker, **options), the options and "
      "their defaults being the C++ BindOptions':\n" +
      bind_options_doc();
  py::class_<PyBinder>(m, "Binder", binder_doc.c_str())
      .def(py::init([](py::object worker_obj, const py::kwargs& options) {
             auto& w = as_worker(worker_obj, "Binder");
             auto binder = std::make_unique<Binder>(w.worker, bind_options_from(options, "Binder"));
             return std::make_unique<PyBinder>(worker_obj, &w, std::move(binder),
                                               &PyWorker::binders);
           }),
           py::arg("worker"),
           method_doc("__init__(worker: Worker, **options: Any) -> None",
                      "A Binder on `worker` (an initialized chip-level Worker); options as "
                      "listed in the class docstring."))
      .def(
          "run",
          [](PyBinder& b, const PyArgs& a) {
            a.require_usable("Binder.run");
            Binder& binder = b.get("Binder.run");
            Busy args_busy(a.worker);
            Busy worker_busy(b.worker);
            GilReleased nogil;
            return binder.run(a.args);
          },
          py::arg("args"),
          method_doc("run(args: TaskArgs) -> BindReport",
                     "Uploads args, runs the task where the backend can, downloads the "
                     "outputs; the GIL is released meanwhile. BindError names the phase and "
                     "tensor of a failure."))
      .def_readonly("worker", &PyBinder::worker_obj, "Worker: the Binder's worker.")
      .def_property_readonly(
          "staging_bytes",
          [](const PyBinder& b) { return b.binder ? b.binder->staging_bytes() : 0; },
          "int: the pinned bytes of the Binder's staging ring (0 until the first staged "
          "upload or verify).");

  // Internal (PinnedTorchAllocator.randn): `count` elements at `address` from the
  // counter-based generator (include/pinstage/random.h), GIL released.
  m.def("_fill_normal", [](uintptr_t address, uint64_t count, const std::string& dtype,
                           uint64_t seed, uint64_t stream, float std, float bias) {
    if (find_pinned(reinterpret_cast<void*>(address), count * (dtype == "bf16" ? 2 : 4)) == nullptr)
      throw Error(ErrorCode::invalid_argument, "_fill_normal: not an open pinned buffer's range");
    GilReleased nogil;
    if (dtype == "bf16")
      fill_normal_bf16(reinterpret_cast<uint16_t*>(address), {seed, stream}, 0, count, std, bias);
    else
      fill_normal_f32(reinterpret_cast<float*>(address), {seed, stream}, 0, count, std, bias);
  });
}

}  // namespace

void bind_tensors(py::module_& m) {
  bind_task_args(m);
  bind_tensor_bind_report(m);
  bind_bind_report(m);
  bind_binder(m);
  bind_resident(m);
  bind_scenes(m);
}

}  // namespace pinstage::python
