# Golden sources (explicit list).
target_sources(pinstage PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/golden.cpp
  ${CMAKE_CURRENT_LIST_DIR}/golden_compare.cpp
  ${CMAKE_CURRENT_LIST_DIR}/golden_io.cpp
  ${CMAKE_CURRENT_LIST_DIR}/golden_kernels.cpp)
