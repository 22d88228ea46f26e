# Tests of base and the runtime core: worker, allocation table, plugin loading, thread
# pool, settings, pages. The backend contract itself is tests/conformance.

# Broken plugins for the loader's error paths; built into a folder of their own so
# `pinstage info` never lists them.
# no_device_ops is not broken: sim without the ABI v5 device-side slots.
foreach(broken bad_version no_entry missing_slot no_device_ops)
  add_library(broken_plugin_${broken} MODULE ${CMAKE_CURRENT_LIST_DIR}/plugins/${broken}.cpp)
  target_include_directories(broken_plugin_${broken} PRIVATE ${PROJECT_SOURCE_DIR}/include)
  set_target_properties(broken_plugin_${broken} PROPERTIES
    LIBRARY_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/test_plugins
    OUTPUT_NAME ${broken} PREFIX "lib")
endforeach()
# half_topology is no_device_ops with device_count alone (the loader refuses half a pair).
add_library(broken_plugin_half_topology MODULE ${CMAKE_CURRENT_LIST_DIR}/plugins/no_device_ops.cpp)
target_include_directories(broken_plugin_half_topology PRIVATE ${PROJECT_SOURCE_DIR}/include)
set_target_properties(broken_plugin_half_topology PROPERTIES
  LIBRARY_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/test_plugins OUTPUT_NAME half_topology PREFIX "lib")
target_compile_definitions(broken_plugin_half_topology PRIVATE PINSTAGE_HALF_TOPOLOGY)
foreach(sim_based no_device_ops half_topology)
  target_compile_definitions(broken_plugin_${sim_based} PRIVATE
    PINSTAGE_SIM_PLUGIN_PATH="$<TARGET_FILE:pinstage_backend_sim>")
  target_link_libraries(broken_plugin_${sim_based} PRIVATE ${CMAKE_DL_LIBS})
  add_dependencies(broken_plugin_${sim_based} pinstage_backend_sim)
endforeach()

pinstage_add_gtest(test_runtime
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_worker.cpp
          ${CMAKE_CURRENT_LIST_DIR}/test_plugin_load.cpp
          ${CMAKE_CURRENT_LIST_DIR}/test_settings.cpp
          ${CMAKE_CURRENT_LIST_DIR}/test_pages.cpp
          ${CMAKE_CURRENT_LIST_DIR}/test_numa_placement.cpp
          ${CMAKE_CURRENT_LIST_DIR}/test_allocation_table.cpp
          ${CMAKE_CURRENT_LIST_DIR}/test_pin_budget.cpp
          ${CMAKE_CURRENT_LIST_DIR}/test_host_pool.cpp
          ${PROJECT_SOURCE_DIR}/src/runtime/allocation_table.cpp
          ${PROJECT_SOURCE_DIR}/src/runtime/host_memory/host_pool.cpp
  LIBRARIES ${CMAKE_DL_LIBS})
target_compile_definitions(test_runtime PRIVATE
  PINSTAGE_TEST_PLUGIN_DIR="${CMAKE_BINARY_DIR}/test_plugins")
add_dependencies(test_runtime pinstage_backend_sim broken_plugin_bad_version
                 broken_plugin_no_entry broken_plugin_missing_slot broken_plugin_no_device_ops
                 broken_plugin_half_topology)

# Concurrency tests: also run under TSan in CI (label concurrency).
pinstage_add_gtest(test_runtime_concurrency
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_worker_concurrency.cpp
          ${CMAKE_CURRENT_LIST_DIR}/test_parallel.cpp
          ${CMAKE_CURRENT_LIST_DIR}/test_host_pool_concurrency.cpp
  LABELS runtime concurrency)
add_dependencies(test_runtime_concurrency pinstage_backend_sim)

# The host-memory provider (issue 46): sim variants that pin as other backends do
# (plugins/pin_variants.cpp), beside the broken plugins.
foreach(variant no_register no_read_only no_pinning)
  add_library(test_plugin_${variant} MODULE ${CMAKE_CURRENT_LIST_DIR}/plugins/pin_variants.cpp)
  target_include_directories(test_plugin_${variant} PRIVATE ${PROJECT_SOURCE_DIR}/include)
  set_target_properties(test_plugin_${variant} PROPERTIES
    LIBRARY_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/test_plugins OUTPUT_NAME ${variant} PREFIX "lib")
  target_compile_definitions(test_plugin_${variant} PRIVATE
    PINSTAGE_SIM_PLUGIN_PATH="$<TARGET_FILE:pinstage_backend_sim>")
  target_link_libraries(test_plugin_${variant} PRIVATE ${CMAKE_DL_LIBS})
  add_dependencies(test_plugin_${variant} pinstage_backend_sim)
endforeach()
target_compile_definitions(test_plugin_no_read_only PRIVATE PINSTAGE_NO_READ_ONLY)
target_compile_definitions(test_plugin_no_pinning PRIVATE PINSTAGE_NO_PINNING)
pinstage_sim_gtest(test_host_sources LABELS runtime
  SOURCES ${PROJECT_SOURCE_DIR}/src/runtime/host_memory/placement.cpp
          ${PROJECT_SOURCE_DIR}/src/runtime/host_memory/host_source.cpp
          ${PROJECT_SOURCE_DIR}/src/runtime/host_memory/shared_named.cpp)
target_compile_definitions(test_host_sources PRIVATE
  PINSTAGE_TEST_PLUGIN_DIR="${CMAKE_BINARY_DIR}/test_plugins")
add_dependencies(test_host_sources test_plugin_no_register test_plugin_no_read_only
                 test_plugin_no_pinning)

# The fault sweep (issue 14): every backend call of a bind and a scene run fails in turn.
pinstage_sim_gtest(test_fault_sweep LABELS runtime faults)

# Issue 41's test gaps (test_gaps41.cpp): sim with a latch per stream (plugins/
# held_streams.cpp) for the pool's two-stream test, next to the broken plugins.
add_library(test_plugin_held_streams MODULE ${CMAKE_CURRENT_LIST_DIR}/plugins/held_streams.cpp)
target_include_directories(test_plugin_held_streams PRIVATE ${PROJECT_SOURCE_DIR}/include)
set_target_properties(test_plugin_held_streams PROPERTIES
  LIBRARY_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/test_plugins OUTPUT_NAME held_streams PREFIX "lib")
target_compile_definitions(test_plugin_held_streams PRIVATE
  PINSTAGE_SIM_PLUGIN_PATH="$<TARGET_FILE:pinstage_backend_sim>")
target_link_libraries(test_plugin_held_streams PRIVATE ${CMAKE_DL_LIBS})
add_dependencies(test_plugin_held_streams pinstage_backend_sim)
pinstage_sim_gtest(test_gaps41 LABELS runtime)
target_compile_definitions(test_gaps41 PRIVATE
  PINSTAGE_TEST_PLUGIN_DIR="${CMAKE_BINARY_DIR}/test_plugins")
add_dependencies(test_gaps41 test_plugin_held_streams)
