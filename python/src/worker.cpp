// Note [Python view lifetime]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~
// No Python view may ever point at released memory:
//  - A PinnedHostBuffer holds a reference to its Python Worker, so the worker (and the
//    plugin that allocated the memory) outlives every buffer: `del worker` while tensors
//    exist is safe; the worker finalizes when the last buffer and the user's reference go.
//  - Every view is counted on its holder (ViewHolder::views): the buffer protocol hands out
//    a Lease (Py_buffer.obj, a BufferExport) that counts for as long as it lives, because
//    consumers such as torch.frombuffer keep only that reference and release the
//    Py_buffer at once; DLPack (torch) counts from the export to the consumer's deleter.
//    A view also holds a reference to its holder.
//  - close() with live views raises BufferError naming the count, like mmap.close().
//  - Worker.finalize() with live views anywhere in its pinned memory refuses with
//    BufferError naming the holders and views; otherwise it closes the open buffers and
//    finalizes the C++ worker. Holders without views are reclaimed (their later use is an
//    error, never a read of released memory).
//  - Releases go through the C++ Buffer: a failed release is logged to stderr, never thrown.
//  - A call that allocates or reads a worker's pinned memory without the GIL counts as
//    busy, so finalize() refuses rather than reclaiming under it.
//  - Destructors never release the GIL (see GilReleased in common.h).
// Counts and the registries change only under the GIL; the DLPack deleter takes the GIL.
#include <Python.h>

#include <pybind11/stl.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <sstream>
#include <thread>
#include <variant>

#include "args.h"
#include "bind_util.h"
#include "common.h"
#include "pinstage/bind.h"

