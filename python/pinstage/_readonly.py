"""ReadOnlyTensor: a map-mode tensor that no torch path can write through (issue 47).

A map-mode tensor views a checkpoint file's page cache, mapped PROT_READ, so a write
through it is SIGSEGV, and torch has no read-only tensors of its own. ReadOnlyTensor is a
traceable tensor subclass in the pattern of DTensor: it holds the plain tensor over the
mapping (`_elem`), and every aten op on it reaches __torch_dispatch__ after torch has
resolved keyword arguments, overloads, foreach lists, `out=` and `inplace=` flags. An op
whose schema marks an argument written (`Tensor(a!)`) is refused when that argument holds
a ReadOnlyTensor; a result that aliases the mapping comes back as a ReadOnlyTensor, a
result in new memory as a plain tensor.

The torch entry points outside the dispatcher are handled in __torch_function__:
data_ptr() (the mapping's address, to read), numpy() and __array__ (non-writable
arrays), __dlpack__ (a read-only capsule, or a copy where the consumer ignores the flag),
`.data =`, storage access (refused on torch 1.13), pickling, torch.save and deepcopy
(plain copies). What no Python hook sees (`plain.data = t`, torch.utils.dlpack.to_dlpack)
takes the outer tensor's own memory, which on torch 2.x sits under a storage flagged to
raise on any write (_shadow_of). docs/loading.md, "Modes", lists every path.
"""
import sys

import torch

from ._pinstage import ReadOnlyError

# What torch.Tensor.__torch_function__ runs an op under, without converting its results
# to the subclass (torch 1.13 has only the wider DisableTorchFunction).
_NO_TORCH_FUNCTION = getattr(torch._C, "DisableTorchFunctionSubclass", torch._C.DisableTorchFunction)

_HINT = ("a read-only view of a mapped checkpoint (mode='map'); clone() it for a writable "
         "copy, or load with mode='copy'")


def _refusal(what):
    return ReadOnlyError(f"{what}: the tensor is {_HINT}")


def _holds_mapped(value):
    if isinstance(value, (list, tuple)):
        return any(isinstance(v, ReadOnlyTensor) for v in value)
    return isinstance(value, ReadOnlyTensor)


class _Op:
    """What the schema of one aten overload says, read once: the arguments it writes
    (`Tensor(a!)`), those that may alias a result (`Tensor(a)`), each result's alias set."""

    __slots__ = ("written", "aliasing", "returns", "rebinds")

    def __init__(self, func):
        schema = func._schema
        args = list(enumerate(schema.arguments))
        self.written = tuple((i, a.name) for i, a in args
                             if a.alias_info is not None and a.alias_info.is_write)
        # A list result (split, unbind: `Tensor(a -> *) self -> Tensor(a)[]`) has an empty
        # alias set of its own; the argument's `*` says its items may alias it.
        self.aliasing = tuple(
            (i, a.name, frozenset(a.alias_info.before_set) | frozenset(a.alias_info.after_set))
            for i, a in args if a.alias_info is not None)
        self.returns = tuple(
            (frozenset(r.alias_info.before_set) or frozenset("*")) if r.alias_info else frozenset()
            for r in schema.returns)
        # set_ makes its (written) self share another tensor's memory; _unsafe_view returns
        # a view its schema does not mark.
        packet = func.overloadpacket
        self.rebinds = packet is torch.ops.aten.set_
        if packet is torch.ops.aten._unsafe_view:
            self.aliasing = ((0, "self", frozenset({"unsafe"})),)
            self.returns = (frozenset({"unsafe"}),)


_OPS = {}


def _value(args, kwargs, index, name):
    return args[index] if index < len(args) else kwargs.get(name)


def _refuse_writes(func, op, args, kwargs):
    """ReadOnlyError when `func` writes a mapped argument, or (set_) makes a tensor share
    a mapped one's memory."""
    for index, name in op.written:
        if _holds_mapped(_value(args, kwargs, index, name)):
            raise _refusal(f"{func} writes its argument {name!r}")
    if op.rebinds and any(_holds_mapped(v) for v in (*args, *kwargs.values())):
        raise _refusal(f"{func} would give a plain tensor the mapping's memory")


