// The scene run end to end on sim: it passes on 1 and 2 layers with either storage, and a
// single corrupted byte in a weight or in the KV pool is caught and named.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "pinstage/bind.h"
#include "pinstage/qwen3_scene.h"

namespace pinstage::qwen3 {
namespace {

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
    EXPECT_EQ(round.bind.uploaded_bytes, sizes(options.config).staged_bytes);
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
  bind.execute_callable = "qwen3_decode";
  Binder binder(worker, bind);
  binder.run(args);
  // After the round: every written row holds the golden's value, every other byte is as
  // before.
  std::vector<bool> written(k.nbytes() / (kHeadDim * 2), false);
  for (size_t i = 0; i < golden.kv_rows.size(); ++i) {
    const int64_t row = golden.kv_rows[i];
    written[row] = true;
    EXPECT_EQ(std::memcmp(k.data_as<uint16_t>() + row * kHeadDim, &golden.k_rows[i * kHeadDim],
                          kHeadDim * 2),
              0);
    EXPECT_EQ(std::memcmp(v.data_as<uint16_t>() + row * kHeadDim, &golden.v_rows[i * kHeadDim],
                          kHeadDim * 2),
              0);
  }
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
  EXPECT_NE(report.rounds[0].failure.find("no callable named 'qwen3_prefill'"), std::string::npos)
      << report.rounds[0].failure;
}

}  // namespace
}  // namespace pinstage::qwen3
