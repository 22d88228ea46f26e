// Tensor-parallel loading: every rank's slices are byte-exact against an independent
// reference (each element of the whole tensor handed to the rank that owns its index, in
// row-major order) for tp 1, 2, 4 and 8, even and uneven, dim 0, dim 1 and a 3-D last dim,
// on a sharded checkpoint of several dtypes; the bytes read equal the checkpoint's; every
// refusal of the plan parser, the builders and the load has its exact message; a failed
// allocation leaves nothing allocated. A slice read (read_tensor_slice) asks the files for
// exactly its bytes and matches a reference gathered element by element.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "pinstage/checkpoint.h"
#include "pinstage/load_plan.h"
#include "pinstage/safetensors.h"
#include "pinstage/worker.h"
#include "temp_dir_test_util.h"
#include "tensor_test_util.h"

namespace pinstage {
namespace {

using test::CountingAllocator;
using test::error_of;
namespace fs = std::filesystem;

struct Spec {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
};

// Sizes along the split dims: even and uneven for tp 2, 4 and 8, never below 8.
std::vector<Spec> specs() {
  return {{"model.layers.0.q_proj.weight", DType::f32, {16, 10}},       // dim 0, even
          {"model.layers.0.q_proj.bias", DType::f32, {12}},             // dim 0, uneven at 8
          {"model.layers.0.o_proj.weight", DType::bf16, {9, 13}},       // dim 1, uneven
          {"model.layers.0.mlp.up_proj.weight", DType::f16, {8, 6}},    // dim 0 (regex)
          {"model.layers.0.mlp.down_proj.weight", DType::i8, {5, 16}},  // dim 1, even
          {"model.layers.0.input_norm.weight", DType::f32, {10}},       // replicated
          {"attn.cube", DType::f64, {3, 4, 11}},                        // dim -1 (2), uneven
          {"model.embed.weight", DType::i32, {17, 8}},                  // dim 0, uneven
          {"u8_3d", DType::u8, {2, 9, 8}},                              // dim 1 of 3, inner 8
          {"scalar", DType::f64, {}},                                   // the default
          {"empty_rows", DType::bf16, {0, 8}}};                         // dim 1 of 0 rows
}

TpPlan plan() {
  TpPlan p;
  p.split("*.q_proj.*", 0)
      .split("*.o_proj.weight", 1)
      .split_regex(R"(model\.layers\.\d+\.mlp\.up_proj\.weight)", 0)
      .split("*.down_proj.weight", 1)
      .replicate("*norm*")
      .split("attn.cube", -1)
      .split("model.embed.weight", 0)
      .split("u8_3d", 1)
      .split("empty_rows", 1)
      .replicate("never.matches");
  return p;
}

unsigned char byte_at(size_t k, uint64_t i) {
  return static_cast<unsigned char>((i * 2654435761u + k * 97 + (i >> 9)) >> 5);
}

// The reference: rank r's slice of `bytes` (row-major `shape`, element `elem` bytes) along
// `dim` over n parts, the first size % n parts one longer (numpy.array_split), built by
// walking every element of the whole tensor and appending it to the rank owning its index.
std::vector<std::string> reference(const std::string& bytes, const std::vector<int64_t>& shape,
                                   size_t elem, int dim, int n) {
  std::vector<std::string> out(static_cast<size_t>(n));
  const int64_t size = shape[static_cast<size_t>(dim)];
  std::vector<int> owner;
  for (int r = 0; r < n; ++r)
    for (int64_t k = 0; k < size / n + (r < size % n ? 1 : 0); ++k) owner.push_back(r);
  int64_t inner = 1;
  for (size_t i = static_cast<size_t>(dim) + 1; i < shape.size(); ++i) inner *= shape[i];
  for (uint64_t e = 0; e < bytes.size() / elem; ++e) {
    const auto index = static_cast<size_t>((static_cast<int64_t>(e) / inner) % size);
    out[static_cast<size_t>(owner[index])] += bytes.substr(e * elem, elem);
  }
  return out;
}

class LoadTpTest : public test::TempDirTest {
 protected:
  LoadTpTest() : TempDirTest("tp") {}

