// The scene run's qwen3 parts. Between rounds the INOUT caches go back to their initial
// bytes by restoring only the rows the decode writes (a second copy of 14 GB of pools is
// what this avoids); a content hash taken before the first round proves the rest came
// back untouched.
#include "pinstage/qwen3/scene.h"

#include <cstring>

#include "pinstage/parallel.h"

namespace pinstage::qwen3 {
namespace {

// A 64-bit content hash whose value does not depend on the thread count: fixed 1 MiB
// blocks hashed in parallel (four independent lanes keep the multiplies pipelined),
// then combined in order.
uint64_t content_hash(const void* data, uint64_t bytes) {
  constexpr uint64_t kBlock = uint64_t{1} << 20;
  constexpr uint64_t kMul = 0x9e3779b97f4a7c15ull;
  const uint64_t blocks = (bytes + kBlock - 1) / kBlock;
  std::vector<uint64_t> block_hash(blocks);
  const auto* base = static_cast<const unsigned char*>(data);
  parallel_for(blocks, 16, [&](size_t first, size_t last) {
    for (size_t b = first; b < last; ++b) {
      const unsigned char* p = base + b * kBlock;
      const uint64_t n = std::min(kBlock, bytes - b * kBlock);
      uint64_t lane[4] = {1, 2, 3, 4};
      uint64_t i = 0;
      for (; i + 32 <= n; i += 32)
        for (int k = 0; k < 4; ++k) {
          uint64_t w;
          std::memcpy(&w, p + i + 8 * k, 8);
          lane[k] = (lane[k] ^ w) * kMul;
        }
      uint64_t tail = n;
      for (; i < n; ++i) tail = (tail ^ p[i]) * kMul;
      block_hash[b] = ((lane[0] * 31 + lane[1]) * 31 + lane[2]) * 31 + lane[3] + tail;
    }
  });
  uint64_t h = bytes;
  for (uint64_t v : block_hash) h = (h ^ v) * kMul + (h >> 29);
  return h;
}

// Copies the kHeadDim values of each row out of (gather) or into (scatter) a cache.
void gather_rows(const Tensor& cache, const std::vector<int64_t>& rows, uint16_t* out) {
  const auto* base = cache.data_as<const uint16_t>();
  for (size_t i = 0; i < rows.size(); ++i)
    std::memcpy(out + i * kHeadDim, base + rows[i] * kHeadDim, kHeadDim * sizeof(uint16_t));
}

void scatter_rows(const Tensor& cache, const std::vector<int64_t>& rows, const uint16_t* in) {
  auto* base = cache.data_as<uint16_t>();
  for (size_t i = 0; i < rows.size(); ++i)
    std::memcpy(base + rows[i] * kHeadDim, in + i * kHeadDim, kHeadDim * sizeof(uint16_t));
}

// The generic run's options for `options`.
SceneRunOptions run_options(const SceneOptions& options) {
  SceneRunOptions run;
  run.values = scene_values(options.config);
  run.threads = options.config.threads;
  run.storage = options.storage;
  run.rounds = options.rounds;
  run.skip_golden = options.skip_golden;
  run.save_golden = options.save_golden;
  run.callable = options.callable;
  run.bind = options.bind;
  return run;
}

}  // namespace

void validate(const SceneOptions& options) {
  validate(options.config);
  if (options.callable.empty())
    throw Error(ErrorCode::invalid_argument, "the scene needs a callable to execute");
  pinstage::validate(*scene(), run_options(options));
}

std::vector<int64_t> written_rows(const TaskArgs& args, int n_layers) {
  const Tensor& slots = args.get("slot_mapping");
  if (slots.dtype() != DType::i32 || slots.numel() != kBatch)
    throw Error(ErrorCode::invalid_argument, "slot_mapping must be i32 [16]");
  const auto* slot = slots.data_as<const int32_t>();
  std::vector<int64_t> rows;
  rows.reserve(static_cast<size_t>(n_layers) * kBatch * kNumKvHeads);
  for (int l = 0; l < n_layers; ++l)
    for (int b = 0; b < kBatch; ++b) {
      if (slot[b] < 0 || int64_t{slot[b]} * kNumKvHeads >= kCacheRows)
        throw Error(ErrorCode::invalid_argument, "slot_mapping[" + std::to_string(b) + "] = " +
                                                     std::to_string(slot[b]) + " is out of range");
      for (int h = 0; h < kNumKvHeads; ++h)
        rows.push_back(l * kCacheRows + int64_t{slot[b]} * kNumKvHeads + h);
    }
  return rows;
}

CacheRestorer::CacheRestorer(const TaskArgs& args, int n_layers)
    : k_cache_(&args.get("k_cache")),
      v_cache_(&args.get("v_cache")),
      rows_(written_rows(args, n_layers)),
      k_initial_(rows_.size() * kHeadDim),
      v_initial_(rows_.size() * kHeadDim) {
  const uint64_t need = static_cast<uint64_t>(n_layers) * kCacheRows * kHeadDim * 2;
  if (k_cache_->nbytes() < need || v_cache_->nbytes() < need)
    throw Error(ErrorCode::invalid_argument, "CacheRestorer: k_cache/v_cache are smaller than " +
                                                 std::to_string(n_layers) + " layer(s) of pool");
  gather_rows(*k_cache_, rows_, k_initial_.data());
  gather_rows(*v_cache_, rows_, v_initial_.data());
  k_hash_ = content_hash(k_cache_->data(), k_cache_->nbytes());
  v_hash_ = content_hash(v_cache_->data(), v_cache_->nbytes());
}

std::vector<std::string> CacheRestorer::restore() const {
  scatter_rows(*k_cache_, rows_, k_initial_.data());
  scatter_rows(*v_cache_, rows_, v_initial_.data());
  std::vector<std::string> changed;
  if (content_hash(k_cache_->data(), k_cache_->nbytes()) != k_hash_)
    changed.emplace_back("k_cache");
  if (content_hash(v_cache_->data(), v_cache_->nbytes()) != v_hash_)
    changed.emplace_back("v_cache");
  return changed;
}

SceneReport run_scene(Worker& worker, const SceneOptions& options,
                      const std::function<void(const SceneRound&)>& on_round) {
  validate(options);
  return pinstage::run_scene(worker, *scene(), run_options(options), on_round);
}

}  // namespace pinstage::qwen3
