#!/usr/bin/env bash
# Configures and builds pinstage: scripts/build.sh [BUILD_DIR] [extra cmake args...]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
shift || true
# ccache (Debian's, installed by setup.sh) keeps objects across clones on this machine, so
# CI after a session, and every later build, recompiles only what changed.
# BASEDIR, NOHASHDIR and the ignored -fmacro-prefix-map (its value is the clone's folder;
# it maps that folder away, so the object is the same from any clone) make its keys
# independent of the clone's folder.
launcher=()
if command -v ccache >/dev/null; then
  export CCACHE_BASEDIR="$root" CCACHE_NOHASHDIR=1 CCACHE_IGNOREOPTIONS="-fmacro-prefix-map=*"
  launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache
            -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
fi
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DPython_EXECUTABLE=/usr/bin/python3 "${launcher[@]}" "$@" >"$build.configure.log" 2>&1 \
  || { cat "$build.configure.log"; exit 1; }
ninja -C "$build" -j"$(nproc)"
