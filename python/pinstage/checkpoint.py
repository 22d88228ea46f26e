"""safe_open / load_file: safetensors checkpoints read straight into a Worker's pinned memory.

The API follows the safetensors package, so its users know it already:

    with pinstage.safe_open("model/", framework="pt", worker=w) as f:   # worker= required
        for name in f.keys():
            t = f.get_tensor(name)      # a torch tensor in w's pinned memory, zero-copy
    tensors = pinstage.load_file("model/", worker=w)          # {name: tensor}
    dev = pinstage.load_to_device("model/", worker=w)         # report + device buffers

PATH is a .safetensors file, a directory with model.safetensors.index.json, or a directory
of *.safetensors files; everything is validated when it is opened. Each tensor owns one
PinnedHostBuffer of exactly its bytes (one byte for an empty tensor, so it is still
pinned), viewed by torch through DLPack: the same lifetime rules as PinnedTorchAllocator
(the tensor keeps the buffer and the worker alive, and finalize() refuses while it lives).
See docs/loading.md.
"""
import operator
from collections.abc import Mapping

import torch

from . import _pinstage
from . import cache as _cache
from ._pinstage import InvalidArgumentError, Worker
from ._readonly import ReadOnlyError, ReadOnlyTensor  # noqa: F401  (pinstage.ReadOnlyError)

# Each safetensors dtype by torch's name for it. Where this torch has no such dtype, the
# 1-byte floats come as their raw bytes (uint8 of the same shape: Debian's torch 2.x
# predates float8), and the wider unsigned ints (torch 2.3 and newer) are refused by
# _torch_dtype.
_TORCH_NAMES = {
    "BOOL": "bool", "U8": "uint8", "I8": "int8", "I16": "int16", "I32": "int32",
    "I64": "int64", "F16": "float16", "BF16": "bfloat16", "F32": "float32",
    "F64": "float64", "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2",
    "U16": "uint16", "U32": "uint32", "U64": "uint64",
}
_DTYPES = {name: getattr(torch, attr, torch.uint8 if name.startswith("F8_") else None)
           for name, attr in _TORCH_NAMES.items()}
_DTYPES = {name: dtype for name, dtype in _DTYPES.items() if dtype is not None}


def _torch_dtype(name, tensor):
    dtype = _DTYPES.get(name)
    if dtype is None:
        raise InvalidArgumentError(
            f"tensor {tensor!r} is {name}, which this torch ({torch.__version__}) has no dtype for")
    return dtype


def _open_checkpoint(path, who, verify=False):
    """The checkpoint at `path`, opened for `who`. A hash sidecar that could not be used
    (stale: a file changed since `pinstage hash`; or broken) refuses a load that verifies
    (pinstage.Error, code 'io') and is a warning for one that does not: a hash nobody asked
    to check does not block a load."""
    checkpoint = _pinstage._Checkpoint(path, who)
    checkpoint.check_sidecar(bool(verify))
    if checkpoint.sidecar_problem:
        import warnings
        warnings.warn(f"{who}: {checkpoint.sidecar_problem}; loading without its hashes "
                      "(nothing asked to verify)", stacklevel=3)
    return checkpoint


# `worker` is a required keyword argument of safe_open, load_file and load_to_device: the
# tensors live in a worker's pinned memory, and no worker is made behind the caller's back
# (its lifetime, backend and finalize() are the caller's). Leaving it out is Python's own
# TypeError naming 'worker'; worker=None (or any non-Worker) is refused here.
def _check_worker(worker, who):
    if not isinstance(worker, Worker):
        raise TypeError(f"{who} needs worker=pinstage.Worker, got {type(worker).__name__}")
    _pinstage.require_chip_worker(worker, who)


def _int(value, who, name, bits):
    """`value` as an int for a C++ parameter of `bits` bits (31: int, 64: uint64):
    TypeError for another type, InvalidArgumentError when the C++ type cannot hold it
    (the C++ loader checks the meaningful range)."""
    if isinstance(value, bool) or not hasattr(type(value), "__index__"):
        raise TypeError(f"{who}(): {name} must be int, not {type(value).__name__}")
    value = operator.index(value)
    if bits == 64 and value < 0:
        raise InvalidArgumentError(f"{who}(): {name} must be >= 0, got {value}")
    low = -(2**31) if bits == 31 else 0
    if not low <= value <= 2**bits - 1:
        raise InvalidArgumentError(f"{who}(): {name} must be at most 2**{bits} - 1, got {value}")
    return value


