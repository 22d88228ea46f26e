// `pinstage bench qwen3-decode` and `pinstage bench synthetic`: argument validation fails
// fast with a clear message, and a small run prints the table and writes the JSON.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

namespace {

struct Result {
  int status = -1;
  std::string output;  // stdout and stderr together
  double seconds = 0.0;
};

// `pinstage bench <task> <args> --no-progress`, stdout and stderr together.
Result run_task(const std::string& task, const std::string& args) {
  const std::string cmd =
      std::string(PINSTAGE_CLI_PATH) + " bench " + task + " " + args + " --no-progress 2>&1";
  const auto start = std::chrono::steady_clock::now();
  Result r;
  FILE* pipe = popen(cmd.c_str(), "r");
  if (pipe == nullptr) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, pipe)) > 0) r.output.append(buf, n);
  const int raw = pclose(pipe);
  r.status = WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return r;
}

Result run_cli(const std::string& args) { return run_task("qwen3-decode", args); }

void expect_rejected(const std::string& args, const std::string& needle,
                     const std::string& task = "qwen3-decode") {
  const Result r = run_task(task, args);
  EXPECT_EQ(r.status, 1) << args << "\n" << r.output;
  EXPECT_NE(r.output.find(needle), std::string::npos) << args << "\n" << r.output;
  EXPECT_EQ(r.output.find("group  "), std::string::npos) << "no table on an error";
}

TEST(BenchCli, GroupsZero) { expect_rejected("--groups 0", "--groups is 0"); }

TEST(BenchCli, RoundsZero) { expect_rejected("--rounds 0", "--rounds is 0"); }

TEST(BenchCli, StagingSizesOutOfRange) {
  expect_rejected("--staging-buffers 0", "staging_buffers is 0");
  expect_rejected("--staging-buffer-mib 0", "--staging-buffer-mib is 0");
  expect_rejected("--staging-buffer-mib 2048", "--staging-buffer-mib is 2048");
}

TEST(BenchCli, OneRoundWithTheColdRoundDroppedLeavesNothing) {
  expect_rejected("--rounds 1", "--keep-cold");
}

TEST(BenchCli, UnknownArm) { expect_rejected("--arms pageable,mmap", "unknown arm 'mmap'"); }

TEST(BenchCli, DuplicateArm) { expect_rejected("--arms pinned,pinned", "twice"); }

TEST(BenchCli, BadSeqLen) { expect_rejected("--seq-len 0", "--seq-len"); }

// 100,000 layers is ~100 TB: refused from the size alone, before anything is allocated
// (so it is also quick).
TEST(BenchCli, LayersTooLargeForMemory) {
  expect_rejected("--layers 100000", "--layers 100000 needs");
  const Result r = run_cli("--layers 100000");
  EXPECT_NE(r.output.find("out_of_memory"), std::string::npos) << r.output;
  EXPECT_LT(r.seconds, 30.0);
}

TEST(BenchCli, UnwritableJsonFailsBeforeTheRun) {
  expect_rejected("--layers 1 --json /nonexistent-dir/x.json", "--json");
}

TEST(BenchCli, SmallRunPrintsTheTableAndWritesTheJson) {
  const auto path = std::filesystem::temp_directory_path() /
                    ("pinstage_bench_cli_" + std::to_string(getpid()) + ".json");
  const Result r =
      run_cli("--layers 1 --groups 1 --rounds 2 --arms pinned,pageable --json " + path.string());
  ASSERT_EQ(r.status, 0) << r.output;
  for (const char* needle : {"--layers 1", "group", "vs pageable", "pinned vs pageable",
                             "upload target", "raw timings written"})
    EXPECT_NE(r.output.find(needle), std::string::npos) << needle << "\n" << r.output;
  std::ifstream in(path);
  ASSERT_TRUE(in) << path;
  const auto doc = nlohmann::json::parse(in);
  EXPECT_EQ(doc["config"]["arms"], nlohmann::json({"pinned", "pageable"}));
  EXPECT_EQ(doc["config"]["reference_arm"], "pageable");
  EXPECT_EQ(doc["groups"][0]["arms"][0]["binds"].size(), 2u);
  std::filesystem::remove(path);
}

TEST(BenchCli, SyntheticRunsThroughTheSameHarness) {
  const Result r = run_task("synthetic", "--tensors 4 --bytes 64M --groups 2 --rounds 2");
  ASSERT_EQ(r.status, 0) << r.output;
  for (const char* needle : {"pinstage bench synthetic: backend sim, 4 tensors x 67,108,864 bytes",
                             "args: 4 tensors, 4 inputs, 268,435,456 bytes per bind", "group",
                             "vs pageable", "pinned vs pageable", "upload target"})
    EXPECT_NE(r.output.find(needle), std::string::npos) << needle << "\n" << r.output;
}

TEST(BenchCli, SyntheticBadSizes) {
  expect_rejected("--tensors 0 --bytes 1M", "--tensors is 0", "synthetic");
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
