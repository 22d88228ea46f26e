"""Scene tests from Python: SceneParams parsing, the two argument hooks, the registry, and
the Qwen3 decode case end to end (generate -> golden -> bind with qwen3_decode -> compare).
The execute step runs the portable kernels, the golden the best ones: runs match within
the spec's tolerance, and a corrupted upload still fails the comparison."""
import gc

import pytest
import torch

import pinstage
from pinstage import TaskArgs, qwen3
from pinstage.scene import (Qwen3DecodeCase, RegisteredSceneCase, SceneParams, SceneTestCase,
                            params_class,
                            scene_cases)

# One layer is 1 GB of arguments; a short sequence keeps the decode quick.
PARAMS = "layers=1,seq_len=200,seed=7"


def test_scene_params_parsing():
    assert SceneParams.parse() == SceneParams(qwen3.DEFAULT_SEED, qwen3.DEFAULT_SEQ_LEN,
                                              qwen3.DEFAULT_LAYERS)
    p = SceneParams.parse("layers=2, seq_len=64")
    assert (p.layers, p.seq_len, p.seed) == (2, 64, qwen3.DEFAULT_SEED)
    assert SceneParams.parse({"seed": "9"}, layers=3) == SceneParams(9, qwen3.DEFAULT_SEQ_LEN, 3)
    assert SceneParams.parse(p) == p
    assert SceneParams.parse(None, base=p, seed=1) == SceneParams(1, 64, 2)
    for bad, message in [("layer=1", "unknown scene parameter 'layer'"),
                         ("layers", "not of the form name=value"),
                         ({"seq_len": 1.5}, "seq_len must be an int"),
                         ({"seed": True}, "seed must be an int"),
                         ("seq_len=ten", "seq_len must be an int"),
                         (42, "must be None, a SceneParams")]:
        with pytest.raises(pinstage.InvalidArgumentError, match=message):
            SceneParams.parse(bad)


def test_qwen3_case_validates_before_allocating():
    case = Qwen3DecodeCase()
    w = pinstage.Worker()
    for bad, message in [("seq_len=0", "seq_len"), ("seq_len=5501", "seq_len"),
                         ("layers=0", "layers")]:
        with pytest.raises(pinstage.InvalidArgumentError, match=message):
            case.make_args(bad, worker=w)
        with pytest.raises(pinstage.InvalidArgumentError, match=message):
            case.run(w, bad)
    with pytest.raises(TypeError, match="make_args needs a pinstage.Worker, got int"):
        qwen3.make_args(layers=1, seq_len=16, worker=3)
    assert w.stats().pinned_count == 0
    w.finalize()


class FillIndexCase(SceneTestCase):
    """A case written against generate_args only (no worker-aware hook): the sim
    callable sim.fill_index writes byte j of argument k as (j + 7k) & 0xff."""

    name = "fill-index"

    def __init__(self):
        self.seen = []
        self.validated = 0

    def validate_params(self, params):
        self.validated += 1

    def generate_args(self, params):
        self.seen.append(params)
        args = TaskArgs()
        args.add("x", torch.ones(params.seq_len, dtype=torch.int32))
        args.add("y", torch.zeros(params.seq_len, dtype=torch.int32), "out")
        return args

    def compute_golden(self, args, params):
        j = torch.arange(params.seq_len * 4, dtype=torch.int64)
        return (j + 7).remainder(256).to(torch.uint8)

    def compare(self, result, golden):
        class Verdict:
            ok = torch.equal(result["y"].view(torch.uint8), golden)

            def message(self):
                return "ok" if self.ok else "y differs"
        return Verdict()

    def bind_options(self, params):
        return {"execute": "sim.fill_index"}


