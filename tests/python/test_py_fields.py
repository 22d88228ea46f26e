"""Every field list of the public headers (PINSTAGE_*_FIELDS) reaches its struct, its Python
side and its docs, in the list's order: the read-only records built from a list
(WorkerStats, BindReport, ..., Comparison) and their listings in docs/python.md; the report
dicts (LoadReport, HostMemoryStats) and their tables; the option keywords (Worker, Binder)
and their tables; and docs/design/architecture.md's "Where a change goes" row names every
list. The lists come from pinstage._pinstage._field_lists(), so a list added to a header
and not here fails."""
import pathlib
import re

import pytest

import pinstage

DOC = pathlib.Path(__file__).resolve().parents[2] / "docs" / "python.md"

RECORDS = ["WorkerStats", "TensorBindReport", "GroupBindReport", "SceneRound", "SceneReport",
           "TensorComparison", "Comparison"]


def properties(cls):
    """The class's properties in definition order."""
    return [name for name, v in vars(cls).items() if isinstance(v, property)]


def listing(text, cls):
    """The `names` of the docs' listing of `cls`: "`Cls`: `a`, `b` (...), `c`." or
    "`Cls(a, b, c)`", skipping what parentheses enclose (notes, nested listings)."""
    m = re.search(r"`%s\(([^)`]*)\)`" % cls, text)
    if m:
        return [n.strip() for n in m.group(1).split(",")]
    start = text.find("`%s`: " % cls)
    assert start >= 0, f"docs/python.md lost its listing of {cls}"
    names, depth, i = [], 0, start + len(cls) + 4
    while i < len(text):
        c = text[i]
        if c == "`":
            end = text.index("`", i + 1)
            if depth == 0:
                names.append(text[i + 1:end])
            i = end
        elif c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
            if depth < 0:
                break
        elif c in ".;" and depth == 0:
            break
        i += 1
    return names


@pytest.mark.parametrize("cls", RECORDS)
def test_docs_list_the_properties_in_order(cls):
    assert listing(DOC.read_text(), cls) == properties(getattr(pinstage, cls))


@pytest.mark.parametrize("cls", RECORDS)
def test_every_property_is_documented(cls):
    for name in properties(getattr(pinstage, cls)):
        doc = getattr(pinstage, cls).__dict__[name].__doc__ or ""
        assert re.match(r"[\w\[\] |,.]+: \S", doc), (cls, name, doc)


def test_worker_stats_repr_names_every_field():
    with pinstage.Worker() as w:
        text = repr(w.stats())
    names = re.findall(r"(\w+)=", text)
    assert text.startswith("WorkerStats(") and names == properties(pinstage.WorkerStats)


def test_enum_fields_read_as_names():
    torch = pytest.importorskip("torch")
    with pinstage.Worker() as w:
        args = pinstage.TaskArgs()
        args.add("x", torch.zeros(4))
        args.add("y", torch.zeros(4), direction="out")
        tensors = pinstage.Binder(w, upload="staged").run(args).tensors
        assert [(t.direction, t.path) for t in tensors] == [("IN", "staged"), ("OUT", "direct")]
        del args


def bind_option_keywords():
    """The keywords Binder takes, from the list PINSTAGE_BIND_OPTION_FIELDS (its refusal of
    an unknown keyword names them all, in the list's order)."""
    worker = pinstage.Worker(backend="sim")
    try:
        with pytest.raises(TypeError) as refused:
            pinstage.Binder(worker, no_such_option=1)
    finally:
        worker.finalize()
    return re.search(r"\(([^()]*)\)$", str(refused.value)).group(1).split(", ")


FIRST_TOUCH = ["device_first_touch_bytes", "device_first_touch_s", "device_first_touch_reason"]


