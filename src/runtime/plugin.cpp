#include "runtime/plugin.h"

#include <dlfcn.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>

#include "pinstage/error.h"
#include "pinstage/files.h"
#include "pinstage/log.h"

namespace pinstage {

std::string library_dir() {
  Dl_info info{};
  // Any function defined in libpinstage locates the library file itself.
  if (dladdr(reinterpret_cast<void*>(&library_dir), &info) == 0 || info.dli_fname == nullptr)
    throw Error(ErrorCode::plugin_load, "cannot locate libpinstage (dladdr failed)");
  return std::filesystem::weakly_canonical(info.dli_fname).parent_path().string();
}

// The plugins' folder: <library_dir>/pinstage when it exists (the installed layout,
// cmake/install.cmake and docs/install.md), else library_dir() itself (the build tree).
std::filesystem::path runtime::plugin_dir() {
  const std::filesystem::path lib = library_dir();
  std::error_code ec;
  return std::filesystem::is_directory(lib / "pinstage", ec) ? lib / "pinstage" : lib;
}

std::string default_backend_path(const std::string& backend) {
  return (runtime::plugin_dir() / ("libpinstage_backend_" + backend + ".so")).string();
}

namespace runtime {
namespace {

[[noreturn]] void fail(const std::string& backend, const std::string& path,
                       const std::string& why) {
  throw Error(ErrorCode::plugin_load,
              "cannot load backend '" + backend + "' from " + path + ": " + why);
}

// Slots a plugin must provide; the rest are optional and defaulted by the Worker.
void check_required_slots(const ps_platform_api& api, const std::string& backend,
                          const std::string& path) {
  const std::pair<const void*, const char*> slots[] = {
      {reinterpret_cast<const void*>(api.last_error), "last_error"},
      {reinterpret_cast<const void*>(api.create_context), "create_context"},
      {reinterpret_cast<const void*>(api.destroy_context), "destroy_context"},
      {reinterpret_cast<const void*>(api.device_malloc), "device_malloc"},
      {reinterpret_cast<const void*>(api.device_free), "device_free"},
      {reinterpret_cast<const void*>(api.copy_h2d), "copy_h2d"},
      {reinterpret_cast<const void*>(api.copy_d2h), "copy_d2h"},
      {reinterpret_cast<const void*>(api.mem_info), "mem_info"},
      {reinterpret_cast<const void*>(api.get_capabilities), "get_capabilities"},
  };
  for (const auto& [slot, name] : slots)
    if (slot == nullptr) fail(backend, path, std::string("required slot '") + name + "' is NULL");
  // The async slots come as a set: a partial set would mix queues and sync copies.
  const void* async[] = {reinterpret_cast<const void*>(api.stream_create),
                         reinterpret_cast<const void*>(api.stream_destroy),
                         reinterpret_cast<const void*>(api.stream_sync),
                         reinterpret_cast<const void*>(api.copy_h2d_async),
                         reinterpret_cast<const void*>(api.copy_d2h_async),
                         reinterpret_cast<const void*>(api.event_create),
                         reinterpret_cast<const void*>(api.event_destroy),
                         reinterpret_cast<const void*>(api.event_record),
                         reinterpret_cast<const void*>(api.event_sync)};
  const auto present =
      std::count_if(std::begin(async), std::end(async), [](const void* p) { return p != nullptr; });
  if (present != 0 && present != static_cast<long>(std::size(async)))
    fail(backend, path, "async slots must be all present or all NULL");
  if ((api.device_count == nullptr) != (api.device_props == nullptr))
    fail(backend, path,
         "topology slots device_count and device_props must be both present or both NULL");
  if ((api.host_register == nullptr) != (api.host_unregister == nullptr))
    fail(backend, path,
         "pinning slots host_register and host_unregister must be both present or both NULL");
  if ((api.host_alloc_pinned == nullptr) != (api.host_free_pinned == nullptr))
    fail(backend, path,
         "vendor slots host_alloc_pinned and host_free_pinned must be both present or both NULL");
  if (api.host_register == nullptr && api.host_alloc_pinned == nullptr)
    fail(backend, path,
         "the plugin cannot pin host memory: it needs host_register/host_unregister or "
         "host_alloc_pinned/host_free_pinned");
}

Plugin load(const std::string& backend, const std::string& path) {
  if (!std::filesystem::exists(path)) fail(backend, path, "no such file");
  // Never closed (see plugin.h); NODELETE keeps it mapped even if someone else dlcloses.
  std::string why;
  void* handle = dlopen_regular_file(path, RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE, &why);
  if (handle == nullptr) fail(backend, path, "dlopen failed: " + why);
  auto entry =
      reinterpret_cast<ps_platform_entry_fn>(dlsym(handle, PINSTAGE_PLATFORM_ENTRY_SYMBOL));
  if (entry == nullptr)
    fail(backend, path,
         std::string("no entry symbol '") + PINSTAGE_PLATFORM_ENTRY_SYMBOL +
             "' (is this a pinstage backend plugin?)");
  const ps_platform_api* api = entry();
  if (api == nullptr) fail(backend, path, "entry symbol returned NULL");
  if (api->api_version != PINSTAGE_PLATFORM_API_VERSION)
    fail(backend, path,
         "plugin built for platform API version " + std::to_string(api->api_version) +
             ", this pinstage needs version " + std::to_string(PINSTAGE_PLATFORM_API_VERSION) +
             ": rebuild the plugin");
  check_required_slots(*api, backend, path);
  return Plugin{api, BackendInfo{api->name ? api->name : backend, path, api->api_version}};
}

}  // namespace

const Plugin& acquire_plugin(const std::string& backend, const std::string& path) {
  // Never destroyed, like the plugins: threads still running at exit (a Python daemon
  // thread, say) may use a plugin while static destructors run.
  static std::mutex& mu = *new std::mutex;
  static auto& loaded = *new std::map<std::string, std::unique_ptr<Plugin>>;  // by path
  const std::string key = std::filesystem::weakly_canonical(path).string();
  std::lock_guard lock(mu);
  auto it = loaded.find(key);
  if (it == loaded.end())
    it = loaded.emplace(key, std::make_unique<Plugin>(load(backend, path))).first;
  return *it->second;
}

}  // namespace runtime

BackendInfo load_backend(const std::string& backend, const std::string& path) {
  return runtime::acquire_plugin(backend, path.empty() ? default_backend_path(backend) : path).info;
}

std::vector<std::string> discover_backends() {
  std::vector<std::string> found;
  for (const auto& entry : std::filesystem::directory_iterator(runtime::plugin_dir())) {
    const std::string name = entry.path().filename().string();
    if (name.starts_with("libpinstage_backend_") && name.ends_with(".so"))
      found.push_back(entry.path().string());
  }
  std::sort(found.begin(), found.end());
  return found;
}

}  // namespace pinstage
