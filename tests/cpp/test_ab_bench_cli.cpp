// `pinstage bench qwen3-decode` and `pinstage bench synthetic`: argument validation fails
// fast with a clear message, and a small run prints the table and writes the JSON.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>

#include "cli_test_util.h"
#include "temp_dir_test_util.h"

namespace {

struct Result {
  int status = -1;
  std::string output;  // stdout and stderr together
  double seconds = 0.0;
};

// `[env] pinstage bench <task> <args> --quiet`, stdout and stderr together.
// --quiet unless `loud`: quiet drops the plan line and where the report went (chatter).
Result run_task(const std::string& task, const std::string& args, const std::string& env = "",
                bool loud = false) {
  const auto start = std::chrono::steady_clock::now();
  const pinstage::test::CommandResult c =
      pinstage::test::run_command(env + " " + std::string(PINSTAGE_CLI_PATH) + " bench " + task +
                                  " " + args + (loud ? "" : " --quiet") + " 2>&1");
  Result r;
  r.status = c.status;
  r.output = c.output;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return r;
}

Result run_cli(const std::string& args) { return run_task("qwen3-decode", args); }

// `pinstage bench compare <args>`.
Result run_compare(const std::string& args) {
  const pinstage::test::CommandResult c = pinstage::test::run_command(
      std::string(PINSTAGE_CLI_PATH) + " bench compare " + args + " 2>&1");
  return {c.status, c.output, 0.0};
}

void expect_rejected(const std::string& args, const std::string& needle,
                     const std::string& task = "qwen3-decode") {
  const Result r = run_task(task, args);
  EXPECT_EQ(r.status, 1) << args << "\n" << r.output;
  EXPECT_NE(r.output.find(needle), std::string::npos) << args << "\n" << r.output;
  EXPECT_EQ(r.output.find("group  "), std::string::npos) << "no table on an error";
}

TEST(BenchCli, GroupsZero) {
  expect_rejected("--groups 0", "--groups='0' is not valid: must be in [1, 2147483647]");
}

TEST(BenchCli, RoundsZero) {
  expect_rejected("--rounds 0", "--rounds='0' is not valid: must be in [1, 2147483647]");
}

TEST(BenchCli, StagingSizesOutOfRange) {
  expect_rejected("--staging-buffers 0", "--staging-buffers='0' is not valid: must be in [1, 64]");
  expect_rejected("--staging-buffers 65", "--staging-buffers='65' is not valid");
  expect_rejected("--staging-buffer-mib 0", "--staging-buffer-mib='0' is not valid");
  expect_rejected("--staging-buffer-mib 2048",
                  "--staging-buffer-mib='2048' is not valid: must be in [1, 1024]");
}

TEST(BenchCli, OneRoundWithTheColdRoundDroppedLeavesNothing) {
  expect_rejected("--rounds 1", "--keep-cold");
}

TEST(BenchCli, UnknownArm) { expect_rejected("--arms pageable,mmap", "unknown arm 'mmap'"); }

TEST(BenchCli, DuplicateArm) { expect_rejected("--arms pinned,pinned", "twice"); }

TEST(BenchCli, BadSeqLen) { expect_rejected("--seq-len 0", "--seq-len"); }

// 100,000 layers is ~100 TB: refused from the size alone, before anything is allocated:
// no group ran and no worker was finalized with memory to release.
TEST(BenchCli, LayersTooLargeForMemory) {
  expect_rejected("--layers 100000", "--layers 100000 needs");
  const Result r = run_cli("--layers 100000");
  EXPECT_NE(r.output.find("out_of_memory"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("group 1"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("finalize released"), std::string::npos) << r.output;
}

TEST(BenchCli, UnwritableJsonFailsBeforeTheRun) {
  expect_rejected("--layers 1 --json /nonexistent-dir/x.json", "--json");
}

// The report and the PNG drawn beside it go in a folder of the test's own.
class BenchCliFiles : public pinstage::test::TempDirTest {
 protected:
  BenchCliFiles() : TempDirTest("bench_cli") {}
};

TEST_F(BenchCliFiles, SmallRunPrintsTheTableAndWritesTheJson) {
  const std::string path = this->path("report.json");
  const Result r = run_task(
      "qwen3-decode", "--layers 1 --groups 1 --rounds 2 --arms pinned,pageable --json " + path, "",
      /*loud=*/true);
  ASSERT_EQ(r.status, 0) << r.output;
  for (const char* needle :
       {"--layers 1", "group", "vs pageable", "alloc ms", "upload GB/s", "pinned is ",
        "than pageable (bind latency", "upload-rate target", "report with every raw timing"})
    EXPECT_NE(r.output.find(needle), std::string::npos) << needle << "\n" << r.output;
  std::ifstream in(path);
  ASSERT_TRUE(in) << path;
  const auto doc = nlohmann::json::parse(in);
  EXPECT_EQ(doc["config"]["arms"], nlohmann::json({"pinned", "pageable"}));
  EXPECT_EQ(doc["config"]["reference_arm"], "pageable");
  EXPECT_EQ(doc["groups"][0]["arms"][0]["binds"].size(), 2u);
  // Every arm's upload was verified, and the report carries the per-tensor rows and the
  // run block.
  for (const auto& arm : doc["groups"][0]["arms"]) {
    EXPECT_TRUE(arm["verified"].get<bool>());
    EXPECT_EQ(arm["tensors"].size(), 20u);
    EXPECT_GT(arm["tensors"][0]["bytes"].get<uint64_t>(), 0u);
  }
  EXPECT_EQ(doc["run"]["backend"], "sim");
  EXPECT_FALSE(doc["run"]["pinstage_version"].get<std::string>().empty());
  EXPECT_FALSE(doc["run"]["options"]["--arms"].get<std::string>().empty());
  // The copy-engine model's parameters, as the backend reports them.
  const auto& model = doc["run"]["model"];
  EXPECT_GE(model["dma_threads"].get<int>(), 1);
  EXPECT_EQ(model["bounce_chunk_bytes"], 2 << 20);
  EXPECT_EQ(model["bounce_buffers"], 2);
  EXPECT_EQ(model["link_gbps"], 0);
  // The automatic-size line is printed once (here the size was given: no such line).
  EXPECT_EQ(r.output.find("automatic"), std::string::npos) << r.output;
}

// The plan's line comes once, not again in the table's header.
TEST(BenchCli, AutomaticSizeLineOnce) {
  const Result r =
      run_task("synthetic", "--tensors 2 --bytes 4K --groups 1 --rounds 2", "", /*loud=*/true);
  ASSERT_EQ(r.status, 0) << r.output;
  const std::string line = "fits";
  const size_t first = r.output.find("pinstage bench: ");
  ASSERT_NE(first, std::string::npos) << r.output;
  const std::string plan = r.output.substr(first + 16, r.output.find('\n', first) - first - 16);
  EXPECT_EQ(r.output.find(plan, first + 16 + plan.size()), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("1 groups"), std::string::npos) << "plural: " << r.output;
  EXPECT_NE(r.output.find("1 group x 2 rounds"), std::string::npos) << r.output;
}

// The nth upload flips one byte (PINSTAGE_SIM_FAULT=corrupt_h2d:n). With one tensor, no
// baseline and 2 rounds, uploads 1-2 are the timed binds and 3 the verification bind: a
// corrupted verified upload fails the bench, naming the arm and group.
TEST(BenchCli, CorruptedUploadFailsTheBench) {
  const std::string args = "--tensors 1 --bytes 64K --groups 1 --rounds 2 --arms pageable,pinned";
  const Result bad = run_task("synthetic", args, "PINSTAGE_SIM_FAULT=corrupt_h2d:3");
  EXPECT_EQ(bad.status, 1) << bad.output;
  EXPECT_NE(bad.output.find("upload check failed for arm pageable in group 1"), std::string::npos)
      << bad.output;
  EXPECT_EQ(bad.output.find("upload-rate target"), std::string::npos) << "no verdict on bad bytes";
  const Result good = run_task("synthetic", args);
  EXPECT_EQ(good.status, 0) << good.output;
}

// The report is rewritten after every group: a run that fails in group 2 keeps group 1,
// and a run that fails at once leaves an existing report untouched.
TEST(BenchCli, JsonKeepsFinishedGroupsAndNeverTruncates) {
  const auto path = std::filesystem::temp_directory_path() /
                    ("pinstage_bench_partial_" + std::to_string(getpid()) + ".json");
  { std::ofstream(path) << "previous report"; }
  const std::string args = "--tensors 1 --bytes 64K --groups 2 --rounds 2 --no-baseline --json " +
                           path.string() + " --no-plot";
  const Result first = run_task("synthetic", args, "PINSTAGE_SIM_FAULT=copy_h2d:1");
  EXPECT_EQ(first.status, 1) << first.output;
  {
    std::ifstream in(path);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    EXPECT_EQ(text, "previous report");
  }
  // 3 uploads per arm per group (2 timed + 1 verification), 2 arms: upload 7 is group 2's.
  const Result second = run_task("synthetic", args, "PINSTAGE_SIM_FAULT=copy_h2d:7");
  EXPECT_EQ(second.status, 1) << second.output;
  std::ifstream in(path);
  const auto doc = nlohmann::json::parse(in);
  EXPECT_EQ(doc["groups"].size(), 1u);
  std::filesystem::remove(path);
}

// Usage errors found while parsing exit 1, like every other failure, before any work.
void expect_usage_error(const std::string& args, const std::string& needle) {
  const Result r = run_cli(args);
  EXPECT_EQ(r.status, 1) << args << "\n" << r.output;
  EXPECT_NE(r.output.find(needle), std::string::npos) << args << "\n" << r.output;
  EXPECT_EQ(r.output.find("group  "), std::string::npos) << "no table on an error";
}

// A release the backend refuses (PINSTAGE_SIM_FAULT=host_free:1: the pool's segment, at
// finalize) is logged, but the run still exits non-zero and says why: that memory may
// have stayed locked.
TEST(BenchCli, FailedFreeMakesTheCommandExitNonZero) {
  const Result r = run_task("synthetic", "--tensors 1 --bytes 64K --groups 1 --rounds 2",
                            "PINSTAGE_SIM_FAULT=host_free:1");
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_NE(r.output.find("releasing a pinned host segment failed"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("1 release of pinned or device memory failed"), std::string::npos)
      << r.output;
}

TEST(BenchCli, LayersZeroIsAnError) {
  expect_usage_error("--layers 0", "--layers 0 is not a size: it must be at least 1 (omit");
}

// Never saturated or truncated: 2^64 and 1.5 are errors, -1 is refused by the scene.
TEST(BenchCli, SeedOutOfRange) {
  expect_rejected("--layers 1 --seed -1", "seed is -1");
  expect_usage_error("--layers 1 --seed 18446744073709551616",
                     "--seed='18446744073709551616' is not valid: must be in "
                     "[-9223372036854775808, 9223372036854775807]");
  expect_usage_error("--layers 1 --seed 1.5", "--seed='1.5' is not valid: expected a whole number");
}

TEST(BenchCli, EmptyJsonIsAnError) { expect_rejected("--layers 1 --json ''", "--json is empty"); }

TEST(BenchCli, ChoicesAreCaseInsensitive) {
  const Result r = run_task("synthetic",
                            "--tensors 1 --bytes 4K --groups 1 --rounds 2 --arms PINNED,Pageable "
                            "--backend SIM");
  EXPECT_EQ(r.status, 0) << r.output;
}

TEST(BenchCli, CompareTwoReports) {
  const auto dir = std::filesystem::temp_directory_path();
  const auto a = dir / ("pinstage_cmp_a_" + std::to_string(getpid()) + ".json");
  const auto b = dir / ("pinstage_cmp_b_" + std::to_string(getpid()) + ".json");
  const std::string args = "--tensors 2 --bytes 1M --groups 1 --rounds 2 --no-plot --json ";
  ASSERT_EQ(run_task("synthetic", args + a.string()).status, 0);
  ASSERT_EQ(run_task("synthetic", args + b.string()).status, 0);
  const Result r = run_compare(a.string() + " " + b.string());
  EXPECT_EQ(r.status, 0) << r.output;
  for (const char* needle : {"best bind ms", "upload GB/s (median)", "alloc ms (median)", "pinned"})
    EXPECT_NE(r.output.find(needle), std::string::npos) << needle << "\n" << r.output;
  const Result bad = run_compare(a.string() + " /nonexistent.json");
  EXPECT_NE(bad.status, 0);
  std::filesystem::remove(a);
  std::filesystem::remove(b);
}

// A report with a key missing or of the wrong type is a clear error naming the file and
// the key's path, never a read of a missing key (undefined behaviour) or a bare JSON
// exception; no table is printed.
TEST(BenchCli, CompareNamesTheFileAndTheKeyOfABadReport) {
  const auto dir = std::filesystem::temp_directory_path();
  const auto good = dir / ("pinstage_cmp_good_" + std::to_string(getpid()) + ".json");
  const auto bad = dir / ("pinstage_cmp_bad_" + std::to_string(getpid()) + ".json");
  ASSERT_EQ(run_task("synthetic",
                     "--tensors 1 --bytes 64K --groups 1 --rounds 2 --no-plot "
                     "--json " +
                         good.string())
                .status,
            0);
  nlohmann::json doc;
  {
    std::ifstream in(good);
    doc = nlohmann::json::parse(in);
  }
  const struct {
    const char* pointer;   // what is changed, as a JSON pointer
    nlohmann::json value;  // null: removed
    const char* says;
  } cases[] = {
      {"/config/arms", nullptr, "config.arms is missing"},
      {"/config/arms", 5, "config.arms is a number, not an array"},
      {"/config/arms", nlohmann::json::array({1}), "config.arms[0] is a number, not a string"},
      {"/config", "x", "config is a string, not an object"},
      {"/summary", nullptr, "summary is missing"},
      {"/summary/arms/0/min_seconds", nullptr, "summary.arms[0].min_seconds is missing"},
      {"/summary/arms/0/median_upload_gbps", "fast",
       "summary.arms[0].median_upload_gbps is a string, not a number"},
      {"/run/utc_time", 5, "run.utc_time is a number, not a string"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.pointer);
    nlohmann::json changed = doc;
    const nlohmann::json::json_pointer at(c.pointer);
    if (c.value.is_null())
      changed[at.parent_pointer()].erase(at.back());
    else
      changed[at] = c.value;
    { std::ofstream(bad) << changed.dump(); }
    for (const std::string& files :
         {good.string() + " " + bad.string(), bad.string() + " " + good.string()}) {
      const Result r = run_compare(files);
      EXPECT_EQ(r.status, 1) << files << "\n" << r.output;
      EXPECT_NE(r.output.find(bad.string() + ": " + c.says), std::string::npos) << files << "\n"
                                                                                << r.output;
      EXPECT_EQ(r.output.find("best bind ms"), std::string::npos) << files << "\n" << r.output;
    }
  }
  { std::ofstream(bad) << "[1, 2]"; }
  const Result r = run_compare(bad.string() + " " + good.string());
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_NE(r.output.find(bad.string() + ": the report is an array, not an object"),
            std::string::npos)
      << r.output;
  std::filesystem::remove(good);
  std::filesystem::remove(bad);
}

TEST(BenchCli, SyntheticRunsThroughTheSameHarness) {
  // Loud: the header is chatter, which --quiet drops (docs/cli.md; issue 42).
  const Result r = run_task("synthetic", "--tensors 4 --bytes 64M --groups 2 --rounds 2", "",
                            /*loud=*/true);
  ASSERT_EQ(r.status, 0) << r.output;
  for (const char* needle : {"pinstage bench synthetic: backend sim, 4 tensors x 67,108,864 bytes",
                             "args: 4 tensors, 4 inputs, 268.44 MB per bind", "group",
                             "vs pageable", "than pageable (bind latency", "upload-rate target"})
    EXPECT_NE(r.output.find(needle), std::string::npos) << needle << "\n" << r.output;
}

TEST(BenchCli, SyntheticBadSizes) {
  expect_rejected("--tensors 0 --bytes 1M", "--tensors='0' is not valid: must be in [1, 65536]",
                  "synthetic");
  expect_rejected("--tensors 4 --bytes abc", "--bytes", "synthetic");
  expect_rejected("--tensors 4 --bytes 6", "--bytes is 6", "synthetic");
}

// Every registered scene is a task, next to synthetic.
TEST(BenchCli, HelpListsTheTasks) {
  const Result r = run_task("--help", "");
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("qwen3-decode"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("synthetic"), std::string::npos) << r.output;
}

}  // namespace
