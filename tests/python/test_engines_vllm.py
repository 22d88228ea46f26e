"""pinstage.vllm against the real vLLM (requirements/engines.txt: vllm 0.33.0, torch 2.14):
the entry point declared in pyproject.toml registers the loader when vLLM loads its
plugins; get_model_loader(LoadConfig(load_format="pinstage")) is pinstage's loader; its
load_weights feeds a model's load_weights every tensor of a 2-shard checkpoint, byte-exact
against the safetensors package's reader, in both modes; unknown options and bad values
are refused naming the key. Without vLLM, `import pinstage` works and `import
pinstage.vllm` says what to install (tested in every pass).

vLLM is only in the engines venv (scripts/engines-check.sh runs this file there with
PINSTAGE_REQUIRE_ENGINES=1, which makes a missing vLLM an error, not a skip)."""
import importlib
import importlib.util
import json
import os
import pathlib
import subprocess
import sys
import types

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
REQUIRED = os.environ.get("PINSTAGE_REQUIRE_ENGINES") == "1"


def engine(module):
    """`module`, imported; skipped when absent, except under PINSTAGE_REQUIRE_ENGINES=1."""
    if REQUIRED:
        return importlib.import_module(module)
    return pytest.importorskip(module)


def _env(build_dir, *paths):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([*map(str, paths), str(build_dir / "python")])
    return env


