#!/usr/bin/env bash
# The installed package, step by step (tests/install/CMakeLists.txt registers each step as
# a ctest test; docs/install.md). Every step fails with a message naming what is wrong.
#
#   install_test.sh version      <pinstage binary> <version>
#   install_test.sh prefix       <build> <work> <source>
#   install_test.sh layout       <build> <work> <source>
#   install_test.sh cli          <work> <version>
#   install_test.sh find_package <work> <version> <source> <c++ compiler>
#   install_test.sh pkg_config   <work> <version> <source> <c++ compiler>
#
# `prefix` installs into <work>/staged and then moves it to <work>/prefix: every later step
# uses the moved tree, so nothing may depend on where it was installed.
set -euo pipefail
# The library folder under the prefix: CMAKE_INSTALL_LIBDIR (lib, or lib/<multiarch>).
libdir=${INSTALL_TEST_LIBDIR:-lib}

fail() {
  echo "install test: FAILED: $*" >&2
  exit 1
}

step_version() {  # <pinstage binary> <version>
  local out
  out=$("$1" --version) || fail "'pinstage --version' exited with $?"
  [ "$out" = "pinstage $2" ] || fail "'pinstage --version' printed '$out', not 'pinstage $2'"
  echo "pinstage --version: $out"
}

step_prefix() {  # <build> <work> <source>
  local build=$1 work=$2
  rm -rf "$work"
  mkdir -p "$work"
  cmake --install "$build" --prefix "$work/staged" >"$work/install.log" ||
    { cat "$work/install.log"; fail "cmake --install $build"; }
  mv "$work/staged" "$work/prefix"
  echo "installed $(grep -c 'Installing:' "$work/install.log") files, moved to $work/prefix"
}

# The files a user needs are there and test-only files are not.
check_files() {  # <prefix>
  local p=$1 f
  local l=$libdir
  for f in bin/pinstage "$l/libpinstage.so" "$l/libpinstage_base.so" \
    "$l/libpinstage_scene_qwen3.so" "$l/pinstage/libpinstage_backend_sim.so" \
    "$l/pinstage/libpinstage_backend_sim.backend" include/pinstage/version.h include/pinstage/worker.h include/pinstage/backend/platform_abi.h \
    include/pinstage/backend/slot.h include/pinstage/qwen3/scene.h \
    "$l/cmake/pinstage/pinstageConfig.cmake" "$l/cmake/pinstage/pinstageConfigVersion.cmake" \
    "$l/cmake/pinstage/pinstageTargets.cmake" "$l/pkgconfig/pinstage.pc"; do
    [ -f "$p/$f" ] || fail "$f is not installed"
  done
  f=$(find "$p" -name 'lib*bad_version*' -o -name '*no_entry*' -o -name '*missing_slot*' \
    -o -name 'test_*' -o -name '*fake_cuda*' -o -name '*_internal*' -o -name '*twin*')
  [ -z "$f" ] || fail "test files are installed: $f"
}

# No installed text file, and no program or library's RUNPATH or constant strings
# (__FILE__), names the build or source tree (debug info may: it is for this machine);
# every RUNPATH is $ORIGIN-relative (a directory outside the project, like the CUDA
# toolkit's, may follow). The public headers include neither the header-only
# dependencies nor private headers.
check_relocatable() {  # <prefix> <build> <source>
  local p=$1 build=$2 src=$3 f rpath
  f=$(grep -rlIF -e "$build" -e "$src" "$p" || true)
  [ -z "$f" ] || fail "installed files name the build or source tree: $f"
  while IFS= read -r f; do
    rpath=$(readelf -d "$f" | sed -n 's/.*(RUNPATH).*\[\(.*\)\]/\1/p')
    # shellcheck disable=SC2016  # a literal $ORIGIN
    [[ "$rpath" == '$ORIGIN'* ]] || fail "$f: RUNPATH '$rpath' is not relative to \$ORIGIN"
    ! readelf -p .rodata "$f" 2>/dev/null | grep -qF -e "$build" -e "$src" ||
      fail "$f: its strings name the build or source tree"
  done < <(find "$p/bin" "$p/$libdir" -type f \( -perm -u+x -o -name '*.so' \))
  f=$(grep -rlE '#include [<"](nlohmann|CLI)/' "$p/include" || true)
  [ -z "$f" ] || fail "public headers include a header-only dependency: $f"
}

