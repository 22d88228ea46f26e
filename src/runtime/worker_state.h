// The shared state behind a Worker and every buffer, stream and event it hands out.
// See Note [Pinned memory lifecycle] in worker.cpp.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>

#include "pinstage/export.h"
#include "pinstage/platform_abi.h"
#include "pinstage/worker.h"
#include "runtime/plugin.h"
#include "runtime/registry.h"

namespace pinstage::detail {

struct PINSTAGE_API WorkerState {
  Plugin plugin;
  ps_device_ctx* ctx = nullptr;
  int device_id = 0;

  mutable std::mutex mu;
  std::condition_variable idle;  // signalled when in_flight drops to 0
  bool live = false;             // initialized and not finalized
  uint64_t in_flight = 0;        // backend calls running now (finalize waits for them)
  AllocationRegistry pinned;
  AllocationRegistry device;
  uint64_t streams = 0;  // outstanding streams and events (released before the context)
  uint64_t events = 0;

  const ps_platform_api& api() const { return *plugin.api; }

  // Throws Error(code, "<backend> <what> failed: <status> (<detail>)") unless status is OK.
  void check(int status, const char* what) const;

  // Raw alloc/free: internal only; the public surface is the buffer types.
  void* alloc(MemoryKind kind, size_t bytes);
  // Releases a tracked pointer; a no-op once the worker is no longer live (finalize
  // reclaimed it already). Throws Error(unknown_pointer) for an untracked pointer and
  // Error(<backend code>) when the backend refuses.
  void free(MemoryKind kind, void* ptr);

  // Frees everything, destroys the context and unloads the plugin. Idempotent.
  void shutdown() noexcept;
};

// Counts a backend call as in flight so finalize cannot destroy the context under it.
// enter() is false when the worker is no longer live; then nothing is counted.
class PINSTAGE_API CallGuard {
 public:
  explicit CallGuard(WorkerState& state) noexcept;
  ~CallGuard();
  CallGuard(CallGuard&& other) noexcept;  // so Worker::enter can return one
  CallGuard(const CallGuard&) = delete;
  CallGuard& operator=(const CallGuard&) = delete;
  bool entered() const noexcept { return entered_; }
  // Throws Error(finalized) unless entered.
  void require() const;

 private:
  WorkerState& state_;
  bool entered_;
};

}  // namespace pinstage::detail
