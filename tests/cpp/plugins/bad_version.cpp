// A plugin built for a future platform API version: the loader must refuse it.
#include "pinstage/backend/platform_abi.h"

namespace {
ps_platform_api table = [] {
  ps_platform_api api{};
  api.api_version = PINSTAGE_PLATFORM_API_VERSION + 98;
  api.name = "bad_version";
  return api;
}();
}  // namespace

extern "C" PINSTAGE_PLUGIN_EXPORT const ps_platform_api* pinstage_platform_entry(void) {
  return &table;
}
