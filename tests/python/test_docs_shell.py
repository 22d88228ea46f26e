"""Every fenced ```sh block of README.md and docs/**/*.md runs (issue 22), so a documented
command cannot drift from the program. A block runs as one bash script (`set -e`) in a
scratch folder where `build` is the build under test (its bin/ on PATH), `scripts`,
`bench`, `python` and `tests` are the repository's, HOME and OUT are scratch folders.

The line before a block may mark it, `<!-- docs-test: MODE[: reason] -->`:
- (no mark): run as written.
- `dry-run`: a benchmark of minutes; every `pinstage` runs as `pinstage --dry-run` (the
  whole command line is parsed and checked, nothing runs), every `build/bin/bench_*` lists
  its benchmarks (`--benchmark_list_tests=true`, which checks its flags), every `ctest`
  lists its tests (`-N`) and every `bench/*.py` script runs with `--dry-run`.
- `hardware: why`: needs a GPU or an NPU; not run here (scripts/gpu-check.sh and
  scripts/npu-check.sh run those commands on the hardware).
- `elsewhere: where`: run as written by another check (the quick start's test command by
  .ci/run, an install by tests/install/install_test.sh); `where` must start with a file
  of the repository that runs one of the block's programs.
"""
import os
import re
import subprocess

import pytest

from conftest import DOCS, ROOT, fenced_blocks

pytestmark = pytest.mark.once  # the same in both pytest passes: run in one (pyproject.toml)

BLOCK = fenced_blocks("sh")
MODES = ("dry-run", "hardware", "elsewhere")
# `pinstage` as a program (not pinstage_gpu_probe, not a path segment).
PINSTAGE = re.compile(r"(?<![\w/-])((?:[\w.$/-]*/)?pinstage)(?=\s|$)")


def blocks():
    for doc in DOCS:
        text = doc.read_text()
        for m in BLOCK.finditer(text):
            line = text.count("\n", 0, m.start("body"))
            yield pytest.param(doc, m.group("mark") or "", m.group("body"),
                               id=f"{doc.relative_to(ROOT)}:{line}")


def parse_mark(mark):
    if not mark:
        return "run", ""
    mode, _, reason = (part.strip() for part in mark.partition(":"))
    assert mode in MODES, f"unknown docs-test mode '{mode}' (known: {', '.join(MODES)})"
    assert mode == "dry-run" or reason, f"docs-test: {mode} needs a reason"
    return mode, reason


def dry(body):
    """The block with every long command turned into its checking form."""
    out = []
    for line in body.splitlines():
        line = PINSTAGE.sub(r"\1 --dry-run", line)
        line = re.sub(r"((?:\S*/)?bin/bench_\w+)", r"\1 --benchmark_list_tests=true", line)
        line = re.sub(r"\bctest\b", "ctest -N", line)
        line = re.sub(r"(bench/\w+\.py)", r"\1 --dry-run", line)
        out.append(line)
    return "\n".join(out) + "\n"


@pytest.fixture
def scratch(tmp_path, build_dir):
    (tmp_path / "build").symlink_to(build_dir)
    for name in ("scripts", "bench", "python", "tests"):
        (tmp_path / name).symlink_to(ROOT / name)
    (tmp_path / "home").mkdir()
    (tmp_path / "out").mkdir()
    return tmp_path


@pytest.mark.parametrize("doc,mark,body", list(blocks()))
def test_every_shell_block_runs_as_written(doc, mark, body, scratch, build_dir):
    mode, reason = parse_mark(mark)
    if mode == "hardware":
        pytest.skip(f"needs hardware: {reason}")
    if mode == "elsewhere":
        where = ROOT / reason.split()[0]
        assert where.is_file(), f"docs-test: elsewhere names '{reason}', not a file"
        programs = []  # each line's program, past its VAR=value assignments
        for line in body.splitlines():
            words = [w for w in line.split("#")[0].split() if not re.match(r"^\w+=", w)]
            if words:
                programs.append(words[0].lstrip("./"))
        assert any(p in where.read_text() for p in programs), \
            f"{where} runs none of {programs}"
        return
    script = body if mode == "run" else dry(body)
    env = dict(os.environ, HOME=str(scratch / "home"), OUT=str(scratch / "out"),
               PATH=f"{build_dir / 'bin'}:{os.environ['PATH']}",
               PYTHONPATH=str(build_dir / "python"))
    done = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", script], cwd=scratch, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"{doc.name}:\n{script}\nstdout:\n{done.stdout}\n" \
                                 f"stderr:\n{done.stderr}"


def test_a_planted_error_in_a_shell_block_fails(scratch, build_dir):
    """The check itself: a misspelt option fails in either mode."""
    env = dict(os.environ, PATH=f"{build_dir / 'bin'}:{os.environ['PATH']}")
    for script in ("pinstage demo --mibs 1\n", dry("pinstage bench qwen3-decode --layer 2\n")):
        done = subprocess.run(["bash", "-e", "-c", script], cwd=scratch, env=env,
                              capture_output=True, text=True, timeout=60)
        assert done.returncode != 0, script
        assert "not expected" in done.stderr, done.stderr
    assert dry("build/bin/pinstage bench x\n") == "build/bin/pinstage --dry-run bench x\n"
    assert dry("pinstage_gpu_probe --x\n") == "pinstage_gpu_probe --x\n"
