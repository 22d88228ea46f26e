# pinstage_add_backend(NAME SOURCES ... [LIBRARIES ...] DLPACK_DEVICE <kDLxxx>
#   TORCH_DEVICE <type|NONE> [FAKE <target> [FAKE_ENVIRONMENT KEY=VALUE ...]] [TEST_ONLY]):
# one backend plugin, built as a MODULE named libpinstage_backend_<NAME>.so next to
# libpinstage, and the one place the backend describes itself. It links base only (no
# tensor, bind, bench or scene code: tests/conformance checks the symbols) and exports only
# its entry.
#  DLPACK_DEVICE: DLPack's device type of its device memory (kDLCPU for sim's host RAM).
#  TORCH_DEVICE: the torch.device type a tensor over that memory has ("cuda"), NONE when
#    torch cannot import it (acl's kDLExtDev).
#  FAKE, FAKE_ENVIRONMENT: the target the conformance suite runs it against without
#    hardware, and the environment that puts it in place (none: the backend needs none).
#  TEST_ONLY: a backend of the tests (tests/backends): built and described (test_only=1),
#    not installed, and listed only under PINSTAGE_TEST_BACKENDS=on.
# The description goes into libpinstage_backend_<NAME>.backend beside the plugin, which
# the runtime reads (described_backends(): Python's pinstage.backends(), the CLI's --backend
# choices); the conformance suite is instantiated from the global property
# PINSTAGE_BACKENDS (tests/conformance). docs/design/plugin-abi.md, "Describing a backend".
set(PINSTAGE_DLPACK_DEVICE_TYPES  # DLPack's DLDeviceType values (dlpack.h)
    kDLCPU=1 kDLCUDA=2 kDLCUDAHost=3 kDLOpenCL=4 kDLVulkan=7 kDLMetal=8 kDLVPI=9 kDLROCM=10
    kDLROCMHost=11 kDLExtDev=12 kDLCUDAManaged=13 kDLOneAPI=14 kDLWebGPU=15 kDLHexagon=16)
function(pinstage_add_backend name)
  cmake_parse_arguments(ARG "TEST_ONLY" "DLPACK_DEVICE;TORCH_DEVICE;FAKE"
                        "SOURCES;LIBRARIES;FAKE_ENVIRONMENT" ${ARGN})
  if(NOT name MATCHES "^[a-z][a-z0-9_]*$")
    message(FATAL_ERROR "pinstage_add_backend(${name}): a backend name is lower-case letters, "
                        "digits and '_', starting with a letter")
  endif()
  set(code "")
  foreach(pair ${PINSTAGE_DLPACK_DEVICE_TYPES})
    string(REPLACE "=" ";" pair "${pair}")
    list(GET pair 0 known)
    if(known STREQUAL "${ARG_DLPACK_DEVICE}")
      list(GET pair 1 code)
    endif()
  endforeach()
  if(code STREQUAL "")
    message(FATAL_ERROR "pinstage_add_backend(${name}): DLPACK_DEVICE '${ARG_DLPACK_DEVICE}' is "
                        "not a DLPack device type: give one of ${PINSTAGE_DLPACK_DEVICE_TYPES}")
  endif()
  if(NOT ARG_TORCH_DEVICE MATCHES "^([a-z][a-z0-9_]*|NONE)$")
    message(FATAL_ERROR "pinstage_add_backend(${name}): TORCH_DEVICE '${ARG_TORCH_DEVICE}' is "
                        "not a torch device type: give one (cpu, cuda) or NONE")
  endif()
  if(ARG_TORCH_DEVICE STREQUAL "NONE")
    set(ARG_TORCH_DEVICE "")
  endif()
  set(target pinstage_backend_${name})
  add_library(${target} MODULE ${ARG_SOURCES})
  target_link_libraries(${target} PRIVATE pinstage_base ${ARG_LIBRARIES})
  target_include_directories(${target} PRIVATE ${PROJECT_SOURCE_DIR}/src)
  set_target_properties(${target} PROPERTIES PREFIX "lib" BUILD_RPATH "$ORIGIN"
    PINSTAGE_FAKE "${ARG_FAKE}" PINSTAGE_FAKE_ENVIRONMENT "${ARG_FAKE_ENVIRONMENT}")
  # Written at generate time beside the plugin, so it never lags behind this call.
  set(description "$<TARGET_FILE_DIR:${target}>/libpinstage_backend_${name}.backend")
  set(test_only 0)
  if(ARG_TEST_ONLY)
    set(test_only 1)
  endif()
  string(CONCAT text "# ${name}: written by pinstage_add_backend (cmake/pinstage.cmake)\n"
         "name=${name}\ndlpack_device_type=${code}\ntorch_device=${ARG_TORCH_DEVICE}\n"
         "test_only=${test_only}\n")
  file(GENERATE OUTPUT "${description}" CONTENT "${text}")
  set_property(GLOBAL APPEND PROPERTY PINSTAGE_BACKENDS ${name})
  if(NOT ARG_TEST_ONLY)
    pinstage_install(${target} PLUGIN)  # into <libdir>/pinstage (cmake/install.cmake)
    install(FILES "${description}" DESTINATION ${PINSTAGE_INSTALL_PLUGINDIR})
  endif()
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
