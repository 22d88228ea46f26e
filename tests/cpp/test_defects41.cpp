// Issue 41's defects in the library: a plan's regex matches a name of a million characters
// in bounded time and stack (std::regex overflowed the stack at ~30,000) and keeps the
// documented syntax; a stale hash sidecar is named stale; a shard directory that lacks a
// numbered shard is refused naming it; a negative thread count is refused.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "pinstage/checkpoint.h"
#include "pinstage/load_plan.h"
#include "pinstage/worker_group.h"
#include "temp_dir_test_util.h"
#include "tensor_test_util.h"

namespace pinstage {
namespace {

using test::error_of;
namespace fs = std::filesystem;

// A safetensors file of U8 tensors {name: bytes}, with no hashes recorded.
void write_u8(const std::string& path, const std::vector<std::pair<std::string, std::string>>& ts) {
  std::string header = "{", data;
  for (const auto& [name, bytes] : ts) {
    header += (header.size() > 1 ? "," : "") + std::string("\"") + name +
              "\":{\"dtype\":\"U8\",\"shape\":[" + std::to_string(bytes.size()) +
              "],\"data_offsets\":[" + std::to_string(data.size()) + "," +
              std::to_string(data.size() + bytes.size()) + "]}";
    data += bytes;
  }
  header += "}";
  header.append((8 - header.size() % 8) % 8, ' ');
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  const uint64_t n = header.size();
  f.write(reinterpret_cast<const char*>(&n), 8);
  f << header << data;
}

std::string what(const Error& e) { return e.what(); }

// ---- 1: the regex of a plan rule ----

TEST(Defects41, ARegexRuleMatchesAMillionCharacterNameInBoundedStack) {
  TpPlan plan;
  plan.split_regex(R"(m\..*)", 0).replicate_regex(R"((ab|cd)+x)");
  const std::string name = "m." + std::string(1'000'000, 'x');
  EXPECT_EQ(plan.match(name), 0);
  EXPECT_EQ(plan.match("n" + name.substr(1)), -1);
  std::string pairs;
  for (int i = 0; i < 250'000; ++i) pairs += i % 2 ? "cd" : "ab";
  EXPECT_EQ(plan.match(pairs + "x"), 1);  // a group repeated 250,000 times
  EXPECT_EQ(plan.match(pairs + "y"), -1);
}

TEST(Defects41, TheRegexSubsetMatchesAsECMAScriptDoes) {
  const std::vector<std::tuple<std::string, std::string, bool>> cases = {
      {R"(model\.layers\.[0-9]+\.mlp\.(gate|up)_proj\.weight)",
       "model.layers.12.mlp.gate_proj.weight", true},
      {R"(model\.layers\.[0-9]+\.mlp\.(gate|up)_proj\.weight)",
       "model.layers.x.mlp.gate_proj.weight", false},
      {R"(layers\.\d+\.o_proj\.weight)", "layers.7.o_proj.weight", true},
      {R"(a{2,3})", "aaa", true},
      {R"(a{2,3})", "aaaa", false},
      {R"(a{2})", "aa", true},
      {R"(a{2,})", "aaaaaaa", true},
      {R"((?:ab)*c?)", "ababc", true},
      {R"([^.]+\.w)", "x.y.w", false},
      {R"([a-c\d_]+)", "ab3_c", true},
      {R"(^x$)", "x", true},
      {R"(x|)", "", true},
      {R"(.*)", "a\nb", false},  // '.' is not a line break, as in ECMAScript
      {R"(\x41\.\w\s\S)", "A.z b", true},
      {R"(a.*?b)", "axxb", true},
      {R"([])", "", false},
      {R"((a*)*b)", std::string(1000, 'a'), false},  // no exponential backtracking
  };
  for (const auto& [re, name, want] : cases) {
    TpPlan plan;
    plan.split_regex(re, 0);
    EXPECT_EQ(plan.match(name) == 0, want) << re << " on " << name;
  }
}

TEST(Defects41, SyntaxOutsideTheSubsetIsRefusedByName) {
  const std::vector<std::pair<std::string, std::string>> refused = {
      {R"((a)\1)", "a backreference '\\1' (not supported)"},
      {R"((?=a)a)", "'(?' other than '(?:'"},
      {R"(a\b)", "a word boundary '\\b' (not supported)"},
      {R"(a{3,2})", "a quantifier {n,m} with m < n"},
      {R"(a{1001})", "a repeat count over 1000"},
      {R"(a{x})", "a '{' that is not a quantifier"},
      {R"(*a)", "'*' with nothing before it to repeat"},
      {R"(a))", "a ')' with no '(' before it"},
      {R"((a)", "a '(' that is never closed"},
      {R"([a)", "a '[' that is never closed"},
      {R"([z-a])", "a range in '[...]' out of order"},
      {R"(\q)", "an unknown escape '\\q'"},
      {R"((((a{1000}){1000})))", "it compiles to over 100000 steps"},
      {std::string(101, '(') + std::string(101, ')'), "groups nested over 100 deep"},
  };
  for (const auto& [re, why] : refused) {
    const std::string& pattern = re;  // clang 14 captures no structured binding
    const Error e = error_of([&] { TpPlan().split_regex(pattern, 0); });
    EXPECT_EQ(e.code(), ErrorCode::invalid_argument) << re;
    EXPECT_NE(what(e).find("does not compile: " + why), std::string::npos)
        << re << ": " << e.what();
  }
}

// ---- 6, 7: the checkpoint ----

class Defects41Files : public test::TempDirTest {
 protected:
  Defects41Files() : TempDirTest("defects41") {}
};

// Issue 47: the stale sidecar no longer blocks a load that does not verify.
TEST_F(Defects41Files, AStaleSidecarIsNamedStaleAndRefusesOnlyAVerifiedLoad) {
  const std::string f = path("hf.safetensors");
  write_u8(f, {{"w", std::string(64, 'a')}});
  hash_checkpoint(Checkpoint::open(f));
  fs::rename(f, path("old"));  // re-saved by its writer: a new file, same layout
  write_u8(f, {{"w", std::string(64, 'b')}});
  const Checkpoint c = Checkpoint::open(f);
  const std::string& why = c.sidecar_problem();
  EXPECT_NE(why.find("is stale: 'hf.safetensors' changed since it was recorded"), std::string::npos)
      << why;
  EXPECT_NE(why.find("run `pinstage hash " + f + "` to replace it"), std::string::npos) << why;
  EXPECT_FALSE(c.get("w").xxh3) << "the stale sidecar's hash was taken";
  CheckpointLoadOptions verify;
  verify.verify = verify.verify_if_present = true;
  const Error e = error_of([&] { check_sidecar(c, verify); });
  EXPECT_EQ(e.code(), ErrorCode::io);
  EXPECT_NE(what(e).find(why), std::string::npos) << e.what();
  EXPECT_NO_THROW(check_sidecar(c, {}));
  PageableAllocator pageable;
  const HostLoad load = load_to_host(c, pageable);  // the new bytes, unverified
  EXPECT_EQ(std::string(static_cast<const char*>(load.tensors[0].storage->data()), 64),
            std::string(64, 'b'));
}

TEST_F(Defects41Files, AShardDirectoryMissingANumberedShardIsRefused) {
  write_u8(path("model-00001-of-00003.safetensors"), {{"a", "x"}});
  write_u8(path("model-00003-of-00003.safetensors"), {{"c", "x"}});
  const Error e = error_of([&] { Checkpoint::open(dir_.string()); });
  EXPECT_EQ(e.code(), ErrorCode::io);
  EXPECT_NE(what(e).find("holds 2 of the 3 shards of 'model-*-of-00003.safetensors': "
                         "'model-00002-of-00003.safetensors' is missing"),
            std::string::npos)
      << e.what();
  write_u8(path("model-00002-of-00003.safetensors"), {{"b", "x"}});
  EXPECT_EQ(Checkpoint::open(dir_.string()).tensors().size(), 3u);
  write_u8(path("model-00004-of-00003.safetensors"), {{"d", "x"}});
  EXPECT_NE(what(error_of([&] {
              Checkpoint::open(dir_.string());
            })).find("'model-00004-of-00003.safetensors' is numbered past its count of 3"),
            std::string::npos);
}

// ---- 8: thread counts ----

TEST(Defects41, NegativeThreadCountsAreRefused) {
  const Error e = error_of([] { split_threads(-1, 2); });
  EXPECT_EQ(e.code(), ErrorCode::invalid_argument);
  EXPECT_EQ(what(e),
            "split_threads: total is -1; it must be >= 0 (0 = the process's thread count)");
  EXPECT_EQ(split_threads(5, 2), (std::vector<int>{3, 2}));
  const Error g = error_of([] { WorkerGroup group(std::vector<Worker*>{}, -2); });
  EXPECT_EQ(what(g),
            "WorkerGroup: threads is -2; it must be >= 0 (0 = the process's thread count)");
}

}  // namespace
}  // namespace pinstage
