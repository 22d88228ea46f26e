# Benchmarks of the qwen3 golden (docs/benchmarks.md, "Golden").
add_executable(bench_golden ${CMAKE_CURRENT_LIST_DIR}/bench_golden.cpp)
target_link_libraries(bench_golden PRIVATE pinstage pinstage_scene_qwen3
                                           pinstage_scene_qwen3_internal benchmark::benchmark)
