// The spec's reference decode (docs/golden.md): run_decode_with is the one implementation
// behind compute_golden (best kernel set) and the qwen3_decode host callable (portable set).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "pinstage/dtype.h"
#include "pinstage/error.h"
#include "pinstage/parallel.h"
#include "pinstage/qwen3/golden.h"
#include "pinstage/qwen3/kernels.h"

namespace pinstage::qwen3 {
namespace kernels {

const char* const kArgNames[kNumArgs] = {"hidden_states",
                                         "input_rms_weight",
                                         "wq",
                                         "wk",
                                         "wv",
                                         "q_norm_weight",
                                         "k_norm_weight",
                                         "seq_lens",
                                         "block_table",
                                         "slot_mapping",
                                         "rope_cos",
                                         "rope_sin",
                                         "k_cache",
                                         "v_cache",
                                         "wo",
                                         "w_gate",
                                         "w_up",
                                         "w_down",
                                         "post_rms_weight",
                                         "out"};

namespace {

constexpr int64_t kH = kHidden;
constexpr int64_t kKv = kKvHidden;
constexpr int64_t kI = kIntermediate;
constexpr int kRowsPerLayer = kBatch * kNumKvHeads;  // K/V rows one layer writes
// Tiles (of kTile columns) per gemm16 call: 4 KiB of each weight row per pass, 256 KiB of
// accumulators (in L2). Measured at seq_len 3500 on 2 cores (docs/benchmarks.md, "Golden"):
// 64 to 1024 tiles are alike; 16 tiles cost about a third more CPU time per layer.
constexpr int kPanel = 128;
// Fewest tiles worth handing to a thread.
constexpr size_t kMinTilesPerThread = 8;

static_assert(kBatch == kLanes, "the kernels are written for 16 decode lanes");
static_assert(kHidden % kTile == 0 && kKvHidden % kTile == 0 && kIntermediate % kTile == 0);

// One output of a shared-input matrix product: y[16][N] = x @ w.
struct GemmJob {
  const uint16_t* w;
  int64_t n;
  float* y;
};

// Runs the jobs (all with the same input xT [K][16]) split by tiles over the threads.
void gemm(Isa isa, int threads, const float* xT, int K, std::initializer_list<GemmJob> list) {
  const std::vector<GemmJob> jobs(list);
  size_t total = 0;
  for (const GemmJob& job : jobs) total += static_cast<size_t>(job.n / kTile);
  parallel_for(
      total, kMinTilesPerThread,
      [&](size_t begin, size_t end) {
        std::vector<float> acc(static_cast<size_t>(kPanel) * kLanes * kTile);
        size_t base = 0;
        for (const GemmJob& job : jobs) {
          const size_t tiles = static_cast<size_t>(job.n / kTile);
          const size_t lo = std::max(begin, base);
          const size_t hi = std::min(end, base + tiles);
          for (size_t t = lo; t < hi; t += kPanel) {
            const size_t t1 = std::min(hi, t + kPanel);
            gemm16(isa, xT, K, job.w, job.n, static_cast<int>(t - base),
                   static_cast<int>(t1 - base), acc.data(), job.y, job.n);
          }
          base += tiles;
        }
      },
      threads);
}

// 1 / sqrt(mean(v^2) + eps) over n values (the sum is kept in double: any accurate f32
// implementation lands within rounding of it).
float inv_rms(const float* v, int64_t n) {
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += static_cast<double>(v[i]) * v[i];
  const float mean = static_cast<float>(sum / static_cast<double>(n));
  return 1.0f / std::sqrt(mean + kEps);
}

// Per-head RMS norm with weight, then rope_half at (cos, sin): out = rope(norm(v) * w).
void norm_rope(const float* v, const float* weight, const float* cos, const float* sin,
               float* out) {
  const float r = inv_rms(v, kHeadDim);
  float t[kHeadDim];
  for (int d = 0; d < kHeadDim; ++d) t[d] = v[d] * r * weight[d];
  for (int d = 0; d < kHalfDim; ++d) {
    out[d] = t[d] * cos[d] - t[d + kHalfDim] * sin[d];
    out[d + kHalfDim] = t[d + kHalfDim] * cos[d + kHalfDim] + t[d] * sin[d + kHalfDim];
  }
}

std::string lane_message(const char* what, int lane) {
  return std::string("run_decode: ") + what + " for lane " + std::to_string(lane);
}

// The paging inputs decide which memory is read and written: check them before anything.
void check_paging(const int32_t* seq_lens, const int32_t* block_table,
                  const int32_t* slot_mapping) {
  for (int b = 0; b < kBatch; ++b) {
    const int32_t s = seq_lens[b];
    if (s < 1 || s > kMaxSeq)
      throw Error(ErrorCode::invalid_argument,
                  lane_message("seq_lens", b) + " is " + std::to_string(s) + ", outside [1, " +
                      std::to_string(kMaxSeq) + "]; fix the seq_lens tensor");
    const int blocks = (s + kBlockSize - 1) / kBlockSize;
    for (int k = 0; k < blocks; ++k) {
      const int32_t page = block_table[b * kMaxBlocksPerSeq + k];
      if (page < 0 || page >= kNumPages)
        throw Error(ErrorCode::invalid_argument,
                    lane_message("block_table entry", b) + ", block " + std::to_string(k) +
                        " (index " + std::to_string(b * kMaxBlocksPerSeq + k) + ") is " +
                        std::to_string(page) + ", outside [0, " + std::to_string(kNumPages) + ")");
    }
    const int32_t slot = slot_mapping[b];
    if (slot < 0 || slot >= kNumPages * kBlockSize)
      throw Error(ErrorCode::invalid_argument, lane_message("slot_mapping", b) + " is " +
                                                   std::to_string(slot) + ", outside [0, " +
                                                   std::to_string(kNumPages * kBlockSize) + ")");
  }
}

// One decode over raw buffers: the spec's steps per layer, each a method. Scratch is
// allocated once per decode; `x` carries the f32 hidden state between layers.
class Decode {
 public:
  Decode(const DecodeBuffers& buf, bool write_cache, Golden* golden, Isa isa, int threads)
      : buf_(buf), write_cache_(write_cache), golden_(golden), isa_(isa), threads_(threads) {}

