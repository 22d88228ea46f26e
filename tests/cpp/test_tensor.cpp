// Checked shape arithmetic, Storage and Tensor, the two allocators, TaskArgs.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <utility>

#include "pinstage/tensor.h"
#include "pinstage/worker.h"
#include "tensor_test_util.h"

namespace pinstage {
namespace {

using test::CountingAllocator;
using test::error_of;

constexpr int64_t kMax = std::numeric_limits<int64_t>::max();

TEST(Shape, CheckedNumel) {
  EXPECT_EQ(checked_numel({}), 1u);  // a scalar
  EXPECT_EQ(checked_numel({16, 5120}), 81920u);
  EXPECT_EQ(checked_numel({0, 5}), 0u);
  EXPECT_EQ(checked_numel({5, 0, kMax}), 0u);  // empty whatever the rest
  EXPECT_EQ(checked_numel({kMax, 1}), static_cast<uint64_t>(kMax));
  EXPECT_EQ(error_of([] { checked_numel({4, -1}); }).code(), ErrorCode::invalid_argument);
  EXPECT_EQ(error_of([] { checked_numel({-1, 0}); }).code(), ErrorCode::invalid_argument);
  const Error overflow = error_of([] { checked_numel({int64_t{1} << 32, int64_t{1} << 32}); });
  EXPECT_EQ(overflow.code(), ErrorCode::invalid_argument);
  EXPECT_NE(std::string(overflow.what()).find("overflow"), std::string::npos) << overflow.what();
  EXPECT_EQ(error_of([] { checked_numel({kMax, 2}); }).code(), ErrorCode::invalid_argument);
  EXPECT_EQ(error_of([] {
              checked_numel({3, 3, int64_t{1} << 62});
            }).code(),
            ErrorCode::invalid_argument);
}

TEST(Shape, CheckedNbytes) {
  EXPECT_EQ(checked_nbytes({16, 5120}, DType::bf16), 163840u);
  EXPECT_EQ(checked_nbytes({3}, DType::i64), 24u);
  EXPECT_EQ(checked_nbytes({int64_t{1} << 59}, DType::i64), uint64_t{1} << 62);
  // The element count fits, the byte size does not.
  const Error e = error_of([] { checked_nbytes({int64_t{1} << 62}, DType::f32); });
  EXPECT_EQ(e.code(), ErrorCode::invalid_argument);
  EXPECT_NE(std::string(e.what()).find("byte size"), std::string::npos) << e.what();
}

TEST(Format, Thousands) {
  const std::pair<uint64_t, const char*> cases[] = {
      {0, "0"},
      {999, "999"},
      {1000, "1,000"},
      {12345, "12,345"},
      {123456, "123,456"},
      {1027153728, "1,027,153,728"},
      {40859999040ull, "40,859,999,040"},
      {std::numeric_limits<uint64_t>::max(), "18,446,744,073,709,551,615"}};
  for (const auto& [n, text] : cases) EXPECT_EQ(format_thousands(n), text) << n;
}

TEST(Direction, NamesRoundTrip) {
  for (Direction d : {Direction::in, Direction::inout, Direction::out})
    EXPECT_EQ(parse_direction(direction_name(d)), d);
  EXPECT_EQ(parse_direction("inout"), Direction::inout);
  EXPECT_FALSE(parse_direction("IN OUT"));
  EXPECT_FALSE(parse_direction(""));
}

TEST(TensorTest, ChecksItsArguments) {
  PageableAllocator alloc;
  auto storage = alloc.allocate(64);
  EXPECT_EQ(error_of([&] { Tensor("", DType::f32, {4}, Direction::in, storage); }).code(),
            ErrorCode::invalid_argument);
  EXPECT_EQ(error_of([&] { Tensor("t", DType::f32, {4}, Direction::in, nullptr); }).code(),
            ErrorCode::invalid_argument);
  const Error small = error_of([&] { Tensor("t", DType::f32, {17}, Direction::in, storage); });
  EXPECT_EQ(small.code(), ErrorCode::invalid_argument);
  EXPECT_NE(std::string(small.what()).find("68 bytes"), std::string::npos) << small.what();
  EXPECT_EQ(error_of([&] { Tensor("t", DType::f32, {-4}, Direction::in, storage); }).code(),
            ErrorCode::invalid_argument);
  Tensor t("t", DType::i32, {4, 4}, Direction::inout, storage);
  EXPECT_EQ(t.numel(), 16u);
  EXPECT_EQ(t.nbytes(), 64u);
  EXPECT_EQ(t.shape_string(), "[4, 4]");
  EXPECT_EQ(t.direction(), Direction::inout);
  EXPECT_FALSE(t.pinned());
  EXPECT_EQ(t.data(), storage->data());
}

TEST(TensorTest, EmptyChecksShapeBeforeAllocating) {
  CountingAllocator alloc;
  EXPECT_EQ(error_of([&] {
              Tensor::empty("t", DType::bf16, {2, -3}, Direction::in, alloc);
            }).code(),
            ErrorCode::invalid_argument);
  EXPECT_EQ(
      error_of([&] {
        Tensor::empty("t", DType::i64, {int64_t{1} << 40, int64_t{1} << 22}, Direction::in, alloc);
      }).code(),
      ErrorCode::invalid_argument);
  EXPECT_EQ(error_of([&] { Tensor::empty("", DType::bf16, {2}, Direction::in, alloc); }).code(),
            ErrorCode::invalid_argument);
  EXPECT_EQ(alloc.calls(), 0);
  Tensor zero = Tensor::empty("z", DType::f32, {0, 7}, Direction::out, alloc);
  EXPECT_EQ(zero.nbytes(), 0u);
  Tensor scalar = Tensor::empty("s", DType::f32, {}, Direction::in, alloc);
  EXPECT_EQ(scalar.nbytes(), 4u);
  EXPECT_EQ(scalar.shape_string(), "[]");
}

TEST(StorageTest, SharedByTensorsReleasedWithTheLast) {
  CountingAllocator alloc;
  {
    auto storage = alloc.allocate(256);
    Tensor a("a", DType::f32, {64}, Direction::in, storage);
    Tensor b("b", DType::bf16, {128}, Direction::in, storage);  // a second view
    storage.reset();
    EXPECT_EQ(alloc.live(), 1);
    {
      Tensor c = a;  // copies share too
      a = Tensor("a2", DType::f32, {1}, Direction::in, alloc.allocate(4));
      EXPECT_EQ(alloc.live(), 2);
    }
    EXPECT_EQ(alloc.live(), 2);  // b still holds the first storage
  }
  EXPECT_EQ(alloc.live(), 0);
  EXPECT_EQ(error_of([] { Storage(nullptr, 8, false, nullptr); }).code(),
            ErrorCode::invalid_argument);
}

TEST(PageableAllocatorTest, PageAlignedAndWritable) {
  PageableAllocator alloc;
  EXPECT_FALSE(alloc.pinned());
  EXPECT_EQ(alloc.name(), "pageable");
  for (size_t bytes : {size_t{1}, size_t{4095}, size_t{4097}, size_t{3} << 20}) {
    auto s = alloc.allocate(bytes);
    ASSERT_NE(s->data(), nullptr);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(s->data()) % 4096, 0u);
    EXPECT_EQ(s->bytes(), bytes);
    EXPECT_FALSE(s->pinned());
    std::memset(s->data(), 0xab, bytes);
    EXPECT_EQ(static_cast<unsigned char*>(s->data())[bytes - 1], 0xab);
  }
  auto empty = alloc.allocate(0);
  EXPECT_EQ(empty->data(), nullptr);
  EXPECT_EQ(empty->bytes(), 0u);
  const Error huge = error_of([&] { alloc.allocate(std::numeric_limits<size_t>::max() / 2); });
  EXPECT_EQ(huge.code(), ErrorCode::out_of_memory);
}

TEST(PinnedAllocatorTest, RefusesAWorkerThatOwnsNoDevice) {
  Worker idle;  // never initialized
  const Error e = error_of([&] { PinnedAllocator a(idle); });
  EXPECT_EQ(e.code(), ErrorCode::invalid_argument);
  EXPECT_NE(std::string(e.what()).find("PinnedAllocator"), std::string::npos) << e.what();
  Worker done;
  done.init("sim");
  done.finalize();
  EXPECT_EQ(error_of([&] { PinnedAllocator a(done); }).code(), ErrorCode::invalid_argument);
}

TEST(PinnedAllocatorTest, StorageIsTheWorkersPinnedMemory) {
  Worker worker;
  worker.init("sim");
  PinnedAllocator alloc(worker);
  EXPECT_TRUE(alloc.pinned());
  EXPECT_EQ(alloc.name(), "pinned");
  {
    Tensor t = Tensor::empty("t", DType::f32, {1000}, Direction::in, alloc);
    EXPECT_TRUE(t.pinned());
    EXPECT_EQ(worker.stats().pinned_count, 1u);
    EXPECT_EQ(worker.stats().pinned_bytes, 4000u);
    std::memset(t.data(), 1, t.nbytes());
    Tensor view("v", DType::i32, {1000}, Direction::out, t.storage());
    EXPECT_EQ(worker.stats().pinned_count, 1u);
    auto empty = alloc.allocate(0);
    EXPECT_EQ(empty->data(), nullptr);
    EXPECT_EQ(worker.stats().pinned_count, 1u);
  }
  EXPECT_EQ(worker.stats().pinned_count, 0u);
  EXPECT_EQ(worker.stats().pinned_bytes, 0u);
}

TEST(PinnedAllocatorTest, TensorsOutliveAFinalizedWorker) {
  std::optional<Tensor> survivor;
  {
    Worker worker;
    worker.init("sim");
    PinnedAllocator alloc(worker);
    survivor.emplace(Tensor::empty("t", DType::bf16, {4096}, Direction::in, alloc));
    Tensor second = Tensor::empty("u", DType::bf16, {16}, Direction::in, alloc);
    worker.finalize();  // reclaims both while tensors still hold them
    EXPECT_EQ(error_of([&] { alloc.allocate(16); }).code(), ErrorCode::finalized);
  }  // `second` and the worker go; releasing after finalize is a no-op
  EXPECT_EQ(survivor->nbytes(), 8192u);
  survivor.reset();  // no double free (ASan would report one)
}

TEST(TaskArgsTest, OrderNamesAndTotals) {
  PageableAllocator alloc;
  TaskArgs args;
  EXPECT_TRUE(args.empty());
  args.add(Tensor::empty("x", DType::bf16, {16, 8}, Direction::in, alloc));
  args.add(Tensor::empty("cache", DType::f32, {100}, Direction::inout, alloc));
  args.add(Tensor::empty("out", DType::bf16, {16, 8}, Direction::out, alloc));
  const Error dup =
      error_of([&] { args.add(Tensor::empty("x", DType::f32, {1}, Direction::in, alloc)); });
  EXPECT_EQ(dup.code(), ErrorCode::invalid_argument);
  EXPECT_NE(std::string(dup.what()).find("'x'"), std::string::npos);
  ASSERT_EQ(args.size(), 3u);
  EXPECT_EQ(args.at(0).name(), "x");
  EXPECT_EQ(args.at(1).name(), "cache");
  EXPECT_EQ(args.at(2).name(), "out");
  EXPECT_EQ(error_of([&] { args.at(3); }).code(), ErrorCode::invalid_argument);
  EXPECT_EQ(args.get("cache").numel(), 100u);
  const Error missing = error_of([&] { args.get("nope"); });
  EXPECT_EQ(missing.code(), ErrorCode::not_found);
  EXPECT_NE(std::string(missing.what()).find("nope"), std::string::npos);
  EXPECT_EQ(args.find("nope"), nullptr);
  EXPECT_EQ(args.find("out"), &args.at(2));
  EXPECT_EQ(args.total_bytes(), 256u + 400u + 256u);
  EXPECT_EQ(args.input_bytes(), 656u);
  EXPECT_EQ(args.input_count(), 2u);
  EXPECT_EQ(args.summary(), "3 tensors, 2 inputs, 656 bytes");
  std::vector<std::string> names;
  for (const Tensor& t : args) names.push_back(t.name());
  EXPECT_EQ(names, (std::vector<std::string>{"x", "cache", "out"}));
}

}  // namespace
}  // namespace pinstage
