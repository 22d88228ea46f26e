"""PinnedTorchAllocator: PyTorch tensors whose storage is a Worker's pinned host memory.

Every tensor is a zero-copy DLPack view of its own PinnedHostBuffer: it keeps the buffer
(and the worker) alive, and counts as a live view until it is garbage, so the worker's
finalize() refuses while it exists. See docs/python.md and docs/howto-stage-torch.md.
"""
import math
import operator

import torch

from . import _pinstage

# The oldest torch this module works with: torch.from_dlpack (1.10) and torch.frombuffer
# keeping Py_buffer.obj, tested on 1.13 (docs/python.md, "Minimum versions").
MIN_TORCH = (1, 13)


def _version_tuple(text):
    parts = []
    for piece in text.split("+")[0].split(".")[:2]:
        digits = "".join(c for c in piece if c.isdigit()) or "0"
        parts.append(int(digits))
    return tuple(parts)


if _version_tuple(torch.__version__) < MIN_TORCH:
    raise ImportError(f"pinstage needs torch >= {'.'.join(map(str, MIN_TORCH))}, "
                      f"found {torch.__version__}")
from ._pinstage import InvalidArgumentError, Worker

_INT64_MAX = 2**63 - 1

# The one dtype set: what TaskArgs accepts (pinstage's DType, docs/tensors.md); the
# float8 kinds and the wide unsigned ints where this torch has them.
_DTYPES = tuple(
    [torch.float32, torch.float64, torch.float16, torch.bfloat16,
     torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8, torch.bool]
    + [getattr(torch, n) for n in ("float8_e4m3fn", "float8_e5m2", "uint16", "uint32", "uint64")
       if hasattr(torch, n)])
_FLOAT_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)


def _dtype_names(dtypes):
    return ", ".join(str(d).replace("torch.", "") for d in dtypes)


def _check_dtype(dtype, who, allowed=_DTYPES):
    """Returns `dtype` if it is one of `allowed`, else raises InvalidArgumentError."""
    if not isinstance(dtype, torch.dtype) or dtype not in allowed:
        raise InvalidArgumentError(
            f"{who}: dtype must be one of {_dtype_names(allowed)}, got {dtype!r}")
    return dtype


def _parse_size(size, who):
    """torch's size forms: ints (``empty(2, 4)``), or one sequence (``empty((2, 4))``,
    a torch.Size). Returns the raw shape for _check_shape."""
    if len(size) == 1 and not isinstance(size[0], bool):
        try:
            operator.index(size[0])
        except TypeError:
            return size[0]  # one sequence
    return size


def _check_shape(shape, who, itemsize=1):
    """Returns `shape` as a tuple of non-negative ints whose byte size fits in int64.

    An int is a 1-D shape. Raises InvalidArgumentError naming the bad dimension."""
    if isinstance(shape, int) and not isinstance(shape, bool):
        shape = (shape,)
    try:
        dims = tuple(shape)
    except TypeError:
        raise InvalidArgumentError(
            f"{who}: shape must be a sequence of non-negative ints, got {shape!r}") from None
    out = []
    for i, d in enumerate(dims):
        if isinstance(d, bool):
            raise InvalidArgumentError(f"{who}: shape[{i}] must be an int, got {d!r}")
        try:
            d = operator.index(d)
        except TypeError:
            raise InvalidArgumentError(
                f"{who}: shape[{i}] must be an int, got {type(d).__name__} {d!r}") from None
        if d < 0:
            raise InvalidArgumentError(f"{who}: shape[{i}] must be >= 0, got {d}")
        out.append(d)
    numel = math.prod(out)
    if numel * itemsize > _INT64_MAX:
        raise InvalidArgumentError(
            f"{who}: shape {tuple(out)} of {itemsize}-byte elements overflows: "
            f"{numel} elements are more than {_INT64_MAX} bytes")
    return tuple(out)