  void run(int n_layers) {
    check_paging(i32(kArgSeqLens), i32(kArgBlockTable), i32(kArgSlotMapping));
    const uint16_t* hidden = bf16(kArgHiddenStates);
    for (int64_t i = 0; i < kBatch * kH; ++i) x_[i] = bf16_to_f32(hidden[i]);
    if (golden_ != nullptr) {
      golden_->n_layers = n_layers;
      const size_t rows = static_cast<size_t>(n_layers) * kRowsPerLayer;
      golden_->kv_rows.assign(rows, 0);
      golden_->k_rows.assign(rows * kHeadDim, 0);
      golden_->v_rows.assign(rows * kHeadDim, 0);
    }
    for (int l = 0; l < n_layers; ++l) {
      project_qkv(l);
      norm_rope(l);
      attention(l);
      output_and_mlp(l);
      write_rows(l);
    }
    if (golden_ != nullptr) golden_->out.resize(kBatch * kH);
    for (int64_t i = 0; i < kBatch * kH; ++i) {
      const uint16_t value = f32_to_bf16(x_[i]);
      if (buf_.out != nullptr) static_cast<uint16_t*>(buf_.out)[i] = value;
      if (golden_ != nullptr) golden_->out[i] = value;
    }
  }

 private:
  const uint16_t* bf16(int i) const { return static_cast<const uint16_t*>(buf_.ptr[i]); }
  const float* f32(int i) const { return static_cast<const float*>(buf_.ptr[i]); }
  const int32_t* i32(int i) const { return static_cast<const int32_t*>(buf_.ptr[i]); }

  // xT[c][b] = bf16r(v[b][c] * w[c]) for 16 lanes of n columns: a matrix product's input.
  void transposed_input(const std::vector<float>& v, const float* w, int64_t n) {
    for (int b = 0; b < kBatch; ++b)
      for (int64_t c = 0; c < n; ++c)
        xT_[c * kBatch + b] = bf16_round(v[b * n + c] * (w != nullptr ? w[c] : 1.0f));
  }

  // 1-3: input RMS (applied after the projections), projections scaled by inv_rms.
  void project_qkv(int l) {
    for (int b = 0; b < kBatch; ++b) inv_[b] = inv_rms(&x_[b * kH], kH);
    transposed_input(x_, f32(kArgInputRmsWeight) + l * kH, kH);
    gemm(isa_, threads_, xT_.data(), kHidden,
         {{bf16(kArgWq) + l * kH * kH, kH, q_.data()},
          {bf16(kArgWk) + l * kH * kKv, kKv, k_.data()},
          {bf16(kArgWv) + l * kH * kKv, kKv, v_.data()}});
    for (int b = 0; b < kBatch; ++b) {
      for (int64_t c = 0; c < kH; ++c) q_[b * kH + c] *= inv_[b];
      for (int64_t c = 0; c < kKv; ++c) {
        k_[b * kKv + c] *= inv_[b];
        v_[b * kKv + c] *= inv_[b];
      }
    }
  }

