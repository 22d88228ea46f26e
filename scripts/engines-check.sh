#!/usr/bin/env bash
# scripts/engines-check.sh: the engine tests in the engines' venv (docs/engines.md, "The
# engines venv and CI"). Makes, or reuses, the venv of requirements/engines.txt (vLLM
# 0.33.0, torch 2.14.0, transformers 5.20.2: about 4.3 GB the first time) and runs, with
# PINSTAGE_REQUIRE_ENGINES=1 (a missing engine is an error, not a skip), the engine test
# files and bench/node_memory.py --dry-run. Not part of CI (.ci/run): run by hand.
#
#   scripts/engines-check.sh            # PINSTAGE_BUILD_DIR: the build (default build/)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${PINSTAGE_BUILD_DIR:-$root/build}
[ -f "$build/python/pinstage/vllm.py" ] ||
  { echo "engines-check.sh: no pinstage module in $build/python: build first (README)" >&2; exit 2; }
start=$SECONDS
venv=$("$root/scripts/venv.sh" "$root/requirements/engines.txt")
echo "engines-check.sh: the venv ($venv) in $((SECONDS - start)) s"
cd "$root"
PINSTAGE_BUILD_DIR="$build" PINSTAGE_REQUIRE_ENGINES=1 "$venv/bin/python" -m pytest -q \
  -p no:cacheprovider tests/python/test_engines_vllm.py tests/python/test_engines_transformers.py \
  tests/python/test_engines_docs.py tests/python/test_iter_tensors.py
PINSTAGE_BUILD_DIR="$build" "$venv/bin/python" bench/node_memory.py --dry-run
echo "engines-check.sh: $((SECONDS - start)) s in all"
