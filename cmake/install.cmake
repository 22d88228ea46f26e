# Where `cmake --install` puts each part (docs/install.md), and pinstage_install(), which
# every installed target calls. Included before any target is made.
#
#   <prefix>/bin                       the CLI and the tools
#   <prefix>/<libdir>                  libpinstage, libpinstage_base, one library per scene
#   <prefix>/<libdir>/pinstage         the backend plugins (src/runtime/plugin.cpp looks there)
#   <prefix>/include/pinstage          the public headers, the plugin SDK, version.h
#   <prefix>/<libdir>/cmake/pinstage   pinstageConfig.cmake (find_package)
#   <prefix>/<libdir>/pkgconfig        pinstage.pc
#   <prefix>/share/pinstage/plot.py    what `pinstage plot` runs (apps/pinstage/cmd_report.cpp)
include(GNUInstallDirs)
set(PINSTAGE_INSTALL_PLUGINDIR ${CMAKE_INSTALL_LIBDIR}/pinstage)
set(PINSTAGE_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/pinstage)

# The folder `dir` (relative to the prefix) reaches the library folder through this
# RUNPATH: "$ORIGIN" relative, so the installed tree still works after it is moved.
function(pinstage_origin_rpath dir out)
  get_filename_component(from "${dir}" ABSOLUTE BASE_DIR "${CMAKE_INSTALL_PREFIX}")
  file(RELATIVE_PATH rel "${from}" "${CMAKE_INSTALL_FULL_LIBDIR}")
  string(REGEX REPLACE "/$" "" rel "${rel}")
  if(rel STREQUAL "")
    set(${out} "$ORIGIN" PARENT_SCOPE)
  else()
    set(${out} "$ORIGIN/${rel}" PARENT_SCOPE)
  endif()
endfunction()

# pinstage_install(<target> LIBRARY|PLUGIN|PROGRAM [EXPORT_NAME <name>]): installs the
# target where its kind goes with a relative RUNPATH to the library folder. LIBRARY
# targets join the pinstage:: export set (pinstageConfig.cmake) as pinstage::<name>.
# Directories outside the project that a target links from (the CUDA toolkit's) stay in
# its RUNPATH; build-tree directories never do.
function(pinstage_install target kind)
  cmake_parse_arguments(ARG "" "EXPORT_NAME" "" ${ARGN})
  if(kind STREQUAL "LIBRARY")
    set(dest ${CMAKE_INSTALL_LIBDIR})
  elseif(kind STREQUAL "PLUGIN")
    set(dest ${PINSTAGE_INSTALL_PLUGINDIR})
  elseif(kind STREQUAL "PROGRAM")
    set(dest ${CMAKE_INSTALL_BINDIR})
  else()
    message(FATAL_ERROR "pinstage_install(${target}): kind must be LIBRARY, PLUGIN or "
                        "PROGRAM, not '${kind}'")
  endif()
  pinstage_origin_rpath(${dest} rpath)
  if(PINSTAGE_PYTHON_PACKAGE)  # setup.py copies them all into the package folder
    set(rpath "$ORIGIN")
  endif()
  # __FILE__ (PINSTAGE_CHECK's message) relative to the source tree: installed files do
  # not name the folder they were built in. Tests keep absolute paths (they open them).
  target_compile_options(${target} PRIVATE -fmacro-prefix-map=${PROJECT_SOURCE_DIR}/=)
  set_target_properties(${target} PROPERTIES INSTALL_RPATH "${rpath}"
                                             INSTALL_RPATH_USE_LINK_PATH ON)
  if(kind STREQUAL "LIBRARY")
    if(ARG_EXPORT_NAME)
      set_target_properties(${target} PROPERTIES EXPORT_NAME ${ARG_EXPORT_NAME})
    endif()
    install(TARGETS ${target} EXPORT pinstageTargets
            LIBRARY DESTINATION ${dest}
            INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
  else()
    install(TARGETS ${target} LIBRARY DESTINATION ${dest} RUNTIME DESTINATION ${dest})
  endif()
endfunction()

# `pinstage plot` (and the bench's PNG) runs this script with python3; it needs only
# matplotlib, not the extension, so the C++ install carries it.
install(FILES ${PROJECT_SOURCE_DIR}/python/pinstage/plot.py
        DESTINATION ${CMAKE_INSTALL_DATADIR}/pinstage)
