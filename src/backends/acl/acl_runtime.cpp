#include "backends/acl/acl_runtime.h"

#include <dlfcn.h>

#include <cstdlib>
#include <filesystem>

#include "pinstage/error.h"
#include "pinstage/files.h"
#include "pinstage/settings.h"

namespace pinstage::acl {

const char* acl_error_name(aclError code) noexcept {
  switch (code) {
#define PINSTAGE_ACL_CASE_(name, value) \
  case value:                           \
    return #name;
    PINSTAGE_ACL_ERROR_LIST(PINSTAGE_ACL_CASE_)
#undef PINSTAGE_ACL_CASE_
    default:
      return "unknown ACL error";
  }
}

namespace {

constexpr const char* kLibrary = "libascendcl.so";

std::optional<std::string> env_path(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return std::nullopt;
  return std::string(value);
}

// Resolves every symbol of `handle` into `rt`; the name of the first missing one, or
// empty when all are there.
std::string resolve(void* handle, Runtime& rt) {
#define PINSTAGE_ACL_RESOLVE_(name, ret, params)                   \
  rt.name = reinterpret_cast<ret(*) params>(dlsym(handle, #name)); \
  if (rt.name == nullptr) return #name;
  PINSTAGE_ACL_FUNCTION_LIST(PINSTAGE_ACL_RESOLVE_)
#undef PINSTAGE_ACL_RESOLVE_
  rt.aclGetRecentErrMsg =
      reinterpret_cast<aclGetRecentErrMsg_fn>(dlsym(handle, "aclGetRecentErrMsg"));
  rt.aclrtMemsetAsync = reinterpret_cast<aclrtMemsetAsync_fn>(dlsym(handle, "aclrtMemsetAsync"));
  return {};
}

// dlopens one candidate; the runtime, or nullptr with `why` filled.
std::unique_ptr<Runtime> try_candidate(const Candidate& c, std::string& why) {
  const bool is_path = c.path.find('/') != std::string::npos;
  if (is_path && !std::filesystem::exists(c.path)) {
    why = "no such file";
    return nullptr;
  }
  void* handle = nullptr;
  if (is_path) {  // a FIFO named by PINSTAGE_ACL_LIBRARY would block dlopen forever
    handle = dlopen_regular_file(c.path, RTLD_NOW | RTLD_LOCAL, &why);
  } else {  // a bare name: the loader searches its own directories
    dlerror();
    handle = dlopen(c.path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      const char* text = dlerror();
      why = text != nullptr ? text : "dlopen failed";
    }
  }
  if (handle == nullptr) return nullptr;
  auto rt = std::make_unique<Runtime>();
  const std::string missing = resolve(handle, *rt);
  if (!missing.empty()) {
    why = "loaded but has no symbol " + missing + " (not an Ascend runtime?)";
    dlclose(handle);
    return nullptr;
  }
  rt->path = c.path;
  rt->origin = c.origin;
  return rt;
}

}  // namespace

SearchInputs search_inputs_from_environment() {
  return SearchInputs{setting_text(Setting::acl_library), env_path("ASCEND_HOME_PATH"),
                      env_path("ASCEND_TOOLKIT_HOME")};
}

std::vector<Candidate> library_candidates(const SearchInputs& in) {
  if (in.acl_library) return {Candidate{"PINSTAGE_ACL_LIBRARY", *in.acl_library}};
  std::vector<Candidate> out;
  const auto lib64 = [](const std::string& home) {
    return (std::filesystem::path(home) / "lib64" / kLibrary).string();
  };
  if (in.ascend_home) out.push_back({"$ASCEND_HOME_PATH/lib64", lib64(*in.ascend_home)});
  if (in.toolkit_home) out.push_back({"$ASCEND_TOOLKIT_HOME/lib64", lib64(*in.toolkit_home)});
  out.push_back({"the default library path", kLibrary});
  return out;
}

std::unique_ptr<Runtime> load_runtime(const SearchInputs& inputs) {
  std::string tried;
  for (const Candidate& c : library_candidates(inputs)) {
    std::string why;
    if (auto rt = try_candidate(c, why)) return rt;
    tried += (tried.empty() ? "" : "; ") + c.origin + " " + c.path + " (" + why + ")";
  }
  if (!inputs.acl_library && !inputs.ascend_home && !inputs.toolkit_home)
    tried += "; ASCEND_HOME_PATH, ASCEND_TOOLKIT_HOME and PINSTAGE_ACL_LIBRARY are unset";
  throw Error(ErrorCode::no_device,
              "no Ascend runtime (libascendcl.so) could be loaded; tried: " + tried +
                  ". Install CANN and source its set_env.sh, or set PINSTAGE_ACL_LIBRARY");
}

std::string call_error(const Runtime& rt, const std::string& call, aclError code) {
  std::string text = call + " failed: " + std::to_string(code) + " " + acl_error_name(code);
  const char* recent = rt.aclGetRecentErrMsg != nullptr ? rt.aclGetRecentErrMsg() : nullptr;
  if (recent != nullptr && *recent != '\0') text += std::string(" (") + recent + ")";
  return text;
}

ps_status status_from_acl(aclError code, ps_status fallback) {
  switch (code) {
    case ACL_ERROR_BAD_ALLOC:
    case ACL_ERROR_RT_MEMORY_ALLOCATION:
      return PS_ERR_OUT_OF_MEMORY;
    case ACL_ERROR_RT_NO_DEVICE:
    case ACL_ERROR_RT_INVALID_DEVICEID:
      return PS_ERR_NO_DEVICE;
    case ACL_ERROR_API_NOT_SUPPORT:
    case ACL_ERROR_RT_FEATURE_NOT_SUPPORT:
      return PS_ERR_UNSUPPORTED;
    default:
      return fallback;
  }
}

}  // namespace pinstage::acl
