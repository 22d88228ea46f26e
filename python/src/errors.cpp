// pinstage::Error -> pinstage.Error (a RuntimeError) carrying .code, the stable
// error_code_name string; invalid_argument -> pinstage.InvalidArgumentError, which is
// also a ValueError (pinstage::ReadOnlyError -> its subclass pinstage.ReadOnlyError);
// pinstage::BindError -> pinstage.BindError with .phase and .tensor.
#include "common.h"

#include "pinstage/bind.h"

namespace pinstage::python {

namespace {

PyObject* g_error = nullptr;
PyObject* g_invalid_argument = nullptr;
PyObject* g_bind_error = nullptr;
PyObject* g_read_only = nullptr;

PyObject* new_exception(const char* name, const char* doc, PyObject* bases,
                        const char* code_default) {
  py::dict attrs;
  attrs["__module__"] = "pinstage";
  attrs["code"] = code_default ? py::object(py::str(code_default)) : py::object(py::none());
  std::string qualified = std::string("pinstage.") + name;
  PyObject* type = PyErr_NewExceptionWithDoc(qualified.c_str(), doc, bases, attrs.ptr());
  if (type == nullptr) throw py::error_already_set();
  return type;
}

// Raises `type(message)` with .code set on the instance, plus any extra attributes.
void raise(PyObject* type, const Error& e, const py::dict& extra = py::dict()) {
  PyObject* instance = PyObject_CallFunction(type, "s", e.what());
  if (instance == nullptr) return;  // the constructor's own error stands
  PyObject_SetAttrString(instance, "code", py::str(error_code_name(e.code())).ptr());
  for (auto item : extra) PyObject_SetAttr(instance, item.first.ptr(), item.second.ptr());
  PyErr_SetObject(type, instance);
  Py_DECREF(instance);
}

}  // namespace

void register_errors(py::module_& m) {
  g_error =
      new_exception("Error",
                    "A pinstage operation failed. .code names why (pinstage.ErrorCode names, e.g. "
                    "'out_of_memory'); the message says what to do.",
                    PyExc_RuntimeError, nullptr);
  py::tuple invalid_bases = py::make_tuple(py::handle(g_error), py::handle(PyExc_ValueError));
  g_invalid_argument = new_exception(
      "InvalidArgumentError",
      "Bad input from the caller (code 'invalid_argument'): both a pinstage.Error and a "
      "ValueError.",
      invalid_bases.ptr(), "invalid_argument");
  g_bind_error = new_exception(
      "BindError",
      "A bind failed: .phase names the step ('device_alloc', 'upload', 'verify', 'execute', "
      "'download', 'release') and .tensor the argument ('' when the step concerns none).",
      g_error, nullptr);
  g_read_only = new_exception(
      "ReadOnlyError",
      "A write to read-only memory refused: a map-mode tensor (a view of a checkpoint's page "
      "cache) written in place, given as out=, or as a TaskArgs 'out'/'inout'. clone() it "
      "for a writable copy, or load with mode='copy'.",
      g_invalid_argument, "invalid_argument");
  PyObject_SetAttrString(g_bind_error, "phase", Py_None);
  PyObject_SetAttrString(g_bind_error, "tensor", Py_None);
  m.attr("Error") = py::handle(g_error);
  m.attr("InvalidArgumentError") = py::handle(g_invalid_argument);
  m.attr("BindError") = py::handle(g_bind_error);
  m.attr("ReadOnlyError") = py::handle(g_read_only);

  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const BindError& e) {
      py::dict extra;
      extra["phase"] = bind_phase_name(e.phase());
      extra["tensor"] = e.tensor();
      raise(g_bind_error, e, extra);
    } catch (const ReadOnlyError& e) {
      raise(g_read_only, e);
    } catch (const Error& e) {
      raise(e.code() == ErrorCode::invalid_argument ? g_invalid_argument : g_error, e);
    }
  });
}

}  // namespace pinstage::python
