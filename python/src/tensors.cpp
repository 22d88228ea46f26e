// TaskArgs, Binder and the Qwen3 decode scene (fixture, golden, comparison) for Python.
// Task args made by the fixture in a worker's pinned memory are a ViewHolder of that
// worker: their zero-copy torch tensors count as views (Note [Python view lifetime] in
// worker.cpp), and using them after the worker is finalized is Error(finalized).
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <climits>
#include <optional>

#include "common.h"
#include "pinstage/bind.h"
#include "pinstage/qwen3_decode.h"
#include "pinstage/qwen3_golden.h"
#include "pinstage/tensor.h"

namespace pinstage::python {

namespace {

// Task args as Python holds them.
struct PyArgs : ViewHolder {
  PyArgs() = default;
  PyArgs(TaskArgs args_, py::object worker_obj_, PyWorker* worker_)
      : args(std::move(args_)), worker_obj(std::move(worker_obj_)), worker(worker_) {
    if (worker != nullptr) worker->holders.insert(this);
  }
  ~PyArgs() override {
    if (worker != nullptr) worker->holders.erase(this);
  }

  // Error(finalized) when the args live in the pinned memory of a finalized worker.
  void require_usable(const std::string& what) const {
    if (worker != nullptr && !worker->worker.initialized())
      throw Error(ErrorCode::finalized,
                  what +
                      ": these task args were generated in the pinned memory of a worker that "
                      "has since been finalized; generate them again on a live worker");
  }

  TaskArgs args;
  py::object worker_obj = py::none();  // keeps the worker alive while these args live
  PyWorker* worker = nullptr;          // whose pinned memory the fixture wrote into, or null
};

// Counts a call that reads a worker's pinned memory without the GIL: construct it before
// releasing the GIL, so it is destroyed after the GIL is back.
class Busy {
 public:
  explicit Busy(PyWorker* worker) : worker_(worker) {
    if (worker_ != nullptr) ++worker_->busy;
  }
  ~Busy() {
    if (worker_ != nullptr) --worker_->busy;
  }
  Busy(const Busy&) = delete;
  Busy& operator=(const Busy&) = delete;