def test_a_host_load_report_is_the_docs_table_less_first_touch(tmp_path, worker):
    """report_fields adds the first-touch list only when its reason is set: a device load
    on sim has every key of docs/loading.md's table (LISTS below), a host load all but
    those three."""
    torch = pytest.importorskip("torch")
    from test_py_checkpoint import write_file
    path = tmp_path / "m.safetensors"
    write_file(path, {"a": torch.arange(10, dtype=torch.float32)})
    tensors, host = pinstage.load_file(str(path), worker=worker, report=True)
    del tensors  # its views go before the worker fixture finalizes, whatever fails below
    table = md_table("loading.md", "load report fields")
    assert table[-3:] == FIRST_TOUCH
    assert list(host) == table[:-3]


# ---- every field list reaches its struct, Python and docs (architecture.md's row) ----

ROOT = DOC.parents[1]
INCLUDE = ROOT / "include" / "pinstage"


def worker_option_keywords():
    """Worker()'s keywords: its refusal of an unknown one names them all, in order."""
    with pytest.raises(TypeError) as refused:
        pinstage.Worker(no_such_option=1)
    return re.search(r"\(options: ([^()]*)\)$", str(refused.value)).group(1).split(", ")


def load_report_keys():
    torch = pytest.importorskip("torch")
    from test_py_checkpoint import write_file
    import tempfile
    with tempfile.TemporaryDirectory() as tmp, pinstage.Worker() as worker:
        path = pathlib.Path(tmp) / "m.safetensors"
        write_file(path, {"a": torch.arange(10, dtype=torch.float32)})
        dev = pinstage.load_to_device(str(path), worker=worker)
        try:
            return list(dev.report)
        finally:
            dev.close()


def host_memory_stat_keys():
    with pinstage.Worker() as worker:
        return list(worker.host_memory_stats())


def md_table(name, marker, column=0):
    """Column `column`'s `names` of docs/NAME's table between the marker comments."""
    text = (ROOT / "docs" / name).read_text()
    m = re.search(r"<!-- %s: start -->\n(.*?)<!-- %s: end -->" % (marker, marker), text, re.S)
    assert m, f"docs/{name} lost its '{marker}' table markers"
    return [row.split("|")[column + 1].strip().strip("`")
            for row in m.group(1).splitlines() if row.startswith("| `")]


def listed(cls):
    """docs/python.md's listing of `cls` up to its list's length: the computed properties
    (rates, `ok`) follow the list's fields there."""
    return listing(DOC.read_text(), cls)[:len(getattr(pinstage, cls)._fields)]


def record(header, cls, docs="python.md"):
    """The row of a list whose Python class has its fields (`_fields`, in list order);
    docs: docs/python.md's listing of the class, a callable, or None."""
    listed_docs = (lambda: listed(cls)) if docs == "python.md" else docs
    return (header, cls, lambda: list(getattr(pinstage, cls)._fields), listed_docs)


