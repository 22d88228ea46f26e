// Note [Backend descriptions]: a backend says once what the layers above need to know of it
// and cannot ask its plugin without loading it: its name, the DLPack device type of its
// device memory and the torch device type over it. pinstage_add_backend (cmake/pinstage.cmake)
// writes that into libpinstage_backend_<name>.backend beside the plugin, and this file reads
// it back, strictly: Python's pinstage.backends(), its device= strings and DLPack exports,
// and the CLI's --backend choices come from here, never from a list of names. Not in the
// plugin table, so listing backends loads no vendor runtime (cuda's libcudart), and the ABI
// stays as it is. The fake a backend is tested against stays in CMake (tests/conformance).
// A test-only backend (TEST_ONLY: test_only=1) is read like any other but listed to a user
// only under PINSTAGE_TEST_BACKENDS=on (listed_backends). A malformed description is a
// warning that leaves its backend out, and its error only when that backend is asked for:
// one bad file in the plugin folder must not make every command fail at start-up.
#include <algorithm>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include "pinstage/error.h"
#include "pinstage/files.h"
#include "pinstage/log.h"
#include "pinstage/settings.h"
#include "pinstage/worker.h"
#include "runtime/plugin.h"

namespace pinstage {
namespace {

constexpr uint64_t kMaxDescriptionBytes = 4096;
constexpr const char* kKeys = "name, dlpack_device_type, torch_device, test_only";
constexpr std::string_view kPluginPrefix = "libpinstage_backend_";

[[noreturn]] void malformed(const std::string& file, size_t line, const std::string& why) {
  throw Error(ErrorCode::io, "backend description " + file +
                                 (line != 0 ? ":" + std::to_string(line) : std::string()) + ": " +
                                 why +
                                 "; pinstage_add_backend (cmake/pinstage.cmake) writes it: "
                                 "rebuild the backend, or correct the file");
}

// A backend name or torch device type: [a-z][a-z0-9_]*.
bool is_identifier(const std::string& text) {
  if (text.empty() || text[0] < 'a' || text[0] > 'z') return false;
  for (const char c : text)
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_')) return false;
  return true;
}

// Every KEY=VALUE line of `text` (blank lines and # comments skipped): a known key, once.
std::map<std::string, std::string> description_lines(const std::string& file,
                                                     const std::string& text) {
  std::map<std::string, std::string> values;
  std::istringstream in(text);
  size_t number = 0;
  for (std::string line; std::getline(in, line);) {
    ++number;
    if (line.empty() || line[0] == '#') continue;
    const size_t eq = line.find('=');
    if (eq == std::string::npos)
      malformed(file, number, "'" + line + "' is not KEY=VALUE (keys: " + kKeys + ")");
    const std::string key = line.substr(0, eq);
    if (key != "name" && key != "dlpack_device_type" && key != "torch_device" && key != "test_only")
      malformed(file, number, "unknown key '" + key + "' (keys: " + kKeys + ")");
    if (!values.emplace(key, line.substr(eq + 1)).second)
      malformed(file, number, "key '" + key + "' is given twice");
  }
  for (const char* key : {"name", "dlpack_device_type", "torch_device"})
    if (values.count(key) == 0) malformed(file, 0, std::string("it has no ") + key + " line");
  return values;
}

BackendDescription parse_description(const std::string& file, const std::string& text,
                                     const std::string& plugin_path) {
  std::map<std::string, std::string> values = description_lines(file, text);
  BackendDescription d;
  d.name = values["name"];
  d.torch_device = values["torch_device"];
  d.plugin_path = plugin_path;
  if (!is_identifier(d.name))
    malformed(file, 0, "name '" + d.name + "' is not a backend name ([a-z][a-z0-9_]*)");
  // A plugin named as the runtime looks for it must be described under that name.
  const std::string stem = std::filesystem::path(plugin_path).stem().string();
  if (stem.starts_with(kPluginPrefix) && stem.substr(kPluginPrefix.size()) != d.name)
    malformed(file, 0,
              "it names backend '" + d.name + "', but its plugin is " + stem + ".so (backend '" +
                  stem.substr(kPluginPrefix.size()) + "')");
  if (!d.torch_device.empty() && !is_identifier(d.torch_device))
    malformed(file, 0,
              "torch_device '" + d.torch_device +
                  "' is not a torch device type (cpu, cuda; "
                  "empty when torch cannot import the memory)");
  // Optional (0 when absent: descriptions written before it existed are a user's backends).
  const std::string test_only = values.count("test_only") != 0 ? values["test_only"] : "0";
  if (test_only != "0" && test_only != "1")
    malformed(file, 0, "test_only '" + test_only + "' is neither 0 nor 1");
  d.test_only = test_only == "1";
  try {
    d.dlpack_device_type =
        static_cast<int>(parse_integer(values["dlpack_device_type"], 1, 255, "dlpack_device_type"));
  } catch (const Error& e) {
    malformed(file, 0, std::string(e.what()) + " (DLPack's DLDeviceType: 1 kDLCPU, 2 kDLCUDA)");
  }
  return d;
}

// "<dir>/libpinstage_backend_cuda.so" -> "<dir>/libpinstage_backend_cuda.backend".
std::string description_path(const std::string& plugin_path) {
  return std::filesystem::path(plugin_path).replace_extension(".backend").string();
}

BackendDescription read_description(const std::string& plugin_path) {
  const std::string file = description_path(plugin_path);
  std::error_code ec;
  if (!std::filesystem::exists(file, ec))
    throw Error(ErrorCode::not_found,
                "the plugin " + plugin_path + " has no backend description (" + file +
                    "): build it with pinstage_add_backend (cmake/pinstage.cmake), which "
                    "writes one");
  std::string text;
  std::string why;
  if (!read_regular_file(file, kMaxDescriptionBytes, &text, &why))
    throw Error(ErrorCode::io, "cannot read backend description " + file + ": " + why);
  return parse_description(file, text, plugin_path);
}

}  // namespace

const BackendDescription& describe_plugin(const std::string& plugin_path) {
  // Never destroyed, like the plugins they describe; a failed read is not kept.
  static std::mutex& mu = *new std::mutex;
  static auto& read = *new std::map<std::string, std::unique_ptr<BackendDescription>>;
  const std::string key = std::filesystem::weakly_canonical(plugin_path).string();
  std::lock_guard lock(mu);
  auto it = read.find(key);
  if (it == read.end())
    it = read.emplace(key, std::make_unique<BackendDescription>(read_description(plugin_path)))
             .first;
  return *it->second;
}

namespace {

// The plugin folder's descriptions, read once: those read, sorted by name, and the error of
// each that was not, by the backend name its plugin's file name gives.
struct Described {
  std::vector<BackendDescription> read;
  std::map<std::string, std::string> unreadable;
};

const Described& described() {
  static const Described& all = *new Described([] {
    Described found;
    for (const std::string& plugin : discover_backends()) {
      if (!std::filesystem::exists(description_path(plugin))) continue;
      try {
        found.read.push_back(describe_plugin(plugin));
      } catch (const Error& e) {
        // One bad file must not stop every command: only a use of that backend fails.
        log(LogLevel::warn, std::string("skipping a backend: ") + e.what());
        std::string name = std::filesystem::path(plugin).stem().string();
        if (name.starts_with(kPluginPrefix)) name.erase(0, kPluginPrefix.size());
        found.unreadable.emplace(name, e.what());
      }
    }
    std::sort(found.read.begin(), found.read.end(),
              [](const auto& a, const auto& b) { return a.name < b.name; });
    return found;
  }());
  return all;
}

}  // namespace

const std::vector<BackendDescription>& described_backends() { return described().read; }

std::vector<BackendDescription> listed_backends() {
  const bool tests = setting_choice(Setting::test_backends) == "on";
  std::vector<BackendDescription> listed;
  for (const BackendDescription& b : described().read)
    if (tests || !b.test_only) listed.push_back(b);
  return listed;
}

std::string backend_choice_error(const std::string& name) {
  std::string names;
  for (const BackendDescription& b : listed_backends()) {
    if (b.name == name) return "";
    names += (names.empty() ? "" : ", ") + b.name;
  }
  const auto bad = described().unreadable.find(name);
  if (bad != described().unreadable.end()) return bad->second;
  return "unknown backend '" + name + "' (one of: " + names + ")";
}

}  // namespace pinstage
