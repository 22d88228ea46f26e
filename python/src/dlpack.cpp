// DLPack export: every capsule (and, once consumed, every tensor made from it) is one live
// view of its holder until the deleter runs. See Note [Python view lifetime] in worker.cpp.
#include "common.h"

namespace pinstage::python {

namespace {

// What one export owns: a reference to the holder's Python object (so the memory and the
// worker stay alive) and the shape the DLTensor points at.
struct ExportContext {
  py::object owner;
  ViewHolder* holder;
  std::vector<int64_t> shape;
  DLManagedTensor managed{};
};

// Called by the consumer (any thread, GIL or not) or by the capsule when never consumed.
void delete_export(DLManagedTensor* self) {
  if (self == nullptr) return;
  auto* context = static_cast<ExportContext*>(self->manager_ctx);
  // At interpreter shutdown the process is about to release everything anyway: touching
  // Python objects then is unsafe, so the context is left behind.
  if (!interpreter_usable()) return;
  const PyGILState_STATE gil = PyGILState_Ensure();
  --context->holder->views;
  delete context;  // drops the owner reference, possibly releasing the buffer
  PyGILState_Release(gil);
}

// A capsule still named "dltensor" was never consumed: its tensor is still ours to delete.
void capsule_destructor(PyObject* capsule) {
  if (!PyCapsule_IsValid(capsule, kDLTensorCapsuleName)) return;
  PyObject *type, *value, *traceback;
  PyErr_Fetch(&type, &value, &traceback);
  auto* managed =
      static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule, kDLTensorCapsuleName));
  if (managed != nullptr && managed->deleter != nullptr) managed->deleter(managed);
  PyErr_Restore(type, value, traceback);
}

}  // namespace

py::capsule export_dlpack(py::object owner, ViewHolder* holder, void* data, DLDataType dtype,
                          std::vector<int64_t> shape, DLDevice device) {
  auto context = std::make_unique<ExportContext>();
  context->owner = std::move(owner);
  context->holder = holder;
  context->shape = std::move(shape);
  DLTensor& t = context->managed.dl_tensor;
  t.data = data;
  t.device = device;
  t.ndim = static_cast<int32_t>(context->shape.size());
  t.dtype = dtype;
  t.shape = context->shape.empty() ? nullptr : context->shape.data();
  t.strides = nullptr;  // compact row-major
  t.byte_offset = 0;
  context->managed.manager_ctx = context.get();
  context->managed.deleter = &delete_export;
  PyObject* capsule = PyCapsule_New(&context->managed, kDLTensorCapsuleName, &capsule_destructor);
  if (capsule == nullptr) throw py::error_already_set();
  ++holder->views;
  context.release();  // owned by the capsule, then by whoever consumes it
  return py::reinterpret_steal<py::capsule>(capsule);
}

}  // namespace pinstage::python
