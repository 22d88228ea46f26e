#!/usr/bin/env bash
# The main job: install, build, then run the pageable-vs-pinned A/B benchmark of the
# Qwen3-14B decode scene on the sim backend at the largest size this machine fits.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/setup.sh"
"$root/scripts/build.sh" "$root/build"
"$root/build/bin/pinstage" info
"$root/build/bin/pinstage" demo
