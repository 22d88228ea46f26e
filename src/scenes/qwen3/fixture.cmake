# Fixture sources (explicit list).
target_sources(pinstage PRIVATE ${CMAKE_CURRENT_LIST_DIR}/fixture.cpp)