def test_pinstage_imports_without_vllm_and_pinstage_vllm_says_what_to_install(
        tmp_path, build_dir):
    # A `vllm` that cannot be imported stands first on the path, whatever is installed.
    (tmp_path / "vllm").mkdir()
    (tmp_path / "vllm" / "__init__.py").write_text(
        "raise ImportError('no vllm here (the test hides it)')\n")
    code = ("import pinstage; pinstage.Worker().finalize()\n"
            "try:\n    import pinstage.vllm\nexcept ImportError as e:\n    print(e)\n"
            "else:\n    print('imported')\n")
    out = subprocess.run([sys.executable, "-c", code], env=_env(build_dir, tmp_path),
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "pip install vllm" in out.stdout and "vllm==0.33.0" in out.stdout, out.stdout
    assert "no vllm here" in out.stdout  # the cause is kept


def _entry_points_dist(directory):
    """A dist-info declaring pyproject.toml's vllm.general_plugins entry points as written
    (scripts/lib/vllm_check.py's, which gpu-check-vllm.sh uses too), so vLLM's plugin
    loader finds them as it would in an installed pinstage; returns the group."""
    spec = importlib.util.spec_from_file_location(
        "vllm_check", ROOT / "scripts" / "lib" / "vllm_check.py")
    helper = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(helper)
    return helper.plugin(directory)


def test_the_entry_point_registers_the_loader_in_a_fresh_process(tmp_path, build_dir):
    engine("vllm")
    group = _entry_points_dist(tmp_path)
    assert group == {"pinstage": "pinstage.vllm:register"}
    code = """
from vllm.config.load import LoadConfig
from vllm.model_executor.model_loader import get_model_loader
try:
    get_model_loader(LoadConfig(load_format="pinstage"))
except ValueError as e:
    print("before:", e)
from vllm.plugins import load_general_plugins
load_general_plugins()
loader = get_model_loader(LoadConfig(load_format="pinstage"))
print("after:", type(loader).__module__, type(loader).__name__, loader.options["mode"])
"""
    env = _env(build_dir, tmp_path)
    env.pop("VLLM_PLUGINS", None)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "before: Load format `pinstage` is not supported" in out.stdout, out.stdout
    assert "after: pinstage.vllm PinstageModelLoader map" in out.stdout, out.stdout


@pytest.fixture(scope="module")
def vllm_loader():
    engine("vllm")
    import pinstage.vllm
    from vllm.config.load import LoadConfig
    from vllm.model_executor.model_loader import get_model_loader

    pinstage.vllm.register()
    pinstage.vllm.register()  # vLLM may run a plugin twice: no second registration

    def make(**extra):
        return get_model_loader(LoadConfig(load_format="pinstage",
                                           model_loader_extra_config=extra))
    return make


def _two_shards(directory):
    """A 2-shard checkpoint with an index, written by the safetensors package: tensors of
    several dtypes and shapes (an empty one too); returns {name: tensor}."""
    import torch
    from safetensors.torch import save_file
    g = torch.Generator().manual_seed(7)
    shards = [
        {"model.embed.weight": torch.randn(64, 32, generator=g).to(torch.bfloat16),
         "model.layers.0.q.weight": torch.randn(32, 32, generator=g),
         "model.layers.0.ids": torch.randint(-2**40, 2**40, (17,), generator=g)},
        {"model.layers.1.q.weight": torch.randn(48, 32, generator=g).half(),
         "model.norm.weight": torch.randn(32, generator=g),
         "model.empty": torch.zeros(0, 4)},
    ]
    weight_map = {}
    for k, tensors in enumerate(shards):
        name = f"model-{k + 1:05d}-of-00002.safetensors"
        save_file(tensors, str(directory / name))
        weight_map.update({t: name for t in tensors})
    (directory / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": weight_map}))
    return {n: t for s in shards for n, t in s.items()}


class _Model:
    """A model as vLLM's loader sees one: load_weights(iterable of (name, tensor)) returns
    the names it loaded. It keeps each tensor's bytes and what the tensor was."""

    def __init__(self, extra_params=()):
        import torch
        self.got, self.kinds = {}, {}
        self.params = [(n, torch.nn.Parameter(torch.zeros(1))) for n in extra_params]

    def named_parameters(self):
        return iter(self.params)

    def named_modules(self):
        return iter(())

    def load_weights(self, weights):
        import pinstage
        for name, t in weights:
            assert name not in self.got, f"{name} given twice"
            self.kinds[name] = (isinstance(t, pinstage.ReadOnlyTensor), t.is_contiguous())
            self.got[name] = _bytes(t)
        return set(self.got)


def _bytes(t):
    """The tensor's bytes, copied out (the loader's views go once the load ends)."""
    import torch
    flat = t.reshape(-1)
    return bytes(flat.view(torch.uint8).numpy()) if flat.numel() else b""


def _config(path):
    # What the loader reads of vLLM's ModelConfig.
    return types.SimpleNamespace(model=str(path), revision=None, quantization=None)


@pytest.mark.parametrize("mode", ["map", "copy"])
def test_load_weights_feeds_every_tensor_byte_exact(vllm_loader, tmp_path, mode):
    from safetensors import safe_open
    want = _two_shards(tmp_path)
    loader = vllm_loader(mode=mode)
    model = _Model()
    loader.load_weights(model, _config(tmp_path))
    assert sorted(model.got) == sorted(want)
    for name in sorted(want):
        shard = json.loads((tmp_path / "model.safetensors.index.json").read_text())
        with safe_open(str(tmp_path / shard["weight_map"][name]), framework="pt") as f:
            assert model.got[name] == _bytes(f.get_tensor(name)), name
        # Whole tensors, as views: read-only ones (the mapping) in map mode.
        assert model.kinds[name] == (mode == "map", True), name


def test_a_weight_the_checkpoint_lacks_is_vllms_own_error(vllm_loader, tmp_path):
    _two_shards(tmp_path)
    model = _Model(extra_params=["lm_head.weight"])
    with pytest.raises(ValueError, match="not initialized from checkpoint.*lm_head.weight"):
        vllm_loader().load_weights(model, _config(tmp_path))


@pytest.mark.parametrize("extra, key", [
    ({"mode": "map", "chunk_bytes": 1}, "chunk_bytes"),
    ({"enable_multithread_load": True}, "enable_multithread_load"),
])
def test_unknown_options_are_refused_naming_the_key(vllm_loader, extra, key):
    with pytest.raises(ValueError, match=f"Unexpected extra config keys for load format "
                                         f"pinstage: {{'{key}'}}"):
        vllm_loader(**extra)


@pytest.mark.parametrize("extra, message", [
    ({"mode": "mmap"}, "mode must be 'map'"),
    ({"threads": -1}, "threads must be an integer >= 0"),
    ({"threads": True}, "threads must be an integer >= 0"),
    ({"verify": "yes"}, "verify must be true, false or 'if-present'"),
    ({"progress": "no"}, "progress must be true or false"),
])
def test_bad_option_values_are_refused_naming_the_key(vllm_loader, extra, message):
    with pytest.raises(ValueError, match=message):
        vllm_loader(**extra)


def test_options_reach_the_load(vllm_loader, tmp_path):
    # verify=True on a checkpoint with no recorded hashes: pinstage's refusal, which shows
    # the option got through to load_file.
    import pinstage
    _two_shards(tmp_path)
    with pytest.raises(pinstage.InvalidArgumentError, match="no recorded"):
        vllm_loader(verify=True, threads=2).load_weights(_Model(), _config(tmp_path))
    vllm_loader(verify="if-present", threads=2).load_weights(_Model(), _config(tmp_path))


def test_a_model_that_writes_into_map_mode_weights_is_told_to_use_copy(vllm_loader,
                                                                        tmp_path):
    import pinstage
    _two_shards(tmp_path)

    class Writer(_Model):
        def load_weights(self, weights):
            for _, t in weights:
                t.mul_(2)  # some weight loaders scale in place

    with pytest.raises(pinstage.ReadOnlyError, match="""'{"mode": "copy"}'"""):
        vllm_loader().load_weights(Writer(), _config(tmp_path))
    vllm_loader(mode="copy").load_weights(Writer(), _config(tmp_path))