def _bool(value, who, name):
    if not isinstance(value, bool):
        raise TypeError(f"{who}(): {name} must be bool, not {type(value).__name__}")
    return value


def _name(value, who):
    if not isinstance(value, str):
        raise TypeError(f"{who}(): name must be str, not {type(value).__name__}")
    return value


def _verify(value, who):
    """verify=True checks every tensor (one without a recorded hash is an error before
    anything is read); "if-present" checks those that have one."""
    if value == "if-present":
        return True, True
    if not isinstance(value, bool):
        raise TypeError(
            f"{who}(): verify must be bool or 'if-present', not {type(value).__name__}")
    return value, False


def _options(who, threads, chunk_bytes, verify, direct):
    """The reading options shared by safe_open, load_file and load_to_device, checked."""
    verify, if_present = _verify(verify, who)
    return dict(threads=_int(threads, who, "threads", 31),
                chunk_bytes=_int(chunk_bytes, who, "chunk_bytes", 64),
                verify=verify, verify_if_present=if_present, direct=_bool(direct, who, "direct"))


def _progress(progress, who):
    """None, a callable progress(done_bytes, total_bytes), or True: a _ProgressBar (run the
    load inside `with _running(progress):`, which draws it while no byte moves)."""
    if progress is True:
        return _ProgressBar(who)
    if progress is not None and progress is not False and not callable(progress):
        raise TypeError(f"{who}(): progress must be a callable (done, total), True (a progress "
                        f"bar) or None, not {type(progress).__name__}")
    return progress or None


def _running(progress):
    """The context a load runs in: a progress bar's (its ticker, its last line), else none."""
    import contextlib
    return progress if isinstance(progress, _ProgressBar) else contextlib.nullcontext()


class _ProgressBar:
    """progress=True: one line on stderr when it is a terminal, redrawn in place from the
    call to the last byte: the phase now running (the C++ load names each as it begins:
    allocate, pin, read, read+upload, upload, verify), the bytes done, and the rate over the
    whole load so far (bytes / seconds since the call, allocation included). Nothing for the
    first `delay` seconds (a quick load stays quiet); a ticker thread redraws every `tick`
    seconds while a phase moves no byte (a long allocation). The last line sums the load up:
    "load_file: 2.20 GB in 1.75 s, 1.26 GB/s (allocate 0.50 s, read 1.25 s)"."""

    def __init__(self, who, stream=None, delay=1.0, clock=None, tick=0.25):
        import sys
        import threading
        import time
        self._clock = clock or time.monotonic
        self._start = self._clock()
        self._who = who
        self._stream = stream or sys.stderr
        self._delay = delay
        self._tick = tick  # None: no ticker thread (tests call tick())
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = None
        self._phases = []  # (name, start time)
        self._done = 0
        self._total = None
        self.drawn = 0  # redraws made (tests read it)

    def __enter__(self):
        import threading
        if self._tick is not None and self._stream.isatty():
            self._thread = threading.Thread(target=self._run, name="pinstage-progress",
                                            daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc):
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
        with self._lock:
            if self.drawn:
                self._stream.write(f"\r{self.summary()}\x1b[K\n")
                self._stream.flush()

    def _run(self):
        while not self._stop.wait(self._tick):
            self.tick()

    def phase(self, name):
        """The C++ load's phase callback: `name` begins now."""
        with self._lock:
            self._phases.append((name, self._clock()))
            self._draw()

    def __call__(self, done, total):
        with self._lock:
            self._done, self._total = done, total
            self._draw()

    def tick(self):
        """A redraw with nothing new (the ticker thread's): the seconds go on."""
        with self._lock:
            self._draw()

    def summary(self):
        """'load_file: 2.20 GB in 1.75 s, 1.26 GB/s (allocate 0.50 s, read 1.25 s)'."""
        now = self._clock()
        seconds = now - self._start
        ends = [at for _, at in self._phases[1:]] + [now]
        spans = ", ".join(f"{name} {end - at:.2f} s"
                          for (name, at), end in zip(self._phases, ends))
        return (f"{self._who}: {self._done / 1e9:.2f} GB in {seconds:.2f} s, "
                f"{self._done / 1e9 / max(seconds, 1e-9):.2f} GB/s" +
                (f" ({spans})" if spans else ""))

    def _draw(self):
        now = self._clock()
        if now - self._start < self._delay or not self._stream.isatty():
            return
        self.drawn += 1
        seconds = now - self._start
        phase = self._phases[-1][0] if self._phases else "open"
        total = self._total or 0
        bar = "#" * int(30 * self._done / max(total, 1))
        size = f"{self._done / 1e9:.2f}/{total / 1e9:.2f} GB" if self._total else "-"
        self._stream.write(f"\r{self._who}: {phase:<11} [{bar:<30}] {size} "
                           f"{self._done / 1e9 / max(seconds, 1e-9):.2f} GB/s {seconds:.1f} s"
                           "\x1b[K")
        self._stream.flush()


