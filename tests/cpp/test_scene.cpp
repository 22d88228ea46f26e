// The scene registry and the scene run end to end on sim: it passes on 1 and 2 layers with
// either storage, a single corrupted byte in a weight or in the KV pool is caught and named
// by the upload check, and a corrupted upload that skips that check still fails the
// comparison (the execute step runs other kernels than the golden, within the tolerance).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "pinstage/bind.h"
#include "pinstage/qwen3/scene.h"

namespace pinstage::qwen3 {
namespace {

// The message validate() gives for `options`, or "" when it passes.
std::string test_error(const SceneRunOptions& options) {
  try {
    pinstage::validate(*scene(), options);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

SceneOptions small(int layers, HostStorage storage) {
  SceneOptions options;
  options.config.n_layers = layers;
  options.config.seq_len = 129;  // two KV pages, the second holding the current token
  options.storage = storage;
  return options;
}

class ScenePasses : public ::testing::TestWithParam<std::tuple<int, HostStorage>> {};

TEST_P(ScenePasses, EveryRoundMatchesTheGolden) {
  const auto [layers, storage] = GetParam();
  Worker worker;
  worker.init("sim");
  SceneOptions options = small(layers, storage);
  options.rounds = layers == 1 ? 2 : 1;  // a second round proves the restore between rounds
  int seen = 0;
  const SceneReport report = run_scene(worker, options, [&](const SceneRound&) { ++seen; });
  ASSERT_EQ(report.rounds.size(), static_cast<size_t>(options.rounds));
  EXPECT_EQ(seen, options.rounds);
  for (const SceneRound& round : report.rounds) {
    EXPECT_TRUE(round.ok()) << round.failure;
    ASSERT_TRUE(round.comparison.has_value());
    EXPECT_TRUE(round.comparison->ok) << round.comparison->message();
    EXPECT_TRUE(round.caches_intact);
    EXPECT_TRUE(round.bind.executed);
    EXPECT_EQ(round.bind.uploaded_bytes, sizes(options.config).input_bytes);
  }
  EXPECT_TRUE(report.ok());
  EXPECT_EQ(report.storage, host_storage_name(storage));
  const WorkerStats stats = worker.stats();
  EXPECT_EQ(stats.device_count, 0u);  // the binder released every device allocation
}

INSTANTIATE_TEST_SUITE_P(LayersAndStorage, ScenePasses,
                         ::testing::Combine(::testing::Values(1, 2),
                                            ::testing::Values(HostStorage::pageable,
                                                              HostStorage::pinned)));

// The 1-based index of the first upload copy of `tensor` (direct path, default chunks).
uint64_t first_copy_of(const std::string& tensor, const Config& config) {
  const uint64_t chunk = BindOptions{}.chunk_bytes;
  uint64_t copies = 0;
  for (const TensorSpec& spec : tensor_specs(config)) {
    if (spec.name == tensor) return copies + 1;
    if (spec.dir != Direction::out) copies += (spec.nbytes + chunk - 1) / chunk;
  }
  ADD_FAILURE() << "no tensor " << tensor;
  return 0;
}

class SceneCatchesCorruption : public ::testing::TestWithParam<const char*> {};

TEST_P(SceneCatchesCorruption, OneFlippedByteFailsTheRunAndNamesTheTensor) {
  const std::string tensor = GetParam();
  Worker worker;
  worker.init("sim");
  const SceneOptions options = small(1, HostStorage::pinned);
  worker.inject_fault(FaultKind::corrupt_h2d, first_copy_of(tensor, options.config));
  const SceneReport report = run_scene(worker, options);
  ASSERT_EQ(report.rounds.size(), 1u);
  EXPECT_FALSE(report.ok());
  const std::string& failure = report.rounds[0].failure;
  EXPECT_NE(failure.find("tensor '" + tensor + "'"), std::string::npos) << failure;
  EXPECT_NE(failure.find("upload was corrupted"), std::string::npos) << failure;
  EXPECT_EQ(worker.stats().device_count, 0u);
}

INSTANTIATE_TEST_SUITE_P(WeightsAndPools, SceneCatchesCorruption,
                         ::testing::Values("wq", "w_down", "k_cache", "v_cache"));

TEST(SceneRestore, CachesHoldInitialBytesPlusExactlyTheWrittenRowsThenRestore) {
  Worker worker;
  worker.init("sim");
  Config config;
  config.n_layers = 2;
  config.seq_len = 200;
  PageableAllocator allocator;
  const TaskArgs args = make_args(allocator, config);
  const Tensor& k = args.get("k_cache");
  const Tensor& v = args.get("v_cache");
  const auto* k_bytes = static_cast<const unsigned char*>(k.data());
  const std::vector<unsigned char> k_before(k_bytes, k_bytes + k.nbytes());
  const Golden golden = compute_golden(args, config.n_layers);
  const CacheRestorer restorer(args, config.n_layers);
  EXPECT_EQ(restorer.rows(), golden.kv_rows);

  BindOptions bind;
  bind.execute_callable = kCallable;
  Binder binder(worker, bind);
  binder.run(args);
  // After the round: every written row holds the golden's value (within the tolerance: the
  // execute step runs the portable kernels), every other byte is as before.
  const uint64_t rows = k.nbytes() / (kHeadDim * 2);
  EXPECT_TRUE(
      compare_rows("k_cache", k.data_as<uint16_t>(), rows, golden.kv_rows, golden.k_rows).ok());
  EXPECT_TRUE(
      compare_rows("v_cache", v.data_as<uint16_t>(), rows, golden.kv_rows, golden.v_rows).ok());
  std::vector<bool> written(rows, false);
  for (const int64_t row : golden.kv_rows) written[row] = true;
  size_t changed_rows = 0, unwritten_changed = 0;
  for (size_t row = 0; row < written.size(); ++row) {
    const bool same = std::memcmp(k_bytes + row * kHeadDim * 2,
                                  k_before.data() + row * kHeadDim * 2, kHeadDim * 2) == 0;
    if (!same) ++changed_rows;
    if (!same && !written[row]) ++unwritten_changed;
  }
  EXPECT_EQ(unwritten_changed, 0u);
  EXPECT_GT(changed_rows, 0u);
  // Restoring brings back the initial bytes exactly and reports nothing changed.
  EXPECT_TRUE(restorer.restore().empty());
  EXPECT_EQ(std::memcmp(k_bytes, k_before.data(), k.nbytes()), 0);
  // A byte changed outside the written rows is reported by name.
  k.data_as<unsigned char>()[12345] ^= 1;
  EXPECT_EQ(restorer.restore(), std::vector<std::string>{"k_cache"});
}

TEST(SceneValidation, BadOptionsAreRefusedBeforeAnythingIsTaken) {
  SceneOptions options = small(1, HostStorage::pinned);
  options.rounds = 0;
  EXPECT_THROW(validate(options), Error);
  options.rounds = 1;
  options.config.seq_len = 5501;
  EXPECT_THROW(validate(options), Error);
  options.config.seq_len = 10;
  options.skip_golden = true;
  options.save_golden = "/tmp/x.safetensors";
  EXPECT_THROW(validate(options), Error);
  EXPECT_THROW(parse_host_storage("paged"), Error);
  EXPECT_EQ(parse_host_storage("pageable"), HostStorage::pageable);
  Worker uninitialized;
  EXPECT_THROW(run_scene(uninitialized, small(1, HostStorage::pinned)), Error);
}

TEST(SceneExecute, AMissingCallableIsAClearError) {
  Worker worker;
  worker.init("sim");
  SceneOptions options = small(1, HostStorage::pageable);
  options.callable = "qwen3_prefill";
  options.skip_golden = true;
  const SceneReport report = run_scene(worker, options);
  ASSERT_EQ(report.rounds.size(), 1u);
  EXPECT_NE(report.rounds[0].failure.find("qwen3_prefill"), std::string::npos)
      << report.rounds[0].failure;
}

// Without the upload check, a corrupted upload reaches the execute step; the comparison
// must still fail. slot_mapping's middle byte flips (sim's corrupt_h2d): lane 8's K/V rows
// land 64 slots away, so the golden's rows hold the pool's initial values.
TEST(SceneExecute, ACorruptedUploadFailsTheComparison) {
  Worker worker;
  worker.init("sim");
  const Config config = small(1, HostStorage::pageable).config;
  PageableAllocator allocator;
  const TaskArgs args = make_args(allocator, config);
  const Golden golden = compute_golden(args, config.n_layers);
  const CacheRestorer restorer(args, config.n_layers);
  BindOptions bind;
  bind.execute_callable = kCallable;  // verify_upload stays off
  Binder binder(worker, bind);
  binder.run(args);
  ASSERT_TRUE(compare(args, golden).ok) << "an intact run must pass first";
  ASSERT_TRUE(restorer.restore().empty());
  worker.inject_fault(FaultKind::corrupt_h2d, first_copy_of("slot_mapping", config));
  binder.run(args);
  const Comparison c = compare(args, golden);
  EXPECT_FALSE(c.ok);
  EXPECT_EQ(c.tensor, "k_cache") << c.message();
  EXPECT_GT(c.mismatches, 0u);
  EXPECT_NE(c.message().find("mismatch"), std::string::npos) << c.message();
}

// The execute step is the portable kernel set; the golden the best one. On a machine with
// AVX-512 or AVX2 they are different code, and the run still matches within the tolerance.
TEST(SceneExecute, RunsThePortableKernelsWithinTheTolerance) {
  PageableAllocator allocator;
  const Config config = small(1, HostStorage::pageable).config;
  const TaskArgs args = make_args(allocator, config);
  const Golden golden = compute_golden(args, config.n_layers);
  std::vector<ExecArg> bound;
  for (const Tensor& t : args) bound.push_back({t.name(), t.data(), t.nbytes()});
  execute_decode(bound);
  const Comparison c = compare(args, golden);
  EXPECT_TRUE(c.ok) << c.message();
  uint64_t checked = 0;
  for (const TensorComparison& t : c.tensors) checked += t.checked;
  EXPECT_EQ(checked, 16u * 5120 + 2u * 128 * 128);
}

TEST(SceneRegistry, Qwen3IsRegisteredWithItsParametersAndCallable) {
  const auto s = find_scene(kSceneName);
  EXPECT_EQ(s, scene());
  EXPECT_EQ(s->callable(), kCallable);
  const auto names = host_callable_names();
  EXPECT_NE(std::find(names.begin(), names.end(), kCallable), names.end());
  std::vector<std::string> params;
  for (const SceneParam& p : s->params()) params.push_back(p.name);
  EXPECT_EQ(params, (std::vector<std::string>{"layers", "seq_len", "seed"}));
  ASSERT_TRUE(size_param(*s));
  EXPECT_EQ(size_param(*s)->name, "layers");
  const SceneValues values = resolve_params(*s, {{"layers", 2}});
  EXPECT_EQ(values.at("seq_len"), kDefaultSeqLen);
  EXPECT_EQ(config_of(values).n_layers, 2);
  EXPECT_EQ(scene_values(config_of(values)), values);
  EXPECT_EQ(task_sizes(s->tensors(values)).input_bytes, 2048508736u);
  EXPECT_EQ(s->describe(values), "2 layers, seq_len 3500, seed 1234");
  EXPECT_EQ(param_flag("seq_len"), "--seq-len");
}

TEST(SceneRegistry, BadNamesAndValuesAreClearErrors) {
  try {
    find_scene("qwen4");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::not_found);
    EXPECT_NE(std::string(e.what()).find("qwen3-decode"), std::string::npos) << e.what();
  }
  const auto s = scene();
  for (const auto& [values, needle] :
       std::vector<std::pair<SceneValues, std::string>>{{{{"layer", 1}}, "no parameter 'layer'"},
                                                        {{{"seq_len", 0}}, "--seq-len"},
                                                        {{{"layers", 0}}, "n_layers is 0"},
                                                        {{{"seed", -1}}, "seed"}}) {
    try {
      resolve_params(*s, values);
      ADD_FAILURE() << needle;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::invalid_argument);
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(register_scene(s), Error);  // the name is taken
}

// ---- Decode steps (the contract's "Decode steps") ----

SceneRunOptions steps_options(int steps, bool resident, int seq_len = 127) {
  SceneRunOptions options;
  options.values = {{"layers", 1}, {"seq_len", seq_len}, {"seed", 1234}};
  options.steps = steps;
  options.resident = resident;
  return options;
}

// Both ways of running the steps match the golden at every step (out and the K/V rows the
// step wrote, read back from the device), and the resident one moves only the step's inputs.
TEST(SceneSteps, EveryStepMatchesItsGoldenAndOnlyTheStepInputsGoUp) {
  // seq_len 127: step 1 writes the last row of page 0, step 2 starts page 1.
  std::vector<BindReport> binds[2];
  for (const bool resident : {true, false}) {
    Worker worker;
    worker.init("sim");
    const SceneReport report = pinstage::run_scene(worker, *scene(), steps_options(4, resident));
    ASSERT_TRUE(report.ok()) << (report.rounds.empty() ? "" : report.rounds.back().failure);
    ASSERT_EQ(report.rounds.size(), 4u);
    EXPECT_EQ(report.steps, 4);
    EXPECT_EQ(report.resident, resident);
    for (const SceneRound& step : report.rounds) {
      ASSERT_TRUE(step.comparison.has_value());
      EXPECT_TRUE(step.comparison->ok) << step.comparison->message();
      ASSERT_EQ(step.comparison->tensors.size(), 3u);  // out, k_cache rows, v_cache rows
      binds[resident ? 0 : 1].push_back(step.bind);
    }
    EXPECT_EQ(worker.stats().device_count, 0u);
  }
  const uint64_t full_bytes = binds[1][0].uploaded_bytes;
  // seq_lens and slot_mapping; hidden_states is fed from out on the device (copy_on_device).
  const uint64_t step_inputs = 2 * kBatch * 4;
  EXPECT_EQ(binds[0][0].uploaded_bytes, full_bytes);  // step 1 uploads everything
  for (size_t s = 1; s < 4; ++s) {
    EXPECT_EQ(binds[0][s].step, static_cast<int>(s + 1));
    EXPECT_EQ(binds[0][s].uploaded_bytes, step_inputs) << "step " << s + 1;  // no weight byte
    EXPECT_EQ(binds[0][s].uploaded_count, 2u);
    EXPECT_TRUE(binds[0][s].tensors[kArgHiddenStates].stayed);
    EXPECT_EQ(binds[0][s].downloaded_bytes, uint64_t{kBatch} * kHidden * 2);  // out only
    EXPECT_EQ(binds[1][s].uploaded_bytes, full_bytes);
    EXPECT_LT(binds[0][s].uploaded_bytes + binds[0][s].downloaded_bytes,
              (binds[1][s].uploaded_bytes + binds[1][s].downloaded_bytes) / 1000);
    for (const TensorBindReport& t : binds[0][s].tensors) {
      if (t.name.rfind("w", 0) == 0 || t.name.find("cache") != std::string::npos) {
        EXPECT_TRUE(t.stayed) << t.name;
      }
    }
  }
}

// Without the ABI's device copy (a backend of ABI v4, say) the fed hidden state goes up
// from the host instead, and every step still matches its golden.
TEST(SceneSteps, WithoutADeviceCopyTheFedInputIsUploaded) {
  Worker worker;
  WorkerOptions options;
  options.plugin_path = PINSTAGE_NO_DEVICE_OPS_PLUGIN;
  worker.init("no_device_ops", 0, options);
  ASSERT_FALSE(worker.capabilities().device_copy);
  const SceneReport report = pinstage::run_scene(worker, *scene(), steps_options(3, true));
  ASSERT_TRUE(report.ok()) << report.rounds.back().failure;
  for (size_t s = 1; s < 3; ++s) {
    EXPECT_EQ(report.rounds[s].bind.uploaded_bytes,
              uint64_t{kBatch} * kHidden * 2 + 2 * kBatch * 4);  // hidden_states and two i32
    EXPECT_FALSE(report.rounds[s].bind.tensors[kArgHiddenStates].stayed);
  }
}

// With the golden on the execute step's own (portable) kernels, every step is bit-exact: out
// and the K/V rows each step wrote, read back from the device, equal the golden's.
TEST(SceneSteps, OnTheSameKernelsEveryStepIsBitExact) {
  ASSERT_EQ(setenv("PINSTAGE_GOLDEN_ISA", "generic", 1), 0);
  Worker worker;
  worker.init("sim");
  const SceneReport report = pinstage::run_scene(worker, *scene(), steps_options(3, true));
  ASSERT_EQ(unsetenv("PINSTAGE_GOLDEN_ISA"), 0);
  ASSERT_TRUE(report.ok());
  for (const SceneRound& step : report.rounds)
    for (const TensorComparison& t : step.comparison->tensors) {
      EXPECT_GT(t.checked, 0u) << t.tensor;
      EXPECT_EQ(t.differing, 0u) << "step " << step.index << ": " << t.message();
    }
}

// Runs three resident steps with `kind` failing at call `nth`: the run stops at `step`,
// whose failure says `what`, and nothing stays on the device.
void expect_step_fails(FaultKind kind, uint64_t nth, size_t step, const std::string& what) {
  Worker worker;
  worker.init("sim");
  worker.inject_fault(kind, nth);
  const SceneReport report = pinstage::run_scene(worker, *scene(), steps_options(3, true));
  ASSERT_EQ(report.rounds.size(), step);
  for (size_t s = 0; s + 1 < step; ++s) EXPECT_TRUE(report.rounds[s].ok());
  EXPECT_NE(report.rounds[step - 1].failure.find(what), std::string::npos)
      << report.rounds[step - 1].failure;
  EXPECT_EQ(worker.stats().device_count, 0u);
}

TEST(SceneSteps, StepsStopAtTheFirstFailureWhichNamesItsStep) {
  // The first execute call is step 1's: fail step 2's.
  expect_step_fails(FaultKind::execute, 2, 2, "resident step 2 failed at phase execute");
}

TEST(SceneSteps, ACorruptedResidentWeightFailsStepOne) {
  expect_step_fails(FaultKind::corrupt_h2d, first_copy_of("wq", Config{1, 127}), 1,
                    "resident step 1 failed at phase verify of tensor 'wq'");
}

TEST(SceneSteps, StepsPastMaxSeqOrWithRoundsAreRefusedBeforeAnyMemory) {
  Worker worker;
  worker.init("sim");
  SceneRunOptions too_many = steps_options(3, true, kMaxSeq - 1);  // 5499, 5500, 5501
  const std::string why = test_error(too_many);
  EXPECT_NE(why.find("--steps 3 with --seq-len 5499: steps must be in [1, 2]"), std::string::npos)
      << why;
  SceneRunOptions rounds = steps_options(2, true);
  rounds.rounds = 2;
  EXPECT_NE(test_error(rounds).find("--rounds must be 1"), std::string::npos);
  SceneRunOptions save = steps_options(2, true);
  save.save_golden = "/tmp/never.safetensors";
  EXPECT_NE(test_error(save).find("--save-golden saves a single step"), std::string::npos);
  EXPECT_NE(test_error(steps_options(0, true)).find("steps must be >= 1"), std::string::npos);
  EXPECT_EQ(worker.stats().pinned_count, 0u);
  EXPECT_EQ(worker.stats().device_count, 0u);
}

TEST(SceneSteps, AdvanceFeedsOutIntoTheHiddenStateAndMovesThePosition) {
  PageableAllocator alloc;
  const Config config{1, 200};
  const TaskArgs args = make_args(alloc, config);
  auto* out = args.get("out").data_as<uint16_t>();
  for (int i = 0; i < kBatch * kHidden; ++i) out[i] = static_cast<uint16_t>(i * 3);
  const auto changed = advance_step(args, config, 5);
  EXPECT_EQ(changed, (std::vector<std::string>{"hidden_states", "seq_lens", "slot_mapping"}));
  EXPECT_EQ(std::memcmp(args.get("hidden_states").data(), out, kBatch * kHidden * 2), 0);
  const auto* seq = args.get("seq_lens").data_as<int32_t>();
  const auto* slot = args.get("slot_mapping").data_as<int32_t>();
  for (int b = 0; b < kBatch; ++b) {
    EXPECT_EQ(seq[b], 205);
    EXPECT_EQ(slot[b], (b * kMaxBlocksPerSeq + 204 / kBlockSize) * kBlockSize + 204 % kBlockSize);
  }
  const auto ranges = written_ranges(args, 1);
  ASSERT_EQ(ranges.size(), 2u * kBatch);
  EXPECT_EQ(ranges[0].tensor, "k_cache");
  EXPECT_EQ(ranges[kBatch].tensor, "v_cache");
  EXPECT_EQ(ranges[1].offset, uint64_t(slot[1]) * kNumKvHeads * kHeadDim * 2);
  EXPECT_EQ(ranges[1].bytes, uint64_t{kNumKvHeads} * kHeadDim * 2);
  EXPECT_THROW(advance_step(args, config, 0), Error);
  EXPECT_THROW(advance_step(args, Config{1, kMaxSeq}, 1), Error);
}

}  // namespace
}  // namespace pinstage::qwen3
