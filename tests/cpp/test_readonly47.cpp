// Issue 47 in the library: read-only memory (a map-mode load's view of the page cache) is
// refused as an OUT or INOUT argument, so no run writes it back.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "pinstage/checkpoint.h"
#include "pinstage/error.h"
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

}  // namespace
}  // namespace pinstage
