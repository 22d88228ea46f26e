# Tests of the bind area: the Binder, the A/B harness and `pinstage bench`.
pinstage_add_gtest(test_bind
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_bind.cpp
  LABELS bind concurrency)
add_dependencies(test_bind pinstage_backend_sim)

pinstage_add_gtest(test_ab_bench
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_ab_bench.cpp
  LABELS bind)
add_dependencies(test_ab_bench pinstage_backend_sim)

pinstage_add_gtest(test_ab_bench_cli
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_ab_bench_cli.cpp
  LABELS bind)
target_compile_definitions(test_ab_bench_cli PRIVATE
  PINSTAGE_CLI_PATH="$<TARGET_FILE:pinstage_cli>")
add_dependencies(test_ab_bench_cli pinstage_cli pinstage_backend_sim)

pinstage_add_gtest(test_staging_ring
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_staging_ring.cpp
  LABELS bind concurrency)
add_dependencies(test_staging_ring pinstage_backend_sim)

pinstage_add_gtest(test_resident
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_resident.cpp
  LABELS bind)
add_dependencies(test_resident pinstage_backend_sim)

# The node level: WorkerGroup, thread teams, group bind (and its fault sweep), the
# tensor-parallel load onto a group's devices.
pinstage_add_gtest(test_worker_group
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_worker_group.cpp
  LABELS bind node concurrency)
add_dependencies(test_worker_group pinstage_backend_sim)
