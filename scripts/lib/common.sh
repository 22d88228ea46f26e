# shellcheck shell=bash
# Sourced by scripts/gpu-check.sh, npu-check.sh and vendor-deps.sh: ROOT (the tree they
# belong to) and fail STATUS MESSAGE... (the message after the script's name, then exit).
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
SCRIPT_NAME="$(basename "${BASH_SOURCE[1]}" .sh)"
fail() {
  local status=$1
  shift
  echo "$SCRIPT_NAME: $*" >&2
  exit "$status"
}

# The settings the two hardware checks share (each script documents them); $1 names the
# check (gpu, npu), $2 is its default layer count. refuse: stopped before starting.
# shellcheck disable=SC2034  # read by the sourcing script
check_settings() {
  OUT="${OUT:-$ROOT/$1-check-out}"
  BUILD="${PINSTAGE_CHECK_BUILD:-$ROOT/build-$1}"
  LAYERS="${PINSTAGE_CHECK_LAYERS:-$2}"
  GROUPS_N="${PINSTAGE_CHECK_GROUPS:-3}"
  ROUNDS="${PINSTAGE_CHECK_ROUNDS:-4}"
  JOBS="${PINSTAGE_CHECK_JOBS:-$(nproc)}"
  PREBUILT="${PINSTAGE_CHECK_PREBUILT:-0}"
}
refuse() { fail 2 "$@"; }
# Refuses unless every argument is a whole number >= 1.
whole_sizes() {
  local n
  for n in "$@"; do
    [[ "$n" =~ ^[1-9][0-9]*$ ]] || refuse "every PINSTAGE_CHECK_* size must be a whole number >= 1, got '$n'"
  done
}