# The installed headers compile against the installed tree alone (no src/ header).
check_headers() {  # <prefix> <work>
  local p=$1 tu=$2/all_headers.cpp
  (cd "$p/include" && find . -name '*.h' | sort | sed 's|^\./\(.*\)|#include "\1"|') >"$tu"
  c++ -std=c++20 -fsyntax-only -I"$p/include" "$tu" ||
    fail "the installed headers do not compile against the installed tree ($tu)"
}

step_layout() {  # <build> <work> <source>
  local p=$2/prefix
  check_files "$p"
  check_relocatable "$p" "$(realpath "$1")" "$(realpath "$3")"
  check_headers "$p" "$2"
  echo "layout: files, RUNPATHs and headers as expected"
}

step_cli() {  # <work> <version>
  local p
  p=$(realpath "$1/prefix")
  step_version "$p/bin/pinstage" "$2"
  local lib out
  lib=$(ldd "$p/bin/pinstage" | awk '$1 == "libpinstage.so" { print $3 }')
  [[ -n "$lib" && "$(realpath "$lib")" == "$p/$libdir/libpinstage.so" ]] ||
    fail "the installed CLI does not load $p/$libdir/libpinstage.so: $(ldd "$p/bin/pinstage")"
  out=$(env -u LD_LIBRARY_PATH "$p/bin/pinstage" info) || fail "'pinstage info' failed: $out"
  local sim
  sim=$(grep -E "^  sim " <<<"$out" || true)
  [[ "$sim" == *"$p/$libdir/pinstage/libpinstage_backend_sim.so"* && "$sim" != *"not usable"* &&
    "$sim" != *unusable* ]] ||
    fail "'pinstage info' does not list the installed sim plugin as usable: $out"
  echo "pinstage info: sim from $p/$libdir/pinstage"
}

step_find_package() {  # <work> <version> <source> <c++ compiler>
  local p b=$1/consumer-cmake
  p=$(realpath "$1/prefix")
  rm -rf "$b"
  cmake -S "$3/tests/install/consumer" -B "$b" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_CXX_COMPILER="$4" -DCMAKE_PREFIX_PATH="$p" -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF \
    >"$b.log" 2>&1 || { cat "$b.log"; fail "configuring the find_package consumer"; }
  grep -qx "pinstage_DIR:PATH=$p/$libdir/cmake/pinstage" "$b/CMakeCache.txt" ||
    fail "find_package found another pinstage: $(grep pinstage_DIR "$b/CMakeCache.txt")"
  cmake --build "$b" >>"$b.log" 2>&1 || { cat "$b.log"; fail "building the consumer"; }
  env -u LD_LIBRARY_PATH "$b/pinstage_consumer" "$2" "$p/$libdir/pinstage" ||
    fail "the find_package consumer"
}

step_pkg_config() {  # <work> <version> <source> <c++ compiler>
  local p exe=$1/consumer-pkgconfig
  p=$(realpath "$1/prefix")
  command -v pkg-config >/dev/null || fail "pkg-config is not installed (apt install pkg-config)"
  export PKG_CONFIG_PATH=$p/$libdir/pkgconfig
  [ "$(pkg-config --modversion pinstage)" = "$2" ] ||
    fail "pkg-config --modversion pinstage: $(pkg-config --modversion pinstage), not $2"
  # shellcheck disable=SC2046  # the flags are words
  "$4" -std=c++20 -O1 -o "$exe" "$3/tests/install/consumer/main.cpp" \
    -DCONSUMER_PLUGIN_DIR="\"$(pkg-config --variable=plugindir pinstage)\"" \
    $(pkg-config --cflags --libs pinstage) -Wl,-rpath,"$p/$libdir" ||
    fail "building the consumer with pkg-config --cflags --libs pinstage"
  env -u LD_LIBRARY_PATH "$exe" "$2" "$p/$libdir/pinstage" || fail "the pkg-config consumer"
}

step_manifest() {  # <build> <work> <source>: docs/install.md's table lists every installed file
  python3 "$3/tests/install/check_manifest.py" "$1/install_manifest.txt" "$(realpath "$2")/staged" \
    "$3/docs/install.md" || fail "docs/install.md's table and the installed files differ"
}

step=${1:?step}
shift
case $step in
  version | prefix | layout | manifest | cli | find_package | pkg_config) "step_$step" "$@" ;;
  *) fail "unknown step '$step'" ;;
esac