class PinnedTorchAllocator:
    """Makes contiguous CPU torch tensors backed by `worker`'s pinned host memory.

    `worker` must be an initialized chip-level pinstage.Worker (the same guard the C++
    PinnedAllocator uses: pinstage.require_chip_worker). The methods take torch's call
    forms: ``empty(2, 4)``, ``empty((2, 4), dtype=torch.bfloat16)``, ``zeros``, ``ones``,
    ``full``, ``empty_like``, ``zeros_like``, and ``randn`` from pinstage's own
    counter-based generator (deterministic per seed)."""

    def __init__(self, worker):
        if not isinstance(worker, Worker):
            raise TypeError(
                f"PinnedTorchAllocator needs a pinstage.Worker, got {type(worker).__name__}")
        _pinstage.require_chip_worker(worker, "PinnedTorchAllocator")
        self._worker = worker

    @property
    def worker(self):
        """The Worker whose pinned memory backs the tensors."""
        return self._worker

    def _new(self, who, size, dtype, allowed=_DTYPES):
        # A trailing positional dtype is the older form empty(shape, dtype).
        if size and isinstance(size[-1], torch.dtype):
            if dtype is not None:
                raise TypeError(f"{who}: dtype given both positionally and as a keyword")
            size, dtype = size[:-1], size[-1]
        dtype = _check_dtype(torch.float32 if dtype is None else dtype, who, allowed)
        itemsize = torch.empty((), dtype=dtype).element_size()
        shape = _check_shape(_parse_size(size, who), who, itemsize)
        nbytes = math.prod(shape) * itemsize
        # A zero-element tensor still gets (one page of) pinned memory, so every tensor
        # this allocator makes is pinned (pinstage.is_pinned answers by its storage).
        buffer = self._worker.alloc_pinned_host(max(nbytes, 1))
        flat = torch.from_dlpack(buffer)  # uint8 [nbytes]: one counted view of the buffer
        return flat[:nbytes].view(dtype).view(shape)

    def empty(self, *size, dtype=None):
        """empty(*size, dtype=torch.float32) -> torch.Tensor

        A tensor in fresh pinned memory (contents unspecified; the sim backend hands out
        zeroed pages). `size`: ints, or one sequence of ints."""
        return self._new("PinnedTorchAllocator.empty", size, dtype)

    def zeros(self, *size, dtype=None):
        """zeros(*size, dtype=torch.float32) -> torch.Tensor: empty() filled with 0."""
        return self._new("PinnedTorchAllocator.zeros", size, dtype).zero_()

    def ones(self, *size, dtype=None):
        """ones(*size, dtype=torch.float32) -> torch.Tensor: empty() filled with 1."""
        return self._new("PinnedTorchAllocator.ones", size, dtype).fill_(1)

    def full(self, size, fill_value, dtype=None):
        """full(size, fill_value, dtype=None) -> torch.Tensor

        empty(size) filled with `fill_value`; dtype None infers it as torch.full does
        (bool, int64, or float32 for a float)."""
        if dtype is None:
            dtype = (torch.bool if isinstance(fill_value, bool)
                     else torch.int64 if isinstance(fill_value, int) else torch.float32)
        return self._new("PinnedTorchAllocator.full", (size,), dtype).fill_(fill_value)

    def randn(self, *size, dtype=None, seed=0, stream=0, std=1.0, bias=0.0):
        """randn(*size, dtype=torch.float32, seed=0, stream=0, std=1.0, bias=0.0)

        Standard normals (times `std`, plus `bias`) from pinstage's counter-based
        generator (include/pinstage/random.h): the same bytes for the same (seed, stream)
        on every machine and thread count. float32 or bfloat16."""
        t = self._new("PinnedTorchAllocator.randn", size, dtype,
                      (torch.float32, torch.bfloat16))
        seed = _check_uint64(seed, "PinnedTorchAllocator.randn: seed")
        stream = _check_uint64(stream, "PinnedTorchAllocator.randn: stream")
        if t.numel():
            _pinstage._fill_normal(t.data_ptr(), t.numel(),
                                   "bf16" if t.dtype == torch.bfloat16 else "f32",
                                   seed, stream, float(std), float(bias))
        return t

    def normal(self, shape, std=1.0, bias=0.0, generator=None, dtype=torch.float32):
        """empty() filled with std * z + bias, z standard normal drawn by torch from
        `generator` (a torch.Generator; None = torch's default). Floating dtypes only."""
        _check_dtype(dtype, "PinnedTorchAllocator.normal", _FLOAT_DTYPES)
        return self.empty(shape, dtype=dtype).normal_(mean=bias, std=std, generator=generator)

    def empty_like(self, tensor, dtype=None):
        """empty_like(tensor, dtype=None) -> torch.Tensor: `tensor`'s shape (and dtype)."""
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"empty_like needs a torch.Tensor, got {type(tensor).__name__}")
        return self.empty(tuple(tensor.shape), dtype=tensor.dtype if dtype is None else dtype)

    def zeros_like(self, tensor, dtype=None):
        """zeros_like(tensor, dtype=None) -> torch.Tensor: empty_like() filled with 0."""
        return self.empty_like(tensor, dtype).zero_()

    def copy(self, tensor):
        """A pinned, contiguous copy of `tensor` (any device torch can copy from)."""
        return self.empty_like(tensor).copy_(tensor)

    def is_pinned(self, tensor):
        """True when all of `tensor`'s bytes lie in this worker's pinned memory (an open
        pinned buffer, or a pinned range of its table such as a map-mode file mapping)."""
        return _pinned_owner(tensor) is self._worker

    def __repr__(self):
        return f"PinnedTorchAllocator({self._worker!r})"


def _check_uint64(value, what):
    if isinstance(value, bool):
        raise InvalidArgumentError(f"{what} must be an int, got {value!r}")
    try:
        value = operator.index(value)
    except TypeError:
        raise InvalidArgumentError(f"{what} must be an int, got {type(value).__name__}") from None
    if not 0 <= value < 2**64:
        raise InvalidArgumentError(f"{what} must be in [0, 2**64 - 1], got {value}")
    return value


def _pinned_owner(tensor):
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"is_pinned needs a torch.Tensor, got {type(tensor).__name__}")
    if tensor.device.type != "cpu" or tensor.layout != torch.strided:
        return None
    nbytes = tensor.numel() * tensor.element_size()
    if nbytes == 0:
        # A zero-element tensor's data_ptr() is 0: its storage tells where it lives
        # (untyped_storage on torch 2.x, where storage() warns that it is deprecated).
        storage = (tensor.untyped_storage() if hasattr(tensor, "untyped_storage")
                   else tensor.storage())
        return _pinstage._pinned_owner(storage.data_ptr(), 0)
    return _pinstage._pinned_owner(tensor.data_ptr(), nbytes)


def is_pinned(tensor):
    """is_pinned(tensor: torch.Tensor) -> bool

    True when all of `tensor`'s bytes lie in pinned memory of a live pinstage Worker: an
    open PinnedHostBuffer, or a range in the worker's own table of pinned ranges
    (Worker.is_pinned_host), such as a map-mode tensor's pinned file mapping (zero-element
    tensors: their storage). Unlike torch.Tensor.is_pinned(), which only knows memory torch
    itself pinned (docs/python.md)."""
    return _pinned_owner(tensor) is not None
