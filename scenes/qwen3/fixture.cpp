// The Qwen3-14B decode fixture: the one table of the twenty arguments, size-only mode,
// and generation straight into the caller's storage on all cores.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>

#include "pinstage/error.h"
#include "pinstage/pages.h"
#include "pinstage/parallel.h"
#include "pinstage/qwen3/decode.h"
#include "pinstage/random.h"

namespace pinstage::qwen3 {

static_assert(kHidden == kNumHeads * kHeadDim && kKvHidden == kNumKvHeads * kHeadDim);
static_assert(kNumHeads % kNumKvHeads == 0, "query heads must group evenly over kv heads");
static_assert(kHeadDim % 2 == 0, "RoPE rotates half dimensions");
static_assert(kNumPages == kBatch * kMaxBlocksPerSeq && kCacheRows == 704512);

namespace {

// One row of the table, layer count not yet applied: `rows` is the dim-0 extent of one
// layer's slice (or of the whole tensor when not stacked).
struct Row {
  const char* name;
  DType dtype;
  int64_t rows;
  int64_t cols;  // 0: a 1-D tensor of `rows` elements
  Direction dir;
  Fill fill;
  float std;
  float bias;
  bool stacked;
};

// The twenty arguments in signature order: the only definition of them in the code.
constexpr Row kTable[] = {
    {"hidden_states", DType::bf16, kBatch, kHidden, Direction::in, Fill::normal, 1.0f, 0.0f, false},
    {"input_rms_weight", DType::f32, 1, kHidden, Direction::in, Fill::normal, 0.1f, 1.0f, true},
    {"wq", DType::bf16, kHidden, kHidden, Direction::in, Fill::normal, 0.02f, 0.0f, true},
    {"wk", DType::bf16, kHidden, kKvHidden, Direction::in, Fill::normal, 0.02f, 0.0f, true},
    {"wv", DType::bf16, kHidden, kKvHidden, Direction::in, Fill::normal, 0.02f, 0.0f, true},
    {"q_norm_weight", DType::f32, 1, kHeadDim, Direction::in, Fill::normal, 0.1f, 1.0f, true},
    {"k_norm_weight", DType::f32, 1, kHeadDim, Direction::in, Fill::normal, 0.1f, 1.0f, true},
    {"seq_lens", DType::i32, kBatch, 0, Direction::in, Fill::seq_lens, 0, 0, false},
    {"block_table", DType::i32, kNumPages, 0, Direction::in, Fill::block_table, 0, 0, false},
    {"slot_mapping", DType::i32, kBatch, 0, Direction::in, Fill::slot_mapping, 0, 0, false},
    {"rope_cos", DType::f32, kMaxSeq, kHeadDim, Direction::in, Fill::rope_cos, 0, 0, false},
    {"rope_sin", DType::f32, kMaxSeq, kHeadDim, Direction::in, Fill::rope_sin, 0, 0, false},
    {"k_cache", DType::bf16, kCacheRows, kHeadDim, Direction::inout, Fill::normal, 0.01f, 0.0f,
     true},
    {"v_cache", DType::bf16, kCacheRows, kHeadDim, Direction::inout, Fill::normal, 0.02f, 0.3f,
     true},
    {"wo", DType::bf16, kHidden, kHidden, Direction::in, Fill::normal, 0.0006f, 0.0f, true},
    {"w_gate", DType::bf16, kHidden, kIntermediate, Direction::in, Fill::normal, 0.02f, 0.0f, true},
    {"w_up", DType::bf16, kHidden, kIntermediate, Direction::in, Fill::normal, 0.02f, 0.0f, true},
    {"w_down", DType::bf16, kIntermediate, kHidden, Direction::in, Fill::normal, 0.0004f, 0.0f,
     true},
    {"post_rms_weight", DType::f32, 1, kHidden, Direction::in, Fill::normal, 0.1f, 1.0f, true},
    {"out", DType::bf16, kBatch, kHidden, Direction::out, Fill::zeros, 0, 0, false},
};
static_assert(std::size(kTable) == 20);

// Names the parameter as the code knows it and as the CLI takes it (--layers, --seq-len).
std::string range_error(const char* what, const char* flag, long long value, const char* range,
                        const char* why) {
  return std::string("qwen3-decode fixture: ") + what + " is " + std::to_string(value) + " (" +
         flag + "); it must be " + range + why;
}

// Generation work is cut into items of at most this many bytes: small enough to balance
// across threads and to stay in cache between page population and the write.
constexpr uint64_t kItemBytes = uint64_t{256} << 10;
// Pages of pageable storage are populated in one call per item above this size.
constexpr uint64_t kPopulateMin = uint64_t{64} << 10;

// A piece of layer 0 of one tensor (of the whole tensor when it is not stacked).
struct Item {
  uint32_t tensor;
  uint64_t begin;  // first element
  uint64_t count;  // elements
};

// The RoPE angle of (position, i): f32 product of the position and the f32 inverse
// frequency ROPE_THETA^(-i/64); cos and sin are taken in double and rounded to f32, so
// the table does not depend on the libm's f32 routines.
void fill_rope(float* out, bool sine, uint64_t first_row, uint64_t rows) {
  float inv_freq[kHalfDim];
  for (int i = 0; i < kHalfDim; ++i)
    inv_freq[i] = static_cast<float>(
        std::pow(static_cast<double>(kRopeTheta), -static_cast<double>(i) / kHalfDim));
  for (uint64_t r = 0; r < rows; ++r) {
    const uint64_t p = first_row + r;
    float* row = out + r * kHeadDim;
    for (int i = 0; i < kHalfDim; ++i) {
      const float ang = static_cast<float>(p) * inv_freq[i];
      const double v =
          sine ? std::sin(static_cast<double>(ang)) : std::cos(static_cast<double>(ang));
      row[i] = row[i + kHalfDim] = static_cast<float>(v);
    }
  }
}

void fill_small(const TensorSpec& spec, const Tensor& t, int seq_len) {
  switch (spec.fill) {
    case Fill::seq_lens: {
      auto* p = t.data_as<int32_t>();
      for (int b = 0; b < kBatch; ++b) p[b] = seq_len;
      break;
    }
    case Fill::block_table: {
      auto* p = t.data_as<int32_t>();
      for (int i = 0; i < kNumPages; ++i) p[i] = i;
      break;
    }
    case Fill::slot_mapping: {
      auto* p = t.data_as<int32_t>();
      const int pos = seq_len - 1;
      for (int b = 0; b < kBatch; ++b)
        p[b] = (b * kMaxBlocksPerSeq + pos / kBlockSize) * kBlockSize + pos % kBlockSize;
      break;
    }
    case Fill::zeros:
      if (t.nbytes() > 0) std::memset(t.data(), 0, t.nbytes());
      break;
    case Fill::rope_cos:
    case Fill::rope_sin:
    case Fill::normal:
      PINSTAGE_ASSERT(false);  // generated item by item
  }
}

// Runs items[0..n) on `threads` threads, each claiming the next unclaimed item, so a
// slow item never holds up a fixed share of the rest.
template <typename Fn>
void run_items(size_t n, int threads, const Fn& fn) {
  if (n == 0) return;
  const int want = threads > 0 ? threads : default_thread_count();
  std::atomic<size_t> next{0};
  parallel_for(
      static_cast<size_t>(want), 1,
      [&](size_t, size_t) {
        for (size_t i = next.fetch_add(1, std::memory_order_relaxed); i < n;
             i = next.fetch_add(1, std::memory_order_relaxed))
          fn(i);
      },
      want);
}

}  // namespace

void validate(const Config& config) {
  if (config.n_layers < 1)
    throw Error(ErrorCode::invalid_argument, range_error("n_layers", "--layers", config.n_layers,
                                                         ">= 1", " (the model has 40 layers)"));
  if (config.seq_len < 1 || config.seq_len > kMaxSeq)
    throw Error(ErrorCode::invalid_argument,
                range_error("seq_len", "--seq-len", config.seq_len, "in [1, 5500]",
                            " (MAX_SEQ: the KV pool and the RoPE tables are sized for it)"));
  if (config.threads < 0)
    throw Error(ErrorCode::invalid_argument, range_error("threads", "--threads", config.threads,
                                                         ">= 0", " (0 means all cores)"));
}

std::vector<TensorSpec> tensor_specs(const Config& config) {
  validate(config);
  const int64_t layers = config.n_layers;
  std::vector<TensorSpec> specs;
  specs.reserve(std::size(kTable));
  for (const Row& row : kTable) {
    TensorSpec spec;
    spec.name = row.name;
    spec.dtype = row.dtype;
    spec.dir = row.dir;
    spec.fill = row.fill;
    spec.std = row.std;
    spec.bias = row.bias;
    spec.layers = row.stacked ? layers : 0;
    const int64_t dim0 = row.stacked ? layers * row.rows : row.rows;
    spec.shape = row.cols > 0 ? std::vector<int64_t>{dim0, row.cols} : std::vector<int64_t>{dim0};
    spec.nbytes = checked_nbytes(spec.shape, spec.dtype);
    specs.push_back(std::move(spec));
  }
  return specs;
}

Sizes sizes(const Config& config) {
  std::vector<SceneTensor> tensors;
  for (const TensorSpec& spec : tensor_specs(config))
    tensors.push_back({spec.name, spec.dtype, spec.shape, spec.dir, spec.nbytes});
  return task_sizes(tensors);  // counted as every scene's are
}

TaskArgs make_args(HostAllocator& allocator, const Config& config) {
  const std::vector<TensorSpec> specs = tensor_specs(config);  // validates first

  // All storage first: if one allocation fails, the tensors made so far are released.
  std::vector<Tensor> tensors;
  tensors.reserve(specs.size());
  for (const TensorSpec& spec : specs)
    tensors.push_back(Tensor::empty(spec.name, spec.dtype, spec.shape, spec.dir, allocator));

  // Items of at most 256 KiB of layer 0 (or of an unstacked tensor). Each thread takes
  // the next free item, writes its values in place, then copies them into the same
  // place of every other layer while they are still in cache: every byte is written
  // once, in its final place, and layer 0 is never read back from memory.
  std::vector<Item> items;
  for (uint32_t t = 0; t < specs.size(); ++t) {
    const TensorSpec& spec = specs[t];
    const uint64_t esize = dtype_size(spec.dtype);
    const uint64_t numel = tensors[t].numel();
    const uint64_t slice = spec.layers > 0 ? numel / static_cast<uint64_t>(spec.layers) : numel;
    if (spec.fill == Fill::normal || spec.fill == Fill::rope_cos || spec.fill == Fill::rope_sin) {
      // RoPE items are whole rows; generated items are whole 32-element blocks.
      const uint64_t unit = spec.fill == Fill::normal ? 32 : kHeadDim;
      const uint64_t per_item = std::max<uint64_t>(unit, kItemBytes / esize / unit * unit);
      for (uint64_t b = 0; b < slice; b += per_item)
        items.push_back({t, b, std::min(per_item, slice - b)});
    } else {
      items.push_back({t, 0, numel});
    }
  }
  const bool populate = !allocator.pinned();
  run_items(items.size(), config.threads, [&](size_t i) {
    const Item& item = items[i];
    const TensorSpec& spec = specs[item.tensor];
    const Tensor& t = tensors[item.tensor];
    const uint64_t esize = dtype_size(spec.dtype);
    const uint64_t bytes = item.count * esize;
    auto* base = static_cast<unsigned char*>(t.data());
    unsigned char* dst = base + item.begin * esize;
    if (populate && bytes >= kPopulateMin) populate_for_write(dst, bytes);
    const NormalStream stream{config.seed, item.tensor};
    switch (spec.fill) {
      case Fill::normal:
        if (spec.dtype == DType::bf16)
          fill_normal_bf16(reinterpret_cast<uint16_t*>(dst), stream, item.begin, item.count,
                           spec.std, spec.bias);
        else
          fill_normal_f32(reinterpret_cast<float*>(dst), stream, item.begin, item.count, spec.std,
                          spec.bias);
        break;
      case Fill::rope_cos:
      case Fill::rope_sin:
        fill_rope(reinterpret_cast<float*>(dst), spec.fill == Fill::rope_sin, item.begin / kHeadDim,
                  item.count / kHeadDim);
        break;
      default:
        fill_small(spec, t, config.seq_len);
    }
    // Replication: layers 1..L-1 get copies of this piece of layer 0.
    if (spec.layers > 1) {
      const uint64_t slice_bytes = t.nbytes() / static_cast<uint64_t>(spec.layers);
      for (int64_t l = 1; l < spec.layers; ++l) {
        unsigned char* copy = dst + static_cast<uint64_t>(l) * slice_bytes;
        if (populate && bytes >= kPopulateMin) populate_for_write(copy, bytes);
        std::memcpy(copy, dst, bytes);
      }
    }
  });

  TaskArgs args;
  for (Tensor& t : tensors) args.add(std::move(t));
  return args;
}

void validate_steps(const Config& config, int steps) {
  validate(config);
  if (steps < 1 || int64_t{config.seq_len} + steps - 1 > kMaxSeq)
    throw Error(ErrorCode::invalid_argument,
                "--steps " + std::to_string(steps) + " with --seq-len " +
                    std::to_string(config.seq_len) + ": steps must be in [1, " +
                    std::to_string(kMaxSeq - config.seq_len + 1) +
                    "] (each step adds a token; seq_len + steps - 1 may not pass MAX_SEQ " +
                    std::to_string(kMaxSeq) + ")");
}

std::vector<std::string> advance_step(const TaskArgs& args, const Config& config, int step) {
  validate_steps(config, step + 1);
  if (step < 1)
    throw Error(ErrorCode::invalid_argument,
                "advance_step: step " + std::to_string(step) + " has no step before it");
  auto need = [&](const char* name, DType dtype, uint64_t numel) -> const Tensor& {
    const Tensor& t = args.get(name);
    if (t.dtype() != dtype || t.numel() != numel)
      throw Error(ErrorCode::invalid_argument, std::string("advance_step: '") + name + "' is " +
                                                   dtype_name(t.dtype()) + " " + t.shape_string() +
                                                   ", not the fixture's");
    return t;
  };
  const Tensor& seq_lens = need("seq_lens", DType::i32, kBatch);
  const Tensor& slots = need("slot_mapping", DType::i32, kBatch);
  const Tensor& hidden = need("hidden_states", DType::bf16, uint64_t{kBatch} * kHidden);
  const Tensor& out = need("out", DType::bf16, uint64_t{kBatch} * kHidden);
  TensorSpec spec{};
  spec.fill = Fill::seq_lens;
  fill_small(spec, seq_lens, config.seq_len + step);
  spec.fill = Fill::slot_mapping;
  fill_small(spec, slots, config.seq_len + step);
  std::memcpy(hidden.data(), out.data(), out.nbytes());
  return {"hidden_states", "seq_lens", "slot_mapping"};
}

}  // namespace pinstage::qwen3
