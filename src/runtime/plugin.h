// The process-wide plugin registry: each plugin file is dlopened once, checked once and
// kept for the life of the process (no dlclose: a vendor runtime a plugin pulls in, such
// as libcudart, is not meant to be torn down and reloaded under live threads).
#pragma once

#include <string>

#include "pinstage/backend/platform_abi.h"
#include "pinstage/worker.h"

namespace pinstage::runtime {

// A loaded plugin: its table and what the Worker reports about it.
struct Plugin {
  const ps_platform_api* api = nullptr;
  BackendInfo info;
};

// The plugin at `path` for `backend`, loading it on first use. Error(plugin_load) naming
// the backend, the path and the reason when the file is missing, has no entry symbol, a
// wrong api_version or missing slots (a failed load is not cached).
const Plugin& acquire_plugin(const std::string& backend, const std::string& path);

}  // namespace pinstage::runtime
