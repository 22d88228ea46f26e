"""Issue 41, "Tests that do not catch what they guard", the Python side: each test fails
when the bug its docstring names is planted (scripts/mutation-check.sh plants each).

- A rank's tensor-parallel rank when tp is below the group's size: every torchrun test
  had tp equal to the world size, where grank % tp and grank // (gsize // tp) agree.
  load_sharded runs here in one process over a stand-in for torch.distributed that says
  "rank r of 4" (its collectives are those of a group whose every rank succeeded).
- into= / out= of a dtype of the same element size as the checkpoint's (float16 for
  BF16, int32 for F32): refused by dtype, not by size."""
import json
import struct
import types

import numpy as np
import pytest
import torch

import pinstage
import pinstage.distributed as pdist


def write_safetensors(path, arrays, dtypes):
    """A safetensors file of {name: NumPy array}, dtypes {name: safetensors dtype}."""
    header, data = {}, b""
    for name, a in arrays.items():
        raw = a.tobytes()
        header[name] = {"dtype": dtypes[name], "shape": list(a.shape),
                        "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + data)


# ---- tp_rank with tp < world size -------------------------------------------------------

class _OneRankOfMany:
    """torch.distributed as rank `rank` of `size` sees it, every other rank succeeding."""

    def __init__(self, rank, size):
        self.rank, self.size = rank, size
        self.group = types.SimpleNamespace(WORLD=object())

    def get_rank(self, group=None):
        return self.rank

    def get_world_size(self, group=None):
        return self.size

    def all_gather_object(self, out, obj, group=None):
        for r in range(len(out)):
            out[r] = (r, None) if isinstance(obj, tuple) else obj


def _context(worker, rank, size):
    return types.SimpleNamespace(rank=rank, local_rank=rank, node=0, world_size=size,
                                 local_world_size=size, devices=[0], worker=worker,
                                 threads=1, threads_from="share")


@pytest.mark.parametrize("grank", [0, 1, 2, 3])
def test_tp_rank_is_the_group_rank_modulo_tp_below_the_world_size(
        tmp_path, worker, monkeypatch, grank):
    """Planted bug: tp_rank = grank // (gsize // tp) (distributed_tp_rank_blocks). With
    4 ranks and tp 2, ranks 0..3 take tp ranks 0, 1, 0, 1 (docs/distributed.md)."""
    a = np.arange(8 * 6, dtype=np.float32).reshape(8, 6)
    write_safetensors(tmp_path / "m.safetensors", {"w": a}, {"w": "F32"})
    plan = {"format": "pinstage.tp_plan/1", "rules": [], "default": {"split": 0}}
    monkeypatch.setattr(pdist, "dist", _OneRankOfMany(grank, 4))
    monkeypatch.setattr(pdist, "setup", lambda backend: _context(worker, grank, 4))
    load = pdist.load_sharded(str(tmp_path / "m.safetensors"), plan, tp=2, stage=False)
    try:
        assert load.report["tp"] == 2
        assert load.report["tp_rank"] == grank % 2
        want = np.array_split(a, 2, axis=0)[grank % 2]
        assert np.array_equal(load.tensors["w"].numpy(), want)
    finally:
        load.close()


# ---- into= / out= of a dtype of the same size --------------------------------------------

SAME_SIZE = [("BF16", np.uint16, torch.float16), ("F32", np.float32, torch.int32),
             ("F16", np.float16, torch.bfloat16), ("I64", np.int64, torch.float64)]


@pytest.mark.parametrize("st_dtype,np_dtype,wrong", SAME_SIZE)
def test_into_and_out_refuse_another_dtype_of_the_same_element_size(
        tmp_path, worker, alloc, st_dtype, np_dtype, wrong):
    """Planted bug: the check compares element sizes, not dtypes (into_compares_size)."""
    a = np.arange(12).astype(np_dtype).reshape(3, 4)
    f = tmp_path / "m.safetensors"
    write_safetensors(f, {"t": a}, {"t": st_dtype})
    target = alloc.zeros((3, 4), wrong)
    with pytest.raises(pinstage.InvalidArgumentError, match=r"tensor 't' is .* in the "
                       rf"checkpoint \({st_dtype}\), but the tensor given for it is "):
        pinstage.load_file(f, worker=worker, into={"t": target})
    with pinstage.safe_open(f, worker=worker) as s:
        with pytest.raises(pinstage.InvalidArgumentError, match=rf"\({st_dtype}\)"):
            s.get_tensor("t", out=target)
    assert not target.view(torch.uint8).any(), "nothing was written into the refused tensor"
    del target
