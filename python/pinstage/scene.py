"""Scene tests: generate a scene's arguments (optionally straight into a worker's pinned
memory), compute the golden, bind them on a worker and compare. See docs/python.md.

Every scene registered in C++ (docs/scenes.md) is a case here without Python code:
``scene_cases()`` gives one ``RegisteredSceneCase`` per registered scene.

A case overrides ``generate_args(params)``; a case that wants its inputs in the worker's
pinned memory also overrides ``generate_args_for_worker(worker, params)``, whose default
calls ``generate_args``, so cases written before the hook existed keep working. Both hooks
receive the same parsed ``SceneParams``: parameters are parsed once, in ``parse_params``.
"""
import dataclasses
import functools
from collections.abc import Mapping

from . import _pinstage
from ._pinstage import Binder, InvalidArgumentError

qwen3 = _pinstage.qwen3

class ParamsBase:
    """What every parameter class shares: parse(). A parameter class is a frozen dataclass
    of int fields with defaults (SceneParams, or one made by params_class())."""

    @classmethod
    def parse(cls, params=None, base=None, **overrides):
        """An instance from None (the defaults), an instance, a mapping or a
        "seed=1,seq_len=64,layers=1" string, then keyword overrides; fields not given keep
        `base`'s values (default cls()). Values are ints (NumPy ints too) or decimal
        strings; anything else, or a name that is not a field, is InvalidArgumentError."""
        names = [f.name for f in dataclasses.fields(cls)]
        values = dataclasses.asdict(base if base is not None else cls())
        if params is None:
            given = {}
        elif isinstance(params, ParamsBase) and dataclasses.is_dataclass(params):
            given = dataclasses.asdict(params)
        elif isinstance(params, str):
            given = _parse_pairs(params)
        elif isinstance(params, Mapping):
            given = dict(params)
        else:
            raise InvalidArgumentError(
                "scene params must be None, a SceneParams, a mapping or a 'name=value,...' "
                f"string, got {type(params).__name__}")
        given.update(overrides)
        for name, value in given.items():
            if name not in names:
                raise InvalidArgumentError(
                    f"unknown scene parameter '{name}' (valid: {', '.join(names)})")
            values[name] = _to_int(name, value)
        return cls(**values)


@dataclasses.dataclass(frozen=True)
class SceneParams(ParamsBase):
    """The parameters of a hand-written SceneTestCase unless it sets `params_class`.
    Ranges are the case's to check (SceneTestCase.validate_params)."""

    seed: int = qwen3.DEFAULT_SEED
    seq_len: int = qwen3.DEFAULT_SEQ_LEN
    layers: int = qwen3.DEFAULT_LAYERS


@functools.lru_cache(maxsize=None)
def params_class(scene):
    """The parameter class of a registered scene: one int field per parameter the scene
    registry declares (pinstage.scene_params), with its default, in order."""
    declared = _pinstage.scene_params(scene)
    name = "".join(part.capitalize() for part in scene.replace("-", "_").split("_")) + "Params"
    fields = [(p["name"], int, dataclasses.field(default=p["default"])) for p in declared]
    return dataclasses.make_dataclass(name, fields, bases=(ParamsBase,), frozen=True)


def _parse_pairs(text):
    pairs = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, sep, value = item.partition("=")
        if not sep:
            raise InvalidArgumentError(
                f"scene parameter '{item}' is not of the form name=value")
        pairs[name.strip()] = value.strip()
    return pairs


def _to_int(name, value):
    if isinstance(value, bool):
        raise InvalidArgumentError(f"scene parameter {name} must be an int, got {value!r}")
    if isinstance(value, int):
        return value
    if hasattr(value, "__index__") and not isinstance(value, str):
        return value.__index__()  # NumPy integers
    if isinstance(value, str):
        try:
            return int(value, 10)
        except ValueError:
            pass
    raise InvalidArgumentError(f"scene parameter {name} must be an int, got {value!r}")


@dataclasses.dataclass
class SceneResult:
    """What SceneTestCase.run did: the args (holding the run's outputs), the golden, the
    bind report and the comparison."""

    case: str
    params: SceneParams
    args: object
    golden: object
    report: object
    comparison: object

    @property
    def ok(self):
        """True when every compared output is within the scene's tolerance."""
        return bool(self.comparison.ok)

    @property
    def pinned(self):
        """True when every uploaded tensor came from pinned memory."""
        uploaded = [t for t in self.report.tensors if t.direction != "OUT"]
        return bool(uploaded) and all(t.pinned for t in uploaded)


