"""The child process of test_readonly47: every way found to write through a map-mode
tensor, one group per run. Usage: readonly47_paths.py GROUP CHECKPOINT.

Each path tries to write the mapping (PROT_READ: a write that gets through is SIGSEGV,
which kills this process). Before a path it prints `start NAME`, after it
`path NAME<tab>EXPECTED<tab>GOT`, and `done` at the end, so the parent names the path that
crashed and compares each outcome. Outcomes: `refused` (ReadOnlyError), `flagged` (torch
2.x's storage flag raised: what the outer tensor's own memory does on a write, see
_readonly._outer_base), `copy` (the path gave a plain copy, checked and written),
`readonly_array` (a non-writable NumPy view of the mapping), `guarded` (a ReadOnlyTensor
came back and refused the write), or an exception's type and message."""
import copy as copy_module
import io
import pickle
import sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

import pinstage

TORCH2 = int(torch.__version__.split(".")[0]) >= 2
NUMPY2 = int(np.__version__.split(".")[0]) >= 2
# torch 2.x: the outer tensor's storage raises on a write; torch 1.13 refuses storage().
FLAGGED = "flagged" if TORCH2 else "refused"


class Ctx:
    """The mapped tensors (`t`: float32 [4, 4], `i`: int32 [8]), their copy-mode twins,
    and plain operands."""

    def __init__(self, path):
        self.worker = pinstage.Worker()
        self.path = path
        self.mapped = pinstage.load_file(path, worker=self.worker, mode="map")
        self.ref = {k: v.clone() for k, v in pinstage.load_file(path, worker=self.worker).items()}
        self.t, self.i = self.mapped["w"], self.mapped["i"]
        self.x = torch.rand(4, 4)

    def unchanged(self):
        return all(torch.equal(self.mapped[k], self.ref[k]) for k in self.ref)


def plain_copy(ctx, got, want=None):
    """`got` is a plain tensor in memory of its own with `want`'s bytes (default the
    mapped `t`), and writable."""
    want = ctx.ref["w"] if want is None else want
    assert isinstance(got, torch.Tensor) and not isinstance(got, pinstage.ReadOnlyTensor), type(got)
    assert torch.equal(got.detach(), want), "not the same bytes"
    assert got.data_ptr() != ctx.t.data_ptr(), "shares the mapping"
    with torch.no_grad():
        got.add_(1)
    return "copy"


def guarded(view):
    """A ReadOnlyTensor came back; its write must be refused."""
    assert isinstance(view, pinstage.ReadOnlyTensor), type(view)
    try:
        with torch.no_grad():
            view.zero_()
    except pinstage.ReadOnlyError:
        return "guarded"
    return "written"


def readonly_array(ctx, array):
    """A non-writable NumPy view of the mapping that cannot be made writable."""
    assert array.__array_interface__["data"][0] == ctx.t.data_ptr(), "not a view of the mapping"
    assert not array.flags.writeable
    for attempt in (lambda: setattr(array.flags, "writeable", True),
                    lambda: array.setflags(write=True), lambda: array.fill(0)):
        try:
            attempt()
        except ValueError:
            continue
        return "writable"
    return "readonly_array"


def _iop(tensor, op):
    """tensor OP= 1 (the augmented assignment, not the method)."""
    namespace = {"a": tensor}
    exec(f"a {op}= 1", namespace)