# Each list: (header, struct the list builds, what Python shows of it, what the docs show
# of it). The Python and docs sides are callables giving names in order; Python's None
# where it takes a part only (its own test holds that part).
LISTS = {
    "PINSTAGE_WORKER_OPTION_FIELDS": ("worker.h", "WorkerOptions", worker_option_keywords,
                                      lambda: md_table("worker.md", "worker option fields")),
    "PINSTAGE_WORKER_STATS_FIELDS": record("worker.h", "WorkerStats"),
    # Python keys them as torch does: test_host_memory_stats_keys_are_the_docs_python_keys.
    "PINSTAGE_HOST_MEMORY_STATS_FIELDS": (
        "worker.h", "HostMemoryStats", None,
        lambda: md_table("worker.md", "host memory stats fields", column=1)),
    "PINSTAGE_BIND_OPTION_FIELDS": (
        "bind.h", "BindOptions",
        lambda: ["execute_callable" if k == "execute" else k for k in bind_option_keywords()],
        lambda: md_table("bind.md", "bind option fields")),
    "PINSTAGE_BIND_REPORT_FIELDS": record(
        "bind.h", "BindReport", lambda: md_table("bind.md", "bind report fields")),
    "PINSTAGE_TENSOR_BIND_REPORT_FIELDS": record("bind.h", "TensorBindReport"),
    "PINSTAGE_GROUP_BIND_REPORT_FIELDS": record("bind.h", "GroupBindReport"),
    "PINSTAGE_TENSOR_COMPARISON_FIELDS": record("scene.h", "TensorComparison"),
    "PINSTAGE_COMPARISON_FIELDS": record("scene.h", "Comparison"),
    "PINSTAGE_SCENE_ROUND_FIELDS": record("scene.h", "SceneRound"),
    "PINSTAGE_SCENE_REPORT_FIELDS": record("scene.h", "SceneReport"),
    # Python's loads take some of these keywords, in their own order (load_common.h).
    "PINSTAGE_CHECKPOINT_LOAD_OPTION_FIELDS": (
        "checkpoint.h", "CheckpointLoadOptions", None,
        lambda: md_table("loading.md", "checkpoint load option fields")),
    "PINSTAGE_LOAD_REPORT_FIELDS": ("checkpoint.h", "LoadReport",
                                    lambda: load_report_keys()[:-3],
                                    lambda: md_table("loading.md", "load report fields")[:-3]),
    "PINSTAGE_LOAD_REPORT_FIRST_TOUCH_FIELDS": (
        "checkpoint.h", "LoadReport", lambda: load_report_keys()[-3:],
        lambda: md_table("loading.md", "load report fields")[-3:]),
    # The plugin SDK's pinning keys (Python hands them on in Worker(config=...)); cuda's
    # table adds its own key: test_cuda_docs_list_the_pin_keys_then_its_own.
    "PINSTAGE_PIN_CONFIG_FIELDS": ("backend/pin_mode.h", "PinConfig", None,
                                   lambda: md_table("acl.md", "pin config keys")),
}


def field_lists():
    return pinstage._pinstage._field_lists()


def test_every_field_list_is_checked_here():
    """A list added to a header without a row in LISTS fails: its front ends go unchecked."""
    assert sorted(field_lists()) == sorted(LISTS)


@pytest.mark.parametrize("name", sorted(LISTS))
def test_the_list_builds_its_struct(name):
    header, struct, _, _ = LISTS[name]
    text = (INCLUDE / header).read_text()
    m = re.search(r"struct (?:PINSTAGE_API )?%s \{(.*?)\n\};" % struct, text, re.S)
    assert m, f"{header} lost struct {struct}"
    assert re.search(r"\b%s\(PINSTAGE_\w*MEMBER\b" % name, m.group(1)), (
        f"struct {struct} is not built from {name}")




@pytest.mark.parametrize("name", sorted(LISTS))
@pytest.mark.parametrize("side", ["python", "docs"])
def test_the_list_reaches_python_and_docs_in_order(name, side):
    names = LISTS[name][2 if side == "python" else 3]
    if names is None:
        pytest.skip(f"{name}: Python takes a part of it, held by its own test")
    assert names() == field_lists()[name]


def test_cuda_docs_list_the_pin_keys_then_its_own():
    """docs/cuda.md's key table: the plugin SDK's pinning keys (pin_mode.h's list), in its
    order, then the keys the cuda backend parses itself."""
    keys = md_table("cuda.md", "pin config keys")
    assert keys == field_lists()["PINSTAGE_PIN_CONFIG_FIELDS"] + ["sysfs_root"]


def test_host_memory_stats_keys_are_the_docs_python_keys():
    assert host_memory_stat_keys() == md_table("worker.md", "host memory stats fields")


def test_architecture_row_names_every_list():
    """docs/design/architecture.md's "Where a change goes" row for a report or option field
    names every list, so the row a newcomer follows holds for each."""
    text = (ROOT / "docs" / "design" / "architecture.md").read_text()
    row = next(line for line in text.splitlines() if line.startswith("| a new field of a "))
    for name in LISTS:
        assert f"`{name}`" in row, name
