#!/usr/bin/env bash
# The C++ suite under ASan+UBSan, and the concurrency tests under TSan.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
common=(-DCMAKE_BUILD_TYPE=RelWithDebInfo -DPINSTAGE_BUILD_BENCH=OFF -DPINSTAGE_BUILD_PYTHON=OFF)

"$root/scripts/build.sh" "$root/build-asan" "${common[@]}" -DPINSTAGE_SANITIZE=address,undefined
(cd "$root/build-asan" &&
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
  ctest --output-on-failure -j2 --timeout 1800)

# TSan runs the concurrency tests only, so it builds only what they need.
cmake -S "$root" -B "$root/build-tsan" -G Ninja -DPython_EXECUTABLE=/usr/bin/python3 \
  "${common[@]}" -DPINSTAGE_SANITIZE=thread >"$root/build-tsan.configure.log"
ninja -C "$root/build-tsan" -j"$(nproc)" test_runtime_concurrency pinstage_backend_sim
(cd "$root/build-tsan" && TSAN_OPTIONS=halt_on_error=1 \
  ctest --output-on-failure -L concurrency --timeout 1800)
