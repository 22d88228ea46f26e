# Tests of the scene registry and the scene run (bind + execute + compare on sim).
pinstage_add_gtest(test_scene SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_scene.cpp
  LIBRARIES pinstage_scenes)
add_dependencies(test_scene pinstage_backend_sim)
