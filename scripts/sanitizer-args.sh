# Sourced by check-sanitizers.sh and fuzz.sh: the CMake arguments of the instrumented trees.
# `common`: -O1 -g1 (and -g1 from PINSTAGE_SANITIZE), what the sanitizers' own docs
# suggest, and 2.4 times less compile time than RelWithDebInfo's -O2 -g (docs/benchmarks.md,
# "CI's time"); no benchmarks or Python module. `asan_args`: the ASan+UBSan tree, which is
# also the fuzz tree (fuzz/: libFuzzer's coverage on the libraries it tests), so CI
# compiles the library once for both. With clang: its instrumented objects take 1.6-1.8x
# less CPU than GCC 12's at the same flags (test_checkpoint.cpp 34.5 s against 60.9 s,
# load.cpp 5.4 s against 8.6 s), and libFuzzer is clang's.
common=(-DCMAKE_BUILD_TYPE=RelWithDebInfo "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG"
        -DPINSTAGE_BUILD_BENCH=OFF -DPINSTAGE_BUILD_PYTHON=OFF)
asan_args=("${common[@]}" -DPINSTAGE_SANITIZE=address,undefined -DCMAKE_CXX_COMPILER=clang++
           -DCMAKE_C_COMPILER=clang -DPINSTAGE_BUILD_FUZZ=ON)
