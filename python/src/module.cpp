// The _pinstage extension: the C++ runtime as the pinstage Python package sees it. The
// public API is re-exported (and documented) by python/pinstage/__init__.py.
#include <pybind11/stl.h>

#include <map>
#include <string>
#include <vector>

#include "common.h"
#include "pinstage/backend/pin_mode.h"
#include "pinstage/bind.h"
#include "pinstage/checkpoint.h"
#include "pinstage/scene.h"
#include "pinstage/version.h"
#include "pinstage/worker.h"

namespace pinstage::python {
void bind_checkpoint(py::module_& m);  // checkpoint.cpp: safe_open, load_file
void bind_load_tp(py::module_& m);     // load_tp.cpp: TpPlan, tp_part, load_tp
void bind_cache(py::module_& m);       // cache.cpp: the restart cache (pinstage.cache)

namespace {

// Every field list of the public headers by its macro's name: its entries' names in order
// (a LoadReport RATE's too), so tests/python/test_py_fields.py can hold each list's
// struct, Python surface, .pyi and docs table to the list itself.
std::map<std::string, std::vector<std::string>> field_lists() {
#define PINSTAGE_NAME4_(type, name, value, doc) #name,
#define PINSTAGE_NAME5_(type, name, value, key, doc) #name,
#define PINSTAGE_RATE_NAME_(name, seconds, doc) #name,
#define PINSTAGE_COMPUTED_NAME_(name, doc) #name,
#define PINSTAGE_PIN_KEY_(type, member, value, key, min, max, shift, doc) key,  // its keys
  return {
      {"PINSTAGE_WORKER_OPTION_FIELDS", {PINSTAGE_WORKER_OPTION_FIELDS(PINSTAGE_NAME4_)}},
      {"PINSTAGE_WORKER_STATS_FIELDS", {PINSTAGE_WORKER_STATS_FIELDS(PINSTAGE_NAME4_)}},
      {"PINSTAGE_HOST_MEMORY_STATS_FIELDS", {PINSTAGE_HOST_MEMORY_STATS_FIELDS(PINSTAGE_NAME5_)}},
      {"PINSTAGE_BIND_OPTION_FIELDS", {PINSTAGE_BIND_OPTION_FIELDS(PINSTAGE_NAME4_)}},
      {"PINSTAGE_BIND_REPORT_FIELDS",
       {PINSTAGE_BIND_REPORT_FIELDS(PINSTAGE_NAME4_, PINSTAGE_COMPUTED_NAME_)}},
      {"PINSTAGE_TENSOR_BIND_REPORT_FIELDS", {PINSTAGE_TENSOR_BIND_REPORT_FIELDS(PINSTAGE_NAME4_)}},
      {"PINSTAGE_GROUP_BIND_REPORT_FIELDS", {PINSTAGE_GROUP_BIND_REPORT_FIELDS(PINSTAGE_NAME4_)}},
      {"PINSTAGE_TENSOR_COMPARISON_FIELDS", {PINSTAGE_TENSOR_COMPARISON_FIELDS(PINSTAGE_NAME4_)}},
      {"PINSTAGE_COMPARISON_FIELDS", {PINSTAGE_COMPARISON_FIELDS(PINSTAGE_NAME4_)}},
      {"PINSTAGE_SCENE_ROUND_FIELDS", {PINSTAGE_SCENE_ROUND_FIELDS(PINSTAGE_NAME4_)}},
      {"PINSTAGE_SCENE_REPORT_FIELDS", {PINSTAGE_SCENE_REPORT_FIELDS(PINSTAGE_NAME4_)}},
      {"PINSTAGE_CHECKPOINT_LOAD_OPTION_FIELDS",
       {PINSTAGE_CHECKPOINT_LOAD_OPTION_FIELDS(PINSTAGE_NAME4_)}},
      {"PINSTAGE_LOAD_REPORT_FIELDS",
       {PINSTAGE_LOAD_REPORT_FIELDS(PINSTAGE_NAME4_, PINSTAGE_RATE_NAME_)}},
      {"PINSTAGE_LOAD_REPORT_FIRST_TOUCH_FIELDS",
       {PINSTAGE_LOAD_REPORT_FIRST_TOUCH_FIELDS(PINSTAGE_NAME4_)}},
      {"PINSTAGE_PIN_CONFIG_FIELDS", {PINSTAGE_PIN_CONFIG_FIELDS(PINSTAGE_PIN_KEY_)}},
  };
#undef PINSTAGE_NAME4_
#undef PINSTAGE_NAME5_
#undef PINSTAGE_RATE_NAME_
#undef PINSTAGE_COMPUTED_NAME_
#undef PINSTAGE_PIN_KEY_
}

}  // namespace
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
  m.def("_field_lists", &field_lists,
        function_doc("_field_lists() -> dict[str, list[str]]",
                     "Every field list of the C++ headers: its names in order (for the "
                     "tests that hold the structs, bindings, stubs and docs to them)."));
}
