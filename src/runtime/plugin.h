// The process-wide plugin registry: each plugin file is dlopened once, checked once and
// kept for the life of the process (no dlclose: a vendor runtime a plugin pulls in, such
// as libcudart, is not meant to be torn down and reloaded under live threads).
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

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

// The folder the plugins (and their descriptions) are looked for in.
std::filesystem::path plugin_dir();

// The plugin WorkerOptions::plugin_path names, or the default one for `backend`.
const Plugin& acquire_plugin(const std::string& backend, const WorkerOptions& options);

// The ps_context_options a backend gets for `options`, its config entries pointing into
// `entries` and options.config (both must outlive it); `host_numa_node` as resolved.
// Error(invalid_argument) for a repeated config key.
ps_context_options context_options(const WorkerOptions& options, int host_numa_node,
                                   std::vector<ps_config_entry>& entries);

// Throws the backend's failure as the Error its status maps to: "backend '<name>' (<path>)
// could not <what>: <status> (<last_error>)".
[[noreturn]] void throw_backend_failure(const Plugin& plugin, int status, const std::string& what);

// WorkerOptions::host_numa_node as it takes effect on this host: the node when the host
// has it (NumaSystem::node_cpus is not empty), else -1, warning once per absent node.
// Error(invalid_argument) for a negative node.
int resolve_host_numa_node(const std::optional<int>& node);

// Device `id` through the plugin's topology slots; without them device 0 with unknown
// properties (DeviceInfo's defaults, named after the backend).
DeviceInfo device_properties(const Plugin& plugin, int id, const ps_context_options& options);

}  // namespace pinstage::runtime
