// The CLI's subcommands; each lives in its own cmd_*.cpp and registers itself here. The
// scene commands (fixture, bench, scene) add one subcommand per registered scene.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <string>

#include "cli_common.h"
#include "pinstage/scene.h"

namespace pinstage::cli {

void add_info_command(CLI::App& app);             // pinstage info
void add_demo_command(CLI::App& app);             // pinstage demo
void add_fixture_command(CLI::App& app);          // pinstage fixture <scene>
void add_bench_command(CLI::App& app);            // pinstage bench <scene> | synthetic
void add_scene_command(CLI::App& app);            // pinstage scene <scene>
void add_report_commands(CLI::App& app);          // pinstage plot
void add_bench_compare_command(CLI::App& bench);  // pinstage bench compare A.json B.json
void add_load_command(CLI::App& app);             // pinstage load PATH
void add_hash_command(CLI::App& app);             // pinstage hash PATH
void add_bench_load_command(CLI::App& bench);     // pinstage bench load PATH
void add_cache_command(CLI::App& app);            // pinstage cache [put|ls|rm|prune]

// The PNG path next to a JSON report (x.json -> x.png).
std::string plot_path_for(const std::string& json_path);
// Draws `json_path` into `png_path` with the Python module pinstage.plot; false with the
// reason in `why` (no python3, no matplotlib, ...).
bool plot_report(const std::string& json_path, const std::string& png_path, std::string& why);

// Which default a scene's size knob gets on a command.
enum class SizeDefault { param, scene, automatic };

// A size knob given as 0 or less is an error, never "automatic": the automatic size is
// what omitting the option means.
inline CLI::Validator positive_size(const std::string& flag, SizeDefault size_default) {
  const std::string hint =
      size_default == SizeDefault::automatic ? " (omit the option for the automatic size)" : "";
  return CLI::Validator(
      [flag, hint](const std::string& text) {
        char* end = nullptr;
        const long long v = std::strtoll(text.c_str(), &end, 10);
        if (end != text.c_str() && *end == '\0' && v < 1)
          return flag + " " + text + " is not a size: it must be at least 1" + hint;
        return std::string();
      },
      "", "positive size");
}

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
    // Scene parameters are int64: a seed of 2^64 is an error, never saturated; the scene
    // checks its own ranges (validate).
    CLI::Option* option = add_integer_option(cmd, param_flag(p.name), value, help,
                                             std::numeric_limits<int64_t>::min(),
                                             std::numeric_limits<int64_t>::max());
    if (!(p.size && size_default == SizeDefault::automatic)) option->capture_default_str();
    if (p.size) option->check(positive_size(param_flag(p.name), size_default));
  }
}

}  // namespace pinstage::cli