def _span(t):
    """[start, end) of `t`'s storage: (0, 0) for fake tensors under torch.compile (the
    schema's alias sets say it all there) and for a storage without bytes."""
    if type(t) is not torch.Tensor:
        return 0, 0
    storage = t.untyped_storage() if hasattr(t, "untyped_storage") else t.storage()
    start = storage.data_ptr()
    return (start, start + storage.nbytes()) if start else (0, 0)


def _wrap_views(op, args, kwargs, out):
    """`out` with each result that aliases a mapped argument wrapped: by the schema's
    alias sets, and in eager mode by the storage it shares with one."""
    mapped_sets = set()
    for index, name, sets in op.aliasing:
        if _holds_mapped(_value(args, kwargs, index, name)):
            mapped_sets |= sets
    mapped = [(v._span, v._shadow) for v in (*args, *kwargs.values())
              if isinstance(v, ReadOnlyTensor) and v._span[0]]

    def wrap(result, aliased):
        if isinstance(result, (list, tuple)):
            return type(result)(wrap(r, aliased) for r in result)
        if not isinstance(result, torch.Tensor) or isinstance(result, ReadOnlyTensor):
            return result
        # A result whose first byte lies in a mapping shares it (new memory cannot).
        at = result.data_ptr() if type(result) is torch.Tensor else 0
        shadow = next((sh for (lo, hi), sh in mapped if lo <= at < hi), False)
        if aliased or shadow is not False:
            return ReadOnlyTensor(result, shadow=shadow or None)
        return result

    if len(op.returns) == 1:
        return wrap(out, bool(op.returns[0] & mapped_sets))
    if isinstance(out, tuple):
        return tuple(wrap(r, bool(sets & mapped_sets)) for r, sets in zip(out, op.returns))
    return out


# torch 2.x: a storage flag that makes every mutable access of its memory raise.
_THROW_ON_WRITE = getattr(torch._C, "_set_throw_on_mutable_data_ptr", None)


def _shadow_of(elem):
    """torch 2.x: a second storage over the bytes of `elem`'s whole storage (a DLPack import
    of it, which keeps `elem`'s alive), flagged so that any write through it raises. The
    outer tensor sits on it, so torch code outside the dispatcher that takes the outer
    tensor's memory (`plain.data = t`, to_dlpack) reads the file's bytes and cannot write
    them. None on torch 1.13, which has no such flag (the outer tensor shares `elem`'s
    storage), and for a tensor without bytes."""
    if _THROW_ON_WRITE is None or not _span(elem)[0]:
        return None
    shadow = torch.from_dlpack(torch.empty(0, dtype=torch.uint8).set_(elem.untyped_storage()))
    _THROW_ON_WRITE(shadow)
    return shadow.untyped_storage()


def _outer_base(elem, shadow):
    if shadow is None:
        return elem
    return torch.empty(0, dtype=elem.dtype).set_(shadow, elem.storage_offset(), elem.size(),
                                                 elem.stride())


def _unwrap(value):
    if isinstance(value, ReadOnlyTensor):
        return value._elem
    if isinstance(value, (list, tuple)) and any(isinstance(v, ReadOnlyTensor) for v in value):
        return type(value)(_unwrap(v) for v in value)
    return value