def test_default_worker_hook_calls_generate_args_and_parses_once():
    case = FillIndexCase()
    w = pinstage.Worker()
    result = case.run(w, {"seq_len": "33"})  # through generate_args_for_worker's default
    assert result.ok and result.report.executed and not result.pinned
    assert case.seen == [SceneParams.parse(seq_len=33)] and case.validated == 1
    assert result.params is case.seen[0]  # one parse, shared by every hook
    result = case.run(w, "seq_len=5", use_worker_hook=False)
    assert result.ok and case.validated == 2
    case.assert_passes(w, "seq_len=8")
    del result
    gc.collect()
    w.finalize()


@pytest.fixture(scope="module")
def qwen3_runs():
    case = Qwen3DecodeCase()
    w = pinstage.Worker()
    runs = {"pinned": case.run(w, PARAMS),
            "pageable": case.run(w, PARAMS, use_worker_hook=False)}
    yield w, runs
    del runs
    gc.collect()
    w.finalize()


@pytest.mark.parametrize("hook", ["pinned", "pageable"])
def test_qwen3_case_passes_end_to_end(qwen3_runs, hook):
    w, runs = qwen3_runs
    result = runs[hook]
    assert result.ok, result.comparison.message()
    assert [t.tensor for t in result.comparison.tensors] == ["out", "k_cache", "v_cache"]
    assert all(t.checked > 0 for t in result.comparison.tensors)
    # Other kernels than the golden's: every element within the spec's tolerance (a few
    # may differ in their last bits), and most bit-identical.
    for t in result.comparison.tensors:
        assert t.mismatches == 0 and (t.atol, t.rtol) == (qwen3.ATOL, qwen3.RTOL)
        assert t.worst_diff <= t.atol + t.rtol * abs(t.worst_expected)
        assert t.differing < t.checked / 20, t.message()
    assert result.report.executed and result.report.uploaded_count == 19
    assert result.pinned == (hook == "pinned")
    assert (result.args.worker is w) == (hook == "pinned")
    assert result.params == params_class("qwen3-decode").parse(PARAMS)
    # The run really computed: out holds the decode's result, not the fixture's zeros.
    assert result.args.out.abs().sum().item() > 0


def test_pinned_args_are_zero_copy_torch_tensors(qwen3_runs):
    w, runs = qwen3_runs
    args = runs["pinned"].args
    assert all(d["pinned"] for d in args.describe())
    wq = args.wq
    assert wq.dtype == torch.bfloat16 and tuple(wq.shape) == (5120, 5120)
    assert args["wq"].data_ptr() == wq.data_ptr()  # every access is a view of one memory
    assert args.live_views == 1 and w.live_views == 1
    seq_lens = args.seq_lens
    assert seq_lens.dtype == torch.int32 and seq_lens.tolist() == [200] * 16
    saved = seq_lens[0].item()
    seq_lens[0] = 99
    assert args["seq_lens"][0].item() == 99  # writes land in the pinned memory
    seq_lens[0] = saved
    del wq, seq_lens
    gc.collect()
    assert args.live_views == 0


def test_pinned_hook_args_are_bit_identical_to_pageable_hook_args():
    case = Qwen3DecodeCase()
    w = pinstage.Worker()
    params = case.parse_params(PARAMS)
    pinned = case.generate_args_for_worker(w, params)
    pageable = case.generate_args(params)
    assert pinned.names == pageable.names and len(pinned.names) == 20
    assert [d["pinned"] for d in pinned.describe()] == [True] * 20
    assert [d["pinned"] for d in pageable.describe()] == [False] * 20
    for name in pinned.names:
        # Compared as raw bits (every tensor's size is a multiple of 8 bytes).
        a = pinned[name].reshape(-1).view(torch.uint8).view(torch.int64)
        b = pageable[name].reshape(-1).view(torch.uint8).view(torch.int64)
        assert torch.equal(a, b), name
        del a, b
    del pinned
    gc.collect()
    w.finalize()


