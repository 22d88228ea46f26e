# Benchmarks of the fixture area (docs/benchmarks.md, "Fixture generation").
add_executable(bench_fixture ${CMAKE_CURRENT_LIST_DIR}/bench_fixture.cpp)
target_link_libraries(bench_fixture PRIVATE pinstage pinstage_internal pinstage_scene_qwen3
                                            benchmark::benchmark)
add_dependencies(bench_fixture pinstage_backend_sim)