  // 4-5: per-head norms and RoPE at each lane's current position; bf16 rounding.
  void norm_rope(int l) {
    const float* qn = f32(kArgQNormWeight) + l * kHeadDim;
    const float* kn = f32(kArgKNormWeight) + l * kHeadDim;
    for (int b = 0; b < kBatch; ++b) {
      const int64_t p = i32(kArgSeqLens)[b] - 1;
      const float* cos = f32(kArgRopeCos) + p * kHeadDim;
      const float* sin = f32(kArgRopeSin) + p * kHeadDim;
      float tmp[kHeadDim];
      for (int hq = 0; hq < kNumHeads; ++hq) {
        kernels::norm_rope(&q_[b * kH + hq * kHeadDim], qn, cos, sin, tmp);
        for (int d = 0; d < kHeadDim; ++d) q_rope_[b * kH + hq * kHeadDim + d] = bf16_round(tmp[d]);
      }
      for (int h = 0; h < kNumKvHeads; ++h) {
        kernels::norm_rope(&k_[b * kKv + h * kHeadDim], kn, cos, sin, tmp);
        for (int d = 0; d < kHeadDim; ++d) {
          k_cur_[b * kKv + h * kHeadDim + d] = f32_to_bf16(tmp[d]);
          v_cur_[b * kKv + h * kHeadDim + d] = f32_to_bf16(v_[b * kKv + h * kHeadDim + d]);
        }
      }
    }
  }

  // 6: paged attention, one (lane, kv head) per work item; row p is the current token.
  void attention(int l) {
    const uint16_t* k_layer = bf16(kArgKCache) + l * kCacheRows * kHeadDim;
    const uint16_t* v_layer = bf16(kArgVCache) + l * kCacheRows * kHeadDim;
    const int32_t* seq_lens = i32(kArgSeqLens);
    const int32_t* block_table = i32(kArgBlockTable);
    parallel_for(
        kBatch * kNumKvHeads, 1,
        [&](size_t begin, size_t end) {
          std::vector<const uint16_t*> krow(kMaxSeq), vrow(kMaxSeq);
          std::vector<float> scores(static_cast<size_t>(kQPerKv) * kMaxSeq);
          for (size_t unit = begin; unit < end; ++unit) {
            const int b = static_cast<int>(unit) / kNumKvHeads;
            const int h = static_cast<int>(unit) % kNumKvHeads;
            const int S = seq_lens[b];
            for (int i = 0; i < S; ++i) {
              const int64_t page = block_table[b * kMaxBlocksPerSeq + i / kBlockSize];
              const int64_t row = (page * kBlockSize + i % kBlockSize) * kNumKvHeads + h;
              krow[i] = k_layer + row * kHeadDim;
              vrow[i] = v_layer + row * kHeadDim;
            }
            krow[S - 1] = &k_cur_[b * kKv + h * kHeadDim];
            vrow[S - 1] = &v_cur_[b * kKv + h * kHeadDim];
            const int64_t head0 = b * kH + static_cast<int64_t>(h) * kQPerKv * kHeadDim;
            attend(isa_, &q_rope_[head0], krow.data(), vrow.data(), S, scores.data(),
                   &attn_[head0]);
          }
        },
        threads_);
  }

  // 7-10: output projection and f32 residual, post-attention RMS, gated MLP, down
  // projection with the f32 carry.
  void output_and_mlp(int l) {
    transposed_input(attn_, nullptr, kH);
    gemm(isa_, threads_, xT_.data(), kHidden, {{bf16(kArgWo) + l * kH * kH, kH, o_.data()}});
    for (int64_t i = 0; i < kBatch * kH; ++i) h1_[i] = x_[i] + o_[i];
    for (int b = 0; b < kBatch; ++b) post_inv_[b] = inv_rms(&h1_[b * kH], kH);
    transposed_input(h1_, f32(kArgPostRmsWeight) + l * kH, kH);
    gemm(isa_, threads_, xT_.data(), kHidden,
         {{bf16(kArgWGate) + l * kH * kI, kI, g_.data()},
          {bf16(kArgWUp) + l * kH * kI, kI, u_.data()}});
    for (int b = 0; b < kBatch; ++b)
      for (int64_t c = 0; c < kI; ++c) {
        const float sg = g_[b * kI + c] * post_inv_[b];
        const float su = u_[b * kI + c] * post_inv_[b];
        const float sigmoid = 1.0f / (1.0f + std::exp(-sg));
        xT_[c * kBatch + b] = bf16_round(sg * sigmoid * su);
      }
    gemm(isa_, threads_, xT_.data(), kIntermediate,
         {{bf16(kArgWDown) + l * kI * kH, kH, down_.data()}});
    for (int64_t i = 0; i < kBatch * kH; ++i) x_[i] = down_[i] + h1_[i];
  }