# framework= spellings (safetensors' own) -> "pt" or "numpy".
_FRAMEWORKS = {"pt": "pt", "torch": "pt", "pytorch": "pt", "np": "numpy", "numpy": "numpy"}


def _framework(framework, who):
    kind = _FRAMEWORKS.get(framework) if isinstance(framework, str) else None
    if kind is None:
        raise InvalidArgumentError(f"{who}: framework must be 'pt' (torch) or 'numpy' ('np'), "
                                   f"got {framework!r}")
    return kind


def _numpy_dtype(name, tensor):
    """The NumPy dtype of a safetensors dtype. NumPy has no bfloat16 or float8: ml_dtypes'
    when it is installed; else the float8 types as their raw bytes (uint8, as torch without
    float8 gives) and BF16 refused."""
    import numpy as np
    plain = {"BOOL": np.bool_, "U8": np.uint8, "I8": np.int8, "I16": np.int16,
             "I32": np.int32, "I64": np.int64, "F16": np.float16, "F32": np.float32,
             "F64": np.float64, "U16": np.uint16, "U32": np.uint32, "U64": np.uint64}
    if name in plain:
        return np.dtype(plain[name])
    try:
        import ml_dtypes
    except ImportError:
        ml_dtypes = None
    extra = {"BF16": "bfloat16", "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2"}
    if ml_dtypes is not None and name in extra:
        return np.dtype(getattr(ml_dtypes, extra[name]))
    if name in ("F8_E4M3", "F8_E5M2"):
        return np.dtype(np.uint8)
    raise InvalidArgumentError(
        f"tensor {tensor!r} is {name}, which NumPy has no dtype for (install ml_dtypes, or "
        "open it with framework='pt')")


def _element_type(info, name, framework):
    """Checks that `framework` has a dtype for the tensor (before any memory is taken)."""
    if framework == "numpy":
        return _numpy_dtype(info["dtype"], name)
    return _torch_dtype(info["dtype"], name)


def _view(buffer, info, name, framework="pt", mapped=False):
    """The torch (or NumPy) view of a buffer holding tensor `name`'s bytes: info's nbytes,
    dtype and shape (a slice's shape, for a slice). `mapped`: a map-mode tensor (read-only:
    a non-writable NumPy array, a ReadOnlyTensor); a _MappedTensor of a copy-mode load
    through the cache is writable, viewed as a PinnedHostBuffer is."""
    nbytes = info["nbytes"]
    if framework == "numpy":
        import numpy as np
        if nbytes == 0 and isinstance(buffer, _pinstage._MappedTensor):
            flat = np.empty(0, dtype=np.uint8)
            flat.flags.writeable = not mapped
        else:
            flat = np.frombuffer(buffer, dtype=np.uint8, count=nbytes)  # one counted view
        return flat.view(_numpy_dtype(info["dtype"], name)).reshape(info["shape"])
    dtype = _torch_dtype(info["dtype"], name)
    if nbytes == 0 and isinstance(buffer, _pinstage._MappedTensor):  # no memory behind it
        empty = torch.empty(0, dtype=torch.uint8).view(dtype).view(info["shape"])
        return ReadOnlyTensor(empty) if mapped else empty
    if mapped:
        flat = torch.from_dlpack(buffer.__dlpack__())
        return ReadOnlyTensor(flat.view(dtype).view(info["shape"]))
    flat = torch.from_dlpack(buffer)  # uint8 [len(buffer)]: one counted view of the buffer
    return flat[:nbytes].view(dtype).view(info["shape"])


_MODES = ("copy", "map")


def _mode(mode, who):
    if not isinstance(mode, str) or mode.lower() not in _MODES:
        raise InvalidArgumentError(f"{who}(): mode must be 'copy' (writable tensors in pinned "
                                   f"memory) or 'map' (read-only views of the page cache, "
                                   f"pinned in place), got {mode!r}")
    return mode.lower()


