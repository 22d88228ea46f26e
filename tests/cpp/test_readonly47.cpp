// Issue 47 in the library: read-only memory (a map-mode load's view of the page cache) is
// refused as an OUT or INOUT argument, so no run writes it back; a TP plan's regex matches
// non-ASCII characters as characters, not bytes.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "pinstage/checkpoint.h"
#include "pinstage/error.h"
#include "pinstage/load_plan.h"
#include "pinstage/safetensors.h"
#include "pinstage/tensor.h"
#include "pinstage/worker.h"
#include "temp_dir_test_util.h"
#include "tensor_test_util.h"

namespace pinstage {
namespace {

// The message of the ReadOnlyError `fn` throws ("" when it throws none).
template <class F>
std::string read_only_error(F fn) {
  try {
    fn();
  } catch (const ReadOnlyError& e) {
    EXPECT_EQ(e.code(), ErrorCode::invalid_argument);
    return e.what();
  }
  return "";
}

TEST(ReadOnly47, TaskArgsRefusesReadOnlyMemoryAsOutOrInout) {
  std::vector<float> bytes(4, 1.0f);
  auto read_only = std::make_shared<Storage>(bytes.data(), 16, false, nullptr, true);
  auto writable = std::make_shared<Storage>(bytes.data(), 16, false, nullptr);
  EXPECT_TRUE(read_only->read_only());
  EXPECT_FALSE(writable->read_only());
  TaskArgs args;
  for (Direction dir : {Direction::out, Direction::inout}) {
    const std::string e =
        read_only_error([&] { args.add(Tensor("w", DType::f32, {4}, dir, read_only)); });
    EXPECT_NE(e.find("tensor 'w' is read-only memory"), std::string::npos) << e;
    EXPECT_NE(e.find(std::string("as ") + direction_name(dir) + " a run would write it"),
              std::string::npos)
        << e;
    EXPECT_TRUE(args.empty()) << "a refused tensor was kept";
  }
  args.add(Tensor("w", DType::f32, {4}, Direction::in, read_only));  // read, never written
  args.add(Tensor("y", DType::f32, {4}, Direction::out, writable));
  EXPECT_EQ(args.size(), 2u);
}

class ReadOnly47Files : public test::TempDirTest {
 protected:
  ReadOnly47Files() : TempDirTest("readonly47") {}
  void SetUp() override {
    TempDirTest::SetUp();
    worker_.init("sim");
  }
  Worker worker_;
};

TEST_F(ReadOnly47Files, AMapModeLoadsStoragesAreReadOnlyACopyModesAreNot) {
  PageableAllocator pageable;
  TaskArgs source;
  source.add(Tensor::empty("a", DType::f32, {1000}, Direction::in, pageable));
  source.add(Tensor::empty("b", DType::i32, {7}, Direction::in, pageable));
  std::memset(source.at(0).data(), 0x3c, source.at(0).nbytes());
  std::memset(source.at(1).data(), 0x11, source.at(1).nbytes());
  save_safetensors(source, path("m.safetensors"));
  const Checkpoint c = Checkpoint::open(path("m.safetensors"));
  CheckpointLoadOptions o;
  o.mode = LoadMode::map;
  const HostLoad mapped = load_to_host(c, worker_, o);
  const HostLoad copied = load_to_host(c, worker_);
  ASSERT_EQ(mapped.report.map_note, "") << "the sim backend pins file mappings";
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_TRUE(mapped.tensors[i].storage->read_only()) << mapped.tensors[i].info.name;
    EXPECT_FALSE(copied.tensors[i].storage->read_only()) << copied.tensors[i].info.name;
  }
  TaskArgs args = to_task_args(mapped);  // as inputs: uploaded, never written
  EXPECT_EQ(args.size(), 2u);
  const HostTensor& a = mapped.tensors[0];
  EXPECT_NE(read_only_error([&] {
              TaskArgs out;
              out.add(Tensor("a", DType::f32, {1000}, Direction::out, a.storage));
            }),
            "");
  TaskArgs ok;
  ok.add(Tensor("a", DType::f32, {1000}, Direction::out, copied.tensors[0].storage));
}

// ---- the regex of a TP plan rule, by character ----

bool matches(const std::string& re, const std::string& name) {
  TpPlan plan;
  plan.split_regex(re, 0);
  return plan.match(name) == 0;
}

TEST(Regex47, NonAsciiCharactersMatchAsCharacters) {
  const std::vector<std::tuple<std::string, std::string, bool>> cases = {
      {"x[éè]y", "xéy", true},
      {"x[éè]y", "xèy", true},
      {"x[éè]y", "xay", false},
      {"x[éè]y", "x\xc3y", false},  // a lone lead byte is no character of the class
      {"é+", "é", true},
      {"é+", "ééé", true},
      {"é+", "", false},  // + with zero repeats
      {"é+", "é\xa9", false},
      {"é?x", "x", true},
      {"ñ{2}", "ññ", true},
      {"ñ{2}", "ñ", false},
      {"ñ{2}", "ñññ", false},
      {"ñ{2,}", "ññññ", true},
      {"x.y", "xéy", true},  // two, three and four bytes: one character each
      {"x.y", "x€y", true},
      {"x.y", "x😀y", true},
      {"x..y", "xéy", false},
      {"x.y", "x\ny", false},
      {"[^a]", "é", true},
      {"[^a]+", "éé€", true},
      {"\\D\\W\\S", "ééé", true},
      {"\\w", "é", false},   // \w is ASCII, as in ECMAScript
      {"\\xe9", "é", true},  // U+00E9, as ECMAScript reads it
      {"\\xe9", "\xe9", false},
      {"[\\xe9]", "é", true},
      {"\\é", "é", true},
      {"layers\\.\\d+\\.注意力\\.(?:q|k)", "layers.12.注意力.k", true},
      {"(?:é|ü)*x", "éüéüx", true},
      {"[a-cé]+", "aébé", true},
  };
  for (const auto& [re, name, want] : cases)
    EXPECT_EQ(matches(re, name), want) << re << " on " << name;
}

TEST(Regex47, WhatCannotMatchByCharacterIsRefusedByName) {
  const std::vector<std::pair<std::string, std::string>> refused = {
      {"[à-ÿ]", "a range in '[...]' with a non-ASCII end (not supported: list its characters)"},
      {"[a-\\xe9]", "a range in '[...]' with a non-ASCII end"},
      {"[^é]", "a negated class '[^...]' with a non-ASCII character (not supported)"},
      {"x\xc3",
       "a byte that is not UTF-8 (a pattern is UTF-8 text, matched by character) at "
       "offset 1"},
      {"\xed\xa0\x80", "a byte that is not UTF-8"},  // a surrogate
      {"\xc0\xaf", "a byte that is not UTF-8"},      // an overlong '/'
  };
  for (const auto& [re, why] : refused) {
    const std::string& pattern = re;  // clang 14 captures no structured binding
    const Error e = test::error_of([&] { TpPlan().split_regex(pattern, 0); });
    EXPECT_EQ(e.code(), ErrorCode::invalid_argument) << re;
    EXPECT_NE(std::string(e.what()).find("does not compile: " + why), std::string::npos)
        << re << ": " << e.what();
  }
}

TEST(Regex47, ANonAsciiNameOfAMillionCharactersIsMatchedInOnePass) {
  std::string name = "m.";
  for (int i = 0; i < 1'000'000; ++i) name += i % 3 ? "é" : "€";
  EXPECT_TRUE(matches("m\\..*", name));
  EXPECT_TRUE(matches("m\\.(?:é|€)+", name));
  EXPECT_FALSE(matches("m\\.(?:é|€)+x", name));
}

}  // namespace
}  // namespace pinstage
