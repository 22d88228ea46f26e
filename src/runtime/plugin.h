// Loading backend plugins: dlopen once, check the ABI version, resolve the table once.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "pinstage/export.h"
#include "pinstage/platform_abi.h"
#include "pinstage/worker.h"

namespace pinstage::detail {

struct PINSTAGE_API DlCloser {
  void operator()(void* handle) const noexcept;
};
using DlHandle = std::unique_ptr<void, DlCloser>;

// A loaded plugin: the handle keeps the code mapped while `api` is used.
struct Plugin {
  DlHandle handle;
  const ps_platform_api* api = nullptr;
  BackendInfo info;
};

// Folder holding libpinstage (and the plugins built beside it).
PINSTAGE_API std::string library_dir();
// Where `backend` is looked for when no explicit path is given.
PINSTAGE_API std::string default_plugin_path(const std::string& backend);
// Loads a plugin; Error(plugin_load) naming the backend, the path and the reason when
// the file is missing, has no entry symbol, a wrong api_version or missing slots.
PINSTAGE_API Plugin load_plugin(const std::string& backend, const std::string& path);
// Every libpinstage_backend_*.so in library_dir(), sorted by path.
PINSTAGE_API std::vector<std::string> discover_plugins();

}  // namespace pinstage::detail
