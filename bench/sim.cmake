# Benchmarks of the sim backend's device model: the link pacing (backend option link_gbps).
add_executable(bench_sim_link ${CMAKE_CURRENT_LIST_DIR}/bench_sim_link.cpp)
target_link_libraries(bench_sim_link PRIVATE pinstage benchmark::benchmark)
add_dependencies(bench_sim_link pinstage_backend_sim)
