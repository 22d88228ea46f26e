"""One CLI convention, on every command (docs/cli.md, "Conventions"): `--json FILE|-` and
`--quiet` are accepted everywhere; `--json -` puts the JSON report alone on stdout and the
text on stderr; `--quiet` drops progress and chatter, never the result."""
import json
import os
import shutil
import struct
import subprocess
import tempfile

import pytest

pytestmark = pytest.mark.once  # the same in both pytest passes: run in one (pyproject.toml)


def run(cli, args, cwd):
    done = subprocess.run([str(cli), *args], capture_output=True, text=True, timeout=300, cwd=cwd)
    assert done.returncode == 0, (args, done.stderr)
    return done


@pytest.fixture(scope="module", autouse=True)
def cache_dir():
    """The cache commands' directory: a temporary one of this module in /dev/shm (tmpfs, as
    the cache needs), named by PINSTAGE_CACHE_DIR for every command run here, so none
    touches the user's default cache; removed afterwards."""
    d = tempfile.mkdtemp(prefix="pinstage-conventions-", dir="/dev/shm")
    os.environ["PINSTAGE_CACHE_DIR"] = d
    yield d
    del os.environ["PINSTAGE_CACHE_DIR"]
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="module")
def files(cli, tmp_path_factory):
    """Two synthetic bench reports and a small checkpoint, made once."""
    d = tmp_path_factory.mktemp("conventions")
    for name in ("a.json", "b.json"):
        run(cli, ["bench", "synthetic", "--tensors", "2", "--bytes", "4096", "--groups", "1",
                  "--rounds", "2", "--no-baseline", "--no-plot", "-q", "--json", name], d)
    # A small checkpoint (4 MB), written by hand: the qwen3 fixture's smallest is 1 GB.
    header = {"w": {"dtype": "F32", "shape": [1024, 1024], "data_offsets": [0, 4 << 20]}}
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    (d / "ckpt.safetensors").write_bytes(struct.pack("<Q", len(text)) + text + bytes(4 << 20))
    return d


# (command, the result's marker: printed with or without --quiet, chatter's marker: only
# without --quiet; None where the command has no chatter)
COMMANDS = [
    (["info"], "backends:", None),
    (["demo", "--mib", "1"], "round trip bit-exact", "worker: sim backend"),
    (["fixture", "qwen3-decode", "--layers", "1", "--seq-len", "16", "--size-only"],
     "tensors, 19 inputs", None),
    (["fixture", "qwen3-decode", "--layers", "1", "--seq-len", "16"], "generate:",
     "qwen3-decode fixture:"),
    (["bench", "synthetic", "--tensors", "2", "--bytes", "4096", "--groups", "1", "--rounds", "2",
      "--no-baseline"], "pinned", "pinstage bench:"),
    (["bench", "qwen3-decode", "--layers", "1", "--seq-len", "16", "--steps", "2", "--groups",
      "1"], "target: staging", None),
    (["bench", "compare", "a.json", "b.json"], "options that differ", "A: a.json"),
    (["scene", "qwen3-decode", "--layers", "1", "--seq-len", "16"], "PASS",
     "qwen3-decode scene:"),
    (["load", "ckpt.safetensors"], "loaded", None),
    (["load", "ckpt.safetensors", "--tp", "2"], "loaded 1 tensor for 2 ranks",
     "plan: none given"),
    (["hash", "ckpt.safetensors"], "hashed 1 tensor", "sidecar: ckpt.safetensors.pinstage"),
    (["bench", "load", "ckpt.safetensors", "--rounds", "1"], "goal", "bench load ckpt"),
    (["plot", "a.json", "--out", "p.png"], None, "picture: p.png"),
    (["cache"], " pages", None),
    (["cache", "put", "ckpt.safetensors"], "ckpt.safetensors: ", None),
    (["cache", "ls"], "ckpt.safetensors", "cache /dev/shm/pinstage-conventions-"),
    (["cache", "rm", "ckpt.safetensors"], None, "removed the cache entry of ckpt.safetensors"),
    (["cache", "prune"], "pruned", None),
]
# Commands that need an entry of ckpt.safetensors before each run (rm removes it).
NEEDS_ENTRY = (["cache", "ls"], ["cache", "rm", "ckpt.safetensors"])