def inplace_paths(c):
    t, i, x = c.t, c.i, c.x
    idx = torch.tensor([0])
    paths = [(f"t.{m}()", lambda m=m: getattr(t, m)()) for m in (
        "zero_", "uniform_", "normal_", "random_", "bernoulli_", "exponential_", "cauchy_",
        "log_normal_", "abs_", "neg_", "exp_", "sqrt_", "sigmoid_", "tanh_", "floor_",
        "round_", "sign_", "t_", "squeeze_")]
    paths += [
        ("t.add_(1)", lambda: t.add_(1)), ("t.fill_(0)", lambda: t.fill_(0)),
        ("t.geometric_(.5)", lambda: t.geometric_(.5)),
        ("t.copy_(x)", lambda: t.copy_(x)), ("t.mul_(2)", lambda: t.mul_(2)),
        ("t.clamp_(0, 1)", lambda: t.clamp_(0, 1)), ("t.lerp_(x, .5)", lambda: t.lerp_(x, .5)),
        ("t.addmm_(x, x)", lambda: t.addmm_(x, x)), ("t.addcmul_(x, x)", lambda: t.addcmul_(x, x)),
        ("t.index_put_", lambda: t.index_put_((idx,), torch.tensor(1.))),
        ("t.index_fill_", lambda: t.index_fill_(0, idx, 1.)),
        ("t.index_copy_", lambda: t.index_copy_(0, idx, x[:1])),
        ("t.index_add_", lambda: t.index_add_(0, idx, x[:1])),
        ("t.masked_fill_", lambda: t.masked_fill_(x > .5, 0.)),
        ("t.masked_scatter_", lambda: t.masked_scatter_(x > .5, x)),
        ("t.scatter_", lambda: t.scatter_(0, idx.view(1, 1), 1.)),
        ("t.scatter_add_", lambda: t.scatter_add_(0, idx.view(1, 1), x[:1, :1])),
        ("t.put_", lambda: t.put_(idx, torch.tensor([1.]))),
        ("t.resize_(2)", lambda: t.resize_(2)), ("t.resize_as_", lambda: t.resize_as_(x[:2])),
        ("t.set_()", lambda: t.set_()), ("t.set_(x)", lambda: t.set_(x)),
        ("t.transpose_", lambda: t.transpose_(0, 1)),
        ("t.as_strided_", lambda: t.as_strided_((2,), (1,))),
        ("t[0] = 1", lambda: t.__setitem__(0, 1.)), ("t[...] = 0", lambda: t.__setitem__(..., 0.)),
        ("t[t > 3] = 0", lambda: t.__setitem__(t > 3, 0.)),
        ("t[:, 1] = x[:, 1]", lambda: t.__setitem__((slice(None), 1), x[:, 1])),
        ("t[[0, 1]] = 2", lambda: t.__setitem__([0, 1], 2.)),
    ]
    paths += [(f"t {op}= 1", lambda op=op: _iop(t, op)) for op in ("+", "-", "*", "/", "**",
                                                                   "//", "%")]
    paths += [(f"i {op}= 1", lambda op=op: _iop(i, op)) for op in ("|", "&", "^", "<<", ">>")]
    return paths + out_paths(c) + aten_paths(c)


def out_paths(c):
    t, x = c.t, c.x
    index = torch.empty(4, 4, dtype=torch.long)
    return [
        ("torch.add(x, 1, out=t)", lambda: torch.add(x, 1, out=t)),
        ("torch.mul(t, 2, out=t)", lambda: torch.mul(t, 2, out=t)),
        ("torch.matmul(x, x, out=t)", lambda: torch.matmul(x, x, out=t)),
        ("torch.sort(out=(t, idx))", lambda: torch.sort(x, out=(t, index))),
        ("torch.max(out=(t[0], idx))", lambda: torch.max(x, 1, out=(t[0], index[0]))),
        ("torch.index_select(out=t)",
         lambda: torch.index_select(x, 0, torch.arange(4), out=t)),
        ("torch.cat(out=t)", lambda: torch.cat([x[:2], x[2:]], out=t)),
        ("torch.clamp(out=t)", lambda: torch.clamp(x, 0, 1, out=t)),
        ("torch.where(out=t)", lambda: torch.where(x > 0, x, x, out=t)),
        ("F.normalize(out=t)", lambda: F.normalize(x, out=t)),
        ("torch.randn(out=t)", lambda: torch.randn(4, 4, out=t)),
        ("torch.zeros(out=t)", lambda: torch.zeros(4, 4, out=t)),
        ("torch.arange(out=t.view(-1))", lambda: torch.arange(16., out=t.view(-1))),
        ("torch.Tensor.add_(t, 1)", lambda: torch.Tensor.add_(t, 1)),
        ("torch.Tensor.copy_(t, x)", lambda: torch.Tensor.copy_(t, x)),
        ("torch.Tensor.__setitem__", lambda: torch.Tensor.__setitem__(t, 0, 1.)),
        ("torch.Tensor.__iadd__", lambda: torch.Tensor.__iadd__(t, 1)),
        ("no_grad: t.add_(1)", lambda: _under(torch.no_grad(), t.add_)),
        ("inference_mode: t.add_(1)", lambda: _under(torch.inference_mode(), t.add_)),
    ]


