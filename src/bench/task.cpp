// Bench tasks: a registered scene, and the synthetic task (K tensors of N bytes).
#include <cstring>
#include <limits>
#include <string>

#include "bench/refuse.h"
#include "pinstage/ab_bench.h"
#include "pinstage/parallel.h"

namespace pinstage::ab {

namespace {

constexpr int64_t kMaxSyntheticTensors = 65536;

}  // namespace

BenchTask scene_task(const Scene& scene, const SceneValues& values) {
  BenchTask task;
  task.name = scene.name();
  if (const auto knob = size_param(scene)) task.size = *knob;
  SceneValues base = values;
  if (!task.size.name.empty()) base[task.size.name] = 1;  // the plan chooses it
  base = resolve_params(scene, base);                     // refuses bad values now
  for (const auto& [name, value] : base)
    if (name != task.size.name) task.params[name] = value;
  const std::string knob = task.size.name;
  auto at = [base, knob](int64_t size) {
    SceneValues v = base;
    if (!knob.empty()) v[knob] = size;
    return v;
  };
  const Scene* s = &scene;  // registered scenes live for the process
  task.sizes = [s, at](int64_t size) { return task_sizes(s->tensors(at(size))); };
  task.make_args = [s, at](HostAllocator& allocator, int64_t size) {
    return s->make_args(allocator, at(size), 0);
  };
  task.describe = [s, at](int64_t size) { return s->describe(at(size)); };
  return task;
}

BenchTask synthetic_task(int64_t tensors, uint64_t bytes) {
  if (tensors < 1 || tensors > kMaxSyntheticTensors)
    detail::refuse_number("synthetic: --tensors", tensors,
                          "it must be in [1, " + std::to_string(kMaxSyntheticTensors) + "]");
  if (bytes == 0 || bytes % 4 != 0)
    detail::refuse_number("synthetic: --bytes", bytes,
                          "it must be a positive multiple of 4 (the tensors are i32)");
  if (bytes > std::numeric_limits<uint64_t>::max() / 2 / static_cast<uint64_t>(tensors))
    throw Error(ErrorCode::invalid_argument, "synthetic: --tensors x --bytes overflows");
  BenchTask task;
  task.name = "synthetic";
  task.params = {{"tensors", tensors}, {"bytes", static_cast<int64_t>(bytes)}};
  task.sizes = [tensors, bytes](int64_t) {
    TaskSizes s;
    s.tensors = s.input_tensors = static_cast<size_t>(tensors);
    s.total_bytes = s.input_bytes = bytes * static_cast<uint64_t>(tensors);
    return s;
  };
  task.make_args = [tensors, bytes](HostAllocator& allocator, int64_t) {
    TaskArgs args;
    for (int64_t k = 0; k < tensors; ++k) {
      Tensor t = Tensor::empty("t" + std::to_string(k), DType::i32,
                               {static_cast<int64_t>(bytes / 4)}, Direction::in, allocator);
      // Written, as generated args are: every page resident before the first bind.
      auto* data = static_cast<unsigned char*>(t.data());
      parallel_for(bytes, size_t{1} << 20, [&](size_t begin, size_t end) {
        std::memset(data + begin, static_cast<int>(0x5a + k), end - begin);
      });
      args.add(std::move(t));
    }
    return args;
  };
  task.describe = [tensors, bytes](int64_t) {
    return std::to_string(tensors) + " tensor" + (tensors == 1 ? "" : "s") + " x " +
           format_thousands(bytes) + " bytes";
  };
  return task;
}

}  // namespace pinstage::ab
