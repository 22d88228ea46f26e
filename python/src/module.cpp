// The _pinstage extension: the C++ runtime as the pinstage Python package sees it. The
// public API is re-exported (and documented) by python/pinstage/__init__.py.
#include <pybind11/stl.h>

#include "common.h"

PYBIND11_MODULE(_pinstage, m) {
  using namespace pinstage::python;
  m.doc() = "pinstage C++ runtime bindings (use the pinstage package, not this module)";
  register_errors(m);
  bind_worker(m);
  bind_tensors(m);
  m.def("error_code_names", [] {
    std::vector<std::string> names;
    for (int c = 0; c <= static_cast<int>(pinstage::ErrorCode::mismatch); ++c)
      names.emplace_back(pinstage::error_code_name(static_cast<pinstage::ErrorCode>(c)));
    return names;
  });
}
