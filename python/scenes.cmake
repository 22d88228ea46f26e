# pinstage_add_python_scene(NAME SOURCES ...): a scene's Python part, compiled into the
# _pinstage extension (python/CMakeLists.txt) where the Python module is built. Its sources
# include only pinstage/python/binding.h of the module (docs/python.md, "A scene's Python
# part") and register their submodule with a static PythonSceneRegistrar. Called from the
# scene's CMakeLists.txt, before python/ is configured.
include_guard(GLOBAL)
function(pinstage_add_python_scene name)
  cmake_parse_arguments(ARG "" "" "SOURCES" ${ARGN})
  if(NOT ARG_SOURCES)
    message(FATAL_ERROR "pinstage_add_python_scene(${name}): no SOURCES")
  endif()
  foreach(source ${ARG_SOURCES})
    get_filename_component(path ${source} ABSOLUTE BASE_DIR ${CMAKE_CURRENT_SOURCE_DIR})
    set_property(GLOBAL APPEND PROPERTY PINSTAGE_PYTHON_SCENE_SOURCES ${path})
  endforeach()
endfunction()
