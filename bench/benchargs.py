"""Argument conventions shared by the bench/ scripts."""
import argparse


def add_dry_run(ap: argparse.ArgumentParser) -> None:
    """--dry-run: parse and check the arguments, then exit 0 before any work (the docs
    tests run every documented bench command line this way)."""
    ap.add_argument("--dry-run", action="store_true",
                    help="check the arguments and exit (the docs tests' check)")


def dry_run_done(args: argparse.Namespace) -> bool:
    """True, after saying so, when --dry-run was given: the caller then returns 0."""
    if args.dry_run:
        print("dry run: arguments parsed; nothing was run")
    return args.dry_run