  // specs() as a checkpoint of shards of at most 300 bytes; bytes_[name] what was written.
  std::string sharded() {
    PageableAllocator pageable;
    TaskArgs args;
    const auto all = specs();
    for (size_t k = 0; k < all.size(); ++k) {
      args.add(Tensor::empty(all[k].name, all[k].dtype, all[k].shape, Direction::in, pageable));
      std::string bytes(args.at(k).nbytes(), '\0');
      for (uint64_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>(byte_at(k, i));
      if (!bytes.empty()) std::memcpy(args.at(k).data(), bytes.data(), bytes.size());
      bytes_[all[k].name] = bytes;
    }
    const std::string d = (dir_ / "model").string();
    EXPECT_GT(save_sharded_checkpoint(args, d, 300), 3u);
    return d;
  }

  std::map<std::string, std::string> bytes_;
};

std::string storage_bytes(const TpTensor& t) {
  EXPECT_EQ(t.storage->bytes(), t.bytes) << t.info.name;
  return t.bytes ? std::string(static_cast<const char*>(t.storage->data()), t.bytes) : "";
}

// Every rank's every tensor against the reference; the read counter against the checkpoint.
void expect_load(const Checkpoint& c, const TpHostLoad& load, int tp,
                 const std::map<std::string, std::string>& written) {
  ASSERT_EQ(load.ranks.size(), static_cast<size_t>(tp));
  EXPECT_EQ(load.report.read_bytes, c.total_bytes()) << "every byte read once";
  EXPECT_EQ(load.report.load.bytes, c.total_bytes());
  uint64_t host = 0, scattered = 0;
  ASSERT_EQ(load.report.ranks.size(), static_cast<size_t>(tp));
  for (int r = 0; r < tp; ++r) {
    const auto& tensors = load.ranks[static_cast<size_t>(r)];
    ASSERT_EQ(tensors.size(), c.tensors().size());
    TpRankReport want;  // the rank's figures, from its tensors
    for (const TpTensor& t : tensors) {
      want.bytes += t.bytes;
      (t.dim < 0  ? want.shared_bytes
       : t.staged ? want.scatter_bytes
                  : want.direct_bytes) += t.bytes;
    }
    const TpRankReport& got = load.report.ranks[static_cast<size_t>(r)];
    EXPECT_EQ(std::make_tuple(got.bytes, got.direct_bytes, got.scatter_bytes, got.shared_bytes),
              std::make_tuple(want.bytes, want.direct_bytes, want.scatter_bytes, want.shared_bytes))
        << "rank " << r;
    scattered += got.scatter_bytes;
    for (size_t k = 0; k < tensors.size(); ++k) {
      const TpTensor& t = tensors[k];
      const std::string& whole = written.at(t.info.name);
      if (t.dim < 0) {
        EXPECT_EQ(t.storage, load.ranks[0][k].storage) << t.info.name << ": one shared storage";
        EXPECT_EQ(t.shape, t.info.shape);
        EXPECT_EQ(storage_bytes(t), whole) << t.info.name;
        if (r == 0) host += t.bytes;
        continue;
      }
      host += t.bytes;
      const auto ref = reference(whole, t.info.shape, t.info.element_size, t.dim, tp);
      EXPECT_EQ(storage_bytes(t), ref[static_cast<size_t>(r)]) << t.info.name << " rank " << r;
      std::vector<int64_t> shape = t.info.shape;
      const auto d = static_cast<size_t>(t.dim);
      shape[d] = shape[d] / tp + (r < shape[d] % tp ? 1 : 0);
      EXPECT_EQ(t.shape, shape) << t.info.name << " rank " << r;
    }
  }
  EXPECT_EQ(load.report.host_bytes, host);
  EXPECT_EQ(scattered, load.report.scatter_bytes) << "the staged rows, each to one rank";
}

// Every tp of 1, 2, 4 and 8 with chunks of 8 MiB and of 7 bytes (many batches of one
// row) on 1 and 3 threads: fn(tp, options), traced.
template <typename F>
void each_case(F&& fn) {
  for (int tp : {1, 2, 4, 8})
    for (uint64_t chunk : {uint64_t{8} << 20, uint64_t{7}})
      for (int threads : {1, 3}) {
        SCOPED_TRACE("tp " + std::to_string(tp) + " chunk " + std::to_string(chunk) + " threads " +
                     std::to_string(threads));
        CheckpointLoadOptions o;
        o.chunk_bytes = chunk;
        o.threads = threads;
        fn(tp, o);
      }
}

TEST_F(LoadTpTest, SlicesMatchTheReferenceForTp1248AndEveryLayout) {
  const Checkpoint c = Checkpoint::open(sharded());
  each_case([&](int tp, CheckpointLoadOptions o) {
    o.verify = true;  // pinstage's writer records every hash
    PageableAllocator pageable;
    const TpHostLoad load = load_tp_to_host(c, plan(), tp, pageable, o);
    expect_load(c, load, tp, bytes_);
    EXPECT_TRUE(load.report.load.verified);
    EXPECT_EQ(load.report.replicated, 2u);  // the norm and the scalar (the default)
    EXPECT_EQ(load.report.strided, 4u);     // o_proj, down_proj, cube, u8_3d
    EXPECT_EQ(load.report.contiguous, 5u);  // q weight and bias, up, embed, empty_rows
    EXPECT_EQ(load.report.unused_rules, std::vector<int>{9});
    EXPECT_EQ(load.report.scatter_bytes, 9 * 13 * 2 + 5 * 16 + 3 * 4 * 11 * 8 + 2 * 9 * 8);
  });
}

TEST_F(LoadTpTest, IntoPinnedMemoryOfASimWorkerWithProgressToTheEnd) {
  const Checkpoint c = Checkpoint::open(sharded());
  Worker worker;
  worker.init("sim");
  {
    PinnedAllocator pinned(worker);
    CheckpointLoadOptions o;
    o.chunk_bytes = 64;
    uint64_t last = 0, total = 0;
    o.progress = [&](uint64_t done, uint64_t all) {
      EXPECT_GE(done, last);
      last = done;
      total = all;
    };
    const TpHostLoad load = load_tp_to_host(c, plan(), 4, pinned, o);
    expect_load(c, load, 4, bytes_);
    EXPECT_EQ(last, c.total_bytes());
    EXPECT_EQ(total, c.total_bytes());
    for (const TpTensor& t : load.ranks[3]) {
      if (t.bytes > 0) {
        EXPECT_TRUE(t.storage->pinned()) << t.info.name;
      }
    }
    EXPECT_GE(worker.stats().pinned_bytes, load.report.host_bytes);
  }
  worker.finalize();
}

TEST(TpPart, IsNumpyArraySplit) {
  // numpy.array_split(range(10), 4) -> [0 1 2] [3 4 5] [6 7] [8 9]
  const std::vector<std::pair<int64_t, int64_t>> want = {{0, 3}, {3, 3}, {6, 2}, {8, 2}};
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(tp_part(10, 4, r).begin, want[static_cast<size_t>(r)].first);
    EXPECT_EQ(tp_part(10, 4, r).count, want[static_cast<size_t>(r)].second);
  }
  EXPECT_EQ(tp_part(8, 8, 7).begin, 7);
  EXPECT_EQ(tp_part(8, 8, 7).count, 1);
  EXPECT_EQ(std::string(error_of([] { tp_part(8, 2, 2); }).what()),
            "tp_part: rank 2 of 2 parts of a dimension of size 8");
}

TEST(TpPlan, GlobsRegexesFirstMatchAndTheDefault) {
  TpPlan p;
  p.split("a.*.w", 0).replicate("a.?.b").split_regex(R"(x\d+)", 1).replicate("*").default_split(0);
  EXPECT_EQ(p.match("a.1.w"), 0);
  EXPECT_EQ(p.match("a.long.name.w"), 0) << "'*' crosses dots";
  EXPECT_EQ(p.match("a.1.b"), 1);
  EXPECT_EQ(p.match("a.12.b"), 3) << "'?' is one character";
  EXPECT_EQ(p.match("x12"), 2);
  EXPECT_EQ(p.match("ax12"), 3) << "a regex matches the whole name";
  EXPECT_EQ(TpPlan().split("a.b", 0).match("axb"), -1) << "'.' in a glob is itself";
  EXPECT_EQ(p.describe(0), "rule 1 (match 'a.*.w': split dim 0)");
  EXPECT_EQ(p.describe(2), "rule 3 (regex 'x\\d+': split dim 1)");
  EXPECT_EQ(p.describe(-1), "the default (split dim 0)");
}

// The message of the Error `fn` throws, which must be invalid_argument.
template <typename F>
std::string refusal(F&& fn) {
  const Error e = error_of(fn);
  EXPECT_EQ(e.code(), ErrorCode::invalid_argument) << e.what();
  return e.what();
}

std::string parse_error(const std::string& text) {
  return refusal([&] { TpPlan::parse(text, "p.json"); });
}

TEST(TpPlan, ParsesTheJsonForm) {
  const TpPlan p = TpPlan::parse(R"({"format": "pinstage.tp_plan/1", "tp": 4,
      "rules": [{"match": "*.q_proj.weight", "split": 0},
                {"regex": "m\\.(o|down)_proj\\.weight", "split": -1},
                {"match": "*norm*", "replicate": true}],
      "default": {"split": 1}})",
                                 "p.json");
  ASSERT_EQ(p.rules().size(), 3u);
  EXPECT_EQ(p.tp(), 4);
  EXPECT_EQ(p.default_dim(), 1);
  EXPECT_EQ(p.match("l.q_proj.weight"), 0);
  EXPECT_EQ(p.match("m.down_proj.weight"), 1);
  EXPECT_EQ(p.rules()[1].split_dim, -1);
  EXPECT_FALSE(p.rules()[2].split_dim.has_value());
  const TpPlan minimal = TpPlan::parse(R"({"format": "pinstage.tp_plan/1", "rules": []})", "m");
  EXPECT_FALSE(minimal.tp().has_value());
  EXPECT_FALSE(minimal.default_dim().has_value());
}

