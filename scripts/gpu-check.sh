#!/usr/bin/env bash
# scripts/gpu-check.sh: the one-command GPU check of the cuda backend (docs/cuda.md).
#
# For a machine with an NVIDIA GPU, the CUDA toolkit, CMake and python3, with no network
# and no Debian -dev packages: run scripts/vendor-deps.sh on the development machine
# first and send .deps/ along with the tree. In one run (a few minutes):
#   1. build: GoogleTest from .deps/googletest, then pinstage with PINSTAGE_CUDA=ON
#   2. the cuda tests (ctest labels cuda and requires_gpu)
#   3. pinstage_gpu_probe: the link limit (1 GiB pinned cudaMemcpy, best of several) and
#      pinning throughput of both pinned modes for 8 GiB
#   4. pinstage bench qwen3-decode --backend cuda --layers 40
#        --arms pageable,pinned,staged --groups 3 --rounds 4
#   5. a summary against the issue-7 targets (scripts/gpu_check_summary.py)
# Output under $OUT (default ./gpu-check-out): gpu-check.log, ctest.xml, probe.json,
# bench.json, bench.log, summary.json.
#
# Settings (environment): PINSTAGE_CHECK_BUILD (build folder, default build-gpu),
# PINSTAGE_CHECK_LAYERS (40), PINSTAGE_CHECK_PIN_GIB (8), PINSTAGE_CHECK_JOBS (cores),
# PINSTAGE_CHECK_BUDGET_S (540: the bench is cut short so the whole run ends within it).
# Exit status: 0 when every step ran (targets are reported, not enforced), 1 when a
# step failed, 3 when no GPU is usable (the build and the CPU-side tests still run).
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${OUT:-$ROOT/gpu-check-out}"
BUILD="${PINSTAGE_CHECK_BUILD:-$ROOT/build-gpu}"
LAYERS="${PINSTAGE_CHECK_LAYERS:-40}"
PIN_GIB="${PINSTAGE_CHECK_PIN_GIB:-8}"
JOBS="${PINSTAGE_CHECK_JOBS:-$(nproc)}"
BUDGET="${PINSTAGE_CHECK_BUDGET_S:-540}"
mkdir -p "$OUT"
exec > >(tee -a "$OUT/gpu-check.log") 2>&1
TEE_PID=$!
# Let tee write the last lines before the caller collects $OUT.
trap 'exec 1>&- 2>&-; wait "$TEE_PID" 2>/dev/null' EXIT

START=$SECONDS
failed=()
notes=()
step() { echo; echo "== [$((SECONDS - START)) s] $*"; }
left() { echo $((BUDGET - (SECONDS - START))); }

step "machine"
date -u +%Y-%m-%dT%H:%M:%SZ
uname -r
echo "cores: $(nproc)"
grep -E 'MemTotal|MemAvailable' /proc/meminfo
echo "THP: $(cat /sys/kernel/mm/transparent_hugepage/enabled 2>/dev/null || echo unknown)"
echo "memlock limit: $(ulimit -l)"
have_gpu=1
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L; then
  nvidia-smi --query-gpu=name,memory.total,driver_version,pcie.link.gen.current,pcie.link.gen.max,pcie.link.width.current,pcie.link.width.max \
    --format=csv || true
else
  have_gpu=0
  echo "no GPU: nvidia-smi is missing or lists no device"
  notes+=("no GPU was available: the probe and the bench did not run")
fi
if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH="/usr/local/cuda/bin:$PATH"
fi
nvcc --version | tail -n 2 || echo "nvcc not found: the cuda backend cannot build"
cmake --version | head -n 1
GEN="Unix Makefiles"
command -v ninja >/dev/null 2>&1 && GEN=Ninja

step "build"
gtest_args=(-DPINSTAGE_BUILD_TESTS=OFF)
tests_built=0
mkdir -p "$BUILD"
if [ -f "$ROOT/.deps/googletest/CMakeLists.txt" ]; then
  if cmake -S "$ROOT/.deps/googletest" -B "$BUILD/gtest" -G "$GEN" -DCMAKE_BUILD_TYPE=Release \
      -DBUILD_GMOCK=OFF -DINSTALL_GTEST=ON -DCMAKE_POLICY_VERSION_MINIMUM=3.5 \
      -DCMAKE_INSTALL_PREFIX="$BUILD/gtest-install" >"$BUILD/gtest-build.log" 2>&1 &&
    cmake --build "$BUILD/gtest" -j "$JOBS" >>"$BUILD/gtest-build.log" 2>&1 &&
    cmake --install "$BUILD/gtest" >>"$BUILD/gtest-build.log" 2>&1; then
    gtest_args=(-DPINSTAGE_BUILD_TESTS=ON "-DCMAKE_PREFIX_PATH=$BUILD/gtest-install")
    tests_built=1
    echo "GoogleTest built from .deps/googletest"
  else
    tail -n 30 "$BUILD/gtest-build.log"
    notes+=("GoogleTest from .deps/googletest failed to build: tests not built")
  fi
