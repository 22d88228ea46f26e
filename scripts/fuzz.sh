#!/usr/bin/env bash
# Runs one libFuzzer target (fuzz/fuzz_<name>.cpp) under ASan+UBSan, for a time or a
# number of executions:
#   scripts/fuzz.sh TARGET BUDGET [BUILD_DIR]   BUDGET: 60 or 60s (seconds), 100000runs
#   scripts/fuzz.sh --list                      the targets that exist
#   scripts/fuzz.sh --build [BUILD_DIR]         configure and build every target
# With PINSTAGE_FUZZ_BUILT=1 a run does not build (the caller did, with --build): several
# runs at once then never share a ninja.
# A run count is steadier for CI (the same work whatever the machine's load); seconds
# suit a long search by hand.
# Configures the ASan+UBSan tree with the fuzz targets (scripts/sanitizer-args.sh; CI's
# ASan tree is one) in BUILD_DIR (default <root>/build-fuzz) when needed, and builds the
# target. Starts from the checked-in seeds (fuzz/corpus/TARGET, never modified) plus what
# earlier runs found (BUILD_DIR/corpus/TARGET). Exits non-zero on a finding, leaving the
# crashing input in BUILD_DIR/findings/. Prints the executions that ran clean.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
if [ "${1:-}" = "--list" ]; then
  for f in "$root"/fuzz/fuzz_*.cpp; do basename "$f" .cpp; done
  exit 0
fi
configure() {  # a tree without the targets is refused, not reconfigured
  if [ -f "$1/build.ninja" ]; then
    grep -q '^PINSTAGE_BUILD_FUZZ:BOOL=ON$' "$1/CMakeCache.txt" ||
      { echo "$1 is a build tree without the fuzz targets (PINSTAGE_BUILD_FUZZ)" >&2; exit 2; }
    return 0
  fi
  source "$root/scripts/sanitizer-args.sh"
  "$root/scripts/build.sh" "$1" "${asan_args[@]}" -- build.ninja >&2
}
if [ "${1:-}" = "--build" ]; then
  build=${2:-$root/build-fuzz}
  configure "$build"
  mapfile -t targets < <("$0" --list)
  ninja -C "$build" --quiet -j"$(nproc)" "${targets[@]}"
  exit 0
fi
[ $# -ge 2 ] || { echo "usage: $0 TARGET BUDGET [BUILD_DIR] | --list" >&2; exit 2; }
target=$1 budget=$2 build=${3:-$root/build-fuzz}
[ -f "$root/fuzz/$target.cpp" ] || { echo "no fuzz target $target (fuzz/$target.cpp)" >&2; exit 2; }
if [[ $budget =~ ^([1-9][0-9]*)s?$ ]]; then
  limit=(-max_total_time="${BASH_REMATCH[1]}") what="in ${BASH_REMATCH[1]} s"
elif [[ $budget =~ ^([1-9][0-9]*)runs$ ]]; then
  # Capped in time too (PINSTAGE_FUZZ_MAX_SECONDS, 90): as its corpus grows a target's
  # inputs grow, and the header target fell from 13,000 to 500 executions a second.
  runs=${BASH_REMATCH[1]} cap=${PINSTAGE_FUZZ_MAX_SECONDS:-90}
  [[ $cap =~ ^[1-9][0-9]*$ ]] || { echo "PINSTAGE_FUZZ_MAX_SECONDS must be a whole number > 0, got '$cap'" >&2; exit 2; }
  limit=(-runs="$runs" -max_total_time="$cap") what="of $runs asked (at most $cap s)"
else
  echo "BUDGET must be seconds (60, 60s) or executions (100000runs), got '$budget'" >&2; exit 2
fi

if [ "${PINSTAGE_FUZZ_BUILT:-}" != 1 ]; then
  configure "$build"
  ninja -C "$build" --quiet "$target"
fi

work="$build/corpus/$target" findings="$build/findings"
mkdir -p "$work" "$findings"
seeds=()
[ -d "$root/fuzz/corpus/$target" ] && seeds=("$root/fuzz/corpus/$target")
log="$build/$target.log"
status=0
# -rss_limit_mb: the parsers must not need more; a deep-nesting input that does is a bug.
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
  "$build/bin/$target" "${limit[@]}" -print_final_stats=1 -rss_limit_mb=2048 \
  -timeout=10 -artifact_prefix="$findings/$target-" "$work" "${seeds[@]}" >"$log" 2>&1 || status=$?
runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
if [ "$status" -ne 0 ]; then
  tail -40 "$log"
  echo "$target: FINDING after ${runs:-?} executions (input in $findings/)" >&2
  exit "$status"
fi
echo "$target: ${runs:-?} executions $what, clean (corpus $(ls "$work" | wc -l) inputs)"
