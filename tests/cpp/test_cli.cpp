// The CLI conventions every command shares: --json FILE or - (stdout), outputs checked
// before any work and never half-written, size knobs >= 1, strict numbers,
// case-insensitive choices; and bench load's file-reading arms on a truncated shard.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <csignal>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench_load_arms.h"
#include "cli_test_util.h"
#include "lock_test_util.h"
#include "pinstage/safetensors.h"
#include "tensor_test_util.h"

namespace {

struct Result {
  int status = -1;
  std::string out;  // stdout
  std::string all;  // stdout, then stderr
};

// Runs `pinstage <args>` with stdout and stderr apart.
Result run(const std::string& args, const std::string& env = "") {
  const auto err =
      std::filesystem::temp_directory_path() / ("pinstage_cli_err_" + std::to_string(getpid()));
  const pinstage::test::CommandResult c = pinstage::test::run_command(
      env + " " + PINSTAGE_CLI_PATH + " " + args + " 2>" + err.string() + " </dev/null");
  Result r;
  r.status = c.status;
  r.out = c.output;
  std::ifstream in(err);
  r.all =
      r.out + std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::filesystem::remove(err);
  return r;
}

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() /
          ("pinstage_cli_" + std::to_string(getpid()) + "_" + name))
      .string();
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

constexpr const char* kSmallFixture = "fixture qwen3-decode --layers 1 --seq-len 64 --quiet";
constexpr const char* kSmallScene =
    "scene qwen3-decode --layers 1 --seq-len 64 --skip-golden --quiet";

TEST(Cli, FixtureJsonToStdoutIsOneDocumentWithARunBlock) {
  const Result r = run(std::string(kSmallFixture) + " --json -");
  ASSERT_EQ(r.status, 0) << r.all;
  const auto doc = nlohmann::json::parse(r.out);  // stdout holds the JSON alone
  EXPECT_EQ(doc["layers"], 1);
  EXPECT_GT(doc["total_bytes"].get<uint64_t>(), 0u);
  EXPECT_EQ(doc["run"]["options"]["--layers"], "1");
  EXPECT_FALSE(doc["run"]["host"].get<std::string>().empty());
}

TEST(Cli, FixtureEmptyOutIsAnErrorBeforeWork) {
  const Result r = run(std::string(kSmallFixture) + " --out ''");
  EXPECT_EQ(r.status, 1) << r.all;
  EXPECT_NE(r.all.find("--out is empty"), std::string::npos) << r.all;
  EXPECT_EQ(r.all.find("generate:"), std::string::npos) << "nothing generated: " << r.all;
}

TEST(Cli, FixtureRefusesADeviceAsOutputAndLeavesIt) {
  const Result r = run(std::string(kSmallFixture) + " --out /dev/null");
  EXPECT_EQ(r.status, 1) << r.all;
  EXPECT_NE(r.all.find("not a regular file"), std::string::npos) << r.all;
  struct stat st {};
  ASSERT_EQ(stat("/dev/null", &st), 0);
  EXPECT_TRUE(S_ISCHR(st.st_mode));
}

TEST(Cli, FixtureOutIsAtomicAndReplacesTheOldFile) {
  const std::string out = temp_path("fixture.safetensors");
  { std::ofstream(out) << "old"; }
  const Result r = run(std::string(kSmallFixture) + " --out " + out);
  ASSERT_EQ(r.status, 0) << r.all;
  EXPECT_GT(std::filesystem::file_size(out), 1000u);
  for (const auto& e :
       std::filesystem::directory_iterator(std::filesystem::path(out).parent_path()))
    EXPECT_EQ(
        e.path().filename().string().find(std::filesystem::path(out).filename().string() + ".tmp-"),
        std::string::npos)
        << "temporary file left: " << e.path();
  std::filesystem::remove(out);
}

TEST(Cli, FixtureLayersZeroIsAnError) {
  const Result r = run("fixture qwen3-decode --layers 0 --size-only");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.all.find("--layers 0 is not a size"), std::string::npos) << r.all;
}

