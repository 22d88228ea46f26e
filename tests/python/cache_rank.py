"""One rank of test_cache50.py's torchrun job: pinstage.distributed.fill_cache (one rank
per node fills the restart cache's entry, the others wait and then look it up), then a
map-mode load from the entry, whose bytes are compared with the checkpoint's own bytes
read here by hand (the reference: the safetensors format, no pinstage), then
load_sharded(cache="use"), then a filler made to fail named on every rank. Writes
OUT/rank<R>.json. PINSTAGE_CACHE_DIR names the cache (set by the test).

usage: torchrun ... cache_rank.py CHECKPOINT PLAN OUT"""
import fcntl
import json
import pathlib
import struct
import sys

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
# The one-filler proof, by latches (no clock): the filler, inside its fill (its first
# progress call), takes an flock on OUT/filling.lock, tells the other rank through the FIFO
# OUT/started (which that rank reads as its "cache fill" phase or its lookup begins), and
# blocks on the FIFO OUT/release until that rank starts waiting at the fill's barrier (its
# "cache fill" phase ran; it is about to gather). Only then does the
# fill go on, and the lock is released when put returns. The other rank checks the lock
# twice: held when it starts waiting (the filler was mid-fill), free when its lookup
# starts (the fill had ended). A rank that looks up without waiting releases the filler
# itself, after seeing the lock still held: the test then fails, every time.
events = []
real_put, real_lookup, real_run = pinstage.cache.put, pinstage.cache.lookup, pd._Phases.run
held = {}


def lock_free():
    """Whether the filler's exclusive lock is free now. A shared probe: two ranks probing at
    once (both look up right after the barrier) must not see each other's probe as held."""
    with open(out / "filling.lock", "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            return False


def release(why):
    if "released" not in held:
        held["released"] = why
        with open(out / "release", "w") as f:
            f.write("x")


def put(*args, **kwargs):
    def progress(done, total):
        if "lock" in held:
            return
        held["lock"] = open(out / "filling.lock", "a")
        fcntl.flock(held["lock"], fcntl.LOCK_EX)
        with open(out / "started", "w") as f:
            f.write("x")
        with open(out / "release") as f:
            f.read(1)
    try:
        return real_put(*args, progress=progress, **kwargs)
    finally:
        events.append(("put_end", "lock" in held))
        if "lock" in held:
            held.pop("lock").close()


def filler_inside():
    """Blocks the other rank until the filler is inside its fill, holding the lock."""
    if "inside" not in held:
        held["inside"] = True
        with open(out / "started") as f:
            f.read(1)


def lookup(*args, **kwargs):
    if ctx.local_rank != 0:
        filler_inside()
    events.append(("lookup_start", lock_free()))
    if ctx.local_rank != 0:
        release("lookup")
    return real_lookup(*args, **kwargs)


def run(self, phase, fn):
    if phase != "cache fill" or ctx.local_rank == 0:
        return real_run(self, phase, fn)

    def then_wait():
        filler_inside()
        value = fn()
        events.append(("waits", lock_free()))
        release("barrier")
        return value
    return real_run(self, phase, then_wait)


pinstage.cache.put, pinstage.cache.lookup, pd._Phases.run = put, lookup, run
found = pd.fill_cache(checkpoint)
pinstage.cache.put, pinstage.cache.lookup, pd._Phases.run = real_put, real_lookup, real_run
record["events"] = events
record["released"] = held.get("released")
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
