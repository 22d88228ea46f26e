#!/usr/bin/env bash
# scripts/gpu-check.sh: the one-command GPU check of the cuda backend (docs/cuda.md).
#
# For a machine with an NVIDIA GPU, the CUDA toolkit, CMake and python3, with no network
# and no Debian -dev packages: run scripts/vendor-deps.sh on the development machine
# first and carry .deps/ along with the tree (without it the check refuses at once).
# Meant to fit one run of about 7 minutes on an H200 and to leave figures even when cut
# short:
#   1. build: GoogleTest from .deps/googletest, then pinstage with PINSTAGE_CUDA=ON
#   1b. map mode first (issue 39): a checkpoint (PINSTAGE_CHECK_MAP_TASK, a fixture: 2 qwen3
#      layers, about 2 GB) written once, then `pinstage load --map` registering its read-only file mapping
#      (does cudaHostRegisterReadOnly take the page cache?), the same from a tmpfs copy
#      in /dev/shm, and a map-mode `load --to device` in GB/s (map.txt, map-*.json)
#   1c. the restart cache (issue 50): that checkpoint put in a cache on /dev/shm
#      (`pinstage cache put`), then its entry uploaded to the device straight from its
#      registered mapping: "cache hit -> device GB/s" (cache.txt, cache-device.json)
#   2. the cuda tests (ctest labels cuda and requires_gpu)
#   3. pinstage_gpu_probe: each device's NUMA node and where a worker's pinned pages for
#      it landed (printed as "placement:"), the link limit (1 GiB pinned cudaMemcpy, best
#      of several) and pinning throughput, cudaHostAlloc and register mode alternating
#   4. pinstage bench qwen3-decode --backend cuda --layers 10 --arms pageable,pinned,staged
#      --rounds 4, one process per group (3 groups), each writing its own JSON, so a run
#      stopped by the budget keeps every group that finished
#   4b. before the bench: vllm serve of a small model with --load-format safetensors,
#      fastsafetensors and pinstage, the load times side by side (scripts/gpu-check-vllm.sh:
#      vllm.txt, vllm.json, vllm-*.log; skipped unless PINSTAGE_CHECK_VLLM_PYTHON has vLLM
#      and pinstage, at most PINSTAGE_CHECK_VLLM_S seconds, default 150)
#   5. a summary against the issue-7 targets (scripts/gpu_check_summary.py)
# Output under $OUT (default ./gpu-check-out, git-ignored): gpu-check.log, map.txt,
# map-*.json, cache.txt, cache-device.json, ctest.xml, probe.json, bench-g<N>.json, bench.log, summary.json. $OUT starts empty: a folder this
# script made before is emptied first, any other non-empty folder is refused.
#
# Settings (environment): PINSTAGE_CHECK_BUILD (build folder, default build-gpu),
# PINSTAGE_CHECK_LAYERS (10), PINSTAGE_CHECK_GROUPS (3), PINSTAGE_CHECK_ROUNDS (4),
# PINSTAGE_CHECK_PIN_MIB (4096), PINSTAGE_CHECK_LINK_MIB (1024),
# PINSTAGE_CHECK_PREFAULT_MIB (2048), PINSTAGE_CHECK_JOBS (cores),
# PINSTAGE_CHECK_BUDGET_S (420: the bench is cut short so the whole run ends within it),
# PINSTAGE_CHECK_MAP_TASK (the fixture the map step loads; default "qwen3-decode --layers 2"),
# PINSTAGE_CHECK_VLLM_S (150), PINSTAGE_CHECK_VLLM_PYTHON, PINSTAGE_CHECK_VLLM,
# PINSTAGE_CHECK_VLLM_MODEL (scripts/gpu-check-vllm.sh).
# For the ctest run on the fake runtime (tests/cpp/cuda.cmake): PINSTAGE_CHECK_PREBUILT=1
# (use the build folder as it is), PINSTAGE_CHECK_FAKE_GPU=<folder of the fake
# libcudart> (no nvidia-smi; the probe and the bench load the fake),
# PINSTAGE_CHECK_CTEST_ARGS (which tests step 2 runs), PINSTAGE_CHECK_BENCH_TASK (the
# bench subcommand and its size, default "qwen3-decode --layers $LAYERS"),
# PINSTAGE_CHECK_DEPS (where .deps is looked for; default <tree>/.deps),
# PINSTAGE_CHECK_PYTHON (the interpreter of the DLPack step, with torch and the build's
# pinstage module; default python3: the step says skipped where either is missing).
# Exit status: 0 when every step ran (targets are reported, not enforced), 1 when a
# step failed, 2 when refused before starting, 3 when no GPU is usable.
set -uo pipefail

