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
from ._pinstage import InvalidArgumentError
from .checkpoint import (_check_worker, _device, _element_type, _framework, _int, _mode,
                         _open_checkpoint, _options, _progress, _read, _running, _view)


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
            chunk_bytes=8 << 20, direct=False, progress=None, mode="copy", device="cpu"):
    """Loads the checkpoint at `path` for `tp` ranks by `plan` into `worker`'s pinned
    memory, reading every byte of it once; returns a TpLoad. A split that cannot be made
    (a dim the tensor lacks, a dim smaller than tp, a tp unlike the plan's) is
    InvalidArgumentError naming the tensor, before any memory is taken; a failed or
    stopped load leaves nothing allocated.

    `mode` as load_file's: "map" gives every rank read-only views of the files' pinned
    mappings (its slices of a split tensor are views too, strided for a split along a
    later dim; nothing read or copied). `device` as load_file's: the worker's own device
    ("sim:0", "cuda:1") uploads every rank's slices onto it (torch tensors over device
    memory, a replicated tensor once for all ranks; on sim CPU tensors): one device for
    all ranks, where load_to_devices gives each rank its own."""
    _check_worker(worker, "load_tp")
    kind = _framework(framework, "load_tp()")
    tp = _int(tp, "load_tp", "tp", 31)
    options = _options("load_tp", threads, chunk_bytes, verify, direct)
    mode = _mode(mode, "load_tp")
    target = _device(device, worker, "load_tp")
    if target is not None and kind != "pt":
        raise InvalidArgumentError(f"load_tp(): device={device!r} gives torch tensors over "
                                   "device memory; pass framework='pt' with it")
    progress = _progress(progress, "load_tp")
    plan = _plan(plan, "load_tp")
    checkpoint = _open_checkpoint(path, "load_tp", options["verify"])
    for name in checkpoint.keys():
        _element_type(checkpoint.info(name), name, kind)  # before any memory is taken
    with _running(progress):
        load = (_mapped if mode == "map" else _copied)(checkpoint, plan, tp, worker, kind,
                                                       options, progress)
        if target is not None:
            _upload(worker, load, progress)
    return load


def _copied(checkpoint, plan, tp, worker, kind, options, progress):
    """copy mode: load_tp_to_host into the worker's pinned buffers, viewed per rank."""
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


def _narrow(whole, dim, begin, count):
    """A view of `whole` (torch tensor or NumPy array) along dim: [begin, begin + count)."""
    if hasattr(whole, "narrow"):
        return whole.narrow(dim, begin, count)
    return whole[(slice(None),) * dim + (slice(begin, begin + count),)]


def _mapped(checkpoint, plan, tp, worker, kind, options, progress):
    """map mode: the files mapped and pinned once; every rank's slice a view of them."""
    names = checkpoint.keys()
    whole, load_report = _read(checkpoint, worker, names, options, progress, kind, mode="map")
    ranks, rank_slices = [], []
    report = {"tp": tp, "read_bytes": 0, "checkpoint_bytes": checkpoint.total_bytes,
              "host_bytes": 0, "scatter_bytes": 0, "scatter_s": 0.0, "replicated": 0,
              "contiguous": 0, "strided": 0, "ranks": [], "load": load_report}
    for rank in range(tp):
        views, slices, shared = {}, [], 0
        for s in _pinstage._tp_plan_slices(checkpoint, plan, tp, rank):
            dim, name = s["dim"], s["name"]
            views[name] = (whole[name] if dim < 0 else
                           _narrow(whole[name], dim, s["begin"], s["shape"][dim]))
            slices.append({"name": name, "dtype": s["dtype"], "shape": s["shape"], "dim": dim,
                           "begin": s["begin"], "bytes": s["nbytes"], "rule": s["rule"],
                           "staged": False, "shared": dim < 0})
            shared += s["nbytes"] if dim < 0 else 0
            if rank == 0:
                report["replicated" if dim < 0 else "contiguous" if _contiguous(views[name])
                       else "strided"] += 1
        ranks.append(views)
        rank_slices.append(slices)
        total = sum(s["bytes"] for s in slices)
        report["ranks"].append({"bytes": total, "direct_bytes": 0, "scatter_bytes": 0,
                                "shared_bytes": shared})
    used = {s["rule"] for s in rank_slices[0]} if rank_slices else set()
    report["unused_rules"] = [i for i in range(len(plan)) if i not in used]
    return TpLoad(tp, ranks, rank_slices, report)


def _contiguous(view):
    return view.is_contiguous() if hasattr(view, "is_contiguous") else view.flags.c_contiguous


def _upload(worker, load, progress):
    """Every rank's slices onto the worker's device (a replicated tensor once), replacing
    the host views in load.ranks; the report gains "device": uploaded_bytes, upload_s."""
    import time
    if hasattr(progress, "phase"):
        progress.phase("upload")
    start = time.monotonic()
    pending, uploaded = {}, 0
    for r, (views, slices) in enumerate(zip(load.ranks, load.slices)):
        for s in slices:
            key = (s["name"], -1 if s["shared"] else r)
            if key not in pending:
                pending[key] = worker.to_device(views[s["name"]], non_blocking=True)
                uploaded += s["bytes"]
    load.ranks = [{s["name"]: pending[(s["name"], -1 if s["shared"] else r)].wait()
                   for s in slices} for r, slices in enumerate(load.slices)]
    load.report["device"] = {"uploaded_bytes": uploaded, "upload_s": time.monotonic() - start}
