#!/usr/bin/env bash
# Every test: install, build, then the C++ suite (ctest) and the Python suite (pytest),
# the latter twice at once: on Debian's Python and on PyPI's torch 2.x and NumPy 2.x.
# GPU tests carry the ctest label requires_gpu and report as skipped without a GPU.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/setup.sh"
# The PyPI venv of the second pass (requirements/peers.txt, with the peer loaders the
# cross-implementation tests need; made once per machine, outside the clone): made while
# the build compiles, since its time is mostly the download.
venv_log=$(mktemp)
# On any exit: no venv build or pytest pass left running, no log left behind.
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$venv_log" "$venv_log".*' EXIT
"$root/scripts/venv.sh" >"$venv_log.path" 2>"$venv_log" &
venv_pid=$!
"$root/scripts/build.sh" "$root/build"
(cd "$root/build" && ctest --output-on-failure -j2 --timeout 900)
venv_status=0
wait "$venv_pid" || venv_status=$?
cat "$venv_log" >&2
[ "$venv_status" -eq 0 ] || { echo "test.sh: scripts/venv.sh failed" >&2; exit 1; }
venv=$(cat "$venv_log.path")
# Both passes at once: each is mostly one core (the suite is serial), and the machine has
# two. PINSTAGE_REQUIRE_PEERS=1: a missing peer fails the venv pass. The venv pass first
# builds the package's wheel once, as `pip install .` does (isolated: the newest
# setuptools from PyPI; its CMake tree build-wheel/ is of build/'s depth, so ccache
# serves its objects), for tests/python/test_pip49.py (PINSTAGE_WHEEL). It leaves out the
# tests marked `once` (pyproject.toml): the CLI's, the docs' and the golden's, the same on
# any torch, run by the Debian pass.
start=$SECONDS
(cd "$root" && wheel_start=$SECONDS && mkdir -p "$venv_log.whl" &&
  { PINSTAGE_CMAKE_BUILD_DIR="$root/build-wheel" "$venv/bin/python" -m pip wheel -q \
      --no-deps -w "$venv_log.whl" . >"$venv_log.venv" 2>&1 ||
    echo "test.sh: pip wheel failed (above): test_pip49.py builds its own" >>"$venv_log.venv"; } &&
  echo "test.sh: the wheel took $((SECONDS - wheel_start)) s" >>"$venv_log.venv" &&
  PINSTAGE_WHEEL=$(ls "$venv_log.whl"/pinstage-*.whl 2>/dev/null || true) \
  PINSTAGE_BUILD_DIR="$root/build" PINSTAGE_REQUIRE_PEERS=1 \
  "$venv/bin/python" -m pytest -q -p no:cacheprovider -m 'not once' tests/python >>"$venv_log.venv" 2>&1) &
venv_pass=$!
debian_status=0
PINSTAGE_BUILD_DIR="$root/build" /usr/bin/python3 -m pytest -q -p no:cacheprovider \
  "$root/tests/python" || debian_status=$?
venv_status=0
wait "$venv_pass" || venv_status=$?
echo "test.sh: the venv pass ($venv):"
cat "$venv_log.venv"
echo "test.sh: both pytest passes took $((SECONDS - start)) s"
[ "$debian_status" -eq 0 ] && [ "$venv_status" -eq 0 ]