def _under(context, fn):
    with context:
        fn(1)


def aten_paths(c):
    t, x = c.t, c.x
    aten = torch.ops.aten
    return [
        ("aten.add_.Tensor", lambda: aten.add_.Tensor(t, x)),
        ("aten.fill_.Scalar", lambda: aten.fill_.Scalar(t, 0)),
        ("aten.copy_.default", lambda: aten.copy_.default(t, x)),
        ("aten.add.out", lambda: aten.add.out(x, x, out=t)),
        ("aten.zero_ (packet)", lambda: aten.zero_(t)),
        ("aten.index_put_.default",
         lambda: aten.index_put_.default(t, [torch.tensor([0])], torch.tensor(1.))),
        ("aten.set_.source_Tensor(plain, t)",
         lambda: aten.set_.source_Tensor(torch.empty(0), t)),
    ]


def functional_paths(c):
    t = c.t
    flags = [("F.relu", lambda: F.relu(t, inplace=True)), ("F.relu_", lambda: F.relu_(t)),
             ("torch.relu_", lambda: torch.relu_(t)),
             ("nn.ReLU(inplace=True)", lambda: nn.ReLU(inplace=True)(t)),
             ("F.dropout", lambda: F.dropout(t, 0.5, True, inplace=True)),
             ("F.alpha_dropout", lambda: F.alpha_dropout(t, 0.5, True, inplace=True)),
             ("F.dropout2d", lambda: F.dropout2d(t.view(1, 1, 4, 4), 0.5, True, True))]
    flags += [(f"F.{n}(inplace=True)", lambda n=n: getattr(F, n)(t, inplace=True)) for n in (
        "hardtanh", "elu", "leaky_relu", "silu", "relu6", "selu", "celu", "rrelu",
        "hardsigmoid", "hardswish", "mish")]
    flags += [("F.threshold", lambda: F.threshold(t, 0.5, 0., inplace=True))]
    init = [(f"nn.init.{n}(tensor=t)", lambda n=n: getattr(nn.init, n)(tensor=t)) for n in (
        "uniform_", "normal_", "kaiming_uniform_", "kaiming_normal_", "xavier_uniform_",
        "xavier_normal_", "zeros_", "ones_", "eye_", "orthogonal_", "trunc_normal_")]
    init += [("nn.init.constant_", lambda: nn.init.constant_(t, 1.)),
             ("nn.init.sparse_", lambda: nn.init.sparse_(t, 0.5)),
             ("nn.init.dirac_", lambda: nn.init.dirac_(t.view(2, 2, 2, 2)))]
    return flags + init + foreach_paths(c) + optimizer_paths(c)


def foreach_paths(c):
    t, x = c.t, c.x
    before = c.x.clone()

    def mixed():  # a plain first entry is left alone: refused before anything is written
        try:
            torch._foreach_mul_([x, t], 2)
        finally:
            assert torch.equal(x, before), "the plain tensor was written"

    paths = [("_foreach_add_([t], 1)", lambda: torch._foreach_add_([t], 1)),
             ("_foreach_zero_([t])", lambda: torch._foreach_zero_([t])),
             ("_foreach_mul_([x, t], 2)", mixed),
             ("_foreach_addcmul_", lambda: torch._foreach_addcmul_([t], [x], [x]))]
    if hasattr(torch, "_foreach_lerp_"):  # torch 2.x
        paths.append(("_foreach_lerp_", lambda: torch._foreach_lerp_([t], [x], 0.5)))
    return paths


