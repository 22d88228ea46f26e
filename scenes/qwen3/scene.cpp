// The scene run's qwen3 parts. Between rounds the INOUT caches go back to their initial
// bytes by restoring only the rows the decode writes (a second copy of 14 GB of pools is
// what this avoids); a content hash taken before the first round proves the rest came
// back untouched.
#include "pinstage/qwen3/scene.h"

#include <cstring>

#include "pinstage/safetensors.h"

namespace pinstage::qwen3 {
namespace {

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

std::vector<ByteRange> written_ranges(const TaskArgs& args, int n_layers) {
  const std::vector<int64_t> rows = written_rows(args, n_layers);
  constexpr uint64_t kRowBytes = kHeadDim * sizeof(uint16_t);
  std::vector<ByteRange> ranges;
  ranges.reserve(2 * rows.size() / kNumKvHeads);
  for (const char* cache : {"k_cache", "v_cache"})
    for (size_t i = 0; i < rows.size(); i += kNumKvHeads)  // heads 0..7 of one lane: adjacent
      ranges.push_back(
          {cache, static_cast<uint64_t>(rows[i]) * kRowBytes, kNumKvHeads * kRowBytes});
  return ranges;
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
  k_hash_ = content_digest(k_cache_->data(), k_cache_->nbytes());
  v_hash_ = content_digest(v_cache_->data(), v_cache_->nbytes());
}

std::vector<std::string> CacheRestorer::restore() const {
  scatter_rows(*k_cache_, rows_, k_initial_.data());
  scatter_rows(*v_cache_, rows_, v_initial_.data());
  std::vector<std::string> changed;
  if (content_digest(k_cache_->data(), k_cache_->nbytes()) != k_hash_)
    changed.emplace_back("k_cache");
  if (content_digest(v_cache_->data(), v_cache_->nbytes()) != v_hash_)
    changed.emplace_back("v_cache");
  return changed;
}

SceneReport run_scene(Worker& worker, const SceneOptions& options,
                      const std::function<void(const SceneRound&)>& on_round) {
  validate(options);
  return pinstage::run_scene(worker, *scene(), run_options(options), on_round);
}

}  // namespace pinstage::qwen3
