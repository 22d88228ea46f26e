// The scene run. Between rounds the INOUT caches go back to their initial bytes by
// restoring only the rows the decode writes (a second copy of 14 GB of pools is what
// this avoids); a content hash taken before the first round proves the rest came back
// untouched.
#include "pinstage/qwen3_scene.h"

#include <chrono>
#include <cstring>

#include "pinstage/parallel.h"

namespace pinstage::qwen3 {
namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

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

}  // namespace

const char* host_storage_name(HostStorage storage) {
  return storage == HostStorage::pinned ? "pinned" : "pageable";
}

HostStorage parse_host_storage(std::string_view name) {
  if (name == "pinned") return HostStorage::pinned;
  if (name == "pageable") return HostStorage::pageable;
  throw Error(ErrorCode::invalid_argument,
              "unknown storage '" + std::string(name) + "' (valid: pageable, pinned)");
}

void validate(const SceneOptions& options) {
  validate(options.config);
  if (options.rounds < 1)
    throw Error(ErrorCode::invalid_argument,
                "rounds must be >= 1, got " + std::to_string(options.rounds));
  if (options.skip_golden && !options.save_golden.empty())
    throw Error(ErrorCode::invalid_argument,
                "--save-golden needs the golden: drop --skip-golden to save it");
  if (options.callable.empty())
    throw Error(ErrorCode::invalid_argument, "the scene needs a callable to execute");
  validate(options.bind);
}

bool SceneReport::ok() const noexcept {
  for (const auto& round : rounds)
    if (!round.ok()) return false;
  return !rounds.empty();
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
  require_chip_worker(worker, "the qwen3 scene");
  const int n_layers = options.config.n_layers;
  SceneReport report;
  report.storage = host_storage_name(options.storage);

  PageableAllocator pageable;
  std::unique_ptr<PinnedAllocator> pinned;
  if (options.storage == HostStorage::pinned) pinned = std::make_unique<PinnedAllocator>(worker);
  HostAllocator& allocator =
      pinned ? static_cast<HostAllocator&>(*pinned) : static_cast<HostAllocator&>(pageable);

  auto start = std::chrono::steady_clock::now();
  const TaskArgs args = make_args(allocator, options.config);
  report.generate_seconds = seconds_since(start);
  report.args_summary = args.summary();

  Golden golden;
  if (!options.skip_golden) {
    start = std::chrono::steady_clock::now();
    golden = compute_golden(args, n_layers);
    report.golden_seconds = seconds_since(start);
    if (!options.save_golden.empty()) save_golden(golden, options.save_golden);
  }

  const CacheRestorer restorer(args, n_layers);

  BindOptions bind = options.bind;
  bind.execute_callable = options.callable;
  bind.verify_upload = true;
  Binder binder(worker, bind);
  for (int r = 1; r <= options.rounds; ++r) {
    SceneRound round;
    round.index = r;
    try {
      round.bind = binder.run(args);
    } catch (const BindError& e) {
      round.failure = e.what();  // names the step and the tensor
    }
    start = std::chrono::steady_clock::now();
    if (round.ok() && !options.skip_golden) {
      round.comparison = compare(args, golden);
      if (!round.comparison->ok) round.failure = round.comparison->message();
    }
    for (const std::string& cache : restorer.restore()) {
      round.caches_intact = false;
      round.failure += (round.failure.empty() ? "" : "; ") + cache +
                       ": bytes outside the rows the decode writes came back changed";
    }
    round.check_seconds = seconds_since(start);
    report.rounds.push_back(round);
    if (on_round) on_round(report.rounds.back());
    if (!round.ok()) break;
  }
  return report;
}

}  // namespace pinstage::qwen3