// The fixture checks memory before allocating, like the bench: 100,000 layers is refused
// from the size alone.
TEST(Cli, FixtureChecksMemoryFirst) {
  const Result r = run("fixture qwen3-decode --layers 100000 --quiet");
  EXPECT_EQ(r.status, 1) << r.all;
  EXPECT_NE(r.all.find("out_of_memory"), std::string::npos) << r.all;
}

// Without --layers the fixture takes the bench's automatic size and says so.
TEST(Cli, FixtureSizeOnlyDefaultsToTheWholeModel) {
  const Result r = run("fixture qwen3-decode --size-only --json -");
  ASSERT_EQ(r.status, 0) << r.all;
  EXPECT_EQ(nlohmann::json::parse(r.out)["layers"], 40);
}

// --dry-run replaces every command's callback; the values CLI11 writes into while parsing
// must outlive it (they were owned by the callback alone once: a use after free that
// crashed `bench load` and that ASan reports).
TEST(Cli, DryRunParsesEveryValueOfACommand) {
  for (const std::string line :
       {"bench load /nonexistent/ckpt --rounds 2 --threads 2 --json -",
        "load /nonexistent/ckpt --threads 2 --chunk-mib 4 --to device",
        "scene qwen3-decode --layers 2",
        "fixture qwen3-decode --layers 2 --seq-len 64 --out /nonexistent/x", "demo"}) {
    const Result r = run("--dry-run " + line);
    ASSERT_EQ(r.status, 0) << line << "\n" << r.all;
    EXPECT_NE(r.out.find("parsed; nothing was run"), std::string::npos) << line << "\n" << r.all;
  }
}

TEST(Cli, SceneJsonAndCaseInsensitiveChoices) {
  const Result r = run(std::string(kSmallScene) + " --storage PINNED --upload Direct --json -");
  ASSERT_EQ(r.status, 0) << r.all;
  const auto doc = nlohmann::json::parse(r.out);
  EXPECT_TRUE(doc["ok"].get<bool>());
  EXPECT_EQ(doc["storage"], "pinned");
  EXPECT_EQ(doc["rounds"].size(), 1u);
  EXPECT_EQ(doc["run"]["backend"], "sim");
}

TEST(Cli, SceneEmptySaveGoldenIsAnError) {
  const Result r = run(std::string(kSmallScene) + " --save-golden ''");
  EXPECT_EQ(r.status, 1) << r.all;
  EXPECT_NE(r.all.find("--save-golden is empty"), std::string::npos) << r.all;
}

TEST(Cli, SceneUnwritableJsonFailsBeforeWork) {
  const Result r = run(std::string(kSmallScene) + " --json /nonexistent-dir/r.json");
  EXPECT_EQ(r.status, 1) << r.all;
  EXPECT_NE(r.all.find("does not exist"), std::string::npos) << r.all;
  EXPECT_EQ(r.all.find("round 1"), std::string::npos) << r.all;
}

TEST(Cli, BackendOptionIsParsedStrictly) {
  const Result r = run(std::string(kSmallScene) + " --backend-option novalue");
  EXPECT_EQ(r.status, 1) << r.all;
  EXPECT_NE(r.all.find("novalue"), std::string::npos) << r.all;
}

