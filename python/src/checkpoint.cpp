// Checkpoint loading for Python: the validated Checkpoint, parallel reads straight into
// PinnedHostBuffers (which torch views zero-copy, see python/pinstage/checkpoint.py), and
// device loads that hand back the report and the owned device buffers. docs/loading.md.
#include <pybind11/stl.h>

#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "args.h"
#include "bind_util.h"
#include "common.h"
#include "device_load.h"
#include "load_common.h"
#include "pinstage/cache.h"
#include "pinstage/checkpoint.h"
#include "pinstage/load_plan.h"
#include "pinstage/parallel.h"
#include "pinstage/safetensors.h"
#include "pinstage/tensor.h"

namespace pinstage::python {

py::dict report_dict(const LoadReport& r) { return fields_dict(report_fields(r)); }

CheckpointLoadOptions load_options(int threads, uint64_t chunk_bytes, bool verify,
                                   bool verify_if_present, bool direct, uint64_t ring_bytes) {
  return {.threads = threads,
          .chunk_bytes = chunk_bytes,
          .direct = direct,
          .verify = verify,
          .verify_if_present = verify_if_present,
          .ring_bytes = ring_bytes};
}

std::string load_signature(std::string_view head, std::string_view tail) {
  const CheckpointLoadOptions d;
  const auto flag = [](bool b) { return b ? "True" : "False"; };
  return std::string(head) + ", threads: int = " + std::to_string(d.threads) +
         ", chunk_bytes: int = " + std::to_string(d.chunk_bytes) +
         ", verify: bool = " + flag(d.verify) +
         ", verify_if_present: bool = " + flag(d.verify_if_present) +
         ", direct: bool = " + flag(d.direct) + ", " + std::string(tail);
}

namespace {

py::dict tensor_dict(const Checkpoint& c, const CheckpointTensor& t) {
  py::dict d;
  d["dtype"] = t.dtype;
  d["shape"] = py::tuple(py::cast(t.shape));
  d["file"] = c.files()[t.file].path;
  d["offset"] = t.offset;
  d["nbytes"] = t.bytes;
  d["element_size"] = t.element_size;
  d["xxh3"] = t.xxh3 ? py::cast(xxh3_hex(*t.xxh3)) : py::none();
  return d;
}

// read_checkpoint of `targets` without the GIL, with Python's progress callback relayed:
// the one read both read_into functions end with.
py::dict read_with_progress(const Checkpoint& c, const std::vector<ReadTarget>& targets,
                            CheckpointLoadOptions o, const py::object& progress) {
  return report_dict(run_with_progress(
      o, progress, [&](const CheckpointLoadOptions& p) { return read_checkpoint(c, targets, p); }));
}

// Reads tensors `names` into `buffers` (PinnedHostBuffers of at least their bytes) without
// the GIL. Each buffer is leased for the whole read, so its close() refuses naming the
// read, and its worker counts the call as busy, so finalize() waits or refuses.
py::dict read_into(const Checkpoint& c, const std::vector<std::string>& names,
                   const std::vector<py::object>& buffers, int threads, uint64_t chunk_bytes,
                   bool verify, bool verify_if_present, bool direct, const py::object& progress) {
  if (names.size() != buffers.size())
    throw Error(ErrorCode::invalid_argument, "read_into: " + std::to_string(names.size()) +
                                                 " names but " + std::to_string(buffers.size()) +
                                                 " buffers");
  std::vector<ReadTarget> targets;
  std::vector<std::unique_ptr<Lease>> leases;  // destroyed after the GIL is back
  std::vector<std::unique_ptr<Busy>> busy;
  for (size_t i = 0; i < names.size(); ++i) {
    const CheckpointTensor& t = c.get(names[i]);
    if (!py::isinstance<PyBuffer>(buffers[i]))
      throw py::type_error("read_into: buffers must be pinstage.PinnedHostBuffer objects");
    auto& b = buffers[i].cast<PyBuffer&>();
    b.require_open("read_into");
    if (b.nbytes < t.bytes)
      throw Error(ErrorCode::invalid_argument, "read_into: the buffer for tensor '" + t.name +
                                                   "' has " + std::to_string(b.nbytes) +
                                                   " bytes; it needs " + std::to_string(t.bytes));
    targets.push_back({&t, b.buffer.data()});
    leases.push_back(std::make_unique<Lease>(buffers[i], &b, LeaseHolder::read));
    busy.push_back(std::make_unique<Busy>(b.worker));
    b.name = t.name;  // finalize()'s refusal names the tensor a view of b holds
  }
  return read_with_progress(
      c, targets, load_options(threads, chunk_bytes, verify, verify_if_present, direct, 0),
      progress);
}

// Reads tensors `names` into caller-held memory: addresses[i] is where tensor names[i]'s
// bytes go, and [address, address + its bytes) must lie inside one open PinnedHostBuffer of
// `worker_obj` (the memory of a PinnedTorchAllocator tensor, say). Every range is checked,
// and no two may overlap, before anything is read; then as read_into (leases, busy, no GIL).
py::dict read_into_pinned(const Checkpoint& c, const std::vector<std::string>& names,
                          const std::vector<uintptr_t>& addresses, const py::object& worker_obj,
                          const std::string& who, int threads, uint64_t chunk_bytes, bool verify,
                          bool verify_if_present, bool direct, const py::object& progress) {
  PyWorker& w = as_worker(worker_obj, who.c_str());
  if (names.size() != addresses.size())
    throw Error(ErrorCode::invalid_argument, who + ": " + std::to_string(names.size()) +
                                                 " names but " + std::to_string(addresses.size()) +
                                                 " addresses");
  std::vector<ReadTarget> targets;
  std::vector<std::unique_ptr<Lease>> leases;        // destroyed after the GIL is back
  std::vector<std::pair<uintptr_t, size_t>> ranges;  // (start, index into names)
  for (size_t i = 0; i < names.size(); ++i) {
    const CheckpointTensor& t = c.get(names[i]);
    if (t.bytes == 0) continue;  // nothing to write
    void* dst = reinterpret_cast<void*>(addresses[i]);
    PyBuffer* b = find_pinned(dst, t.bytes);
    if (b == nullptr || b->worker != &w)
      throw Error(ErrorCode::invalid_argument,
                  who + ": the memory for tensor '" + t.name + "' (" + std::to_string(t.bytes) +
                      " bytes) is not inside one open pinned buffer of this worker " +
                      (b == nullptr ? "(pageable, closed, or too small)"
                                    : "(it is another worker's pinned memory)") +
                      "; make it with pinstage.PinnedTorchAllocator(worker)");
    ranges.emplace_back(addresses[i], i);
    targets.push_back({&t, dst});
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t k = 1; k < ranges.size(); ++k) {
    const CheckpointTensor& prev = c.get(names[ranges[k - 1].second]);
    if (ranges[k - 1].first + prev.bytes > ranges[k].first)
      throw Error(ErrorCode::invalid_argument,
                  who + ": the memory for tensors '" + prev.name + "' and '" +
                      names[ranges[k].second] + "' overlaps; each tensor needs memory of its own");
  }
  Busy busy(&w);
  for (const ReadTarget& t : targets) {
    PyBuffer* b = find_pinned(t.dst, t.tensor->bytes);
    leases.push_back(std::make_unique<Lease>(py::cast(b, py::return_value_policy::reference), b,
                                             LeaseHolder::read));
  }
  return read_with_progress(
      c, targets, load_options(threads, chunk_bytes, verify, verify_if_present, direct, 0),
      progress);
}

// Reads the slice `dims` ((begin, count, step) per dim) of tensor `name` into `buffer` (a
// PinnedHostBuffer of at least the slice's bytes), asking the files for exactly the
// slice's byte ranges, without the GIL; leased and busy as read_into.
py::dict read_slice(const Checkpoint& c, const std::string& name,
                    const std::vector<std::tuple<int64_t, int64_t, int64_t>>& dims,
                    const py::object& buffer, int threads, uint64_t chunk_bytes, bool verify,
                    bool verify_if_present, bool direct, const py::object& progress) {
  const CheckpointTensor& t = c.get(name);
  std::vector<SliceDim> slice;
  uint64_t bytes = t.element_size;
  for (const auto& [begin, count, step] : dims) {
    slice.push_back({begin, count, step});
    bytes *= static_cast<uint64_t>(std::max<int64_t>(count, 0));
  }
  if (!py::isinstance<PyBuffer>(buffer))
    throw py::type_error("read_slice: buffer must be a pinstage.PinnedHostBuffer");
  auto& b = buffer.cast<PyBuffer&>();
  b.require_open("read_slice");
  if (b.nbytes < bytes)
    throw Error(ErrorCode::invalid_argument, "read_slice: the buffer for the slice of tensor '" +
                                                 t.name + "' has " + std::to_string(b.nbytes) +
                                                 " bytes; it needs " + std::to_string(bytes));
  const Lease lease(buffer, &b, LeaseHolder::read);
  const Busy busy(b.worker);
  return report_dict(
      run_with_progress(load_options(threads, chunk_bytes, verify, verify_if_present, direct, 0),
                        progress, [&](const CheckpointLoadOptions& p) {
                          return read_tensor_slice(c, t, slice, b.buffer.data(), p);
                        }));
}

// A tensor of a load through the worker (map mode, or any load through the restart cache):
// a view of its storage, which it keeps alive (pinstage._pinstage._MappedTensor;
// python/pinstage/checkpoint.py wraps it). Read-only in map mode; writable in copy mode (a
// cache hit's private copy-on-write mapping, or pinned memory the load copied into).
struct PyMapped : ViewHolder {
  std::shared_ptr<Storage> storage;
  std::string name;
  bool writable = false;
  std::string holder_name() const override { return "mapped tensor '" + name + "'"; }
};

// The one host load of load_file, safe_open and get_tensor (load_to_host through the
// worker): copy mode reserves the pool once, allocates each tensor and reads, all in C++
// without the GIL; map mode maps and pins the files; a load through the cache goes through
// the worker, which routes it to the entry. Returns ([PinnedHostBuffer or _MappedTensor per
// name], the report).
py::tuple load_pinned(const Checkpoint& c, py::object worker_obj,
                      const std::vector<std::string>& names, const std::string& mode, int threads,
                      uint64_t chunk_bytes, bool verify, bool verify_if_present, bool direct,
                      const py::object& progress, const std::string& cache) {
  PyWorker& w = as_worker(worker_obj, "load_file");
  CheckpointLoadOptions o =
      load_options(threads, chunk_bytes, verify, verify_if_present, direct, 0);
  o.mode = parse_load_mode(mode);
  o.cache = parse_cache_use(cache);
  BufferAllocator buffers(w.worker);
  const bool into_buffers = o.mode == LoadMode::copy && o.cache == CacheUse::off;
  HostLoad load;
  {
    Busy busy(&w);
    load = run_with_progress(o, progress, [&](const CheckpointLoadOptions& p) {
      return into_buffers ? load_to_host(c, buffers, p, &names)
                          : load_to_host(c, w.worker, p, &names);
    });
  }
  if (into_buffers) load.report.host_pages = buffers.fill_pages();
  py::list out;
  for (size_t i = 0; i < load.tensors.size(); ++i) {
    if (into_buffers) {
      auto* b = new PyBuffer(worker_obj, &w, std::move(buffers.buffers[i]));
      b->name = load.tensors[i].info.name;  // finalize()'s refusal names it
      out.append(py::cast(b, py::return_value_policy::take_ownership));
      continue;
    }
    auto mapped = std::make_unique<PyMapped>();
    mapped->storage = load.tensors[i].storage;
    mapped->name = load.tensors[i].info.name;
    mapped->writable = o.mode == LoadMode::copy;
    out.append(py::cast(std::move(mapped)));
  }
  return py::make_tuple(out, report_dict(load.report));
}

py::capsule mapped_dlpack(py::object self, const py::object& stream, const py::object& max_version,
                          const py::object& dl_device, const py::object& copy) {
  (void)stream;
  (void)dl_device;
  auto& m = self.cast<PyMapped&>();
  DLPackRequest request;
  request.versioned = wants_versioned(max_version);
  request.read_only = !m.writable;
  request.copy = !copy.is_none() && copy.cast<bool>();
  request.label = m.name;
  return export_dlpack(self, &m, m.storage->data(), DLDataType{kDLUInt, 8, 1},
                       {static_cast<int64_t>(m.storage->bytes())}, DLDevice{kDLCPU, 0}, request);
}

void bind_mapped(py::module_& m) {
  py::class_<PyMapped> cls(m, "_MappedTensor", py::buffer_protocol(),
                           "A view of a load's storage through the worker: read-only in map mode "
                           "(a pinned file mapping), writable in copy mode (a cache hit).");
  cls.def_buffer([](PyMapped& t) {
       return py::buffer_info(t.storage->data(), 1, py::format_descriptor<uint8_t>::format(), 1,
                              {static_cast<py::ssize_t>(t.storage->bytes())}, {1},
                              /*readonly=*/!t.writable);
     })
      .def_readonly("name", &PyMapped::name, "str: the tensor.")
      .def_readonly("writable", &PyMapped::writable, "bool: its bytes may be written.")
      .def_property_readonly(
          "nbytes", [](const PyMapped& t) { return t.storage->bytes(); }, "int: its bytes.")
      .def_property_readonly(
          "address",
          [](const PyMapped& t) { return reinterpret_cast<uintptr_t>(t.storage->data()); },
          "int: where its first byte is mapped.")
      .def(
          "__dlpack_device__",
          [](const PyMapped&) { return py::make_tuple(static_cast<int>(kDLCPU), 0); },
          method_doc("__dlpack_device__() -> tuple[int, int]", "(kDLCPU, 0): host memory."));
  def_dlpack(cls, &mapped_dlpack, "A DLPack capsule of the bytes (read-only unless writable).");
}

std::unique_ptr<PyDeviceLoad> to_device(const Checkpoint& c, py::object worker_obj, int threads,
                                        uint64_t chunk_bytes, bool verify, bool verify_if_present,
                                        bool direct, uint64_t ring_bytes,
                                        const std::optional<std::vector<std::string>>& names,
                                        const py::object& progress, const std::string& mode,
                                        const std::string& cache) {
  PyWorker& w = as_worker(worker_obj, "load_to_device");
  CheckpointLoadOptions o =
      load_options(threads, chunk_bytes, verify, verify_if_present, direct, ring_bytes);
  o.mode = parse_load_mode(mode);
  o.cache = parse_cache_use(cache);
  auto out = std::make_unique<PyDeviceLoad>(worker_obj, &w);
  Busy busy(&w);
  out->load = run_with_progress(o, progress, [&](const CheckpointLoadOptions& p) {
    return names ? load_to_device(c, w.worker, p, *names) : load_to_device(c, w.worker, p);
  });
  return out;
}

const DeviceTensor& device_tensor(const PyDeviceLoad& d, const std::string& name) {
  for (const DeviceTensor& t : d.load.tensors)
    if (t.info.name == name) return t;
  throw Error(ErrorCode::not_found, "the device load has no tensor '" + name + "'");
}

void bind_device_load(py::module_& m) {
  py::class_<PyDeviceLoad> cls(m, "_DeviceLoad");
  bind_device_load_views(cls);
  cls.def_property_readonly(
         "report", [](const PyDeviceLoad& d) { return report_dict(d.load.report); },
         "dict[str, Any]: the load's report (bytes, seconds, GB/s per phase).")
      .def(
          "keys",
          [](const PyDeviceLoad& d) {
            return list_of(d.load.tensors, [](const DeviceTensor& t) { return t.info.name; });
          },
          method_doc("keys() -> list[str]"))
      .def(
          "nbytes",
          [](const PyDeviceLoad& d, const std::string& n) {
            return device_tensor(d, n).info.bytes;
          },
          py::arg("name"), method_doc("nbytes(name: str) -> int"))
      .def(
          "device_ptr",
          [](const PyDeviceLoad& d, const std::string& n) {
            return reinterpret_cast<uintptr_t>(device_tensor(d, n).buffer.data());
          },
          py::arg("name"), method_doc("device_ptr(name: str) -> int"))
      .def(
          "to_bytes",
          [](const PyDeviceLoad& d, const std::string& n) {
            const DeviceTensor& t = device_tensor(d, n);
            std::string out(t.info.bytes, '\0');
            if (t.info.bytes > 0) {
              PyWorker& w = d.worker_obj.cast<PyWorker&>();
              w.worker.copy_to_host(out.data(), t.buffer, 0, t.info.bytes);
            }
            return py::bytes(out);
          },
          py::arg("name"),
          method_doc("to_bytes(name: str) -> bytes", "The tensor read back from the device."))
      .def("close", &PyDeviceLoad::close,
           method_doc("close() -> None",
                      "Frees the device memory now; BufferError while a tensor(name) view lives."));
}

// ---- one tensor-parallel rank (python/pinstage/distributed.py) ----
// The plan travels as its JSON text (TpPlan::parse, errors naming `source`).

py::dict slice_dict(const Checkpoint& c, const TpTensor& t) {
  py::dict d = tensor_dict(c, c.get(t.info.name));
  d["name"] = t.info.name;
  d["shape"] = py::tuple(py::cast(t.shape));
  d["full_shape"] = py::tuple(py::cast(t.info.shape));
  d["dim"] = t.dim;
  d["begin"] = t.begin;
  d["nbytes"] = t.bytes;
  d["rule"] = t.rule;
  return d;
}

py::list slice_dicts(const Checkpoint& c, const TpPlan& plan, int tp, int rank) {
  py::list out;
  for (const TpTensor& t : tp_rank_slices(c, plan, tp, rank)) out.append(slice_dict(c, t));
  return out;
}

py::list tp_slices(const Checkpoint& c, const std::string& plan, const std::string& source, int tp,
                   int rank) {
  return slice_dicts(c, TpPlan::parse(plan, source), tp, rank);
}

// The open PinnedHostBuffers `buffers`, leased for the call and counted busy on their
// worker; each must hold at least need[i] bytes. Errors name `who` and the tensor.
struct Leased {
  std::vector<void*> dsts;
  std::vector<std::unique_ptr<Lease>> leases;  // destroyed after the GIL is back
  std::vector<std::unique_ptr<Busy>> busy;
};
Leased lease_buffers(const std::vector<py::object>& buffers, const std::vector<TpTensor>& slices,
                     const std::string& who) {
  if (buffers.size() != slices.size())
    throw Error(ErrorCode::invalid_argument, who + ": " + std::to_string(buffers.size()) +
                                                 " buffers for " + std::to_string(slices.size()) +
                                                 " tensors");
  Leased l;
  for (size_t i = 0; i < buffers.size(); ++i) {
    if (!py::isinstance<PyBuffer>(buffers[i]))
      throw py::type_error(who + ": buffers must be pinstage.PinnedHostBuffer objects");
    auto& b = buffers[i].cast<PyBuffer&>();
    b.require_open(who.c_str());
    if (b.nbytes < slices[i].bytes)
      throw Error(ErrorCode::invalid_argument,
                  who + ": the buffer for tensor '" + slices[i].info.name + "' has " +
                      std::to_string(b.nbytes) + " bytes; its slice needs " +
                      std::to_string(slices[i].bytes));
    l.dsts.push_back(b.buffer.data());
    l.leases.push_back(std::make_unique<Lease>(buffers[i], &b, LeaseHolder::read));
    l.busy.push_back(std::make_unique<Busy>(b.worker));
  }
  return l;
}

// Rank `rank`'s slices read into `buffers` (tp_slices order), the files asked for those
// bytes only; the report gains read_bytes.
py::dict read_tp_into(const Checkpoint& c, const std::string& plan, const std::string& source,
                      int tp, int rank, const std::vector<py::object>& buffers, int threads,
                      uint64_t chunk_bytes, bool direct, const py::object& progress) {
  const auto slices = tp_rank_slices(c, TpPlan::parse(plan, source), tp, rank);
  const Leased l = lease_buffers(buffers, slices, "read_tp_into");
  CheckpointLoadOptions o = load_options(threads, chunk_bytes, false, false, direct, 0);
  ProgressRelay relay(progress);
  relay.attach(o);
  TpLoadReport r;
  try {
    GilReleased nogil;
    r = read_tp_slices(c, slices, l.dsts, o);
  } catch (const ProgressStopped&) {
    relay.rethrow();
  }
  py::dict d = report_dict(r.load);
  d["read_bytes"] = r.read_bytes;
  return d;
}

// A writable Python buffer (an mmap of a shared-memory segment), exported for the call.
struct Memory {
  py::buffer_info info;
  uint64_t bytes = 0;
  unsigned char* data = nullptr;
};
Memory memory_of(const py::buffer& buffer, bool writable) {
  Memory m{buffer.request(writable)};
  m.bytes = static_cast<uint64_t>(m.info.size) * static_cast<uint64_t>(m.info.itemsize);
  m.data = static_cast<unsigned char*>(m.info.ptr);
  return m;
}

// Every (name, offset) range inside `bytes`, no two overlapping; Error naming `who`.
void check_ranges(const Checkpoint& c, const std::vector<std::string>& names,
                  const std::vector<uint64_t>& offsets, uint64_t bytes, const std::string& who) {
  if (names.size() != offsets.size())
    throw Error(ErrorCode::invalid_argument, who + ": " + std::to_string(names.size()) +
                                                 " names but " + std::to_string(offsets.size()) +
                                                 " offsets");
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (size_t i = 0; i < names.size(); ++i) {
    const CheckpointTensor& t = c.get(names[i]);
    if (offsets[i] > bytes || t.bytes > bytes - offsets[i])
      throw Error(ErrorCode::invalid_argument,
                  who + ": tensor '" + t.name + "' (" + std::to_string(t.bytes) +
                      " bytes at offset " + std::to_string(offsets[i]) +
                      ") does not fit the memory's " + std::to_string(bytes) + " bytes");
    if (t.bytes > 0) ranges.emplace_back(offsets[i], offsets[i] + t.bytes);
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t k = 1; k < ranges.size(); ++k)
    if (ranges[k - 1].second > ranges[k].first)
      throw Error(ErrorCode::invalid_argument,
                  who + ": two tensors overlap at offset " + std::to_string(ranges[k].first));
}

// Whole tensors `names` read to `offsets` in `memory` (a writable buffer), without the GIL.
py::dict read_whole_into(const Checkpoint& c, const std::vector<std::string>& names,
                         const py::buffer& memory, const std::vector<uint64_t>& offsets,
                         int threads, uint64_t chunk_bytes, bool direct) {
  const Memory m = memory_of(memory, true);
  check_ranges(c, names, offsets, m.bytes, "read_whole_into");
  std::vector<ReadTarget> targets;
  for (size_t i = 0; i < names.size(); ++i)
    targets.push_back({&c.get(names[i]), m.data + offsets[i]});
  LoadReport r;
  {
    GilReleased nogil;
    r = read_checkpoint(c, targets, load_options(threads, chunk_bytes, false, false, direct, 0));
  }
  return report_dict(r);
}

// Rank `rank`'s slices of the whole tensors `names` held at `offsets` in `memory`, copied
// into `buffers` (one PinnedHostBuffer per name) without the GIL; returns the bytes copied.
uint64_t copy_tp_from(const Checkpoint& c, const std::string& plan, const std::string& source,
                      int tp, int rank, const std::vector<std::string>& names,
                      const py::buffer& memory, const std::vector<uint64_t>& offsets,
                      const std::vector<py::object>& buffers, int threads) {
  const Memory m = memory_of(memory, false);
  check_ranges(c, names, offsets, m.bytes, "copy_tp_from");
  const auto all = tp_rank_slices(c, TpPlan::parse(plan, source), tp, rank);
  std::vector<TpTensor> slices;
  for (const std::string& n : names) {
    const auto it =
        std::find_if(all.begin(), all.end(), [&](const TpTensor& t) { return t.info.name == n; });
    slices.push_back(*it);  // c.get() in check_ranges: every name is a tensor
  }
  const Leased l = lease_buffers(buffers, slices, "copy_tp_from");
  uint64_t copied = 0;
  GilReleased nogil;
  for (size_t i = 0; i < slices.size(); ++i) {
    copy_tp_slice(slices[i], m.data + offsets[i], l.dsts[i], threads);
    copied += slices[i].bytes;
  }
  return copied;
}

void bind_tp(py::module_& m) {
  m.def("_tp_slices", &tp_slices, py::arg("checkpoint"), py::arg("plan"), py::arg("source"),
        py::arg("tp"), py::arg("rank"),
        function_doc("_tp_slices(checkpoint: _Checkpoint, plan: str, source: str, tp: int, "
                     "rank: int) -> list[dict[str, Any]]",
                     "Rank `rank`'s slice of every tensor (the plan's JSON text)."));
  m.def("_tp_plan_slices", &slice_dicts, py::arg("checkpoint"), py::arg("plan"), py::arg("tp"),
        py::arg("rank"),
        function_doc("_tp_plan_slices(checkpoint: _Checkpoint, plan: TpPlan, tp: int, rank: "
                     "int) -> list[dict[str, Any]]",
                     "Rank `rank`'s slice of every tensor under a TpPlan."));
  m.def("_read_tp_into", &read_tp_into, py::arg("checkpoint"), py::arg("plan"), py::arg("source"),
        py::arg("tp"), py::arg("rank"), py::arg("buffers"), py::arg("threads") = 0,
        py::arg("chunk_bytes") = uint64_t{8} << 20, py::arg("direct") = false,
        py::arg("progress") = py::none(),
        function_doc("_read_tp_into(checkpoint: _Checkpoint, plan: str, source: str, tp: int, "
                     "rank: int, buffers: list[PinnedHostBuffer], threads: int = 0, "
                     "chunk_bytes: int = 8388608, direct: bool = False, progress: "
                     "Callable[[int, int], None] | None = None) -> dict[str, Any]",
                     "Reads only the rank's byte ranges into the buffers; the load report."));
  m.def("_read_whole_into", &read_whole_into, py::arg("checkpoint"), py::arg("names"),
        py::arg("memory"), py::arg("offsets"), py::arg("threads") = 0,
        py::arg("chunk_bytes") = uint64_t{8} << 20, py::arg("direct") = false,
        function_doc("_read_whole_into(checkpoint: _Checkpoint, names: list[str], memory: "
                     "Buffer, offsets: list[int], threads: int = 0, chunk_bytes: int = "
                     "8388608, direct: bool = False) -> dict[str, Any]",
                     "Reads whole tensors to offsets in a writable buffer; the load report."));
  m.def("_copy_tp_from", &copy_tp_from, py::arg("checkpoint"), py::arg("plan"), py::arg("source"),
        py::arg("tp"), py::arg("rank"), py::arg("names"), py::arg("memory"), py::arg("offsets"),
        py::arg("buffers"), py::arg("threads") = 0,
        function_doc("_copy_tp_from(checkpoint: _Checkpoint, plan: str, source: str, tp: int, "
                     "rank: int, names: list[str], memory: Buffer, offsets: list[int], buffers: "
                     "list[PinnedHostBuffer], threads: int = 0) -> int",
                     "Copies the rank's slices of whole tensors in memory into the buffers."));
  m.def(
      "xxh3_64",
      [](const py::object& data) {
        if (!PyObject_CheckBuffer(data.ptr()))  // pybind11's overload error names no argument
          throw Error(ErrorCode::invalid_argument,
                      "xxh3_64: data must be a buffer (bytes, bytearray, memoryview, a "
                      "contiguous NumPy array), got " +
                          std::string(Py_TYPE(data.ptr())->tp_name));
        const Memory m = memory_of(data.cast<py::buffer>(), false);
        GilReleased nogil;
        return xxh3_64(m.data, static_cast<size_t>(m.bytes));
      },
      py::arg("data"),
      function_doc("xxh3_64(data: Buffer) -> int",
                   "The xxh3-64 of a buffer's bytes (bytes, memoryview, a contiguous numpy "
                   "array): the hash a checkpoint's sidecar records per tensor."));
  m.def("default_thread_count", &default_thread_count,
        function_doc("default_thread_count() -> int",
                     "Threads a load uses by default (PINSTAGE_NUM_THREADS, else the usable "
                     "CPUs), fixed at its first use in the process."));
  m.def("usable_cpu_count", &usable_cpu_count,
        function_doc("usable_cpu_count() -> int", "CPUs in this process's affinity mask."));
}

// _Checkpoint's reads: into pinned buffers, to pinned addresses, onto a device.
void def_checkpoint_reads(py::class_<Checkpoint>& cls) {
  const auto progress = py::arg("progress") = py::none();
  const char* const progress_returns =
      "progress: Callable[[int, int], None] | None = None) -> dict[str, Any]";
  def_load(cls, "read_into", &read_into, std::make_tuple(py::arg("names"), py::arg("buffers")),
           progress,
           method_doc(load_signature("read_into(names: list[str], buffers: list[PinnedHostBuffer]",
                                     progress_returns),
                      "Reads the named tensors into the PinnedHostBuffers (of at least their "
                      "bytes) without the GIL; returns the load report."));
  def_load(cls, "read_into_pinned", &read_into_pinned,
           std::make_tuple(py::arg("names"), py::arg("addresses"), py::arg("worker"),
                           py::arg("who") = "read_into_pinned"),
           progress,
           method_doc(load_signature("read_into_pinned(names: list[str], addresses: list[int], "
                                     "worker: Worker, who: str = 'read_into_pinned'",
                                     progress_returns),
                      "Reads the named tensors to the addresses, each range inside one open "
                      "pinned buffer of worker and no two overlapping (checked before any "
                      "read), without the GIL; returns the load report. Errors name `who`."));
  def_load(cls, "load_pinned", &load_pinned,
           std::make_tuple(py::arg("worker"), py::arg("names"), py::arg("mode") = "copy"), progress,
           py::arg("cache") = "off",
           method_doc(load_signature("load_pinned(worker: Worker, names: list[str], mode: str = "
                                     "'copy'",
                                     "progress: Callable[[int, int], None] | None = None, "
                                     "cache: str = 'off') -> tuple[list[Any], dict[str, Any]]"),
                      "The one host load: the named tensors in the worker's pinned memory "
                      "(copy: PinnedHostBuffers, the pool reserved once) or as read-only views "
                      "of the pinned file mappings (map), from the cache's entry on a hit "
                      "(cache 'use' or 'fill'); and the load report."));
  def_load(
      cls, "load_to_device", &to_device, std::make_tuple(py::arg("worker")),
      py::arg("ring_bytes") = CheckpointLoadOptions{}.ring_bytes, py::arg("names") = py::none(),
      progress, py::arg("mode") = "copy", py::arg("cache") = "off",
      method_doc(
          load_signature("load_to_device(worker: Worker",
                         "ring_bytes: int = " + std::to_string(CheckpointLoadOptions{}.ring_bytes) +
                             ", names: list[str] | None = None, progress: "
                             "Callable[[int, int], None] | None = None, mode: str = "
                             "'copy', cache: str = 'off') -> _DeviceLoad"),
          "Streams every tensor (or those named) onto worker's device through its "
          "staging ring (copy), or uploads them from the pinned file mappings "
          "(map, or a cache hit)."));
  def_load(cls, "read_slice", &read_slice,
           std::make_tuple(py::arg("name"), py::arg("dims"), py::arg("buffer")), progress,
           method_doc(load_signature("read_slice(name: str, dims: list[tuple[int, int, int]], "
                                     "buffer: PinnedHostBuffer",
                                     progress_returns),
                      "Reads the slice (begin, count, step per dim) of tensor name into "
                      "buffer, packed row-major, asking the files for exactly its bytes, "
                      "without the GIL; returns the load report (bytes: the bytes read)."));
}

}  // namespace

void bind_checkpoint(py::module_& m) {
  py::class_<Checkpoint> cls(m, "_Checkpoint");
  cls.def(py::init([](const py::object& path, const std::string& who) {
            return Checkpoint::open(path_arg(path, who + "(): path"));
          }),
          py::arg("path"), py::arg("who") = "_Checkpoint",
          method_doc("__init__(path: str | os.PathLike[str], who: str = '_Checkpoint') -> None",
                     "Opens and validates a .safetensors file or a checkpoint directory; "
                     "errors about path name `who`, the public caller."))
      .def_property_readonly(
          "layout", [](const Checkpoint& c) { return checkpoint_layout_name(c.layout()); },
          "str: 'single_file', 'indexed_directory' or 'shard_directory'.")
      .def_property_readonly(
          "files",
          [](const Checkpoint& c) {
            return list_of(c.files(), [](const CheckpointFile& f) { return f.path; });
          },
          "list[str]: the shard files.")
      .def_property_readonly("total_bytes", &Checkpoint::total_bytes,
                             "int: the bytes of all tensors.")
      .def_property_readonly("sidecar_problem", &Checkpoint::sidecar_problem,
                             "str: why the hash sidecar was not used ('' when it was, or there "
                             "is none).")
      .def(
          "check_sidecar",
          [](const Checkpoint& c, bool verify) {
            CheckpointLoadOptions o;
            o.verify = verify;
            check_sidecar(c, o);
          },
          py::arg("verify"),
          method_doc("check_sidecar(verify: bool) -> None",
                     "Error (code 'io') naming sidecar_problem when verify and the sidecar "
                     "was not used."))
      .def(
          "keys",
          [](const Checkpoint& c) {
            return list_of(c.tensors(), [](const CheckpointTensor& t) { return t.name; });
          },
          method_doc("keys() -> list[str]"))
      .def(
          "metadata",
          [](const Checkpoint& c) {
            py::dict d;
            for (const auto& [k, v] : c.metadata()) d[py::str(k)] = v;
            return d;
          },
          method_doc("metadata() -> dict[str, str]"))
      .def(
          "info",
          [](const Checkpoint& c, const std::string& n) { return tensor_dict(c, c.get(n)); },
          py::arg("name"), method_doc("info(name: str) -> dict[str, Any]"))
      .def(
          "infos",
          [](const Checkpoint& c, const std::vector<std::string>& names) {
            py::list out;  // get() is the checkpoint's name index: O(1) a name
            for (const std::string& n : names) out.append(tensor_dict(c, c.get(n)));
            return out;
          },
          py::arg("names"), method_doc("infos(names: list[str]) -> list[dict[str, Any]]"));
  def_checkpoint_reads(cls);
  bind_device_load(m);
  bind_mapped(m);
  bind_tp(m);
}

}  // namespace pinstage::python
