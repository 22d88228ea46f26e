// The golden decode on the real fixture: inputs are never modified, the K/V rows land
// exactly at the spec's slots, the in-place form (the sim callable's) writes only those rows,
// results do not depend on the thread count or kernel set, and bad inputs are refused
// before anything is written.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "pinstage/dtype.h"
#include "pinstage/error.h"
#include "pinstage/parallel.h"
#include "pinstage/qwen3/decode.h"
#include "pinstage/qwen3/golden.h"
#include "pinstage/qwen3/kernels.h"
#include "pinstage/tensor.h"

namespace {

using namespace pinstage;
using namespace pinstage::qwen3;
namespace D = pinstage::qwen3::kernels;

constexpr int kLayers = 2;
constexpr int kSeqLen = 300;  // not a multiple of 128: the last page is partly used

// Content hash of a byte range: 1 MiB blocks hashed in parallel, combined by block index.
uint64_t hash_bytes(const void* data, size_t bytes) {
  constexpr size_t kBlock = size_t{1} << 20;
  const size_t blocks = (bytes + kBlock - 1) / kBlock;
  std::vector<uint64_t> h(blocks);
  const auto* p = static_cast<const unsigned char*>(data);
  parallel_for(blocks, 1, [&](size_t begin, size_t end) {
    for (size_t b = begin; b < end; ++b) {
      uint64_t x = 0x9e3779b97f4a7c15ull ^ b;
      const size_t lo = b * kBlock, hi = std::min(bytes, lo + kBlock);
      size_t i = lo;
      for (; i + 8 <= hi; i += 8) {
        uint64_t w;
        std::memcpy(&w, p + i, 8);
        x = (x ^ w) * 0x100000001b3ull;
        x ^= x >> 29;
      }
      for (; i < hi; ++i) x = (x ^ p[i]) * 0x100000001b3ull;
      h[b] = x;
    }
  });
  uint64_t all = bytes;
  for (uint64_t x : h) all = (all ^ x) * 0xff51afd7ed558ccdull;
  return all;
}

std::vector<uint64_t> hash_all(const TaskArgs& args) {
  std::vector<uint64_t> hashes;
  for (const Tensor& t : args) hashes.push_back(hash_bytes(t.data(), t.nbytes()));
  return hashes;
}

// The real fixture for `layers` layers at kSeqLen, generated once per process (a test
// binary run by ctest runs one test per process, so few tests use it).
const TaskArgs& fixture(int layers) {
  static PageableAllocator allocator;
  static std::unique_ptr<TaskArgs> args[3];
  if (!args[layers]) {
    Config config;
    config.n_layers = layers;
    config.seq_len = kSeqLen;
    args[layers] = std::make_unique<TaskArgs>(make_args(allocator, config));
  }
  return *args[layers];
}

// The twenty arguments shaped for `layers` layers but never filled: the allocator does not
// touch pages, so this is free; for tests that must fail before any data is read.
TaskArgs unfilled_args(int layers) {
  static PageableAllocator allocator;
  Config config;
  config.n_layers = layers;
  TaskArgs args;
  for (const TensorSpec& spec : tensor_specs(config))
    args.add(Tensor::empty(spec.name, spec.dtype, spec.shape, spec.dir, allocator));
  return args;
}

std::vector<uint64_t> hash_except(const TaskArgs& args, const std::vector<std::string>& skip) {
  std::vector<uint64_t> hashes;
  for (const Tensor& t : args)
    if (std::find(skip.begin(), skip.end(), t.name()) == skip.end())
      hashes.push_back(hash_bytes(t.data(), t.nbytes()));
  return hashes;
}

TEST(GoldenDecode, ReadsOnlyWritesTheSpecSlotsAndRunsInPlaceToTheSameResult) {
  const TaskArgs& args = fixture(kLayers);
  const std::vector<uint64_t> before = hash_all(args);
  const Golden golden = compute_golden(args, kLayers);
  // 1. compute_golden modifies no input (nor out).
  ASSERT_EQ(hash_all(args), before);
  EXPECT_EQ(golden.n_layers, kLayers);
  ASSERT_EQ(golden.out.size(), static_cast<size_t>(kBatch) * kHidden);
  bool nonzero = false;
  for (uint16_t v : golden.out) {
    ASSERT_FALSE(std::isnan(bf16_to_f32(v)));
    nonzero |= (v & 0x7fff) != 0;
  }
  EXPECT_TRUE(nonzero);

  // 2. The written rows are at the spec's slots, in layer, lane, head order.
  ASSERT_EQ(golden.kv_rows.size(), static_cast<size_t>(kLayers) * kBatch * kNumKvHeads);
  ASSERT_EQ(golden.k_rows.size(), golden.kv_rows.size() * kHeadDim);
  ASSERT_EQ(golden.v_rows.size(), golden.kv_rows.size() * kHeadDim);
  const int64_t pos = kSeqLen - 1;
  size_t e = 0;
  for (int l = 0; l < kLayers; ++l)
    for (int b = 0; b < kBatch; ++b)
      for (int h = 0; h < kNumKvHeads; ++h, ++e) {
        // The spec's paging, written out independently of slot_mapping.
        const int64_t slot =
            (int64_t{b} * kMaxBlocksPerSeq + pos / kBlockSize) * kBlockSize + pos % kBlockSize;
        EXPECT_EQ(golden.kv_rows[e], l * kCacheRows + slot * kNumKvHeads + h)
            << "layer " << l << " lane " << b << " head " << h;
      }
  // Lanes start from different hidden states, so their rows differ.
  EXPECT_NE(std::memcmp(&golden.k_rows[0], &golden.k_rows[kNumKvHeads * kHeadDim], 2 * kHeadDim),
            0);

  // 3. The in-place form (the sim callable's) gives the same result and writes exactly
  // those rows: undoing them restores the caches byte for byte.
  const Tensor& k = args.get("k_cache");
  const Tensor& v = args.get("v_cache");
  const Tensor& out = args.get("out");
  std::vector<uint16_t> k_saved, v_saved;
  for (int64_t row : golden.kv_rows) {
    k_saved.insert(k_saved.end(), k.data_as<uint16_t>() + row * kHeadDim,
                   k.data_as<uint16_t>() + (row + 1) * kHeadDim);
    v_saved.insert(v_saved.end(), v.data_as<uint16_t>() + row * kHeadDim,
                   v.data_as<uint16_t>() + (row + 1) * kHeadDim);
  }
  const std::vector<uint64_t> inputs = hash_except(args, {"k_cache", "v_cache", "out"});
  std::memset(out.data(), 0xff, out.nbytes());

  Golden again;
  run_decode(decode_buffers(args, kLayers), kLayers, /*write_cache=*/true, &again);

  EXPECT_EQ(again.out, golden.out);
  EXPECT_EQ(again.kv_rows, golden.kv_rows);
  EXPECT_EQ(again.k_rows, golden.k_rows);
  EXPECT_EQ(again.v_rows, golden.v_rows);
  EXPECT_EQ(std::memcmp(out.data(), golden.out.data(), out.nbytes()), 0);
  const Comparison c = compare(args, golden);
  EXPECT_TRUE(c.ok) << c.message();
  for (const TensorComparison& t : c.tensors) EXPECT_EQ(t.differing, 0u) << t.message();
  EXPECT_EQ(hash_except(args, {"k_cache", "v_cache", "out"}), inputs);

  for (size_t i = 0; i < golden.kv_rows.size(); ++i) {
    std::memcpy(k.data_as<uint16_t>() + golden.kv_rows[i] * kHeadDim, &k_saved[i * kHeadDim],
                kHeadDim * 2);
    std::memcpy(v.data_as<uint16_t>() + golden.kv_rows[i] * kHeadDim, &v_saved[i * kHeadDim],
                kHeadDim * 2);
  }
  const std::vector<uint64_t> now = hash_all(args);
  for (size_t i = 0; i < now.size(); ++i) {
    if (args.at(i).name() != "out") {
      EXPECT_EQ(now[i], before[i]) << args.at(i).name();
    }
  }
}

TEST(GoldenDecode, SameResultForAnyThreadCountAndKernelSet) {
  DecodeBuffers buf = decode_buffers(fixture(1), 1);
  buf.out = nullptr;
  const D::Isa best_isa = D::default_isa();
  Golden best, one_thread;
  D::run_decode_with(buf, 1, false, &best, best_isa, 2);
  D::run_decode_with(buf, 1, false, &one_thread, best_isa, 1);
  EXPECT_EQ(one_thread.out, best.out);
  EXPECT_EQ(one_thread.k_rows, best.k_rows);
  EXPECT_EQ(one_thread.v_rows, best.v_rows);
  for (D::Isa isa : {D::Isa::generic, D::Isa::avx2, D::Isa::avx512}) {
    if (!D::isa_supported(isa) || isa == best_isa) continue;
    SCOPED_TRACE(D::isa_name(isa));
    Golden other;
    D::run_decode_with(buf, 1, false, &other, isa, 0);
    ASSERT_EQ(other.kv_rows, best.kv_rows);
    // Only the summation order differs: within the spec's tolerance, and nearly all
    // elements bit-identical.
    for (const TensorComparison& c :
         {compare_bf16("out", other.out.data(), best.out.data(), best.out.size()),
          compare_bf16("k_rows", other.k_rows.data(), best.k_rows.data(), best.k_rows.size()),
          compare_bf16("v_rows", other.v_rows.data(), best.v_rows.data(), best.v_rows.size())}) {
      EXPECT_TRUE(c.ok()) << c.message();
      EXPECT_LT(c.differing * 20, c.checked) << c.message();
    }
  }
}

TEST(GoldenDecode, BadPagingIsRefusedBeforeAnythingIsWritten) {
  const TaskArgs args = unfilled_args(kLayers);
  const DecodeBuffers good = decode_buffers(args, kLayers);
  struct Case {
    const char* what;
    int index;  // argument to replace
    std::vector<int32_t> values;
    const char* message;
  };
  std::vector<int32_t> seq(kBatch, kSeqLen), table(kBatch * kMaxBlocksPerSeq), slots(kBatch);
  for (size_t i = 0; i < table.size(); ++i) table[i] = static_cast<int32_t>(i);
  for (int b = 0; b < kBatch; ++b)
    slots[b] = (b * kMaxBlocksPerSeq + (kSeqLen - 1) / kBlockSize) * kBlockSize +
               (kSeqLen - 1) % kBlockSize;
  auto with = [](std::vector<int32_t> v, size_t i, int32_t x) {
    v[i] = x;
    return v;
  };
  const std::vector<Case> cases = {
      {"seq_len 0", kArgSeqLens, with(seq, 3, 0), "seq_lens for lane 3"},
      {"seq_len past MAX_SEQ", kArgSeqLens, with(seq, 15, kMaxSeq + 1), "seq_lens for lane 15"},
      {"page out of range", kArgBlockTable, with(table, 5 * kMaxBlocksPerSeq + 2, kNumPages),
       "lane 5, block 2"},
      {"negative page", kArgBlockTable, with(table, 0, -1), "lane 0, block 0"},
      {"slot out of range", kArgSlotMapping, with(slots, 7, kNumPages * kBlockSize),
       "slot_mapping for lane 7"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    DecodeBuffers buf = good;
    buf.ptr[kArgSeqLens] = seq.data();
    buf.ptr[kArgBlockTable] = table.data();
    buf.ptr[kArgSlotMapping] = slots.data();
    buf.ptr[c.index] = c.values.data();
    // The rows a run would write, marked: they must stay as they are.
    auto* k = static_cast<uint16_t*>(buf.k_cache);
    auto* v = static_cast<uint16_t*>(buf.v_cache);
    auto marked = [&](bool set) {
      bool all = true;
      for (int l = 0; l < kLayers; ++l)
        for (int b = 0; b < kBatch; ++b)
          for (int h = 0; h < kNumKvHeads; ++h)
            for (int d = 0; d < kHeadDim; ++d) {
              const int64_t i =
                  (l * kCacheRows + int64_t{slots[b]} * kNumKvHeads + h) * kHeadDim + d;
              if (set) k[i] = v[i] = 0x5555;
              all = all && k[i] == 0x5555 && v[i] == 0x5555;
            }
      return all;
    };
    marked(true);
    std::vector<uint16_t> out(kBatch * kHidden, 0x1234);
    buf.out = out.data();
    try {
      run_decode(buf, kLayers, /*write_cache=*/true, nullptr);
      ADD_FAILURE() << "accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::invalid_argument);
      EXPECT_NE(std::string(e.what()).find(c.message), std::string::npos) << e.what();
    }
    EXPECT_EQ(out, std::vector<uint16_t>(kBatch * kHidden, 0x1234));
    EXPECT_TRUE(marked(false)) << "a K/V row was written";
  }
}

TEST(GoldenDecode, MissingAddressesAndLayerCountsAreRefused) {
  const TaskArgs args = unfilled_args(kLayers);
  DecodeBuffers buf = decode_buffers(args, kLayers);
  EXPECT_THROW(run_decode(buf, 0, false, nullptr), Error);
  DecodeBuffers no_cache = buf;
  no_cache.k_cache = nullptr;
  EXPECT_THROW(run_decode(no_cache, kLayers, /*write_cache=*/true, nullptr), Error);
  DecodeBuffers no_wq = buf;
  no_wq.ptr[kArgWq] = nullptr;
  try {
    run_decode(no_wq, kLayers, false, nullptr);
    ADD_FAILURE() << "a null wq was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("wq"), std::string::npos) << e.what();
  }
  // The arguments hold 2 layers: asking for 1 or 3 is a shape mismatch.
  for (int layers : {1, 3}) {
    try {
      compute_golden(args, layers);
      ADD_FAILURE() << layers << " layers accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::invalid_argument);
      EXPECT_NE(std::string(e.what()).find("input_rms_weight"), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(compute_golden(args, 0), Error);
  TaskArgs partial;
  for (const Tensor& t : args)
    if (t.name() != "rope_sin") partial.add(t);
  try {
    compute_golden(partial, kLayers);
    ADD_FAILURE() << "arguments without rope_sin accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rope_sin"), std::string::npos) << e.what();
  }
}

TEST(GoldenDecode, BoundArgumentsAreCheckedByNameOrderAndSize) {
  const TaskArgs args = unfilled_args(kLayers);
  std::vector<DecodeArg> bound;
  for (const Tensor& t : args) bound.push_back({t.name(), t.data(), t.nbytes()});
  int layers = 0;
  const DecodeBuffers buf = decode_buffers(bound, &layers);
  EXPECT_EQ(layers, kLayers);
  for (int i = 0; i < kNumArgs; ++i) EXPECT_EQ(buf.ptr[i], bound[i].ptr) << i;
  EXPECT_EQ(buf.k_cache, bound[kArgKCache].ptr);
  EXPECT_EQ(buf.out, bound[kArgOut].ptr);

  auto refused = [&](std::vector<DecodeArg> args, const std::string& part) {
    try {
      decode_buffers(args, &layers);
      ADD_FAILURE() << "accepted; expected an error naming " << part;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::invalid_argument);
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
    }
  };
  refused(std::vector<DecodeArg>(bound.begin(), bound.end() - 1), "19 arguments");
  std::vector<DecodeArg> swapped = bound;
  std::swap(swapped[kArgWk], swapped[kArgWv]);
  refused(swapped, "'wv'");
  std::vector<DecodeArg> short_wo = bound;
  short_wo[kArgWo].bytes -= 2;
  refused(short_wo, "'wo'");
  std::vector<DecodeArg> odd_rms = bound;
  odd_rms[kArgInputRmsWeight].bytes += 4;
  refused(odd_rms, "input_rms_weight");
  std::vector<DecodeArg> null_v = bound;
  null_v[kArgVCache].ptr = nullptr;
  refused(null_v, "'v_cache' has no address");
}

}  // namespace