// Every numeric option of every command goes through the one strict parser: hex, an empty
// value, a negative one (which CLI11 wraps into a size_t), one past either end and trailing
// text are each an error naming the option, the value and the range, exit 1, before any
// work. `rest` makes the command otherwise cheap, or failing in another way (`--json ''`
// where an accepted value would start a long run).
TEST(Cli, EveryNumericOptionIsParsedStrictly) {
  // The rests that several rows share, and the int range most counts take.
  const char* tiny = "--tensors 1 --bytes 4K --quiet";
  const char* staged = "--tensors 1 --bytes 4K --arms staged --quiet";
  const char* scene = "--layers 1 --seq-len 64 --skip-golden --quiet --json ''";
  const int64_t int_max = 2147483647;
  const struct {
    const char* command;
    const char* option;
    int64_t min, max;
    const char* rest;
  } options[] = {
      {"demo", "--mib", 1, 1 << 20, ""},
      {"bench synthetic", "--groups", 1, int_max, tiny},
      {"bench synthetic", "--rounds", 1, int_max, tiny},
      {"bench synthetic", "--staging-buffers", 1, 64, staged},
      {"bench synthetic", "--staging-buffer-mib", 1, 1024, staged},
      {"bench synthetic", "--tensors", 1, 65536, "--bytes 4K --quiet"},
      {"bench qwen3-decode", "--seq-len", INT64_MIN, INT64_MAX, "--layers 1 --quiet"},
      {"bench load /nonexistent", "--rounds", 1, 1000, "--quiet"},
      {"bench load /nonexistent", "--threads", 0, 1024, "--quiet"},
      {"bench load /nonexistent", "--chunk-mib", 1, 4096, "--quiet"},
      {"load /nonexistent", "--threads", 0, 1024, "--quiet"},
      {"load /nonexistent", "--chunk-mib", 1, 4096, "--quiet"},
      {"load /nonexistent", "--ring-mib", 1, 65536, "--quiet"},
      {"fixture qwen3-decode", "--threads", 0, 4096, "--layers 1 --size-only --quiet"},
      {"fixture qwen3-decode", "--repeat", 1, int_max, "--layers 1 --quiet --json ''"},
      {"scene qwen3-decode", "--threads", 0, 4096, scene},
      {"scene qwen3-decode", "--rounds", 1, int_max, scene},
  };
  for (const auto& o : options) {
    const std::string range = "[" + std::to_string(o.min) + ", " + std::to_string(o.max) + "]";
    std::vector<std::string> bad = {"0x10", "", "5abc", "1.5"};
    if (o.min > INT64_MIN) bad.push_back(std::to_string(o.min - 1));
    bad.push_back(o.max < INT64_MAX ? std::to_string(o.max + 1) : "9223372036854775808");
    if (o.min >= 0) bad.push_back("-1");
    for (const std::string& value : bad) {
      const std::string args =
          std::string(o.command) + " " + o.option + " '" + value + "' " + o.rest;
      SCOPED_TRACE(args);
      const Result r = run(args);
      EXPECT_EQ(r.status, 1) << r.all;
      EXPECT_NE(r.all.find(std::string(o.option) + "='" + value + "' is not valid"),
                std::string::npos)
          << r.all;
      EXPECT_NE(r.all.find(range), std::string::npos) << r.all;
      for (const char* work :
           {"worker:", "pinstage bench:", "round 1:", "generated", "no such file"})
        EXPECT_EQ(r.all.find(work), std::string::npos) << "work done: " << r.all;
    }
  }
}

// A leading zero is decimal, never octal (CLI11 alone reads 010 as 8), and the report's
// option list records the value as parsed.
TEST(Cli, LeadingZeroIsDecimal) {
  const Result r = run("demo --mib 010");
  ASSERT_EQ(r.status, 0) << r.all;
  EXPECT_NE(r.out.find("pinned 10,485,760 bytes"), std::string::npos) << r.out;
  const Result s = run(std::string(kSmallFixture) + " --size-only --seed 010 --json -");
  ASSERT_EQ(s.status, 0) << s.all;
  EXPECT_NE(s.all.find("seq_len 64, seed 10\n"), std::string::npos) << s.all;
  EXPECT_EQ(nlohmann::json::parse(s.out)["run"]["options"]["--seed"], "10");
}

TEST(Cli, InfoSaysPerBackendWhetherADeviceIsUsable) {
  const Result r = run("info --json -");
  ASSERT_EQ(r.status, 0) << r.all;
  const auto doc = nlohmann::json::parse(r.out);
  bool sim = false;
  for (const auto& b : doc["backends"]) {
    ASSERT_TRUE(b.contains("usable")) << b;
    if (!b["usable"].get<bool>()) EXPECT_FALSE(b["why"].get<std::string>().empty()) << b;
    if (b["name"] == "sim") sim = b["usable"].get<bool>();
  }
  EXPECT_TRUE(sim) << r.out;
}

