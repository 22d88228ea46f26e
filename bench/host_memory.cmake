# The host memory pool's figures (docs/benchmarks.md, "Host memory pool"): a plain program,
# since it prints side-by-side ratios rather than per-iteration times.
add_executable(bench_host_pool ${CMAKE_CURRENT_LIST_DIR}/bench_host_pool.cpp
               ${PROJECT_SOURCE_DIR}/src/runtime/host_memory/host_pool.cpp)
target_link_libraries(bench_host_pool PRIVATE pinstage pinstage_internal)
add_dependencies(bench_host_pool pinstage_backend_sim)
