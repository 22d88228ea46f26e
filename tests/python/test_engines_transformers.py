"""transformers through pinstage (docs/engines.md, "transformers"): a tiny random Qwen3
saved with save_pretrained (sharded), reloaded with
`Qwen3ForCausalLM.from_pretrained(None, config=config, state_dict=pinstage.load_file(...))`
and through pinstage.transformers.from_pretrained, in both modes: the logits equal the
default from_pretrained's bitwise on CPU, and map mode's parameters are the mapping's
read-only views (no copy). What a write does (an optimizer step, load_state_dict with and
without assign=True), an Auto class, a path given beside state_dict, and a dtype cast.

transformers is in the engines venv (requirements/engines.txt: 5.20.2, the newest vLLM
0.33.0 allows); scripts/engines-check.sh runs this file there."""
import importlib
import os
import warnings

import pytest

if os.environ.get("PINSTAGE_REQUIRE_ENGINES") == "1":
    importlib.import_module("transformers")
transformers = pytest.importorskip("transformers")
import torch  # noqa: E402

import pinstage  # noqa: E402
from pinstage.transformers import from_pretrained  # noqa: E402

IDS = torch.tensor([[1, 5, 9, 33, 100, 7, 64]])


def _config(tie=False):
    return transformers.Qwen3Config(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        tie_word_embeddings=tie)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """(path, config, logits of the default from_pretrained): a random tiny Qwen3, in 3+
    shards so the index layout is what pinstage reads."""
    path = tmp_path_factory.mktemp("qwen3")
    torch.manual_seed(0)
    config = _config()
    transformers.Qwen3ForCausalLM(config).save_pretrained(path, max_shard_size="100KB")
    assert len(list(path.glob("*.safetensors"))) >= 3
    reference = transformers.AutoModelForCausalLM.from_pretrained(path).eval()
    with torch.no_grad():
        logits = reference(IDS).logits
    return path, config, logits


def _logits(model):
    with torch.no_grad():
        return model.eval()(IDS).logits


def _all_mapped(model):
    return all(isinstance(p, pinstage.ReadOnlyTensor) for p in model.parameters())


@pytest.mark.parametrize("mode", ["map", "copy"])
def test_the_documented_path_gives_bitwise_equal_logits(saved, worker, mode):
    path, config, want = saved
    state = pinstage.load_file(path, worker=worker, mode=mode)
    model = transformers.Qwen3ForCausalLM.from_pretrained(None, config=config,
                                                          state_dict=state)
    assert torch.equal(_logits(model), want)
    # transformers assigns the given tensors: the parameters are pinstage's memory.
    q = "model.layers.0.self_attn.q_proj.weight"
    assert model.get_parameter(q).data_ptr() == state[q].data_ptr()
    assert _all_mapped(model) == (mode == "map")


@pytest.mark.parametrize("mode", ["map", "copy"])
def test_from_pretrained_takes_an_auto_class(saved, worker, mode):
    path, _, want = saved
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no copy to warn about
        model = from_pretrained(transformers.AutoModelForCausalLM, path, worker=worker,
                                mode=mode)
    assert type(model) is transformers.Qwen3ForCausalLM
    assert torch.equal(_logits(model), want)
    assert _all_mapped(model) == (mode == "map")


def test_what_transformers_itself_refuses(saved, worker):
    # An Auto class with a None path, and a path beside state_dict: the two errors a user
    # of the bare path meets, which pinstage.transformers.from_pretrained avoids.
    path, config, _ = saved
    state = pinstage.load_file(path, worker=worker, mode="map")
    with pytest.raises(TypeError):
        transformers.AutoModelForCausalLM.from_pretrained(None, config=config,
                                                          state_dict=state)
    with pytest.raises(ValueError, match="state_dict` cannot be passed together"):
        transformers.Qwen3ForCausalLM.from_pretrained(path, config=config, state_dict=state)


