# Tests of the qwen3 golden: kernels and comparison on synthetic data, the decode on the
# real fixture (2 layers, 2 GB).
pinstage_add_gtest(test_golden
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_golden_kernels.cpp
          ${CMAKE_CURRENT_LIST_DIR}/test_golden_compare.cpp
          ${CMAKE_CURRENT_LIST_DIR}/test_golden.cpp
  LABELS golden)
# qwen3_dump: writes a fixture and its goldens as .safetensors for the PyTorch anchor
# (tests/python/test_golden_vs_torch.py).
add_executable(qwen3_dump ${PROJECT_SOURCE_DIR}/tests/tools/qwen3_dump.cpp)
target_link_libraries(qwen3_dump PRIVATE pinstage pinstage_internal)