# shellcheck source=scripts/lib/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/common.sh"
check_settings gpu 10
DEPS="${PINSTAGE_CHECK_DEPS:-$ROOT/.deps}"
PIN_MIB="${PINSTAGE_CHECK_PIN_MIB:-4096}"  # 4 GiB: the pool's cold vs warm figure (issue 20)
LINK_MIB="${PINSTAGE_CHECK_LINK_MIB:-1024}"
PREFAULT_MIB="${PINSTAGE_CHECK_PREFAULT_MIB:-2048}"
VLLM_S="${PINSTAGE_CHECK_VLLM_S:-150}"  # the vLLM step's share of the budget
BUDGET="${PINSTAGE_CHECK_BUDGET_S:-420}"
FAKE_GPU="${PINSTAGE_CHECK_FAKE_GPU:-}"
CTEST_ARGS="${PINSTAGE_CHECK_CTEST_ARGS:--L ^(cuda|requires_gpu)$}"
BENCH_TASK="${PINSTAGE_CHECK_BENCH_TASK:-qwen3-decode --layers $LAYERS}"
MARK=".pinstage-gpu-check"

# Refused at once, before any output folder or build: minutes of a lent GPU must not go
# on a build that cannot work.
if [ "$PREBUILT" != 1 ] && { [ ! -f "$DEPS/include/nlohmann/json.hpp" ] ||
  [ ! -f "$DEPS/include/CLI/CLI.hpp" ]; }; then
  refuse "no $DEPS with include/nlohmann and include/CLI: run scripts/vendor-deps.sh on" \
    "the development machine and carry .deps/ along with the tree (docs/cuda.md)"
fi
whole_sizes "$LAYERS" "$GROUPS_N" "$ROUNDS" "$PIN_MIB" "$LINK_MIB" "$PREFAULT_MIB" "$BUDGET" \
  "$VLLM_S"
# $OUT starts empty, so old results are never summarised as new.
if [ -d "$OUT" ] && [ -n "$(ls -A "$OUT")" ]; then
  [ -f "$OUT/$MARK" ] || refuse "$OUT is not empty and was not made by this script: choose another OUT"
  find "$OUT" -mindepth 1 -delete || refuse "cannot empty $OUT"
fi
mkdir -p "$OUT" || refuse "cannot create $OUT"
touch "$OUT/$MARK"
exec > >(tee -a "$OUT/gpu-check.log") 2>&1
TEE_PID=$!
# Let tee write the last lines before the caller collects $OUT.
trap 'exec 1>&- 2>&-; wait "$TEE_PID" 2>/dev/null' EXIT

START=$SECONDS
failed=()
notes=()
step() { echo; echo "== [$((SECONDS - START)) s] $*"; }
left() { echo $((BUDGET - (SECONDS - START))); }
# The probe and the bench load the fake runtime when asked to.
run_cuda() { if [ -n "$FAKE_GPU" ]; then LD_LIBRARY_PATH="$FAKE_GPU" "$@"; else "$@"; fi; }

