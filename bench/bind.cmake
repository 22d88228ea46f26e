# Benchmarks of the bind area: the Binder's own overhead per tensor.
add_executable(bench_bind ${CMAKE_CURRENT_LIST_DIR}/bench_bind.cpp)
target_link_libraries(bench_bind PRIVATE pinstage benchmark::benchmark)
add_dependencies(bench_bind pinstage_backend_sim)
