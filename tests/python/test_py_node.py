"""The node level from Python (issue 24): pinstage.WorkerGroup over sim devices=N (each
worker on its device, its NUMA node, its share of the threads), a group bind whose inputs
are checked back on every device, a failing device named with every device left clean,
and load_to_devices, byte-exact on each device against numpy.array_split of the written
arrays, reading the checkpoint once."""
import numpy as np
import pytest
import torch

import pinstage
from tp_checkpoint import PLAN, arrays, expected_slice, write_checkpoint


def sim(devices, numa=None, **extra):
    config = {"devices": str(devices)}
    if numa:
        config["numa_nodes"] = numa
    return dict(config=config, device_capacity_bytes=64 << 20, **extra)


def test_a_group_has_a_worker_per_device_on_its_node_with_its_threads():
    with pinstage.WorkerGroup("sim", "all", threads=5, **sim(3, "0,0,0")) as group:
        assert len(group) == 3
        assert group.device_ids == [0, 1, 2]
        assert [w.device_id for w in group] == [0, 1, 2]
        assert group.team_threads == [2, 2, 1] == pinstage.split_threads(5, 3)
        assert all(w.host_numa_node == 0 for w in group)  # node 0 is on every host
    assert all(w.finalized for w in group.workers)
    with pinstage.WorkerGroup("sim", [2, 0], **sim(3)) as group:
        assert group.device_ids == [2, 0]


@pytest.mark.parametrize("devices, message", [
    ("", "empty"), ("0,0", "device 0 is given twice"), ("7", "device 7 does not exist"),
    ("0,x", "'x'"), ("0,,1", "''"),
])
def test_bad_device_lists_are_refused_by_name(devices, message):
    with pytest.raises(pinstage.InvalidArgumentError, match=message):
        pinstage.WorkerGroup("sim", devices, **sim(2))


def test_a_group_bind_checks_every_input_back_on_every_device():
    with pinstage.WorkerGroup("sim", "all", **sim(2)) as group:
        args = []
        for d, worker in enumerate(group):
            alloc = pinstage.PinnedTorchAllocator(worker)
            a = pinstage.TaskArgs()
            a.add("x", alloc.copy(torch.arange(1 << 16, dtype=torch.int32) * (d + 1)))
            a.add("y", alloc.zeros((1 << 14,), torch.float32), "out")
            args.append(a)
        report = group.bind(args, verify_upload=True)
        assert report.devices == [0, 1]
        assert [r.uploaded_bytes for r in report.reports] == [1 << 18, 1 << 18]
        assert report.uploaded_bytes == 2 << 18 and report.downloaded_bytes == 2 << 16
        assert report.upload_gbps > 0
        assert "device 1: 1 of 2 tensors uploaded" in str(report)
        with pytest.raises(pinstage.InvalidArgumentError, match="1 TaskArgs for 2 devices"):
            group.bind(args[:1])
        # Device 1's first upload fails: it is named, and no device keeps memory.
        group[1].inject_fault("copy_h2d", 1)
        with pytest.raises(pinstage.Error, match=r"^device 1: .*'x'"):
            group.bind(args)
        assert [w.stats().device_count for w in group] == [0, 0]
        del args, a
    assert all(w.finalized for w in group.workers)  # no view was left to refuse it


@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_load_to_devices_puts_exactly_each_slice_on_its_device(tmp_path, tp):
    path, plan = write_checkpoint(tmp_path)
    with pinstage.WorkerGroup("sim", "all", **sim(tp, ",".join("01"[r % 2] for r in range(tp)))) \
            as group:
        load = pinstage.load_to_devices(path, group, plan)
        total = sum(a.nbytes for a, _ in arrays().values())
        assert load.report["read_bytes"] == load.report["checkpoint_bytes"] == total
        assert load.report["devices"] == list(range(tp))
        for rank in range(tp):
            uploaded = 0
            for name in arrays():
                want = expected_slice(name, tp, rank)
                buf = load.ranks[rank][name]
                assert buf.worker is group[rank]
                assert load.slices[rank][name][1] == want.shape
                got = np.from_dlpack(buf).view(np.uint8).tobytes()  # sim: device memory is RAM
                assert got == want.tobytes(), f"{name} on rank {rank}"
                uploaded += want.nbytes
            assert load.report["uploads"][rank]["bytes"] == uploaded
            assert group[rank].stats().device_bytes == uploaded
        load.close()
        assert [w.stats().device_count for w in group] == [0] * tp


def test_load_to_devices_refuses_a_bad_split_before_any_memory(tmp_path):
    path, _ = write_checkpoint(tmp_path)
    bad = dict(PLAN, rules=[{"match": "*norm*", "split": 3}])
    with pinstage.WorkerGroup("sim", "all", **sim(2)) as group:
        with pytest.raises(pinstage.InvalidArgumentError, match="norm"):
            pinstage.load_to_devices(path, group, bad)
        assert group[0].host_memory_stats()["segment.current"] == 0
        with pytest.raises(TypeError, match="WorkerGroup"):
            pinstage.load_to_devices(path, group[0], PLAN)