# Step 1: GoogleTest from .deps, then only the targets the check needs. Sets tests_built
# and cli_built; exits through the summary when the build fails.
build_all() {
  if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
    export PATH="/usr/local/cuda/bin:$PATH"
  fi
  nvcc --version | tail -n 2 || echo "nvcc not found: the cuda backend cannot build"
  cmake --version | head -n 1
  local gen="Unix Makefiles"
  command -v ninja >/dev/null 2>&1 && gen=Ninja
  step "build"
  local gtest_args=(-DPINSTAGE_BUILD_TESTS=OFF)
  tests_built=0
  mkdir -p "$BUILD"
  if [ -f "$DEPS/googletest/CMakeLists.txt" ]; then
    if cmake -S "$DEPS/googletest" -B "$BUILD/gtest" -G "$gen" -DCMAKE_BUILD_TYPE=Release \
        -DBUILD_GMOCK=OFF -DINSTALL_GTEST=ON -DCMAKE_POLICY_VERSION_MINIMUM=3.5 \
        -DCMAKE_INSTALL_PREFIX="$BUILD/gtest-install" >"$BUILD/gtest-build.log" 2>&1 &&
      cmake --build "$BUILD/gtest" -j "$JOBS" >>"$BUILD/gtest-build.log" 2>&1 &&
      cmake --install "$BUILD/gtest" >>"$BUILD/gtest-build.log" 2>&1; then
      gtest_args=(-DPINSTAGE_BUILD_TESTS=ON "-DCMAKE_PREFIX_PATH=$BUILD/gtest-install")
      tests_built=1
      echo "GoogleTest built from $DEPS/googletest"
    else
      tail -n 30 "$BUILD/gtest-build.log"
      notes+=("GoogleTest from .deps/googletest failed to build: tests not built")
    fi
  else
    echo "no $DEPS/googletest (run scripts/vendor-deps.sh on the dev machine): tests not built"
    notes+=("no GoogleTest sources in .deps: the requires_gpu tests were not built")
  fi
  # The plugin, the probe and the tests first; the CLI (for the bench) on its own, so a
  # CLI that does not build costs only the bench.
  local targets=(pinstage_backend_cuda pinstage_gpu_probe)
  [ $tests_built = 1 ] && targets+=(test_cuda_plugin test_cuda_gpu)
  cli_built=0
  if cmake -S "$ROOT" -B "$BUILD" -G "$gen" -DCMAKE_BUILD_TYPE=Release -DPINSTAGE_CUDA=ON \
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
}

step "machine"
date -u +%Y-%m-%dT%H:%M:%SZ
uname -r
echo "cores: $(nproc)"
grep -E 'MemTotal|MemAvailable' /proc/meminfo
echo "THP: $(cat /sys/kernel/mm/transparent_hugepage/enabled 2>/dev/null || echo unknown)"
echo "memlock limit: $(ulimit -l)"
have_gpu=1
if [ -n "$FAKE_GPU" ]; then
  echo "fake CUDA runtime from $FAKE_GPU (a test of this script, not a measurement)"
elif command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L; then
  nvidia-smi --query-gpu=name,memory.total,driver_version,pcie.link.gen.current,pcie.link.gen.max,pcie.link.width.current,pcie.link.width.max \
    --format=csv || true
else
  have_gpu=0
  echo "no GPU: nvidia-smi is missing or lists no device"
  notes+=("no GPU was available: the probe and the bench did not run")
fi

tests_built=1
cli_built=1
if [ "$PREBUILT" = 1 ]; then
  step "build: using $BUILD as it is (PINSTAGE_CHECK_PREBUILT=1)"
else
  build_all
fi

