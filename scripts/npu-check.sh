#!/usr/bin/env bash
# scripts/npu-check.sh: the one-command check of the acl backend on a real Ascend machine
# (docs/acl.md), the counterpart of scripts/gpu-check.sh. Self-contained: it needs CANN
# installed and its set_env.sh sourced (ASCEND_HOME_PATH or ASCEND_TOOLKIT_HOME set, or
# libascendcl.so on the library path), CMake, a C++20 compiler, GoogleTest and python3.
#   1. build pinstage (the acl plugin needs no CANN at build time; it dlopens the runtime)
#   2. the conformance suite on the REAL runtime: test_conformance_acl run directly, with
#      PINSTAGE_ACL_LIBRARY unset (ctest would point it at the test double)
#   3. the A/B bench: pinstage bench qwen3-decode --backend acl at 40 layers with the arms
#      pageable, pinned and staged
#   4. the upload figures per arm against the reference system's Ascend figures:
#      pinned 54.65-56.63 GB/s, pageable 19.08-54.87 GB/s (40.86 GB of args)
# Output under $OUT (default ./npu-check-out): npu-check.log, conformance.xml, bench.json.
# Settings (environment): PINSTAGE_CHECK_BUILD (build folder, default build-npu),
# PINSTAGE_CHECK_LAYERS (40), PINSTAGE_CHECK_GROUPS (3), PINSTAGE_CHECK_ROUNDS (4),
# PINSTAGE_CHECK_JOBS (cores), PINSTAGE_CHECK_PREBUILT=1 (use the build folder as it is),
# PINSTAGE_CHECK_DEVICE (0; the bench's device is the runtime's current one).
# Exit status: 0 when every step ran (figures are reported, not enforced), 1 when a step
# failed, 2 when refused before starting, 3 when no Ascend runtime or device is usable.
set -uo pipefail

# shellcheck source=scripts/lib/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/common.sh"
check_settings npu 40
whole_sizes "$LAYERS" "$GROUPS_N" "$ROUNDS" "$JOBS"
if [ -n "${PINSTAGE_ACL_LIBRARY:-}" ]; then
  echo "npu-check: note: PINSTAGE_ACL_LIBRARY=$PINSTAGE_ACL_LIBRARY is used for every step"
fi
mkdir -p "$OUT" || refuse "cannot create $OUT"
exec > >(tee "$OUT/npu-check.log") 2>&1

failed=()
step() { echo; echo "== $*"; }

step "memlock: $(ulimit -l) KiB (aclrtMallocHost and registration lock memory; raise it in containers)"
command -v npu-smi >/dev/null && npu-smi info | head -20

if [ "$PREBUILT" != 1 ]; then
  step "build ($BUILD)"
  cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DPINSTAGE_CUDA=OFF \
    -DPython_EXECUTABLE="$(command -v python3)" >"$OUT/configure.log" 2>&1 \
    || { tail -30 "$OUT/configure.log"; exit 1; }
  cmake --build "$BUILD" -j "$JOBS" --target pinstage_cli pinstage_backend_acl \
    test_conformance_acl || exit 1
fi
CLI="$BUILD/bin/pinstage"
CONF="$BUILD/bin/test_conformance_acl"

step "is the Ascend runtime there? (pinstage info)"
"$CLI" info | sed -n '/^backends:/,/^$/p'
if ! "$CLI" info | grep -qE '^  acl +usable'; then
  echo "npu-check: the acl backend is not usable here (see the line above); stopping"
  exit 3
fi

step "conformance on the real runtime"
env -u PINSTAGE_ACL_LIBRARY "$CONF" --gtest_output="xml:$OUT/conformance.xml" \
  || failed+=(conformance)

step "A/B bench: qwen3-decode, $LAYERS layers, pageable,pinned,staged, $GROUPS_N groups x $ROUNDS rounds"
"$CLI" bench qwen3-decode --backend acl --layers "$LAYERS" --arms pageable,pinned,staged \
  --groups "$GROUPS_N" --rounds "$ROUNDS" --quiet --no-plot --json "$OUT/bench.json" \
  || failed+=(bench)

step "figures against the reference system (Ascend card, 40.86 GB of args)"
python3 - "$OUT/bench.json" <<'EOF'
import json, sys
REF = {"pinned": (54.65, 56.63), "pageable": (19.08, 54.87)}
try:
    bench = json.load(open(sys.argv[1]))
except (OSError, ValueError) as e:
    sys.exit(f"no bench figures: {e}")
per_arm = {}
for g in bench.get("groups", []):
    for a in g.get("arms", []):
        gbps = a.get("stats", {}).get("upload_gbps")
        if gbps is not None:
            per_arm.setdefault(a.get("arm"), []).append(gbps)
for arm, values in per_arm.items():
    ref = REF.get(arm)
    ref_text = f"reference {ref[0]:.2f}-{ref[1]:.2f} GB/s" if ref else "no reference figure"
    print(f"  {arm:9s} upload {min(values):6.2f}-{max(values):6.2f} GB/s over "
          f"{len(values)} group(s); {ref_text}")
EOF

echo
if [ ${#failed[@]} -gt 0 ]; then
  echo "npu-check: FAILED steps: ${failed[*]}"
  exit 1
fi
echo "npu-check: every step ran; results in $OUT"