def _read(checkpoint, worker, names, options, progress=None, framework="pt", mode="copy",
          cache="off"):
    """({name: tensor}, the load report): the one C++ load (reserve once, allocate, read;
    or map and pin; with `cache`, from the cache's entry on a hit), Python only wrapping
    what it returns."""
    infos = checkpoint.infos(names)
    for n, info in zip(names, infos):
        _element_type(info, n, framework)  # refused before any memory is taken
    buffers, report = checkpoint.load_pinned(worker, names, mode=mode, progress=progress,
                                             cache=cache, **options)
    mapped = mode == "map"
    return ({n: _view(b, info, n, framework, mapped) for n, b, info in zip(names, buffers, infos)},
            report)


def _describe(dtype, shape):
    return f"{str(dtype).replace('torch.', '')} of shape {tuple(shape)}"


def _check_into_tensor(tensor, name, info, who):
    """Checks that `tensor` can take tensor `name` of the checkpoint (`info`): a dense,
    contiguous CPU torch tensor of its dtype and shape. The memory itself (inside this
    worker's pinned buffers, no overlap) is checked in C++ before anything is read."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{who}: the tensor for {name!r} must be a torch.Tensor, "
                        f"not {type(tensor).__name__}")
    want_dtype = _torch_dtype(info["dtype"], name)
    want_shape = tuple(info["shape"])
    if tensor.dtype != want_dtype or tuple(tensor.shape) != want_shape:
        raise InvalidArgumentError(
            f"{who}: tensor {name!r} is {_describe(want_dtype, want_shape)} in the checkpoint "
            f"({info['dtype']}), but the tensor given for it is "
            f"{_describe(tensor.dtype, tensor.shape)}")
    if tensor.device.type != "cpu" or tensor.layout != torch.strided:
        raise InvalidArgumentError(
            f"{who}: the tensor for {name!r} is on {tensor.device} ({tensor.layout}); it must "
            "be a dense CPU tensor in the worker's pinned memory")
    if not tensor.is_contiguous():
        raise InvalidArgumentError(
            f"{who}: the tensor for {name!r} is not contiguous (strides {tensor.stride()}); "
            "its bytes are written in the file's row-major order")


def _read_into(checkpoint, worker, names, tensors, options, who, progress=None):
    """Reads tensors `names` into the caller's `tensors` (same order), every one checked
    before any byte is written."""
    infos = checkpoint.infos(names)
    for n, t, info in zip(names, tensors, infos):
        _check_into_tensor(t, n, info, who)
    addresses = [t.data_ptr() for t in tensors]
    return checkpoint.read_into_pinned(names, addresses, worker, who=who, progress=progress,
                                       **options)


class _ReadCounter:
    """What safe_open and SafeSlice share: `read_bytes`, the bytes read from the files so
    far (a safe_open's counts its get_tensor calls and every slice's)."""

    _read_bytes = 0

    @property
    def read_bytes(self):
        """int: bytes this object read from the files so far."""
        return self._read_bytes


class safe_open(_ReadCounter):  # noqa: N801 (the safetensors name)
    """A checkpoint opened for reading tensors one at a time into `worker`'s pinned memory.

    `framework`: "pt" (torch tensors) or "numpy" ("np": NumPy arrays), both views of the
    pinned memory. `verify=True` checks each tensor's recorded xxh3-64 as it is read (a
    tensor without one is an error); `verify="if-present"` checks those that have one.
    `mode`: "copy" (default) or "map" (read-only views of the page cache, pinned in place;
    docs/loading.md, "Modes"). `read_bytes` counts the bytes read from the files so far
    (get_tensor and slices); `report` is the last get_tensor's load report (a dict with the
    CLI's keys; None before the first). `cache`: "off" (default), "use" or "fill", as in
    load_file; get_tensor and map-mode slices go through it, copy-mode slices read the
    source's bytes they need."""

    report = None

    def __init__(self, path, framework="pt", *, worker, device="cpu", verify=False,
                 threads=0, chunk_bytes=8 << 20, mode="copy", cache="off"):
        self._framework = _framework(framework, "safe_open")
        _check_worker(worker, "safe_open")
        self._mode = _mode(mode, "safe_open")
        self._cache = _cache.use(cache, "safe_open")
        if device != "cpu":
            raise InvalidArgumentError(
                f"safe_open: device must be 'cpu' (pinned host memory), got {device!r}; "
                "use pinstage.load_to_device for the device")
        self._options = _options("safe_open", threads, chunk_bytes, verify, False)
        self._checkpoint = _open_checkpoint(path, "safe_open", self._options["verify"])
        self._worker = worker

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def keys(self):
        """Tensor names in file order."""
        return self._checkpoint.keys()

    def metadata(self):
        """The merged __metadata__ (and the index's metadata) as {str: str}."""
        return self._checkpoint.metadata()

    def info(self, name):
        """{dtype, shape, file, offset, nbytes, element_size, xxh3} of one tensor."""
        return self._checkpoint.info(_name(name, "safe_open.info"))

    def get_tensor(self, name, out=None):
        """Tensor `name` read into fresh pinned memory of exactly its bytes; or, with `out`
        (a contiguous tensor of its dtype and shape in this worker's pinned memory, e.g.
        from PinnedTorchAllocator), read into `out`, which is returned: no allocation."""
        name = _name(name, "safe_open.get_tensor")
        if out is None:
            tensors, report = _read(self._checkpoint, self._worker, [name], self._options,
                                    framework=self._framework, mode=self._mode,
                                    cache=self._cache)
            self.report = report
            if self._mode == "copy":  # map mode reads nothing: the bytes are mapped
                self._read_bytes += report["bytes"]
            return tensors[name]
        if self._framework != "pt":
            raise InvalidArgumentError("safe_open.get_tensor(out=): out is a torch tensor; "
                                       "this file was opened with framework='numpy'")
        report = _read_into(self._checkpoint, self._worker, [name], [out], self._options,
                            "safe_open.get_tensor(out=)")
        self.report = report
        self._read_bytes += report["bytes"]
        return out

    def get_slice(self, name):
        """A slice object for tensor `name`: get_shape(), get_dtype(), and [index] reading
        only the bytes the index selects (ints, slices with a step >= 1, '...')."""
        name = _name(name, "safe_open.get_slice")
        info = self._checkpoint.info(name)
        if self._options["verify"] and not self._options["verify_if_present"]:
            raise InvalidArgumentError(
                f"safe_open.get_slice: verify=True cannot check a slice of tensor {name!r}: "
                "its recorded xxh3-64 covers the whole tensor; use get_tensor, or open with "
                "verify='if-present' (slices are then read unchecked)")
        _element_type(info, name, self._framework)
        return SafeSlice(self, name, info)