namespace pinstage::python {

// ---- the GIL-release test hook (GilReleased in common.h) ----

namespace {
PyObject* installed_gil_release_hook = nullptr;  // a strong reference; touched under the GIL
}  // namespace

PyObject* GilReleased::gil_release_hook() {
  Py_XINCREF(installed_gil_release_hook);
  return installed_gil_release_hook;
}

void GilReleased::run_gil_release_hook(PyObject* hook) {
  try {
    const PyGILState_STATE gil = PyGILState_Ensure();
    PyObject* result = PyObject_CallNoArgs(hook);
    if (result == nullptr) PyErr_WriteUnraisable(hook);
    Py_XDECREF(result);
    Py_DECREF(hook);
    PyGILState_Release(gil);
  } catch (abi::__forced_unwind&) {
    for (;;) pause();  // interpreter exit: parked as in ~GilReleased
  }
}

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

std::unordered_set<PyWorker*>& live_workers() {
  static auto* workers = new std::unordered_set<PyWorker*>();  // never destroyed: used at exit
  return *workers;
}

// ---- PyWorker ----

PyWorker::PyWorker(WorkerLevel level, std::string backend, int device_id_, WorkerOptions options_)
    : backend_name(std::move(backend)),
      device_id(device_id_),
      options(std::move(options_)),
      worker(level) {
  live_workers().insert(this);
}

// Keeps the GIL: a destructor that took it back at interpreter exit would be ended by a
// forced unwind through its noexcept frame (std::terminate).
// The copy stream goes before the context it was made on (a member would be destroyed
// after finalize(), which then warns "1 stream(s) still alive": docs/distributed.md's
// ranks, which end without finalize()). No copy is pending: each CopyEvent held the worker.
PyWorker::~PyWorker() {
  live_workers().erase(this);
  copy_stream.reset();
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

std::string PyWorker::describe_views() const {
  // Buffers in address order (a load's tensors in their order), then the other holders: the
  // first kListed each on a line, then how many more (a 201-tensor load once listed all 201
  // in 27,522 characters, each line a walk over every live Python object).
  constexpr size_t kListed = 5;
  std::vector<const PyBuffer*> held;
  for (const PyBuffer* b : buffers)
    if (b->views > 0) held.push_back(b);
  std::sort(held.begin(), held.end(), [](const PyBuffer* a, const PyBuffer* b) {
    return a->buffer.data() < b->buffer.data();
  });
  std::vector<const ViewHolder*> others;
  for (const ViewHolder* h : holders)
    if (h->views > 0) others.push_back(h);
  std::ostringstream out;
  size_t listed = 0;
  for (const PyBuffer* b : held) {
    if (listed++ == kListed) break;
    const std::string tensors = describe_live_tensors(b, b->buffer.data(), b->nbytes, b->name);
    out << "\n  " << (tensors.empty() ? "" : tensors + " in ") << "PinnedHostBuffer at 0x"
        << std::hex << reinterpret_cast<uintptr_t>(b->buffer.data()) << std::dec << " ("
        << b->nbytes << " bytes): " << b->views << " view(s)";
    if (b->args_views > 0) out << ", " << b->args_views << " of them held by TaskArgs";
    if (b->read_views > 0)
      out << ", " << b->read_views << " of them held by a running checkpoint read";
    if (b->copy_views > 0)
      out << ", " << b->copy_views
          << " of them held by a pending async copy (wait() its CopyEvent)";
  }
  for (const ViewHolder* h : others) {
    if (listed++ == kListed) break;
    const auto [data, nbytes] = device_range(h);
    const std::string tensors = describe_live_tensors(h, data, nbytes);
    out << "\n  " << (tensors.empty() ? "" : tensors + " of a ") << h->holder_name() << ": "
        << h->views << " view(s)";
  }
  const size_t all = held.size() + others.size();
  if (all > kListed) out << "\n  and " << all - kListed << " more";
  return out.str();
}

void PyWorker::require_no_views(const char* what) const {
  if (pending_copies > 0)
    throw py::buffer_error(std::string("cannot ") + what + ": " + std::to_string(pending_copies) +
                           " async copy(ies) are still pending; wait() their CopyEvents first");
  int64_t holders_with_views = 0, views = 0, device_holders = 0;
  count_views(&holders_with_views, &views);
  for (const ViewHolder* h : holders)  // a DeviceBuffer's DLPack export is no pinned buffer
    if (h->views > 0 && h->holder_name() == "DeviceBuffer") ++device_holders;
  const int64_t pinned = holders_with_views - device_holders;
  const std::string held =
      (pinned > 0 ? std::to_string(pinned) + " pinned buffer(s)" : std::string()) +
      (pinned > 0 && device_holders > 0 ? " and " : "") +
      (device_holders > 0 ? std::to_string(device_holders) + " device buffer(s)" : "");
  if (views > 0)
    throw py::buffer_error(
        std::string("cannot ") + what + ": " + held + " still have " + std::to_string(views) +
        " live view(s) (memoryview, NumPy array, torch tensor, DLPack "
        "capsule or TaskArgs); delete them first (del, then gc.collect() for cycles):" +
        describe_views());
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
  // An entry left at this address can only be a buffer whose memory is gone (reclaimed):
  // the new, live buffer takes the address over.
  open_buffers()[reinterpret_cast<uintptr_t>(buffer.data())] = this;
}

// Unregisters (under the GIL) and empties the buffer; the caller releases what it returns,
// so no other thread can see a half-released buffer. Only this buffer's own entry is
// erased: the address may since belong to another worker's buffer.
static PinnedHostBuffer take(PyBuffer& b) {
  if (b.buffer) {
    auto& registry = open_buffers();
    auto it = registry.find(reinterpret_cast<uintptr_t>(b.buffer.data()));
    if (it != registry.end() && it->second == &b) registry.erase(it);
  }
  b.worker->buffers.erase(&b);
  return std::move(b.buffer);
}

// Keeps the GIL (see ~PyWorker); the release logs a failure, never throws.
PyBuffer::~PyBuffer() { take(*this).reset(); }

void PyBuffer::require_open(const char* what) const {
  if (!open())
    throw py::value_error(std::string(what) +
                          ": the PinnedHostBuffer is closed (close() or the worker's "
                          "finalize() released it)");
}

void PyBuffer::close() {
  if (!buffer) return;
  if (views > 0)
    throw py::buffer_error(
        "cannot close the PinnedHostBuffer: " + std::to_string(views) +
        " live view(s) (memoryview, NumPy array, torch tensor, DLPack capsule, TaskArgs or a "
        "checkpoint read) still use it" +
        (read_views > 0 ? ", " + std::to_string(read_views) +
                              " of them held by a running checkpoint read (read_into); wait "
                              "for it to return"
                        : std::string()) +
        (copy_views > 0 ? ", " + std::to_string(copy_views) +
                              " of them held by a pending async copy; wait() its CopyEvent"
                        : std::string()) +
        "; delete them first");
  PinnedHostBuffer dying = take(*this);
  GilReleased nogil;
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

// Py_buffer.obj is a fresh Lease: the view counts for as long as whoever holds that
// reference keeps it (a memoryview until release(), torch.frombuffer for its tensor's life).
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
  try {
    py::object lease = make_lease(py::reinterpret_borrow<py::object>(self), buffer);
    return PyBuffer_FillInfo(view, lease.ptr(), buffer->buffer.data(),
                             static_cast<Py_ssize_t>(buffer->nbytes), 0, flags);
  } catch (py::error_already_set& e) {
    e.restore();
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_BufferError, e.what());
  }
  return -1;
}

// Never called for our views (their obj is the Lease); present so that NumPy's frombuffer
// sees a releasing exporter and keeps a memoryview (and so the Lease) as the array's base.
void release_buffer(PyObject*, Py_buffer*) {}

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

std::string type_name(const py::handle& value) {
  return py::type::of(value).attr("__name__").cast<std::string>();
}

// A str argument (TypeError naming `what` otherwise; never pybind11's "Unable to cast").
std::string str_arg(const py::handle& value, const std::string& what) {
  if (!py::isinstance<py::str>(value))
    throw py::type_error(what + " must be a str, got " + type_name(value));
  return value.cast<std::string>();
}

// A dict of str -> str/int/float/bool as the backend's key/value settings.
BackendConfig backend_config(const py::handle& value) {
  if (!py::isinstance<py::dict>(value))
    throw py::type_error(
        "Worker option config must be a dict of backend settings, e.g. "
        "{'register_chunk_mb': 1024}, got " +
        type_name(value));
  BackendConfig config;
  for (auto item : value.cast<py::dict>()) {
    const std::string key = str_arg(item.first, "Worker option config: a key");
    const py::handle v = item.second;
    if (!py::isinstance<py::str>(v) && !py::isinstance<py::int_>(v) &&
        !py::isinstance<py::float_>(v))
      throw py::type_error("Worker option config['" + key + "'] must be a str, int or float, got " +
                           type_name(v));
    config.emplace_back(key, py::str(v).cast<std::string>());
  }
  return config;
}

}  // namespace

