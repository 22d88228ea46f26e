"""Worker.to_device / Worker.to_host: one tensor through the worker's pinned pool, as
torch's tensor.to(device, non_blocking=...) does through its own (docs/python.md, "One
tensor to the device and back").

to_device copies the tensor into pinned memory (unless it is there already), queues the
upload into a fresh DeviceBuffer and returns the device tensor: a torch tensor on the
device's DLPack device (the CPU on sim, whose device memory is host RAM), zero-copy over
the DeviceBuffer, which it keeps alive. to_host queues the download into a fresh pinned
tensor. With non_blocking=True both return a PendingTensor at once; its wait() gives the
tensor. torch is imported on first use only."""
import math

from ._pinstage import InvalidArgumentError, Worker


class PendingTensor:
    """A copy queued by to_device or to_host(non_blocking=True). wait() blocks until it is
    complete and returns the tensor (the same one each time); done says whether it is."""

    __slots__ = ("_event", "_make", "_tensor")

    def __init__(self, event, make):
        self._event = event
        self._make = make
        self._tensor = None

    @property
    def done(self):
        """True once the copy is complete (wait() then returns at once)."""
        return self._tensor is not None or self._event.query()

    def wait(self):
        """Blocks (GIL released) until the copy is complete; returns the tensor."""
        if self._tensor is None:
            self._event.wait()
            self._tensor = self._make()
            self._event = self._make = None
        return self._tensor

    def __repr__(self):
        return f"<pinstage.PendingTensor {'done' if self.done else 'pending'}>"


def _torch():
    import torch
    return torch


def _host_tensor(value, who):
    """`value` as a dense contiguous CPU torch tensor: a torch tensor, or a NumPy array
    (shared, not copied, by torch.from_numpy)."""
    torch = _torch()
    if not isinstance(value, torch.Tensor):
        import sys
        np = sys.modules.get("numpy")
        if np is None or not isinstance(value, np.ndarray):
            raise TypeError(f"{who}: expected a torch.Tensor or a numpy.ndarray, "
                            f"not {type(value).__name__}")
        value = torch.from_numpy(value)
    if value.device.type != "cpu" or value.layout != torch.strided:
        raise InvalidArgumentError(f"{who}: the tensor must be a dense CPU tensor, got one on "
                                   f"{value.device} ({value.layout})")
    return value.contiguous()


def to_device(self, tensor, non_blocking=False):
    """to_device(tensor, non_blocking=False) -> torch.Tensor | PendingTensor

    `tensor` (a CPU torch tensor or NumPy array) on this worker's device: staged through
    pinned memory, uploaded into a new DeviceBuffer, returned as a torch tensor of the same
    dtype and shape over it (zero-copy; on sim a CPU tensor). non_blocking=True returns a
    PendingTensor at once (wait() gives the tensor)."""
    from .torch_alloc import PinnedTorchAllocator, _check_dtype
    who = "Worker.to_device"
    host = _host_tensor(tensor, who)
    _check_dtype(host.dtype, who)  # named as this call, not the allocator it uses
    if self.initialized:  # refused before anything is copied (acl: torch cannot import it)
        self._require_torch_device(who)
    alloc = PinnedTorchAllocator(self)
    pinned = host if alloc.is_pinned(host) else alloc.copy(host)
    nbytes = host.numel() * host.element_size()
    device = self.alloc_device(max(nbytes, 1))
    event = self.copy_to_device_async(device, pinned)
    dtype, shape = host.dtype, tuple(host.shape)
    pending = PendingTensor(event, lambda: device.as_tensor(dtype, shape))
    return pending if non_blocking else pending.wait()


def to_host(self, tensor, non_blocking=False):
    """to_host(tensor, non_blocking=False) -> torch.Tensor | PendingTensor

    A device tensor of this worker (from to_device, DeviceBuffer.as_tensor or
    DeviceLoad.tensor) copied into a new tensor in pinned memory: a CPU torch tensor of the
    same dtype and shape (tensor.numpy() shares it with NumPy). non_blocking=True returns a
    PendingTensor at once (a DeviceLoad tensor's copy is done before it returns)."""
    from .torch_alloc import PinnedTorchAllocator, _check_dtype
    torch = _torch()
    who = "Worker.to_host"
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{who}: expected a torch.Tensor, not {type(tensor).__name__}")
    _check_dtype(tensor.dtype, who)
    if not tensor.is_contiguous():
        raise InvalidArgumentError(f"{who}: the device tensor is not contiguous "
                                   f"(strides {tensor.stride()})")
    host = PinnedTorchAllocator(self).empty(tuple(tensor.shape), dtype=tensor.dtype)
    nbytes = math.prod(tensor.shape) * tensor.element_size()
    if nbytes == 0:
        return PendingTensor(_Done(), lambda: host) if non_blocking else host
    event = self._download(tensor.data_ptr(), nbytes, host)
    pending = PendingTensor(event or _Done(), lambda: host)
    return pending if non_blocking else pending.wait()


class _Done:
    """The event of a copy already complete."""

    def wait(self):
        return None

    def query(self):
        return True


Worker.to_device = to_device
Worker.to_host = to_host
