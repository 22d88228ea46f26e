"""Every ```cpp block of README.md and docs/**/*.md compiles against the build's headers and
libraries and runs (issue 22), so a C++ snippet cannot name a header or a function that is
not there. Each block becomes the body of a function of one program (its #include lines go
to the top, `#line` keeps compiler messages on the doc's own lines); the program runs every
block in order, in a scratch folder holding a small checkpoint `model/`, and prints each
block's name when it returned.

The line before a block may mark it, `<!-- docs-test: MODE[: reason] -->`:
- (no mark): compiled and run.
- `continues`: the rest of the block before it in the same file (same function).
- `compile: reason`: compiled, not run (it needs a GPU or an NPU).
- `declarations: reason`: namespace-scope code (a class to derive from), checked by the
  compiler (-fsyntax-only) with the others' headers.
"""
import json
import struct
import subprocess

import pytest

from conftest import DOCS, ROOT, fenced_blocks

pytestmark = pytest.mark.once  # the same in both pytest passes: run in one (pyproject.toml)

BLOCK = fenced_blocks("cpp")
MODES = ("continues", "compile", "declarations")
COMMON = ["#include <cstdio>", "#include <cstring>", "#include <exception>", "#include <string>",
          "#include <vector>"]


def collect():
    """[(name, mode, [(doc, first_line, body), ...])], continuations merged."""
    out = []
    for doc in DOCS:
        text = doc.read_text()
        for m in BLOCK.finditer(text):
            line = text.count("\n", 0, m.start("body")) + 1
            mark = m.group("mark") or ""
            mode, _, reason = (p.strip() for p in mark.partition(":"))
            assert mode in ("",) + MODES, f"{doc.name}:{line}: unknown docs-test mode '{mode}'"
            assert mode in ("", "continues") or reason, f"{doc.name}:{line}: {mode} needs a reason"
            rel = str(doc.relative_to(ROOT))
            if mode == "continues":
                assert out and out[-1][2][0][0] == rel, f"{rel}:{line}: continues nothing"
                out[-1][2].append((rel, line, m.group("body")))
                continue
            out.append((f"{rel}:{line}", mode or "run", [(rel, line, m.group("body"))]))
    return out


def split(body):
    includes = [l for l in body.splitlines() if l.startswith("#include")]
    rest = "\n".join("" if l.startswith("#include") else l for l in body.splitlines())
    return includes, rest


def program(blocks):
    includes, functions, calls = list(COMMON), [], []
    for i, (name, mode, parts) in enumerate(blocks):
        if mode == "declarations":
            continue
        body = []
        for rel, line, text in parts:
            inc, rest = split(text)
            includes += inc
            body.append(f'#line {line} "{rel}"\n{rest}')
        functions.append(f"void block_{i}() {{\n" + "\n".join(body) + "\n}\n")
        if mode == "run":
            calls.append(f'  block_{i}();\n  std::printf("ok %s\\n", "{name}");\n'
                         "  std::fflush(stdout);\n")
    return "\n".join(dict.fromkeys(includes)) + "\n\n" + "\n".join(functions) + \
        "int main() {\n" + "".join(calls) + "  return 0;\n}\n"


def declarations(blocks):
    includes, bodies = list(COMMON), []
    for name, mode, parts in blocks:
        if mode != "declarations":
            continue
        for rel, line, text in parts:
            inc, rest = split(text)
            includes += inc
            bodies.append(f"namespace block_{len(bodies)} {{\nusing namespace pinstage;\n"
                          f'#line {line} "{rel}"\n{rest}\n}}\n')
    return "\n".join(dict.fromkeys(includes + ["#include \"pinstage/scene.h\""])) + "\n" + \
        "\n".join(bodies)


def compiler(build_dir, source, out, syntax_only=False):
    cmd = ["c++", "-std=c++20", "-O1", f"-I{ROOT / 'include'}", f"-I{build_dir / 'include'}",
           f"-I{ROOT / 'scenes' / 'qwen3' / 'include'}", str(source)]
    if syntax_only:
        return cmd + ["-fsyntax-only"]
    lib = build_dir / "lib"
    return cmd + ["-o", str(out), f"-L{lib}", f"-Wl,-rpath,{lib}", "-lpinstage",
                  "-lpinstage_scene_qwen3", "-lpinstage_base", "-pthread"]


def write_checkpoint(folder):
    folder.mkdir()
    header = {"w": {"dtype": "F32", "shape": [64, 64], "data_offsets": [0, 64 * 64 * 4]}}
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    (folder / "model.safetensors").write_bytes(struct.pack("<Q", len(text)) + text +
                                               bytes(64 * 64 * 4))


@pytest.fixture(scope="module")
def ran(build_dir, tmp_path_factory):
    blocks = collect()
    d = tmp_path_factory.mktemp("docs_cpp")
    (d / "docs.cpp").write_text(program(blocks))
    built = subprocess.run(compiler(build_dir, d / "docs.cpp", d / "docs"), capture_output=True,
                           text=True, timeout=600)
    assert built.returncode == 0, "a C++ snippet does not compile:\n" + built.stderr[-6000:]
    write_checkpoint(d / "model")
    done = subprocess.run([str(d / "docs")], cwd=d, capture_output=True, text=True, timeout=600)
    return blocks, d, done


def test_every_snippet_compiles_and_runs(ran):
    blocks, _, done = ran
    assert done.returncode == 0, f"stdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    ran_ok = {line[3:] for line in done.stdout.splitlines() if line.startswith("ok ")}
    expected = {name for name, mode, _ in blocks if mode == "run"}
    assert ran_ok == expected
    assert len(expected) >= 7
    assert "still alive" not in done.stderr, done.stderr  # no example leaks a handle


def test_namespace_scope_snippets_compile(build_dir, tmp_path):
    (tmp_path / "decl.cpp").write_text(declarations(collect()))
    done = subprocess.run(compiler(build_dir, tmp_path / "decl.cpp", None, syntax_only=True),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-6000:]


def test_a_planted_error_in_a_snippet_fails(build_dir, tmp_path):
    bad = [("x.md:1", "run", [("docs/x.md", 3,
                               '#include "pinstage/worker.h"\npinstage::Worker w;\n'
                               'w.init_device("sim");\n')])]
    (tmp_path / "bad.cpp").write_text(program(bad))
    done = subprocess.run(compiler(build_dir, tmp_path / "bad.cpp", tmp_path / "bad"),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode != 0
    assert "docs/x.md:5" in done.stderr, done.stderr  # the doc's own line