TEST(TpPlan, EveryBadPlanFileIsRefusedByName) {
  const std::string head = R"({"format": "pinstage.tp_plan/1", )";
  const std::string pre = "tp plan 'p.json': ";
  // Each plan's body after the format key, and the refusal that names its fault.
  const std::pair<const char*, const char*> refused[] = {
      {R"("rules": [], "rule": []})", "the plan has an unknown key 'rule'"},
      {R"("rules": [{"match": "a", "split": 0, "dim": 1}]})", "rule 1 has an unknown key 'dim'"},
      {R"("rules": [], "tp": 2, "tp": 4})", "the plan repeats the key 'tp'"},
      {R"("rules": [{"match": "a", "split": 0, "split": 1}]})",
       "the plan repeats the key 'split' inside one object"},
      {R"("rules": [{"match": "a", "split": 64}]})",
       "rule 1: \"split\" is 64; it must be in [-64, 63]"},
      {R"("rules": [{"match": "a", "split": -65}]})",
       "rule 1: \"split\" is -65; it must be in [-64, 63]"},
      {R"("rules": [{"match": "a", "split": 1.0}]})",
       "rule 1: \"split\" is not a whole number (it must be in [-64, 63])"},
      {R"("rules": [{"match": "a", "split": true}]})",
       "rule 1: \"split\" is not a whole number (it must be in [-64, 63])"},
      {R"("rules": [], "tp": 0})", "\"tp\" is 0; it must be in [1, 1024]"},
      {R"("rules": [], "tp": 18446744073709551615})",
       "\"tp\" is 18446744073709551615; it must be in [1, 1024]"},
      {R"("rules": [], "tp": 1025})", "\"tp\" is 1025; it must be in [1, 1024]"},
      {R"("rules": [], "tp": "2"})", "\"tp\" is not a whole number (it must be in [1, 1024])"},
      {R"("rules": [{"match": "a", "regex": "a", "split": 0}]})",
       "rule 1 has both \"match\" and \"regex\"; give one"},
      {R"("rules": [{"split": 0}]})", "rule 1 has neither \"match\" (a glob) nor \"regex\""},
      {R"("rules": [{"match": "a"}]})", "rule 1 has neither \"split\" nor \"replicate\""},
      {R"("rules": [{"match": "a", "split": 0, "replicate": true}]})",
       "rule 1 has both \"split\" and \"replicate\"; give one"},
      {R"("rules": [{"match": "a", "replicate": false}]})",
       "rule 1: \"replicate\" must be true (a rule that splits says \"split\": DIM)"},
      {R"("rules": [{"match": "", "split": 0}]})", "rule 1: \"match\" is empty"},
      {R"("rules": [{"match": 3, "split": 0}]})", "rule 1: \"match\" is not a string"},
      {R"("rules": [{"match": "a", "split": 0}, "b"]})", "rule 2 is not an object"},
      {R"("rules": {}})", "it has no \"rules\" array (an empty one replicates everything)"},
      {R"("rules": [], "default": {"split": 0, "x": 1}})", "the default has an unknown key 'x'"},
      {R"("rules": [], "default": "replicate"})", "\"default\" is not an object"},
  };
  for (const auto& [body, why] : refused) EXPECT_EQ(parse_error(head + body), pre + why) << body;
  EXPECT_EQ(parse_error(R"({"rules": []})"), pre + "its \"format\" is not \"pinstage.tp_plan/1\"");
  EXPECT_EQ(parse_error("[]"), pre + "the plan is not a JSON object");
  EXPECT_NE(parse_error("{").find(pre + "the plan is not valid JSON"), std::string::npos);
  EXPECT_NE(parse_error(head + R"("rules": [{"regex": "(", "split": 0}]})")
                .find(pre + "rule 1: regex '(' does not compile: "),
            std::string::npos);
  EXPECT_EQ(refusal([] { TpPlan::read_file("/nonexistent/plan.json"); }),
            "tp plan '/nonexistent/plan.json': cannot read it: No such file or directory");
}

TEST(TpPlan, TheBuildersRefuseWhatTheParserRefuses) {
  const std::string pre = "tp plan (built in code): ";
  EXPECT_EQ(refusal([] { TpPlan().split("", 0); }), pre + "rule 1: its match is empty");
  EXPECT_EQ(refusal([] { TpPlan().replicate("a").split("b", 64); }),
            pre +
                "rule 2: split dim 64 is out of range [-64, 63] (negative counts from the "
                "last dim)");
  EXPECT_NE(refusal([] {
              TpPlan().split_regex("[", 0);
            }).find(pre + "rule 1: regex '[' does not compile: "),
            std::string::npos);
  EXPECT_EQ(refusal([] { TpPlan().default_split(-65); }),
            pre +
                "the default: split dim -65 is out of range [-64, 63] (negative counts from "
                "the last dim)");
  EXPECT_EQ(refusal([] { TpPlan().expect_tp(0); }),
            "tp plan (built in code): \"tp\" is 0; it must be a whole number in [1, 1024]");
}

TEST_F(LoadTpTest, EveryImpossibleSplitIsRefusedBeforeAnyAllocation) {
  const Checkpoint c = Checkpoint::open(sharded());
  CountingAllocator alloc;
  auto load = [&](const TpPlan& p, int tp) {
    return refusal([&] { load_tp_to_host(c, p, tp, alloc); });
  };
  EXPECT_EQ(load(TpPlan().split("*input_norm*", 1), 2),
            "tp load: tensor 'model.layers.0.input_norm.weight' (shape [10]): rule 1 (match "
            "'*input_norm*': split dim 1) cannot split it: it has 1 dim (0..0, or -1..-1); "
            "nothing was loaded");
  EXPECT_EQ(load(TpPlan().split("*input_norm*", -2), 2),
            "tp load: tensor 'model.layers.0.input_norm.weight' (shape [10]): rule 1 (match "
            "'*input_norm*': split dim -2) cannot split it: it has 1 dim (0..0, or -1..-1); "
            "nothing was loaded");
  EXPECT_EQ(load(TpPlan().split("attn.cube", 3), 2),
            "tp load: tensor 'attn.cube' (shape [3, 4, 11]): rule 1 (match 'attn.cube': split "
            "dim 3) cannot split it: it has 3 dims (0..2, or -3..-1); nothing was loaded");
  EXPECT_EQ(load(TpPlan().replicate("*.*").default_split(0), 2),
            "tp load: tensor 'scalar' (shape []): the default (split dim 0) cannot split it: it "
            "has 0 dims; nothing was loaded");
  EXPECT_EQ(load(TpPlan().split("*down_proj*", 0), 8),
            "tp load: tensor 'model.layers.0.mlp.down_proj.weight' (shape [5, 16]): rule 1 "
            "(match '*down_proj*': split dim 0) would split dim 0 of size 5 into 8 parts: 3 "
            "would be empty (replicate it, or split a dim of at least tp); nothing was "
            "loaded");
  EXPECT_EQ(load(TpPlan().split("empty_rows", 0), 1),
            "tp load: tensor 'empty_rows' (shape [0, 8]): rule 1 (match 'empty_rows': split dim "
            "0) would split dim 0 of size 0 into 1 part: 1 would be empty (replicate it, "
            "or split a dim of at least tp); nothing was loaded");
  EXPECT_EQ(load(plan(), 9),
            "tp load: tensor 'model.layers.0.mlp.up_proj.weight' (shape [8, 6]): rule 3 (regex "
            "'model\\.layers\\.\\d+\\.mlp\\.up_proj\\.weight': split dim 0) would split "
            "dim 0 of size 8 into 9 parts: 1 would be empty (replicate it, or split a dim "
            "of at least tp); nothing was loaded");
  EXPECT_EQ(load(plan(), 0), "tp load: tp is 0; it must be a whole number in [1, 1024]");
  EXPECT_EQ(load(plan(), 1025), "tp load: tp is 1025; it must be a whole number in [1, 1024]");
  EXPECT_EQ(load(TpPlan().expect_tp(4), 2), "tp load: the plan was written for tp 4, not 2");
  EXPECT_EQ(alloc.calls(), 0) << "nothing was allocated for any refusal";
}

TEST_F(LoadTpTest, AFailedAllocationLeavesNothingAllocated) {
  const Checkpoint c = Checkpoint::open(sharded());
  int allocations = 0;
  {
    CountingAllocator alloc;
    load_tp_to_host(c, plan(), 4, alloc);
    allocations = alloc.calls();
    EXPECT_EQ(alloc.live(), 0);
  }
  EXPECT_EQ(allocations, 2 + 9 * 4) << "replicated once, split once per rank";
  for (int fail = 1; fail <= allocations; ++fail) {
    CountingAllocator alloc;
    alloc.fail_at(fail);
    const Error e = error_of([&] { load_tp_to_host(c, plan(), 4, alloc); });
    EXPECT_EQ(e.code(), ErrorCode::out_of_memory) << e.what();
    EXPECT_EQ(alloc.live(), 0) << "allocation " << fail << " failed; all others released";
  }
}

TEST_F(LoadTpTest, VerifyCatchesAFlippedByteInAStridedAndAContiguousSplit) {
  const std::string d = sharded();
  for (const std::string name : {"model.layers.0.o_proj.weight", "model.embed.weight"}) {
    const Checkpoint clean = Checkpoint::open(d);
    const CheckpointTensor& t = clean.get(name);
    const std::string file = clean.files()[t.file].path;
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(t.offset + t.bytes - 1));
    const char flipped = static_cast<char>(~bytes_[name].back());
    f.write(&flipped, 1);
    f.close();
    const Checkpoint c = Checkpoint::open(d);
    CheckpointLoadOptions o;
    o.verify = true;
    CountingAllocator alloc;
    const Error e = error_of([&] { load_tp_to_host(c, plan(), 2, alloc, o); });
    EXPECT_EQ(e.code(), ErrorCode::io);
    EXPECT_NE(std::string(e.what()).find("tensor '" + name + "' fails its integrity check"),
              std::string::npos)
        << e.what();
    EXPECT_EQ(alloc.live(), 0);
    f.open(file, std::ios::in | std::ios::out | std::ios::binary);  // put it back
    f.seekp(static_cast<std::streamoff>(t.offset + t.bytes - 1));
    f.write(&bytes_[name].back(), 1);
  }
}

