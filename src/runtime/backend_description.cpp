// Note [Backend descriptions]: a backend says once what the layers above need to know of it
// and cannot ask its plugin without loading it: its name, the DLPack device type of its
// device memory and the torch device type over it. pinstage_add_backend (cmake/pinstage.cmake)
// writes that into libpinstage_backend_<name>.backend beside the plugin, and this file reads
// it back, strictly: Python's pinstage.backends(), its device= strings and DLPack exports,
// and the CLI's --backend choices come from here, never from a list of names. Not in the
// plugin table, so listing backends loads no vendor runtime (cuda's libcudart), and the ABI
// stays as it is. The fake a backend is tested against stays in CMake (tests/conformance).
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
#include "pinstage/settings.h"
#include "pinstage/worker.h"
#include "runtime/plugin.h"

namespace pinstage {
namespace {

constexpr uint64_t kMaxDescriptionBytes = 4096;
constexpr const char* kKeys = "name, dlpack_device_type, torch_device";
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
    if (key != "name" && key != "dlpack_device_type" && key != "torch_device")
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

const std::vector<BackendDescription>& described_backends() {
  static const std::vector<BackendDescription>& all = *new std::vector<BackendDescription>([] {
    std::vector<BackendDescription> found;
    for (const std::string& plugin : discover_backends())
      if (std::filesystem::exists(description_path(plugin)))
        found.push_back(describe_plugin(plugin));
    std::sort(found.begin(), found.end(),
              [](const auto& a, const auto& b) { return a.name < b.name; });
    return found;
  }());
  return all;
}

}  // namespace pinstage
