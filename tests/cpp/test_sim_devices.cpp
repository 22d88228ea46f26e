// sim's topology (ABI v6): devices=N with a numa_nodes= map, listed without a context,
// each device its own context (pool, copy engines), and the strict parsing of both keys;
// the Worker's device_info() and host_numa_node() over them.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "backends/sim/sim_config.h"
#include "pinstage/error.h"
#include "pinstage/pages.h"
#include "pinstage/worker.h"
#include "tensor_test_util.h"

namespace pinstage {
namespace {

using test::error_of;

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

WorkerOptions with_config(BackendConfig config, uint64_t capacity = 0) {
  WorkerOptions options;
  options.config = std::move(config);
  options.device_capacity_bytes = capacity;
  return options;
}

TEST(SimDevices, ATwoSocketFourDeviceNodeIsListedWithoutAContext) {
  const auto devices =
      list_devices("sim", with_config({{"devices", "4"}, {"numa_nodes", "0,0,1,1"}}, 32 << 20));
  ASSERT_EQ(devices.size(), 4u);
  std::set<std::string> pci_ids;
  for (int id = 0; id < 4; ++id) {
    const DeviceInfo& d = devices[id];
    EXPECT_EQ(d.id, id);
    EXPECT_EQ(d.name, "sim device " + std::to_string(id));
    EXPECT_EQ(d.memory_bytes, 32u << 20);  // the worker's capacity, per device
    EXPECT_EQ(d.numa_node, id < 2 ? 0 : 1);
    EXPECT_TRUE(d.usable);
    EXPECT_EQ(d.reason, "");
    EXPECT_TRUE(d.pci_bus_id.starts_with("ffff:")) << d.pci_bus_id;  // no real bus has it
    pci_ids.insert(d.pci_bus_id);
  }
  EXPECT_EQ(pci_ids.size(), 4u);
  // The default: one device, its node unknown.
  const auto one = list_devices("sim");
  ASSERT_EQ(one.size(), 1u);
  EXPECT_EQ(one[0].numa_node, -1);
  EXPECT_EQ(one[0].pci_bus_id, "ffff:00:00.0");
}

// Without a capacity of its own, a device gets its share of the default: the devices
// share the host's memory. (PINSTAGE_SIM_DEVICE_CAPACITY, when set, is per device.)
TEST(SimDevices, TheDefaultCapacityIsSplitAcrossTheDevices) {
  const uint64_t one = list_devices("sim")[0].memory_bytes;
  const uint64_t each = list_devices("sim", with_config({{"devices", "4"}}))[0].memory_bytes;
  if (std::getenv("PINSTAGE_SIM_DEVICE_CAPACITY") != nullptr)
    EXPECT_EQ(each, one);
  else
    EXPECT_EQ(each, one / 4);
  Worker worker;
  worker.init("sim", 3, with_config({{"devices", "4"}}));
  EXPECT_EQ(worker.stats().device_capacity_bytes, each);
}

// Each device is a context of its own: its own pool (capacity, commitments) and engines.
TEST(SimDevices, EachDeviceHasItsOwnPoolAndCopies) {
  const WorkerOptions options = with_config({{"devices", "2"}}, 8 << 20);
  Worker a, b;
  a.init("sim", 0, options);
  b.init("sim", 1, options);
  DeviceBuffer full = a.alloc_device(8 << 20);  // device 0 is full ...
  EXPECT_EQ(error_of([&] { a.alloc_device(4096); }).code(), ErrorCode::out_of_memory);
  DeviceBuffer other = b.alloc_device(8 << 20);  // ... device 1 is not
  EXPECT_EQ(a.stats().device_committed_bytes, 8u << 20);
  EXPECT_EQ(b.stats().device_committed_bytes, 8u << 20);
  const std::vector<unsigned char> src = test::pattern(1 << 20, 3);
  std::vector<unsigned char> back(src.size());
  b.copy_to_device(other, 0, src.data(), src.size());
  b.copy_to_host(back.data(), other, 0, back.size());
  EXPECT_EQ(back, src);
  EXPECT_EQ(error_of([&] { a.copy_to_device(other, 0, src.data(), 16); }).code(),
            ErrorCode::invalid_argument);  // device 1's buffer is not device 0's
}

TEST(SimDevices, ADeviceOutsideTheCountIsRefusedNamingTheCount) {
  Worker worker;
  Error e = error_of([&] { worker.init("sim", 2, with_config({{"devices", "2"}})); });
  EXPECT_EQ(e.code(), ErrorCode::no_device);
  EXPECT_TRUE(contains(e.what(), "no device 2: this sim has 2 device(s), ids 0..1")) << e.what();
  EXPECT_FALSE(worker.initialized());
  e = error_of([&] { worker.init("sim", 1); });  // the default is one device
  EXPECT_TRUE(contains(e.what(), "this sim has 1 device(s)")) << e.what();
}

TEST(SimDevices, BadTopologyOptionsAreRefusedNamingTheKey) {
  const std::pair<BackendConfig, std::string> cases[] = {
      {{{"devices", "0"}}, "devices='0' is not valid"},
      {{{"devices", "65"}}, "devices='65' is not valid"},
      {{{"devices", "2x"}}, "devices='2x' is not valid"},
      {{{"numa_nodes", ""}}, "numa_nodes='' is not valid"},
      {{{"numa_nodes", "0,"}}, "numa_nodes='0,' is not valid"},
      {{{"numa_nodes", "0,,1"}, {"devices", "3"}}, "numa_nodes='0,,1' is not valid"},
      {{{"numa_nodes", "-1"}}, "numa_nodes='-1' is not valid"},
      {{{"numa_nodes", "1024"}}, "numa_nodes='1024' is not valid"},
      {{{"numa_nodes", "0, 1"}, {"devices", "2"}}, "numa_nodes=' 1' is not valid"},
      {{{"numa_nodes", "0,1"}}, "numa_nodes names 2 node(s) but devices=1"},
      {{{"devices", "4"}, {"numa_nodes", "0,0,1"}}, "numa_nodes names 3 node(s) but devices=4"},
  };
  for (const auto& [options, message] : cases) {
    const auto& config = options;  // clang 14 captures no structured binding
    SCOPED_TRACE(message);
    Worker worker;
    Error e = error_of([&] { worker.init("sim", 0, with_config(config)); });
    EXPECT_EQ(e.code(), ErrorCode::invalid_argument);
    EXPECT_TRUE(contains(e.what(), message)) << e.what();
    EXPECT_FALSE(worker.initialized());
    e = error_of([&] { list_devices("sim", with_config(config)); });  // the same parse
    EXPECT_EQ(e.code(), ErrorCode::invalid_argument);
    EXPECT_TRUE(contains(e.what(), message)) << e.what();
  }
  const ps_config_entry good[] = {{"numa_nodes", "3,0"}, {"devices", "2"}};  // any order
  const sim::SimConfig c = sim::parse_config(good);
  EXPECT_EQ(c.devices, 2);
  EXPECT_EQ(c.numa_node(0), 3);
  EXPECT_EQ(c.numa_node(1), 0);
  EXPECT_EQ(c.numa_node(2), -1);
}

TEST(SimDevices, TheWorkersDeviceIsTheListedOne) {
  const WorkerOptions options = with_config({{"devices", "3"}, {"numa_nodes", "0,1,1"}});
  const auto listed = list_devices("sim", options);
  Worker worker;
  worker.init("sim", 2, options);
  const DeviceInfo mine = worker.device_info();
  EXPECT_EQ(mine.id, 2);
  EXPECT_EQ(mine.name, listed[2].name);
  EXPECT_EQ(mine.pci_bus_id, listed[2].pci_bus_id);
  EXPECT_EQ(mine.numa_node, 1);
  EXPECT_EQ(mine.memory_bytes, worker.stats().device_capacity_bytes);
  worker.finalize();
  EXPECT_EQ(error_of([&] { worker.device_info(); }).code(), ErrorCode::finalized);
}

// host_numa_node: a node the host has is used; one it lacks is warned about and nothing
// is placed (a map written for a bigger machine still builds); a negative one is refused.
TEST(SimDevices, TheHostNumaNodeInForceIsReported) {
  Worker plain;
  plain.init("sim");
  EXPECT_EQ(plain.host_numa_node(), -1);
  if (!numa_node_cpus(0).empty()) {
    WorkerOptions options;
    options.host_numa_node = 0;
    Worker placed;
    placed.init("sim", 0, options);
    EXPECT_EQ(placed.host_numa_node(), 0);
  }
  WorkerOptions absent;
  absent.host_numa_node = 1000;  // no host has it
  Worker elsewhere, again;
  testing::internal::CaptureStderr();
  elsewhere.init("sim", 0, absent);
  again.init("sim", 0, absent);
  const std::string warned = testing::internal::GetCapturedStderr();
  EXPECT_TRUE(contains(warned, "this host has no NUMA node 1000")) << warned;
  EXPECT_EQ(warned.find("NUMA node 1000"), warned.rfind("NUMA node 1000")) << "warned twice";
  EXPECT_EQ(elsewhere.host_numa_node(), -1);
  EXPECT_EQ(again.host_numa_node(), -1);
  PinnedHostBuffer works = elsewhere.alloc_pinned_host(1 << 20);
  EXPECT_TRUE(works);
  WorkerOptions negative;
  negative.host_numa_node = -2;
  Worker refused;
  const Error e = error_of([&] { refused.init("sim", 0, negative); });
  EXPECT_EQ(e.code(), ErrorCode::invalid_argument);
  EXPECT_TRUE(contains(e.what(), "host_numa_node must be >= 0")) << e.what();
  EXPECT_FALSE(refused.initialized());
}

}  // namespace
}  // namespace pinstage