# Step 1b: map mode on the GPU. A refusal is a finding (map_note says why), not a failure.
map_checks() {
  local ck="$OUT/map-ckpt" shm="/dev/shm/pinstage-gpu-check-$$" cli="$BUILD/bin/pinstage"
  step "map mode: a read-only file mapping and a tmpfs mapping registered in place"
  read -r -a task <<<"$MAP_TASK"
  if ! run_cuda timeout 120 "$cli" fixture "${task[@]}" --out "$ck" --shard-size 512M -q; then
    failed+=(map); notes+=("map mode: the checkpoint could not be written"); return
  fi
  local kind path
  for kind in page-cache tmpfs; do
    path=$ck
    if [ $kind = tmpfs ]; then
      mkdir -p "$shm" && cp -r "$ck/." "$shm/" || { notes+=("map mode: no tmpfs copy"); continue; }
      path=$shm
    fi
    cat "$path"/* >/dev/null  # warm: the figure is the pin in place, not the disk
    run_cuda timeout 120 "$cli" load "$path" --map --backend cuda --json "$OUT/map-$kind.json" -q ||
      { failed+=(map); notes+=("map mode ($kind) failed; see gpu-check.log"); }
  done
  run_cuda timeout 120 "$cli" load "$ck" --map --to device --backend cuda \
    --json "$OUT/map-device.json" -q || { failed+=(map); notes+=("map-mode device load failed"); }
  rm -rf "$shm"
  cache_checks "$ck"
  rm -rf "$ck"
  python3 - "$OUT" <<'PY' | tee "$OUT/map.txt"
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
for name in ("map-page-cache", "map-tmpfs", "map-device"):
    f = out / f"{name}.json"
    if not f.exists():
        print(f"{name}: no report"); continue
    r = json.loads(f.read_text())
    how = "copied: " + r["map_note"] if r["map_note"] else "registered in place"
    print(f"{name}: {r['bytes'] / 1e9:.2f} GB, map {r['map_s']:.3f} s, pin {r['pin_s']:.3f} s, "
          f"total {r['total_gbps']:.2f} GB/s, upload {r['upload_s']:.3f} s; {how}")
PY
}

# Step 1c: the restart cache: the checkpoint put in a cache of its own, then loaded onto the
# device with --cache use: a hit uploads from the entry's registered mapping, no ring.
cache_checks() {
  local ck=$1 cdir="/dev/shm/pinstage-gpu-check-cache-$$" cli="$BUILD/bin/pinstage"
  step "cache: a cache hit uploaded to the device from the entry's registered mapping"
  mkdir -m 700 "$cdir" || { notes+=("cache: no cache directory in /dev/shm"); return; }
  if PINSTAGE_CACHE_DIR="$cdir" run_cuda timeout 120 "$cli" cache put "$ck" -q &&
    PINSTAGE_CACHE_DIR="$cdir" run_cuda timeout 120 "$cli" load "$ck" --map --to device \
      --cache use --backend cuda --json "$OUT/cache-device.json" -q; then
    python3 - "$OUT/cache-device.json" <<'PY' | tee "$OUT/cache.txt"
import json, sys
r = json.load(open(sys.argv[1]))
how = "copied: " + r["map_note"] if r["map_note"] else "registered in place"
print(f"cache hit -> device GB/s: {r['total_gbps']:.2f} (cache {r['cache']}, "
      f"{r['bytes'] / 1e9:.2f} GB, pin {r['pin_s']:.3f} s, upload {r['upload_s']:.3f} s, "
      f"ring {r['ring_pinned_bytes']} B; {how})")
PY
  else
    failed+=(cache); notes+=("cache: the put or the device load of its hit failed; see gpu-check.log")
  fi
  rm -rf "$cdir"
}

MAP_TASK="${PINSTAGE_CHECK_MAP_TASK:-qwen3-decode --layers 2}"
[ $have_gpu = 1 ] && [ $cli_built = 1 ] && map_checks

tests_text="not built"
if [ $tests_built = 1 ]; then
  step "tests (ctest $CTEST_ARGS)"
  # shellcheck disable=SC2086  # CTEST_ARGS is a list of arguments
  ctest --test-dir "$BUILD" $CTEST_ARGS --output-on-failure --timeout 180 \
    --output-junit "$OUT/ctest.xml" || failed+=(tests)
  tests_text="$(python3 "$ROOT/scripts/gpu_check_summary.py" --junit "$OUT/ctest.xml")"
  echo "tests: $tests_text"
fi

if [ $have_gpu = 1 ]; then
  step "probe (link limit, pinning ${PIN_MIB} MiB, the two modes alternating)"
  if PINSTAGE_LOG=info run_cuda timeout 180 "$BUILD/bin/pinstage_gpu_probe" --pin-mib "$PIN_MIB" \
      --link-mib "$LINK_MIB" --prefault-mib "$PREFAULT_MIB" --json "$OUT/probe.json" >/dev/null; then
    echo "probe: wrote $OUT/probe.json"
    python3 -c 'import json, sys
for p in json.load(open(sys.argv[1])).get("placement", []): print("placement:", json.dumps(p))' \
      "$OUT/probe.json" || true
  else
    failed+=(probe)
    notes+=("the probe failed or was cut short; see gpu-check.log")
  fi

  # A DeviceBuffer handed to torch through DLPack is a CUDA tensor on the same memory
  # (docs/python.md): upload a pattern, read it through torch, write through torch, read
  # it back through pinstage.
  step "dlpack: a DeviceBuffer as a torch CUDA tensor"
  check_python=${PINSTAGE_CHECK_PYTHON:-python3}
  if ! PYTHONPATH="$BUILD/python" "$check_python" -c "import torch, pinstage" >/dev/null 2>&1; then
    echo "skipped: $check_python has no torch, or the build has no pinstage module for it"
  elif run_cuda env PYTHONPATH="$BUILD/python" timeout 120 "$check_python" -c '
import torch, pinstage
w = pinstage.Worker(backend="cuda")
a = pinstage.PinnedTorchAllocator(w)
d = w.alloc_device(4096)
pattern = (torch.arange(4096) % 251).to(torch.uint8)
w.copy_to_device_async(d, a.copy(pattern)).wait()
assert d.__dlpack_device__() == (2, w.device_id), d.__dlpack_device__()
if torch.cuda.is_available():
    t = torch.from_dlpack(d)
    assert t.is_cuda and t.data_ptr() == d.device_ptr, (t.device, t.data_ptr(), d.device_ptr)
    assert torch.equal(t.cpu(), pattern)
    t.fill_(7)
    torch.cuda.synchronize()
    back = a.zeros((4096,), torch.uint8)
    w.copy_to_host_async(back, d).wait()
    assert int(back.sum()) == 7 * 4096
    print("dlpack: torch sees the device memory in place (cuda:%d)" % t.device.index)
    del t
else:
    print("dlpack: exported as kDLCUDA; this torch has no CUDA (a fake runtime), not consumed")
d.close()
w.finalize()
' 2>&1 | tee -a "$OUT/dlpack.txt"; then :; else
    failed+=(dlpack)
    notes+=("a DeviceBuffer did not round-trip through torch CUDA; see dlpack.txt")
  fi

  # vLLM serving a small model with each load format (scripts/gpu-check-vllm.sh): runs
  # where PINSTAGE_CHECK_VLLM_PYTHON has vLLM and pinstage, else says skipped.
  step "vllm serve: --load-format safetensors, fastsafetensors, pinstage (at most ${VLLM_S} s)"
  OUT="$OUT" run_cuda bash "$ROOT/scripts/gpu-check-vllm.sh" "$VLLM_S" ||
    { failed+=(vllm); notes+=("a vllm serve run failed or ran out of time; see vllm-*.log"); }

  # One process per group, each with its own JSON: a group cut short by the budget
  # loses only itself. Estimate on an H200 host (PCIe Gen5, ~50 GB/s pinned): ~1 GB per
  # layer and bind; 10 layers, 3 arms x (1 cold + 4) binds, baseline memcpy and argument
  # generation come to roughly 20-40 s per group.
  step "bench ($BENCH_TASK, $GROUPS_N groups x $ROUNDS rounds, $(left) s left)"
  if [ $cli_built = 0 ]; then
    echo "skipped: no CLI"
  else
    # A CLI that can draw a plot next to the JSON is told not to: nothing to draw with there.
    read -r -a task <<<"$BENCH_TASK"
    bench_extra=()
    "$BUILD/bin/pinstage" bench "${task[0]}" --help 2>/dev/null | grep -q -- '--no-plot' &&
      bench_extra+=(--no-plot)
    for g in $(seq 1 "$GROUPS_N"); do
      t=$(( $(left) - 15 ))
      if [ "$t" -lt 30 ]; then
        failed+=(bench)
        notes+=("no time left for bench group $g of $GROUPS_N (PINSTAGE_CHECK_BUDGET_S=$BUDGET)")
        break
      fi
      echo "-- group $g of $GROUPS_N (at most $t s)"
      run_cuda timeout "$t" "$BUILD/bin/pinstage" bench "${task[@]}" --backend cuda \
        --arms pageable,pinned,staged --groups 1 --rounds "$ROUNDS" \
        "${bench_extra[@]}" --json "$OUT/bench-g$g.json" 2>&1 | tee -a "$OUT/bench.log"
      rc=${PIPESTATUS[0]}
      if [ "$rc" != 0 ]; then
        failed+=(bench)
        notes+=("bench group $g failed (exit $rc$([ "$rc" = 124 ] && echo ': ran past its time')); see bench.log")
        break
      fi
    done
  fi
fi

step "summary"
note_args=()
for n in "${notes[@]}"; do note_args+=(--note "$n"); done
bench_args=()
for f in "$OUT"/bench-g*.json; do [ -f "$f" ] && bench_args+=(--bench "$f"); done
# With a GPU both must exist: their absence fails the summary step.
[ $have_gpu = 1 ] && bench_args+=(--expect probe --expect bench)
python3 "$ROOT/scripts/gpu_check_summary.py" --out "$OUT" --probe "$OUT/probe.json" \
  "${bench_args[@]}" --tests "$tests_text" "${note_args[@]}" || failed+=(summary)
echo "gpu-check: $((SECONDS - START)) s; output in $OUT"
if [ ${#failed[@]} -gt 0 ]; then
  echo "gpu-check: failed steps: ${failed[*]}"
  exit 1
fi
[ $have_gpu = 1 ] || exit 3
echo "gpu-check: every step ran"
exit 0