  // 11: the current token's K/V rows, into the caches and/or the golden.
  void write_rows(int l) {
    for (int b = 0; b < kBatch; ++b)
      for (int h = 0; h < kNumKvHeads; ++h) {
        const int64_t row =
            l * kCacheRows + static_cast<int64_t>(i32(kArgSlotMapping)[b]) * kNumKvHeads + h;
        const uint16_t* kr = &k_cur_[b * kKv + h * kHeadDim];
        const uint16_t* vr = &v_cur_[b * kKv + h * kHeadDim];
        if (write_cache_) {
          std::memcpy(static_cast<uint16_t*>(buf_.k_cache) + row * kHeadDim, kr, kHeadDim * 2);
          std::memcpy(static_cast<uint16_t*>(buf_.v_cache) + row * kHeadDim, vr, kHeadDim * 2);
        }
        if (golden_ != nullptr) {
          const size_t e = (static_cast<size_t>(l) * kBatch + b) * kNumKvHeads + h;
          golden_->kv_rows[e] = row;
          std::memcpy(&golden_->k_rows[e * kHeadDim], kr, kHeadDim * 2);
          std::memcpy(&golden_->v_rows[e * kHeadDim], vr, kHeadDim * 2);
        }
      }
  }

  const DecodeBuffers& buf_;
  const bool write_cache_;
  Golden* const golden_;
  const Isa isa_;
  const int threads_;
  std::vector<float> x_ = std::vector<float>(kBatch * kH), xT_ = std::vector<float>(kBatch * kI),
                     q_ = std::vector<float>(kBatch * kH), k_ = std::vector<float>(kBatch * kKv),
                     v_ = std::vector<float>(kBatch * kKv),
                     q_rope_ = std::vector<float>(kBatch * kH),
                     attn_ = std::vector<float>(kBatch * kH), o_ = std::vector<float>(kBatch * kH),
                     h1_ = std::vector<float>(kBatch * kH), g_ = std::vector<float>(kBatch * kI),
                     u_ = std::vector<float>(kBatch * kI), down_ = std::vector<float>(kBatch * kH);
  std::vector<uint16_t> k_cur_ = std::vector<uint16_t>(kBatch * kKv),
                        v_cur_ = std::vector<uint16_t>(kBatch * kKv);
  float inv_[kBatch] = {}, post_inv_[kBatch] = {};
};

}  // namespace

void run_decode_with(const DecodeBuffers& buf, int n_layers, bool write_cache, Golden* golden,
                     Isa isa, int threads) {
  if (n_layers < 1)
    throw Error(ErrorCode::invalid_argument,
                "run_decode: n_layers is " + std::to_string(n_layers) + "; it must be >= 1");
  for (int i = 0; i < kNumArgs; ++i)
    if (i != kArgOut && buf.ptr[i] == nullptr)
      throw Error(ErrorCode::invalid_argument,
                  std::string("run_decode: argument ") + kArgNames[i] + " has no address");
  if (write_cache && (buf.k_cache == nullptr || buf.v_cache == nullptr))
    throw Error(ErrorCode::invalid_argument,
                "run_decode: write_cache needs writable k_cache and v_cache addresses");
  Decode(buf, write_cache, golden, isa, threads).run(n_layers);
}

}  // namespace kernels

const char* golden_kernels() { return kernels::isa_name(kernels::default_isa()); }

void run_decode(const DecodeBuffers& buffers, int n_layers, bool write_cache, Golden* golden) {
  kernels::run_decode_with(buffers, n_layers, write_cache, golden, kernels::default_isa(), 0);
}

namespace {

std::vector<TensorSpec> specs_for(int n_layers, const char* who) {
  if (n_layers < 1)
    throw Error(ErrorCode::invalid_argument, std::string(who) + ": n_layers is " +
                                                 std::to_string(n_layers) + "; it must be >= 1");
  Config config;
  config.n_layers = n_layers;
  std::vector<TensorSpec> specs = tensor_specs(config);
  PINSTAGE_ASSERT(specs.size() == kNumArgs);
  for (int i = 0; i < kNumArgs; ++i) PINSTAGE_ASSERT(specs[i].name == kernels::kArgNames[i]);
  return specs;
}

}  // namespace

DecodeBuffers decode_buffers(const TaskArgs& args, int n_layers) {
  const std::vector<TensorSpec> specs = specs_for(n_layers, "decode_buffers");
  DecodeBuffers buf;
  for (int i = 0; i < kNumArgs; ++i) {
    const TensorSpec& spec = specs[i];
    const Tensor* t = args.find(spec.name);
    if (t == nullptr)
      throw Error(ErrorCode::invalid_argument,
                  "decode_buffers: the arguments have no tensor '" + spec.name +
                      "'; pass the twenty arguments qwen3::make_args builds");
    if (t->dtype() != spec.dtype || t->shape() != spec.shape) {
      throw Error(ErrorCode::invalid_argument,
                  "decode_buffers: tensor '" + spec.name + "' is " + dtype_name(t->dtype()) + " " +
                      t->shape_string() + "; " + std::to_string(n_layers) + " layer(s) need " +
                      dtype_name(spec.dtype) + " " + format_shape(spec.shape));
    }
    buf.ptr[i] = t->data();
  }
  buf.k_cache = const_cast<void*>(buf.ptr[kArgKCache]);
  buf.v_cache = const_cast<void*>(buf.ptr[kArgVCache]);
  buf.out = const_cast<void*>(buf.ptr[kArgOut]);
  return buf;
}

DecodeBuffers decode_buffers(std::span<const DecodeArg> args, int* n_layers) {
  if (args.size() != kNumArgs)
    throw Error(ErrorCode::invalid_argument, "qwen3_decode: got " + std::to_string(args.size()) +
                                                 " arguments; it takes the scene's " +
                                                 std::to_string(kNumArgs) + " in signature order");
  for (int i = 0; i < kNumArgs; ++i)
    if (args[i].name != kernels::kArgNames[i])
      throw Error(ErrorCode::invalid_argument, "qwen3_decode: argument " + std::to_string(i) +
                                                   " is '" + std::string(args[i].name) +
                                                   "'; expected '" + kernels::kArgNames[i] +
                                                   "' (signature order)");
  const uint64_t per_layer = uint64_t{kHidden} * sizeof(float);  // input_rms_weight
  const uint64_t rms_bytes = args[kArgInputRmsWeight].bytes;
  if (rms_bytes == 0 || rms_bytes % per_layer != 0 || rms_bytes / per_layer > (1u << 20))
    throw Error(ErrorCode::invalid_argument,
                "qwen3_decode: input_rms_weight has " + std::to_string(rms_bytes) +
                    " bytes; it must be n_layers * " + std::to_string(per_layer));
  const int layers = static_cast<int>(rms_bytes / per_layer);
  const std::vector<TensorSpec> specs = specs_for(layers, "qwen3_decode");
  DecodeBuffers buf;
  for (int i = 0; i < kNumArgs; ++i) {
    if (args[i].bytes != specs[i].nbytes)
      throw Error(ErrorCode::invalid_argument,
                  "qwen3_decode: argument '" + specs[i].name + "' has " +
                      std::to_string(args[i].bytes) + " bytes; " + std::to_string(layers) +
                      " layer(s) (from input_rms_weight) need " + std::to_string(specs[i].nbytes));
    if (args[i].ptr == nullptr)
      throw Error(ErrorCode::invalid_argument,
                  "qwen3_decode: argument '" + specs[i].name + "' has no address");
    buf.ptr[i] = args[i].ptr;
  }
  buf.k_cache = args[kArgKCache].ptr;
  buf.v_cache = args[kArgVCache].ptr;
  buf.out = args[kArgOut].ptr;
  if (n_layers != nullptr) *n_layers = layers;
  return buf;
}

Golden compute_golden(const TaskArgs& args, int n_layers) {
  DecodeBuffers buf = decode_buffers(args, n_layers);
  buf.k_cache = nullptr;
  buf.v_cache = nullptr;
  buf.out = nullptr;
  Golden golden;
  run_decode(buf, n_layers, /*write_cache=*/false, &golden);
  return golden;
}

}  // namespace pinstage::qwen3
