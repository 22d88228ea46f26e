// The Qwen3-14B decode scene as a registered scene (include/pinstage/scene.h) and its run:
// generate the fixture, compute the golden once, then rounds of bind, execute, read back
// and compare. See docs/golden.md.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "pinstage/bind.h"
#include "pinstage/export.h"
#include "pinstage/qwen3/golden.h"
#include "pinstage/scene.h"
#include "pinstage/worker.h"

namespace pinstage::qwen3 {

// The registered scene's name and its execute step's host callable.
inline constexpr const char* kSceneName = "qwen3-decode";
inline constexpr const char* kCallable = "qwen3_decode";

// The registered scene (registered when this library loads).
PINSTAGE_API std::shared_ptr<const Scene> scene();

// Config <-> the scene's parameter values ("layers", "seq_len", "seed").
PINSTAGE_API SceneValues scene_values(const Config& config);
PINSTAGE_API Config config_of(const SceneValues& values, int threads = 0);

// The host callable behind kCallable: the decode on bound device buffers, in place, on the
// portable (generic) kernels, so a run is checked against the golden's other kernel set
// within the tolerance (docs/golden.md, "Execute step").
PINSTAGE_API void execute_decode(std::span<const ExecArg> args);

using pinstage::host_storage_name;
using pinstage::HostStorage;
using pinstage::parse_host_storage;
using SceneRound = pinstage::SceneRound;
using SceneReport = pinstage::SceneReport;

struct SceneOptions {
  Config config;
  HostStorage storage = HostStorage::pinned;
  int rounds = 1;            // >= 1
  bool skip_golden = false;  // run and check byte integrity only
  std::string save_golden;   // write the golden here (.safetensors) when not empty
  std::string callable = kCallable;
  BindOptions bind;  // its execute_callable and verify_upload are set by the run
};

// Throws Error(invalid_argument) naming the bad option (config, rounds, skip_golden with
// save_golden) before anything is allocated.
PINSTAGE_API void validate(const SceneOptions& options);

// The flat rows of k_cache/v_cache the decode writes (spec step 11), layer-major, then
// lane, then kv head: l * kCacheRows + slot_mapping[b] * kNumKvHeads + h.
PINSTAGE_API std::vector<int64_t> written_rows(const TaskArgs& args, int n_layers);

// The same rows as byte ranges of k_cache and v_cache: per layer and lane, its eight kv
// heads' rows are contiguous (one 2,048-byte range each). What a resident run reads back.
PINSTAGE_API std::vector<ByteRange> written_ranges(const TaskArgs& args, int n_layers);

// Puts the INOUT caches back to their initial bytes after a round by restoring only the
// rows the decode writes (no second copy of the pools), and proves the rest came back
// untouched with a content hash taken at construction. `args` must outlive it.
class PINSTAGE_API CacheRestorer : public RoundReset {
 public:
  CacheRestorer(const TaskArgs& args, int n_layers);
  const std::vector<int64_t>& rows() const noexcept { return rows_; }
  // Restores the written rows of k_cache and v_cache; returns the names of the caches whose
  // other bytes differ from their initial ones (empty when both are intact).
  std::vector<std::string> restore() const override;

 private:
  const Tensor* k_cache_;
  const Tensor* v_cache_;
  std::vector<int64_t> rows_;
  std::vector<uint16_t> k_initial_, v_initial_;
  uint64_t k_hash_ = 0, v_hash_ = 0;
};

// The scene run (pinstage::run_scene on the registered scene). Stops at the first failing
// round; `on_round` is called after each round.
PINSTAGE_API SceneReport run_scene(Worker& worker, const SceneOptions& options,
                                   const std::function<void(const SceneRound&)>& on_round = {});

}  // namespace pinstage::qwen3