def _slice_dims(index, shape, name):
    """(dims, shape): the (begin, count, step) per dim of tensor `name` that `index` (an
    int, a slice, '...', or a tuple of them) selects, and the result's shape (an int drops
    its dim). Python's rules: negative ints count from the end, slice bounds are clipped."""
    items = index if isinstance(index, tuple) else (index,)
    ellipses = sum(1 for i in items if i is Ellipsis)
    if ellipses > 1:
        raise IndexError(f"get_slice({name!r}): an index can only have a single ellipsis ('...')")
    given = len(items) - ellipses
    if given > len(shape):
        raise IndexError(f"get_slice({name!r}): too many indices for a tensor of dimension "
                         f"{len(shape)} ({given} given)")
    if ellipses:
        at = next(k for k, i in enumerate(items) if i is Ellipsis)
        items = items[:at] + (slice(None),) * (len(shape) - given) + items[at + 1:]
    items = items + (slice(None),) * (len(shape) - len(items))
    dims, out = [], []
    for d, (i, size) in enumerate(zip(items, shape)):
        if isinstance(i, slice):
            start, stop, step = i.indices(size)
            if step < 1:
                raise ValueError(f"get_slice({name!r}): dim {d}: the step must be >= 1 "
                                 f"(got {step}); slice the result to reverse it")
            count = len(range(start, stop, step))
            step = min(step, max(size, 1))  # past the end either way; C++ takes an int64
            dims.append((start if count else 0, count, step))
            out.append(count)
        elif isinstance(i, bool) or not hasattr(type(i), "__index__"):
            raise TypeError(f"get_slice({name!r}): an index is an int, a slice or '...' "
                            f"(one per dim), not {type(i).__name__}")
        else:
            k = operator.index(i)
            if not -size <= k < size:
                raise IndexError(f"get_slice({name!r}): index {k} is out of bounds for dim {d} "
                                 f"with size {size}")
            dims.append((k % size, 1, 1))
    return dims, tuple(out)