class SceneTestCase:
    """Base class of scene test cases. Subclasses set `name` and override the hooks."""

    name = "scene"
    params_class = SceneParams  # the case's parameters: free-form, any ParamsBase dataclass
    default_params = None  # None: params_class()

    # ---- parameters: parsed once, shared by every hook ----

    def parse_params(self, params=None, **overrides):
        """params_class.parse over `default_params`, then validate_params()."""
        parsed = self.params_class.parse(params, base=self.default_params, **overrides)
        self.validate_params(parsed)
        return parsed

    def validate_params(self, params):
        """Raises InvalidArgumentError for parameters the case cannot run with."""

    # ---- hooks ----

    def generate_args(self, params):
        """The case's TaskArgs for `params` (a SceneParams), in pageable memory."""
        raise NotImplementedError(f"{type(self).__name__} must override generate_args")

    def generate_args_for_worker(self, worker, params):
        """The case's TaskArgs for running on `worker`. Default: generate_args(params).
        Override to place inputs straight into the worker's pinned memory."""
        return self.generate_args(params)

    def compute_golden(self, args, params):
        """The expected result for `args` (read before the run changes them)."""
        raise NotImplementedError(f"{type(self).__name__} must override compute_golden")

    def compare(self, result, golden):
        """Compares the run's outputs (held in `result`, the args after the bind) against
        the golden; returns an object with .ok and .message()."""
        raise NotImplementedError(f"{type(self).__name__} must override compare")

    def bind_options(self, params):
        """Keyword options for pinstage.Binder (e.g. execute="<callable>")."""
        return {}

    # ---- driving ----

    def make_args(self, params=None, worker=None):
        """Parses `params` and calls the worker-aware hook when a worker is given, else
        generate_args."""
        parsed = self.parse_params(params)
        if worker is not None:
            return self.generate_args_for_worker(worker, parsed)
        return self.generate_args(parsed)

    def run(self, worker, params=None, *, use_worker_hook=True, **bind_options):
        """Generates the args (through generate_args_for_worker, or generate_args when
        use_worker_hook is False), computes the golden, binds the args on `worker` (with
        bind_options() updated by `bind_options`) and compares. Returns a SceneResult."""
        parsed = self.parse_params(params)
        if use_worker_hook:
            args = self.generate_args_for_worker(worker, parsed)
        else:
            args = self.generate_args(parsed)
        golden = self.compute_golden(args, parsed)
        options = dict(self.bind_options(parsed))
        options.update(bind_options)
        report = Binder(worker, **options).run(args)
        comparison = self.compare(args, golden)
        return SceneResult(self.name, parsed, args, golden, report, comparison)

    def assert_passes(self, worker, params=None, **kwargs):
        """run(), raising AssertionError with the comparison's message when it fails."""
        result = self.run(worker, params, **kwargs)
        if not result.ok:
            raise AssertionError(f"{self.name} {result.params}: {result.comparison.message()}")
        return result


class RegisteredSceneCase(SceneTestCase):
    """A scene from the C++ registry (pinstage.scene_names()): its parameters (the
    params_class, whatever the scene declares), arguments, golden, comparison and execute
    callable all come from the scene's registration. The worker-aware hook generates the
    arguments straight into the worker's pinned memory."""

    def __init__(self, name=None):
        if name is not None:
            self.name = name
        if self.name not in _pinstage.scene_names():
            raise InvalidArgumentError(
                f"no scene named '{self.name}' (registered: "
                f"{', '.join(_pinstage.scene_names())})")
        self.params_class = params_class(self.name)
        self.default_params = None

    def _values(self, params):
        """The parameters as the C++ registry wants them."""
        return dataclasses.asdict(params)

    def validate_params(self, params):
        _pinstage.scene_describe(self.name, self._values(params))

    def generate_args(self, params):
        return _pinstage.scene_make_args(self.name, self._values(params))

    def generate_args_for_worker(self, worker, params):
        return _pinstage.scene_make_args(self.name, self._values(params), worker=worker)

    def compute_golden(self, args, params):
        return _pinstage.scene_compute_golden(self.name, args, self._values(params))

    def compare(self, result, golden):
        return _pinstage.scene_compare(result, golden)

    def bind_options(self, params):
        return {"execute": _pinstage.scene_callable(self.name)}


def scene_cases():
    """One RegisteredSceneCase per scene in the C++ registry, by name."""
    return [RegisteredSceneCase(name) for name in _pinstage.scene_names()]


class Qwen3DecodeCase(RegisteredSceneCase):
    """The Qwen3-14B decode scene (docs/golden.md), from the registry. Its worker-aware
    hook generates the twenty arguments directly in the worker's pinned memory; they
    surface as zero-copy torch tensors (args.wq, args["k_cache"], ...)."""

    name = "qwen3-decode"