// ---- read_tensor_slice: the file ranges a slice covers, and only those read ----

// The reference slice: every element of the whole tensor whose index is in the slice,
// in row-major order.
std::string slice_reference(const std::string& bytes, const std::vector<int64_t>& shape,
                            size_t elem, const std::vector<SliceDim>& slice) {
  std::string out;
  for (uint64_t e = 0; e < bytes.size() / elem; ++e) {
    uint64_t rest = e;
    bool in = true;
    for (size_t d = shape.size(); d-- > 0;) {
      const auto i = static_cast<int64_t>(rest % static_cast<uint64_t>(shape[d]));
      rest /= static_cast<uint64_t>(shape[d]);
      const SliceDim& s = slice[d];
      in = in && i >= s.begin && (i - s.begin) % s.step == 0 && (i - s.begin) / s.step < s.count;
    }
    if (in) out += bytes.substr(e * elem, elem);
  }
  return out;
}

TEST(TensorSlice, RowsAreOneRangeAndColumnsOneRangePerRow) {
  CheckpointTensor t;
  t.name = "w";
  t.element_size = 4;
  t.shape = {6, 10};
  t.offset = 1000;
  t.bytes = 240;
  using R = std::vector<std::pair<uint64_t, uint64_t>>;
  auto ranges = [&](const std::vector<SliceDim>& s) {
    R out;
    for (const SliceRange& g : tensor_slice_ranges(t, s)) out.emplace_back(g.offset, g.bytes);
    return out;
  };
  EXPECT_EQ(ranges({{0, 6, 1}, {0, 10, 1}}), (R{{1000, 240}}));             // whole
  EXPECT_EQ(ranges({{2, 3, 1}, {0, 10, 1}}), (R{{1080, 120}}));             // rows 2..4
  EXPECT_EQ(ranges({{1, 2, 1}, {3, 4, 1}}), (R{{1052, 16}, {1092, 16}}));   // columns 3..6
  EXPECT_EQ(ranges({{0, 2, 4}, {0, 10, 1}}), (R{{1000, 40}, {1160, 40}}));  // rows 0, 4
  EXPECT_EQ(ranges({{5, 1, 1}, {1, 3, 4}}), (R{{1204, 4}, {1220, 4}, {1236, 4}}));
  EXPECT_EQ(ranges({{0, 0, 1}, {0, 10, 1}}), R{});  // no elements: nothing to read
  t.shape = {};
  t.bytes = 4;
  EXPECT_EQ(ranges({}), (R{{1000, 4}}));  // a scalar
}