class SafeSlice(_ReadCounter):
    """One tensor of a safe_open, read in part: [index] reads the index's bytes alone
    (rows: one range; columns: one range per row) into fresh pinned memory; in map mode it
    is a read-only view of the pinned file mapping instead, nothing read. `read_bytes`
    counts what this object read from the files."""

    def __init__(self, owner, name, info):
        self._owner = owner
        self._name = name
        self._info = info

    def get_shape(self):
        """The whole tensor's shape, as a list."""
        return list(self._info["shape"])

    def get_dtype(self):
        """The safetensors dtype: "F32", "BF16", ..."""
        return self._info["dtype"]

    def __getitem__(self, index):
        dims, shape = _slice_dims(index, self._info["shape"], self._name)
        if self._owner._mode == "map":
            return self._mapped(index)
        nbytes = self._info["element_size"]
        for _, count, _ in dims:
            nbytes *= count
        owner = self._owner
        buffer = owner._worker.alloc_pinned_host(max(nbytes, 1))
        try:
            report = owner._checkpoint.read_slice(self._name, dims, buffer, **owner._options)
        except BaseException:
            buffer.close()  # no view of it exists yet
            raise
        self._read_bytes += report["bytes"]
        owner._read_bytes += report["bytes"]
        info = {"nbytes": nbytes, "dtype": self._info["dtype"], "shape": shape}
        return _view(buffer, info, self._name, owner._framework)

    def _mapped(self, index):
        """Map mode: the index applied to a view of the pinned file mapping, nothing read
        (a row slice is contiguous, a column slice strided); every rank of a node that
        slices the same file shares its page cache."""
        owner = self._owner
        tensors, owner.report = _read(owner._checkpoint, owner._worker, [self._name],
                                      owner._options, framework=owner._framework, mode="map",
                                      cache=owner._cache)
        return tensors[self._name][index]


def _refuse_unknown(what, wanted, keys):
    """InvalidArgumentError when a name of `wanted` is not among the checkpoint's `keys`;
    `what` starts the message ("load_file(): names lists")."""
    known = set(keys)
    missing = [n for n in wanted if n not in known]
    if missing:
        raise InvalidArgumentError(
            f"{what} {len(missing)} tensor(s) the checkpoint does not hold "
            f"(the first is {missing[0]!r})")

def _into(into, checkpoint, who):
    """The (names, tensors) of an `into` mapping, in checkpoint order; every name must be
    a tensor of the checkpoint."""
    if not isinstance(into, Mapping):
        raise TypeError(f"{who}: into must be a mapping of tensor name to torch.Tensor, "
                        f"not {type(into).__name__}")
    for name in into:
        if not isinstance(name, str):
            raise TypeError(f"{who}: the keys of into must be str, not {type(name).__name__}")
    keys = checkpoint.keys()
    _refuse_unknown(f"{who}: into names", into, keys)
    names = [n for n in keys if n in into]
    return names, [into[n] for n in names]


# device= spellings are the backend names Worker(backend=) takes, and only those: every
# backend as it describes itself (pinstage.backends()). Ascend's is "acl" everywhere
# (torch_npu's "npu" is refused with that hint, as Worker refuses it).
def _device_backends():
    return [b.name for b in _pinstage.backends()]


def _device(device, worker, who):
    """None for "cpu" (the worker's pinned host memory); else checks that `device`
    ("sim:0", "cuda:1", "acl:0", "cuda" = index 0, or a torch.device) is `worker`'s device."""
    if isinstance(device, torch.device):
        device = str(device)
    if not isinstance(device, str):
        raise TypeError(f"{who}(): device must be str or torch.device, not {type(device).__name__}")
    if device == "cpu":
        return None
    kind, sep, index = device.partition(":")
    backends = _device_backends()
    forms = "'cpu', or TYPE[:INDEX] with TYPE one of " + ", ".join(backends)
    if kind == "npu":
        forms = "pinstage's backend for Ascend NPUs is 'acl' (torch_npu's 'npu' is not a " \
                f"pinstage name): pass device='acl{sep}{index}'"
    if kind not in backends or (sep and not (index.isdigit() and index.isascii())):
        raise InvalidArgumentError(f"{who}(): device {device!r} is not a device: {forms} "
                                   "(e.g. 'cuda:1')")
    backend, device_id = kind, int(index) if sep else 0
    if (worker.backend, worker.device_id) != (backend, device_id):
        raise InvalidArgumentError(
            f"{who}(): device {device!r} is backend {backend!r} device {device_id}, but the "
            f"worker is backend {worker.backend!r} device {worker.device_id}; pass a "
            f"Worker(backend={backend!r}, device_id={device_id})")
    return backend, device_id