 private:
  PyWorker* worker_;
};

// Keeps a Python object alive from C++ (a Storage owner); takes the GIL to let it go.
std::shared_ptr<void> python_owner(py::object object) {
  return std::shared_ptr<void>(new py::object(std::move(object)), [](void* p) {
    if (!interpreter_usable()) return;  // shutdown: leave it
    const PyGILState_STATE gil = PyGILState_Ensure();
    delete static_cast<py::object*>(p);
    PyGILState_Release(gil);
  });
}

DLDataType dl_dtype(DType dtype) {
  switch (dtype) {
    case DType::bf16:
      return {kDLBfloat, 16, 1};
    case DType::f16:
      return {kDLFloat, 16, 1};
    case DType::f32:
      return {kDLFloat, 32, 1};
    case DType::i32:
      return {kDLInt, 32, 1};
    case DType::i64:
      return {kDLInt, 64, 1};
  }
  throw Error(ErrorCode::internal, "unknown dtype");
}

std::optional<DType> dtype_from_torch(const std::string& name) {
  if (name == "torch.bfloat16") return DType::bf16;
  if (name == "torch.float16") return DType::f16;
  if (name == "torch.float32") return DType::f32;
  if (name == "torch.int32") return DType::i32;
  if (name == "torch.int64") return DType::i64;
  return std::nullopt;
}

py::object torch_module() { return py::module_::import("torch"); }

// The Worker behind `obj`, or TypeError naming the caller.
PyWorker& as_worker(const py::object& obj, const char* who) {
  if (!py::isinstance<PyWorker>(obj))
    throw py::type_error(std::string(who) + " needs a pinstage.Worker, got " +
                         py::type::of(obj).attr("__name__").cast<std::string>());
  return obj.cast<PyWorker&>();
}

void add_tensor(PyArgs& a, const std::string& name, const py::object& tensor,
                const std::string& direction) {
  const std::optional<Direction> dir = parse_direction(direction);
  if (!dir)
    throw Error(ErrorCode::invalid_argument,
                "unknown direction '" + direction + "' (valid: 'in', 'inout', 'out')");
  py::object torch = torch_module();
  if (!py::isinstance(tensor, torch.attr("Tensor")))
    throw py::type_error("TaskArgs.add: '" + name + "' must be a torch.Tensor, got " +
                         py::type::of(tensor).attr("__name__").cast<std::string>());
  const auto device = tensor.attr("device").attr("type").cast<std::string>();
  if (device != "cpu")
    throw Error(ErrorCode::invalid_argument,
                "TaskArgs.add: '" + name + "' is on device '" + device +
                    "'; host tensors only (use .cpu(), or PinnedTorchAllocator.copy())");
  if (!tensor.attr("is_contiguous")().cast<bool>())
    throw Error(ErrorCode::invalid_argument,
                "TaskArgs.add: '" + name + "' is not contiguous; pass tensor.contiguous()");
  const auto dtype_name = py::str(tensor.attr("dtype")).cast<std::string>();
  const auto dtype = dtype_from_torch(dtype_name);
  if (!dtype)
    throw Error(ErrorCode::invalid_argument,
                "TaskArgs.add: '" + name + "' has dtype " + dtype_name +
                    "; supported: bfloat16, float16, float32, int32, int64");
  std::vector<int64_t> shape;
  for (auto d : tensor.attr("shape")) shape.push_back(d.cast<int64_t>());
  const auto address = tensor.attr("data_ptr")().cast<uintptr_t>();
  const auto nbytes =
      tensor.attr("numel")().cast<uint64_t>() * tensor.attr("element_size")().cast<uint64_t>();
  void* data = nbytes == 0 ? nullptr : reinterpret_cast<void*>(address);
  const bool pinned = nbytes > 0 && find_pinned(data, nbytes) != nullptr;
  // The storage holds the tensor itself: a pinned tensor's DLPack view stays counted (its
  // worker's finalize() refuses) for as long as these args hold it.
  auto storage = std::make_shared<Storage>(data, nbytes, pinned, python_owner(tensor));
  a.args.add(Tensor(name, *dtype, std::move(shape), *dir, std::move(storage)));
}

py::object tensor_view(py::object self, const std::string& name) {
  auto& a = self.cast<PyArgs&>();
  a.require_usable("TaskArgs['" + name + "']");
  const Tensor* t = a.args.find(name);
  if (t == nullptr) throw py::key_error("no tensor named '" + name + "' in these task args");
  py::object torch = torch_module();
  return torch.attr("from_dlpack")(
      export_dlpack(self, &a, t->data(), dl_dtype(t->dtype()), t->shape(), DLDevice{kDLCPU, 0}));
}

py::dict describe_tensor(const Tensor& t) {
  py::dict d;
  d["name"] = t.name();
  d["dtype"] = dtype_name(t.dtype());
  d["shape"] = py::tuple(py::cast(t.shape()));
  d["direction"] = direction_name(t.direction());
  d["nbytes"] = t.nbytes();
  d["pinned"] = t.pinned();
  return d;
}

// ---- Binder ----

// A Binder in Python. Registered with its worker, whose finalize() releases the C++
// Binder (staging ring, stream) first; run() afterwards is Error(finalized).
struct PyBinder {
  PyBinder(py::object worker_obj_, PyWorker* worker_, std::unique_ptr<Binder> binder_)
      : worker_obj(std::move(worker_obj_)), worker(worker_), binder(std::move(binder_)) {
    worker->binders.insert(&binder);
  }
  ~PyBinder() {
    binder.reset();
    worker->binders.erase(&binder);
  }
  PyBinder(const PyBinder&) = delete;
  PyBinder& operator=(const PyBinder&) = delete;

  Binder& get(const char* what) const {
    if (!binder)
      throw Error(ErrorCode::finalized,
                  std::string(what) +
                      ": the binder's worker was finalized; create and init a new Worker and "
                      "Binder");
    return *binder;
  }

