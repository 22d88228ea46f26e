# pinstage_add_backend(NAME SOURCES ...): one backend plugin, built as a MODULE named
# libpinstage_backend_<NAME>.so next to libpinstage. It links base only (no tensor, bind,
# bench or scene code: tests/conformance checks the symbols) and exports only its entry.
function(pinstage_add_backend name)
  cmake_parse_arguments(ARG "" "" "SOURCES;LIBRARIES" ${ARGN})
  set(target pinstage_backend_${name})
  add_library(${target} MODULE ${ARG_SOURCES})
  target_link_libraries(${target} PRIVATE pinstage_base ${ARG_LIBRARIES})
  target_include_directories(${target} PRIVATE ${PROJECT_SOURCE_DIR}/src)
  set_target_properties(${target} PROPERTIES PREFIX "lib" BUILD_RPATH "$ORIGIN")
  pinstage_install(${target} PLUGIN)  # into <libdir>/pinstage (cmake/install.cmake)
endfunction()

# pinstage_test_optimization(TARGET): a test binary's own code at -O1 in a release build
# (the library it tests stays -O3): test_checkpoint.cpp compiles in 15.6 s of CPU at -O1,
# 24.7 s at -O3, and the test code is glue around the library's calls.
function(pinstage_test_optimization target)
  target_compile_options(${target} PRIVATE $<$<CONFIG:Release>:-O1>)
endfunction()

# pinstage_add_gtest(NAME SOURCES ... [LABELS ...]): one GoogleTest binary whose tests are
# registered with ctest (labels let CI pick the concurrency set for TSan).
function(pinstage_add_gtest name)
  cmake_parse_arguments(ARG "" "" "SOURCES;LABELS;LIBRARIES" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE pinstage pinstage_internal GTest::gtest_main ${ARG_LIBRARIES})
  pinstage_test_optimization(${name})
  gtest_discover_tests(${name} DISCOVERY_TIMEOUT 60)
  # Labels go on through a ctest include file run after discovery: gtest_discover_tests
  # flattens its PROPERTIES, so LABELS "bind;concurrency" would keep only "bind".
  if(ARG_LABELS)
    set(file "${CMAKE_CURRENT_BINARY_DIR}/${name}_labels.cmake")
    file(WRITE "${file}" "if(DEFINED ${name}_TESTS)\n  set_tests_properties(\${${name}_TESTS} "
                         "PROPERTIES LABELS \"${ARG_LABELS}\")\nendif()\n")
    set_property(DIRECTORY APPEND PROPERTY TEST_INCLUDE_FILES "${file}")
  endif()
endfunction()
