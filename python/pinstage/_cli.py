"""The `pinstage` console command pip installs: runs the CLI binary built with the package
(pinstage-cli, beside libpinstage in the package folder: setup.py), or, in a build tree,
<build>/bin/pinstage. Same arguments, output and exit status (docs/cli.md)."""
import os
import pathlib
import sys


def cli_path():
    """The CLI binary this package runs, or None when it has none."""
    here = pathlib.Path(__file__).resolve().parent
    for candidate in (here / "pinstage-cli", here.parent.parent / "bin" / "pinstage"):
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    return None


def main():
    exe = cli_path()
    if exe is None:
        sys.exit("pinstage: this install of the Python package has no CLI binary "
                 "(pinstage-cli next to the package; docs/python.md, \"Install\")")
    # pinstage-cli finds libpinstage and the scene libraries beside itself (RUNPATH $ORIGIN,
    # setup.py's PINSTAGE_PYTHON_PACKAGE): it also runs directly, with no LD_LIBRARY_PATH.
    os.execv(exe, ["pinstage", *sys.argv[1:]])


if __name__ == "__main__":
    main()