TEST_F(LoadTpTest, ASliceReadsExactlyItsBytesAndMatchesTheReference) {
  const Checkpoint c = Checkpoint::open(sharded());
  const std::vector<std::pair<std::string, std::vector<SliceDim>>> cases = {
      {"model.layers.0.q_proj.weight", {{3, 5, 1}, {0, 10, 1}}},  // rows
      {"model.layers.0.q_proj.weight", {{0, 16, 1}, {7, 3, 1}}},  // columns
      {"model.layers.0.o_proj.weight", {{1, 4, 2}, {2, 4, 3}}},   // steps on both
      {"attn.cube", {{2, 1, 1}, {1, 3, 1}, {4, 7, 1}}},           // a 3-D block
      {"u8_3d", {{0, 2, 1}, {8, 1, 1}, {0, 8, 1}}},               // the last row of each
      {"model.layers.0.q_proj.bias", {{11, 1, 1}}},
      {"scalar", {}},
      {"empty_rows", {{0, 0, 1}, {2, 3, 1}}},
  };
  for (const auto& [name, slice] : cases)
    for (uint64_t chunk : {uint64_t{8} << 20, uint64_t{3}}) {
      SCOPED_TRACE(name + " chunk " + std::to_string(chunk));
      const CheckpointTensor& t = c.get(name);
      const std::string want = slice_reference(bytes_.at(name), t.shape, t.element_size, slice);
      std::string got(want.size() + 8, '\x5a');  // 8 guard bytes stay untouched
      CheckpointLoadOptions o;
      o.chunk_bytes = chunk;
      o.threads = 3;
      uint64_t last = 0;
      o.progress = [&](uint64_t done, uint64_t total) {
        EXPECT_EQ(total, want.size());
        last = done;
      };
      const LoadReport r = read_tensor_slice(c, t, slice, got.data(), o);
      EXPECT_EQ(r.bytes, want.size()) << "only the slice's bytes are read";
      EXPECT_EQ(last, want.empty() ? 0 : want.size());
      EXPECT_EQ(got.substr(0, want.size()), want);
      EXPECT_EQ(got.substr(want.size()), std::string(8, '\x5a'));
    }
}

