// Tensor-parallel loading for Python: TpPlan (the builder and the JSON form), tp_part, and
// _load_tp, which runs load_tp_to_host into storages that become PinnedHostBuffers of the
// worker, so each rank's slices are torch or NumPy views with the buffers' lifetime rules
// (python/pinstage/tp.py builds them). See docs/python.md, "Tensor-parallel loading".
#include <pybind11/stl.h>

#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "args.h"
#include "common.h"
#include "load_common.h"
#include "pinstage/checkpoint.h"
#include "pinstage/load_plan.h"
#include "pinstage/tensor.h"

namespace pinstage::python {

namespace {

using namespace py::literals;

py::dict tp_report_dict(const TpHostLoad& load) {
  const TpLoadReport& r = load.report;
  py::dict d;
  d["tp"] = load.tp;
  d["read_bytes"] = r.read_bytes;
  d["checkpoint_bytes"] = r.checkpoint_bytes;
  d["host_bytes"] = r.host_bytes;
  d["scatter_bytes"] = r.scatter_bytes;
  d["scatter_s"] = r.scatter_s;
  d["replicated"] = r.replicated;
  d["contiguous"] = r.contiguous;
  d["strided"] = r.strided;
  d["unused_rules"] = r.unused_rules;
  py::list ranks;
  for (const TpRankReport& rank : r.ranks)
    ranks.append(py::dict("bytes"_a = rank.bytes, "direct_bytes"_a = rank.direct_bytes,
                          "scatter_bytes"_a = rank.scatter_bytes,
                          "shared_bytes"_a = rank.shared_bytes));
  d["ranks"] = ranks;
  d["load"] = report_dict(r.load);
  return d;
}

// load_tp_to_host into PinnedHostBuffers of `worker_obj`, without the GIL. Returns
// (buffers, ranks, report): ranks[r] is a list of {name, dtype, shape, dim, begin, bytes,
// rule, staged, buffer}, buffer an index into buffers (a replicated tensor's is the same
// for every rank).
py::tuple load_tp(const Checkpoint& c, const TpPlan& plan, int tp, const py::object& worker_obj,
                  int threads, uint64_t chunk_bytes, bool verify, bool verify_if_present,
                  bool direct, const py::object& progress) {
  PyWorker& w = as_worker(worker_obj, "load_tp");
  resolve_tp_plan(c, plan, tp);  // every refusal before the GIL is let go
  BufferAllocator allocator(w.worker);
  TpHostLoad load;
  {
    const Busy busy(&w);  // finalize() waits: no buffer is registered with the worker yet
    load = run_with_progress(
        load_options(threads, chunk_bytes, verify, verify_if_present, direct, 0), progress,
        [&](const CheckpointLoadOptions& o) { return load_tp_to_host(c, plan, tp, allocator, o); });
  }
  std::map<const void*, size_t> index;
  py::list buffers;
  for (PinnedHostBuffer& b : allocator.buffers) {
    index[b.data()] = index.size();
    buffers.append(py::cast(std::make_unique<PyBuffer>(worker_obj, &w, std::move(b))));
  }
  py::list ranks;
  for (const std::vector<TpTensor>& rank : load.ranks) {
    py::list slices;
    for (const TpTensor& t : rank)
      slices.append(py::dict("name"_a = t.info.name, "dtype"_a = t.info.dtype,
                             "shape"_a = py::tuple(py::cast(t.shape)), "dim"_a = t.dim,
                             "begin"_a = t.begin, "bytes"_a = t.bytes, "rule"_a = t.rule,
                             "staged"_a = t.staged, "buffer"_a = index.at(t.storage->data())));
    ranks.append(slices);
  }
  return py::make_tuple(buffers, ranks, tp_report_dict(load));
}

// A builder method of TpPlan for Python: it returns the plan itself (the same Python
// object), so calls chain as in C++.
template <class... A>
auto builder(TpPlan& (TpPlan::*method)(A...)) {
  return [method](py::object self, A... a) {
    (self.cast<TpPlan&>().*method)(std::move(a)...);
    return self;
  };
}

// TpPlan's readers (the JSON form) and queries.
void def_tp_plan_queries(py::class_<TpPlan>& cls) {
  cls.def_static("parse", &TpPlan::parse, py::arg("text"), py::arg("source") = "plan",
                 function_doc("parse(text: str, source: str = 'plan') -> TpPlan",
                              "The JSON form (docs/loading.md), parsed strictly; errors name "
                              "source."))
      .def_static(
          "read_file",
          [](const py::object& path) {
            return TpPlan::read_file(path_arg(path, "TpPlan.read_file(): path"));
          },
          py::arg("path"), function_doc("read_file(path: str | os.PathLike[str]) -> TpPlan"))
      .def_property_readonly(
          "tp", [](const TpPlan& p) { return p.tp(); }, "int | None: expect_tp's, or None.")
      .def("match", &TpPlan::match, py::arg("name"),
           method_doc("match(name: str) -> int",
                      "The index of the first rule matching name, or -1 (the default)."))
      .def("describe", &TpPlan::describe, py::arg("rule"),
           method_doc("describe(rule: int) -> str",
                      "\"rule 2 (match '*.q_proj.weight': split dim 0)\"; -1: the default."));
}

void bind_tp_plan(py::module_& m) {
  py::class_<TpPlan> cls(m, "TpPlan",
                         "Which tensors a tensor-parallel load splits, and along which dim: rules "
                         "tried in order, the first match deciding, and a default (replicate).");
  cls.def(py::init<>(), method_doc("__init__() -> None", "An empty plan: every tensor replicated."))
      .def("split", builder(&TpPlan::split), py::arg("glob"), py::arg("dim"),
           method_doc("split(glob: str, dim: int) -> TpPlan",
                      "Tensors whose whole name matches glob ('*' any run, '?' one character) "
                      "are split along dim (negative counts from the last)."))
      .def("replicate", builder(&TpPlan::replicate), py::arg("glob"),
           method_doc("replicate(glob: str) -> TpPlan"))
      .def("split_regex", builder(&TpPlan::split_regex), py::arg("regex"), py::arg("dim"),
           method_doc("split_regex(regex: str, dim: int) -> TpPlan",
                      "As split, with an ECMAScript regex matching the whole name."))
      .def("replicate_regex", builder(&TpPlan::replicate_regex), py::arg("regex"),
           method_doc("replicate_regex(regex: str) -> TpPlan"))
      .def("default_split", builder(&TpPlan::default_split), py::arg("dim"),
           method_doc("default_split(dim: int) -> TpPlan",
                      "Tensors no rule matches are split along dim."))
      .def("default_replicate", builder(&TpPlan::default_replicate),
           method_doc("default_replicate() -> TpPlan"))
      .def("expect_tp", builder(&TpPlan::expect_tp), py::arg("tp"),
           method_doc("expect_tp(tp: int) -> TpPlan",
                      "The tp the plan was written for: a load with another is refused."))
      .def(
          "__len__", [](const TpPlan& p) { return p.rules().size(); },
          method_doc("__len__() -> int", "The number of rules."));
  def_tp_plan_queries(cls);
}

}  // namespace

void bind_load_tp(py::module_& m) {
  bind_tp_plan(m);
  m.def(
      "tp_part",
      [](int64_t size, int parts, int rank) {
        if (size < 0 || parts < 1 || rank < 0 || rank >= parts)
          throw Error(ErrorCode::invalid_argument,
                      "tp_part: needs size >= 0, parts >= 1 and 0 <= rank < parts; got size " +
                          std::to_string(size) + ", parts " + std::to_string(parts) + ", rank " +
                          std::to_string(rank));
        const TpPart p = tp_part(size, parts, rank);
        return py::make_tuple(p.begin, p.count);
      },
      py::arg("size"), py::arg("parts"), py::arg("rank"),
      function_doc("tp_part(size: int, parts: int, rank: int) -> tuple[int, int]",
                   "(begin, count) of part rank of a dim of size split into parts, as "
                   "numpy.array_split cuts it: the first size % parts parts one longer."));
  def_load(
      m, "_load_tp", &load_tp,
      std::make_tuple(py::arg("checkpoint"), py::arg("plan"), py::arg("tp"), py::arg("worker")),
      py::arg("progress") = py::none(),
      function_doc(load_signature("_load_tp(checkpoint: _Checkpoint, plan: TpPlan, tp: int, "
                                  "worker: Worker",
                                  "progress: Callable[[int, int], None] | None = None) -> "
                                  "tuple[list[PinnedHostBuffer], list[list[dict[str, Any]]], "
                                  "dict[str, Any]]"),
                   "load_tp_to_host into PinnedHostBuffers of worker (pinstage.load_tp)."));
}

}  // namespace pinstage::python
