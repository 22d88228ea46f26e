"""`pinstage load --tp N --plan FILE`: a sharded checkpoint of several dtypes built with
numpy; each rank's slices (shape, start, bytes) are numpy.array_split's for tp 1, 2, 4 and
8, the bytes read are the checkpoint's, and a bad plan or split fails before any work with
its message; `bench load --tp N` reports each rank's read and scatter figures. The slices' bytes
are checked against a reference in tests/cpp/test_load_tp.cpp and tests/python/test_tp_slices.py."""
import json
import subprocess

import numpy as np

from tp_checkpoint import DTYPES, PLAN, SMALL, write_small_checkpoint

TENSORS = SMALL


def checkpoint(tmp_path):
    return write_small_checkpoint(tmp_path)[0]


def run(cli, *args):
    return subprocess.run([str(cli), *map(str, args)], capture_output=True, text=True,
                          timeout=300)


def test_slices_are_numpy_array_split_and_read_once(cli, tmp_path):
    d = checkpoint(tmp_path)
    total = sum(a.nbytes for a, _ in TENSORS.values())
    for tp in (1, 2, 4, 8):
        p = run(cli, "load", d, "--tp", tp, "--plan", tmp_path / "plan.json", "--json", "-",
                "--quiet")
        assert p.returncode == 0, p.stderr
        doc = json.loads(p.stdout)
        assert doc["tp"] == tp and len(doc["ranks"]) == tp
        assert doc["read_bytes"] == doc["checkpoint_bytes"] == total
        for rank in doc["ranks"]:
            for s in rank["slices"]:
                a, dim = TENSORS[s["name"]]
                if dim is None:
                    assert s["shared"] and s["shape"] == list(a.shape) and s["bytes"] == a.nbytes
                    continue
                dim %= a.ndim
                part = np.array_split(a, tp, axis=dim)[rank["rank"]]
                starts = np.cumsum([0] + [x.shape[dim] for x in np.array_split(a, tp, axis=dim)])
                assert (s["dim"], s["shape"], s["bytes"]) == (dim, list(part.shape), part.nbytes)
                assert s["begin"] == starts[rank["rank"]], s
                assert s["dtype"] == DTYPES[a.dtype.name]


def test_bad_plans_and_splits_fail_before_work(cli, tmp_path):
    d = checkpoint(tmp_path)
    p = run(cli, "load", d, "--tp", 4, "--plan", tmp_path / "plan.json")  # cube's last dim: 9
    assert p.returncode == 0, p.stderr
    p = run(cli, "load", d, "--tp", 10, "--plan", tmp_path / "plan.json")
    assert p.returncode != 0
    assert ("tensor 'layers.0.cube' (shape [3, 4, 9]): rule 3 (match '*.cube': split dim -1) "
            "would split dim 2 of size 9 into 10 parts: 1 would be empty") in p.stderr, p.stderr
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({**PLAN, "tp": 2, "tp ": 3}))
    p = run(cli, "load", d, "--plan", bad)
    assert p.returncode != 0 and "the plan has an unknown key 'tp '" in p.stderr, p.stderr
    bad.write_text('{"format": "pinstage.tp_plan/1", "rules": [], "rules": []}')
    p = run(cli, "load", d, "--tp", 2, "--plan", bad)
    assert p.returncode != 0 and "repeats the key 'rules'" in p.stderr, p.stderr
    p = run(cli, "load", d, "--plan", tmp_path / "plan.json")
    assert p.returncode != 0 and 'gives no "tp": say how many ranks with --tp N' in p.stderr
    p = run(cli, "load", d, "--tp", 2, "--to", "device")
    assert p.returncode != 0 and "--to device cannot be combined" in p.stderr
    p = run(cli, "load", d, "--tp", 1025)
    assert p.returncode != 0 and "--tp='1025' is not valid: must be in [1, 1024]" in p.stderr


def test_bench_load_tp_reports_each_ranks_read_and_scatter(cli, tmp_path):
    d = checkpoint(tmp_path)
    p = run(cli, "bench", "load", d, "--tp", 4, "--plan", tmp_path / "plan.json", "--rounds", 1,
            "--no-cold", "--json", "-", "--quiet")
    assert p.returncode == 0, p.stderr
    tp = json.loads(p.stdout)["tp"]
    total = sum(a.nbytes for a, _ in TENSORS.values())
    assert tp["tp"] == 4 and tp["read_bytes"] == tp["checkpoint_bytes"] == total
    shared = sum(a.nbytes for a, dim in TENSORS.values() if dim is None)
    assert [r["rank"] for r in tp["ranks"]] == [0, 1, 2, 3]
    for r in tp["ranks"]:
        assert r["bytes"] == r["direct_bytes"] + r["scatter_bytes"] + r["shared_bytes"]
        assert r["shared_bytes"] == shared
    assert sum(r["scatter_bytes"] for r in tp["ranks"]) == tp["scatter_bytes"] > 0
    assert sum(r["bytes"] - r["shared_bytes"] for r in tp["ranks"]) + shared == total
    p = run(cli, "bench", "load", d, "--tp", 10, "--plan", tmp_path / "plan.json")
    assert p.returncode != 0 and "would split dim 2 of size 9 into 10 parts" in p.stderr