  py::object worker_obj;  // keeps the worker alive for the Binder's life
  PyWorker* worker;
  std::unique_ptr<Binder> binder;
};

size_t size_option(int64_t value, const char* name) {
  if (value < 0)
    throw Error(ErrorCode::invalid_argument, std::string("Binder option ") + name +
                                                 " must be >= 0, got " + std::to_string(value));
  return static_cast<size_t>(value);
}

}  // namespace

BindOptions make_bind_options(const std::string& layout, const std::string& upload,
                              const std::string& execute, int64_t staging_buffers,
                              int64_t staging_buffer_bytes, int64_t chunk_bytes,
                              int64_t arena_alignment, bool verify_upload, int64_t copy_threads) {
  BindOptions options;
  options.layout = parse_device_layout(layout);
  options.upload = parse_upload_path(upload);
  options.execute_callable = execute;
  options.staging_buffers = size_option(staging_buffers, "staging_buffers");
  options.staging_buffer_bytes = size_option(staging_buffer_bytes, "staging_buffer_bytes");
  options.chunk_bytes = size_option(chunk_bytes, "chunk_bytes");
  options.arena_alignment = size_option(arena_alignment, "arena_alignment");
  options.verify_upload = verify_upload;
  if (copy_threads < 0 || copy_threads > INT_MAX)
    throw Error(ErrorCode::invalid_argument,
                "Binder option copy_threads must be >= 0, got " + std::to_string(copy_threads));
  options.copy_threads = static_cast<int>(copy_threads);
  return options;
}

qwen3::Config make_config(int64_t layers, int64_t seq_len, int64_t seed, int64_t threads) {
  auto narrow = [](int64_t v, const char* name) {
    if (v < INT_MIN || v > INT_MAX)
      throw Error(ErrorCode::invalid_argument,
                  std::string(name) + " = " + std::to_string(v) + " is out of range");
    return static_cast<int>(v);
  };
  if (seed < 0)
    throw Error(ErrorCode::invalid_argument, "seed must be >= 0, got " + std::to_string(seed));
  qwen3::Config config;
  config.n_layers = narrow(layers, "layers");
  config.seq_len = narrow(seq_len, "seq_len");
  config.seed = static_cast<uint64_t>(seed);
  config.threads = narrow(threads, "threads");
  qwen3::validate(config);
  return config;
}

namespace {

// ---- qwen3 ----

const char* fill_name(qwen3::Fill fill) {
  switch (fill) {
    case qwen3::Fill::normal:
      return "normal";
    case qwen3::Fill::seq_lens:
      return "seq_lens";
    case qwen3::Fill::block_table:
      return "block_table";
    case qwen3::Fill::slot_mapping:
      return "slot_mapping";
    case qwen3::Fill::rope_cos:
      return "rope_cos";
    case qwen3::Fill::rope_sin:
      return "rope_sin";
    case qwen3::Fill::zeros:
      return "zeros";
  }
  return "unknown";
}

void bind_qwen3(py::module_& parent) {
  auto m = parent.def_submodule("qwen3", "The Qwen3-14B decode scene: fixture and golden.");
  m.attr("NUM_HEADS") = qwen3::kNumHeads;
  m.attr("NUM_KV_HEADS") = qwen3::kNumKvHeads;
  m.attr("HEAD_DIM") = qwen3::kHeadDim;
  m.attr("HIDDEN") = qwen3::kHidden;
  m.attr("INTERMEDIATE") = qwen3::kIntermediate;
  m.attr("BATCH") = qwen3::kBatch;
  m.attr("MAX_SEQ") = qwen3::kMaxSeq;
  m.attr("BLOCK_SIZE") = qwen3::kBlockSize;
  m.attr("CACHE_ROWS") = qwen3::kCacheRows;
  m.attr("DEFAULT_LAYERS") = qwen3::kDefaultLayers;
  m.attr("DEFAULT_SEQ_LEN") = qwen3::kDefaultSeqLen;
  m.attr("DEFAULT_SEED") = qwen3::kDefaultSeed;
  m.attr("RTOL") = qwen3::kRtol;
  m.attr("ATOL") = qwen3::kAtol;

  m.def(
      "validate",
      [](int64_t layers, int64_t seq_len, int64_t seed) { make_config(layers, seq_len, seed, 0); },
      py::arg("layers") = qwen3::kDefaultLayers, py::arg("seq_len") = qwen3::kDefaultSeqLen,
      py::arg("seed") = qwen3::kDefaultSeed);

  m.def(
      "tensor_specs",
      [](int64_t layers, int64_t seq_len, int64_t seed) {
        py::list out;
        for (const auto& s : qwen3::tensor_specs(make_config(layers, seq_len, seed, 0))) {
          py::dict d;
          d["name"] = s.name;
          d["dtype"] = dtype_name(s.dtype);
          d["shape"] = py::tuple(py::cast(s.shape));
          d["direction"] = direction_name(s.dir);
          d["fill"] = fill_name(s.fill);
          d["std"] = s.std;
          d["bias"] = s.bias;
          d["layers"] = s.layers;
          d["nbytes"] = s.nbytes;
          out.append(d);
        }
        return out;
      },
      py::arg("layers") = qwen3::kDefaultLayers, py::arg("seq_len") = qwen3::kDefaultSeqLen,
      py::arg("seed") = qwen3::kDefaultSeed);

  m.def(
      "sizes",
      [](int64_t layers, int64_t seq_len, int64_t seed) {
        const auto s = qwen3::sizes(make_config(layers, seq_len, seed, 0));
        py::dict d;
        d["tensors"] = s.tensors;
        d["staged_tensors"] = s.staged_tensors;
        d["total_bytes"] = s.total_bytes;
        d["staged_bytes"] = s.staged_bytes;
        return d;
      },
      py::arg("layers") = qwen3::kDefaultLayers, py::arg("seq_len") = qwen3::kDefaultSeqLen,
      py::arg("seed") = qwen3::kDefaultSeed);

  m.def(
      "make_args",
      [](int64_t layers, int64_t seq_len, int64_t seed, int64_t threads, py::object worker_obj) {
        const auto config = make_config(layers, seq_len, seed, threads);
        if (worker_obj.is_none()) {
          PageableAllocator allocator;
          TaskArgs args;
          {
            py::gil_scoped_release nogil;
            args = qwen3::make_args(allocator, config);
          }
          return std::make_unique<PyArgs>(std::move(args), py::none(), nullptr);
        }
        auto& w = as_worker(worker_obj, "make_args");
        PinnedAllocator allocator(w.worker);  // the chip-worker guard
        TaskArgs args;
        {
          py::gil_scoped_release nogil;
          args = qwen3::make_args(allocator, config);
        }
        return std::make_unique<PyArgs>(std::move(args), worker_obj, &w);
      },
      py::arg("layers") = qwen3::kDefaultLayers, py::arg("seq_len") = qwen3::kDefaultSeqLen,
      py::arg("seed") = qwen3::kDefaultSeed, py::arg("threads") = 0,
      py::arg("worker") = py::none());

  py::class_<qwen3::Golden>(m, "Golden", "The reference decode's result for one set of args.")
      .def_readonly("layers", &qwen3::Golden::n_layers)
      .def_property_readonly("out_bits",
                             [](const qwen3::Golden& g) {
                               py::array_t<uint16_t> a({qwen3::kBatch, qwen3::kHidden});
                               std::copy(g.out.begin(), g.out.end(), a.mutable_data());
                               return a;
                             })
      .def_property_readonly("kv_rows", [](const qwen3::Golden& g) { return g.kv_rows.size(); })
      .def("__repr__", [](const qwen3::Golden& g) {
        return "<pinstage.qwen3.Golden layers=" + std::to_string(g.n_layers) +
               " kv_rows=" + std::to_string(g.kv_rows.size()) + ">";
      });

  py::class_<qwen3::TensorComparison>(m, "TensorComparison", "One tensor against the golden.")
      .def_readonly("tensor", &qwen3::TensorComparison::tensor)
      .def_readonly("checked", &qwen3::TensorComparison::checked)
      .def_readonly("mismatches", &qwen3::TensorComparison::mismatches)
      .def_readonly("differing", &qwen3::TensorComparison::differing)
      .def_readonly("worst_index", &qwen3::TensorComparison::worst_index)
      .def_readonly("worst_actual", &qwen3::TensorComparison::worst_actual)
      .def_readonly("worst_expected", &qwen3::TensorComparison::worst_expected)
      .def_readonly("worst_diff", &qwen3::TensorComparison::worst_diff)
      .def_property_readonly("ok", &qwen3::TensorComparison::ok)
      .def("message", &qwen3::TensorComparison::message)
      .def("__repr__", &qwen3::TensorComparison::message);

  py::class_<qwen3::Comparison>(m, "Comparison", "A run's outputs against the golden.")
      .def_readonly("ok", &qwen3::Comparison::ok)
      .def_readonly("tensor", &qwen3::Comparison::tensor)
      .def_readonly("mismatches", &qwen3::Comparison::mismatches)
      .def_readonly("worst_index", &qwen3::Comparison::worst_index)
      .def_readonly("worst_actual", &qwen3::Comparison::worst_actual)
      .def_readonly("worst_expected", &qwen3::Comparison::worst_expected)
      .def_readonly("worst_diff", &qwen3::Comparison::worst_diff)
      .def_readonly("tensors", &qwen3::Comparison::tensors)
      .def("message", &qwen3::Comparison::message)
      .def("__bool__", [](const qwen3::Comparison& c) { return c.ok; })
      .def("__repr__", &qwen3::Comparison::message);

  m.def(
      "compute_golden",
      [](const PyArgs& a, int64_t layers) {
        a.require_usable("compute_golden");
        if (layers < 1 || layers > INT_MAX)
          throw Error(ErrorCode::invalid_argument,
                      "compute_golden: layers must be >= 1, got " + std::to_string(layers));
        Busy busy(a.worker);
        py::gil_scoped_release nogil;
        return qwen3::compute_golden(a.args, static_cast<int>(layers));
      },
      py::arg("args"), py::arg("layers"));

  m.def(
      "compare",
      [](const PyArgs& a, const qwen3::Golden& golden) {
        a.require_usable("compare");
        Busy busy(a.worker);
        py::gil_scoped_release nogil;
        return qwen3::compare(a.args, golden);
      },
      py::arg("result"), py::arg("golden"));

  bind_scene_run(m);
}

}  // namespace

void bind_tensors(py::module_& m) {
  py::class_<PyArgs>(m, "TaskArgs", "The ordered, named arguments of one task.")
      .def(py::init<>())
      .def("add", &add_tensor, py::arg("name"), py::arg("tensor"), py::arg("direction") = "in")
      .def("__getitem__", &tensor_view, py::arg("name"))
      .def("__getattr__",
           [](py::object self, const std::string& name) -> py::object {
             if (self.cast<PyArgs&>().args.find(name) == nullptr)
               throw py::attribute_error("TaskArgs has no tensor or attribute '" + name + "'");
             return tensor_view(self, name);
           })
      .def("__contains__",
           [](const PyArgs& a, const std::string& name) { return a.args.find(name) != nullptr; })
      .def("__len__", [](const PyArgs& a) { return a.args.size(); })
      .def_property_readonly("names",
                             [](const PyArgs& a) {
                               std::vector<std::string> names;
                               for (const auto& t : a.args) names.push_back(t.name());
                               return names;
                             })
      .def("describe",
           [](const PyArgs& a) {
             py::list out;
             for (const auto& t : a.args) out.append(describe_tensor(t));
             return out;
           })
      .def_property_readonly("total_bytes", [](const PyArgs& a) { return a.args.total_bytes(); })
      .def_property_readonly("staged_bytes", [](const PyArgs& a) { return a.args.staged_bytes(); })
      .def_property_readonly("staged_count", [](const PyArgs& a) { return a.args.staged_count(); })
      .def_property_readonly("worker", [](const PyArgs& a) { return a.worker_obj; })
      .def_property_readonly("live_views", [](const PyArgs& a) { return a.views; })
      .def("summary", [](const PyArgs& a) { return a.args.summary(); })
      .def("__repr__",
           [](const PyArgs& a) { return "<pinstage.TaskArgs " + a.args.summary() + ">"; });

  py::class_<TensorBindReport>(m, "TensorBindReport", "One tensor's part in a bind.")
      .def_readonly("name", &TensorBindReport::name)
      .def_property_readonly("direction",
                             [](const TensorBindReport& r) { return direction_name(r.direction); })
      .def_readonly("pinned", &TensorBindReport::pinned)
      .def_property_readonly("path",
                             [](const TensorBindReport& r) { return upload_path_name(r.path); })
      .def_readonly("bytes", &TensorBindReport::bytes)
      .def_readonly("device_offset", &TensorBindReport::device_offset)
      .def_readonly("upload_seconds", &TensorBindReport::upload_seconds)
      .def_readonly("download_seconds", &TensorBindReport::download_seconds)
      .def_property_readonly("upload_gbps", &TensorBindReport::upload_gbps)
      .def_property_readonly("download_gbps", &TensorBindReport::download_gbps)
      .def("__repr__", [](const TensorBindReport& r) {
        return "<pinstage.TensorBindReport " + r.name + " " + std::to_string(r.bytes) + " bytes>";
      });

  py::class_<BindReport>(m, "BindReport", "What one Binder.run did and how long each part took.")
      .def_property_readonly("phase_seconds",
                             [](const BindReport& r) {
                               py::dict d;
                               for (size_t p = 0; p < kBindPhaseCount; ++p)
                                 d[bind_phase_name(static_cast<BindPhase>(p))] = r.phase_seconds[p];
                               return d;
                             })
      .def_readonly("total_seconds", &BindReport::total_seconds)
      .def_readonly("tensors", &BindReport::tensors)
      .def_property_readonly("layout",
                             [](const BindReport& r) { return device_layout_name(r.layout); })
      .def_readonly("device_bytes", &BindReport::device_bytes)
      .def_readonly("device_allocations", &BindReport::device_allocations)
      .def_readonly("uploaded_count", &BindReport::uploaded_count)
      .def_readonly("uploaded_bytes", &BindReport::uploaded_bytes)
      .def_readonly("downloaded_count", &BindReport::downloaded_count)
      .def_readonly("downloaded_bytes", &BindReport::downloaded_bytes)
      .def_readonly("ring_count", &BindReport::ring_count)
      .def_readonly("ring_bytes", &BindReport::ring_bytes)
      .def_readonly("executed", &BindReport::executed)
      .def_property_readonly("upload_gbps", &BindReport::upload_gbps)
      .def_property_readonly("download_gbps", &BindReport::download_gbps)
      .def("summary", &BindReport::summary)
      .def("__str__", &BindReport::to_string)
      .def("__repr__",
           [](const BindReport& r) { return "<pinstage.BindReport " + r.summary() + ">"; });

  py::class_<PyBinder>(m, "Binder", "Binds TaskArgs on one chip-level Worker.")
      .def(py::init([](py::object worker_obj, const std::string& layout, const std::string& upload,
                       const std::optional<std::string>& execute, int64_t staging_buffers,
                       int64_t staging_buffer_bytes, int64_t chunk_bytes, int64_t arena_alignment,
                       bool verify_upload, int64_t copy_threads) {
             auto& w = as_worker(worker_obj, "Binder");
             const BindOptions options = make_bind_options(
                 layout, upload, execute.value_or(""), staging_buffers, staging_buffer_bytes,
                 chunk_bytes, arena_alignment, verify_upload, copy_threads);
             auto binder = std::make_unique<Binder>(w.worker, options);
             return std::make_unique<PyBinder>(worker_obj, &w, std::move(binder));
           }),
           // The defaults are the C++ BindOptions' own.
           py::arg("worker"), py::kw_only(),
           py::arg("layout") = device_layout_name(BindOptions{}.layout),
           py::arg("upload") = upload_path_name(BindOptions{}.upload),
           py::arg("execute") = py::none(),
           py::arg("staging_buffers") = static_cast<int64_t>(BindOptions{}.staging_buffers),
           py::arg("staging_buffer_bytes") =
               static_cast<int64_t>(BindOptions{}.staging_buffer_bytes),
           py::arg("chunk_bytes") = static_cast<int64_t>(BindOptions{}.chunk_bytes),
           py::arg("arena_alignment") = static_cast<int64_t>(BindOptions{}.arena_alignment),
           py::arg("verify_upload") = BindOptions{}.verify_upload,
           py::arg("copy_threads") = static_cast<int64_t>(BindOptions{}.copy_threads))
      .def(
          "run",
          [](PyBinder& b, const PyArgs& a) {
            a.require_usable("Binder.run");
            Binder& binder = b.get("Binder.run");
            Busy args_busy(a.worker);
            Busy worker_busy(b.worker);
            py::gil_scoped_release nogil;
            return binder.run(a.args);
          },
          py::arg("args"))
      .def_property_readonly("worker", [](const PyBinder& b) { return b.worker_obj; })
      .def_property_readonly("staging_bytes", [](const PyBinder& b) {
        return b.binder ? b.binder->staging_bytes() : 0;
      });

  bind_qwen3(m);
}

}  // namespace pinstage::python
