// The Qwen3-14B decode fixture against docs (the spec's tables and formulas): sizes,
// shapes, validation, values (statistics, paging, RoPE, replication, zeros) and
// bit-identical bytes whatever the allocator or thread count.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <optional>
#include <vector>

#include "pinstage/parallel.h"
#include "pinstage/qwen3/decode.h"
#include "pinstage/random.h"
#include "pinstage/worker.h"
#include "tensor_test_util.h"

namespace pinstage::qwen3 {
namespace {

using test::CountingAllocator;
using test::error_of;

// The spec's byte table: n_layers -> (input bytes, all 20 tensors).
struct SizeRow {
  int layers;
  uint64_t staged;
  uint64_t total;
};
constexpr SizeRow kSpecSizes[] = {
    {1, 1027153728ull, 1027317568ull},
    {2, 2048508736ull, 2048672576ull},
    {4, 4091218752ull, 4091382592ull},
    {40, 40859999040ull, 40860162880ull},
};

Config layers(int n) {
  Config c;
  c.n_layers = n;
  return c;
}

TEST(FixtureSizes, MatchTheSpecTable) {
  for (const SizeRow& row : kSpecSizes) {
    const Sizes s = sizes(layers(row.layers));
    EXPECT_EQ(s.tensors, 20u);
    EXPECT_EQ(s.input_tensors, 19u);
    EXPECT_EQ(s.input_bytes, row.staged) << row.layers << " layers";
    EXPECT_EQ(s.total_bytes, row.total) << row.layers << " layers";
    uint64_t sum = 0;
    for (const TensorSpec& spec : tensor_specs(layers(row.layers))) {
      EXPECT_EQ(spec.nbytes, checked_nbytes(spec.shape, spec.dtype)) << spec.name;
      sum += spec.nbytes;
    }
    EXPECT_EQ(sum, row.total);
  }
}

// The spec's argument table, written out independently of the code's.
struct SpecRow {
  const char* name;
  DType dtype;
  std::vector<int64_t> shape;  // for L = 3
  Direction dir;
  bool stacked;
};
const std::vector<SpecRow>& spec_rows() {
  static const std::vector<SpecRow> rows = {
      {"hidden_states", DType::bf16, {16, 5120}, Direction::in, false},
      {"input_rms_weight", DType::f32, {3, 5120}, Direction::in, true},
      {"wq", DType::bf16, {3 * 5120, 5120}, Direction::in, true},
      {"wk", DType::bf16, {3 * 5120, 1024}, Direction::in, true},
      {"wv", DType::bf16, {3 * 5120, 1024}, Direction::in, true},
      {"q_norm_weight", DType::f32, {3, 128}, Direction::in, true},
      {"k_norm_weight", DType::f32, {3, 128}, Direction::in, true},
      {"seq_lens", DType::i32, {16}, Direction::in, false},
      {"block_table", DType::i32, {16 * 43}, Direction::in, false},
      {"slot_mapping", DType::i32, {16}, Direction::in, false},
      {"rope_cos", DType::f32, {5500, 128}, Direction::in, false},
      {"rope_sin", DType::f32, {5500, 128}, Direction::in, false},
      {"k_cache", DType::bf16, {3 * 704512, 128}, Direction::inout, true},
      {"v_cache", DType::bf16, {3 * 704512, 128}, Direction::inout, true},
      {"wo", DType::bf16, {3 * 5120, 5120}, Direction::in, true},
      {"w_gate", DType::bf16, {3 * 5120, 17408}, Direction::in, true},
      {"w_up", DType::bf16, {3 * 5120, 17408}, Direction::in, true},
      {"w_down", DType::bf16, {3 * 17408, 5120}, Direction::in, true},
      {"post_rms_weight", DType::f32, {3, 5120}, Direction::in, true},
      {"out", DType::bf16, {16, 5120}, Direction::out, false},
  };
  return rows;
}

TEST(FixtureTable, MatchesTheSpec) {
  const std::vector<TensorSpec> specs = tensor_specs(layers(3));
  const auto& rows = spec_rows();
  ASSERT_EQ(specs.size(), rows.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    EXPECT_EQ(specs[i].name, rows[i].name);
    EXPECT_EQ(specs[i].dtype, rows[i].dtype) << rows[i].name;
    EXPECT_EQ(specs[i].shape, rows[i].shape) << rows[i].name;
    EXPECT_EQ(specs[i].dir, rows[i].dir) << rows[i].name;
    EXPECT_EQ(specs[i].layers, rows[i].stacked ? 3 : 0) << rows[i].name;
  }
}

TEST(FixtureValidation, RefusesBadParametersBeforeAllocating) {
  struct Bad {
    Config config;
    const char* word;
  };
  std::vector<Bad> bad;
  auto with = [](auto edit) {
    Config c = layers(1);
    edit(c);
    return c;
  };
  bad.push_back({with([](Config& c) { c.seq_len = 0; }), "seq_len"});
  bad.push_back({with([](Config& c) { c.seq_len = 5501; }), "seq_len"});
  bad.push_back({with([](Config& c) { c.seq_len = -3; }), "seq_len"});
  bad.push_back({with([](Config& c) { c.n_layers = 0; }), "n_layers"});
  bad.push_back({with([](Config& c) { c.n_layers = -1; }), "n_layers"});
  bad.push_back({with([](Config& c) { c.threads = -2; }), "threads"});
  for (const Bad& b : bad) {
    CountingAllocator alloc;
    for (const Error& e :
         {error_of([&] { validate(b.config); }), error_of([&] { tensor_specs(b.config); }),
          error_of([&] { sizes(b.config); }), error_of([&] { make_args(alloc, b.config); })}) {
      EXPECT_EQ(e.code(), ErrorCode::invalid_argument);
      EXPECT_NE(std::string(e.what()).find(b.word), std::string::npos) << e.what();
    }
    EXPECT_EQ(alloc.calls(), 0) << b.word;
  }
  // The edges of the valid ranges are accepted.
  Config edge = layers(1);
  edge.seq_len = 1;
  EXPECT_NO_THROW(validate(edge));
  edge.seq_len = kMaxSeq;
  EXPECT_NO_THROW(validate(edge));
}

TEST(FixtureValidation, FailedAllocationLeavesNothing) {
  for (int fail_at : {1, 7, 20}) {
    CountingAllocator alloc;
    alloc.fail_at(fail_at);
    EXPECT_EQ(error_of([&] { make_args(alloc, layers(1)); }).code(), ErrorCode::out_of_memory);
    EXPECT_EQ(alloc.calls(), fail_at);
    EXPECT_EQ(alloc.live(), 0) << "storages left after failing allocation " << fail_at;
  }
}

// ---- values ------------------------------------------------------------------------------
// Each test runs in its own process under ctest, so every fixture built here is built
// for one test: the checks on one fixture are helpers called from one test.

uint64_t slice_bytes(const Tensor& t, const TensorSpec& spec) {
  return spec.layers > 0 ? t.nbytes() / static_cast<uint64_t>(spec.layers) : t.nbytes();
}

void expect_shapes_and_totals(const TaskArgs& args, int n_layers) {
  const std::vector<TensorSpec> specs = tensor_specs(layers(n_layers));
  ASSERT_EQ(args.size(), 20u);
  for (size_t i = 0; i < specs.size(); ++i) {
    const Tensor& t = args.at(i);
    EXPECT_EQ(t.name(), specs[i].name);
    EXPECT_EQ(t.dtype(), specs[i].dtype);
    EXPECT_EQ(t.shape(), specs[i].shape);
    EXPECT_EQ(t.direction(), specs[i].dir);
    EXPECT_EQ(t.nbytes(), specs[i].nbytes);
  }
}

void expect_replicated(const TaskArgs& args, int n_layers) {
  for (const TensorSpec& spec : tensor_specs(layers(n_layers))) {
    if (spec.layers == 0) continue;
    const Tensor& t = args.get(spec.name);
    const uint64_t slice = slice_bytes(t, spec);
    const auto* base = static_cast<const unsigned char*>(t.data());
    for (int64_t l = 1; l < spec.layers; ++l)
      EXPECT_EQ(std::memcmp(base, base + l * slice, slice), 0) << spec.name << " layer " << l;
  }
}

// Tensor k of the table draws from stream k; spot-check elements across each slice.
void expect_generator_streams(const TaskArgs& args, int n_layers, uint64_t seed) {
  const std::vector<TensorSpec> specs = tensor_specs(layers(n_layers));
  for (size_t k = 0; k < specs.size(); ++k) {
    if (specs[k].fill != Fill::normal) continue;
    const Tensor& t = args.at(k);
    const uint64_t n = slice_bytes(t, specs[k]) / dtype_size(t.dtype());
    const NormalStream stream{seed, k};
    for (uint64_t i : {uint64_t{0}, uint64_t{1}, uint64_t{17}, n / 3, n / 2 + 5, n - 1}) {
      const float want = normal_reference(stream, i, specs[k].std, specs[k].bias);
      if (t.dtype() == DType::bf16)
        ASSERT_EQ(t.data_as<uint16_t>()[i], f32_to_bf16(want)) << specs[k].name << "[" << i << "]";
      else
        ASSERT_EQ(t.data_as<float>()[i], want) << specs[k].name << "[" << i << "]";
    }
  }
}

// Sample mean and standard deviation of layer 0 of every random tensor, within five
// standard errors of the spec's bias and std. bf16 rounding adds the variance of a
// uniform error of one bf16 spacing at the bias (Sheppard's correction), which matters
// for v_cache (0.3 + 0.02 z).
void expect_statistics(const TaskArgs& args, int n_layers) {
  for (const TensorSpec& spec : tensor_specs(layers(n_layers))) {
    if (spec.fill != Fill::normal) continue;
    const Tensor& t = args.get(spec.name);
    const uint64_t n = slice_bytes(t, spec) / dtype_size(t.dtype());
    const size_t chunks = 64;
    std::vector<double> sum(chunks), sq(chunks);
    parallel_for(chunks, 1, [&](size_t b, size_t e) {
      for (size_t c = b; c < e; ++c) {
        double s = 0, q = 0;
        for (uint64_t i = n * c / chunks; i < n * (c + 1) / chunks; ++i) {
          const double v = t.dtype() == DType::bf16 ? bf16_to_f32(t.data_as<uint16_t>()[i])
                                                    : t.data_as<float>()[i];
          s += v - spec.bias;
          q += (v - spec.bias) * (v - spec.bias);
        }
        sum[c] = s;
        sq[c] = q;
      }
    });
    double s = 0, q = 0;
    for (size_t c = 0; c < chunks; ++c) {
      s += sum[c];
      q += sq[c];
    }
    const double dn = static_cast<double>(n);
    const double mean = s / dn;
    const double sd = std::sqrt(q / dn - mean * mean);
    double want_sd = spec.std;
    if (t.dtype() == DType::bf16 && spec.bias != 0.0f) {
      const double spacing = std::ldexp(1.0, std::ilogb(spec.bias) - 7);
      want_sd = std::sqrt(want_sd * want_sd + spacing * spacing / 12);
    }
    EXPECT_NEAR(mean, 0.0, 5 * spec.std / std::sqrt(dn)) << spec.name << " mean - bias";
    EXPECT_NEAR(sd / want_sd, 1.0, 5 / std::sqrt(2 * dn)) << spec.name << " std " << sd;
  }
}

// Paging computed the other way round: the physical page of lane b's last token through
// the block table, then the slot inside it.
void expect_paging(const TaskArgs& args, int seq_len) {
  const auto* seq_lens = args.get("seq_lens").data_as<int32_t>();
  const auto* table = args.get("block_table").data_as<int32_t>();
  const auto* slots = args.get("slot_mapping").data_as<int32_t>();
  for (int i = 0; i < 16 * 43; ++i) ASSERT_EQ(table[i], i);
  for (int b = 0; b < 16; ++b) {
    EXPECT_EQ(seq_lens[b], seq_len);
    const int pos = seq_lens[b] - 1;
    const int page = table[b * 43 + pos / 128];
    EXPECT_EQ(slots[b], page * 128 + pos % 128) << "lane " << b;
    // The slot lies inside lane b's own 43 pages.
    EXPECT_GE(slots[b], b * 43 * 128);
    EXPECT_LT(slots[b], (b + 1) * 43 * 128);
  }
}

void expect_rope(const TaskArgs& args) {
  const auto* cos_t = args.get("rope_cos").data_as<float>();
  const auto* sin_t = args.get("rope_sin").data_as<float>();
  double worst = 0;
  for (int p = 0; p < 5500; ++p) {
    for (int i = 0; i < 64; ++i) {
      // ang = p * 10000^(-i/64), the power rounded to f32 and the product taken in f32.
      const float inv = static_cast<float>(1.0 / std::pow(10000.0, i / 64.0));
      const float ang = static_cast<float>(p) * inv;
      const float c = static_cast<float>(std::cos(static_cast<double>(ang)));
      const float s = static_cast<float>(std::sin(static_cast<double>(ang)));
      worst = std::max({worst, static_cast<double>(std::fabs(cos_t[p * 128 + i] - c)),
                        static_cast<double>(std::fabs(sin_t[p * 128 + i] - s))});
      ASSERT_EQ(cos_t[p * 128 + i], cos_t[p * 128 + 64 + i]) << "halves repeat, p=" << p;
      ASSERT_EQ(sin_t[p * 128 + i], sin_t[p * 128 + 64 + i]) << "halves repeat, p=" << p;
    }
  }
  // One f32 ulp at most: the power is computed two ways (pow(x, -y) and 1 / pow(x, y)).
  EXPECT_LT(worst, 1.2e-7);
  EXPECT_EQ(cos_t[0], 1.0f);
  EXPECT_EQ(sin_t[0], 0.0f);
  EXPECT_EQ(cos_t[128], static_cast<float>(std::cos(1.0)));  // p = 1, i = 0: angle 1
}

void expect_zeros(const Tensor& t) {
  const auto* p = static_cast<const unsigned char*>(t.data());
  for (uint64_t i = 0; i < t.nbytes(); ++i) ASSERT_EQ(p[i], 0u) << t.name() << " byte " << i;
}

TEST(FixtureValues, TwoLayersFollowTheSpec) {
  PageableAllocator alloc;
  const TaskArgs args = make_args(alloc, layers(2));
  EXPECT_EQ(args.input_bytes(), 2048508736ull);
  EXPECT_EQ(args.total_bytes(), 2048672576ull);
  EXPECT_EQ(args.summary(), "20 tensors, 19 inputs, 2,048,508,736 bytes");
  for (const Tensor& t : args) EXPECT_FALSE(t.pinned());
  {
    SCOPED_TRACE("shapes");
    expect_shapes_and_totals(args, 2);
  }
  {
    SCOPED_TRACE("replication");
    expect_replicated(args, 2);
  }
  {
    SCOPED_TRACE("streams");
    expect_generator_streams(args, 2, kDefaultSeed);
  }
  {
    SCOPED_TRACE("statistics");
    expect_statistics(args, 2);
  }
  {
    SCOPED_TRACE("paging");
    expect_paging(args, kDefaultSeqLen);
  }
  {
    SCOPED_TRACE("rope");
    expect_rope(args);
  }
  {
    SCOPED_TRACE("out");
    expect_zeros(args.get("out"));
  }
  // One layer is layer 0 of two (and the unstacked tensors are the same).
  const TaskArgs one = make_args(alloc, layers(1));
  const std::vector<TensorSpec> specs = tensor_specs(layers(2));
  for (size_t i = 0; i < specs.size(); ++i) {
    ASSERT_EQ(one.at(i).nbytes(), slice_bytes(args.at(i), specs[i])) << one.at(i).name();
    EXPECT_EQ(std::memcmp(one.at(i).data(), args.at(i).data(), one.at(i).nbytes()), 0)
        << one.at(i).name();
  }
}

// Which tensors differ from `ref`: every tensor must be byte-identical unless listed.
void expect_differs_only_in(const TaskArgs& ref, const TaskArgs& other,
                            const std::vector<Fill>& changed, const char* what) {
  const std::vector<TensorSpec> specs = tensor_specs(layers(1));
  ASSERT_EQ(other.size(), ref.size());
  for (size_t i = 0; i < specs.size(); ++i) {
    const bool same = std::memcmp(ref.at(i).data(), other.at(i).data(), ref.at(i).nbytes()) == 0;
    const bool may_change =
        std::find(changed.begin(), changed.end(), specs[i].fill) != changed.end();
    EXPECT_EQ(same, !may_change) << specs[i].name << " (" << what << ")";
  }
}

// The bytes depend on n_layers, seq_len and seed only: not on the allocator or the
// thread count. seq_len moves only the paging, the seed only the random values.
TEST(FixtureValues, BytesDependOnlyOnTheConfig) {
  PageableAllocator pageable;
  const TaskArgs ref = make_args(pageable, layers(1));
  {
    Worker worker;
    worker.init("sim");
    PinnedAllocator pinned(worker);
    Config c = layers(1);
    c.threads = 1;
    const TaskArgs other = make_args(pinned, c);
    for (const Tensor& t : other) EXPECT_TRUE(t.pinned()) << t.name();
    expect_differs_only_in(ref, other, {}, "pinned, 1 thread");
  }
  {
    Config c = layers(1);
    c.threads = 3;
    c.seq_len = 1;
    const TaskArgs other = make_args(pageable, c);
    expect_paging(other, 1);
    expect_differs_only_in(ref, other, {Fill::seq_lens, Fill::slot_mapping},
                           "seq_len 1, 3 threads");
  }
  {
    Config c = layers(1);
    c.seq_len = kMaxSeq;
    c.seed = 77;
    const TaskArgs other = make_args(pageable, c);
    expect_paging(other, kMaxSeq);
    expect_generator_streams(other, 1, 77);
    expect_differs_only_in(ref, other, {Fill::seq_lens, Fill::slot_mapping, Fill::normal},
                           "seq_len 5500, seed 77");
  }
}

// The thread count never changes a byte, including counts above this machine's cores and
// the odd counts that split items unevenly: a generator whose output changes at 4 or more
// threads must fail here (issue 14). `ref` above ran on all cores; 1 and 3 are covered
// there too.
// Storage filled with 0xA5, as reused memory would be ("contents are unspecified"): an
// item the generator skips then shows, even one whose values are zeros.
class PoisonedAllocator final : public HostAllocator {
 public:
  std::shared_ptr<Storage> allocate(size_t bytes) override {
    auto storage = inner_.allocate(bytes);
    if (bytes > 0) std::memset(storage->data(), 0xA5, bytes);
    return storage;
  }
  bool pinned() const override { return false; }
  std::string name() const override { return "poisoned"; }

 private:
  PageableAllocator inner_;
};

TEST(FixtureValues, BytesDoNotDependOnTheThreadCount) {
  PageableAllocator pageable;
  PoisonedAllocator poisoned;
  Config c = layers(1);
  c.threads = 1;
  const TaskArgs ref = make_args(pageable, c);
  for (int threads : {1, 2, 3, 4, 7, 8}) {
    c.threads = threads;
    const TaskArgs other = make_args(poisoned, c);
    expect_differs_only_in(ref, other, {}, ("threads " + std::to_string(threads)).c_str());
  }
}

}  // namespace
}  // namespace pinstage::qwen3
