// The CLI's subcommands; each lives in its own cmd_*.cpp and registers itself here. The
// scene commands (fixture, bench, scene) add one subcommand per registered scene.
#pragma once

#include <CLI/CLI.hpp>

#include "pinstage/scene.h"

namespace pinstage::cli {

void add_info_command(CLI::App& app);     // pinstage info
void add_demo_command(CLI::App& app);     // pinstage demo
void add_fixture_command(CLI::App& app);  // pinstage fixture <scene>
void add_bench_command(CLI::App& app);    // pinstage bench <scene> | synthetic
void add_scene_command(CLI::App& app);    // pinstage scene <scene>

// Which default a scene's size knob gets on a command.
enum class SizeDefault { param, scene, automatic };

// One option per scene parameter (--seq-len for seq_len), bound to values[name], which
// gets the parameter's default first.
inline void add_scene_options(CLI::App& cmd, const Scene& scene, SceneValues& values,
                              SizeDefault size_default) {
  for (const SceneParam& p : scene.params()) {
    int64_t& value = values[p.name];
    value = p.default_value;
    std::string help = p.help;
    if (p.size && size_default == SizeDefault::scene && p.scene_default > 0)
      value = p.scene_default;
    if (p.size && size_default == SizeDefault::automatic) {
      value = 0;
      help += "; default: the largest that fits in half of MemAvailable";
    }
    CLI::Option* option = cmd.add_option(param_flag(p.name), value, help);
    if (!(p.size && size_default == SizeDefault::automatic)) option->capture_default_str();
  }
}

}  // namespace pinstage::cli
