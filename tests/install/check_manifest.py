#!/usr/bin/env python3
"""docs/install.md's "What goes where" table against what `cmake --install` installed:
every installed file (the build's install_manifest.txt) matches a row of the table, and
every row matches an installed file (a row that says "only with" may match none).

  check_manifest.py <install_manifest.txt> <prefix it was installed to> <docs/install.md>

A row's path is a file, or a folder when it ends in "/"; `<libdir>` stands for the
installed library folder, `<name>` for any name. Files listed in the row's contents
("`LICENSE`, `CHANGELOG.md`") are the files of a folder row."""
import pathlib
import re
import sys


def table_rows(markdown):
    """[(patterns, optional)] of the table under the '## What goes where' heading."""
    section = markdown.split("## What goes where", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 2 or not cells[0].startswith("`"):
            continue
        paths = re.findall(r"`([^`]+)`", cells[0])
        rows.append((paths, "only with" in cells[1]))
    if not rows:
        sys.exit("check_manifest: docs/install.md has no 'What goes where' table")
    return rows


def pattern(path, libdir):
    """The regex for a row's path: a file, or everything under a folder."""
    out = re.escape(path.replace("<libdir>", "\0"))
    out = out.replace("\0", re.escape(libdir)).replace(re.escape("<name>"), "[^/]+")
    return out + (".*" if path.endswith("/") else "")


def main(manifest, prefix, doc):
    prefix = prefix.rstrip("/") + "/"
    installed = []
    for line in pathlib.Path(manifest).read_text().splitlines():
        if line.startswith(prefix):
            installed.append(line[len(prefix):])
    if not installed:
        sys.exit(f"check_manifest: {manifest} lists nothing under {prefix}")
    libdir = next(f.rsplit("/", 1)[0] for f in installed if f.endswith("/libpinstage.so"))
    rows = [([re.compile(pattern(p, libdir)) for p in paths], paths, optional)
            for paths, optional in table_rows(pathlib.Path(doc).read_text())]
    # A folder row is matched by its own files only when no more specific row matches.
    def best(f):
        hits = [(len(p.pattern), i) for i, (pats, _, _) in enumerate(rows)
                for p in pats if p.fullmatch(f)]
        return max(hits)[1] if hits else None

    unlisted = [f for f in installed if best(f) is None]
    used = {best(f) for f in installed}
    unused = [paths for i, (_, paths, optional) in enumerate(rows)
              if i not in used and not optional]
    errors = [f"installed but not in docs/install.md's table: {f}" for f in unlisted]
    errors += [f"in docs/install.md's table but not installed: {', '.join(p)}" for p in unused]
    for e in errors:
        print(f"check_manifest: {e}", file=sys.stderr)
    if errors:
        return 1
    print(f"check_manifest: {len(installed)} installed files, {len(rows)} rows: all listed")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    sys.exit(main(*sys.argv[1:]))