int64_t int_arg(const py::handle& value, const std::string& what) {
  // Anything with __index__ (int, NumPy integers), never bool.
  if (py::isinstance<py::bool_>(value) || !PyIndex_Check(value.ptr()))
    throw Error(ErrorCode::invalid_argument, what + " must be an int, got " + type_name(value));
  py::object index = py::reinterpret_steal<py::object>(PyNumber_Index(value.ptr()));
  if (!index) throw py::error_already_set();
  int overflow = 0;
  const long long v = PyLong_AsLongLongAndOverflow(index.ptr(), &overflow);
  if (overflow != 0)
    throw Error(ErrorCode::invalid_argument, what + " = " + py::repr(value).cast<std::string>() +
                                                 " is out of range (int64: [-2**63, 2**63 - 1])");
  return v;
}

Busy::Busy(PyWorker* worker) : worker_(worker) {
  if (worker_ != nullptr) ++worker_->busy;
}

Busy::~Busy() {
  if (worker_ != nullptr) --worker_->busy;
}

py::dict fields_dict(const ReportFields& fields) {
  py::dict d;
  for (const ReportField& f : fields)
    std::visit([&](const auto& value) { d[py::str(f.key)] = value; }, f.value);
  return d;
}

void require_no_nul(const std::string& path, const std::string& what) {
  if (path.find('\0') != std::string::npos)
    throw Error(ErrorCode::invalid_argument,
                what + " contains a NUL character: " + py::repr(py::str(path)).cast<std::string>() +
                    "; a path cannot hold one");
}

std::string path_arg(const py::handle& value, const std::string& what) {
  py::object path = py::reinterpret_borrow<py::object>(value);
  if (!py::isinstance<py::str>(path)) {
    // os.fspath() of an os.PathLike; bytes paths (and PathLikes giving bytes) are refused.
    PyObject* fs = py::isinstance<py::bytes>(path) ? nullptr : PyOS_FSPath(path.ptr());
    if (fs == nullptr) PyErr_Clear();
    path = py::reinterpret_steal<py::object>(fs);
    if (!path || !py::isinstance<py::str>(path))
      throw py::type_error(what + " must be str or os.PathLike, not " + type_name(value));
  }
  auto text = path.cast<std::string>();
  require_no_nul(text, what);
  return text;
}

