# Opening checkpoints: the safetensors header parse at 10k-1M tensors (docs/benchmarks.md,
# "Opening a header of 100,000 tensors"); a plain program that prints the time per tensor.
add_executable(bench_header ${CMAKE_CURRENT_LIST_DIR}/bench_header.cpp)
target_link_libraries(bench_header PRIVATE pinstage)
