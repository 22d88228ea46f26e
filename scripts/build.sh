#!/usr/bin/env bash
# Configures and builds pinstage:
#   scripts/build.sh [BUILD_DIR] [extra cmake args...] [-- ninja targets...]
# With targets after `--`, builds only those (a sanitizer stage builds what it runs).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
shift || true
cmake_args=() targets=()
while [ $# -gt 0 ]; do
  if [ "$1" = "--" ]; then shift; targets=("$@"); break; fi
  cmake_args+=("$1"); shift
done
source "$root/scripts/ccache-env.sh"
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DPython_EXECUTABLE=/usr/bin/python3 "${launcher[@]}" "${cmake_args[@]}" \
  >"$build.configure.log" 2>&1 || { cat "$build.configure.log"; exit 1; }
ninja -C "$build" -j"$(nproc)" "${targets[@]}"
