#!/usr/bin/env bash
# The main job: install, build, then run the pageable-vs-pinned A/B benchmark of the
# Qwen3-14B decode scene on the sim backend, at the largest layer count whose host
# args, staging and device memory fit in half of this machine's available memory.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/setup.sh"
"$root/scripts/build.sh" "$root/build"
"$root/build/bin/pinstage" info
"$root/build/bin/pinstage" bench qwen3-decode --backend sim --json "$root/build/bench-qwen3-decode.json" "$@"
