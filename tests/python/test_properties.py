"""Property tests (hypothesis, issue 41): the host memory pool against a model of its
figures, tensor-parallel slices and plans against NumPy, and the CLI's numeric and choice
options at their boundaries.

- The pool: random alloc / free / empty_cache (and trim_host_cache / reserve_pinned_host
  where Python has them) against a model of docs/worker.md, "Host memory pool": blocks in
  whole pages, the lowest-addressed of the smallest free ranges, a miss maps a segment of
  the request rounded up to 2 MiB, ranges merge inside a segment only, whole free segments
  go back least recently used first. Every figure of host_memory_stats() is compared after
  every step, and every live buffer keeps its own bytes.
- Slices: get_slice(...)[index] and load_tp(...) against NumPy's indexing and
  numpy.array_split on random shapes, dtypes, indexes, tp and plan rules.
- The CLI: every numeric option of every command (found by asking the CLI itself with
  --dry-run) at min - 1, min, max, max + 1 and garbage; every choice in case variants.

Fixed budgets (derandomized, no database), so a run is the same run each time; the whole
file takes well under a minute. Skipped where hypothesis is missing (the Debian pass)."""
import json
import os
import re
import struct
import subprocess

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from hypothesis.stateful import (RuleBasedStateMachine, invariant, precondition,  # noqa: E402
                                 rule)

import numpy as np  # noqa: E402

import pinstage  # noqa: E402

PAGE = os.sysconf("SC_PAGE_SIZE")
SEGMENT_UNIT = 2 << 20
MiB = 1 << 20


def budget(n):
    """The settings of a property with n examples."""
    return settings(max_examples=n, deadline=None, database=None, derandomize=True,
                    suppress_health_check=[HealthCheck.function_scoped_fixture,
                                           HealthCheck.too_slow,
                                           HealthCheck.data_too_large])


def round_up(n, unit):
    return (n + unit - 1) // unit * unit


# ---- the pool against a model ------------------------------------------------------------

class PoolModel:
    """What the pool must hold: segments {base: bytes}, free ranges {start: bytes} merged
    inside a segment only, live blocks {address: (bytes, span)} and the counters."""

    def __init__(self):
        self.segments, self.last_use, self.free, self.live = {}, {}, {}, {}
        self.clock = 0
        self.c = dict.fromkeys(["hits", "misses", "num_host_alloc", "num_host_free",
                                "allocated_peak", "allocations_peak", "reserved_peak",
                                "segments_peak"], 0)

    def segment_of(self, address):
        return next(b for b, n in self.segments.items() if b <= address < b + n)

    def best_fit(self, span):
        fits = [(n, start) for start, n in self.free.items() if n >= span]
        return min(fits)[1] if fits else None

    def add_segment(self, base, nbytes):
        self.segments[base] = nbytes
        self.clock += 1
        self.last_use[base] = self.clock
        self.free[base] = nbytes
        self.c["num_host_alloc"] += 1
        self.peaks()

    def take(self, at, nbytes, span):
        n = self.free.pop(at)
        if n > span:
            self.free[at + span] = n - span
        self.clock += 1
        self.last_use[self.segment_of(at)] = self.clock
        self.live[at] = (nbytes, span)
        self.peaks()

    def give(self, at, span):
        base = self.segment_of(at)
        end = at + span
        if end in self.free and end < base + self.segments[base]:
            span += self.free.pop(end)
        before = next((s for s, n in self.free.items() if s + n == at and s >= base), None)
        if before is not None and at != base:
            at, span = before, self.free.pop(before) + span
        self.free[at] = span

    def whole_free(self):
        """Bases of wholly free segments, least recently used first."""
        whole = [b for b, n in self.segments.items() if self.free.get(b) == n]
        return sorted(whole, key=lambda b: self.last_use[b])

    def release(self, want):
        """Whole free segments until at least `want` bytes went; the bytes released."""
        gone = 0
        for base in self.whole_free():
            if gone >= want:
                break
            gone += self.segments.pop(base)
            del self.free[base], self.last_use[base]
            self.c["num_host_free"] += 1
        return gone

    def peaks(self):
        c = self.c
        c["allocated_peak"] = max(c["allocated_peak"], self.allocated())
        c["allocations_peak"] = max(c["allocations_peak"], len(self.live))
        c["reserved_peak"] = max(c["reserved_peak"], sum(self.segments.values()))
        c["segments_peak"] = max(c["segments_peak"], len(self.segments))

    def allocated(self):
        return sum(n for n, _ in self.live.values())

    def expected(self):
        c = self.c
        return {"allocated_bytes.current": self.allocated(),
                "allocated_bytes.peak": c["allocated_peak"],
                "allocation.current": len(self.live), "allocation.peak": c["allocations_peak"],
                "reserved_bytes.current": sum(self.segments.values()),
                "reserved_bytes.peak": c["reserved_peak"],
                "segment.current": len(self.segments), "segment.peak": c["segments_peak"],
                "num_host_alloc": c["num_host_alloc"], "num_host_free": c["num_host_free"],
                "cached_bytes.current": sum(self.free.values()),
                "pending_bytes.current": 0, "pending_blocks.current": 0,
                "num_hits": c["hits"], "num_misses": c["misses"]}


