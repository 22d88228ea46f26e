# Tests of the bind area: the Binder, the A/B harness and `pinstage bench`.
pinstage_sim_gtest(test_bind LABELS bind concurrency)
pinstage_sim_gtest(test_ab_bench LABELS bind)
pinstage_sim_gtest(test_ab_bench_cli LABELS bind)
target_compile_definitions(test_ab_bench_cli PRIVATE
  PINSTAGE_CLI_PATH="$<TARGET_FILE:pinstage_cli>")
add_dependencies(test_ab_bench_cli pinstage_cli)
pinstage_sim_gtest(test_staging_ring LABELS bind concurrency)
pinstage_sim_gtest(test_resident LABELS bind)

# The node level: WorkerGroup, thread teams, group bind (and its fault sweep), the
# tensor-parallel load onto a group's devices.
pinstage_sim_gtest(test_worker_group LABELS bind node concurrency)
