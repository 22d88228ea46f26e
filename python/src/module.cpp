// The _pinstage extension: the C++ runtime as the pinstage Python package sees it. The
// public API is re-exported (and documented) by python/pinstage/__init__.py.
#include <pybind11/stl.h>

#include "common.h"
#include "pinstage/version.h"

namespace pinstage::python {
void bind_checkpoint(py::module_& m);  // checkpoint.cpp: safe_open, load_file
void bind_load_tp(py::module_& m);     // load_tp.cpp: TpPlan, tp_part, load_tp
void bind_cache(py::module_& m);       // cache.cpp: the restart cache (pinstage.cache)
}  // namespace pinstage::python

PYBIND11_MODULE(_pinstage, m) {
  using namespace pinstage::python;
  // Docstrings carry their own signatures (method_doc/function_doc in common.h).
  py::options options;
  options.disable_function_signatures();
  m.doc() = "pinstage C++ runtime bindings (use the pinstage package, not this module)";
  // The version of the libpinstage loaded (project(VERSION) of CMakeLists.txt).
  m.attr("__version__") = pinstage::version();
  register_errors(m);
  bind_lease(m);
  bind_worker(m);
  bind_device(m);
  bind_tensors(m);
  bind_checkpoint(m);
  bind_load_tp(m);
  bind_cache(m);
  bind_node(m);
  m.def(
      "error_code_names",
      [] {
        std::vector<std::string> names;
        for (int c = 0; c <= static_cast<int>(pinstage::ErrorCode::mismatch); ++c)
          names.emplace_back(pinstage::error_code_name(static_cast<pinstage::ErrorCode>(c)));
        return names;
      },
      function_doc("error_code_names() -> list[str]",
                   "Every Error.code value, in the C++ ErrorCode order."));
}
