# Tests of the tensor area: dtypes, tensors, allocators, TaskArgs, the normal generator,
# the Qwen3 decode fixture and safetensors I/O.
pinstage_add_gtest(test_tensor
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_dtype.cpp
          ${CMAKE_CURRENT_LIST_DIR}/test_tensor.cpp
  LABELS tensor)
add_dependencies(test_tensor pinstage_backend_sim)

# The generator and the fixture (builds 1- and 2-layer fixtures: about 4 GB at peak).
pinstage_add_gtest(test_fixture
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_random.cpp
          ${CMAKE_CURRENT_LIST_DIR}/test_fixture.cpp
  LABELS tensor)
add_dependencies(test_fixture pinstage_backend_sim)

pinstage_sim_gtest(test_safetensors LABELS tensor)
