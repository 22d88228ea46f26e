// A plugin of the right version whose required slots are NULL: the loader must name one.
#include "pinstage/backend/platform_abi.h"

namespace {
const char* no_error() { return ""; }
ps_platform_api table = [] {
  ps_platform_api api{};
  api.api_version = PINSTAGE_PLATFORM_API_VERSION;
  api.name = "missing_slot";
  api.last_error = no_error;
  return api;
}();
}  // namespace

extern "C" PINSTAGE_PLUGIN_EXPORT const ps_platform_api* pinstage_platform_entry(void) {
  return &table;
}