def test_a_training_step_on_map_mode_weights_raises_read_only_error(saved, worker):
    path, _, _ = saved
    model = from_pretrained(transformers.Qwen3ForCausalLM, path, worker=worker).train()
    loss = model(IDS, labels=IDS).loss
    loss.backward()  # reading the weights for gradients is fine
    with pytest.raises(pinstage.ReadOnlyError, match="mode='copy'"):
        torch.optim.SGD(model.parameters(), lr=0.1, foreach=False).step()
    copy = from_pretrained(transformers.Qwen3ForCausalLM, path, worker=worker, mode="copy")
    copy.train()(IDS, labels=IDS).loss.backward()
    torch.optim.SGD(copy.parameters(), lr=0.1, foreach=False).step()  # writable


def test_load_state_dict_with_and_without_assign(saved, worker):
    path, config, want = saved
    state = pinstage.load_file(path, worker=worker, mode="map")
    model = transformers.Qwen3ForCausalLM(config)
    model.load_state_dict(state)  # copies into the model's own (writable) parameters
    assert not _all_mapped(model) and torch.equal(_logits(model), want)
    model.model.norm.weight.data.mul_(1)
    model.load_state_dict(state, assign=True)  # the parameters become the mapping's views
    assert _all_mapped(model) and torch.equal(_logits(model), want)
    with pytest.raises(pinstage.ReadOnlyError), torch.no_grad():
        model.model.norm.weight.mul_(2)


def test_tied_embeddings_share_the_mapped_tensor(tmp_path, worker):
    torch.manual_seed(1)
    config = _config(tie=True)
    transformers.Qwen3ForCausalLM(config).save_pretrained(tmp_path)
    want = _logits(transformers.Qwen3ForCausalLM.from_pretrained(tmp_path))
    model = from_pretrained(transformers.Qwen3ForCausalLM, tmp_path, worker=worker)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert isinstance(model.lm_head.weight, pinstage.ReadOnlyTensor)
    assert torch.equal(_logits(model), want)


def test_a_casting_dtype_is_refused_in_map_mode_and_taken_in_copy_mode(saved, worker):
    path, _, _ = saved
    with pytest.raises(pinstage.InvalidArgumentError,
                       match=r"dtype=torch.float16 would cast .*float32.*dtype='auto'.*"
                             r"mode='copy'"):
        from_pretrained(transformers.Qwen3ForCausalLM, path, worker=worker,
                        dtype=torch.float16)
    model = from_pretrained(transformers.Qwen3ForCausalLM, path, worker=worker, mode="copy",
                            dtype=torch.float16)
    assert model.model.norm.weight.dtype == torch.float16
    from_pretrained(transformers.Qwen3ForCausalLM, path, worker=worker, dtype="auto")


def test_weights_the_checkpoint_lacks_are_named_as_copies(tmp_path, worker):
    torch.manual_seed(2)
    config = _config()
    model = transformers.Qwen3ForCausalLM(config)
    state = {k: v for k, v in model.state_dict().items() if "layers.1.mlp" not in k}
    model.save_pretrained(tmp_path, state_dict=state)
    with pytest.warns(UserWarning, match=r"3 parameter\(s\).*not views of the mapped"):
        from_pretrained(transformers.Qwen3ForCausalLM, tmp_path, worker=worker)


def test_from_pretrained_refuses_a_state_dict_of_its_own(saved, worker):
    path, _, _ = saved
    with pytest.raises(TypeError, match="gives the state_dict itself"):
        from_pretrained(transformers.Qwen3ForCausalLM, path, worker=worker, state_dict={})


def test_logits_under_torch_compile_in_map_mode(saved, worker):
    # backend="eager": dynamo's tracing, which is what fails, without inductor's minutes
    # of C++ compilation on a 2-core machine.
    path, _, want = saved
    model = from_pretrained(transformers.Qwen3ForCausalLM, path, worker=worker).eval()
    compiled = torch.compile(model, backend="eager")
    with torch.no_grad():
        assert torch.equal(compiled(IDS).logits, want)


def test_logits_under_torch_compile_in_copy_mode(saved, worker):
    path, _, want = saved
    model = from_pretrained(transformers.Qwen3ForCausalLM, path, worker=worker, mode="copy")
    compiled = torch.compile(model.eval(), backend="eager")
    with torch.no_grad():
        assert torch.equal(compiled(IDS).logits, want)