def _address_and_fill(buffer, value):
    a = np.frombuffer(buffer, dtype=np.uint8)
    a[:] = value
    address = a.ctypes.data
    del a
    return address


def _holds(buffer, value):
    a = np.frombuffer(buffer, dtype=np.uint8)
    ok = bool((a == value).all())
    del a
    return ok


SIZES = st.one_of(st.integers(1, 3 * PAGE), st.integers(1, 5 * MiB),
                  st.sampled_from([PAGE, 2 * PAGE, SEGMENT_UNIT, SEGMENT_UNIT + 1, 2 * MiB - 1]))
LIMIT = 24 * MiB  # the cache bound: reached by some sequences, so the bound is modelled too


class PoolMachine(RuleBasedStateMachine):
    """Random alloc / free / empty_cache / trim / reserve against PoolModel."""

    def __init__(self):
        super().__init__()
        self.worker = pinstage.Worker(host_cache_limit_bytes=LIMIT)
        self.model = PoolModel()
        self.buffers = []  # (buffer, address, fill)
        self.fills = 0

    @rule(nbytes=SIZES)
    def alloc(self, nbytes):
        m = self.model
        span = round_up(nbytes, PAGE)
        hit = m.best_fit(span)
        b = self.worker.alloc_pinned_host(nbytes)
        self.fills += 1
        address = _address_and_fill(b, self.fills % 251 + 1)
        if hit is not None:
            m.c["hits"] += 1
            assert address == hit, f"{nbytes} B: not the lowest of the smallest free ranges"
        else:
            m.c["misses"] += 1
            assert address not in m.segments and all(
                not (s <= address < s + n) for s, n in m.segments.items()), "a miss reused"
            m.add_segment(address, round_up(nbytes, SEGMENT_UNIT))
        m.take(address, nbytes, span)
        self.buffers.append((b, address, self.fills % 251 + 1))

    @precondition(lambda self: self.buffers)
    @rule(pick=st.integers(0, 1 << 30))
    def free(self, pick):
        b, address, fill = self.buffers.pop(pick % len(self.buffers))
        assert _holds(b, fill), "a live buffer's bytes changed under it"
        b.close()
        m = self.model
        m.give(address, m.live.pop(address)[1])
        cached = sum(m.free.values())
        if cached > LIMIT:
            m.release(cached - LIMIT)

    @rule()
    def empty_cache(self):
        assert self.worker.empty_cache() == self.model.release(float("inf"))

    @precondition(lambda self: hasattr(self.worker, "trim_host_cache"))
    @rule(nbytes=st.integers(0, 12 * MiB))
    def trim(self, nbytes):
        assert self.worker.trim_host_cache(nbytes) == self.model.release(nbytes)

    @invariant()
    def figures_match_the_model(self):
        got = self.worker.host_memory_stats()
        want = self.model.expected()
        assert {k: got[k] for k in want} == want
        assert got["cache_limit_bytes"] == LIMIT

    def teardown(self):
        for b, _, _ in self.buffers:
            b.close()
        self.worker.finalize()