def _names(names, checkpoint, who):
    """The tensors `names` selects, in checkpoint order: None = all; an iterable of exact
    names (each one of the checkpoint's, none twice); or a callable name -> bool."""
    keys = checkpoint.keys()
    if names is None:
        return keys
    if callable(names):
        chosen = set()
        for n in keys:
            keep = names(n)
            if not isinstance(keep, bool):
                raise TypeError(f"{who}(): names({n!r}) must return bool, "
                                f"not {type(keep).__name__}")
            if keep:
                chosen.add(n)
        return [n for n in keys if n in chosen]
    if isinstance(names, (str, bytes)) or not hasattr(names, "__iter__"):
        raise TypeError(f"{who}(): names must be a list of tensor names or a callable "
                        f"name -> bool, not {type(names).__name__}")
    wanted = list(names)
    for n in wanted:
        if not isinstance(n, str):
            raise TypeError(f"{who}(): names must hold str, not {type(n).__name__}")
    _refuse_unknown(f"{who}(): names lists", wanted, keys)
    if len(set(wanted)) != len(wanted):
        twice = next(n for n in wanted if wanted.count(n) > 1)
        raise InvalidArgumentError(f"{who}(): names lists {twice!r} twice")
    chosen = set(wanted)
    return [n for n in keys if n in chosen]


def load_file(path, device="cpu", *, worker, verify=False, threads=0, chunk_bytes=8 << 20,
              direct=False, into=None, names=None, ring_bytes=64 << 20, progress=None,
              mode="copy", report=False, cache="off"):
    """Every tensor of the checkpoint at `path` as {name: torch tensor} in `worker`'s pinned
    memory, read by parallel pread straight into place.

    `into`: {name: tensor} the caller holds (contiguous, of each tensor's dtype and shape,
    in `worker`'s pinned memory, e.g. from PinnedTorchAllocator): exactly those tensors are
    read, into that memory, and the same tensors are returned (checkpoint order). Nothing
    is allocated, and every tensor is checked before any byte is written.

    `names`: which tensors to load (default all): a list of exact names (each must be in
    the checkpoint) or a callable name -> bool (e.g. ``lambda n: fnmatch(n, "*.mlp.*")``).

    `device`: "cpu" (default) loads into pinned host memory; the worker's own device
    ("sim:0", "cuda:1", "acl:0": a backend name and index) streams the tensors onto it
    as load_to_device does (through a `ring_bytes` staging ring) and returns its result.

    `progress`: called as progress(done_bytes, total_bytes) after each chunk read, from the
    loading threads (the caller's among them) with the GIL taken, one call at a time,
    done increasing; an exception it raises stops the load and is raised by load_file,
    with nothing left allocated (tensors given in `into` may be partly written). When it
    has a phase(name) method, that is called as each phase begins ("allocate", "pin",
    "read", "read+upload", "upload", "verify"). progress=True draws a bar on a terminal
    for a load that lasts over a second, from the call on: the phase, the bytes, the rate
    over the whole load, and a last line with each phase's seconds.

    `mode`: "copy" (default: writable tensors that own pinned memory) or "map": read-only
    views of the files' page cache, pinned in place, nothing read or copied (torch gets
    ReadOnlyTensor, NumPy non-writable arrays; a device load uploads straight from the
    mapping). docs/loading.md, "Modes", says which to pick when.

    `report=True` returns (tensors, report): the load report as a dict with the CLI's keys
    (bytes, total_s, alloc_s, read_s, verify_s, mode, map_s, pin_s, ..., cache,
    cache_entry).

    `cache`: the restart cache (pinstage.cache, docs/cache.md). "off" (default: an entry
    takes memory no reclaim gives back, so it is asked for, never a side effect); "use": an
    entry of this checkpoint that is there and not stale is loaded from (map mode: mapped
    in place, nothing read; copy mode: a copy-on-write copy of it), else the source is read;
    "fill": a missing or stale entry is made first. The report's `cache` says which
    happened ("off", "hit", "miss", "stale", "filled"), `cache_entry` where the entry is.
    Not with into= (which reads into your tensors from the source)."""
    _check_worker(worker, "load_file")
    target = _device(device, worker, "load_file")
    options = _options("load_file", threads, chunk_bytes, verify, direct)
    mode = _mode(mode, "load_file")
    cache = _cache.use(cache, "load_file")
    report = _bool(report, "load_file", "report")
    ring_bytes = _int(ring_bytes, "load_file", "ring_bytes", 64)
    progress = _progress(progress, "load_file")
    if into is not None and names is not None:
        raise InvalidArgumentError("load_file(): pass names= or into=, not both: the keys "
                                   "of into name the tensors to load")
    if into is not None and target is not None:
        raise InvalidArgumentError(f"load_file(): into= is host memory, but device={device!r}; "
                                   "load into pinned tensors with device='cpu'")
    if into is not None and cache != "off":
        raise InvalidArgumentError(f"load_file(): into= reads the source into your tensors, "
                                   f"and cache={cache!r} loads from the cache's entry: pass "
                                   "one of them")
    checkpoint = _open_checkpoint(path, "load_file", options["verify"])
    if into is not None and mode == "map":
        raise InvalidArgumentError("load_file(): into= reads into your tensors, and mode='map' "
                                   "reads nothing: pass one of them")
    with _running(progress):
        if target is not None:
            loaded = checkpoint.load_to_device(worker, ring_bytes=ring_bytes,
                                               names=_names(names, checkpoint, "load_file"),
                                               progress=progress, mode=mode, cache=cache,
                                               **options)
            return (loaded, loaded.report) if report else loaded
        if into is None:
            tensors, got = _read(checkpoint, worker, _names(names, checkpoint, "load_file"),
                                 options, progress, mode=mode, cache=cache)
            return (tensors, got) if report else tensors
        names, tensors = _into(into, checkpoint, "load_file(into=)")
        got = _read_into(checkpoint, worker, names, tensors, options, "load_file(into=)",
                         progress)
    return (dict(zip(names, tensors)), got) if report else dict(zip(names, tensors))