def _param(c):
    p = c.t.detach().requires_grad_()
    p.grad = torch.ones(4, 4)
    return p


def _map_linear(c):
    lin = nn.Linear(4, 4, bias=False)
    if TORCH2:
        lin.load_state_dict({"weight": c.t}, assign=True)
    else:  # torch 1.13 has no assign=
        lin.weight = nn.Parameter(c.t)
    assert isinstance(lin.weight, pinstage.ReadOnlyTensor)
    return lin


def _train_step(c):
    lin = _map_linear(c)
    lin(c.x).sum().backward()
    torch.optim.SGD(lin.parameters(), lr=0.1, foreach=True).step()


def optimizer_paths(c):
    optim = torch.optim
    paths = [(f"{name}({kw}).step()", lambda cls=cls, kw=kw: cls([_param(c)], lr=0.1, **kw).step())
             for name, cls, kw in (
                 ("SGD", optim.SGD, {"foreach": True}), ("SGD", optim.SGD, {"foreach": False}),
                 ("SGD", optim.SGD, {"momentum": 0.9}), ("Adam", optim.Adam, {"foreach": True}),
                 ("Adam", optim.Adam, {"foreach": False}), ("AdamW", optim.AdamW, {}),
                 ("RMSprop", optim.RMSprop, {}), ("Adagrad", optim.Adagrad, {}))]
    paths += [("module forward+backward+SGD.step", lambda: _train_step(c)),
              ("module.weight.data.add_", lambda: _map_linear(c).weight.data.add_(1)),
              ("module.reset_parameters", lambda: _map_linear(c).reset_parameters())]
    return paths


def alias_paths(c):
    t = c.t
    views = [("t.view(-1)", lambda: t.view(-1)), ("t[0]", lambda: t[0]), ("t.T", lambda: t.T),
             ("t.detach()", lambda: t.detach()), ("t.data", lambda: t.data),
             ("t.reshape(-1)", lambda: t.reshape(-1)), ("t.flatten()", lambda: t.flatten()),
             ("torch.narrow(input=t)",
              lambda: torch.narrow(input=t, dim=0, start=0, length=1)),
             ("torch.reshape(input=t)", lambda: torch.reshape(input=t, shape=(-1,))),
             ("torch.detach(input=t)", lambda: torch.detach(input=t)),
             ("torch.Tensor.view(t, -1)", lambda: torch.Tensor.view(t, -1)),
             ("t.unbind(0)[0]", lambda: t.unbind(0)[0]), ("t.split(1)[0]", lambda: t.split(1)[0]),
             ("t.chunk(2)[1]", lambda: t.chunk(2)[1]),
             ("t.as_strided", lambda: t.as_strided((2,), (1,))),
             ("t.contiguous()", lambda: t.contiguous()), ("t.cpu()", lambda: t.cpu()),
             ("t.to('cpu')", lambda: t.to("cpu")), ("t.to(float32)", lambda: t.to(torch.float32)),
             ("t.view_as(t)", lambda: t.view_as(t)), ("t.unsqueeze(0)", lambda: t.unsqueeze(0)),
             ("t.permute(1, 0)", lambda: t.permute(1, 0)), ("t.movedim", lambda: t.movedim(0, 1)),
             ("t.diagonal()", lambda: t.diagonal()), ("t.select(0, 0)", lambda: t.select(0, 0)),
             ("t.unfold(0, 2, 2)", lambda: t.unfold(0, 2, 2)),
             ("t.view(int32)", lambda: t.view(torch.int32)), ("t.real", lambda: t.real),
             ("t.resolve_conj()", lambda: t.resolve_conj()),
             ("torch.as_tensor(t)", lambda: torch.as_tensor(t)),
             ("torch.asarray(t)", lambda: torch.asarray(t)),
             ("aten.alias", lambda: torch.ops.aten.alias.default(t)),
             ("aten.view", lambda: torch.ops.aten.view.default(t, [-1])),
             ("aten._unsafe_view", lambda: torch.ops.aten._unsafe_view.default(t, [16])),
             ("nn.Parameter(t)", lambda: nn.Parameter(t)),
             ("nn.Parameter(t).data", lambda: nn.Parameter(t).data),
             ("list(t)[0]", lambda: list(t)[0])]
    views.append(("an op whose schema does not mark its view", lambda: _unmarked_view(t)))
    paths = [(name, lambda make=make: guarded(make())) for name, make in views]
    # torch 1.13 refuses to make a second Python object for the tensor; 2.x hands back
    # the ReadOnlyTensor itself
    subclass = "guarded" if TORCH2 else "RuntimeError: Creating a new Tensor subclass*"
    paths += [("t.as_subclass(torch.Tensor)",
               lambda: guarded(t.as_subclass(torch.Tensor)), subclass),
              ("Tensor._make_subclass",
               lambda: guarded(torch.Tensor._make_subclass(torch.Tensor, t)), subclass)]
    return paths + storage_paths(c)