TestPoolAgainstTheModel = PoolMachine.TestCase
TestPoolAgainstTheModel.settings = settings(
    max_examples=25, stateful_step_count=30, deadline=None, database=None, derandomize=True,
    suppress_health_check=[HealthCheck.too_slow])


@pytest.mark.skipif(not hasattr(pinstage.Worker, "reserve_pinned_host"),
                    reason="Python has no Worker.reserve_pinned_host (C++ only)")
@pytest.mark.xfail(strict=False, reason="issue 41 defect 5: reserve_pinned_host compares the "
                   "total cached bytes, not one free block that fits")
@budget(20)
@given(held=st.lists(st.integers(1, 3 * MiB), min_size=2, max_size=6),
       want=st.integers(1, 6 * MiB))
def test_after_a_reserve_a_request_of_that_size_maps_nothing(held, want):
    """reserve_pinned_host(n) then alloc_pinned_host(n): a hit, whatever the cache held
    before (a fragmented cache included: every other block freed)."""
    w = pinstage.Worker(host_cache_limit_bytes=256 * MiB)
    try:
        buffers = [w.alloc_pinned_host(n) for n in held]
        for b in buffers[::2]:
            b.close()
        w.reserve_pinned_host(want)
        before = w.host_memory_stats()["num_host_alloc"]
        with w.alloc_pinned_host(want):
            assert w.host_memory_stats()["num_host_alloc"] == before
        for b in buffers[1::2]:
            b.close()
    finally:
        w.finalize()


# ---- slices and tensor-parallel plans against NumPy --------------------------------------

DTYPES = {"F32": np.float32, "F64": np.float64, "I8": np.int8, "I16": np.int16,
          "I64": np.int64, "U8": np.uint8, "F16": np.float16}


