// A working backend without the ABI v5 device-side slots and the v6 topology slots: sim's
// table with copy_d2d_async, memset_async, device_count and device_props left NULL, as a
// backend that lacks them builds it. The runtime must answer Error(unsupported) naming the
// backend and the operation, never fall back, and list one device of unknown properties.
// Built with PINSTAGE_HALF_TOPOLOGY it keeps device_count alone: a broken table the
// loader refuses (the topology slots come as a pair).
#include "pinstage/backend/platform_abi.h"
#include "sim_table.h"

namespace {
ps_platform_api table = [] {
  ps_platform_api api = sim_table();
  api.copy_d2d_async = nullptr;
  api.memset_async = nullptr;
  api.device_props = nullptr;
#ifdef PINSTAGE_HALF_TOPOLOGY
  api.name = "half_topology";
#else
  api.name = "no_device_ops";
  api.device_count = nullptr;
#endif
  return api;
}();
}  // namespace

extern "C" PINSTAGE_PLUGIN_EXPORT const ps_platform_api* pinstage_platform_entry(void) {
  return &table;
}