_LIBRARY = []  # the test op's library, defined once per process


def _unmarked_view(t):
    """A view made by an op whose schema does not say it aliases its input (as a custom
    kernel may): caught by the memory it shares, not by the schema."""
    if not _LIBRARY:
        _LIBRARY.append(torch.library.Library("pinstage_test47", "DEF"))
        _LIBRARY[0].define("unmarked_view(Tensor x) -> Tensor")
        _LIBRARY[0].impl("unmarked_view", lambda x: x.view(-1), "CPU")
    return torch.ops.pinstage_test47.unmarked_view(t)


def storage_paths(c):
    t = c.t
    paths = [("torch.empty(0).set_(t)", lambda: torch.empty(0).set_(t), "refused"),
             ("torch.empty(0).set_(source=t)", lambda: torch.empty(0).set_(source=t),
              "refused"),
             ("t.storage()[0] = 1", lambda: t.storage().__setitem__(0, 1.), FLAGGED),
             ("t.storage().fill_(0)", lambda: t.storage().fill_(0), FLAGGED),
             ("t.share_memory_()", lambda: t.share_memory_(), "refused"),
             ("module.share_memory()", lambda: _map_linear(c).share_memory(), "refused")]
    if TORCH2:  # torch 1.13 has no untyped storage, and no flag to guard `.data =` with
        paths += [(name, fn, "flagged") for name, fn in (
            ("t.untyped_storage().fill_(0)", lambda: t.untyped_storage().fill_(0)),
            ("Tensor.untyped_storage(t)[0] = 1",
             lambda: torch.Tensor.untyped_storage(t).__setitem__(0, 1)),
            ("empty.set_(t.untyped_storage())",
             lambda: torch.empty(0).set_(t.untyped_storage()).zero_()),
            ("plain.data = t; plain.zero_()", lambda: _data_assigned(c).zero_()),
            ("to_dlpack(t) -> from_dlpack -> zero_", lambda: torch.utils.dlpack.from_dlpack(
                torch.utils.dlpack.to_dlpack(t)).zero_()))]
    return paths


def _data_assigned(c):
    plain = torch.zeros(4, 4)
    plain.data = c.t
    assert torch.equal(plain, c.ref["w"])  # reads the file's bytes
    return plain


def _dlpack_flags(capsule):
    """(flags, data pointer) of a DLPack 1.0 capsule (DLManagedTensorVersioned)."""
    import ctypes
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype, get.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    address = get(capsule, b"dltensor_versioned")
    # version (2 x u32), manager_ctx, deleter, flags (u64), then DLTensor (data first)
    flags = ctypes.c_uint64.from_address(address + 24).value
    data = ctypes.c_void_p.from_address(address + 32).value
    return flags, data


