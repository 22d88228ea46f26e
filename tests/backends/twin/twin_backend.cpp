// The twin backend (tests/backends/twin/CMakeLists.txt): sim's table under the name "twin".
// Its context creation says at debug level that it is sim's, through base's log as any
// backend's messages go (so it links base, as conformance.twin.PluginLinksBaseOnly checks).
#include <string>

#include "pinstage/backend/platform_abi.h"
#include "pinstage/log.h"
#include "sim_table.h"

namespace {
ps_platform_api sim_api{};

int create_context(int device_id, const ps_context_options* options, ps_device_ctx** out) {
  try {
    pinstage::log(pinstage::LogLevel::debug,
                  "twin: device " + std::to_string(device_id) + " is a sim device");
  } catch (...) {  // nothing unwinds through the C ABI
    return PS_ERR_INTERNAL;
  }
  return sim_api.create_context(device_id, options, out);
}

ps_platform_api twin() {
  sim_api = sim_table();
  ps_platform_api api = sim_api;
  api.name = "twin";
  if (api.create_context != nullptr) api.create_context = create_context;
  return api;
}
const ps_platform_api table = twin();
}  // namespace

extern "C" PINSTAGE_PLUGIN_EXPORT const ps_platform_api* pinstage_platform_entry(void) {
  return &table;
}