TEST_F(LoadTpTest, EveryBadSliceIsRefusedByName) {
  const Checkpoint c = Checkpoint::open(sharded());
  const CheckpointTensor& t = c.get("model.layers.0.o_proj.weight");  // [9, 13]
  char dst[512];
  auto message = [&](const std::vector<SliceDim>& s, CheckpointLoadOptions o = {}) {
    return std::string(error_of([&] { read_tensor_slice(c, t, s, dst, o); }).what());
  };
  const std::string head = "slice of tensor 'model.layers.0.o_proj.weight' (shape [9, 13]): ";
  EXPECT_EQ(message({{0, 9, 1}}), head + "1 dims given for a tensor of 2");
  EXPECT_EQ(message({{0, 9, 1}, {-1, 2, 1}}),
            head + "dim 1 (begin -1, count 2, step 1): begin and count must be >= 0");
  EXPECT_EQ(message({{0, 9, 0}, {0, 13, 1}}),
            head + "dim 0 (begin 0, count 9, step 0): the step must be >= 1");
  EXPECT_EQ(message({{0, 9, 1}, {10, 4, 1}}),
            head + "dim 1 (begin 10, count 4, step 1) reaches past the dim's size 13");
  EXPECT_EQ(message({{1, 5, 2}, {0, 13, 1}}),
            head + "dim 0 (begin 1, count 5, step 2) reaches past the dim's size 9");
  EXPECT_EQ(message({{9, 1, 1}, {0, 13, 1}}),
            head + "dim 0 (begin 9, count 1, step 1) reaches past the dim's size 9");
  EXPECT_EQ(read_tensor_slice(c, t, {{9, 0, 1}, {0, 13, 1}}, dst).bytes, 0u);  // empty, at the end
  CheckpointLoadOptions verify;
  verify.verify = true;
  EXPECT_NE(message({{0, 1, 1}, {0, 13, 1}}, verify)
                .find("verify cannot check a slice of tensor 'model.layers.0.o_proj.weight'"),
            std::string::npos);
  verify.verify_if_present = true;
  EXPECT_EQ(read_tensor_slice(c, t, {{0, 1, 1}, {0, 13, 1}}, dst, verify).unverified, 1u);
  CheckpointTensor big = t;
  big.shape = {int64_t{1} << 20, 64};
  EXPECT_NE(std::string(error_of([&] {
                          tensor_slice_ranges(big, {{0, 1 << 20, 1}, {0, 32, 2}});
                        }).what())
                .find("more than 16777216 separate byte ranges"),
            std::string::npos);
}

