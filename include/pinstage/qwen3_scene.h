// The Qwen3-14B decode scene run: generate the fixture, compute the golden once, then
// rounds of bind, execute, read back and compare. See docs/golden.md.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "pinstage/bind.h"
#include "pinstage/export.h"
#include "pinstage/qwen3_golden.h"
#include "pinstage/worker.h"

namespace pinstage::qwen3 {

// Where the scene's host arguments live.
enum class HostStorage { pageable, pinned };
PINSTAGE_API const char* host_storage_name(HostStorage storage);  // "pageable", "pinned"
// Throws Error(invalid_argument) listing the valid names.
PINSTAGE_API HostStorage parse_host_storage(std::string_view name);

struct SceneOptions {
  Config config;
  HostStorage storage = HostStorage::pinned;
  int rounds = 1;            // >= 1
  bool skip_golden = false;  // run and check byte integrity only
  std::string save_golden;   // write the golden here (.safetensors) when not empty
  std::string callable = "qwen3_decode";
  BindOptions bind;  // its execute_callable and verify_upload are set by the run
};

// Throws Error(invalid_argument) naming the bad option (config, rounds, skip_golden with
// save_golden) before anything is allocated.
PINSTAGE_API void validate(const SceneOptions& options);

struct SceneRound {
  int index = 0;  // 1-based
  BindReport bind;
  std::optional<Comparison> comparison;  // absent with skip_golden
  // Outside the rows the decode writes, the caches read back equal their initial bytes.
  bool caches_intact = true;
  std::string failure;  // empty when the round passed
  double check_seconds = 0.0;
  bool ok() const noexcept { return failure.empty(); }
};

struct PINSTAGE_API SceneReport {
  std::string storage;
  std::string args_summary;  // TaskArgs::summary()
  double generate_seconds = 0.0;
  double golden_seconds = 0.0;  // 0 with skip_golden
  std::vector<SceneRound> rounds;
  bool ok() const noexcept;
};

// The flat rows of k_cache/v_cache the decode writes (spec step 11), layer-major, then
// lane, then kv head: l * kCacheRows + slot_mapping[b] * kNumKvHeads + h.
PINSTAGE_API std::vector<int64_t> written_rows(const TaskArgs& args, int n_layers);

// Puts the INOUT caches back to their initial bytes after a round by restoring only the
// rows the decode writes (no second copy of the pools), and proves the rest came back
// untouched with a content hash taken at construction. `args` must outlive it.
class PINSTAGE_API CacheRestorer {
 public:
  CacheRestorer(const TaskArgs& args, int n_layers);
  const std::vector<int64_t>& rows() const noexcept { return rows_; }
  // Restores the written rows of k_cache and v_cache; returns the names of the caches whose
  // other bytes differ from their initial ones (empty when both are intact).
  std::vector<std::string> restore() const;

 private:
  const Tensor* k_cache_;
  const Tensor* v_cache_;
  std::vector<int64_t> rows_;
  std::vector<uint16_t> k_initial_, v_initial_;
  uint64_t k_hash_ = 0, v_hash_ = 0;
};

// Runs the scene on `worker` (chip level). Stops at the first failing round. `on_round` is
// called after each round (progress reporting).
PINSTAGE_API SceneReport run_scene(Worker& worker, const SceneOptions& options,
                                   const std::function<void(const SceneRound&)>& on_round = {});

}  // namespace pinstage::qwen3
