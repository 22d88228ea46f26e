// The sim plugin's table, for the test plugins built on it (no_device_ops, half_topology,
// held_streams): dlopen'ed from PINSTAGE_SIM_PLUGIN_PATH once; every slot NULL when it
// cannot be loaded, which the runtime's loader refuses.
#pragma once

#include <dlfcn.h>

#include "pinstage/backend/platform_abi.h"

inline ps_platform_api sim_table() {
  void* sim = dlopen(PINSTAGE_SIM_PLUGIN_PATH, RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
  auto entry =
      sim != nullptr
          ? reinterpret_cast<ps_platform_entry_fn>(dlsym(sim, PINSTAGE_PLATFORM_ENTRY_SYMBOL))
          : nullptr;
  return entry != nullptr ? *entry() : ps_platform_api{};
}
