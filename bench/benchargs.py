"""Conventions shared by the bench/ scripts: --dry-run, and --json written atomically."""
import argparse
import json
import os
import pathlib
import importlib.util


def add_dry_run(ap: argparse.ArgumentParser) -> None:
    """--dry-run: parse and check the arguments, then exit 0 before any work (the docs
    tests run every documented bench command line this way)."""
    ap.add_argument("--dry-run", action="store_true",
                    help="check the arguments and exit (the docs tests' check)")


def add_build_and_rounds(ap: argparse.ArgumentParser, flag: str, default) -> None:
    """The build folder option ``flag`` (PINSTAGE_BUILD_DIR, else ``default``) and --rounds
    (3), which the torch comparison benches share."""
    ap.add_argument(flag, default=os.environ.get("PINSTAGE_BUILD_DIR", default))
    ap.add_argument("--rounds", type=int, default=3)


def dry_run_done(args: argparse.Namespace) -> bool:
    """True, after saying so, when --dry-run was given: the caller then returns 0."""
    if args.dry_run:
        print("dry run: arguments parsed; nothing was run")
    return args.dry_run


def _plot_module():
    """This tree's python/pinstage/plot.py, loaded by path: it needs nothing compiled, and a
    bench may write before (or without) the build's package on sys.path."""
    spec = importlib.util.spec_from_file_location(
        "_pinstage_plot", pathlib.Path(__file__).resolve().parents[1] / "python/pinstage/plot.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write_json_atomically(path, doc):
    """Writes `doc` as JSON to `path` through a temp file and a rename (plot.py's
    write_atomically): a reader sees the old file or the new one, never a part."""
    def write(f):
        json.dump(doc, f, indent=1)
        f.write("\n")

    _plot_module().write_atomically(path, write)
