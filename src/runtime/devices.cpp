// Devices and topology (ABI v6): list_devices, Worker::device_info and where a worker's
// pinned memory is placed (WorkerOptions::host_numa_node).
#include <cstring>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "pinstage/log.h"
#include "pinstage/pages.h"
#include "pinstage/worker.h"
#include "runtime/given_once.h"
#include "runtime/plugin.h"
#include "runtime/worker_state.h"

namespace pinstage {
namespace runtime {

const Plugin& acquire_plugin(const std::string& backend, const WorkerOptions& options) {
  return acquire_plugin(
      backend, options.plugin_path.empty() ? default_backend_path(backend) : options.plugin_path);
}

ps_context_options context_options(const WorkerOptions& options, int host_numa_node,
                                   std::vector<ps_config_entry>& entries) {
  entries.clear();
  for (const auto& entry : options.config) {
    const std::string& key = entry.first;  // not a binding: clang 14's lambdas cannot take one
    detail::check_given_once(
        entries, [&](const ps_config_entry& e) { return key == e.key; },
        "backend option '" + key + "'");
    entries.push_back({key.c_str(), entry.second.c_str()});
  }
  return ps_context_options{.device_capacity_bytes = options.device_capacity_bytes,
                            .config = entries.data(),
                            .config_count = entries.size(),
                            .host_numa_node = host_numa_node};
}

void throw_backend_failure(const Plugin& plugin, int status, const std::string& what) {
  const char* detail = plugin.api->last_error();
  throw Error(error_code_from_status(status),
              "backend '" + plugin.info.name + "' (" + plugin.info.path + ") could not " + what +
                  ": " + ps_status_str(status) +
                  (detail && *detail ? std::string(" (") + detail + ")" : std::string()));
}

int resolve_host_numa_node(const std::optional<int>& node) {
  if (!node) return -1;
  if (*node < 0)
    throw Error(
        ErrorCode::invalid_argument,
        "host_numa_node must be >= 0 (unset = the kernel's choice), got " + std::to_string(*node));
  if (!numa_node_cpus(*node).empty()) return *node;
  // A device map written for a bigger machine (sim's numa_nodes=0,0,1,1 on one node)
  // still builds: say so once per node, and place nothing.
  static std::mutex mu;
  static std::set<int> warned;
  std::lock_guard lock(mu);
  if (warned.insert(*node).second)
    log(LogLevel::warn, "host_numa_node " + std::to_string(*node) +
                            ": this host has no NUMA node " + std::to_string(*node) +
                            " with a CPU this process may use (/sys/devices/system/node); "
                            "pinned memory is left to the kernel's placement");
  return -1;
}

namespace {

// A fixed-size C string of the ABI, up to its NUL or its end.
template <size_t N>
std::string fixed_string(const char (&text)[N]) {
  return std::string(text, strnlen(text, N));
}

}  // namespace

DeviceInfo device_properties(const Plugin& plugin, int id, const ps_context_options& options) {
  const ps_platform_api& api = *plugin.api;
  if (api.device_props == nullptr)
    return DeviceInfo{.id = id,
                      .name = plugin.info.name + " device " + std::to_string(id),
                      .memory_bytes = 0,
                      .pci_bus_id = {},
                      .numa_node = -1,
                      .usable = true,
                      .reason = {}};
  ps_device_props props{};
  props.numa_node = -1;
  if (const int status = api.device_props(id, &options, &props); status != PS_OK)
    throw_backend_failure(plugin, status, "describe device " + std::to_string(id));
  return DeviceInfo{.id = id,
                    .name = fixed_string(props.name),
                    .memory_bytes = props.memory_bytes,
                    .pci_bus_id = fixed_string(props.pci_bus_id),
                    .numa_node = props.numa_node < 0 ? -1 : props.numa_node,
                    .usable = props.usable != 0,
                    .reason = fixed_string(props.reason)};
}

}  // namespace runtime

std::vector<DeviceInfo> list_devices(const std::string& backend, const WorkerOptions& options) {
  const runtime::Plugin& plugin = runtime::acquire_plugin(backend, options);
  std::vector<ps_config_entry> entries;
  const ps_context_options ctx_options = runtime::context_options(options, -1, entries);
  int count = 1;  // no topology slots: one device
  if (plugin.api->device_count != nullptr) {
    if (const int status = plugin.api->device_count(&ctx_options, &count); status != PS_OK)
      runtime::throw_backend_failure(plugin, status, "count its devices");
    if (count < 0)
      throw Error(ErrorCode::backend, "backend '" + plugin.info.name + "' reported " +
                                          std::to_string(count) + " devices");
  }
  std::vector<DeviceInfo> devices;
  devices.reserve(static_cast<size_t>(count));
  for (int id = 0; id < count; ++id)
    devices.push_back(runtime::device_properties(plugin, id, ctx_options));
  return devices;
}

DeviceInfo Worker::device_info() const {
  const runtime::CallGuard guard = enter();
  std::vector<ps_config_entry> entries;
  const ps_context_options ctx_options =
      runtime::context_options(state_->options, state_->placement.numa_node, entries);
  return runtime::device_properties(*state_->plugin, state_->device_id, ctx_options);
}

int Worker::host_numa_node() const { return state().placement.numa_node; }

}  // namespace pinstage
