"""Issue 47: a map-mode tensor (a read-only view of a checkpoint's page cache) cannot be
written through by any torch, NumPy, DLPack or pinstage path, on torch 1.13 and 2.x.

Each group of paths runs in a child process (readonly47_paths.py): a write that gets
through is SIGSEGV, so a crash is an exit code naming the path that was running, not a
dead pytest. Against the old guard (a name-based __torch_function__ on args[0]) the
functional, aliases and bridges groups died of SIGSEGV, t.set_() emptied a mapped tensor,
the copies group failed (pickling, deepcopy, module.to) and the compile test raised
Dynamo's RecursionError, on torch 1.13 and 2.15."""
import hashlib
import os
import pathlib
import subprocess
import sys

import pytest
import torch

import pinstage
from test_py_checkpoint import write_file

CHILD = pathlib.Path(__file__).with_name("readonly47_paths.py")
TORCH2 = int(torch.__version__.split(".")[0]) >= 2
# The fewest paths each group drives, so that a path list cannot silently shrink.
GROUPS = {"inplace": 80, "functional": 45, "aliases": 40, "bridges": 15, "copies": 15,
          "sweep": 500}


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    path = tmp_path_factory.mktemp("readonly47") / "m.safetensors"
    write_file(path, {"w": torch.arange(16.).reshape(4, 4) / 7,
                      "i": torch.arange(8, dtype=torch.int32)})
    return path


def _run(group, ckpt, build_dir):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(build_dir / "python"), str(CHILD.parent), os.environ.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, str(CHILD), group, str(ckpt)], env=env,
                          capture_output=True, text=True, timeout=900)


def _matches(expected, got):
    return got == expected or (expected.endswith("*") and got.startswith(expected[:-1]))


@pytest.mark.parametrize("group", sorted(GROUPS))
def test_no_path_writes_a_map_mode_tensor(group, ckpt, build_dir):
    before = hashlib.sha256(ckpt.read_bytes()).hexdigest()
    proc = _run(group, ckpt, build_dir)
    lines = proc.stdout.splitlines()
    started = [line[len("start "):] for line in lines if line.startswith("start ")]
    assert proc.returncode == 0, (
        f"{group}: the child exited with {proc.returncode} (a negative code is the signal) "
        f"in path {started[-1] if started else None!r}\n{proc.stderr[-3000:]}")
    assert lines and lines[-1] == "done", proc.stderr[-3000:]
    results = [line[len("path "):].split("\t") for line in lines if line.startswith("path ")]
    wrong = [r for r in results if not _matches(r[1], r[2])]
    assert not wrong, "\n".join(f"{n}: expected {e}, got {g}" for n, e, g in wrong)
    assert len(results) >= GROUPS[group], len(results)
    if group == "sweep":  # most in-place methods reached the dispatcher and were refused
        assert sum(r[2] == "refused" for r in results) >= 150
    assert hashlib.sha256(ckpt.read_bytes()).hexdigest() == before


def test_read_only_error_is_one_class_raised_by_python_and_cpp():
    assert pinstage.ReadOnlyError is pinstage._pinstage.ReadOnlyError
    assert issubclass(pinstage.ReadOnlyError, pinstage.InvalidArgumentError)
    assert pinstage.ReadOnlyError("x").code == "invalid_argument"


def test_views_stay_read_only_and_new_memory_is_plain(worker, ckpt):
    t = pinstage.load_file(ckpt, worker=worker, mode="map")["w"]
    for view in (t[1], t.T, t.view(-1)[3:], t.detach(), t.unbind()[2], t.split(1)[3]):
        assert isinstance(view, pinstage.ReadOnlyTensor)
        assert view.data_ptr() >= t.data_ptr()  # the mapping's address, to read
    for new in (t + 1, t.clone(), t.to(torch.float64), t.sum(0), torch.cat([t, t])):
        assert type(new) is torch.Tensor
    assert torch.equal(t @ torch.eye(4), t.clone())
    assert repr(t[0]).startswith("ReadOnlyTensor([0.0000, 0.1429")
    assert t[2].tolist() == pytest.approx([8 / 7, 9 / 7, 10 / 7, 11 / 7])


class TinyLayer(torch.nn.Module):
    """One Llama-style decoder layer: RMS norms, attention, a SiLU-gated MLP."""

    def __init__(self, d=32, heads=4, hidden=64):
        super().__init__()
        linear = lambda i, o: torch.nn.Linear(i, o, bias=False)  # noqa: E731
        self.heads = heads
        self.norm1, self.norm2 = (torch.nn.Parameter(torch.rand(d) + 0.5) for _ in range(2))
        self.q, self.k, self.v, self.o = (linear(d, d) for _ in range(4))
        self.gate, self.up, self.down = linear(d, hidden), linear(d, hidden), linear(hidden, d)

    @staticmethod
    def rms(x, weight):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * weight

    def forward(self, x):
        b, s, d = x.shape
        y = self.rms(x, self.norm1)
        q, k, v = (p(y).view(b, s, self.heads, -1).transpose(1, 2) for p in (self.q, self.k, self.v))
        a = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o(a.transpose(1, 2).reshape(b, s, d))
        y = self.rms(x, self.norm2)
        return x + self.down(torch.nn.functional.silu(self.gate(y)) * self.up(y))


@pytest.mark.skipif(not TORCH2, reason="torch.compile and load_state_dict(assign=) are torch 2.x")
def test_map_mode_weights_compile_and_match_copy_mode(worker, tmp_path):
    """Issue 47: a Llama-like layer with map-mode weights failed in Dynamo with a
    RecursionError; it now compiles (one graph, fullgraph=True) to copy mode's output."""
    torch.manual_seed(0)
    path = tmp_path / "layer.safetensors"
    write_file(path, {k: v.detach().contiguous() for k, v in TinyLayer().state_dict().items()})
    copy_layer, map_layer = TinyLayer(), TinyLayer()
    copy_layer.load_state_dict(pinstage.load_file(path, worker=worker), assign=True)
    map_layer.load_state_dict(pinstage.load_file(path, worker=worker, mode="map"), assign=True)
    assert isinstance(map_layer.q.weight, pinstage.ReadOnlyTensor)
    x = torch.randn(2, 5, 32)
    want = copy_layer(x)
    got = torch.compile(map_layer, fullgraph=True)(x)
    assert type(got) is torch.Tensor
    torch.testing.assert_close(got, want)
