"""docs/design/architecture.md's row "a new host source", checked against the tree: every
SourceKind entry of src/runtime/host_memory/host_source.h has exactly one
SourceRegistration, in one file of src/runtime/host_memory/ that src/runtime/CMakeLists.txt
builds, registered under its own name, and its row in docs/worker.md's "Host sources"
table; kSourceKindCount counts them. (make_source() and source_name() read the
registrations, so nothing else names a source.) Static: the same on any torch."""
import pathlib
import re

import pytest

pytestmark = pytest.mark.once

ROOT = pathlib.Path(__file__).resolve().parents[2]
HOST_MEMORY = ROOT / "src" / "runtime" / "host_memory"


def kinds():
    """The SourceKind entries, in order, and kSourceKindCount."""
    text = (HOST_MEMORY / "host_source.h").read_text()
    body = re.search(r"enum class SourceKind \{(.*?)\};", text, re.S).group(1)
    names = re.findall(r"^\s*([a-z_]+),", body, re.M)
    count = int(re.search(r"kSourceKindCount = (\d+);", text).group(1))
    return names, count


def registrations():
    """[(file name, kind, registered name)] of every SourceRegistration in host_memory/."""
    found = []
    for path in sorted(HOST_MEMORY.glob("*.cpp")):
        for kind, name in re.findall(r'SourceRegistration \w+\(SourceKind::(\w+),\s*"(\w+)"',
                                     path.read_text()):
            found.append((path.name, kind, name))
    return found


def test_every_source_kind_has_one_registration_one_file_and_one_docs_row():
    names, count = kinds()
    assert len(names) == count, f"kSourceKindCount is {count}, SourceKind has {names}"
    found = registrations()
    cmake = (ROOT / "src" / "runtime" / "CMakeLists.txt").read_text()
    doc = (ROOT / "docs" / "worker.md").read_text()
    table = doc[doc.index("### Host sources"):]
    for kind in names:
        mine = [f for f in found if f[1] == kind]
        assert len(mine) == 1, f"SourceKind::{kind} is registered {len(mine)} times: {mine}"
        path, _, name = mine[0]
        assert name == kind, f"SourceKind::{kind} is registered as '{name}' in {path}"
        assert f"host_memory/{path}" in cmake, f"{path} ({kind}) is not built"
        assert f"| `{kind}` |" in table, f"docs/worker.md's Host sources table lacks {kind}"
    assert len(found) == len(names), f"registrations of no SourceKind: {found}"