class ReadOnlyTensor(torch.Tensor):
    """A torch tensor of a map-mode load: a view of a checkpoint file's page cache, pinned
    in place and mapped read-only. Every op that would write it (in place, out=,
    inplace=True, foreach, optimizers, nn.init, set_, storage writes) raises
    ReadOnlyError; views of it (t[0], t.view(...), t.detach()) are ReadOnlyTensors too;
    results in new memory (t + 1, t.clone(), t.to(torch.float32)) are plain tensors.
    clone() gives a writable copy; numpy() and np.asarray() give non-writable arrays;
    torch.save, pickle and copy.deepcopy give plain tensors with the same bytes."""

    @staticmethod
    def __new__(cls, elem, requires_grad=False, shadow=None):
        if isinstance(elem, ReadOnlyTensor):
            elem = elem._elem
        if type(elem) is torch.Tensor:  # `shadow`: a view's, its base's (_shadow_of)
            shadow = _shadow_of(elem) if shadow is None else shadow
            out = torch.Tensor._make_subclass(cls, _outer_base(elem, shadow), requires_grad)
        else:  # torch.compile's fake or functional inner tensor: a wrapper, as DTensor
            out = torch.Tensor._make_wrapper_subclass(
                cls, elem.size(), strides=elem.stride(), storage_offset=elem.storage_offset(),
                dtype=elem.dtype, layout=elem.layout, device=elem.device,
                requires_grad=requires_grad)
        out._elem = elem
        out._span = _span(elem)  # the memory its views share (_wrap_views)
        out._shadow = shadow
        return out

    def __init__(self, elem, requires_grad=False, shadow=None):
        super().__init__()

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        op = _OPS.get(func)
        if op is None:
            op = _OPS[func] = _Op(func)
        _refuse_writes(func, op, args, kwargs)
        out = func(*[_unwrap(a) for a in args], **{k: _unwrap(v) for k, v in kwargs.items()})
        return _wrap_views(op, args, kwargs, out)

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        special = _SPECIAL.get(func)
        if special is not None:
            return special(*args, **(kwargs or {}))
        with _NO_TORCH_FUNCTION():
            return func(*args, **(kwargs or {}))

    def __array__(self, dtype=None, copy=None):  # NumPy 2 passes copy=, torch's takes none
        return _array(self, dtype, copy)

    # torch.compile traces the inner tensor (torch 2.x; torch 1.13 never calls these).
    def __tensor_flatten__(self):
        return ["_elem"], None

    @staticmethod
    def __tensor_unflatten__(inner_tensors, ctx, outer_size, outer_stride):
        return ReadOnlyTensor(inner_tensors["_elem"])

    def _stable_hash_for_caching(self):
        """AOT autograd's cache key: all a ReadOnlyTensor has is its inner tensor's layout."""
        return (f"pinstage.ReadOnlyTensor {self.dtype} {tuple(self.shape)} {self.stride()} "
                f"{self.storage_offset()} {self.device} {self.requires_grad}")


def _data_ptr(self):
    return self._elem.data_ptr()


def _numpy(self, *, force=False):
    """A non-writable array over the mapping (NumPy refuses to make it writable again:
    its base is a torch tensor)."""
    array = self._elem.numpy(force=True) if force else self._elem.numpy()
    array.flags.writeable = False
    return array


def _array(self, dtype=None, copy=None):
    array = _numpy(self)
    if copy or (dtype is not None and array.dtype != dtype):
        return array.astype(dtype or array.dtype)  # a copy: writable, as NumPy's are
    return array


def _tolist(self):
    return self._elem.tolist()


def _repr(self, *, tensor_contents=None):
    text = repr(self._elem)
    if self.requires_grad:
        text = text[:-1] + ", requires_grad=True)"
    return "ReadOnlyTensor" + text[len("tensor"):] if text.startswith("tensor") else text


def _plain_copy(self):
    copy = self._elem.clone()
    if getattr(self, "_is_param", False):
        return torch.nn.Parameter(copy, self.requires_grad)
    return copy.requires_grad_(self.requires_grad)


def _reduce_ex(self, protocol):
    # A plain copy: what the pickle holds is then ordinary memory, and the load (torch's
    # default weights_only one included) gives a writable tensor of the same bytes.
    return _plain_copy(self).__reduce_ex__(protocol)


def _deepcopy(self, memo):
    if id(self) in memo:
        return memo[id(self)]
    copy = _plain_copy(self)
    if self.grad is not None:
        import copy as copy_module
        copy.grad = copy_module.deepcopy(self.grad, memo)
    memo[id(self)] = copy
    return copy


def _torch_consumer():
    """True when __dlpack__ was called by torch's own from_dlpack, which ignores DLPack's
    read-only flag (torch has no read-only tensors)."""
    frame = sys._getframe(1)
    skip = {__name__, "torch.overrides", "torch._tensor"}
    while frame is not None and frame.f_globals.get("__name__") in skip:
        frame = frame.f_back
    return frame is not None and frame.f_globals.get("__name__", "").startswith("torch.")


