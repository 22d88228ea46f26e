// The acl backend's library search (Note [Library search order] in acl_runtime.h) and its
// error text, against copies of the libascendcl double at known places. No plugin here:
// the loader is called directly with the inputs the environment would give.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>

#include <string>

#include "backends/acl/acl_runtime.h"
#include "fake_acl_client.h"
#include "pinstage/error.h"
#include "pinstage/settings.h"

namespace pinstage::acl {
namespace {

const std::string kHome = PINSTAGE_FAKE_ACL_DIR;             // .../fake_acl
const std::string kToolkit = PINSTAGE_FAKE_ACL_TOOLKIT_DIR;  // .../fake_acl_toolkit

bool has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

std::string load_error(const SearchInputs& in) {
  try {
    load_runtime(in);
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::no_device);
    return e.what();
  }
  ADD_FAILURE() << "load_runtime succeeded";
  return {};
}

TEST(AclSearch, CandidatesFollowTheDocumentedOrder) {
  const auto c = library_candidates({std::nullopt, "/h", "/t"});
  ASSERT_EQ(c.size(), 3u);
  EXPECT_EQ(c[0].origin, "$ASCEND_HOME_PATH/lib64");
  EXPECT_EQ(c[0].path, "/h/lib64/libascendcl.so");
  EXPECT_EQ(c[1].origin, "$ASCEND_TOOLKIT_HOME/lib64");
  EXPECT_EQ(c[1].path, "/t/lib64/libascendcl.so");
  EXPECT_EQ(c[2].path, "libascendcl.so");  // the default search path last
  // PINSTAGE_ACL_LIBRARY, when set, is the only candidate.
  const auto only = library_candidates({"/x/libascendcl.so", "/h", "/t"});
  ASSERT_EQ(only.size(), 1u);
  EXPECT_EQ(only[0].origin, "PINSTAGE_ACL_LIBRARY");
}

TEST(AclSearch, AscendHomeIsTriedBeforeTheToolkitHome) {
  auto rt = load_runtime({std::nullopt, kHome, kToolkit});
  EXPECT_EQ(rt->path, kHome + "/lib64/libascendcl.so");
  EXPECT_EQ(rt->origin, "$ASCEND_HOME_PATH/lib64");
  ASSERT_NE(rt->aclInit, nullptr);
  ASSERT_NE(rt->aclGetRecentErrMsg, nullptr);
  // A home without the library falls through to the toolkit's.
  rt = load_runtime({std::nullopt, "/nonexistent-ascend-home", kToolkit});
  EXPECT_EQ(rt->path, kToolkit + "/lib64/libascendcl.so");
  EXPECT_EQ(rt->origin, "$ASCEND_TOOLKIT_HOME/lib64");
}

TEST(AclSearch, AnExplicitLibraryIsTheOnlyOneTried) {
  auto rt = load_runtime({kToolkit + "/lib64/libascendcl.so", kHome, std::nullopt});
  EXPECT_EQ(rt->origin, "PINSTAGE_ACL_LIBRARY");
  EXPECT_EQ(rt->path, kToolkit + "/lib64/libascendcl.so");
  // A bad explicit path fails even though ASCEND_HOME_PATH has a good one.
  const std::string text = load_error({"/nonexistent/libascendcl.so", kHome, std::nullopt});
  EXPECT_TRUE(has(text, "tried: PINSTAGE_ACL_LIBRARY /nonexistent/libascendcl.so (no such file)"))
      << text;
  EXPECT_FALSE(has(text, "ASCEND_HOME_PATH")) << text;
}

// dlopen of a FIFO blocks until a writer comes: the type is checked first, without blocking.
TEST(AclSearch, AFifoNamedAsTheLibraryIsRefusedWithoutBlocking) {
  const std::string fifo = ::testing::TempDir() + "acl-fifo-" + std::to_string(::getpid()) + ".so";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const std::string text = load_error({fifo, kHome, std::nullopt});
  ::unlink(fifo.c_str());
  EXPECT_TRUE(has(text, "PINSTAGE_ACL_LIBRARY " + fifo + " (it is a FIFO, not a regular file)"))
      << text;
}

TEST(AclSearch, NothingLoadableIsOneLineNamingEveryTry) {
  const std::string text = load_error({std::nullopt, "/no-home", "/no-toolkit"});
  EXPECT_EQ(text.find('\n'), std::string::npos) << text;
  EXPECT_TRUE(has(text,
                  "no Ascend runtime (libascendcl.so) could be loaded; tried: "
                  "$ASCEND_HOME_PATH/lib64 /no-home/lib64/libascendcl.so (no such file); "
                  "$ASCEND_TOOLKIT_HOME/lib64 /no-toolkit/lib64/libascendcl.so (no such "
                  "file); the default library path libascendcl.so ("))
      << text;
  EXPECT_TRUE(has(text, "set PINSTAGE_ACL_LIBRARY")) << text;
  const std::string bare = load_error({});
  EXPECT_TRUE(has(bare, "ASCEND_HOME_PATH, ASCEND_TOOLKIT_HOME and PINSTAGE_ACL_LIBRARY are unset"))
      << bare;
}

TEST(AclSearch, ALibraryWithoutTheSymbolsIsRefusedByName) {
  // libpinstage is a real shared object with none of the ACL symbols.
  const std::string text = load_error({PINSTAGE_LIBRARY_PATH, std::nullopt, std::nullopt});
  EXPECT_TRUE(has(text, "(loaded but has no symbol aclInit (not an Ascend runtime?))")) << text;
}

TEST(AclSearch, TheEnvironmentIsReadThroughTheSettingsModule) {
  ::setenv("PINSTAGE_ACL_LIBRARY", "", 1);  // empty: a scripting mistake, refused by name
  try {
    search_inputs_from_environment();
    ADD_FAILURE() << "an empty PINSTAGE_ACL_LIBRARY was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::invalid_argument);
    EXPECT_TRUE(has(e.what(), "PINSTAGE_ACL_LIBRARY=''")) << e.what();
  }
  EXPECT_THROW(check_settings(), Error);
  ::setenv("PINSTAGE_ACL_LIBRARY", "/opt/x/libascendcl.so", 1);
  ::setenv("ASCEND_HOME_PATH", "", 1);  // empty ASCEND_* (set_env.sh style) counts as unset
  ::setenv("ASCEND_TOOLKIT_HOME", "/t", 1);
  const SearchInputs in = search_inputs_from_environment();
  EXPECT_EQ(in.acl_library, "/opt/x/libascendcl.so");
  EXPECT_EQ(in.ascend_home, std::nullopt);
  EXPECT_EQ(in.toolkit_home, "/t");
  ::unsetenv("PINSTAGE_ACL_LIBRARY");
  ::unsetenv("ASCEND_HOME_PATH");
  ::unsetenv("ASCEND_TOOLKIT_HOME");
}

TEST(AclErrors, EveryKnownCodeHasItsName) {
  EXPECT_STREQ(acl_error_name(107002), "ACL_ERROR_RT_CONTEXT_NULL");
  EXPECT_STREQ(acl_error_name(207000), "ACL_ERROR_RT_FEATURE_NOT_SUPPORT");
  EXPECT_STREQ(acl_error_name(100002), "ACL_ERROR_REPEAT_INITIALIZE");
  EXPECT_STREQ(acl_error_name(507899), "ACL_ERROR_RT_DRV_INTERNAL_ERROR");
  EXPECT_STREQ(acl_error_name(12345), "unknown ACL error");
  EXPECT_EQ(status_from_acl(ACL_ERROR_RT_MEMORY_ALLOCATION, PS_ERR_BACKEND), PS_ERR_OUT_OF_MEMORY);
  EXPECT_EQ(status_from_acl(ACL_ERROR_RT_NO_DEVICE, PS_ERR_BACKEND), PS_ERR_NO_DEVICE);
  EXPECT_EQ(status_from_acl(ACL_ERROR_RT_FEATURE_NOT_SUPPORT, PS_ERR_BACKEND), PS_ERR_UNSUPPORTED);
  EXPECT_EQ(status_from_acl(ACL_ERROR_RT_CONTEXT_NULL, PS_ERR_COPY_FAILED), PS_ERR_COPY_FAILED);
}

TEST(AclErrors, TextNamesTheCallTheCodeAndTheRecentMessage) {
  auto rt = load_runtime({kHome + "/lib64/libascendcl.so", std::nullopt, std::nullopt});
  uint32_t count = 0;
  const aclError code = rt->aclrtGetDeviceCount(&count);  // before aclInit: refused
  ASSERT_EQ(code, ACL_ERROR_UNINITIALIZE);
  const std::string text = call_error(*rt, "aclrtGetDeviceCount", code);
  EXPECT_EQ(text,
            "aclrtGetDeviceCount failed: 100001 ACL_ERROR_UNINITIALIZE (fake ascendcl: "
            "aclrtGetDeviceCount: runtime call before aclInit or after aclFinalize)");
  // aclGetRecentErrMsg is now NULL (read once): no empty parentheses.
  EXPECT_EQ(call_error(*rt, "aclrtFree", ACL_ERROR_RT_MEMORY_FREE),
            "aclrtFree failed: 207002 ACL_ERROR_RT_MEMORY_FREE");
}

}  // namespace
}  // namespace pinstage::acl
