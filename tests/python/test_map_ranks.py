"""Many ranks on one node, one copy (issue 48): under torchrun, each rank opens the same
checkpoint in map mode and takes its tensor-parallel part of every tensor with get_slice.
Each part equals numpy's cut of the tensor, is read-only, reads nothing from the files,
and lies in a shared mapping of the shard file itself: every rank's slices are views of the
one page cache (docs/engines.md, "Many ranks on one node"). bench/node_memory.py measures
the memory this saves; map_slices_rank.py is the rank."""
import json
import pathlib

import pytest

import tp_checkpoint
from test_distributed import needs_torchrun, one_suite_at_a_time, torchrun  # noqa: F401

HERE = pathlib.Path(__file__).resolve().parent


def test_map_mode_get_slice_is_a_view_of_the_mapping(tmp_path, worker):
    import pinstage
    model, _ = tp_checkpoint.write_checkpoint(tmp_path)
    with pinstage.safe_open(model, worker=worker, mode="map") as f:
        whole = f.get_tensor("layers.0.o_proj.weight")
        cols = f.get_slice("layers.0.o_proj.weight")[:, 10:20]
        assert isinstance(cols, pinstage.ReadOnlyTensor) and f.read_bytes == 0
        assert cols.data_ptr() == whole[:, 10:].data_ptr()  # the same mapped bytes
        assert cols.stride() == whole.stride()              # a strided view, not a copy
    with pinstage.safe_open(model, worker=worker) as f:      # copy mode: read, contiguous
        copied = f.get_slice("layers.0.o_proj.weight")[:, 10:20]
        assert copied.is_contiguous()
        assert f.read_bytes == copied.numel() * copied.element_size()
    assert (copied == cols).all()
    with pytest.raises(pinstage.ReadOnlyError):
        cols.add_(1)


@needs_torchrun
@pytest.mark.parametrize("nproc", [4])  # the 4 ranks; 2 adds CI time, not cover
def test_every_rank_slices_the_one_shared_mapping(tmp_path, build_dir, nproc):
    model, _ = tp_checkpoint.write_checkpoint(tmp_path)
    out = tmp_path / "ranks.json"
    torchrun(build_dir, nproc, HERE / "map_slices_rank.py", model, out)
    ranks = json.loads(out.read_text())
    assert len(ranks) == nproc
    for r, found in enumerate(ranks):
        assert found.pop("read_bytes") == 0, f"rank {r} read from the files"
        assert sorted(found) == sorted(tp_checkpoint.arrays())
        for name, got in found.items():
            want = tp_checkpoint.expected_slice(name, nproc, r)
            assert bytes.fromhex(got["bytes"]) == want.tobytes(), (r, name)
            assert not got["writeable"], (r, name)
            # A shared (MAP_SHARED, 's') read-only mapping of the shard file itself.
            assert got["mapping"] == str(pathlib.Path(got["file"]).resolve()), (r, name, got)
            assert got["perms"].startswith("r-") and got["perms"].endswith("s"), got["perms"]
