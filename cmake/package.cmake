# The installed package: the public headers, pinstageConfig.cmake with its version file,
# and pinstage.pc. Included after every target exists; the targets install themselves
# through pinstage_install() (cmake/install.cmake). See docs/install.md.
include(CMakePackageConfigHelpers)

# The user API, the plugin SDK (pinstage/backend/) and the generated version.h. A
# scene's headers are installed by pinstage_add_scene (scenes/CMakeLists.txt).
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/pinstage
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} FILES_MATCHING PATTERN "*.h")
install(FILES ${PINSTAGE_GENERATED_INCLUDE}/pinstage/version.h
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/pinstage)

install(EXPORT pinstageTargets NAMESPACE pinstage:: FILE pinstageTargets.cmake
        DESTINATION ${PINSTAGE_INSTALL_CMAKEDIR})
configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/pinstageConfig.cmake.in
  ${PROJECT_BINARY_DIR}/pinstageConfig.cmake
  INSTALL_DESTINATION ${PINSTAGE_INSTALL_CMAKEDIR}
  PATH_VARS PINSTAGE_INSTALL_PLUGINDIR)
# 0.x: a new minor version may break the API, so only the same minor version matches.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/pinstageConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/pinstageConfig.cmake
              ${PROJECT_BINARY_DIR}/pinstageConfigVersion.cmake
        DESTINATION ${PINSTAGE_INSTALL_CMAKEDIR})

# pkg-config: paths relative to the .pc file's own folder, so a moved prefix still works.
file(RELATIVE_PATH PINSTAGE_PC_TO_PREFIX ${CMAKE_INSTALL_FULL_LIBDIR}/pkgconfig
     ${CMAKE_INSTALL_PREFIX})
string(REGEX REPLACE "/$" "" PINSTAGE_PC_TO_PREFIX "${PINSTAGE_PC_TO_PREFIX}")
configure_file(${CMAKE_CURRENT_LIST_DIR}/pinstage.pc.in ${PROJECT_BINARY_DIR}/pinstage.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/pinstage.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)

# pinstage::scenes: links every installed scene library (each registers itself on load).
set_target_properties(pinstage_scenes PROPERTIES EXPORT_NAME scenes)
install(TARGETS pinstage_scenes EXPORT pinstageTargets)

install(FILES ${PROJECT_SOURCE_DIR}/LICENSE ${PROJECT_SOURCE_DIR}/CHANGELOG.md
              ${PROJECT_SOURCE_DIR}/README.md DESTINATION ${CMAKE_INSTALL_DOCDIR})
