#!/usr/bin/env bash
# Copies the build's outside dependencies into .deps/ (git-ignored) so the tree builds on
# a machine that has no Debian -dev packages (the GPU check machine, scripts/gpu-check.sh):
#   .deps/include/nlohmann   nlohmann/json headers   (found by the top CMakeLists)
#   .deps/include/CLI        CLI11 headers           (found by the top CMakeLists)
#   .deps/googletest         GoogleTest sources      (built by scripts/gpu-check.sh)
# Run it on the development machine, then send .deps along with the tree.
# Sources can be overridden: JSON_INCLUDE=/path CLI11_INCLUDE=/path GTEST_SRC=/path.
set -euo pipefail

# shellcheck source=scripts/lib/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/common.sh"
dest="$ROOT/.deps"
json_src="${JSON_INCLUDE:-/usr/include}/nlohmann"
cli_src="${CLI11_INCLUDE:-/usr/include}/CLI"
gtest_src="${GTEST_SRC:-/usr/src/googletest}"

[ -f "$json_src/json.hpp" ] || fail 1 "no nlohmann/json at $json_src (apt install nlohmann-json3-dev, or set JSON_INCLUDE)"
[ -f "$cli_src/CLI.hpp" ] || fail 1 "no CLI11 at $cli_src (apt install libcli11-dev, or set CLI11_INCLUDE)"

mkdir -p "$dest/include"
rm -rf "$dest/include/nlohmann" "$dest/include/CLI" "$dest/googletest"
cp -a "$json_src" "$dest/include/nlohmann"
cp -a "$cli_src" "$dest/include/CLI"
if [ -f "$gtest_src/CMakeLists.txt" ] && [ -d "$gtest_src/googletest" ]; then
  cp -a "$gtest_src" "$dest/googletest"
  gtest_note="GoogleTest sources from $gtest_src"
else
  gtest_note="no GoogleTest sources (apt install googletest, or set GTEST_SRC): the GPU check will build without tests"
  echo "vendor-deps: warning: $gtest_note" >&2
fi

{
  echo "Copied by scripts/vendor-deps.sh on $(date -u +%Y-%m-%dT%H:%M:%SZ) from $(hostname)."
  echo "nlohmann/json from $json_src ($(grep -m1 -o 'version [0-9.]*' "$json_src/json.hpp" || echo 'version unknown'))"
  echo "CLI11 from $cli_src ($(grep -m1 -o 'CLI11_VERSION "[0-9.]*"' "$cli_src/Version.hpp" 2>/dev/null || echo 'version unknown'))"
  echo "$gtest_note"
} > "$dest/SOURCES.txt"

echo "vendor-deps: wrote $dest ($(du -sh "$dest" | cut -f1))"
cat "$dest/SOURCES.txt"
