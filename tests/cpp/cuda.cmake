# Tests of the cuda area (only when the cuda backend is built, see src/backends/cuda).
#  test_cuda_plugin (label cuda): no GPU needed; GPUs are hidden from it.
#  test_cuda_gpu (label requires_gpu): skipped, never passed, where no GPU is present.
#  fake_cuda.* (label cuda): test_cuda_gpu again, on the fake CUDA runtime of
#    test_cuda_fake_runtime.cpp, so the plugin's logic is exercised without a GPU. It
#    checks bookkeeping, ordering and device selection, not the hardware. Any test can
#    run the cuda backend on the fake the same way: LD_LIBRARY_PATH=${CMAKE_BINARY_DIR}/fake_cuda
#    (the conformance suite does).
#  gpu_probe.* (label cuda): pinstage_gpu_probe's CPU-only mode and its argument checks.
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
  gtest_discover_tests(test_cuda_gpu
    TEST_PREFIX "fake_cuda."
    PROPERTIES LABELS cuda ENVIRONMENT "LD_LIBRARY_PATH=${_fake_dir}"
    DISCOVERY_TIMEOUT 60)

  # tools/gpu_probe is added before tests/cpp (see the top CMakeLists.txt).
  if(TARGET pinstage_gpu_probe)
    add_test(NAME gpu_probe.prefault_only
             COMMAND pinstage_gpu_probe --prefault-only --prefault-gib 1)
    set_tests_properties(gpu_probe.prefault_only PROPERTIES LABELS cuda
      PASS_REGULAR_EXPRESSION "\"prefault\": {[^}]*\"bytes\": 1073741824")
    add_test(NAME gpu_probe.rejects_bad_arguments
             COMMAND pinstage_gpu_probe --prefault-only --reps 0)
    set_tests_properties(gpu_probe.rejects_bad_arguments PROPERTIES LABELS cuda
      PASS_REGULAR_EXPRESSION "--reps: Value 0 not in range")
  endif()
endif()
