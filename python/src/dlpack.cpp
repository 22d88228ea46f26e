// DLPack export and buffer-export leases: every capsule (and, once consumed, every tensor
// made from it) and every Lease is one live view of its holder until the deleter runs or
// the Lease dies. See Note [Python view lifetime] in worker.cpp.
#include <algorithm>
#include <cstring>
#include <map>
#include <sstream>

#include "common.h"

namespace pinstage::python {

// ---- Labels: the tensor names of live views ----

namespace {

// Touched only under the GIL (Lease and export contexts are made and deleted with it).
std::multimap<const ViewHolder*, std::string>& labels() {
  static auto* map = new std::multimap<const ViewHolder*, std::string>;  // never destroyed
  return *map;
}

void add_label(const ViewHolder* holder, const std::string& label) {
  if (!label.empty()) labels().emplace(holder, label);
}

void remove_label(const ViewHolder* holder, const std::string& label) {
  if (label.empty()) return;
  auto [begin, end] = labels().equal_range(holder);
  for (auto it = begin; it != end; ++it)
    if (it->second == label) {
      labels().erase(it);
      return;
    }
}

}  // namespace

std::vector<std::string> view_labels(const ViewHolder* holder) {
  std::vector<std::string> out;
  auto [begin, end] = labels().equal_range(holder);
  for (auto it = begin; it != end; ++it) out.push_back(it->second);
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

std::string describe_live_tensors(const ViewHolder* holder, const void* data, uint64_t nbytes,
                                  const std::string& name) {
  std::vector<std::string> names = view_labels(holder);
  if (!name.empty() && std::find(names.begin(), names.end(), name) == names.end())
    names.push_back(name);
  std::string shapes;  // from the torch tensors and NumPy arrays over the memory
  if (nbytes > 0 && interpreter_usable()) {
    try {
      shapes = py::module_::import("pinstage._views")
                   .attr("describe")(reinterpret_cast<uintptr_t>(data), nbytes)
                   .cast<std::string>();
    } catch (const std::exception&) {
      PyErr_Clear();  // the refusal is raised either way, with what is known
    }
  }
  std::ostringstream out;
  constexpr size_t kNamed = 5;  // a DeviceLoad's 201 live tensors: the first few, then a count
  const char* sep = names.size() > 1 ? "tensors " : "tensor ";
  for (size_t i = 0; i < names.size() && i < kNamed; ++i) {
    out << sep << "'" << names[i] << "'";
    sep = ", ";
  }
  if (names.size() > kNamed) out << " and " << names.size() - kNamed << " more";
  if (!shapes.empty()) out << (names.empty() ? shapes : " (" + shapes + ")");
  return out.str();
}

// ---- Lease ----

namespace {

// The holder's count of the leases `by` holds, if it keeps one.
int64_t* lease_count(ViewHolder* holder, LeaseHolder by) {
  switch (by) {
    case LeaseHolder::args:
      return &holder->args_views;
    case LeaseHolder::read:
      return &holder->read_views;
    case LeaseHolder::copy:
      return &holder->copy_views;
    case LeaseHolder::view:
      break;
  }
  return nullptr;
}

}  // namespace

Lease::Lease(py::object owner_, ViewHolder* holder_, LeaseHolder by_, std::string label_)
    : owner(std::move(owner_)), holder(holder_), by(by_), label(std::move(label_)) {
  ++holder->views;
  add_label(holder, label);
  if (int64_t* count = lease_count(holder, by)) ++*count;
}

// Runs under the GIL (pybind11's dealloc, or the read's frame); keeps it: a destructor
// never releases the GIL.
Lease::~Lease() {
  --holder->views;
  remove_label(holder, label);
  if (int64_t* count = lease_count(holder, by)) --*count;
}

py::object make_lease(py::object owner, ViewHolder* holder, LeaseHolder by, std::string label) {
  return py::cast(std::make_unique<Lease>(std::move(owner), holder, by, std::move(label)));
}

void bind_lease(py::module_& m) {
  py::class_<Lease>(m, "BufferExport",
                    "One counted view of a PinnedHostBuffer: the object a memoryview's .obj "
                    "(and torch.frombuffer) holds. The memory stays allocated while it lives.",
                    py::is_final())
      .def_readonly("buffer", &Lease::owner,
                    "The PinnedHostBuffer (or TaskArgs) whose memory this export views.")
      .def("__repr__", [](const Lease& l) {
        return "<pinstage.BufferExport of " + py::repr(l.owner).cast<std::string>() + ">";
      });
}

namespace {

// What one export owns: a reference to the holder's Python object (so the memory and the
// worker stay alive; none for a copy), the shape and strides the DLTensor points at, a
// copy's bytes, and one of the two managed-tensor layouts.
struct ExportContext {
  py::object owner;
  ViewHolder* holder = nullptr;  // null for a copy: no view counted
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;
  std::unique_ptr<uint8_t[]> copied;
  std::string label;  // the tensor's name, if known (view_labels)
  DLManagedTensor managed{};
  DLManagedTensorVersioned versioned{};
};

// Both deleters, called by the consumer (any thread, GIL or not) or by the capsule when
// never consumed.
void delete_context(ExportContext* context) {
  // At interpreter shutdown the process is about to release everything anyway: touching
  // Python objects then is unsafe, so the context is left behind.
  if (!interpreter_usable()) return;
  const PyGILState_STATE gil = PyGILState_Ensure();
  if (context->holder != nullptr) {
    --context->holder->views;
    remove_label(context->holder, context->label);
  }
  delete context;  // drops the owner reference, possibly releasing the buffer
  PyGILState_Release(gil);
}

void delete_export(DLManagedTensor* self) {
  if (self != nullptr) delete_context(static_cast<ExportContext*>(self->manager_ctx));
}

void delete_versioned_export(DLManagedTensorVersioned* self) {
  if (self != nullptr) delete_context(static_cast<ExportContext*>(self->manager_ctx));
}

// A capsule still under its original name was never consumed: its tensor is still ours.
void capsule_destructor(PyObject* capsule) {
  PyObject *type, *value, *traceback;
  PyErr_Fetch(&type, &value, &traceback);
  if (PyCapsule_IsValid(capsule, kDLTensorCapsuleName)) {
    auto* managed =
        static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule, kDLTensorCapsuleName));
    if (managed != nullptr && managed->deleter != nullptr) managed->deleter(managed);
  } else if (PyCapsule_IsValid(capsule, kDLTensorVersionedCapsuleName)) {
    auto* managed = static_cast<DLManagedTensorVersioned*>(
        PyCapsule_GetPointer(capsule, kDLTensorVersionedCapsuleName));
    if (managed != nullptr && managed->deleter != nullptr) managed->deleter(managed);
  }
  PyErr_Restore(type, value, traceback);
}

}  // namespace

