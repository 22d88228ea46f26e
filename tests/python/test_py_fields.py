"""The read-only records built from a header's field list (WorkerStats, TensorBindReport,
GroupBindReport, SceneRound, SceneReport) and their listings in docs/python.md name the
same properties in the same order, so the list, the binding and the docs cannot drift; and
docs/bind.md's table holds every bind option of PINSTAGE_BIND_OPTION_FIELDS, in order."""
import pathlib
import re

import pytest

import pinstage

DOC = pathlib.Path(__file__).resolve().parents[2] / "docs" / "python.md"

RECORDS = ["WorkerStats", "TensorBindReport", "GroupBindReport", "SceneRound", "SceneReport"]


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


def test_bind_md_tables_every_bind_option_in_order():
    text = (DOC.parent / "bind.md").read_text()
    rows = text[text.index("| option | default | meaning |"):].split("\n")[2:]
    table = []
    for row in rows:
        if not row.startswith("| `"):
            break
        table.append(row.split("`")[1])
    # Python spells execute_callable `execute` (docs/bind.md says so above the table).
    keywords = ["execute_callable" if k == "execute" else k for k in bind_option_keywords()]
    assert table == keywords