def run_as_given(cli, args, cwd):
    """run(), after making the cache entry a command of NEEDS_ENTRY needs."""
    if any(args[:len(n)] == n for n in NEEDS_ENTRY):
        run(cli, ["cache", "put", "ckpt.safetensors", "-q"], cwd)
    return run(cli, args, cwd)


@pytest.mark.parametrize("args,result,chat", COMMANDS, ids=[" ".join(c[0][:2]) for c in COMMANDS])
def test_json_dash_and_quiet_mean_one_thing_everywhere(cli, files, args, result, chat):
    loud = run_as_given(cli, args, files)
    if result:
        assert result in loud.stdout, loud.stdout
    if chat:
        assert chat in loud.stdout, loud.stdout
    quiet = run_as_given(cli, [*args, "--quiet"], files)
    if result:
        assert result in quiet.stdout, quiet.stdout  # never the result
    if chat:
        assert chat not in quiet.stdout, quiet.stdout  # always the chatter
    as_json = run_as_given(cli, [*args, "--json", "-"], files)
    report = json.loads(as_json.stdout)  # stdout holds the report alone
    assert "run" in report and report["run"]["options"]
    if result:
        assert result in as_json.stderr  # the text moved to stderr
    both = run_as_given(cli, [*args, "-q", "--json", "-"], files)
    assert json.loads(both.stdout)["run"]
    if chat:
        assert chat not in both.stderr


def test_an_empty_json_is_refused_by_every_command(cli, files):
    for args, _, _ in COMMANDS:
        done = subprocess.run([str(cli), *args, "--json", ""], capture_output=True, text=True,
                              timeout=60, cwd=files)
        assert done.returncode == 1, args
        assert "--json is empty" in done.stderr, (args, done.stderr)


def test_hash_makes_an_unhashed_checkpoint_verifiable(cli, tmp_path):
    header = {"w": {"dtype": "U8", "shape": [4096], "data_offsets": [0, 4096]}}
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    ckpt = tmp_path / "hf.safetensors"
    ckpt.write_bytes(struct.pack("<Q", len(text)) + text + bytes(range(256)) * 16)
    refused = subprocess.run([str(cli), "load", str(ckpt), "--verify"], capture_output=True,
                             text=True, timeout=60)
    assert refused.returncode == 1 and f"pinstage hash {ckpt}" in refused.stderr
    run(cli, ["hash", str(ckpt)], tmp_path)
    assert (tmp_path / "hf.safetensors.pinstage.xxh3.json").exists()
    ok = run(cli, ["load", str(ckpt), "--verify"], tmp_path)
    assert "matches the recorded one" in ok.stdout
    data = bytearray(ckpt.read_bytes())
    data[-1] ^= 1  # a damaged byte, same layout
    mtime_ns = ckpt.stat().st_mtime_ns
    ckpt.write_bytes(bytes(data))  # in place: same inode and size
    os.utime(ckpt, ns=(mtime_ns, mtime_ns))  # damage leaves the time as it was
    bad = subprocess.run([str(cli), "load", str(ckpt), "--verify"], capture_output=True,
                         text=True, timeout=60)
    assert bad.returncode == 1 and "tensor 'w' fails its integrity check" in bad.stderr


def test_compare_lists_the_differing_options_first_and_no_change_of_zeros(cli, files):
    a = json.loads((files / "a.json").read_text())
    b = json.loads((files / "b.json").read_text())
    b["run"]["options"]["--rounds"] = "7"  # as if run with another option
    del b["run"]["options"]["--no-plot"]
    for doc in (a, b):  # allocation too fast to show at the table's precision
        for arm in doc["summary"]["arms"]:
            arm["median_alloc_seconds"] = 2e-7 if doc is a else 3e-7
    (files / "a2.json").write_text(json.dumps(a))
    (files / "b2.json").write_text(json.dumps(b))
    out = run(cli, ["bench", "compare", "a2.json", "b2.json"], files).stdout
    differ = out.index("options that differ:")
    assert out.index("--rounds: 2 (A) vs 7 (B)") > differ
    assert "--no-plot: true (A) vs (absent) (B)" in out
    assert out.index("--rounds") < out.index("best bind ms")  # before the figures
    alloc = [line for line in out.splitlines() if "alloc ms (median)" in line]
    assert alloc and all(line.split()[-1] == "-" for line in alloc), alloc
    same = run(cli, ["bench", "compare", "a.json", "a.json"], files).stdout
    assert "options that differ: none" in same
