# The CLI's shared conventions (--json FILE|-, --quiet, empty or bad output paths, size
# knobs, case-insensitive choices) on fixture, scene, info and plot, and bench load's
# file-reading arms (built in) on a truncated shard. Label cli.
pinstage_add_gtest(test_cli
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_cli.cpp
  LIBRARIES pinstage_cli_parts
  LABELS cli)
target_compile_definitions(test_cli PRIVATE PINSTAGE_CLI_PATH="$<TARGET_FILE:pinstage_cli>")
add_dependencies(test_cli pinstage_cli pinstage_backend_sim)

# The one atomic writer (include/pinstage/atomic_file.h) every output goes through.
pinstage_add_gtest(test_atomic_file
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_atomic_file.cpp
  LABELS cli)

# The flags from the field lists (apps/pinstage/cli_fields.h): each command's --help, the
# table in docs/cli.md, the values and the refusals. Label cli.
pinstage_add_gtest(test_cli_fields
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_cli_fields.cpp
  LIBRARIES pinstage_cli_parts
  LABELS cli)
target_compile_definitions(test_cli_fields PRIVATE PINSTAGE_CLI_PATH="$<TARGET_FILE:pinstage_cli>"
                                                   PINSTAGE_DOCS_CLI="${PROJECT_SOURCE_DIR}/docs/cli.md")
add_dependencies(test_cli_fields pinstage_cli pinstage_backend_sim)
