// The CLI's subcommands; each lives in its own cmd_*.cpp and registers itself here.
#pragma once

#include <CLI/CLI.hpp>

namespace pinstage::cli {

void add_info_command(CLI::App& app);     // pinstage info
void add_demo_command(CLI::App& app);     // pinstage demo
void add_fixture_command(CLI::App& app);  // pinstage fixture qwen3-decode
void add_bench_command(CLI::App& app);    // pinstage bench qwen3-decode
void add_scene_command(CLI::App& app);    // pinstage scene qwen3-decode

}  // namespace pinstage::cli
