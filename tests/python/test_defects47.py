"""Issue 47's other defects, each as the user met it: a stale hash sidecar blocked a plain
load; a TP rule with non-ASCII characters was matched byte by byte; DeviceBuffer.as_tensor's
size check wrapped at 2**64; to_device(complex64) blamed PinnedTorchAllocator.empty."""
import os
import warnings

import pytest

import pinstage
from test_defects41 import cli_run, write_safetensors


@pytest.fixture
def stale(cli, tmp_path):
    """A checkpoint re-saved by its writer after `pinstage hash`: the sidecar is stale."""
    ckpt = tmp_path / "hf.safetensors"
    write_safetensors(ckpt, {"w": ("U8", [64], bytes(range(64)))})
    assert cli_run(cli, "hash", ckpt).returncode == 0
    os.replace(ckpt, tmp_path / "old")
    write_safetensors(ckpt, {"w": ("U8", [64], bytes(range(64, 128)))})
    return ckpt


def test_the_cli_warns_about_a_stale_sidecar_and_loads_unless_asked_to_verify(cli, stale):
    plain = cli_run(cli, "load", stale)
    assert plain.returncode == 0, plain.stderr
    assert "warning: hash sidecar" in plain.stderr and "is stale" in plain.stderr, plain.stderr
    assert f"run `pinstage hash {stale}`" in plain.stderr
    assert "loading without its hashes (nothing asked to verify)" in plain.stderr
    for verify in ("--verify", "--verify=if-present"):
        checked = cli_run(cli, "load", stale, verify)
        assert checked.returncode == 1 and "is stale" in checked.stderr, checked.stderr
        assert "a load that verifies needs its hashes" in checked.stderr


@pytest.mark.parametrize("mode", ["copy", "map"])
def test_load_file_and_safe_open_warn_about_a_stale_sidecar_and_load(worker, stale, mode):
    with pytest.warns(UserWarning, match=r"load_file: hash sidecar .* is stale.*nothing asked"):
        tensors = pinstage.load_file(stale, worker=worker, mode=mode)
    assert tensors["w"].tolist() == list(range(64, 128))  # the file's new bytes
    with pytest.warns(UserWarning, match="safe_open: hash sidecar .* is stale"):
        with pinstage.safe_open(stale, worker=worker, mode=mode) as f:
            assert f.get_tensor("w")[0].item() == 64
    del tensors, f


@pytest.mark.parametrize("verify", [True, "if-present"])
def test_a_load_that_verifies_is_refused_by_a_stale_sidecar(worker, stale, verify):
    for load in (lambda: pinstage.load_file(stale, worker=worker, verify=verify),
                 lambda: pinstage.safe_open(stale, worker=worker, verify=verify),
                 lambda: pinstage.load_to_device(stale, worker=worker, verify=verify),
                 lambda: pinstage.load_tp(stale, 1, worker=worker, verify=verify)):
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # refused, not warned about
            with pytest.raises(pinstage.Error, match="is stale.*needs its hashes") as e:
                load()
        assert e.value.code == "io"


def test_a_tp_rule_with_non_ascii_characters_splits_what_it_names(worker, tmp_path):
    """x[éè]y, é+ and ñ{2} were matched byte by byte: never, so the tensors were replicated."""
    ckpt = tmp_path / "m.safetensors"
    names = {"xéy": "x[éè]y", "ééé": "é+", "ññ": "ñ{2}"}
    write_safetensors(ckpt, {n: ("U8", [4, 2], bytes(range(8))) for n in names})
    plan = pinstage.TpPlan()
    for pattern in names.values():
        plan.split_regex(pattern, 0)
    load = pinstage.load_tp(ckpt, 2, plan, worker=worker)
    for name in names:
        assert load.ranks[1][name].tolist() == [[4, 5], [6, 7]], name  # split, not replicated
    del load


def test_as_tensor_refuses_a_shape_whose_bytes_pass_two_to_the_64(worker):
    """(2**61 + 1,) float64 is 2**64 + 8 bytes: the check wrapped to 8 and passed, and torch
    then raised a RuntimeError."""
    torch = pytest.importorskip("torch")
    buffer = worker.alloc_device(64)
    for shape in [(2**61 + 1,), (2**59 + 1,), (2**31, 2**28 + 1)]:
        with pytest.raises(pinstage.InvalidArgumentError, match=r"float64 is too large \(over"):
            buffer.as_tensor(torch.float64, shape)
    # the largest shape the check lets through is still refused by the buffer's size
    with pytest.raises(pinstage.InvalidArgumentError, match=f"needs {2**62} bytes; the "
                                                            "DeviceBuffer has 64"):
        buffer.as_tensor(torch.float64, (2**59,))
    assert buffer.as_tensor(torch.float64, (8,)).shape == (8,)
    buffer.close()


def test_to_device_and_to_host_name_themselves_for_a_dtype_they_cannot_stage(worker):
    torch = pytest.importorskip("torch")
    for call, who in ((lambda: worker.to_device(torch.zeros(3, dtype=torch.complex64)),
                       "Worker.to_device"),
                      (lambda: worker.to_host(torch.zeros(3, dtype=torch.complex128)),
                       "Worker.to_host")):
        with pytest.raises(pinstage.InvalidArgumentError) as e:
            call()
        message = str(e.value)
        assert message.startswith(f"{who}: dtype must be one of float32, float64"), message
        assert "bfloat16" in message and "complex" in message.split("got")[-1], message
        assert "PinnedTorchAllocator" not in message