// ---- one rank alone ----

// Each rank loaded alone has exactly what the all-ranks load gives it, reads its own
// bytes and nothing else (the ranks' reads add up to the checkpoint once), and
// copy_tp_slice cuts the same slice out of the whole tensor in memory.
TEST_F(LoadTpTest, EachRankAloneReadsOnlyItsSlicesAndMatchesTheAllRanksLoad) {
  const Checkpoint c = Checkpoint::open(sharded());
  each_case([&](int tp, const CheckpointLoadOptions& o) {
    PageableAllocator pageable;
    const TpHostLoad all = load_tp_to_host(c, plan(), tp, pageable, o);
    uint64_t read = 0;
    for (int rank = 0; rank < tp; ++rank) {
      const TpRankLoad one = load_tp_rank_to_host(c, plan(), tp, rank, pageable, o);
      const auto& want = all.ranks[static_cast<size_t>(rank)];
      ASSERT_EQ(one.tensors.size(), want.size());
      uint64_t mine = 0;
      for (size_t k = 0; k < want.size(); ++k) {
        const TpTensor& t = one.tensors[k];
        EXPECT_EQ(t.shape, want[k].shape) << t.info.name;
        EXPECT_EQ(t.begin, want[k].begin) << t.info.name;
        EXPECT_EQ(storage_bytes(t), storage_bytes(want[k])) << t.info.name << " rank " << rank;
        const std::string& whole = bytes_.at(t.info.name);
        std::string copied(t.bytes, '\0');
        copy_tp_slice(t, whole.data(), copied.data(), o.threads);
        EXPECT_EQ(copied, storage_bytes(want[k])) << t.info.name << " copied, rank " << rank;
        mine += t.bytes;
      }
      EXPECT_EQ(one.report.read_bytes, mine) << "rank " << rank << " read its bytes only";
      EXPECT_EQ(one.report.host_bytes, mine);
      EXPECT_EQ(one.report.replicated + one.report.contiguous + one.report.strided,
                c.tensors().size());
      EXPECT_EQ(one.report.unused_rules, std::vector<int>{9});
      read += one.report.read_bytes;
    }
    uint64_t replicated = 0;
    for (const TpTensor& t : all.ranks[0])
      if (t.dim < 0) replicated += t.bytes;
    EXPECT_EQ(read, c.total_bytes() + replicated * static_cast<uint64_t>(tp - 1))
        << "split bytes read once over the ranks, replicated ones by each rank";
  });
}

