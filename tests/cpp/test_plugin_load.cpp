// Plugin loading: every failure names the backend, the path and the reason.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <new>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "pinstage/backend/slot.h"
#include "pinstage/worker.h"
#include "temp_dir_test_util.h"

namespace pinstage {
namespace {

std::string init_error(const std::string& backend, const std::string& path) {
  Worker worker;
  WorkerOptions options;
  options.plugin_path = path;
  try {
    worker.init(backend, 0, options);
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::plugin_load) << e.what();
    EXPECT_FALSE(worker.initialized());
    return e.what();
  }
  ADD_FAILURE() << "init succeeded with " << path;
  return {};
}

const std::string kDir = PINSTAGE_TEST_PLUGIN_DIR;

void expect_has(const std::string& text, const std::string& part) {
  EXPECT_NE(text.find(part), std::string::npos) << "'" << part << "' not in: " << text;
}

TEST(PluginLoad, MissingFile) {
  const std::string msg = init_error("ghost", kDir + "/libghost.so");
  EXPECT_NE(msg.find("'ghost'"), std::string::npos) << msg;
  EXPECT_NE(msg.find(kDir + "/libghost.so"), std::string::npos) << msg;
  EXPECT_NE(msg.find("no such file"), std::string::npos) << msg;
}

TEST(PluginLoad, AFifoIsRefusedWithoutBlocking) {
  const std::string fifo =
      ::testing::TempDir() + "plugin-fifo-" + std::to_string(::getpid()) + ".so";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const std::string msg = init_error("ghost", fifo);
  ::unlink(fifo.c_str());
  EXPECT_NE(msg.find("it is a FIFO, not a regular file"), std::string::npos) << msg;
}

TEST(PluginLoad, UnknownBackendNameLooksNextToTheLibrary) {
  Worker worker;
  try {
    worker.init("nosuch");
    FAIL() << "init succeeded";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::plugin_load);
    EXPECT_NE(std::string(e.what()).find(default_backend_path("nosuch")), std::string::npos)
        << e.what();
  }
}

TEST(PluginLoad, MissingEntrySymbol) {
  const std::string msg = init_error("no_entry", kDir + "/libno_entry.so");
  EXPECT_NE(msg.find("no entry symbol 'pinstage_platform_entry'"), std::string::npos) << msg;
}

TEST(PluginLoad, WrongApiVersion) {
  const std::string msg = init_error("bad_version", kDir + "/libbad_version.so");
  EXPECT_NE(msg.find("API version " + std::to_string(PINSTAGE_PLATFORM_API_VERSION + 98)),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("rebuild the plugin"), std::string::npos) << msg;
}

TEST(PluginLoad, MissingRequiredSlot) {
  const std::string msg = init_error("missing_slot", kDir + "/libmissing_slot.so");
  EXPECT_NE(msg.find("required slot 'create_context' is NULL"), std::string::npos) << msg;
}

// The ABI v5 device-side slots are optional, each on its own: a backend without them
// loads, and asking for either is Error(unsupported) naming the backend and the slot, with
// no fallback through the host (the buffer keeps its bytes).
TEST(PluginLoad, ABackendWithoutDeviceSideSlotsSaysUnsupported) {
  Worker worker;
  WorkerOptions options;
  options.plugin_path = kDir + "/libno_device_ops.so";
  worker.init("no_device_ops", 0, options);
  EXPECT_EQ(worker.backend().name, "no_device_ops");
  DeviceBuffer a = worker.alloc_device(64), b = worker.alloc_device(64);
  const std::vector<unsigned char> want(64, 0x3c);
  worker.copy_to_device(a, 0, want.data(), 64);
  Stream stream = worker.create_stream();
  const auto unsupported = [](auto&& call, const std::string& says) {
    try {
      call();
      ADD_FAILURE() << "no error; wanted: " << says;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::unsupported) << e.what();
      EXPECT_NE(std::string(e.what()).find("backend 'no_device_ops' has no " + says),
                std::string::npos)
          << e.what();
    }
  };
  const std::string copy = "device-to-device copy (its copy_d2d_async slot is NULL)";
  const std::string fill = "device fill (its memset_async slot is NULL)";
  unsupported([&] { worker.copy_on_device(b, 0, a, 0, 64); }, copy);
  unsupported([&] { worker.copy_on_device_async(b, 0, a, 0, 64, stream); }, copy);
  unsupported([&] { worker.fill_device(a, 0, 0, 64); }, fill);
  unsupported([&] { worker.fill_device_async(a, 0, 0, 64, stream); }, fill);
  std::vector<unsigned char> back(64);
  worker.copy_to_host(back.data(), a, 0, 64);
  EXPECT_EQ(back, want);
}