def _write(path, arrays):
    """A safetensors file of {name: (safetensors dtype, NumPy array)}."""
    header, data = {}, b""
    for name, (dtype, a) in arrays.items():
        raw = a.tobytes()
        header[name] = {"dtype": dtype, "shape": list(a.shape),
                        "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + data)


@st.composite
def arrays(draw, max_dims=3, min_side=0):
    dtype = draw(st.sampled_from(sorted(DTYPES)))
    shape = tuple(draw(st.lists(st.integers(min_side, 7), min_size=0, max_size=max_dims)))
    count = int(np.prod(shape, dtype=np.int64))
    values = np.arange(count, dtype=np.int64) * 7 + draw(st.integers(0, 50))
    return dtype, (values % 101).astype(DTYPES[dtype]).reshape(shape)


@st.composite
def indexes(draw, shape):
    """An index get_slice takes: per dim an int or a slice with step >= 1 (bounds past the
    ends included), maybe fewer items than dims, maybe one '...'."""
    items = []
    for size in shape[:draw(st.integers(0, len(shape)))]:
        if size > 0 and draw(st.booleans()):
            items.append(draw(st.integers(-size, size - 1)))
        else:
            bound = st.one_of(st.none(), st.integers(-size - 2, size + 2))
            items.append(slice(draw(bound), draw(bound),
                               draw(st.one_of(st.none(), st.integers(1, 3)))))
    if draw(st.booleans()):
        items.insert(draw(st.integers(0, len(items))), Ellipsis)
    return tuple(items) if len(items) != 1 or draw(st.booleans()) else items[0]


@budget(60)
@given(data=st.data())
def test_get_slice_is_numpys_indexing(tmp_path_factory, data):
    dtype, a = data.draw(arrays())
    index = data.draw(indexes(a.shape))
    path = tmp_path_factory.mktemp("slice") / "t.safetensors"
    _write(path, {"t": (dtype, a)})
    w = pinstage.Worker()
    try:
        with pinstage.safe_open(path, framework="numpy", worker=w) as f:
            got = f.get_slice("t")[index]
            want = a[index]
            assert got.shape == np.shape(want) and got.dtype == a.dtype
            assert got.tobytes() == np.ascontiguousarray(want).tobytes(), index
            assert f.read_bytes <= a.nbytes
            del got
    finally:
        w.finalize()


@st.composite
def tp_cases(draw):
    """(tp, {name: (dtype, array, split dim or None)}, plan): each tensor decided by a
    random rule (glob, regex, replicate) or the default."""
    tp = draw(st.integers(1, 4))
    tensors, rules = {}, []
    for k in range(draw(st.integers(1, 4))):
        dtype, a = draw(arrays(max_dims=3, min_side=1))
        name = f"layers.{k}.w{draw(st.integers(0, 9))}"
        fits = [d for d, n in enumerate(a.shape) if n >= tp]
        kind = draw(st.sampled_from(["glob", "regex", "replicate", "default"]))
        if kind in ("glob", "regex") and fits:
            dim = draw(st.sampled_from(fits))
            spelled = draw(st.sampled_from([dim, dim - a.ndim]))  # negative dims count back
            pattern = {"match": f"layers.{k}.*"} if kind == "glob" else \
                {"regex": rf"layers\.{k}\.w[0-9]"}
            rules.append({**pattern, "split": spelled})
            tensors[name] = (dtype, a, dim)
        elif kind == "replicate":
            rules.append({"match": f"layers.{k}.*", "replicate": True})
            tensors[name] = (dtype, a, None)
        else:
            tensors[name] = (dtype, a, None)  # the default: replicated
    plan = {"format": "pinstage.tp_plan/1", "rules": rules, "default": {"replicate": True}}
    return tp, tensors, plan


@budget(40)
@given(case=tp_cases())
def test_load_tp_is_numpy_array_split(tmp_path_factory, case):
    tp, tensors, plan = case
    path = tmp_path_factory.mktemp("tp") / "m.safetensors"
    _write(path, {n: (d, a) for n, (d, a, _) in tensors.items()})
    w = pinstage.Worker()
    try:
        load = pinstage.load_tp(path, tp, plan, worker=w, framework="numpy")
        assert load.report["read_bytes"] == sum(a.nbytes for _, a, _ in tensors.values())
        for rank in range(tp):
            for name, (_, a, dim) in tensors.items():
                want = a if dim is None else np.array_split(a, tp, axis=dim)[rank]
                got = load.ranks[rank][name]
                assert got.shape == want.shape and got.tobytes() == \
                    np.ascontiguousarray(want).tobytes(), (name, rank, dim)
        del load, got
    finally:
        w.finalize()


@budget(30)
@given(data=st.data())
def test_a_split_of_a_dim_smaller_than_tp_is_refused_before_any_memory(tmp_path_factory,
                                                                        data):
    dtype, a = data.draw(arrays(max_dims=3, min_side=1))
    dim = data.draw(st.integers(0, a.ndim)) if a.ndim else 0
    tp = data.draw(st.integers(a.shape[dim] + 1, a.shape[dim] + 4)) if dim < a.ndim else \
        data.draw(st.integers(2, 4))
    path = tmp_path_factory.mktemp("tp") / "m.safetensors"
    _write(path, {"t": (dtype, a)})
    plan = {"format": "pinstage.tp_plan/1", "rules": [{"match": "t", "split": dim}]}
    w = pinstage.Worker()
    try:
        with pytest.raises(pinstage.InvalidArgumentError, match="tensor 't'"):
            pinstage.load_tp(path, tp, plan, worker=w, framework="numpy")
        assert w.host_memory_stats()["allocation.current"] == 0
    finally:
        w.finalize()


# ---- the CLI's numeric and choice options at their boundaries ----------------------------

OPTION = re.compile(r"^\s+(?:-\w,)?(--[a-z][\w-]*)(\{\w+\})?\s+(?:(INT|UINT|TEXT|FLOAT)\S*)?")
CHOICES = re.compile(r":\{([^}]*)\}")
RANGE = re.compile(r"expected a whole number in \[(-?\d+), (-?\d+)\]")
GARBAGE = ["", "abc", "0x10", "1e3", "1.5", "+1", " 1", "1 ", "--", "١", "1_0", "9" * 40]


def _dry(cli, cwd, words):
    done = subprocess.run([str(cli), "--dry-run", *words], capture_output=True, text=True,
                          timeout=60, cwd=cwd)
    return done.returncode, done.stdout + done.stderr


def _commands(cli, cwd, path=()):
    """Every leaf command: (words, positional values, help text)."""
    text = subprocess.run([str(cli), *path, "--help"], capture_output=True, text=True,
                          timeout=60, cwd=cwd).stdout
    if "Subcommands:" in text:
        subs = re.findall(r"^  ([a-z][\w-]*)\s", text.split("Subcommands:")[1], re.M)
        return [c for s in subs for c in _commands(cli, cwd, (*path, s))]
    positionals = []
    if "Positionals:" in text:
        for line in text.split("Positionals:")[1].split("Options:")[0].splitlines():
            m = re.match(r"^  ([A-Z]+) (\S+)(?: x (\d+))?", line)
            if m:
                file_ = "FILE" in m.group(2)
                positionals += ["a.json" if file_ else "ckpt.safetensors"] * int(m.group(3) or 1)
    return [(list(path), positionals, text.split("Options:")[1] if "Options:" in text else "")]


@pytest.fixture(scope="module")
def cli_options(cli, tmp_path_factory):
    """(cwd, numeric [(words, positionals, flag, lo, hi)], choice [(words, positionals, flag,
    choices)]), found by asking the CLI: an option whose garbage value is refused with
    'expected a whole number in [lo, hi]' is numeric; ':{a,b}' in its help lists choices."""
    cwd = tmp_path_factory.mktemp("cli")
    (cwd / "a.json").write_text("{}")
    (cwd / "ckpt.safetensors").write_bytes(b"")
    numeric, choice = [], []
    for words, positionals, options in _commands(cli, cwd):
        for line in options.splitlines():
            m = OPTION.match(line)
            if not m or not m.group(3) and not m.group(2):
                continue
            flag = m.group(1)
            rc, out = _dry(cli, cwd, [*words, *positionals, f"{flag}=garbage"])
            r = RANGE.search(out)
            if rc != 0 and r and flag in out:
                numeric.append((words, positionals, flag, int(r.group(1)), int(r.group(2))))
            c = CHOICES.search(line)
            if c:
                choice.append((words, positionals, flag, c.group(1).split(",")))
    # An option that refuses a bound its own message gives is a finding of its own
    # (test_a_numeric_options_message_gives_its_real_range), kept out of the property.
    wrong = [o for o in numeric if any(
        _dry(cli, cwd, [*o[0], *o[1], f"{o[2]}={v}"])[0] != 0 for v in (o[3], o[4]))]
    return cwd, [o for o in numeric if o not in wrong], choice, wrong


def test_the_cli_has_numeric_and_choice_options_to_try(cli_options):
    _, numeric, choice, _ = cli_options
    assert len(numeric) >= 15 and len(choice) >= 2, (numeric, choice)


@pytest.mark.xfail(strict=False, reason="found by this suite: the scene size options "
                   "(--layers, ...) say 'expected a whole number in [-2^63, 2^63 - 1]' for "
                   "garbage but refuse anything below 1 (commands.h positive_size)")
def test_a_numeric_options_message_gives_its_real_range(cli_options):
    wrong = cli_options[3]
    assert not wrong, [(" ".join(w), flag, lo, hi) for w, _, flag, lo, hi in wrong]


def _strict_integer(text, lo, hi):
    """What parse_integer accepts (cli_common.h): decimal digits, an optional '-', in range."""
    return re.fullmatch(r"-?[0-9]+", text) is not None and lo <= int(text) <= hi


@budget(120)
@given(data=st.data())
def test_every_numeric_option_takes_exactly_its_range(cli, cli_options, data):
    cwd, numeric, _, _ = cli_options
    words, positionals, flag, lo, hi = data.draw(st.sampled_from(numeric))
    text = data.draw(st.one_of(
        st.sampled_from([str(v) for v in (lo - 1, lo, hi, hi + 1)]),
        st.integers(lo - 3, lo + 3).map(str), st.integers(hi - 3, hi + 3).map(str),
        st.integers(lo, hi).map(lambda v: "0" + str(v) if v >= 0 else str(v)),
        st.sampled_from(GARBAGE)))
    rc, out = _dry(cli, cwd, [*words, *positionals, f"{flag}={text}"])
    if _strict_integer(text, lo, hi):
        assert rc == 0 and "parsed; nothing was run" in out, (words, flag, text, out)
    elif text == "":
        assert rc == 1 and f"{flag}: 1 required" in out, out  # CLI11: the value is missing
    else:
        assert rc == 1, (words, flag, text, out)
        assert f"{flag}='{text}' is not valid" in out and f"[{lo}, {hi}]" in out, out


def _case_variants(word):
    return st.lists(st.booleans(), min_size=len(word), max_size=len(word)).map(
        lambda up: "".join(c.upper() if u else c for c, u in zip(word, up)))


def _choice_case(cli, cli_options, data, flags_wanted):
    cwd, _, choice, _ = cli_options
    pool = [c for c in choice if flags_wanted(c[2])]
    if not pool:
        pytest.skip("no such choice option")
    words, positionals, flag, choices = data.draw(st.sampled_from(pool))
    value = data.draw(st.sampled_from(choices).flatmap(_case_variants))
    return _dry(cli, cwd, [*words, *positionals, f"{flag}={value}"]), value, flag


@budget(40)
@given(data=st.data())
def test_choices_are_case_insensitive(cli, cli_options, data):
    (rc, out), value, flag = _choice_case(cli, cli_options, data, lambda f: f != "--verify")
    assert rc == 0 and "parsed" in out, (flag, value, out)


@pytest.mark.xfail(strict=False, reason="issue 41 defect 12: --verify=ALL and "
                   "--verify=IF-PRESENT are refused (choices are case-insensitive, docs/cli.md)")
@budget(20)
@given(data=st.data())
def test_verify_choices_are_case_insensitive(cli, cli_options, data):
    (rc, out), value, flag = _choice_case(cli, cli_options, data, lambda f: f == "--verify")
    assert rc == 0 and "parsed" in out, (flag, value, out)


@budget(40)
@given(data=st.data(), junk=st.text(st.characters(min_codepoint=33, max_codepoint=126),
                                    min_size=1, max_size=8))
def test_a_value_that_is_no_choice_is_refused_naming_the_choices(cli, cli_options, data,
                                                               junk):
    cwd, _, choice, _ = cli_options
    words, positionals, flag, choices = data.draw(st.sampled_from(choice))
    if junk.lower() in choices:
        return
    rc, out = _dry(cli, cwd, [*words, *positionals, f"{flag}={junk}"])
    assert rc == 1 and "{" + ",".join(choices) + "}" in out, (flag, junk, out)