TEST(TpPieces, ARowSplitIsOnePieceAColumnSplitOnePerRowAWholeRowMerged) {
  TpTensor t;
  t.info.element_size = 2;
  t.info.shape = {3, 10};
  t.info.bytes = 60;
  t.shape = {3, 4};
  t.dim = 1;
  t.begin = 3;
  t.bytes = 24;
  const auto pieces = tp_slice_pieces(t);
  ASSERT_EQ(pieces.size(), 3u);
  EXPECT_EQ(pieces[1].offset, 20u + 6u);
  EXPECT_EQ(pieces[1].bytes, 8u);
  EXPECT_EQ(pieces[1].slice_offset, 8u);
  t.shape = {3, 10};
  t.begin = 0;
  t.bytes = 60;
  ASSERT_EQ(tp_slice_pieces(t).size(), 1u) << "tp 1: the rows meet";
  t.dim = 0;
  t.shape = {1, 10};
  t.begin = 2;
  t.bytes = 20;
  const auto rows = tp_slice_pieces(t);
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0].offset, 40u);
  EXPECT_EQ(rows[0].bytes, 20u);
}

TEST_F(LoadTpTest, ARankLoadRefusesBeforeAnyAllocationAndLeavesNothingOnFailure) {
  const Checkpoint c = Checkpoint::open(sharded());
  CountingAllocator alloc;
  EXPECT_EQ(refusal([&] { load_tp_rank_to_host(c, plan(), 4, 4, alloc); }),
            "tp load: rank 4 is not in [0, 4) for tp 4");
  EXPECT_EQ(refusal([&] { load_tp_rank_to_host(c, plan(), 2, -1, alloc); }),
            "tp load: rank -1 is not in [0, 2) for tp 2");
  CheckpointLoadOptions o;
  o.verify = true;
  EXPECT_EQ(refusal([&] { load_tp_rank_to_host(c, plan(), 2, 0, alloc, o); }),
            "tp rank load: verify is refused: a rank's slice is no whole tensor to check "
            "against its recorded hash (load_tp_to_host verifies every rank at once)");
  EXPECT_EQ(refusal([&] {
              load_tp_rank_to_host(c, plan(), 9, 0, alloc);
            }).rfind("tp load: tensor 'model.layers.0.mlp.up_proj.weight'", 0),
            0u)
      << "resolve_tp_plan's refusal";
  EXPECT_EQ(alloc.calls(), 0) << "nothing was allocated for any refusal";
  const auto slices = tp_rank_slices(c, plan(), 2, 1);
  EXPECT_EQ(refusal([&] { read_tp_slices(c, slices, {}); }),
            "tp rank load: 0 destinations for 11 slices");
  const int allocations = static_cast<int>(slices.size());
  for (int fail = 1; fail <= allocations; ++fail) {
    CountingAllocator failing;
    failing.fail_at(fail);
    const Error e = error_of([&] { load_tp_rank_to_host(c, plan(), 2, 1, failing); });
    EXPECT_EQ(e.code(), ErrorCode::out_of_memory) << e.what();
    EXPECT_EQ(failing.live(), 0) << "allocation " << fail << " failed; all others released";
  }
}

}  // namespace
}  // namespace pinstage
