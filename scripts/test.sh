#!/usr/bin/env bash
# Every test: install, build, then the C++ suite (ctest) and the Python suite (pytest).
# GPU tests carry the ctest label requires_gpu and report as skipped without a GPU.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/setup.sh"
"$root/scripts/build.sh" "$root/build"
(cd "$root/build" && ctest --output-on-failure -j2 --timeout 900)
if [ -d "$root/tests/python" ] && ls "$root"/tests/python/test_*.py >/dev/null 2>&1; then
  PINSTAGE_BUILD_DIR="$root/build" /usr/bin/python3 -m pytest -q "$root/tests/python"
  # The same suite again on PyPI's torch 2.x and NumPy 2.x, with the peer loaders the
  # cross-implementation tests need (requirements/peers.txt; scripts/venv.sh makes the venv
  # once per machine, outside the clone). PINSTAGE_REQUIRE_PEERS=1: a missing peer fails.
  venv=$("$root/scripts/venv.sh")
  start=$SECONDS
  (cd "$root" && PINSTAGE_BUILD_DIR="$root/build" PINSTAGE_REQUIRE_PEERS=1 \
    "$venv/bin/python" -m pytest -q tests/python)
  echo "test.sh: the venv pass ($venv) took $((SECONDS - start)) s"
fi