else
  echo "no .deps/googletest (run scripts/vendor-deps.sh on the dev machine): tests not built"
  notes+=("no GoogleTest sources in .deps: the requires_gpu tests were not built")
fi
# The plugin, the probe and the tests first; the CLI (for the bench) on its own, so a
# CLI that does not build costs only the bench.
targets=(pinstage_backend_cuda pinstage_gpu_probe)
[ $tests_built = 1 ] && targets+=(test_cuda_plugin test_cuda_gpu)
cli_built=0
if cmake -S "$ROOT" -B "$BUILD" -G "$GEN" -DCMAKE_BUILD_TYPE=Release -DPINSTAGE_CUDA=ON \
    -DPINSTAGE_BUILD_PYTHON=OFF -DPINSTAGE_BUILD_BENCH=OFF "${gtest_args[@]}" &&
  cmake --build "$BUILD" -j "$JOBS" --target "${targets[@]}"; then
  echo "built: ${targets[*]}"
  if cmake --build "$BUILD" -j "$JOBS" --target pinstage_cli; then
    cli_built=1
  else
    echo "the pinstage CLI did not build: no bench"
    failed+=(build-cli)
    notes+=("the pinstage CLI did not build, so the bench did not run; see gpu-check.log")
  fi
else
  echo "BUILD FAILED"
  failed+=(build)
  python3 "$ROOT/scripts/gpu_check_summary.py" --out "$OUT" --tests "not built" \
    --note "the build failed; see gpu-check.log" "${notes[@]/#/--note=}"
  exit 1
fi

tests_text="not built"
if [ $tests_built = 1 ]; then
  step "tests (ctest -L 'cuda|requires_gpu')"
  ctest --test-dir "$BUILD" -L '^(cuda|requires_gpu)$' --output-on-failure --timeout 180 \
    --output-junit "$OUT/ctest.xml" || failed+=(tests)
  tests_text="$(python3 - "$OUT/ctest.xml" <<'PY'
import sys, xml.etree.ElementTree as ET
try:
    root = ET.parse(sys.argv[1]).getroot()
except Exception as e:
    print(f"no junit output ({e})"); sys.exit()
cases = root.iter("testcase")
n = f = s = 0
for c in cases:
    n += 1
    status = c.get("status", "")
    if c.find("failure") is not None or c.find("error") is not None or status == "fail":
        f += 1
    elif c.find("skipped") is not None or status in ("notrun", "disabled", "skipped"):
        s += 1
print(f"{n} tests: {n - f - s} passed, {f} failed, {s} skipped")
PY
)"
  echo "tests: $tests_text"
fi

if [ $have_gpu = 1 ]; then
  step "probe (link limit, pinning ${PIN_GIB} GiB in both modes)"
  if PINSTAGE_LOG=info timeout 180 "$BUILD/bin/pinstage_gpu_probe" --pin-gib "$PIN_GIB" \
      --json "$OUT/probe.json" >/dev/null; then
    echo "probe: wrote $OUT/probe.json"
  else
    failed+=(probe)
    notes+=("the probe failed; see gpu-check.log")
  fi

  t=$(( $(left) - 20 ))
  step "bench (layers $LAYERS, ${t} s left for it)"
  if [ $cli_built = 0 ]; then
    echo "skipped: no CLI"
  elif [ "$t" -lt 60 ]; then
    failed+=(bench)
    notes+=("no time left for the bench (PINSTAGE_CHECK_BUDGET_S=$BUDGET)")
  else
    timeout "$t" "$BUILD/bin/pinstage" bench qwen3-decode --backend cuda --layers "$LAYERS" \
      --arms pageable,pinned,staged --groups 3 --rounds 4 --json "$OUT/bench.json" \
      2>&1 | tee "$OUT/bench.log"
    rc=${PIPESTATUS[0]}
    if [ "$rc" = 124 ]; then
      failed+=(bench)
      notes+=("the bench ran past ${t} s and was stopped")
    elif [ "$rc" != 0 ]; then
      failed+=(bench)
      notes+=("the bench failed (exit $rc); see bench.log")
    fi
  fi
fi

step "summary"
note_args=()
for n in "${notes[@]}"; do note_args+=(--note "$n"); done
python3 "$ROOT/scripts/gpu_check_summary.py" --out "$OUT" --probe "$OUT/probe.json" \
  --bench "$OUT/bench.json" --tests "$tests_text" "${note_args[@]}"
echo "gpu-check: $((SECONDS - START)) s; output in $OUT"
if [ ${#failed[@]} -gt 0 ]; then
  echo "gpu-check: failed steps: ${failed[*]}"
  exit 1
fi
[ $have_gpu = 1 ] || exit 3
exit 0