def iter_tensors(path, *, worker, mode="copy", names=None, verify=False, threads=0,
                 chunk_bytes=8 << 20, progress=None):
    """(name, tensor) for each tensor of the checkpoint at `path` (or those `names` selects,
    as in load_file), in file order, loaded one file at a time as load_file loads them:
    the engines' weight iterators (docs/engines.md). Memory beyond what the caller keeps is
    at most one file's tensors (copy mode: that file's pinned copies; map mode: views of
    that file's mapping). Everything is checked before the first tensor is yielded;
    `progress(done, total)` counts over the whole checkpoint."""
    _check_worker(worker, "iter_tensors")
    options = _options("iter_tensors", threads, chunk_bytes, verify, False)
    mode = _mode(mode, "iter_tensors")
    progress = _progress(progress, "iter_tensors")
    checkpoint = _pinstage._Checkpoint(path, "iter_tensors")
    selected = _names(names, checkpoint, "iter_tensors")
    files, sizes = {}, {}
    for name, info in zip(selected, checkpoint.infos(selected)):
        _element_type(info, name, "pt")  # refused before anything is yielded
        files.setdefault(info["file"], []).append(name)
        sizes[info["file"]] = sizes.get(info["file"], 0) + info["nbytes"]
    groups = [(files[f], sizes[f]) for f in files]
    return _each_file(checkpoint, worker, groups, options, mode, progress, sum(sizes.values()))


def _each_file(checkpoint, worker, groups, options, mode, progress, total):
    """iter_tensors' generator: one _read per file, the progress offset by the files before."""
    offset = 0
    for names, nbytes in groups:
        step = None if progress is None else (
            lambda done, _file_total, base=offset: progress(base + done, total))
        tensors, _ = _read(checkpoint, worker, names, options, step, mode=mode)
        yield from tensors.items()
        offset += nbytes
        del tensors


def load_to_device(path, *, worker, verify=False, threads=0, chunk_bytes=8 << 20,
                   direct=False, ring_bytes=64 << 20, names=None, progress=None, mode="copy",
                   cache="off"):
    """Streams the checkpoint (or the tensors `names` selects, as in load_file) onto
    `worker`'s device through a staging ring of `ring_bytes` of pinned memory. Returns an
    object with .report (bytes, seconds per phase, overlap, ring_pinned_bytes...), .keys(),
    .nbytes(name), .device_ptr(name), .to_bytes(name) and close(); it owns the device
    buffers until closed or garbage collected. `progress` as in load_file (a failed or
    stopped device load frees its device memory and ring). mode="map" uploads each tensor
    straight from the checkpoint's pinned file mapping, with no ring (its report says when
    the backend refused to pin the mapping and the ring was used instead). `cache` as in
    load_file: a hit uploads straight from the entry's registered mapping, with no ring
    copy, whatever `mode` is."""
    _check_worker(worker, "load_to_device")
    options = _options("load_to_device", threads, chunk_bytes, verify, direct)
    mode = _mode(mode, "load_to_device")
    cache = _cache.use(cache, "load_to_device")
    ring_bytes = _int(ring_bytes, "load_to_device", "ring_bytes", 64)
    progress = _progress(progress, "load_to_device")
    checkpoint = _open_checkpoint(path, "load_to_device", options["verify"])
    selected = None if names is None else _names(names, checkpoint, "load_to_device")
    with _running(progress):
        return checkpoint.load_to_device(worker, ring_bytes=ring_bytes, names=selected,
                                         progress=progress, mode=mode, cache=cache, **options)