// Under a typical RLIMIT_MEMLOCK (8 MiB) without CAP_IPC_LOCK, info still reports, and
// says why its 64 MiB probe was refused.
TEST(Cli, InfoReportsUnderATypicalMemlockLimit) {
  if (std::system("command -v prlimit >/dev/null && command -v setpriv >/dev/null") != 0)
    GTEST_SKIP() << "needs prlimit and setpriv (util-linux)";
  // detect_leaks=0: under ASan, LeakSanitizer's tracer may not attach to a process whose
  // capabilities changed (no effect elsewhere).
  const Result r = run("info --json -",
                       "ASAN_OPTIONS=detect_leaks=0 prlimit --memlock=8388608 "
                       "setpriv --bounding-set=-ipc_lock --");
  ASSERT_EQ(r.status, 0) << r.all;
  const auto doc = nlohmann::json::parse(r.out);
  const std::string probe = doc["sim"]["pinned_probe"];
  EXPECT_NE(probe.find("does not fit RLIMIT_MEMLOCK"), std::string::npos) << probe;
  EXPECT_NE(probe.find("of its 8388608 bytes"), std::string::npos) << probe;
  EXPECT_FALSE(doc["sim"]["pinned_is_page_locked"].get<bool>());
  EXPECT_EQ(doc["machine"]["rlimit_memlock_soft"], 8388608);
  EXPECT_NE(r.all.find("probe was refused"), std::string::npos) << r.all;
}

// A FIFO given as a report fails at once; reading it would wait for a writer forever.
TEST(Cli, ReportReadersRefuseAFifo) {
  const std::string fifo = temp_path("report.json");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  // (plot's reader is Python: tests/python/test_py_plot.py checks it.)
  for (const std::string& cmd : {"bench compare " + fifo + " " + fifo}) {
    const Result r = run(cmd);
    EXPECT_EQ(r.status, 1) << cmd << "\n" << r.all;
    EXPECT_NE(r.all.find("not a regular file"), std::string::npos) << cmd << "\n" << r.all;
  }
  std::filesystem::remove(fifo);
}

// --verify means every tensor: a checkpoint without pinstage's hashes fails naming how to
// check what can be checked; --verify=if-present loads it and says what went unchecked.
TEST(Cli, LoadVerifyWithoutRecordedHashesFailsUnlessIfPresent) {
  pinstage::PageableAllocator pageable;
  pinstage::TaskArgs args;
  args.add(pinstage::Tensor::empty("w", pinstage::DType::f32, {1024}, pinstage::Direction::in,
                                   pageable));
  std::memset(args.at(0).data(), 1, args.at(0).nbytes());
  const std::string hashed = temp_path("hashed.safetensors");
  pinstage::save_safetensors(args, hashed);
  // The same tensor, written by hand without __metadata__ (as any other writer would).
  const std::string bare = temp_path("bare.safetensors");
  {
    const std::string header = R"({"w":{"dtype":"F32","shape":[1024],"data_offsets":[0,4096]}})";
    std::string file(8, '\0');
    for (int i = 0; i < 8; ++i) file[i] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
    file += header + std::string(4096, '\1');
    std::ofstream(bare, std::ios::binary) << file;
  }
  for (const char* to : {"host", "device"}) {
    SCOPED_TRACE(to);
    const std::string load = std::string("load --to ") + to + " ";
    Result r = run(load + bare + " --verify");
    EXPECT_EQ(r.status, 1) << r.all;
    EXPECT_NE(r.all.find("verify cannot check 1 of 1 tensors"), std::string::npos) << r.all;
    EXPECT_NE(r.all.find("--verify=if-present"), std::string::npos) << r.all;
    r = run(load + bare + " --verify=if-present");
    EXPECT_EQ(r.status, 0) << r.all;
    EXPECT_NE(r.all.find("1 tensor had no recorded xxh3-64 and could not be checked"),
              std::string::npos)
        << r.all;
    r = run(load + hashed + " --verify --json -");
    ASSERT_EQ(r.status, 0) << r.all;
    const auto doc = nlohmann::json::parse(r.out);
    EXPECT_TRUE(doc["verified"].get<bool>());
    if (std::string(to) == "device") EXPECT_EQ(doc["verify_readback_bytes"], 4096);
    r = run(load + hashed + " --verify=all");
    EXPECT_EQ(r.status, 0) << r.all;
    r = run(load + hashed + " --verify=maybe");
    EXPECT_EQ(r.status, 1) << r.all;
  }
  std::filesystem::remove(hashed);
  std::filesystem::remove(bare);
}

