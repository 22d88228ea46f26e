"""PinnedTorchAllocator: PyTorch tensors whose storage is a Worker's pinned host memory.

Every tensor is a zero-copy DLPack view of its own PinnedHostBuffer: it keeps the buffer
(and the worker) alive, and counts as a live view until it is garbage, so the worker's
finalize() refuses while it exists. See docs/python.md and docs/howto-stage-torch.md.
"""
import math
import operator

import torch

from . import _pinstage
from ._pinstage import InvalidArgumentError, Worker

_INT64_MAX = 2**63 - 1

# Fixed-size dtypes a tensor can be viewed as over raw bytes.
_DTYPES = (
    torch.float32, torch.float64, torch.float16, torch.bfloat16,
    torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8, torch.bool,
    torch.complex64, torch.complex128,
)
_FLOAT_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)


def _dtype_names(dtypes):
    return ", ".join(str(d).replace("torch.", "") for d in dtypes)


def _check_dtype(dtype, who, allowed=_DTYPES):
    """Returns `dtype` if it is one of `allowed`, else raises InvalidArgumentError."""
    if not isinstance(dtype, torch.dtype) or dtype not in allowed:
        raise InvalidArgumentError(
            f"{who}: dtype must be one of {_dtype_names(allowed)}, got {dtype!r}")
    return dtype


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
    PinnedAllocator uses: pinstage.require_chip_worker)."""

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

    def empty(self, shape, dtype=torch.float32):
        """A tensor of `shape` and `dtype` in fresh pinned memory (contents unspecified;
        the sim backend hands out zeroed pages)."""
        dtype = _check_dtype(dtype, "PinnedTorchAllocator.empty")
        itemsize = torch.empty((), dtype=dtype).element_size()
        shape = _check_shape(shape, "PinnedTorchAllocator.empty", itemsize)
        nbytes = math.prod(shape) * itemsize
        # A zero-element tensor still gets (one page of) pinned memory, so every tensor
        # this allocator makes is pinned.
        buffer = self._worker.alloc_pinned_host(max(nbytes, 1))
        flat = torch.from_dlpack(buffer)  # uint8 [nbytes]: one counted view of the buffer
        return flat[:nbytes].view(dtype).view(shape)

    def zeros(self, shape, dtype=torch.float32):
        """empty() filled with zeros."""
        return self.empty(shape, dtype).zero_()

    def full(self, shape, value, dtype=torch.float32):
        """empty() filled with `value`."""
        return self.empty(shape, dtype).fill_(value)

    def normal(self, shape, std=1.0, bias=0.0, generator=None, dtype=torch.float32):
        """empty() filled with std * z + bias, z standard normal drawn by torch from
        `generator` (a torch.Generator; None = torch's default). Floating dtypes only."""
        _check_dtype(dtype, "PinnedTorchAllocator.normal", _FLOAT_DTYPES)
        return self.empty(shape, dtype).normal_(mean=bias, std=std, generator=generator)

    def empty_like(self, tensor):
        """empty() with `tensor`'s shape and dtype."""
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"empty_like needs a torch.Tensor, got {type(tensor).__name__}")
        return self.empty(tuple(tensor.shape), tensor.dtype)

    def copy(self, tensor):
        """A pinned, contiguous copy of `tensor` (any device torch can copy from)."""
        return self.empty_like(tensor).copy_(tensor)

    def is_pinned(self, tensor):
        """True when all of `tensor`'s bytes lie in an open pinned buffer of this worker."""
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"is_pinned needs a torch.Tensor, got {type(tensor).__name__}")
        if tensor.device.type != "cpu":
            return False
        owner = _pinstage._pinned_owner(tensor.data_ptr(),
                                        tensor.numel() * tensor.element_size())
        return owner is self._worker

    def __repr__(self):
        return f"PinnedTorchAllocator({self._worker!r})"