// Without the ABI v6 topology slots a backend has one device, id 0, of unknown
// properties; half of the pair is a broken table, refused by name.
TEST(PluginLoad, ABackendWithoutTopologySlotsHasOneUnknownDevice) {
  WorkerOptions options;
  options.plugin_path = kDir + "/libno_device_ops.so";
  const auto devices = list_devices("no_device_ops", options);
  ASSERT_EQ(devices.size(), 1u);
  EXPECT_EQ(devices[0].id, 0);
  EXPECT_EQ(devices[0].name, "no_device_ops device 0");
  EXPECT_EQ(devices[0].numa_node, -1);
  EXPECT_EQ(devices[0].memory_bytes, 0u);
  EXPECT_EQ(devices[0].pci_bus_id, "");
  EXPECT_TRUE(devices[0].usable);
  Worker worker;
  worker.init("no_device_ops", 0, options);
  EXPECT_EQ(worker.device_info().name, "no_device_ops device 0");
  const std::string msg = init_error("half_topology", kDir + "/libhalf_topology.so");
  EXPECT_NE(msg.find("device_count and device_props must be both present or both NULL"),
            std::string::npos)
      << msg;
}

TEST(PluginLoad, NotASharedObject) {
  // A text file made here (a source path from __FILE__ is relative under ccache's basedir).
  char path[] = "/tmp/pinstage-not-a-plugin-XXXXXX";
  const int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  const char text[] = "not a shared object\n";
  ASSERT_EQ(write(fd, text, sizeof text - 1), static_cast<ssize_t>(sizeof text - 1));
  close(fd);
  const std::string msg = init_error("text", path);
  unlink(path);
  EXPECT_NE(msg.find("dlopen failed"), std::string::npos) << msg;
}

TEST(PluginLoad, SimIsFoundAndReportsItsVersion) {
  Worker worker;
  worker.init("sim");
  EXPECT_EQ(worker.backend().name, "sim");
  EXPECT_EQ(worker.backend().api_version, PINSTAGE_PLATFORM_API_VERSION);
  EXPECT_EQ(worker.backend().path, default_backend_path("sim"));
  const auto found = discover_backends();
  EXPECT_NE(std::find(found.begin(), found.end(), default_backend_path("sim")), found.end());
}

// A backend's description (Note [Backend descriptions]) is read strictly: every malformed
// file is Error(io) naming the file, the line where there is one, and what is wrong.
class BackendDescriptionFile : public test::TempDirTest {
 protected:
  BackendDescriptionFile() : TempDirTest("description") {}
  // describe_plugin's error for a plugin `name` whose description is `text`.
  std::string error_for(const std::string& text, const std::string& name = "demo") {
    const std::string plugin = path("libpinstage_backend_" + name + ".so");
    std::ofstream(path("libpinstage_backend_" + name + ".backend")) << text;
    try {
      describe_plugin(plugin);
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::io) << e.what();
      EXPECT_NE(std::string(e.what()).find(path("libpinstage_backend_" + name + ".backend")),
                std::string::npos)
          << e.what();
      return e.what();
    }
    ADD_FAILURE() << "accepted: " << text;
    return {};
  }
};

TEST_F(BackendDescriptionFile, AWellFormedOneIsReadAsWritten) {
  std::ofstream(path("libpinstage_backend_ok.backend"))
      << "# comment\n\nname=ok\ndlpack_device_type=12\ntorch_device=\n";
  const BackendDescription& d = describe_plugin(path("libpinstage_backend_ok.so"));
  EXPECT_EQ(d.name, "ok");
  EXPECT_EQ(d.dlpack_device_type, 12);
  EXPECT_EQ(d.torch_device, "");
  EXPECT_EQ(d.plugin_path, path("libpinstage_backend_ok.so"));
  EXPECT_FALSE(d.test_only) << "no test_only line: a user's backend";
  std::ofstream(path("libpinstage_backend_t.backend"))
      << "name=t\ndlpack_device_type=1\ntorch_device=cpu\ntest_only=1\n";
  EXPECT_TRUE(describe_plugin(path("libpinstage_backend_t.so")).test_only);
}

