# Tests of the checkpoint area: opening and validating checkpoints, loading them into
# pinned host memory and onto the sim device (includes a 1 GiB tensor: ~2 GB of disk and
# memory at peak).
pinstage_add_gtest(test_checkpoint
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_checkpoint.cpp
  LABELS tensor checkpoint)
add_dependencies(test_checkpoint pinstage_backend_sim)

# Tensor-parallel loading: plans, slices against a reference for tp 1..8, refusals.
pinstage_add_gtest(test_load_tp
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_load_tp.cpp
  LABELS tensor checkpoint)
add_dependencies(test_load_tp pinstage_backend_sim)
