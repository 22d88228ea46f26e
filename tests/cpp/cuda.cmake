# Tests of the cuda area (only when the cuda backend is built, see src/backends/cuda).
#  test_cuda_plugin (label cuda): no GPU needed; GPUs are hidden from it.
#  test_cuda_gpu (label requires_gpu): skipped, never passed, where no GPU is present.
#  fake_cuda.* (label cuda): test_cuda_gpu again, on the fake CUDA runtime of
#    test_cuda_fake_runtime.cpp, so the plugin's logic is exercised without a GPU. It
#    checks bookkeeping, ordering and device selection, not the hardware. Any test can
#    run the cuda backend on the fake the same way: LD_LIBRARY_PATH=${CMAKE_BINARY_DIR}/fake_cuda
#    (the conformance suite does). Its host-source, NUMA and huge-page tests are the checks
#    of host_source_checks.h, shared with acl.
#  test_cuda_unload, cuda_plugin_nodelete (label cuda): the plugin is never unloaded.
#  gpu_probe.* (label cuda): pinstage_gpu_probe's CPU-only mode, its argument checks and
#    a whole run on the fake runtime.
#  gpu_check.* (label cuda): scripts/gpu-check.sh on the fake runtime, and its refusal
#    without .deps.
if(TARGET pinstage_backend_cuda)
  # test_cuda_plugin (label cuda) and test_cuda_gpu (label requires_gpu) load the plugin.
  foreach(pair "test_cuda_plugin;cuda" "test_cuda_gpu;requires_gpu")
    list(GET pair 0 test)
    list(GET pair 1 label)
    pinstage_add_gtest(${test} SOURCES ${CMAKE_CURRENT_LIST_DIR}/${test}.cpp LABELS ${label}
                       LIBRARIES pinstage_cuda_support ${CMAKE_DL_LIBS})
    target_compile_definitions(${test} PRIVATE
      PINSTAGE_CUDA_PLUGIN_PATH="$<TARGET_FILE:pinstage_backend_cuda>")
    add_dependencies(${test} pinstage_backend_cuda)
  endforeach()

  # The fake runtime: libcudart.so.13 in a folder of its own, found first through
  # LD_LIBRARY_PATH (the plugin and the test use RUNPATH, which that overrides).
  set(_fake_dir ${CMAKE_BINARY_DIR}/fake_cuda)
  file(WRITE ${CMAKE_CURRENT_BINARY_DIR}/fake_cudart.map
       "libcudart.so.13 { global: cuda*; pinstage_fake_cuda_*; local: *; };\n")
  add_library(pinstage_fake_cudart SHARED ${CMAKE_CURRENT_LIST_DIR}/test_cuda_fake_runtime.cpp)
  target_link_libraries(pinstage_fake_cudart PRIVATE CUDA::toolkit Threads::Threads)
  target_link_options(pinstage_fake_cudart PRIVATE
    -Wl,--version-script=${CMAKE_CURRENT_BINARY_DIR}/fake_cudart.map)
  set_target_properties(pinstage_fake_cudart PROPERTIES
    OUTPUT_NAME cudart VERSION 13 SOVERSION 13
    LIBRARY_OUTPUT_DIRECTORY ${_fake_dir}
    CXX_VISIBILITY_PRESET default)
  add_dependencies(test_cuda_gpu pinstage_fake_cudart)
  # test_cuda_plugin re-runs itself on the fake to list its devices (CudaOnFakeRuntime.*).
  add_dependencies(test_cuda_plugin pinstage_fake_cudart)
  target_compile_definitions(test_cuda_plugin PRIVATE
    PINSTAGE_FAKE_CUDA_DIR="${CMAKE_BINARY_DIR}/fake_cuda")
  gtest_discover_tests(test_cuda_gpu
    TEST_PREFIX "fake_cuda."
    PROPERTIES LABELS cuda ENVIRONMENT "LD_LIBRARY_PATH=${_fake_dir}"
    DISCOVERY_TIMEOUT 60)

  # Issue 16, item 1: the plugin is NODELETE in its own dynamic section, and a program
  # that does not link libcudart (test_cuda_unload, like the CLI) keeps both mapped.
  add_executable(test_cuda_unload ${CMAKE_CURRENT_LIST_DIR}/test_cuda_unload.cpp)
  target_link_libraries(test_cuda_unload PRIVATE pinstage pinstage_internal GTest::gtest_main
                                                 ${CMAKE_DL_LIBS})
  target_compile_definitions(test_cuda_unload PRIVATE
    PINSTAGE_CUDA_PLUGIN_PATH="$<TARGET_FILE:pinstage_backend_cuda>")
  add_dependencies(test_cuda_unload pinstage_backend_cuda pinstage_fake_cudart)
  gtest_discover_tests(test_cuda_unload
    PROPERTIES LABELS cuda ENVIRONMENT "LD_LIBRARY_PATH=${_fake_dir}"
    DISCOVERY_TIMEOUT 60)
  find_program(PINSTAGE_READELF readelf REQUIRED)
  add_test(NAME cuda_plugin_nodelete
           COMMAND ${PINSTAGE_READELF} -d $<TARGET_FILE:pinstage_backend_cuda>)
  set_tests_properties(cuda_plugin_nodelete PROPERTIES LABELS cuda
    PASS_REGULAR_EXPRESSION "FLAGS_1[^\n]*NODELETE")

  # tools/gpu_probe is added before tests/cpp (see the top CMakeLists.txt).
  if(TARGET pinstage_gpu_probe)
    add_test(NAME gpu_probe.prefault_only
             COMMAND pinstage_gpu_probe --prefault-only --prefault-mib 64)
    set_tests_properties(gpu_probe.prefault_only PROPERTIES LABELS cuda
      PASS_REGULAR_EXPRESSION "\"prefault\": {[^}]*\"bytes\": 67108864")
    add_test(NAME gpu_probe.rejects_bad_arguments
             COMMAND pinstage_gpu_probe --prefault-only --reps 0)
    set_tests_properties(gpu_probe.rejects_bad_arguments PROPERTIES LABELS cuda
      PASS_REGULAR_EXPRESSION "--reps: Value 0 not in range")
    # Every CUDA line of the probe, on the fake runtime, at small sizes.
    add_test(NAME gpu_probe.on_fake_cuda
             COMMAND pinstage_gpu_probe --link-mib 4 --reps 2 --pin-mib 8 --prefault-mib 8)
    set_tests_properties(gpu_probe.on_fake_cuda PROPERTIES LABELS cuda
      ENVIRONMENT "LD_LIBRARY_PATH=${_fake_dir}"
      PASS_REGULAR_EXPRESSION "\"complete\": true")
    add_dependencies(pinstage_gpu_probe pinstage_fake_cudart)
  endif()

  # scripts/gpu-check.sh, the whole of it but the build, on the fake runtime at small
  # sizes (probe, bench, summary), so every line has run before a GPU is lent. The bench
  # is the synthetic task here: qwen3-decode's smallest size (1 GB) is too slow for ctest.
  if(TARGET pinstage_gpu_probe AND TARGET pinstage_cli)
    set(_check_out ${CMAKE_CURRENT_BINARY_DIR}/gpu-check-fake-out)
    add_test(NAME gpu_check.on_fake_cuda COMMAND bash ${PROJECT_SOURCE_DIR}/scripts/gpu-check.sh)
    set_tests_properties(gpu_check.on_fake_cuda PROPERTIES LABELS cuda TIMEOUT 300
      ENVIRONMENT "OUT=${_check_out};PINSTAGE_CHECK_BUILD=${CMAKE_BINARY_DIR};PINSTAGE_CHECK_PREBUILT=1;PINSTAGE_CHECK_FAKE_GPU=${_fake_dir};PINSTAGE_CHECK_LAYERS=1;PINSTAGE_CHECK_GROUPS=2;PINSTAGE_CHECK_ROUNDS=2;PINSTAGE_CHECK_BENCH_TASK=synthetic --tensors 6 --bytes 1M;PINSTAGE_CHECK_MAP_TASK=qwen3-decode --layers 1 --seq-len 1;PINSTAGE_CHECK_PIN_MIB=8;PINSTAGE_CHECK_LINK_MIB=4;PINSTAGE_CHECK_PREFAULT_MIB=8;PINSTAGE_CHECK_CTEST_ARGS=-R ^CudaStatus[.];PINSTAGE_CHECK_PYTHON=${Python_EXECUTABLE}"
      PASS_REGULAR_EXPRESSION "gpu-check: every step ran")
    add_test(NAME gpu_check.refuses_without_deps COMMAND bash ${PROJECT_SOURCE_DIR}/scripts/gpu-check.sh)
    set_tests_properties(gpu_check.refuses_without_deps PROPERTIES LABELS cuda
      ENVIRONMENT "OUT=${CMAKE_CURRENT_BINARY_DIR}/gpu-check-nodeps-out;PINSTAGE_CHECK_DEPS=${CMAKE_CURRENT_BINARY_DIR}/no-such-deps"
      PASS_REGULAR_EXPRESSION "gpu-check: no .*no-such-deps.*scripts/vendor-deps.sh")
    # Old results are never summarised as new: a non-empty OUT it did not make is refused.
    file(WRITE ${CMAKE_CURRENT_BINARY_DIR}/gpu-check-foreign-out/summary.json "{}\n")
    add_test(NAME gpu_check.refuses_a_foreign_out COMMAND bash ${PROJECT_SOURCE_DIR}/scripts/gpu-check.sh)
    set_tests_properties(gpu_check.refuses_a_foreign_out PROPERTIES LABELS cuda
      ENVIRONMENT "OUT=${CMAKE_CURRENT_BINARY_DIR}/gpu-check-foreign-out;PINSTAGE_CHECK_PREBUILT=1"
      PASS_REGULAR_EXPRESSION "gpu-check-foreign-out is not empty and was not made by this script")
  endif()
endif()
