"""One rank of test_cache50.py's torchrun job: pinstage.distributed.fill_cache (one rank
per node fills the restart cache's entry, the others wait and then look it up), then a
map-mode load from the entry, whose bytes are compared with the checkpoint's own bytes
read here by hand (the reference: the safetensors format, no pinstage), then
load_sharded(cache="use"), then a filler made to fail named on every rank. Writes
OUT/rank<R>.json. PINSTAGE_CACHE_DIR names the cache (set by the test).

usage: torchrun ... cache_rank.py CHECKPOINT PLAN OUT"""
import json
import pathlib
import struct
import sys
import time

import torch.distributed as dist

import pinstage  # noqa: E402
from pinstage import distributed as pd  # noqa: E402

checkpoint, plan, out = pathlib.Path(sys.argv[1]), sys.argv[2], pathlib.Path(sys.argv[3])


def reference():
    """{name: bytes} of every tensor of every .safetensors file of the checkpoint."""
    refs = {}
    for f in sorted(checkpoint.glob("*.safetensors")):
        raw = f.read_bytes()
        (n,) = struct.unpack("<Q", raw[:8])
        header = json.loads(raw[8:8 + n])
        header.pop("__metadata__", None)
        for name, e in header.items():
            b, end = e["data_offsets"]
            refs[name] = raw[8 + n + b:8 + n + end]
    return refs


dist.init_process_group("gloo")
ctx = pd.setup(backend="sim")
record = {"rank": ctx.rank}
# When the fill ended and each lookup began, on the machine-wide monotonic clock: the test
# checks that the non-filler looked up only after the filler's put returned (the barrier).
events = []
real_put, real_lookup = pinstage.cache.put, pinstage.cache.lookup


def put(*args, **kwargs):
    got = real_put(*args, **kwargs)
    events.append(("put_end", time.monotonic()))
    return got


def lookup(*args, **kwargs):
    events.append(("lookup_start", time.monotonic()))
    return real_lookup(*args, **kwargs)


pinstage.cache.put, pinstage.cache.lookup = put, lookup
found = pd.fill_cache(checkpoint)
pinstage.cache.put, pinstage.cache.lookup = real_put, real_lookup
record["events"] = events
record["fill"] = {k: found[k] for k in ("state", "filler", "entry_path")}
tensors, report = pinstage.load_file(checkpoint, worker=ctx.worker, mode="map", cache="use",
                                     report=True)
refs = reference()
record["load"] = {"cache": report["cache"], "cache_entry": report["cache_entry"],
                  "names": sorted(tensors) == sorted(refs),
                  "equal": all(tensors[n].numpy().tobytes() == refs[n] for n in refs)}
del tensors
sharded = pd.load_sharded(checkpoint, plan, cache="use", stage=False)
record["sharded_cache"] = sharded.report["cache"]
sharded.tensors = {}
sharded.close()
# A filler that fails: every rank hears of it.
if found["filler"]:
    pinstage.cache.rm(checkpoint)
dist.barrier()
pd._fault_phase = "cache fill" if found["filler"] else None
try:
    pd.fill_cache(checkpoint)
    record["failure"] = None
except pd.RankFailed as e:
    record["failure"] = {"phase": e.phase, "ranks": sorted(e.failures)}
pd._fault_phase = None
dist.barrier()
record["after_failure"] = pinstage.cache.lookup(checkpoint)["state"]
again = pd.fill_cache(checkpoint)  # refilled once, by the same rank
record["refill"] = {k: again[k] for k in ("state", "filler")}
dist.barrier()
(out / f"rank{ctx.rank}.json").write_text(json.dumps(record))
ctx.close()
dist.destroy_process_group()
