"""What finalize()'s refusal says about the live views of a buffer: the dtype and shape of
the torch tensors and NumPy arrays over its memory (python/src/dlpack.cpp,
describe_live_tensors). Runs only on the refusal's path: it walks the garbage collector's
objects, which is slow on a large heap but finds a stray loop variable that holds a view."""
import gc
import sys
import warnings

_MAX_LISTED = 6


def _span(obj):
    """(address, bytes) of a torch tensor's or NumPy array's data, or None."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(obj, torch.Tensor):
        if obj.layout != torch.strided:
            return None
        return obj.data_ptr(), obj.numel() * obj.element_size()
    np = sys.modules.get("numpy")
    if np is not None and isinstance(obj, np.ndarray):
        return obj.__array_interface__["data"][0], obj.nbytes
    return None


def _spelling(obj):
    dtype = str(obj.dtype).replace("torch.", "")
    return f"{dtype} [{', '.join(str(d) for d in obj.shape)}]"


def describe(address, nbytes):
    """'bfloat16 [16, 5120], uint8 [4096]': the distinct dtypes and shapes of the live
    tensors and arrays whose bytes lie in [address, address + nbytes); '' when none."""
    end = address + nbytes
    found = []
    with warnings.catch_warnings():  # isinstance() on some module proxies warns (torch's
        warnings.simplefilter("ignore")  # deprecated torch.distributed.reduce_op)
        for obj in gc.get_objects():
            try:
                span = _span(obj)
            except Exception:  # an object torch or NumPy cannot describe: not a view we know
                continue
            if span is not None and span[1] > 0 and address <= span[0] < end:
                found.append(obj)
    # A view keeps the tensor it was made from (torch's _base, NumPy's base): name the
    # view the caller holds, not the flat bytes it came from.
    bases = {id(b) for b in (getattr(o, "_base", None) if not hasattr(o, "__array_interface__")
                             else getattr(o, "base", None) for o in found) if b is not None}
    seen = []
    for obj in found:
        spelling = _spelling(obj)
        if id(obj) not in bases and spelling not in seen:
            seen.append(spelling)
    listed = seen[:_MAX_LISTED]
    if len(seen) > _MAX_LISTED:
        listed.append(f"and {len(seen) - _MAX_LISTED} more")
    return ", ".join(listed)
