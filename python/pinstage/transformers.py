"""pinstage.transformers: a Hugging Face transformers model whose weights pinstage loaded
(docs/engines.md, "transformers").

    from transformers import AutoModelForCausalLM
    from pinstage.transformers import from_pretrained
    model = from_pretrained(AutoModelForCausalLM, "model/", worker=w)        # map mode

It is transformers' own path, `ModelClass.from_pretrained(None, config=config,
state_dict=pinstage.load_file(path, mode=...))`, with what a user would otherwise trip on
taken care of: an Auto class (which refuses a None path) resolved to the config's model
class, the config read from `path`, and in map mode a dtype that would cast (a silent copy
of every weight) refused before anything is loaded. In map mode the model's parameters are
the checkpoint's page cache, pinned in place: read-only, so a write to one (an optimizer
step, an in-place op) raises pinstage.ReadOnlyError naming the remedy (mode="copy").
"""
import warnings

import torch

import pinstage
from ._pinstage import InvalidArgumentError
from ._readonly import _span
from .checkpoint import ReadOnlyTensor, _mode


def _model_class(model_class, config):
    """The concrete class: an Auto class (its `_model_mapping`) resolved for `config`."""
    mapping = getattr(model_class, "_model_mapping", None)
    if mapping is None:
        return model_class
    try:
        return mapping[type(config)]
    except KeyError:
        raise InvalidArgumentError(
            f"pinstage.transformers.from_pretrained: {model_class.__name__} has no model "
            f"class for {type(config).__name__}; pass the model class itself") from None


def _refuse_cast(state, dtype):
    """Map mode: a dtype other than the floating tensors' own would cast each into a copy."""
    if dtype is None or dtype == "auto":
        return
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype, dtype)
    floating = {t.dtype for t in state.values() if t.is_floating_point()}
    other = sorted(str(d).replace("torch.", "") for d in floating if d != dtype)
    if other:
        raise InvalidArgumentError(
            f"pinstage.transformers.from_pretrained: dtype={dtype} would cast the checkpoint's "
            f"{', '.join(other)} tensors into new memory, a second copy of the weights beside "
            "the mapped one; pass dtype='auto' to keep the checkpoint's, or mode='copy'")


def _mapped_span(tensors):
    """[start, end) of the mapped storage under each read-only tensor among `tensors`."""
    return [_span(t._elem) for t in tensors if isinstance(t, ReadOnlyTensor)]


def _copied(model, state):
    """(count, bytes) of the parameters that are not views of the mapping (buffers such as
    rotary tables are computed, never loaded)."""
    spans = _mapped_span(list(state.values()))
    count = nbytes = 0
    for t in model.parameters():
        base = getattr(t, "_elem", t)  # a read-only wrapper: the mapped tensor under it
        with torch._C.DisableTorchFunction():
            ptr, size = base.data_ptr(), base.numel() * base.element_size()
        if size and not any(lo <= ptr < hi for lo, hi in spans):
            count, nbytes = count + 1, nbytes + size
    return count, nbytes


def from_pretrained(model_class, path, *, worker, mode="map", config=None, threads=0,
                    verify=False, progress=None, **kwargs):
    """`model_class` (a transformers model class or Auto class) with the weights of the
    checkpoint at `path` loaded by pinstage.load_file(path, worker=worker, mode=mode, ...):
    `model_class.from_pretrained(None, config=config, state_dict=...)`. `config` defaults
    to AutoConfig.from_pretrained(path); other keyword arguments go to from_pretrained
    (state_dict is this function's to give). In map mode the parameters are the mapping's
    read-only views: a dtype that would cast them is refused, and parameters that still
    ended up as copies are named in a warning."""
    import transformers
    if "state_dict" in kwargs:
        raise TypeError("pinstage.transformers.from_pretrained() gives the state_dict itself "
                        "(pinstage.load_file of path); do not pass one")
    if config is None:
        config = transformers.AutoConfig.from_pretrained(path)
    cls = _model_class(model_class, config)
    mode = _mode(mode, "pinstage.transformers.from_pretrained")
    state = pinstage.load_file(path, worker=worker, mode=mode, threads=threads,
                               verify=verify, progress=progress)
    if mode == "map":
        _refuse_cast(state, kwargs.get("dtype", kwargs.get("torch_dtype")))
    model = cls.from_pretrained(None, config=config, state_dict=state, **kwargs)
    if mode == "map":
        count, nbytes = _copied(model, state)
        mapped = sum(t.nbytes for t in state.values() if isinstance(t, ReadOnlyTensor))
        if count and nbytes > 0.01 * mapped:
            warnings.warn(
                f"pinstage.transformers.from_pretrained: {count} parameter(s) "
                f"({nbytes / 1e6:.1f} MB) are not views of the mapped checkpoint (weights the "
                "checkpoint lacks, or that transformers converted): that memory is a copy "
                "beside the mapping", stacklevel=2)
    return model
