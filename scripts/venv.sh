#!/usr/bin/env bash
# Makes once, or reuses, the PyPI venv of the ecosystem checks and prints its path.
#
#   scripts/venv.sh [REQUIREMENTS]      # default requirements/peers.txt
#   scripts/venv.sh requirements/engines.txt   # vLLM's (docs/engines.md)
#
# The venv lives outside the clone, in ${XDG_CACHE_HOME:-~/.cache}/pinstage/venv-<key>,
# <key> the hash of the requirements file and of the base interpreter (its path and
# version): a fresh clone on the same machine reuses it, a changed file or interpreter
# gets a new one. It is made from /usr/bin/python3 (PINSTAGE_VENV_PYTHON overrides), the
# interpreter build/python's module is built for, so that module imports in it as is.
#
# Built atomically: into venv-<key>.build.XXXXXX next to it, published by renaming a
# symlink venv-<key> -> that folder only once every package installed, `pip check` passed
# and the packages imported (the folder itself never moves: pip's scripts name it). An
# interrupted build is never published and is removed by the next run. A lock serializes
# concurrent runs. Downloads go through a folder of wheels inside the build, deleted once
# installed; their bytes and time are printed on stderr.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
req=${1:-$root/requirements/peers.txt}
base=${PINSTAGE_VENV_PYTHON:-/usr/bin/python3}

say() { echo "venv.sh: $*" >&2; }
die() { say "$*"; exit 1; }

[ -f "$req" ] || die "no requirements file $req"
[ -x "$base" ] || die "no interpreter $base (set PINSTAGE_VENV_PYTHON)"
command -v flock >/dev/null || die "flock (util-linux) is needed to serialize venv builds"
req=$(cd "$(dirname "$req")" && pwd)/$(basename "$req")

key=$({ cat "$req"; echo "$base"; "$base" -c 'import sys; print(sys.version)'; } \
      | sha256sum | cut -c1-16)
cache=${XDG_CACHE_HOME:-$HOME/.cache}/pinstage
venv=$cache/venv-$key
mkdir -p "$cache"

# Published and complete: reuse (no lock needed, the symlink appears only when complete).
if [ -L "$venv" ] && [ -f "$venv/.pinstage-complete" ]; then
  echo "$venv"
  exit 0
fi

exec 9>"$cache/venv-$key.lock"
flock 9
if [ -L "$venv" ] && [ -f "$venv/.pinstage-complete" ]; then  # made while we waited
  echo "$venv"
  exit 0
fi
# Leftovers of interrupted builds (we hold the lock: none is running).
rm -rf "$venv" "$cache/venv-$key".build.* "$cache/venv-$key.link"

index=${PIP_INDEX_URL:-https://pypi.org/simple}
unreachable="cannot reach the package index $index (PIP_INDEX_URL): the ecosystem venv
($venv) is downloaded from it once per requirements file; run where PyPI is reachable,
or set PIP_INDEX_URL to a mirror"
"$base" - "$index" <<'EOF' || die "$unreachable"
import sys, urllib.request
try:
    urllib.request.urlopen(sys.argv[1].rstrip("/") + "/pip/", timeout=20).close()
except Exception as e:
    print(f"venv.sh: {sys.argv[1]}: {e}", file=sys.stderr)
    sys.exit(1)
EOF

build=$(mktemp -d "$cache/venv-$key.build.XXXXXX")
chmod 755 "$build"
trap 'rm -rf "$build"' EXIT
say "building $venv from $req (a first build downloads about 3 GB: torch's CUDA wheels)"
t0=$(date +%s.%N)
"$base" -m venv "$build"
py=$build/bin/python
pip=("$py" -m pip --disable-pip-version-check --no-input --no-cache-dir)
"${pip[@]}" download --quiet --retries 2 --timeout 60 --only-binary=:all: --no-deps \
  -r "$req" -d "$build/.wheels" || die "downloading the wheels of $req failed (above)"
t1=$(date +%s.%N)
bytes=$(du -sb "$build/.wheels" | cut -f1)
files=$(find "$build/.wheels" -type f | wc -l)
"${pip[@]}" install --quiet --no-index --find-links "$build/.wheels" --no-deps -r "$req" \
  || die "installing $req failed (above)"
"${pip[@]}" check >&2 || die "$req is not a complete, consistent set of pins (pip check above)"
rm -rf "$build/.wheels"
# What must import: the file's "# venv.sh-imports: a b c" line, else the peers' modules.
imports=$(sed -n 's/^# venv.sh-imports: *//p' "$req" | head -n 1)
imports=${imports:-torch numpy safetensors fastsafetensors runai_model_streamer hypothesis pytest huggingface_hub}
"$py" -c "import ${imports// /, }" || die "the venv's packages ($imports) do not import (above)"
t2=$(date +%s.%N)
"$base" - "$bytes" "$files" "$t0" "$t1" "$t2" <<'EOF' >&2
import sys
b, n, t0, t1, t2 = int(sys.argv[1]), int(sys.argv[2]), *map(float, sys.argv[3:])
print(f"venv.sh: downloaded {b / 1e9:.2f} GB ({b} bytes, {n} wheels) in {t1 - t0:.0f} s "
      f"({b / 1e6 / max(t1 - t0, 1e-9):.0f} MB/s); installed in {t2 - t1:.0f} s; "
      f"{t2 - t0:.0f} s in all")
EOF
touch "$build/.pinstage-complete"
ln -s "$(basename "$build")" "$cache/venv-$key.link"
mv -T "$cache/venv-$key.link" "$venv"  # rename(2): the venv appears complete or not at all
trap - EXIT
echo "$venv"
