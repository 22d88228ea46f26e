"""Issue 42: docs/cli.md says --quiet drops the header, the size plan and the notes and keeps
the result; `bench synthetic -q` printed all three. It must print the tables, the summary's
verdicts and targets, and none of the chatter."""
import subprocess

import pytest

pytestmark = pytest.mark.once  # the same in both pytest passes: run in one (pyproject.toml)

SMALL = ["--tensors", "2", "--bytes", "4096", "--groups", "1", "--rounds", "2"]


def bench(cli, *extra):
    proc = subprocess.run([str(cli), "bench", "synthetic", *SMALL, *extra], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout + proc.stderr


def test_quiet_bench_synthetic_prints_the_result_without_chatter(cli):
    loud = bench(cli)
    quiet = bench(cli, "-q")
    chatter = ["pinstage bench synthetic: backend",  # the header
               "args: ",                              # the sizes, part of the header
               "pinstage bench: ",                    # the size plan
               "note: "]                              # the notes
    for line in chatter:
        assert line in loud, f"{line!r} is no longer printed at all; update this test"
        assert line not in quiet, f"-q printed {line!r}:\n{quiet}"
    assert "summary:" in quiet and "pinned" in quiet  # the result stays
