"""One torchrun rank of test_map_ranks.py: opens the checkpoint in map mode and takes its
tensor-parallel part of every tensor with get_slice (the dim tp_checkpoint splits it by);
rank 0 writes every rank's findings to OUT as JSON.

    map_slices_rank.py CHECKPOINT OUT"""
import json
import os
import sys

import numpy as np
import torch.distributed as dist

import pinstage


def mapping_of(address):
    """(path, perms) of the mapping of this process that holds `address`."""
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split()
            lo, hi = (int(x, 16) for x in fields[0].split("-"))
            if lo <= address < hi:
                return (fields[5] if len(fields) > 5 else ""), fields[1]
    return "", ""


def main(checkpoint, out):
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    worker = pinstage.Worker()
    mine = {}
    with pinstage.safe_open(checkpoint, framework="numpy", worker=worker, mode="map") as f:
        for name in f.keys():
            sl = f.get_slice(name)
            shape = sl.get_shape()
            dim = (len(shape) - 1) if name.endswith("cube") else (1 if "o_proj" in name else 0)
            index = ...
            if "norm" not in name:  # replicated: the whole tensor
                begin, count = pinstage.tp_part(shape[dim], world, rank)
                index = (slice(None),) * dim + (slice(begin, begin + count),)
            part = sl[index]
            path, perms = mapping_of(part.__array_interface__["data"][0])
            mine[name] = {"bytes": np.ascontiguousarray(part).tobytes().hex(),
                          "writeable": bool(part.flags.writeable),
                          "mapping": path, "perms": perms,
                          "file": os.path.join(checkpoint, f.info(name)["file"])}
        mine["read_bytes"] = f.read_bytes
    everyone = [None] * world
    dist.all_gather_object(everyone, mine)
    if rank == 0:
        with open(out, "w") as o:
            json.dump(everyone, o)
    del part, sl, mine
    dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:3])
