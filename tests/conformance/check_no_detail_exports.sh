#!/usr/bin/env bash
# Fails when a library exports a pinstage name from a detail namespace: internals stay
# hidden (-fvisibility=hidden), and what tests or scenes need is public API.
set -euo pipefail
status=0
for lib in "$@"; do
  bad=$(nm -DC "$lib" | grep -E ' [TWVBDR] ' | grep -E 'pinstage::([A-Za-z0-9_]+::)*detail::' || true)
  if [ -n "$bad" ]; then
    echo "$lib exports detail:: names:"; echo "$bad"; status=1
  fi
done
[ "$status" -eq 0 ] && echo "no detail:: exports in $# libraries"
exit "$status"
