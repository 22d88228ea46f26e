// Finding, loading and calling the Ascend runtime (libascendcl.so) without CANN at build
// time. docs/acl.md describes the search order; tests/cpp/test_acl_runtime.cpp checks it.
//
// Note [Library search order]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~
// 1. PINSTAGE_ACL_LIBRARY, a path to the library. When set it is the only candidate: an
//    explicit choice that fails is an error, never a silent fall-through to another
//    runtime.
// 2. $ASCEND_HOME_PATH/lib64/libascendcl.so, then $ASCEND_TOOLKIT_HOME/lib64/libascendcl.so
//    (CANN's set_env.sh exports both).
// 3. libascendcl.so on the default search path (LD_LIBRARY_PATH, ld.so.cache).
// The first candidate that dlopens and has every symbol wins. When none does, the error is
// one line naming each candidate and why it failed.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backends/acl/acl_api.h"
#include "pinstage/backend/platform_abi.h"

namespace pinstage::acl {

// What the search looks at; unset (or empty, for the ASCEND_* variables) is nullopt.
struct SearchInputs {
  std::optional<std::string> acl_library;   // PINSTAGE_ACL_LIBRARY
  std::optional<std::string> ascend_home;   // ASCEND_HOME_PATH
  std::optional<std::string> toolkit_home;  // ASCEND_TOOLKIT_HOME
};

// Reads the three variables now (PINSTAGE_ACL_LIBRARY through the settings module).
SearchInputs search_inputs_from_environment();

// One place to look: where it came from ("PINSTAGE_ACL_LIBRARY") and what is dlopened.
struct Candidate {
  std::string origin;
  std::string path;
};

// The candidates in search order (Note [Library search order]).
std::vector<Candidate> library_candidates(const SearchInputs& inputs);

// The loaded library: its symbols, resolved once. Never unloaded (like the plugins).
struct Runtime {
  std::string path;    // what was dlopened
  std::string origin;  // which candidate it was
#define PINSTAGE_ACL_MEMBER_(name, ret, params) ret(*name) params = nullptr;
  PINSTAGE_ACL_FUNCTION_LIST(PINSTAGE_ACL_MEMBER_)
#undef PINSTAGE_ACL_MEMBER_
  aclGetRecentErrMsg_fn aclGetRecentErrMsg = nullptr;  // NULL on runtimes without it
  aclrtMemsetAsync_fn aclrtMemsetAsync = nullptr;      // likewise
};

// Loads the first candidate that works. Throws Error(no_device) with one line that says
// what was tried: "acl: no Ascend runtime (libascendcl.so) could be loaded; tried: ...".
std::unique_ptr<Runtime> load_runtime(const SearchInputs& inputs);

// "aclrtMalloc of 4096 bytes on device 0 failed: 207001 ACL_ERROR_RT_MEMORY_ALLOCATION
// (<aclGetRecentErrMsg() when not NULL>)". Call it on the failing thread, right away.
std::string call_error(const Runtime& rt, const std::string& call, aclError code);

// The ps_status a failed ACL call maps to; `fallback` for codes with no closer meaning.
ps_status status_from_acl(aclError code, ps_status fallback);

}  // namespace pinstage::acl
