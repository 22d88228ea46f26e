# Tests of the acl backend (label acl), all over the libascendcl test double of
# tests/fakes/ascendcl: no CANN or Ascend card needed. The double is built as
# ${CMAKE_BINARY_DIR}/fake_acl/lib64/libascendcl.so (so ASCEND_HOME_PATH=.../fake_acl finds
# it too) and chosen with PINSTAGE_ACL_LIBRARY. The conformance row is in
# tests/conformance/CMakeLists.txt.
#  test_acl_runtime: the library search order and the error text (no plugin).
#  test_acl_plugin: the plugin through Worker: context per thread, teardown order with an
#    injected failure in each step, each host source (the runtime's registered memory, the
#    aclrtMallocHost fallback, a file's page cache), NUMA placement and the huge-page
#    switch (tests/cpp/host_source_checks.h, shared with cuda), and every rule of the
#    double broken on purpose.
#  acl.cli.*: pinstage info / bench / scene on --backend acl over the double; any
#    violation the double prints fails them.
set(_fake_acl_dir ${CMAKE_BINARY_DIR}/fake_acl)
set(PINSTAGE_FAKE_ACL_LIBRARY ${_fake_acl_dir}/lib64/libascendcl.so)
file(WRITE ${CMAKE_CURRENT_BINARY_DIR}/fake_ascendcl.map
     "{ global: acl*; pinstage_fake_acl_*; local: *; };\n")
add_library(pinstage_fake_ascendcl SHARED ${PROJECT_SOURCE_DIR}/tests/fakes/ascendcl/fake_ascendcl.cpp)
target_include_directories(pinstage_fake_ascendcl PRIVATE ${PROJECT_SOURCE_DIR}/src)
target_link_options(pinstage_fake_ascendcl PRIVATE
  -Wl,--version-script=${CMAKE_CURRENT_BINARY_DIR}/fake_ascendcl.map)
set_target_properties(pinstage_fake_ascendcl PROPERTIES
  OUTPUT_NAME ascendcl LIBRARY_OUTPUT_DIRECTORY ${_fake_acl_dir}/lib64
  CXX_VISIBILITY_PRESET default)
# A second copy, for the search-order test's $ASCEND_TOOLKIT_HOME.
add_custom_command(TARGET pinstage_fake_ascendcl POST_BUILD
  COMMAND ${CMAKE_COMMAND} -E make_directory ${CMAKE_BINARY_DIR}/fake_acl_toolkit/lib64
  COMMAND ${CMAKE_COMMAND} -E copy $<TARGET_FILE:pinstage_fake_ascendcl>
          ${CMAKE_BINARY_DIR}/fake_acl_toolkit/lib64/libascendcl.so)

set(_acl_env "PINSTAGE_ACL_LIBRARY=${PINSTAGE_FAKE_ACL_LIBRARY}")
foreach(test test_acl_runtime test_acl_plugin)
  add_executable(${test} ${CMAKE_CURRENT_LIST_DIR}/${test}.cpp)
  target_link_libraries(${test} PRIVATE pinstage pinstage_internal pinstage_acl_support
                        GTest::gtest_main ${CMAKE_DL_LIBS})
  target_include_directories(${test} PRIVATE ${PROJECT_SOURCE_DIR}/tests/fakes/ascendcl
                                             ${PROJECT_SOURCE_DIR}/tests/cpp)
  target_compile_definitions(${test} PRIVATE
    PINSTAGE_FAKE_ACL_DIR="${_fake_acl_dir}"
    PINSTAGE_FAKE_ACL_TOOLKIT_DIR="${CMAKE_BINARY_DIR}/fake_acl_toolkit"
    PINSTAGE_LIBRARY_PATH="$<TARGET_FILE:pinstage>")
  add_dependencies(${test} pinstage_fake_ascendcl pinstage_backend_acl)
endforeach()
gtest_discover_tests(test_acl_runtime PROPERTIES LABELS acl DISCOVERY_TIMEOUT 60)
gtest_discover_tests(test_acl_plugin PROPERTIES LABELS acl ENVIRONMENT "${_acl_env}"
                     DISCOVERY_TIMEOUT 60)

# The CLI over the double.
set(_cli $<TARGET_FILE:pinstage_cli>)
add_test(NAME acl.cli.info_finds_the_double COMMAND ${_cli} info)
set_tests_properties(acl.cli.info_finds_the_double PROPERTIES LABELS acl
  ENVIRONMENT "${_acl_env}" PASS_REGULAR_EXPRESSION "\n  acl +usable: device 0")
add_test(NAME acl.cli.info_without_a_runtime
         COMMAND ${CMAKE_COMMAND} -E env PINSTAGE_ACL_LIBRARY=/nonexistent/libascendcl.so
                 ${_cli} info)
set_tests_properties(acl.cli.info_without_a_runtime PROPERTIES LABELS acl
  PASS_REGULAR_EXPRESSION "\n  acl +not usable: [^\n]*no Ascend runtime \\(libascendcl.so\\) could be loaded; tried: PINSTAGE_ACL_LIBRARY /nonexistent/libascendcl.so \\(no such file\\)")
add_test(NAME acl.cli.no_library_says_what_was_tried
         COMMAND ${CMAKE_COMMAND} -E env --unset=ASCEND_HOME_PATH --unset=ASCEND_TOOLKIT_HOME
                 --unset=PINSTAGE_ACL_LIBRARY ${_cli} bench qwen3-decode --backend acl
                 --layers 1 --seq-len 64 --groups 2 --rounds 2 --quiet)
set_tests_properties(acl.cli.no_library_says_what_was_tried PROPERTIES LABELS acl
  PASS_REGULAR_EXPRESSION "no Ascend runtime \\(libascendcl.so\\) could be loaded; tried: the default library path libascendcl.so \\([^\n]*\\); ASCEND_HOME_PATH, ASCEND_TOOLKIT_HOME and PINSTAGE_ACL_LIBRARY are unset")
add_test(NAME acl.cli.bench_qwen3_decode
         COMMAND ${_cli} bench qwen3-decode --backend acl --layers 1 --seq-len 64 --groups 2
                 --rounds 2 --quiet)
# acl runs no host callables: the scene is an integrity check (upload, read back, compare
# bytes) and says so clearly, never a silent skip; it passes over the double without a
# violation.
add_test(NAME acl.cli.scene_qwen3_decode
         COMMAND ${_cli} scene qwen3-decode --backend acl --layers 1 --seq-len 64 --rounds 1)
set_tests_properties(acl.cli.bench_qwen3_decode acl.cli.scene_qwen3_decode PROPERTIES
  LABELS acl ENVIRONMENT "${_acl_env}" FAIL_REGULAR_EXPRESSION "VIOLATION")
# PASS_REGULAR_EXPRESSION ignores the exit status, so a failing round ("FAILED", "FAIL")
# fails the test through the FAIL expressions.
set_tests_properties(acl.cli.scene_qwen3_decode PROPERTIES
  PASS_REGULAR_EXPRESSION "integrity check only: the acl backend runs no host callables"
  FAIL_REGULAR_EXPRESSION "VIOLATION;FAIL")
