// Internal state of the sim backend (see sim_backend.cpp for what sim does).
#pragma once

#include <array>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "backends/sim/device_pool.h"
#include "backends/sim/dma.h"
#include "backends/sim/sim_config.h"
#include "backends/sim/stream.h"
#include "pinstage/backend/faults.h"
#include "pinstage/backend/platform_abi.h"

namespace pinstage::sim {

struct Event {
  void mark(bool done, int failure = PS_OK, std::string failure_text = {});
  // Waits until reached; returns the failure of a copy queued before it (PS_OK if none).
  int wait(std::string* error);
  bool reached();  // never blocks
  std::mutex mu;
  std::condition_variable cv;
  bool done = true;  // never recorded = complete, as on CUDA
  int status = PS_OK;
  std::string error;
};

// The device: its memory pool and one driver channel per direction (copy engine plus
// bounce buffers). It keeps no list of pinned ranges: the runtime's one table says with
// each copy whether its host side is pinned (PS_COPY_HOST_PINNED), and that picks the path.
struct Context {
  uint64_t capacity = 0;
  SimConfig config;
  std::unique_ptr<DevicePool> pool;
  std::unique_ptr<Channel> h2d, d2h;
  std::atomic<bool> lock_refused{false};
  backend::FaultCountdowns faults;  // the fault hook (backend/faults.h)

  StreamGate gate;  // outlives the streams: the runtime destroys them first

  // Copies by path: [h2d direct, h2d bounced, d2h direct, d2h bounced] x (count, bytes).
  std::array<std::atomic<uint64_t>, 8> copies{};

  bool should_fail(ps_fault_kind kind);
};

}  // namespace pinstage::sim
