// The node level for Python (python/pinstage/node.py builds on these): _WorkerGroup, a
// C++ WorkerGroup over Python Workers (kept alive by it), its group bind and its
// tensor-parallel load onto the devices; GroupBindReport; parse_device_list and
// split_threads. See docs/node.md.
#include <pybind11/stl.h>

#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "args.h"
#include "bind_options.h"
#include "bind_util.h"
#include "common.h"
#include "load_common.h"
#include "pinstage/bind.h"
#include "pinstage/load_plan.h"
#include "pinstage/worker_group.h"

namespace pinstage::python {

namespace {

using namespace py::literals;

// A WorkerGroup over the Python Workers in `workers` (a list it holds).
struct PyGroup {
  PyGroup(py::list workers_, int threads) : workers(std::move(workers_)) {
    std::vector<Worker*> members;
    for (const py::handle w : workers) {
      PyWorker& pw = as_worker(py::reinterpret_borrow<py::object>(w), "WorkerGroup");
      py_workers.push_back(&pw);
      members.push_back(&pw.worker);
    }
    group = std::make_unique<WorkerGroup>(members, threads);
  }

  // Holds off every member's finalize() for a call without the GIL.
  std::vector<std::unique_ptr<Busy>> busy_all() const {
    std::vector<std::unique_ptr<Busy>> busy;
    for (PyWorker* w : py_workers) busy.push_back(std::make_unique<Busy>(w));
    return busy;
  }

