// Registration shapes several binding files share: read-only properties made from a public
// header's field list X(type, name, default, doc), read-only records whose properties and
// __repr__ come from one field list, a list of one thing of each item, and the properties every
// worker-memory object (PinnedHostBuffer, DeviceBuffer) has.
#pragma once

#include <iterator>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "common.h"
#include "pinstage/bind.h"
#include "pinstage/tensor.h"

namespace pinstage::python {

// One read-only field of a record for def_record: its Python name, member and docstring.
template <class T, class M>
struct RecordField {
  const char* name;
  M T::*member;
  const char* doc;
};
template <class T, class M>
RecordField<T, M> field(const char* name, M T::*member, const char* doc) {
  return {name, member, doc};
}

// How Python reads an enum field: by its name ("IN", "staged"), as the C++ reports print it.
inline const char* field_name_of(Direction d) { return direction_name(d); }
inline const char* field_name_of(UploadPath p) { return upload_path_name(p); }
inline const char* field_name_of(DeviceLayout l) { return device_layout_name(l); }

// One read-only property `name` over `member`: the value itself (a copy of a list, a view
// of a registered class kept alive by its owner), or the name of an enum.
template <class T, class M>
void def_field(py::class_<T>& c, const char* name, M T::*member, const char* doc) {
  if constexpr (std::is_enum_v<M>)
    c.def_property_readonly(
        name, [member](const T& r) { return field_name_of(r.*member); }, doc);
  else
    c.def_readonly(name, member, doc);
}

// One read-only property per field of LIST, a public header's X(type, name, default, doc)
// list (PINSTAGE_WORKER_STATS_FIELDS, ...), on `cls`, the py::class_ of the struct the list
// builds: in list order, named as the members, the list's doc their docstrings; and the
// class attribute `_fields`, the names in list order (as a namedtuple's), which the tests
// hold the .pyi stubs and the docs to. A field added to the list reaches Python with no
// change here.
#define PINSTAGE_PY_DEF_FIELDS(cls, LIST) \
  PINSTAGE_PY_DEF_FIELDS_(cls, LIST(PINSTAGE_PY_DEF_FIELD_), {PINSTAGE_PY_FIELD_NAMES(LIST)})
// The same for a list X(type, name, default, doc), COMPUTED(name, doc) (BindReport's), a
// COMPUTED entry being a member function read as a property in its place.
#define PINSTAGE_PY_DEF_FIELDS_COMPUTED(cls, LIST)                                      \
  PINSTAGE_PY_DEF_FIELDS_(cls, LIST(PINSTAGE_PY_DEF_FIELD_, PINSTAGE_PY_DEF_COMPUTED_), \
                          {LIST(PINSTAGE_PY_FIELD_NAME_, PINSTAGE_PY_COMPUTED_NAME_)})
#define PINSTAGE_PY_DEF_FIELDS_(cls, DEFS, NAMES)                                 \
  do {                                                                            \
    auto& pinstage_fields_cls_ = (cls);                                           \
    using PinstageFieldsRecord_ = decltype(record_type_of(pinstage_fields_cls_)); \
    DEFS pinstage_fields_cls_.attr("_fields") =                                   \
        py::tuple(py::cast(std::vector<std::string> NAMES));                      \
  } while (0)
#define PINSTAGE_PY_DEF_FIELD_(type, name, value, doc) \
  ::pinstage::python::def_field(pinstage_fields_cls_, #name, &PinstageFieldsRecord_::name, doc);
#define PINSTAGE_PY_DEF_COMPUTED_(name, doc) \
  pinstage_fields_cls_.def_property_readonly(#name, &PinstageFieldsRecord_::name, doc);
#define PINSTAGE_PY_COMPUTED_NAME_(name, doc) #name,
// The field names of LIST, in order, for a braced list: {PINSTAGE_PY_FIELD_NAMES(LIST)}.
#define PINSTAGE_PY_FIELD_NAMES(LIST) LIST(PINSTAGE_PY_FIELD_NAME_)
#define PINSTAGE_PY_FIELD_NAME_(type, name, value, doc) #name,

// The struct a py::class_ binds, for PINSTAGE_PY_DEF_FIELDS (only its type is used).
template <class T>
T record_type_of(const py::class_<T>&);

// __repr__ "Type(a=1, b='x')": the fields `names` in this order with each value's Python
// repr (def_record's, and a field list's: def_field_repr(c, {PINSTAGE_PY_FIELD_NAMES(L)})).
template <class T>
void def_field_repr(py::class_<T>& c, std::vector<std::string> names) {
  const auto type = c.attr("__name__").template cast<std::string>();
  c.def("__repr__", [type, names = std::move(names)](const py::object& self) {
    std::string out = type + "(";
    for (size_t i = 0; i < names.size(); ++i)
      out += (i > 0 ? ", " : "") + names[i] + "=" +
             py::repr(self.attr(names[i].c_str())).template cast<std::string>();
    return out + ")";
  });
}

// A plain record (Capabilities, DeviceInfo): one read-only property per field, and a
// __repr__ "Type(a=1, b='x')" naming the fields in this order with each value's Python repr,
// so a field added to the list shows in both. `c` is a handle: taken by value.
template <class T, class... M>
void def_record(py::class_<T> c, const RecordField<T, M>&... fields) {
  (c.def_readonly(fields.name, fields.member, fields.doc), ...);
  def_field_repr(c, {fields.name...});
}

// fn(item) for each of `items`, in order: a checkpoint's file paths, its tensors' names.
template <class Range, class Fn>
auto list_of(const Range& items, Fn fn) {
  std::vector<std::decay_t<decltype(fn(*std::begin(items)))>> out;
  for (const auto& item : items) out.push_back(fn(item));
  return out;
}

// upload_gbps and download_gbps, the rates a bind report computes (TensorBindReport,
// GroupBindReport), as properties with these docstrings.
template <class T>
py::class_<T>& def_rates(py::class_<T>& c, const char* upload_doc, const char* download_doc) {
  return c.def_property_readonly("upload_gbps", &T::upload_gbps, upload_doc)
      .def_property_readonly("download_gbps", &T::download_gbps, download_doc);
}

// nbytes, closed and worker of memory a Worker owns (T has nbytes, open() and worker_obj);
// `memory` says whose: "memory" (PinnedHostBuffer), "device memory" (DeviceBuffer).
// pybind11 copies property docstrings, so built ones may be temporaries.
template <class T>
void def_memory_properties(py::class_<T>& c, const std::string& memory) {
  c.def_readonly("nbytes", &T::nbytes, "int: the size asked for (kept after close()).")
      .def_property_readonly(
          "closed", [](const T& b) { return !b.open(); },
          "bool: the memory was released (close(), or the worker's finalize()).")
      .def_readonly("worker", &T::worker_obj,
                    ("Worker: the worker whose " + memory + " this is.").c_str());
}

}  // namespace pinstage::python
