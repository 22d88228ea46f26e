# Tests of the sim backend's device model (src/backends/sim): the device pool, the driver's
# bounce and direct paths, its streams and its options. They compile the pool, the engine,
# the streams and the option parser in (the plugin exports only its entry) and reach the
# rest through the Worker.
pinstage_add_gtest(test_sim
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_sim_pool.cpp
          ${CMAKE_CURRENT_LIST_DIR}/test_sim_driver.cpp
          ${CMAKE_CURRENT_LIST_DIR}/test_sim_devices.cpp
          ${PROJECT_SOURCE_DIR}/src/backends/sim/device_pool.cpp
          ${PROJECT_SOURCE_DIR}/src/backends/sim/sim_config.cpp
          ${PROJECT_SOURCE_DIR}/src/backends/sim/dma.cpp
          ${PROJECT_SOURCE_DIR}/src/backends/sim/stream.cpp
  LABELS sim concurrency)
target_include_directories(test_sim PRIVATE ${PROJECT_SOURCE_DIR}/src)
add_dependencies(test_sim pinstage_backend_sim)
