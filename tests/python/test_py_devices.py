"""pinstage.devices() and a Worker's device and NUMA placement from Python (ABI v6)."""
import pytest

import pinstage

FOUR = {"devices": 4, "numa_nodes": "0,0,1,1"}


def test_devices_lists_a_sim_node_without_a_context():
    devs = pinstage.devices("sim", config=FOUR, device_capacity_bytes=16 << 20)
    assert [d.id for d in devs] == [0, 1, 2, 3]
    assert [d.numa_node for d in devs] == [0, 0, 1, 1]
    assert [d.name for d in devs] == [f"sim device {i}" for i in range(4)]
    assert all(d.memory_bytes == 16 << 20 and d.usable and d.reason == "" for d in devs)
    assert len({d.pci_bus_id for d in devs}) == 4
    assert "numa_node=1" in repr(devs[3])
    assert [d.numa_node for d in pinstage.devices()] == [-1]  # the default: one, unknown


def test_a_worker_reports_its_device_and_placement():
    with pinstage.Worker(device_id=3, config=FOUR) as w:
        info = w.device_info()
        assert (info.id, info.numa_node, info.name) == (3, 1, "sim device 3")
        assert w.host_numa_node == -1  # nothing asked
    with pinstage.Worker(host_numa_node=None) as w:
        assert w.host_numa_node == -1
    with pinstage.Worker(host_numa_node=1000) as w:  # no host has it: warned, not placed
        assert w.host_numa_node == -1
        assert w.alloc_pinned_host(4096).nbytes == 4096


def test_bad_topology_arguments_name_what_is_wrong():
    with pytest.raises(pinstage.InvalidArgumentError, match="numa_nodes names 2 node"):
        pinstage.devices(config={"devices": 3, "numa_nodes": "0,1"})
    with pytest.raises(pinstage.Error, match="no device 4: this sim has 4 device"):
        pinstage.Worker(device_id=4, config=FOUR)
    with pytest.raises(pinstage.InvalidArgumentError, match="host_numa_node must be >= 0"):
        pinstage.Worker(host_numa_node=-1)
    with pytest.raises(pinstage.InvalidArgumentError, match="host_numa_node must be an int"):
        pinstage.Worker(host_numa_node="0")
    with pytest.raises(TypeError, match="unexpected option 'numa'"):
        pinstage.devices(numa=0)