def _torch_exports_read_only():
    import inspect
    try:
        return "read_only" in inspect.signature(torch.Tensor.__dlpack__).parameters
    except (TypeError, ValueError):
        return False


_READ_ONLY_EXPORT = _torch_exports_read_only()


def _dlpack(self, stream=None, *, max_version=None, dl_device=None, copy=None, read_only=None):
    """A DLPack capsule: versioned and flagged read-only (DLPack 1.0) for a consumer that
    asks for a versioned one, zero-copy; else a copy of the bytes, never the mapping
    writable (a legacy capsule cannot say read-only, and torch.from_dlpack ignores the
    flag). copy=False where only a copy would do is refused."""
    versioned = max_version is not None and tuple(max_version) >= (1, 0)
    share = versioned and _READ_ONLY_EXPORT and not copy and not _torch_consumer()
    kwargs = {} if stream is None else {"stream": stream}
    if max_version is not None:
        kwargs["max_version"] = max_version
    if dl_device is not None:
        kwargs["dl_device"] = dl_device
    if share:
        return self._elem.__dlpack__(read_only=True, **kwargs)
    if copy is False:
        raise _refusal("__dlpack__(copy=False): this consumer cannot take a read-only "
                       "capsule, so only a copy can be exported")
    return self._elem.clone().__dlpack__(**kwargs)


def _refuse_storage(name):
    def refuse(self, *args, **kwargs):
        if not self._span[0]:  # no bytes (an empty tensor): nothing to write
            return getattr(self._elem, name)(*args, **kwargs)
        raise _refusal(f"{name}() would hand out the mapping's memory unguarded (a storage "
                       "or plain tensor over it)")
    return refuse


_OWN = ("_elem", "_span", "_shadow")  # a ReadOnlyTensor's attributes (a plain one has none)


def _set_data(self, value):
    """`t.data = value`. Another mapped tensor: t views its bytes. A tensor in memory of
    its own (what module.to(torch.float32) assigns): t becomes that plain, writable
    tensor, a Parameter still if it was one."""
    if isinstance(value, ReadOnlyTensor):
        with _NO_TORCH_FUNCTION():
            self.data = value
        self._elem, self._span, self._shadow = value._elem, value._span, value._shadow
        return
    requires_grad = self.requires_grad
    swap = getattr(torch.utils, "swap_tensors", None)
    if swap is not None:
        attributes = {k: v for k, v in self.__dict__.items() if k not in _OWN}
        swap(self, value.detach())  # self is now a plain tensor over value's memory
        self.__dict__.update(attributes)  # _is_param: still a Parameter
    else:  # torch 1.13: the tensor keeps torch's Python dispatch key, served by torch.Tensor
        with _NO_TORCH_FUNCTION():
            self.data = value
        for name in _OWN:
            delattr(self, name)
        self.__class__ = torch.Tensor
    self.requires_grad_(requires_grad)


def _specials():
    table = {
        torch.Tensor.data_ptr: _data_ptr,
        torch.Tensor.numpy: _numpy,
        torch.Tensor.__array__: _array,
        torch.Tensor.tolist: _tolist,
        torch.Tensor.__repr__: _repr,
        torch.Tensor.__reduce_ex__: _reduce_ex,
        torch.Tensor.__deepcopy__: _deepcopy,
        torch.Tensor.__dlpack__: _dlpack,
        torch.Tensor.data.__set__: _set_data,
    }
    # torch 2.x: the outer tensor's storage is the flagged one (_shadow_of), whose every
    # write raises, and torch.compile reads it; torch 1.13 refuses to hand it out.
    names = ["share_memory_"] + (["storage", "_storage"] if _THROW_ON_WRITE is None else [])
    for name in names:
        if hasattr(torch.Tensor, name):
            table[getattr(torch.Tensor, name)] = _refuse_storage(name)
    return table


_SPECIAL = _specials()
