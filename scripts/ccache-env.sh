# Sourced by the build scripts: ccache (Debian's, installed by setup.sh) as the compiler
# launcher, so CI after a session, and every later build, recompiles only what changed.
# Sets `launcher` (cmake -D arguments; empty without ccache).
# BASEDIR, NOHASHDIR and the ignored -fmacro-prefix-map (its value is the clone's folder;
# it maps that folder away, so the object is the same from any clone) make its keys
# independent of the clone's folder. MAXSIZE: room for the release, ASan, TSan and fuzz
# builds' objects together (the sanitizer builds carry debug info), so one never evicts
# another.
launcher=()
if command -v ccache >/dev/null; then
  export CCACHE_BASEDIR="$root" CCACHE_NOHASHDIR=1 CCACHE_IGNOREOPTIONS="-fmacro-prefix-map=*"
  export CCACHE_MAXSIZE=${CCACHE_MAXSIZE:-20G}
  launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache
            -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
fi