def _versioned_capsule(c):
    flags, data = _dlpack_flags(c.t.__dlpack__(max_version=(1, 0)))
    assert flags & 1 and data == c.t.data_ptr(), (flags, data)  # READ_ONLY, zero-copy
    return "readonly_capsule"


def _np_from_dlpack(c):
    array = np.from_dlpack(c.t)
    if NUMPY2:  # asks for DLPack 1.0 and honours its read-only flag
        return readonly_array(c, array)
    return plain_copy(c, torch.from_numpy(array))  # a legacy capsule: a copy


def bridge_paths(c):
    t = c.t
    arrays = [("t.numpy()", lambda: t.numpy()), ("np.asarray(t)", lambda: np.asarray(t)),
              ("np.array(t, copy=False)", lambda: np.array(t, copy=False)),
              ("torch.Tensor.numpy(t)", lambda: torch.Tensor.numpy(t)),
              ("t.numpy(force=True)", lambda: t.numpy(force=True)),
              ("t.__array__()", lambda: t.__array__()),
              ("np.asarray(t).reshape(-1)", lambda: np.asarray(t).reshape(-1)),
              ("t.numpy().view(np.int32)", lambda: t.numpy().view(np.int32))]
    paths = [(name, lambda make=make: readonly_array(c, make())) for name, make in arrays]
    paths += [("np.copyto(np.asarray(t), 0)", lambda: _numpy_write(lambda: np.copyto(
                  np.asarray(t), 0))),
              ("np.add(out=np.asarray(t))", lambda: _numpy_write(lambda: np.add(
                  c.x.numpy(), 1, out=np.asarray(t)))),
              ("np.from_dlpack(t)", lambda: _np_from_dlpack(c),
               "readonly_array" if NUMPY2 else "copy"),
              ("torch.from_dlpack(t)", lambda: plain_copy(c, torch.from_dlpack(t)), "copy"),
              ("torch.from_dlpack(t.__dlpack__())",
               lambda: plain_copy(c, torch.from_dlpack(t.__dlpack__())), "copy"),
              ]
    exports = torch.Tensor.__dlpack__.__code__.co_varnames  # torch 1.13: stream only
    if "copy" in exports:
        paths.append(("t.__dlpack__(copy=False)", lambda: t.__dlpack__(copy=False), "refused"))
    if "read_only" in exports:
        paths.append(("t.__dlpack__(max_version=(1, 0))", lambda: _versioned_capsule(c),
                      "readonly_capsule"))
    return paths + pinstage_paths(c)


def _numpy_write(fn):
    try:
        fn()
    except ValueError as e:
        assert "read-only" in str(e), e
        return "readonly_array"
    return "written"


def pinstage_paths(c):
    t = c.t

    def add(direction):
        pinstage.TaskArgs().add("y", t, direction)

    def into():
        pinstage.load_file(c.path, worker=c.worker, into={"w": t})

    def out():
        with pinstage.safe_open(c.path, worker=c.worker) as f:
            f.get_tensor("w", out=t)

    not_pinned = "InvalidArgumentError: *"  # not inside one of the worker's pinned buffers
    return [("TaskArgs.add(t, 'out')", lambda: add("out"), "refused"),
            ("TaskArgs.add(t, 'inout')", lambda: add("inout"), "refused"),
            ("TaskArgs.add(t, 'in')", lambda: add("in"), "ok"),
            ("load_file(into={'w': t})", into, not_pinned),
            ("safe_open.get_tensor(out=t)", out, not_pinned)]


def _save_load(c, obj, **load):
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    buffer.seek(0)
    return torch.load(buffer, **load)


