"""load_tp: a checkpoint loaded once for N tensor-parallel ranks into a Worker's pinned memory.

    plan = pinstage.TpPlan().split("*.q_proj.weight", 0).split("*.o_proj.weight", 1)
    tp = pinstage.load_tp("model/", 4, plan, worker=w)
    tp.ranks[2]["model.layers.0.q_proj.weight"]   # rank 2's rows, a torch tensor
    tp.report["read_bytes"] == tp.report["checkpoint_bytes"]   # every byte read once

The C++ load_tp_to_host does the work (docs/loading.md, "Tensor-parallel loading"); each
slice's storage is a PinnedHostBuffer of the worker, viewed zero-copy, with load_file's
lifetime rules. A replicated tensor is one buffer every rank's view shares.
"""
import json
import os
from collections.abc import Mapping

from . import _pinstage
from ._pinstage import TpPlan
from .checkpoint import (_check_worker, _element_type, _framework, _int, _open_checkpoint,
                         _options, _progress, _view)


def _plan(plan, who):
    """A TpPlan from None (every tensor replicated), a TpPlan, a mapping (the JSON form as
    a dict) or a path to a plan file."""
    if plan is None:
        return TpPlan()
    if isinstance(plan, TpPlan):
        return plan
    if isinstance(plan, Mapping):
        return TpPlan.parse(json.dumps(plan), f"{who}(): plan")
    if isinstance(plan, (str, os.PathLike)):
        return TpPlan.read_file(plan)
    raise TypeError(f"{who}(): plan must be a TpPlan, a dict (the JSON form), a path or None, "
                    f"not {type(plan).__name__}")


class TpLoad:
    """What load_tp loaded: `ranks[r]` is {name: tensor} of rank r's slices (checkpoint
    order), `slices[r]` their descriptions ({name, dtype, shape, dim, begin, bytes, rule,
    staged, shared}), `report` the load's figures (read_bytes, checkpoint_bytes, host_bytes,
    scatter_bytes, per-rank figures under "ranks", the reads under "load") and `tp`."""

    __slots__ = ("tp", "ranks", "slices", "report")

    def __init__(self, tp, ranks, slices, report):
        self.tp = tp
        self.ranks = ranks
        self.slices = slices
        self.report = report

    def __repr__(self):
        return (f"<pinstage.TpLoad tp={self.tp}: {len(self.slices[0]) if self.slices else 0} "
                f"tensors per rank, {self.report['read_bytes']} bytes read>")


def load_tp(path, tp, plan=None, *, worker, framework="pt", verify=False, threads=0,
            chunk_bytes=8 << 20, direct=False, progress=None):
    """Loads the checkpoint at `path` for `tp` ranks by `plan` into `worker`'s pinned
    memory, reading every byte of it once; returns a TpLoad. A split that cannot be made
    (a dim the tensor lacks, a dim smaller than tp, a tp unlike the plan's) is
    InvalidArgumentError naming the tensor, before any memory is taken; a failed or
    stopped load leaves nothing allocated."""
    _check_worker(worker, "load_tp")
    kind = _framework(framework, "load_tp()")
    tp = _int(tp, "load_tp", "tp", 31)
    options = _options("load_tp", threads, chunk_bytes, verify, direct)
    progress = _progress(progress, "load_tp")
    plan = _plan(plan, "load_tp")
    checkpoint = _open_checkpoint(path, "load_tp", options["verify"])
    for name in checkpoint.keys():
        _element_type(checkpoint.info(name), name, kind)  # before any memory is taken
    buffers, rank_slices, report = _pinstage._load_tp(checkpoint, plan, tp, worker,
                                                      progress=progress, **options)
    ranks = []
    for slices in rank_slices:
        views = {}
        for s in slices:
            s["shared"] = s["dim"] < 0
            info = {"nbytes": s["bytes"], "dtype": s["dtype"], "shape": s["shape"]}
            views[s["name"]] = _view(buffers[s.pop("buffer")], info, s["name"], kind)
        ranks.append(views)
    return TpLoad(tp, ranks, rank_slices, report)
