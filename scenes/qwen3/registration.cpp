// The Qwen3 decode scene in the scene registry, and its execute step as the host callable
// "qwen3_decode". Both are registered when this library loads.
#include <climits>
#include <string>
#include <vector>

#include "pinstage/error.h"
#include "pinstage/qwen3/kernels.h"
#include "pinstage/qwen3/scene.h"
#include "pinstage/random.h"

namespace pinstage::qwen3 {
namespace {

struct GoldenResult : SceneGolden {
  explicit GoldenResult(Golden g) : golden(std::move(g)) {}
  Golden golden;
};

const Golden& golden_of(const SceneGolden& golden) {
  const auto* result = dynamic_cast<const GoldenResult*>(&golden);
  if (result == nullptr)
    throw Error(ErrorCode::invalid_argument,
                "qwen3-decode: the golden was not computed by this scene");
  return result->golden;
}

int narrow(int64_t value, const char* name) {
  if (value < INT_MIN || value > INT_MAX)
    throw Error(ErrorCode::invalid_argument, std::string("qwen3-decode: ") + name + " = " +
                                                 std::to_string(value) + " is out of range");
  return static_cast<int>(value);
}

SceneParam param(const char* name, const char* help, int64_t default_value) {
  SceneParam p;
  p.name = name;
  p.help = help;
  p.default_value = default_value;
  return p;
}

class Qwen3Scene final : public Scene {
 public:
  std::string name() const override { return kSceneName; }
  std::string description() const override {
    return "The Qwen3-14B decode scene: twenty arguments (1 GB per layer), paged KV cache";
  }
  std::vector<SceneParam> params() const override {
    SceneParam layers = param("layers", "Decoder layers (>= 1; 1 GB each)", kDefaultLayers);
    layers.size = true;
    layers.unit = "layer";
    layers.size_max = kDefaultLayers;
    layers.size_max_note = "the whole model";
    layers.scene_default = 2;  // 40 layers would hold 80 GB of host memory on sim
    return {layers, param("seq_len", "Tokens in the KV cache per lane, [1, 5500]", kDefaultSeqLen),
            param("seed", "Random seed", static_cast<int64_t>(kDefaultSeed))};
  }
  void validate(const SceneValues& values) const override { qwen3::validate(config_of(values)); }
  std::vector<SceneTensor> tensors(const SceneValues& values) const override {
    std::vector<SceneTensor> out;
    for (const TensorSpec& s : tensor_specs(config_of(values)))
      out.push_back({s.name, s.dtype, s.shape, s.dir, s.nbytes});
    return out;
  }
  TaskArgs make_args(HostAllocator& allocator, const SceneValues& values,
                     int threads) const override {
    return qwen3::make_args(allocator, config_of(values, threads));
  }
  std::unique_ptr<SceneGolden> compute_golden(const TaskArgs& args,
                                              const SceneValues& values) const override {
    return std::make_unique<GoldenResult>(qwen3::compute_golden(args, config_of(values).n_layers));
  }
  Comparison compare(const TaskArgs& result, const SceneGolden& golden) const override {
    return qwen3::compare(result, golden_of(golden));
  }
  std::string callable() const override { return kCallable; }
  uint64_t save_golden(const SceneGolden& golden, const std::string& path) const override {
    return qwen3::save_golden(golden_of(golden), path);
  }
  std::unique_ptr<RoundReset> round_reset(const TaskArgs& args,
                                          const SceneValues& values) const override {
    return std::make_unique<CacheRestorer>(args, config_of(values).n_layers);
  }
  std::string generator() const override {
    return std::string(pinstage::gen_isa_name(pinstage::gen_isa_default())) + " generator";
  }
  void validate_steps(const SceneValues& values, int steps) const override {
    qwen3::validate_steps(config_of(values), steps);
  }
  std::vector<std::string> advance(const TaskArgs& args, const SceneValues& values,
                                   int step) const override {
    return advance_step(args, config_of(values), step);
  }
  std::vector<std::pair<std::string, std::string>> device_feeds(const SceneValues&) const override {
    return {{"out", "hidden_states"}};  // the contract: hidden_states of step s = out of s - 1
  }
  std::vector<ByteRange> written_ranges(const TaskArgs& args,
                                        const SceneValues& values) const override {
    return qwen3::written_ranges(args, config_of(values).n_layers);
  }
  std::string describe(const SceneValues& values) const override {
    const Config c = config_of(values);
    return std::to_string(c.n_layers) + " layer" + (c.n_layers == 1 ? "" : "s") + ", seq_len " +
           std::to_string(c.seq_len) + ", seed " + std::to_string(c.seed);
  }
};

const SceneRegistrar registrar([] {
  register_host_callable(kCallable, execute_decode);
  register_scene(std::make_shared<Qwen3Scene>());
});

}  // namespace

std::shared_ptr<const Scene> scene() { return find_scene(kSceneName); }

SceneValues scene_values(const Config& config) {
  return {{"layers", config.n_layers},
          {"seq_len", config.seq_len},
          {"seed", static_cast<int64_t>(config.seed)}};
}

Config config_of(const SceneValues& values, int threads) {
  Config config;
  auto take = [&](const char* name, int64_t fallback) {
    const auto it = values.find(name);
    return it == values.end() ? fallback : it->second;
  };
  config.n_layers = narrow(take("layers", kDefaultLayers), "n_layers");
  config.seq_len = narrow(take("seq_len", kDefaultSeqLen), "seq_len");
  const int64_t seed = take("seed", static_cast<int64_t>(kDefaultSeed));
  if (seed < 0)
    throw Error(ErrorCode::invalid_argument,
                "qwen3-decode: seed is " + std::to_string(seed) + "; it must be >= 0");
  config.seed = static_cast<uint64_t>(seed);
  config.threads = threads;
  return config;
}

void execute_decode(std::span<const ExecArg> args) {
  std::vector<DecodeArg> bound;
  bound.reserve(args.size());
  for (const ExecArg& a : args) bound.push_back({a.name, a.device_ptr, a.bytes});
  int n_layers = 0;
  const DecodeBuffers buffers = decode_buffers(bound, &n_layers);
  // The portable kernels, not the golden's: the comparison then checks the arithmetic of
  // a second kernel set as well as every byte's trip to the device and back.
  kernels::run_decode_with(buffers, n_layers, /*write_cache=*/true, nullptr, kernels::Isa::generic,
                           0);
}

}  // namespace pinstage::qwen3