def copy_paths(c):
    t = c.t
    lin = lambda: _map_linear(c)  # noqa: E731
    made = [("torch.save/torch.load", lambda: _save_load(c, {"w": t})["w"]),
            ("torch.load(weights_only=True)",
             lambda: _save_load(c, {"w": t}, weights_only=True)["w"]),
            ("torch.save of a view", lambda: _save_load(c, t[1:])),
            ("pickle", lambda: pickle.loads(pickle.dumps(t))),
            ("copy.deepcopy(t)", lambda: copy_module.deepcopy(t)),
            ("copy.deepcopy(state dict)", lambda: copy_module.deepcopy(dict(c.mapped))["w"]),
            ("copy.copy(t)", lambda: copy_module.copy(t)), ("t.clone()", lambda: t.clone()),
            ("t + 0", lambda: t + 0), ("torch.tensor(t)", lambda: torch.tensor(t)),
            ("deepcopy(module).weight", lambda: copy_module.deepcopy(lin()).weight),
            ("torch.save(module) weight", lambda: _save_load(c, lin(), weights_only=False).weight),
            ("module.to(float64).weight", lambda: lin().to(torch.float64).weight.float()),
            ("module.half().float()", lambda: lin().half().weight.float())]
    want = {"torch.save of a view": c.ref["w"][1:],
            "module.half().float()": c.ref["w"].half().float()}
    paths = [(name, lambda name=name, make=make: plain_copy(c, make(), want.get(name)))
             for name, make in made]
    paths.append(("module.to(float64): a plain Parameter", lambda: _converted(c)))
    return paths


def _converted(c):
    lin = _map_linear(c).to(torch.float64)
    assert type(lin.weight) is torch.Tensor or type(lin.weight) is nn.Parameter, type(lin.weight)
    assert isinstance(lin.weight, nn.Parameter) and lin.weight.requires_grad
    with torch.no_grad():
        lin.weight.add_(1)  # its own memory: writable
    return "copy"


def sweep_paths(c):
    """Every in-place method of torch.Tensor (name ending in '_'), tried with a few argument
    lists: whatever each does, it must not write the mapping (exit code 0)."""
    t, x = c.t, c.x
    tried = []
    for name in sorted(n for n in dir(torch.Tensor) if n.endswith("_") and not n.startswith("__")):
        for args in ((), (1,), (x,), (0, torch.tensor([0]), 1.), (x, x)):
            tried.append((f"sweep {name}{len(args)}",
                          lambda name=name, args=args: _swept(getattr(t, name), args)))
    return tried


def _swept(method, args):
    try:
        method(*args)
    except pinstage.ReadOnlyError:
        return "refused"
    except Exception:  # noqa: BLE001: a wrong argument list is no write either
        return "rejected"
    return "returned"


# Each group's paths and the outcome a path has unless it names its own ("x*": any outcome
# that starts with x).
GROUPS = {"inplace": (inplace_paths, "refused"), "functional": (functional_paths, "refused"),
          "aliases": (alias_paths, "guarded"), "bridges": (bridge_paths, "readonly_array"),
          "copies": (copy_paths, "copy"), "sweep": (sweep_paths, "*")}


def outcome(fn):
    try:
        got = fn()
    except pinstage.ReadOnlyError:
        return "refused"
    except Exception as e:  # noqa: BLE001: reported to the parent, which compares
        if isinstance(e, RuntimeError) and "Cannot access data pointer" in str(e):
            return "flagged"
        return f"{type(e).__name__}: {' '.join(str(e).split())[:160]}"
    return got if isinstance(got, str) else "ok"


def main(group, path):
    import warnings
    warnings.simplefilter("ignore")  # torch's deprecation notes would drown the report
    c = Ctx(path)
    make, default = GROUPS[group]
    for name, fn, *expect in make(c):
        print(f"start {name}", flush=True)
        print(f"path {name}\t{expect[0] if expect else default}\t{outcome(fn)}", flush=True)
    assert c.unchanged(), "the mapped tensors changed"
    print("done", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
