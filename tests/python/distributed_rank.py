"""One rank of test_distributed.py's torchrun jobs: loads its slices both ways, checks them
against numpy, gathers digests and reports, then makes rank FAIL_RANK fail a load and
records what every rank saw. Writes OUT/rank<R>.json.

usage: torchrun ... distributed_rank.py CHECKPOINT PLAN OUT FAIL_RANK"""
import json
import os
import pathlib
import sys

import numpy as np
import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(__file__))
import tp_checkpoint  # noqa: E402

import pinstage  # noqa: E402
from pinstage import distributed as pd  # noqa: E402

checkpoint, plan, out, fail_rank = sys.argv[1], sys.argv[2], pathlib.Path(sys.argv[3]), \
    int(sys.argv[4])
dist.init_process_group("gloo")
# A 2-socket node of 4 sim devices (this host has one NUMA node: node 1 is not placed).
ctx = pd.setup(backend="sim", config={"devices": "4", "numa_nodes": "0,0,1,1"})
record = {"rank": ctx.rank, "threads": ctx.threads, "threads_from": ctx.threads_from,
          "cpus": ctx.cpus, "pool_threads": pinstage._pinstage.default_thread_count(),
          "devices": ctx.devices, "device_id": ctx.worker.device_id,
          "device_numa_node": ctx.device_numa_node, "modes": {}}
for mode in pd.READ_MODES:
    load = pd.load_sharded(checkpoint, plan, read=mode)
    tp, tp_rank = load.report["tp"], load.report["tp_rank"]
    for name, t in load.tensors.items():
        want = tp_checkpoint.expected_slice(name, tp, tp_rank)
        assert tuple(t.shape) == want.shape, (name, tuple(t.shape), want.shape)
        assert np.array_equal(t.numpy(), want), f"{mode}: {name} differs from numpy"
        assert t.is_pinned() or pinstage.is_pinned(t), name
    alloc = pinstage.PinnedTorchAllocator(ctx.worker)
    for name, d in load.device.items():  # staged: the device holds the same bytes
        back = alloc.zeros(d.nbytes, dtype=torch.uint8)
        ctx.worker.copy_to_host_async(back, d).wait()
        assert back.numpy().tobytes() == load.tensors[name].numpy().tobytes(), name
    del back
    digests = [None] * dist.get_world_size()
    dist.all_gather_object(digests, (tp_rank, pd.slice_digests(load)))
    reports = pd.gather_reports(load)
    load.tensors = {}
    del t
    load.close()
    record["modes"][mode] = {"digests": digests, "reports": reports,
                             "pinned_after_close": ctx.worker.stats().pinned_bytes}
pd._fault_phase = "copy 0" if ctx.rank == fail_rank else None
try:
    pd.load_sharded(checkpoint, plan, read="once-per-node")
    record["failure"] = None
except pd.RankFailed as e:
    record["failure"] = {"message": str(e), "ranks": sorted(e.failures), "phase": e.phase}
    kept = e  # its traceback holds the load's frames: the memory must be freed already
stats = ctx.worker.stats()
record["after_failure"] = {"pinned_bytes": stats.pinned_bytes, "device_bytes": stats.device_bytes}
dist.barrier()
record["shm_after"] = sorted(n for n in os.listdir(pd.SHM_DIR) if n.startswith(pd.SHM_PREFIX))
(out / f"rank{ctx.rank}.json").write_text(json.dumps(record))
dist.destroy_process_group()
