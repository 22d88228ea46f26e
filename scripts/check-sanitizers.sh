#!/usr/bin/env bash
# The C++ suite under ASan+UBSan, and the concurrency tests under TSan.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
common=(-DCMAKE_BUILD_TYPE=RelWithDebInfo -DPINSTAGE_BUILD_BENCH=OFF -DPINSTAGE_BUILD_PYTHON=OFF)

"$root/scripts/build.sh" "$root/build-asan" "${common[@]}" -DPINSTAGE_SANITIZE=address,undefined
(cd "$root/build-asan" &&
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
  ctest --output-on-failure -j2 --timeout 1800)

"$root/scripts/build.sh" "$root/build-tsan" "${common[@]}" -DPINSTAGE_SANITIZE=thread
(cd "$root/build-tsan" && TSAN_OPTIONS=halt_on_error=1 \
  ctest --output-on-failure -L concurrency --timeout 1800)
