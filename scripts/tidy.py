#!/usr/bin/env python3
"""Runs clang-tidy over files, one process a core, skipping a file whose last clean run
had the same input.

    scripts/tidy.py BUILD_DIR [--checks CHECKS] FILE... [--size-only FILE...]

--size-only files get only readability-function-size (the 80-line rule). All files share
one pool of a process a core, the slowest kinds first, so no core idles at the end while
one long file finishes alone. The static analyzer runs in its shallow mode
(-analyzer-config mode=shallow: small functions inlined, 75,000 nodes a function), the
mode an IDE runs on every build: the deep mode took 1.7-2.5 times as long for the same
checks (host_pool.cpp 35.6 s against 16.6 s, dma.cpp 28.0 against 11.3, with no
analyzer at all 13.0 and 8.4; one file at a time, 2026-12-08), and a cold run over every
file 808 s of clang-tidy against 570 s (docs/benchmarks.md), while the sanitizers and
fuzzers run the paths it would explore. In apps/ and tools/ it
inlines only C functions and static methods as well (ipa=basic-inlining): their code is
glue over CLI11's templates (cli_common.cpp 12.5 s shallow, 10.5 s with both).

A clean file is remembered under ${XDG_CACHE_HOME:-~/.cache}/pinstage/tidy by a hash of
its preprocessed text with comments (so every header it includes, and each NOLINT), the
.clang-tidy files that apply to it, --checks and clang-tidy's version. A warm CI run then tidies only what changed: the
cold run costs minutes (CLI11's and pybind11's headers), the warm one seconds. Files with
findings are never remembered. Exits 1 if any file has a finding, printing them.
"""
import argparse
import concurrent.futures
import hashlib
import json
import os
import pathlib
import shlex
import subprocess
import sys
import time


def config_files(source: pathlib.Path, root: pathlib.Path):
    """The .clang-tidy files from the source's folder up to the tree's root."""
    found, folder = [], source.parent
    while True:
        if (folder / ".clang-tidy").is_file():
            found.append(folder / ".clang-tidy")
        if folder == root or folder == folder.parent:
            return found
        folder = folder.parent


def preprocessed(entry, root: pathlib.Path) -> bytes:
    """The file's text after the preprocessor, with its build's flags: comments kept (a
    NOLINT is one) and line markers too (line counts are a check), the tree's folder
    taken out of them so that any clone of the same text has the same key."""
    args = entry["arguments"] if "arguments" in entry else shlex.split(entry["command"])
    out = args.index("-o")
    args = args[:out] + args[out + 2:]  # no object file: -E writes to stdout
    done = subprocess.run(args + ["-E", "-C"], cwd=entry["directory"], capture_output=True)
    if done.returncode != 0:
        raise RuntimeError(f"preprocessing {entry['file']} failed:\n{done.stderr.decode()}")
    return done.stdout.replace(str(root).encode(), b"<root>")


def analyzer_config(setting: str) -> list:
    return ["--extra-arg=-Xclang", "--extra-arg=-analyzer-config", "--extra-arg=-Xclang",
            f"--extra-arg={setting}"]


LIGHT_ANALYZER = ("apps/", "tools/")
SIZE_ONLY = "-*,readability-function-size"


def tidy_args(name: str, checks: str) -> list:
    """clang-tidy's arguments for one file beyond -p and the file."""
    args = [f"--checks={checks}"] if checks else []
    if checks != SIZE_ONLY:
        args += analyzer_config("mode=shallow")
        if name.startswith(LIGHT_ANALYZER):
            args += analyzer_config("ipa=basic-inlining")
    return args


def cost_rank(name: str, checks: str) -> int:
    """The slowest kinds first: the CLI's (CLI11), the bindings' (pybind11), the rest."""
    if checks != SIZE_ONLY and name.startswith(LIGHT_ANALYZER):
        return 0
    return 1 if name.startswith("python/") else 2


def key(entry, source, root, args, version) -> str:
    h = hashlib.sha256(version.encode())
    h.update(" ".join(args).encode() + b"\0" + str(source.relative_to(root)).encode() + b"\0")
    for config in config_files(source, root):
        h.update(config.read_bytes())
    h.update(preprocessed(entry, root))
    return h.hexdigest()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("build")
    parser.add_argument("--checks", default="")
    parser.add_argument("files", nargs="+")
    parser.add_argument("--size-only", nargs="+", default=[],
                        help="files checked only for the 80-line rule")
    a = parser.parse_args()
    root = pathlib.Path(__file__).resolve().parent.parent
    build = pathlib.Path(a.build).resolve()
    entries = {str(pathlib.Path(e["file"]).resolve()): e
               for e in json.loads((build / "compile_commands.json").read_text())}
    version = subprocess.run(["clang-tidy", "--version"], capture_output=True,
                             text=True, check=True).stdout
    cache = pathlib.Path(os.environ.get("XDG_CACHE_HOME", pathlib.Path.home() / ".cache"))
    cache = cache / "pinstage" / "tidy"
    cache.mkdir(parents=True, exist_ok=True)
    work = [(n, a.checks) for n in a.files] + [(n, SIZE_ONLY) for n in a.size_only]
    work.sort(key=lambda w: cost_rank(*w))  # stable: the given order within a kind

    def one(item):
        name, checks = item
        source = (root / name).resolve()
        entry = entries.get(str(source))
        if entry is None:
            return name, False, f"{name}: not in {build}/compile_commands.json\n"
        args = tidy_args(name, checks)
        mark = cache / key(entry, source, root, args, version)
        if mark.exists():
            return name, True, None
        start = time.monotonic()
        done = subprocess.run(["clang-tidy", "-p", str(build), "--quiet", *args, str(source)],
                              capture_output=True, text=True)
        seconds[name] = time.monotonic() - start
        if done.returncode == 0:
            mark.touch()
            return name, False, None
        return name, False, done.stdout + done.stderr

    failed, cached, seconds = 0, 0, {}
    with concurrent.futures.ThreadPoolExecutor(os.cpu_count() or 1) as pool:
        for name, hit, finding in pool.map(one, work):
            cached += hit
            if finding is not None:
                failed += 1
                lines = [ln for ln in finding.splitlines() if "warnings generated" not in ln]
                print("\n".join(lines), flush=True)
    print(f"tidy.py: {len(work)} files, {cached} unchanged since a clean run, "
          f"{failed} with findings")
    if seconds:  # where a cold run's time goes
        slowest = sorted(seconds.items(), key=lambda kv: -kv[1])[:5]
        print(f"tidy.py: {sum(seconds.values()):.0f} s of clang-tidy; slowest: "
              + ", ".join(f"{n} {t:.0f} s" for n, t in slowest))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
