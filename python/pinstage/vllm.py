"""pinstage.vllm: vLLM's `--load-format pinstage` (docs/engines.md, "vLLM").

    vllm serve MODEL --load-format pinstage
    vllm serve MODEL --load-format pinstage --model-loader-extra-config '{"mode": "copy"}'

Installing pinstage declares the entry point `pinstage = "pinstage.vllm:register"` in the
group `vllm.general_plugins`, which vLLM runs in every process it starts (the API server
and each worker); `register()` adds `PinstageModelLoader` under the name "pinstage".

The loader yields each tensor of the checkpoint whole, as a view of pinned host memory, and
the model's own `load_weights` (its weight_loader) narrows it to the rank's slice and
copies it to the device. In map mode (the default) the views are the page cache itself,
pinned in place: every rank of a node shares one copy and a CUDA worker's upload reads it
by DMA, with no bounce buffer. Options (`--model-loader-extra-config`, JSON):
`mode` ("map" | "copy"), `threads` (int >= 0; 0 = all cores), `verify` (true | false |
"if-present": the recorded xxh3-64 of each tensor) and `progress` (bool; default vLLM's
`use_tqdm_on_load`). Any other key is refused as vLLM refuses its own.
"""
import gc
import os
import time

try:
    from vllm.model_executor.model_loader import register_model_loader
    from vllm.model_executor.model_loader.base_loader import BaseModelLoader
    from vllm.model_executor.model_loader.default_loader import DefaultModelLoader
except ImportError as e:  # pinstage itself imports without vLLM; this module needs it
    raise ImportError(
        "pinstage.vllm needs vLLM: pip install vllm (tested: vllm==0.33.0, the pins in "
        "requirements/engines.txt; scripts/venv.sh requirements/engines.txt makes that "
        f"environment). Importing vLLM failed: {e}") from e

from vllm.logger import init_logger

import pinstage

logger = init_logger(__name__)
LOAD_FORMAT = "pinstage"
OPTIONS = ("mode", "threads", "verify", "progress")


def _options(load_config):
    """The checked options of `load_config.model_loader_extra_config`: a ValueError naming
    the key for an unknown key or a bad value, as vLLM's own loaders do."""
    extra = load_config.model_loader_extra_config
    if not isinstance(extra, dict):
        raise ValueError(f"model_loader_extra_config must be a dict for load format "
                         f"{load_config.load_format}, got {type(extra).__name__}")
    unexpected = set(extra) - set(OPTIONS)
    if unexpected:
        raise ValueError(f"Unexpected extra config keys for load format "
                         f"{load_config.load_format}: {unexpected} (pinstage takes "
                         f"{', '.join(OPTIONS)}; docs/engines.md)")
    mode = extra.get("mode", "map")
    if mode not in ("map", "copy"):
        raise ValueError(f"mode must be 'map' (read-only views of the page cache, pinned in "
                         f"place) or 'copy' (writable pinned copies), got {mode!r}")
    threads = extra.get("threads", 0)
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 0:
        raise ValueError(f"threads must be an integer >= 0 (0: every core), got {threads!r}")
    verify = extra.get("verify", False)
    if not isinstance(verify, bool) and verify != "if-present":
        raise ValueError(f"verify must be true, false or 'if-present', got {verify!r}")
    progress = extra.get("progress", load_config.use_tqdm_on_load)
    if not isinstance(progress, bool):
        raise ValueError(f"progress must be true or false, got {progress!r}")
    return {"mode": mode, "threads": threads, "verify": verify, "progress": progress}


def _worker():
    """The pinstage worker of this process: the cuda backend on vLLM's current CUDA device
    (so map mode registers the mapping with the driver and uploads need no bounce), sim
    elsewhere (its pinning is mlock)."""
    import torch
    from vllm.platforms import current_platform
    if current_platform.is_cuda() and torch.cuda.is_available():
        try:
            return pinstage.Worker(backend="cuda", device_id=torch.cuda.current_device())
        except pinstage.Error as e:
            e.add_note("pinstage.vllm: vLLM runs on CUDA, so the loader needs pinstage's cuda "
                       "backend: install a pinstage built with it (-DPINSTAGE_CUDA=ON)")
            raise
    return pinstage.Worker(backend="sim")


class PinstageModelLoader(BaseModelLoader):
    """vLLM's `--load-format pinstage`: safetensors checkpoints through pinstage's pinned
    load (docs/engines.md). `options` holds the checked extra config."""

    def __init__(self, load_config):
        super().__init__(load_config)
        self.options = _options(load_config)

    def download_model(self, model_config):
        """A local folder is used as it is; a Hub name is downloaded as vLLM's default
        loader would (its safetensors files and their index)."""
        self._folder(model_config)

    def _folder(self, model_config):
        path = model_config.model
        if os.path.isdir(path) or os.path.isfile(path):
            return path
        from vllm.model_executor.model_loader.weight_utils import download_weights_from_hf
        return download_weights_from_hf(
            path, self.load_config.download_dir, ["*.safetensors"], model_config.revision,
            ignore_patterns=self.load_config.ignore_patterns)

    def weights_iterator(self, model_config):
        """(name, tensor) for every tensor of the checkpoint, whole, one file at a time
        (pinstage.iter_tensors: a copy-mode load holds at most one file's tensors beyond
        what the model keeps)."""
        o = self.options
        return pinstage.iter_tensors(self._folder(model_config), worker=_worker(),
                                     mode=o["mode"], threads=o["threads"], verify=o["verify"],
                                     progress=o["progress"] or None)

    def load_weights(self, model, model_config):
        """Feeds `model.load_weights` every tensor; a weight of an unquantized model that
        the checkpoint did not give is vLLM's own error naming it."""
        start = time.perf_counter()
        try:
            loaded = model.load_weights(self.weights_iterator(model_config))
        except pinstage.ReadOnlyError as e:
            raise pinstage.ReadOnlyError(
                f"{e}. This model's weight loader writes into the checkpoint's tensors, "
                "which map mode cannot allow: start vLLM with --model-loader-extra-config "
                "'{\"mode\": \"copy\"}'") from e
        finally:
            gc.collect()  # the last file's views: their mapping or pinned memory goes now
        # vLLM's default loader's line, so what reads its logs reads ours.
        logger.info("Loading weights took %.2f seconds (pinstage, mode=%s)",
                    time.perf_counter() - start, self.options["mode"])
        if loaded is not None and model_config.quantization is None:
            # vLLM's own check of a weight the checkpoint did not give, as its default
            # loader runs it on an unquantized model.
            DefaultModelLoader.track_weights_loading(self, model, loaded, quantized=False)


_registered = False


def register():
    """The `vllm.general_plugins` entry point: registers PinstageModelLoader as load format
    "pinstage" (once per process: vLLM may run its plugins more than once)."""
    global _registered
    if not _registered:
        register_model_loader(LOAD_FORMAT)(PinstageModelLoader)
        _registered = True
