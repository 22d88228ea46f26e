# Tests of the qwen3 golden: kernels and comparison on synthetic data, the decode on the
# real fixture (2 layers, 2 GB).
pinstage_add_gtest(test_golden
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_golden_kernels.cpp
          ${CMAKE_CURRENT_LIST_DIR}/test_golden_compare.cpp
          ${CMAKE_CURRENT_LIST_DIR}/test_golden.cpp
  LABELS golden
  LIBRARIES pinstage_scene_qwen3 pinstage_scene_qwen3_internal)
# The fixture's tests (test_fixture.cpp, in test_fixture of tensor.cmake) use the scene's
# library.
target_link_libraries(test_fixture PRIVATE pinstage_scene_qwen3)
