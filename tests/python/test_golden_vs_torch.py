"""The correctness anchor of the C++ golden: the same decode computed by PyTorch, written
independently from the scene contract (qwen3_torch_reference.py), on a 2-layer fixture
exported with the project's safetensors writer, at seq_len 1, 256 (a whole number of
pages) and 300 (a partly used last page).

The C++ side runs in tests/tools/qwen3_dump (built as <build>/bin/qwen3_dump), which writes
the fixture once and, per seq_len, that seq_len's seq_lens/slot_mapping and the golden.
"""
import os
import subprocess

import pytest
import torch

import qwen3_torch_reference as ref

pytestmark = pytest.mark.once  # the same in both pytest passes: run in one (pyproject.toml)

LAYERS = 2
SEQ_LENS = (1, 256, 300)

@pytest.fixture(scope="module")
def dumped(build_dir, tmp_path_factory):
    tool = build_dir / "bin" / "qwen3_dump"
    if not tool.exists():
        pytest.fail(f"{tool} not found: build the project first (target qwen3_dump)")
    out_dir = tmp_path_factory.mktemp("golden_vs_torch")
    subprocess.run(
        [str(tool), "--layers", str(LAYERS), "--seq-lens", ",".join(map(str, SEQ_LENS)),
         "--out-dir", str(out_dir)],
        check=True,
    )
    yield out_dir
    for path in out_dir.iterdir():  # 2 GB: do not leave it behind
        path.unlink()


def describe(name, actual, expected, bad):
    a = actual.float().reshape(-1)
    b = expected.float().reshape(-1)
    diff = (a - b).abs()
    diff[diff.isnan()] = float("inf")
    worst = int(torch.argmax(torch.where(bad.reshape(-1), diff, torch.zeros_like(diff))))
    return (f"{name}: {int(bad.sum())} of {bad.numel()} elements mismatch; worst at {worst}: "
            f"C++ {float(a[worst])}, torch {float(b[worst])}")


@pytest.mark.parametrize("seq_len", SEQ_LENS)
def test_cpp_golden_matches_torch_reference(dumped, seq_len):
    torch.set_num_threads(os.cpu_count() or 1)  # torch may default to fewer
    args = ref.read_safetensors(dumped / "fixture.safetensors")
    golden = ref.read_safetensors(dumped / f"golden_{seq_len}.safetensors")
    # The seq_len-dependent inputs come with the golden; the rest does not depend on it.
    args["seq_lens"] = golden["seq_lens"]
    args["slot_mapping"] = golden["slot_mapping"]
    assert torch.all(args["seq_lens"] == seq_len)
    assert args["wq"].shape == (LAYERS * ref.HIDDEN, ref.HIDDEN)

    out, rows, k_rows, v_rows = ref.decode(args, LAYERS)

    assert torch.equal(golden["kv_rows"], rows), "the C++ golden wrote other rows"
    for name, actual, expected in (("out", golden["out"], out),
                                   ("k_rows", golden["k_rows"], k_rows),
                                   ("v_rows", golden["v_rows"], v_rows)):
        assert actual.shape == expected.shape, name
        assert actual.dtype == torch.bfloat16, name
        bad = ref.mismatches(actual, expected)
        assert not bool(bad.any()), describe(name, actual, expected, bad)
        # The contract's tolerance is loose (attention reaches `out` only through a small wo),
        # so the anchor also asks for agreement to rounding: each difference within 2^-6 of
        # |torch| + rms/8 (the rms term covers values that cancel to near zero), and almost
        # every element bit-identical. Measured: at most 0.008, and at least 99.4 % on
        # torch 1.13; torch 2.x's own bf16 kernels round differently (95.7-96.9 % on 2.15,
        # every element still within rounding), so the share asked for follows its major.
        a, b = actual.float(), expected.float()
        scale = b.abs() + b.pow(2).mean().sqrt() / 8
        far = (a - b).abs() > 2.0 ** -6 * scale
        assert not bool(far.any()), describe(name + " (beyond rounding)", actual, expected, far)
        same = float((a == b).float().mean())
        want = 0.98 if torch.__version__.startswith("1.") else 0.95
        assert same >= want, f"{name}: only {same:.4f} of the elements are identical"
