// sim with one way of pinning taken away (issue 46, the host sources), as other backends are:
//  - no_register: no host_register/host_unregister, as a backend that can only allocate
//    pinned memory of its own: the runtime's pool takes the vendor source.
//  - no_read_only (PINSTAGE_NO_READ_ONLY): host_register refuses PS_REGISTER_READ_ONLY with
//    PS_ERR_UNSUPPORTED, as a CUDA driver whose cudaDevAttrHostRegisterReadOnlySupported is
//    0: map mode pins a private copy (file_private) instead.
//  - no_pinning (PINSTAGE_NO_PINNING): neither pair, which the loader refuses (ABI v8).
#include "pinstage/backend/platform_abi.h"
#include "sim_table.h"

namespace {
ps_platform_api sim_api{};

int refuse_read_only(ps_device_ctx* ctx, void* ptr, size_t bytes, uint32_t flags) {
  if ((flags & PS_REGISTER_READ_ONLY) != 0) return PS_ERR_UNSUPPORTED;
  return sim_api.host_register(ctx, ptr, bytes, flags);
}

// sim's table with the pinning slots this variant lacks, or a refusing host_register.
ps_platform_api variant(const char* name, bool register_slots, bool vendor_slots,
                        decltype(ps_platform_api::host_register) host_register) {
  sim_api = sim_table();
  ps_platform_api api = sim_api;
  api.name = name;
  if (host_register != nullptr) api.host_register = host_register;
  if (!register_slots) {
    api.host_register = nullptr;
    api.host_unregister = nullptr;
  }
  if (!vendor_slots) {
    api.host_alloc_pinned = nullptr;
    api.host_free_pinned = nullptr;
  }
  return api;
}

#if defined(PINSTAGE_NO_READ_ONLY)
ps_platform_api table = variant("no_read_only", true, true, refuse_read_only);
#elif defined(PINSTAGE_NO_PINNING)
ps_platform_api table = variant("no_pinning", false, false, nullptr);
#else
ps_platform_api table = variant("no_register", false, true, nullptr);
#endif
}  // namespace

extern "C" PINSTAGE_PLUGIN_EXPORT const ps_platform_api* pinstage_platform_entry(void) {
  return &table;
}