uint64_t dl_itemsize(DLDataType dtype) {
  return (static_cast<uint64_t>(dtype.bits) * dtype.lanes + 7) / 8;
}

py::capsule export_dlpack(py::object owner, ViewHolder* holder, void* data, DLDataType dtype,
                          std::vector<int64_t> shape, DLDevice device, DLPackRequest request) {
  auto context = std::make_unique<ExportContext>();
  context->shape = std::move(shape);
  context->strides.assign(context->shape.size(), 1);  // row-major, in elements
  uint64_t count = 1;
  for (size_t i = context->shape.size(); i-- > 0;) {
    context->strides[i] = static_cast<int64_t>(count);
    count *= static_cast<uint64_t>(context->shape[i]);
  }
  if (request.copy) {
    const uint64_t bytes = count * dl_itemsize(dtype);
    context->copied.reset(new uint8_t[bytes == 0 ? 1 : bytes]);
    if (bytes > 0) std::memcpy(context->copied.get(), data, bytes);
    data = context->copied.get();
  } else {
    context->owner = std::move(owner);
    context->holder = holder;
    context->label = request.label;
  }
  DLTensor t{};
  t.data = data;
  t.device = device;
  t.ndim = static_cast<int32_t>(context->shape.size());
  t.dtype = dtype;
  t.shape = context->shape.empty() ? nullptr : context->shape.data();
  t.strides = context->strides.empty() ? nullptr : context->strides.data();
  t.byte_offset = 0;
  void* pointer = nullptr;
  const char* name = nullptr;
  if (request.versioned) {
    auto& v = context->versioned;
    v.version = {kDLPackMajorVersion, kDLPackMinorVersion};
    v.manager_ctx = context.get();
    v.deleter = &delete_versioned_export;
    v.flags = (request.copy ? kDLFlagIsCopied : 0) | (request.read_only ? kDLFlagReadOnly : 0);
    v.dl_tensor = t;
    pointer = &v;
    name = kDLTensorVersionedCapsuleName;
  } else {
    context->managed.dl_tensor = t;
    context->managed.manager_ctx = context.get();
    context->managed.deleter = &delete_export;
    pointer = &context->managed;
    name = kDLTensorCapsuleName;
  }
  PyObject* capsule = PyCapsule_New(pointer, name, &capsule_destructor);
  if (capsule == nullptr) throw py::error_already_set();
  if (context->holder != nullptr) {
    ++context->holder->views;
    add_label(context->holder, context->label);
  }
  context.release();  // owned by the capsule, then by whoever consumes it
  return py::reinterpret_steal<py::capsule>(capsule);
}

}  // namespace pinstage::python
