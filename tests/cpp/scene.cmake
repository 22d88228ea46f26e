# Tests of the scene registry and the scene run (bind + execute + compare on sim).
pinstage_add_gtest(test_scene SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_scene.cpp
  LIBRARIES pinstage_scenes)
add_dependencies(test_scene pinstage_backend_sim broken_plugin_no_device_ops)
# sim without the ABI's device copy: a resident decode then uploads what it feeds.
target_compile_definitions(test_scene PRIVATE
  PINSTAGE_NO_DEVICE_OPS_PLUGIN="${CMAKE_BINARY_DIR}/test_plugins/libno_device_ops.so")