  py::list workers;
  std::vector<PyWorker*> py_workers;
  std::unique_ptr<WorkerGroup> group;
};

GroupBindReport group_bind(PyGroup& g, const py::list& args_list, const py::kwargs& options) {
  std::vector<const PyArgs*> args;
  for (const py::handle a : args_list) {
    if (!py::isinstance<PyArgs>(a))
      throw py::type_error("WorkerGroup.bind: args must be pinstage.TaskArgs, one per device");
    const auto& pa = a.cast<const PyArgs&>();
    pa.require_usable("WorkerGroup.bind");
    args.push_back(&pa);
  }
  GroupBinder binder(*g.group, bind_options_from(options, "WorkerGroup.bind"));
  std::vector<TaskArgs> copies;  // TaskArgs share their storage: no bytes are copied
  std::vector<std::unique_ptr<Busy>> busy = g.busy_all();
  for (const PyArgs* a : args) {
    copies.push_back(a->args);
    busy.push_back(std::make_unique<Busy>(a->worker));
  }
  const GilReleased nogil;
  return binder.run(copies);
}

// load_tp_to_devices without the GIL; returns (ranks, report): ranks[r] a list of
// (name, dtype, shape, dim, begin, DeviceBuffer or None for 0 bytes).
py::tuple group_load_tp(PyGroup& g, const Checkpoint& c, const TpPlan& plan, int threads,
                        uint64_t chunk_bytes, bool verify, bool verify_if_present, bool direct,
                        const py::object& progress) {
  resolve_tp_plan(c, plan, static_cast<int>(g.group->size()));  // refusals with the GIL
  TpDeviceLoad load;
  {
    const auto busy = g.busy_all();
    load = run_with_progress(
        load_options(threads, chunk_bytes, verify, verify_if_present, direct, 0), progress,
        [&](const CheckpointLoadOptions& o) { return load_tp_to_devices(c, plan, *g.group, o); });
  }
  py::list ranks;
  for (size_t r = 0; r < load.ranks.size(); ++r) {
    py::list tensors;
    for (DeviceTensor& t : load.ranks[r])
      tensors.append(py::make_tuple(
          t.info.name, t.info.dtype, py::tuple(py::cast(t.info.shape)),
          t.buffer ? make_device_buffer(g.workers[r].cast<py::object>(), std::move(t.buffer))
                   : py::none()));
    ranks.append(tensors);
  }
  py::dict report;
  report["tp"] = load.tp;
  report["devices"] = load.devices;
  report["read_bytes"] = load.host.read_bytes;
  report["checkpoint_bytes"] = load.host.checkpoint_bytes;
  report["uploaded_bytes"] = load.uploaded_bytes;
  report["upload_s"] = load.upload_s;
  report["upload_gbps"] = load.upload_gbps();
  report["total_s"] = load.total_s;
  report["read_s"] = load.host.load.read_s;
  py::list uploads;
  for (const TpDeviceReport& u : load.uploads)
    uploads.append(py::dict("device"_a = u.device, "bytes"_a = u.bytes, "tensors"_a = u.tensors,
                            "upload_s"_a = u.upload_s, "gbps"_a = u.gbps()));
  report["uploads"] = uploads;
  return py::make_tuple(ranks, report);
}

void bind_group_report(py::module_& m) {
  py::class_<GroupBindReport> c(m, "GroupBindReport",
                                "What one WorkerGroup.bind did: each device's BindReport and the "
                                "node's totals.");
  PINSTAGE_PY_DEF_FIELDS(c, PINSTAGE_GROUP_BIND_REPORT_FIELDS);
  def_rates(c, "float: all devices' upload bytes over the slowest upload phase.",
            "float: the same for the downloads.")
      .def("__str__", &GroupBindReport::to_string,
           method_doc("__str__() -> str", "The totals, then one line per device."));
}

}  // namespace

void bind_node(py::module_& m) {
  bind_group_report(m);
  m.def("parse_device_list", &parse_device_list, py::arg("text"), py::arg("devices"),
        function_doc("parse_device_list(text: str, devices: list[DeviceInfo]) -> list[int]",
                     "'all' (every usable device) or '0,2' -> ids, checked against devices(): "
                     "InvalidArgumentError for an empty item, a repeated or unknown id, a "
                     "device that is not usable."));
  m.def(
      "split_threads",
      [](const py::object& total, const py::object& devices) {
        // Python ints of any size: out of C++'s range is InvalidArgumentError, by name.
        const int64_t t = int_arg(total, "split_threads: total");
        const int64_t d = int_arg(devices, "split_threads: devices");
        if (t > std::numeric_limits<int>::max() || t < std::numeric_limits<int>::min())
          throw Error(ErrorCode::invalid_argument,
                      "split_threads: total is " + std::to_string(t) + "; it must be in [0, " +
                          std::to_string(std::numeric_limits<int>::max()) + "]");
        if (d < 0 || d > (int64_t{1} << 20))
          throw Error(
              ErrorCode::invalid_argument,
              "split_threads: devices is " + std::to_string(d) + "; it must be in [0, 1048576]");
        return split_threads(static_cast<int>(t), static_cast<size_t>(d));
      },
      py::arg("total"), py::arg("devices"),
      function_doc("split_threads(total: int, devices: int) -> list[int]",
                   "total threads (0 = the process's) over devices teams, the remainder to "
                   "the first, at least one each."));
  py::class_<PyGroup>(m, "_WorkerGroup")
      .def(py::init<py::list, int>(), py::arg("workers"), py::arg("threads") = 0)
      .def_property_readonly("device_ids", [](const PyGroup& g) { return g.group->device_ids(); })
      .def_property_readonly("team_threads",
                             [](const PyGroup& g) {
                               std::vector<int> t;
                               for (size_t i = 0; i < g.group->size(); ++i)
                                 t.push_back(g.group->team_threads(i));
                               return t;
                             })
      .def("bind", &group_bind, py::arg("args"))
      .def("load_tp", &group_load_tp, py::arg("checkpoint"), py::arg("plan"), py::kw_only(),
           py::arg("threads"), py::arg("chunk_bytes"), py::arg("verify"),
           py::arg("verify_if_present"), py::arg("direct"), py::arg("progress"));
}

}  // namespace pinstage::python