TEST_F(BackendDescriptionFile, EveryMalformedOneIsRefusedSayingWhy) {
  const std::string good_rest = "dlpack_device_type=2\ntorch_device=cuda\n";
  expect_has(error_for("name=demo\nname=demo\n" + good_rest), (":2: key 'name' is given twice"));
  expect_has(error_for("name=demo\ncolour=red\n" + good_rest),
             (":2: unknown key 'colour' (keys: name, dlpack_device_type"));
  expect_has(error_for("name demo\n" + good_rest), (":1: 'name demo' is not KEY=VALUE"));
  expect_has(error_for("name=demo\ntorch_device=cuda\n"), ("it has no dlpack_device_type line"));
  expect_has(error_for("name=demo\n" + good_rest + "test_only=yes\n"),
             ("test_only 'yes' is neither 0 nor 1"));
  expect_has(error_for("name=demo\ndlpack_device_type=two\ntorch_device=cuda\n"),
             ("dlpack_device_type"));
  expect_has(error_for("name=demo\ndlpack_device_type=0\ntorch_device=cuda\n"),
             ("DLPack's DLDeviceType"));
  expect_has(error_for("name=demo\ndlpack_device_type=2\ntorch_device=CUDA:0\n"),
             ("torch_device 'CUDA:0' is not a torch device type"));
  expect_has(error_for("name=other\n" + good_rest),
             ("it names backend 'other', but its plugin is "
              "libpinstage_backend_demo.so (backend 'demo')"));
  expect_has(error_for("name=Bad-Name\n" + good_rest, "Bad-Name"),
             ("name 'Bad-Name' is not a backend name"));
  // Every message says where the file comes from and what to do.
  expect_has(error_for("name=demo\n"), ("pinstage_add_backend"));
}

TEST_F(BackendDescriptionFile, APluginWithoutOneIsNotFound) {
  try {
    describe_plugin(path("libpinstage_backend_none.so"));
    ADD_FAILURE() << "a missing description was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::not_found);
    expect_has(e.what(), ("has no backend description"));
  }
}

// The plugins' last_error text: no destructor (a thread_local one raced glibc's TLS free at
// a detached thread's exit under TSan), cut with a marker, each failure's meaning kept.
static_assert(std::is_trivially_destructible_v<backend::LastError>);

TEST(SlotLastError, LongTextIsCutWithAMarker) {
  backend::LastError e;
  e.set("sim: ", std::string(3 * backend::LastError::kCapacity, 'x'));
  const std::string cut = e.c_str();
  EXPECT_EQ(cut.size(), backend::LastError::kCapacity - 1);
  EXPECT_EQ(cut.substr(0, 6), "sim: x");
  EXPECT_EQ(cut.substr(cut.size() - 4), "x...");
  e.set("a", "b", "c");
  EXPECT_STREQ(e.c_str(), "abc");
  e.set(std::string(backend::LastError::kCapacity - 1, 'y'));  // fits exactly: no marker
  EXPECT_EQ(std::string(e.c_str()), std::string(backend::LastError::kCapacity - 1, 'y'));
  e.clear();
  EXPECT_STREQ(e.c_str(), "");
}

TEST(SlotLastError, GuardedKeepsEachFailuresStatusAndText) {
  backend::LastError e;
  EXPECT_EQ(backend::guarded(e, "sim", [] { backend::fail(PS_ERR_INVALID_ARGUMENT, "bad size"); }),
            PS_ERR_INVALID_ARGUMENT);
  EXPECT_STREQ(e.c_str(), "bad size");
  EXPECT_EQ(backend::guarded(e, "sim", [] { throw std::bad_alloc(); }), PS_ERR_OUT_OF_MEMORY);
  EXPECT_STREQ(e.c_str(), "sim: host memory exhausted");
  EXPECT_EQ(backend::guarded(e, "sim", [] { throw std::runtime_error("boom"); }), PS_ERR_INTERNAL);
  EXPECT_STREQ(e.c_str(), "sim: internal error: boom");
  EXPECT_EQ(backend::guarded(e, "sim", [] { throw Error(ErrorCode::invalid_argument, "no"); }),
            PS_ERR_INVALID_ARGUMENT);
  EXPECT_STREQ(e.c_str(), "sim: no");
  EXPECT_EQ(backend::guarded(e, "sim", [] {}), PS_OK);
  EXPECT_STREQ(e.c_str(), "");  // cleared by a slot that succeeds
}

}  // namespace
}  // namespace pinstage