// bench load's file-reading arms on a shard truncated under them (after the checkpoint
// was opened): an error naming the file, never SIGBUS, and nothing left allocated or mapped.
class TruncatedShard : public ::testing::Test {
 protected:
  void SetUp() override {
    pinstage::PageableAllocator pageable;
    pinstage::TaskArgs args;
    for (const char* name : {"a", "b"}) {
      pinstage::Tensor t = pinstage::Tensor::empty(name, pinstage::DType::f32, {16384},
                                                   pinstage::Direction::in, pageable);
      std::memset(t.data(), 0x5a, t.nbytes());
      args.add(std::move(t));
    }
    pinstage::save_safetensors(args, path);
  }
  void TearDown() override { std::filesystem::remove(path); }

  // Whether this process still maps `path`.
  bool mapped() const { return read_file("/proc/self/maps").find(path) != std::string::npos; }

  const std::string path = temp_path("truncated.safetensors");
};

TEST_F(TruncatedShard, MmapArmNamesTheFileInsteadOfDyingOfSigbus) {
  const pinstage::Checkpoint c = pinstage::Checkpoint::open(path);
  pinstage::test::CountingAllocator pinned;
  pinstage::cli::arm_mmap_copy(c, pinned);  // whole: no error
  EXPECT_EQ(pinned.live(), 0);
  // Truncated after the mmap, before the copies: the first copy reads a page the file no
  // longer backs.
  const pinstage::Error e = pinstage::test::error_of([&] {
    pinstage::cli::arm_mmap_copy(c, pinned, [](const pinstage::CheckpointFile& f) {
      ASSERT_EQ(::truncate(f.path.c_str(), 0), 0);
    });
  });
  EXPECT_EQ(e.code(), pinstage::ErrorCode::io);
  EXPECT_NE(std::string(e.what()).find("'" + path + "' was truncated while being read"),
            std::string::npos)
      << e.what();
  EXPECT_EQ(pinned.live(), 0);
  EXPECT_FALSE(mapped());
}

TEST_F(TruncatedShard, ReadArmNamesTheFile) {
  const pinstage::Checkpoint c = pinstage::Checkpoint::open(path);
  ASSERT_EQ(::truncate(path.c_str(), 4096), 0);
  pinstage::test::CountingAllocator pinned;
  const pinstage::Error e =
      pinstage::test::error_of([&] { pinstage::cli::arm_read_then_copy(c, pinned); });
  EXPECT_EQ(e.code(), pinstage::ErrorCode::io);
  EXPECT_NE(std::string(e.what()).find("'" + path + "' was truncated while being read"),
            std::string::npos)
      << e.what();
  EXPECT_EQ(pinned.live(), 0);
}

// The guard is scoped to its copy: a SIGBUS anywhere else (here a read of a truncated
// mapping after the guard was installed) still kills the process with SIGBUS.
TEST_F(TruncatedShard, SigbusOutsideTheGuardStillKills) {
#if defined(PINSTAGE_TEST_SANITIZED)
  GTEST_SKIP() << "ASan takes SIGBUS itself (it reports and aborts)";
#endif
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        const pinstage::Checkpoint c = pinstage::Checkpoint::open(path);
        pinstage::test::CountingAllocator pinned;
        pinstage::cli::arm_mmap_copy(c, pinned);  // installs the handler
        const int fd = ::open(path.c_str(), O_RDWR);
        const auto* p =
            static_cast<const volatile char*>(::mmap(nullptr, 4096, PROT_READ, MAP_SHARED, fd, 0));
        // The child's own file goes before the read kills it (its TearDown never runs).
        if (p == MAP_FAILED || ::unlink(path.c_str()) != 0 || ::ftruncate(fd, 0) != 0) std::exit(1);
        std::exit(p[0] == 0 ? 2 : 3);  // never reached: the read faults
      },
      ::testing::KilledBySignal(SIGBUS), "");
}

}  // namespace
