// BindOptions from Python keywords, generated from the one field list in bind.h
// (PINSTAGE_BIND_OPTION_FIELDS): pinstage.Binder(worker, **options) and
// qwen3.run_scene(..., bind={...}) both read their options here, so a field added to the
// list needs no Python change. Header-only: python/CMakeLists.txt lists its sources.
#pragma once

#include <climits>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>

#include "common.h"
#include "pinstage/bind.h"

namespace pinstage::python {

// The Python keyword of a BindOptions field: its C++ name, except execute_callable,
// which Python calls `execute` (as the CLI's --execute).
constexpr std::string_view bind_option_keyword(std::string_view field) {
  return field == "execute_callable" ? std::string_view("execute") : field;
}

namespace bind_options_detail {

[[noreturn]] inline void wrong_type(std::string_view key, const char* want, py::handle v) {
  throw py::type_error("Binder option " + std::string(key) + " must be " + want + ", got " +
                       py::type::of(v).attr("__name__").cast<std::string>());
}

// Anything with __index__ (int, numpy integers), as pybind11's int64_t parameters took.
inline int64_t as_int(std::string_view key, py::handle v) {
  if (py::isinstance<py::bool_>(v) || !PyIndex_Check(v.ptr())) wrong_type(key, "an int", v);
  return int_arg(v, "Binder option " + std::string(key));
}

inline std::string as_str(std::string_view key, py::handle v) {
  if (!py::isinstance<py::str>(v)) wrong_type(key, "a str", v);
  return v.cast<std::string>();
}

// One Python value into one field, by the field's type; errors name the option.
inline void assign(DeviceLayout& f, std::string_view key, py::handle v) {
  f = parse_device_layout(as_str(key, v));
}
inline void assign(UploadPath& f, std::string_view key, py::handle v) {
  f = parse_upload_path(as_str(key, v));
}
inline void assign(std::string& f, std::string_view key, py::handle v) {
  f = v.is_none() ? std::string() : as_str(key, v);  // None = unset, as the default
}
inline void assign(bool& f, std::string_view key, py::handle v) {
  try {
    f = v.cast<bool>();  // what a pybind11 bool parameter takes (True/False, numpy.bool_, ...)
  } catch (const py::cast_error&) {
    wrong_type(key, "a bool", v);
  }
}
inline void assign(size_t& f, std::string_view key, py::handle v) {
  const int64_t n = as_int(key, v);
  if (n < 0)
    throw Error(ErrorCode::invalid_argument,
                "Binder option " + std::string(key) + " must be >= 0, got " + std::to_string(n));
  f = static_cast<size_t>(n);
}
inline void assign(int& f, std::string_view key, py::handle v) {
  const int64_t n = as_int(key, v);
  if (n < 0 || n > INT_MAX)
    throw Error(ErrorCode::invalid_argument, "Binder option " + std::string(key) +
                                                 " must be in [0, " + std::to_string(INT_MAX) +
                                                 "], got " + std::to_string(n));
  f = static_cast<int>(n);
}

inline bool is_excluded(std::string_view key, std::initializer_list<std::string_view> excluded) {
  for (std::string_view e : excluded)
    if (key == e) return true;
  return false;
}

}  // namespace bind_options_detail

// The Python keywords of the options, in field order, less `excluded`: "layout, upload, ...".
inline std::string bind_option_keywords(std::initializer_list<std::string_view> excluded = {}) {
  std::string out;
#define PINSTAGE_PY_KEYWORD_(type, name, value, doc)                             \
  if (!bind_options_detail::is_excluded(bind_option_keyword(#name), excluded)) { \
    out += out.empty() ? "" : ", ";                                              \
    out += bind_option_keyword(#name);                                           \
  }
  PINSTAGE_BIND_OPTION_FIELDS(PINSTAGE_PY_KEYWORD_)
#undef PINSTAGE_PY_KEYWORD_
  return out;
}

// One line per option, "keyword: meaning", for docstrings.
inline std::string bind_options_doc() {
  std::string out;
#define PINSTAGE_PY_DOC_(type, name, value, doc) \
  out += "  " + std::string(bind_option_keyword(#name)) + ": " + doc + "\n";
  PINSTAGE_BIND_OPTION_FIELDS(PINSTAGE_PY_DOC_)
#undef PINSTAGE_PY_DOC_
  return out;
}

// What a key that is not an option raises: TypeError (a function's unexpected keyword)
// or InvalidArgumentError (a bad key in a dict of options).
enum class UnknownBindOption { type_error, invalid_argument };

// BindOptions from Python keywords: the C++ defaults, then every key of `kwargs` set by
// its field's type (str for the enums, None or str for execute, bool, int >= 0). A key
// that names no option, or one in `excluded` (options the caller sets itself), raises as
// `unknown` says, listing the valid keys; `who` starts that message. Values are checked
// here and again by validate() in the Binder.
inline BindOptions bind_options_from(const py::dict& kwargs, const char* who,
                                     UnknownBindOption unknown = UnknownBindOption::type_error,
                                     std::initializer_list<std::string_view> excluded = {}) {
  BindOptions options;
  for (auto item : kwargs) {
    const auto key = item.first.cast<std::string>();
    bool known = false;
#define PINSTAGE_PY_ASSIGN_(type, name, value, doc)              \
  if (!known && key == bind_option_keyword(#name) &&             \
      !bind_options_detail::is_excluded(key, excluded)) {        \
    bind_options_detail::assign(options.name, key, item.second); \
    known = true;                                                \
  }
    PINSTAGE_BIND_OPTION_FIELDS(PINSTAGE_PY_ASSIGN_)
#undef PINSTAGE_PY_ASSIGN_
    if (known) continue;
    const std::string message = std::string(who) + ": unknown bind option '" + key + "' (" +
                                bind_option_keywords(excluded) + ")";
    if (unknown == UnknownBindOption::type_error) throw py::type_error(message);
    throw Error(ErrorCode::invalid_argument, message);
  }
  return options;
}

}  // namespace pinstage::python