def test_finalize_with_fixture_args(capfd):
    w = pinstage.Worker()
    args = qwen3.make_args(layers=1, seq_len=16, worker=w)
    cos = args.rope_cos
    with pytest.raises(BufferError, match=r"1 pinned buffer\(s\) still have 1 live view"):
        w.finalize()
    assert cos[0, 0].item() == 1.0  # refused: the memory is still there
    del cos
    w.finalize()  # no views left: the worker reclaims the args' memory
    for use in (lambda a: a["wq"], lambda a: qwen3.compute_golden(a, 1),
                lambda a: pinstage.Binder(pinstage.Worker()).run(a)):
        with pytest.raises(pinstage.Error) as e:
            use(args)
        assert e.value.code == "finalized" and "generate them again" in str(e.value)
    del args  # their storage's release after finalize is a no-op
    gc.collect()
    assert "failed" not in capfd.readouterr().err


def test_fixture_args_keep_their_worker_alive():
    w = pinstage.Worker()
    args = qwen3.make_args(layers=1, seq_len=16, worker=w)
    del w
    gc.collect()
    assert args.worker.initialized
    assert args.seq_lens.tolist() == [16] * 16
    assert qwen3.sizes(layers=1)["input_bytes"] == args.input_bytes == 1_027_153_728
    specs = qwen3.tensor_specs(layers=1)
    assert [s["name"] for s in specs] == args.names
    assert specs[2]["shape"] == (5120, 5120) and specs[2]["dtype"] == "bf16"


def test_run_scene_validates_before_allocating():
    w = pinstage.Worker()
    for kwargs, message in [({"rounds": 0}, "rounds must be >= 1"),
                            ({"storage": "disk"}, "disk"),
                            ({"bind": {"bogus": 1}}, "unknown bind option 'bogus'"),
                            ({"bind": {"layout": "bogus"}}, "bogus"),
                            ({"seq_len": 0}, "seq_len"),
                            ({"skip_golden": True, "save_golden": "/tmp/g.safetensors"},
                             "save-golden needs the golden")]:
        with pytest.raises(pinstage.InvalidArgumentError, match=message):
            qwen3.run_scene(w, layers=1, **kwargs)
    with pytest.raises(TypeError, match="run_scene needs a pinstage.Worker"):
        qwen3.run_scene("sim")
    assert w.stats().pinned_count == 0
    w.finalize()


def test_registry_lists_the_scenes_and_builds_cases():
    assert "qwen3-decode" in pinstage._pinstage.scene_names()
    params = {p["name"]: p for p in pinstage._pinstage.scene_params("qwen3-decode")}
    assert params["layers"]["size"] and params["seq_len"]["default"] == qwen3.DEFAULT_SEQ_LEN
    assert pinstage._pinstage.scene_callable("qwen3-decode") == "qwen3_decode"
    assert [c.name for c in scene_cases()] == pinstage._pinstage.scene_names()
    with pytest.raises(pinstage.InvalidArgumentError, match="no scene named 'nope'"):
        RegisteredSceneCase("nope")
    with pytest.raises(pinstage.InvalidArgumentError, match="no parameter 'layer'"):
        pinstage._pinstage.scene_describe("qwen3-decode", {"layer": 1})


def test_corrupted_upload_fails_the_comparison():
    """Without the upload check, a flipped byte of slot_mapping (sim's corrupt_h2d on its
    first copy) sends lane 8's K/V rows 64 slots away: k_cache mismatches."""
    case = Qwen3DecodeCase()
    w = pinstage.Worker()
    names = [s["name"] for s in qwen3.tensor_specs(layers=1)]
    w.inject_fault("corrupt_h2d", names.index("slot_mapping") + 1)  # one copy per tensor
    result = case.run(w, PARAMS, use_worker_hook=False)
    assert not result.ok
    assert result.comparison.tensor == "k_cache", result.comparison.message()
    assert "mismatch" in result.comparison.message()
    del result
    gc.collect()
    w.finalize()
