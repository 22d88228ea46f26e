// While `pinstage fixture --out DIR --shard-size N` writes, a SIGINT, SIGTERM
// or SIGHUP removes the shards this run finished before its index was
// committed: without the index they are no checkpoint, only tens of MB left
// behind. See docs/cli.md ("Files pinstage writes").
#pragma once

#include <string>

namespace pinstage::cli {

// Installs the handlers for its lifetime (one at a time), after the CLI's own
// (remove_temporary_files_on_signals), which still run after it. The shards it
// removes are the files named model-*.safetensors that were not in `dir` when
// it was made, so a user's files stay; once the index is committed (replaced or
// made) nothing is removed.
class ShardCleanupOnSignal {
 public:
  explicit ShardCleanupOnSignal(const std::string& dir);
  ~ShardCleanupOnSignal();
  ShardCleanupOnSignal(const ShardCleanupOnSignal&) = delete;
  ShardCleanupOnSignal& operator=(const ShardCleanupOnSignal&) = delete;
};

}  // namespace pinstage::cli