namespace {

uint64_t non_negative(const py::handle& value, const char* name) {
  const int64_t v = int_arg(value, std::string("option ") + name);
  if (v < 0)
    throw Error(ErrorCode::invalid_argument,
                std::string("option ") + name + " must be >= 0, got " + std::to_string(v));
  return static_cast<uint64_t>(v);
}

// None = unset (the kernel's choice); an int, whose sign the C++ init() checks.
std::optional<int> host_numa_node_arg(const py::handle& value) {
  if (value.is_none()) return std::nullopt;
  const int64_t node = int_arg(value, "option host_numa_node");
  if (node < INT32_MIN || node > INT32_MAX)
    throw Error(ErrorCode::invalid_argument,
                "option host_numa_node is out of range: " + std::to_string(node));
  return static_cast<int>(node);
}

// One Worker() keyword's value into its WorkerOptions field, by the field's type: counts
// are ints >= 0, plugin_path a path, config a dict of str, host_numa_node an int or None.
void assign(uint64_t& f, const char* key, const py::handle& v) { f = non_negative(v, key); }
void assign(std::optional<uint64_t>& f, const char* key, const py::handle& v) {
  f = non_negative(v, key);
}
void assign(std::string& f, const char*, const py::handle& v) {
  f = path_arg(v, "Worker option plugin_path");  // the one str option
}
void assign(BackendConfig& f, const char*, const py::handle& v) { f = backend_config(v); }
void assign(std::optional<int>& f, const char*, const py::handle& v) { f = host_numa_node_arg(v); }

// Worker()'s keywords, from PINSTAGE_WORKER_OPTION_FIELDS in its order: "a, b, ...".
std::string worker_option_keys() {
  std::string keys;
#define PINSTAGE_PY_WORKER_KEY_(type, name, value, doc) \
  keys += (keys.empty() ? "" : ", ") + std::string(#name);
  PINSTAGE_WORKER_OPTION_FIELDS(PINSTAGE_PY_WORKER_KEY_)
#undef PINSTAGE_PY_WORKER_KEY_
  return keys;
}

// "options: a (int), b (str), ...": each keyword with the type its doc starts with.
std::string worker_options_doc() {
  std::string out;
#define PINSTAGE_PY_WORKER_DOC_(type, name, value, doc)                 \
  out += std::string(out.empty() ? "options: " : ", ") + #name + " (" + \
         std::string(doc).substr(0, std::string_view(doc).find(':')) + ")";
  PINSTAGE_WORKER_OPTION_FIELDS(PINSTAGE_PY_WORKER_DOC_)
#undef PINSTAGE_PY_WORKER_DOC_
  return out + ".";
}

WorkerOptions parse_options(const py::kwargs& kwargs) {
  WorkerOptions options;
  for (auto item : kwargs) {
    const auto key = item.first.cast<std::string>();
    bool known = false;
#define PINSTAGE_PY_WORKER_SET_(type, name, value, doc) \
  if (!known && key == #name) {                         \
    assign(options.name, #name, item.second);           \
    known = true;                                       \
  }
    PINSTAGE_WORKER_OPTION_FIELDS(PINSTAGE_PY_WORKER_SET_)
#undef PINSTAGE_PY_WORKER_SET_
    if (!known)
      throw py::type_error("Worker() got an unexpected option '" + key +
                           "' (options: " + worker_option_keys() + ")");
  }
  return options;
}

// Holds the GIL: the C++ init() must not race with any other call on the same worker.
void init_worker(PyWorker& w) { w.worker.init(w.backend_name, w.device_id, w.options); }

// Waits (GIL released between looks, so other threads can drop their views) until no view
// or busy call is left, or `timeout` seconds passed (negative: no limit).
void wait_for_views(PyWorker& w, double timeout) {
  using clock = std::chrono::steady_clock;
  const auto start = clock::now();
  py::module_ gc = py::module_::import("gc");
  for (;;) {
    int64_t holders = 0, views = 0;
    w.count_views(&holders, &views);
    if (views == 0 && w.busy == 0 && w.pending_copies == 0) return;
    gc.attr("collect")();
    w.count_views(&holders, &views);
    if (views == 0 && w.busy == 0 && w.pending_copies == 0) return;
    if (timeout >= 0 && std::chrono::duration<double>(clock::now() - start).count() >= timeout)
      return;  // require_no_views then raises, naming the holders
    GilReleased nogil;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

void finalize_worker(PyWorker& w, bool wait, const py::object& timeout) {
  if (!w.worker.initialized()) {  // never initialized, or finalized: nothing to wait for
    w.worker.finalize();
    return;
  }
  double limit = -1;
  if (!timeout.is_none()) {
    if (!py::isinstance<py::float_>(timeout) && !PyIndex_Check(timeout.ptr()))
      throw py::type_error("Worker.finalize: timeout must be a number of seconds or None, got " +
                           type_name(timeout));
    limit = timeout.cast<double>();
    if (!(limit >= 0))
      throw Error(ErrorCode::invalid_argument,
                  "Worker.finalize: timeout must be >= 0 seconds, got " +
                      py::repr(timeout).cast<std::string>());
  }
  if (wait) wait_for_views(w, limit);
  w.require_no_views("finalize the worker");
  // Buffers without views are released one by one (so they read as closed), then the
  // worker reclaims whatever else it handed out.
  std::vector<PyBuffer*> open(w.buffers.begin(), w.buffers.end());
  for (PyBuffer* buffer : open) buffer->close();
  for (auto* binder : w.binders) binder->reset();
  for (auto* binder : w.resident_binders) binder->reset();
  w.copy_stream.reset();  // no copy is pending on it (require_no_views)
  GilReleased nogil;
  w.worker.finalize();
}

}  // namespace

// True when max_version asks for DLPack >= 1.0 (a (major, minor) pair; None: no).
bool wants_versioned(const py::object& max_version) {
  if (max_version.is_none()) return false;
  if (!py::isinstance<py::tuple>(max_version) || py::len(max_version) != 2)
    throw py::type_error("__dlpack__: max_version must be a (major, minor) tuple or None, got " +
                         py::repr(max_version).cast<std::string>());
  auto t = max_version.cast<py::tuple>();
  return int_arg(t[0], "__dlpack__: max_version major") >= 1;
}

namespace {

// A DLPack device argument: a pair whose items have __index__ (ints or an IntEnum such as
// the array API's DLDeviceType), or Enums whose .value is an int.
std::pair<int64_t, int64_t> device_arg(const py::object& value) {
  auto item = [](py::handle v, const char* what) {
    py::object x = py::reinterpret_borrow<py::object>(v);
    if (!PyIndex_Check(x.ptr()) && py::hasattr(x, "value")) x = x.attr("value");
    return int_arg(x, std::string("__dlpack__: dl_device ") + what);
  };
  if (!py::isinstance<py::sequence>(value) || py::isinstance<py::str>(value) || py::len(value) != 2)
    throw py::type_error(
        "__dlpack__: dl_device must be a (device_type, device_id) pair, e.g. (1, 0), got " +
        py::repr(value).cast<std::string>());
  auto seq = value.cast<py::sequence>();
  return {item(seq[0], "device_type"), item(seq[1], "device_id")};
}

// The DLPack device to export `b` as, for the consumer's dl_device (None: kDLCPU).
DLDevice export_device(const PyBuffer& b, const py::object& dl_device) {
  if (dl_device.is_none()) return DLDevice{kDLCPU, 0};
  const auto [type, id] = device_arg(dl_device);
  const auto& caps = b.worker->worker.capabilities();
  const bool cuda_host = !caps.device_memory_is_host && caps.pinned_is_page_locked;
  if (type != kDLCPU && !(type == kDLCUDAHost && cuda_host))
    throw py::buffer_error("cannot export a PinnedHostBuffer of backend '" +
                           b.worker->worker.backend().name + "' to DLPack device type " +
                           std::to_string(type) +
                           " (kDLCPU = 1 always; kDLCUDAHost = 3 for the cuda backend)");
  if (id != 0)
    throw py::buffer_error("cannot export a PinnedHostBuffer to DLPack device (" +
                           std::to_string(type) + ", " + std::to_string(id) +
                           "): host memory has device id 0 only");
  return DLDevice{static_cast<int32_t>(type), 0};
}

py::capsule buffer_dlpack(py::object self, const py::object& stream, const py::object& max_version,
                          const py::object& dl_device, const py::object& copy) {
  (void)stream;  // host memory: nothing is queued, so no stream to order against
  auto& b = self.cast<PyBuffer&>();
  b.require_open("__dlpack__");
  DLPackRequest request;
  request.versioned = wants_versioned(max_version);
  if (!copy.is_none()) {
    if (!py::isinstance<py::bool_>(copy))
      throw py::type_error("__dlpack__: copy must be True, False or None, got " + type_name(copy));
    request.copy = copy.cast<bool>();
  }
  const DLDevice device = export_device(b, dl_device);
  return export_dlpack(self, &b, b.buffer.data(), DLDataType{kDLUInt, 8, 1},
                       {static_cast<int64_t>(b.nbytes)}, device, request);
}

// Installs the buffer slots before the type is readied (so Python 3.12+ derives
// __buffer__ from them); pybind11's own slots only serve def_buffer().
void buffer_type_setup(PyHeapTypeObject* heap) {
  heap->as_buffer.bf_getbuffer = &get_buffer;
  heap->as_buffer.bf_releasebuffer = &release_buffer;
  heap->ht_type.tp_as_buffer = &heap->as_buffer;
}

py::object alloc_pinned(py::object self, const py::object& nbytes) {
  auto& w = self.cast<PyWorker&>();
  const int64_t n = int_arg(nbytes, "alloc_pinned_host: nbytes");
  if (n < 1)
    throw Error(ErrorCode::invalid_argument,
                "alloc_pinned_host: nbytes must be >= 1, got " + std::to_string(n));
  PinnedHostBuffer buffer;
  {
    // Busy: finalize() refuses until the buffer is registered, so it can never reclaim
    // memory that is about to become a PinnedHostBuffer.
    Busy busy(&w);
    GilReleased nogil;  // pre-faulting and locking take time
    buffer = w.worker.alloc_pinned_host(static_cast<size_t>(n));
  }
  return py::cast(std::make_unique<PyBuffer>(self, &w, std::move(buffer)));
}

const char* state_name(const PyWorker& w) {
  return w.worker.initialized() ? "initialized" : w.finalized() ? "finalized" : "not initialized";
}

void bind_info(py::module_& m) {
  def_record(
      py::class_<Capabilities>(m, "Capabilities", "What the worker's backend can do."),
      field("pinned_is_page_locked", &Capabilities::pinned_is_page_locked,
            "bool: the backend's pinned host memory is page-locked."),
      field("async_copy", &Capabilities::async_copy, "bool: copies can overlap with host work."),
      field("execute", &Capabilities::execute,
            "bool: the backend runs host callables between upload and download."),
      field("device_memory_is_host", &Capabilities::device_memory_is_host,
            "bool: device memory is host RAM (sim)."));
  def_record(
      py::class_<DeviceInfo>(m, "DeviceInfo", "One device as its backend reports it."),
      field("id", &DeviceInfo::id, "int: the device id (0..n-1)."),
      field("name", &DeviceInfo::name, "str: 'sim device 1', 'NVIDIA H200'."),
      field("memory_bytes", &DeviceInfo::memory_bytes,
            "int: the device's memory (sim: its capacity); 0 = unknown."),
      field("pci_bus_id", &DeviceInfo::pci_bus_id, "str: '0000:3b:00.0'; '' where there is none."),
      field("numa_node", &DeviceInfo::numa_node,
            "int: the host NUMA node nearest the device; -1 = unknown."),
      field("usable", &DeviceInfo::usable, "bool: a worker can use it now."),
      field("reason", &DeviceInfo::reason, "str: why not usable; '' when usable."));
  def_record(
      py::class_<BackendDescription>(
          m, "BackendDescription",
          "A backend as its pinstage_add_backend call describes it (docs/python.md)."),
      field("name", &BackendDescription::name,
            "str: 'cuda': Worker(backend=) and the device= spelling ('cuda:1')."),
      field("dlpack_device_type", &BackendDescription::dlpack_device_type,
            "int: DLPack's device type of its device memory (1 kDLCPU, 2 kDLCUDA, 12 "
            "kDLExtDev)."),
      field("torch_device", &BackendDescription::torch_device,
            "str: the torch.device type of a tensor over that memory ('cpu', 'cuda'); '' "
            "when torch cannot import it."),
      field("plugin_path", &BackendDescription::plugin_path, "str: the plugin it describes."),
      field("test_only", &BackendDescription::test_only,
            "bool: a backend of the tests (twin), listed only under PINSTAGE_TEST_BACKENDS=on."));
  m.def(
      "backends", [] { return listed_backends(); },
      function_doc("backends() -> list[BackendDescription]",
                   "Every backend built here, as it describes itself, sorted by name; the "
                   "tests' backends only under PINSTAGE_TEST_BACKENDS=on, and one whose "
                   "description is malformed is left out with a warning."));
  m.def(
      "devices",
      [](const std::string& backend, const py::kwargs& kwargs) {
        const WorkerOptions options = parse_options(kwargs);
        GilReleased nogil;  // a vendor runtime may take a while to count its devices
        return list_devices(backend, options);
      },
      py::arg("backend") = "sim",
      function_doc("devices(backend: str = 'sim', **options: Any) -> list[DeviceInfo]",
                   "Every device the backend sees, without creating a context; options "
                   "as Worker's (sim reads config={'devices': ..., 'numa_nodes': ...})."));
  py::class_<WorkerStats> stats(m, "WorkerStats", "Outstanding allocations of a worker.");
  PINSTAGE_PY_DEF_FIELDS(stats, PINSTAGE_WORKER_STATS_FIELDS);
  def_field_repr(stats, {PINSTAGE_PY_FIELD_NAMES(PINSTAGE_WORKER_STATS_FIELDS)});
}

void bind_worker_lifetime(py::class_<PyWorker>& c) {
  c.def(py::init([](const std::string& level, const std::string& backend,
                    const py::object& device_id, bool initialize, const py::kwargs& kwargs) {
          const int64_t id = int_arg(device_id, "Worker: device_id");
          // Negative ids reach the C++ check ("device id must be >= 0").
          if (id < INT32_MIN || id > INT32_MAX)
            throw Error(ErrorCode::invalid_argument,
                        "Worker: device id must be in [0, 2**31 - 1], got " + std::to_string(id));
          auto w = std::make_unique<PyWorker>(parse_worker_level(level), backend,
                                              static_cast<int>(id), parse_options(kwargs));
          if (initialize) init_worker(*w);
          return w;
        }),
        py::arg("level") = "chip", py::arg("backend") = "sim", py::arg("device_id") = 0,
        py::kw_only(), py::arg("initialize") = true,
        method_doc("__init__(level: str = 'chip', backend: str = 'sim', device_id: int = 0, "
                   "*, initialize: bool = True, **options: Any) -> None",
                   "One device through a backend plugin. " + worker_options_doc()))
      .def("init", &init_worker,
           method_doc("init() -> None", "Loads the plugin and creates the context."))
      .def("finalize", &finalize_worker, py::arg("wait") = false, py::arg("timeout") = py::none(),
           method_doc("finalize(wait: bool = False, timeout: float | None = None) -> None",
                      "Terminal and idempotent. BufferError naming the holders while views "
                      "of the worker's pinned memory exist; with wait=True first waits "
                      "(collecting garbage) for them to go, up to timeout seconds (None: no "
                      "limit)."))
      .def(
          "__enter__",
          [](py::object self) {
            auto& w = self.cast<PyWorker&>();
            if (!w.worker.initialized()) init_worker(w);  // Error(finalized) if it was
            return self;
          },
          method_doc("__enter__() -> Worker", "Initializes the worker if it is not yet."))
      .def(
          "__exit__",
          [](PyWorker& w, py::handle exc_type, py::handle, py::handle) {
            // With an exception already on its way, leave a worker whose memory is still
            // viewed alone (it finalizes when its last reference goes) rather than hide
            // that exception behind a BufferError.
            int64_t holders = 0, views = 0;
            w.count_views(&holders, &views);
            if (!exc_type.is_none() && (views > 0 || w.busy > 0 || w.pending_copies > 0))
              return false;
            finalize_worker(w, false, py::none());
            return false;
          },
          py::arg("exc_type"), py::arg("exc"), py::arg("tb"),
          method_doc("__exit__(exc_type: Any, exc: Any, tb: Any) -> bool",
                     "finalize(); with an exception on its way and views still alive, "
                     "leaves the worker to finalize when its last reference goes."));
}

namespace {

// The Worker's memory figures, pinned allocation and fault injection.
void def_worker_memory(py::class_<PyWorker>& c) {
  c.def(
       "stats", [](const PyWorker& w) { return w.worker.stats(); },
       method_doc("stats() -> WorkerStats", "Outstanding allocations."))
      .def(
          "host_memory_stats",
          [](const PyWorker& w) {
            return fields_dict(report_fields(w.worker.host_memory_stats()));
          },
          method_doc("host_memory_stats() -> dict[str, int | float]",
                     "The pinned memory pool's figures, keyed as torch's "
                     "host_memory_stats() where it has the figure (docs/worker.md)."))
      .def(
          "empty_cache", [](PyWorker& w) { return w.worker.empty_cache(); },
          method_doc("empty_cache() -> int",
                     "Returns every wholly free cached pinned segment to the OS; the bytes "
                     "returned."))
      .def(
          "is_pinned_host",
          [](const PyWorker& w, const py::object& address, const py::object& nbytes) {
            const auto at = static_cast<uintptr_t>(int_arg(address, "is_pinned_host: address"));
            const auto n = static_cast<size_t>(int_arg(nbytes, "is_pinned_host: nbytes"));
            return w.worker.is_pinned_host(reinterpret_cast<const void*>(at), n);
          },
          py::arg("address"), py::arg("nbytes"),
          method_doc("is_pinned_host(address: int, nbytes: int) -> bool",
                     "True when [address, address + nbytes) is this worker's pinned memory: "
                     "a live pinned buffer, or a map-mode load's file mapping pinned in place "
                     "(the table copies ask)."))
      .def_property_readonly(
          "live_views",
          [](const PyWorker& w) {
            int64_t holders = 0, views = 0;
            w.count_views(&holders, &views);
            return views;
          },
          "int: views of the worker's pinned memory still alive (finalize refuses while "
          "any are).")
      .def_property_readonly(
          "open_buffers", [](const PyWorker& w) { return w.buffers.size(); },
          "int: PinnedHostBuffers of this worker not yet closed.")
      .def_readonly("busy_calls", &PyWorker::busy,
                    "int: calls running without the GIL on this worker's memory.")
      .def("alloc_pinned_host", &alloc_pinned, py::arg("nbytes"),
           method_doc("alloc_pinned_host(nbytes: int) -> PinnedHostBuffer",
                      "A new PinnedHostBuffer of nbytes (>= 1) bytes; the GIL is released "
                      "while it pins."))
      .def(
          "inject_fault",
          [](PyWorker& w, const py::object& kind, const py::object& nth) {
            const int64_t n = int_arg(nth, "inject_fault: nth");
            if (n < 1)
              throw Error(ErrorCode::invalid_argument,
                          "inject_fault: nth must be >= 1, got " + std::to_string(n));
            w.worker.inject_fault(parse_fault_kind(str_arg(kind, "inject_fault: kind")),
                                  static_cast<uint64_t>(n));
          },
          py::arg("kind"), py::arg("nth") = 1,
          method_doc("inject_fault(kind: str, nth: int = 1) -> None",
                     "Tests: the nth next backend call of kind fails."))
      .def("__repr__", [](const PyWorker& w) {
        return std::string("<pinstage.Worker level=") + worker_level_name(w.worker.level()) +
               " backend=" + w.backend_name + " device_id=" + std::to_string(w.device_id) + " " +
               state_name(w) + ">";
      });
}

}  // namespace

void bind_worker_class(py::class_<PyWorker>& c) {
  bind_worker_lifetime(c);
  c.def_property_readonly(
       "initialized", [](const PyWorker& w) { return w.worker.initialized(); },
       "bool: init() succeeded and finalize() has not run.")
      .def_property_readonly("finalized", &PyWorker::finalized,
                             "bool: finalize() ran; the worker cannot be used again.")
      .def_property_readonly(
          "level", [](const PyWorker& w) { return worker_level_name(w.worker.level()); },
          "str: 'chip': the worker owns one device (the node level is a WorkerGroup).")
      .def_property_readonly(
          "backend",
          [](const PyWorker& w) {
            return w.worker.initialized() ? w.worker.backend().name : w.backend_name;
          },
          "str: the backend's name.")
      .def_property_readonly(
          "backend_path", [](const PyWorker& w) { return w.worker.backend().path; },
          "str: the plugin file loaded ('' before init).")
      .def_readonly("device_id", &PyWorker::device_id, "int: the device.")
      .def_property_readonly(
          "capabilities", [](const PyWorker& w) { return w.worker.capabilities(); },
          "Capabilities: what the backend can do.")
      .def_property_readonly(
          "host_numa_node", [](const PyWorker& w) { return w.worker.host_numa_node(); },
          "int: the NUMA node its pinned memory is placed on; -1 = none (not asked, or "
          "the host lacks the node).")
      .def(
          "device_info", [](const PyWorker& w) { return w.worker.device_info(); },
          method_doc("device_info() -> DeviceInfo",
                     "This worker's device, as devices() "
                     "reports it."));
  def_worker_memory(c);
}

void bind_buffer_class(py::class_<PyBuffer>& c) {
  def_memory_properties(c, "memory");
  c.def(
       "__len__", [](const PyBuffer& b) { return b.nbytes; },
       method_doc("__len__() -> int", "nbytes."))
      .def_readonly("live_views", &PyBuffer::views,
                    "int: views of the buffer still alive (close() refuses while any are).")
      .def("close", &PyBuffer::close,
           method_doc("close() -> None",
                      "Releases the memory now; BufferError while views "
                      "exist."))
      .def(
          "__enter__", [](py::object self) { return self; },
          method_doc("__enter__() -> PinnedHostBuffer"))
      .def(
          "__exit__",
          [](PyBuffer& b, py::handle exc_type, py::handle, py::handle) {
            if (!exc_type.is_none() && b.views > 0) return false;
            b.close();
            return false;
          },
          py::arg("exc_type"), py::arg("exc"), py::arg("tb"),
          method_doc("__exit__(exc_type: Any, exc: Any, tb: Any) -> bool",
                     "close(); with an exception on its way and views still alive, leaves "
                     "the buffer open."))
      .def(
          "__dlpack_device__",
          [](const PyBuffer& b) {
            b.require_open("__dlpack_device__");
            return py::make_tuple(static_cast<int>(kDLCPU), 0);
          },
          method_doc("__dlpack_device__() -> tuple[int, int]", "(kDLCPU, 0): host memory."))
      .def("__repr__", [](const PyBuffer& b) {
        return std::string("<pinstage.PinnedHostBuffer nbytes=") + std::to_string(b.nbytes) +
               (b.open() ? "" : " closed") + " views=" + std::to_string(b.views) + ">";
      });
  def_dlpack(c, &buffer_dlpack,
             "A DLPack capsule of the bytes: 'dltensor_versioned' (DLPack 1.0) when "
             "max_version >= (1, 0), else 'dltensor'; copy=True gives a private copy.");
}

}  // namespace

void bind_worker(py::module_& m) {
  bind_info(m);
  // Both classes first, then their methods: docstrings then name the Python types.
  py::class_<PyWorker> worker(m, "Worker",
                              "One device through a backend plugin, and its pinned memory.");
  py::class_<PyBuffer> buffer(m, "PinnedHostBuffer", py::is_final(),
                              py::custom_type_setup(&buffer_type_setup),
                              "Pinned host memory of a Worker: writable 1-D bytes through the "
                              "buffer protocol and DLPack.");
  bind_worker_class(worker);
  bind_buffer_class(buffer);

  // The Worker whose open buffer holds [address, address + nbytes), else the live Worker
  // whose table of pinned ranges does (Worker::is_pinned_host: a map-mode tensor's file
  // mapping), or None (internal: how is_pinned() and to_device tell pinned tensors apart).
  m.def(
      "_pinned_owner",
      [](uintptr_t address, uint64_t nbytes) -> py::object {
        const auto* at = reinterpret_cast<const void*>(address);
        if (PyBuffer* found = find_pinned(at, nbytes)) return found->worker_obj;
        for (PyWorker* w : live_workers())
          if (nbytes > 0 && w->worker.initialized() &&
              w->worker.is_pinned_host(at, static_cast<size_t>(nbytes)))
            return py::cast(w, py::return_value_policy::reference);
        return py::none();
      },
      py::arg("address"), py::arg("nbytes"),
      function_doc("_pinned_owner(address: int, nbytes: int) -> Worker | None"));

  m.def(
      "_set_gil_release_hook",
      [](const py::object& hook) {
        if (!hook.is_none() && !PyCallable_Check(hook.ptr()))
          throw py::type_error("_set_gil_release_hook: hook must be callable or None, got " +
                               type_name(hook));
        PyObject* old = installed_gil_release_hook;
        installed_gil_release_hook = hook.is_none() ? nullptr : hook.inc_ref().ptr();
        Py_XDECREF(old);
      },
      py::arg("hook"),
      function_doc("_set_gil_release_hook(hook: Callable[[], None] | None) -> None",
                   "Tests: hook() runs in each thread right after a pinstage call released "
                   "the GIL (GIL taken back for it), so a test can hold the call inside its "
                   "GIL-free window on a latch; None removes it."));

  m.def(
      "require_chip_worker",
      [](const py::object& w, const py::object& who) {
        require_chip_worker(as_worker(w, "require_chip_worker").worker,
                            str_arg(who, "require_chip_worker: who"));
      },
      py::arg("worker"), py::arg("who"),
      function_doc("require_chip_worker(worker: Worker, who: str) -> None",
                   "InvalidArgumentError unless worker is an initialized chip-level Worker."));
}

}  // namespace pinstage::python
