#include "backends/cuda/cuda_config.h"

#include <charconv>
#include <limits>
#include <set>

namespace pinstage::cuda {

namespace {

constexpr const char* kKnownKeys =
    "pinned_mode, register_threshold_mb, prefault_threads, register_thp";

std::string_view trim(std::string_view s) {
  const auto first = s.find_first_not_of(" \t\r\n");
  if (first == std::string_view::npos) return {};
  const auto last = s.find_last_not_of(" \t\r\n");
  return s.substr(first, last - first + 1);
}

bool parse_uint(std::string_view value, uint64_t max, uint64_t& out) {
  if (value.empty()) return false;
  uint64_t v = 0;
  const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
  if (ec != std::errc() || end != value.data() + value.size() || v > max) return false;
  out = v;
  return true;
}

}  // namespace

const char* pinned_mode_name(PinnedMode mode) {
  switch (mode) {
    case PinnedMode::auto_select:
      return "auto";
    case PinnedMode::alloc:
      return "alloc";
    case PinnedMode::reg:
      return "register";
  }
  return "unknown";
}

bool parse_config(std::string_view text, CudaConfig& out, std::string& error) {
  CudaConfig config;  // defaults; copied to `out` only when everything parsed
  std::set<std::string, std::less<>> seen;
  size_t pos = 0;
  while (pos <= text.size()) {
    const size_t semi = std::min(text.find(';', pos), text.size());
    const std::string_view item = trim(text.substr(pos, semi - pos));
    pos = semi + 1;
    if (item.empty()) continue;
    const size_t eq = item.find('=');
    if (eq == std::string_view::npos) {
      error = "cuda config item '" + std::string(item) + "' is not key=value (keys: " + kKnownKeys +
              ")";
      return false;
    }
    const std::string key(trim(item.substr(0, eq)));
    const std::string_view value = trim(item.substr(eq + 1));
    if (!seen.insert(key).second) {
      error = "cuda config key '" + key + "' is given twice";
      return false;
    }
    auto bad_value = [&](const char* expected) {
      error =
          "cuda config " + key + "='" + std::string(value) + "' is not valid: expected " + expected;
      return false;
    };
    if (key == "pinned_mode") {
      if (value == "auto")
        config.pinned_mode = PinnedMode::auto_select;
      else if (value == "alloc")
        config.pinned_mode = PinnedMode::alloc;
      else if (value == "register")
        config.pinned_mode = PinnedMode::reg;
      else
        return bad_value("auto, alloc or register");
    } else if (key == "register_threshold_mb") {
      uint64_t mb = 0;
      // Bounded so the byte count cannot overflow.
      if (!parse_uint(value, std::numeric_limits<uint64_t>::max() >> 20, mb))
        return bad_value("a whole number of MiB (0 = register everything in auto mode)");
      config.register_threshold_bytes = mb << 20;
    } else if (key == "prefault_threads") {
      uint64_t n = 0;
      if (!parse_uint(value, 1024, n)) return bad_value("0 (one per core) to 1024");
      config.prefault_threads = static_cast<int>(n);
    } else if (key == "register_thp") {
      if (value == "1" || value == "true" || value == "on")
        config.register_thp = true;
      else if (value == "0" || value == "false" || value == "off")
        config.register_thp = false;
      else
        return bad_value("0 or 1");
    } else {
      error = "unknown cuda config key '" + key + "' (keys: " + kKnownKeys + ")";
      return false;
    }
  }
  out = config;
  return true;
}

PinnedMode choose_pinned_mode(const CudaConfig& config, size_t bytes) {
  if (config.pinned_mode != PinnedMode::auto_select) return config.pinned_mode;
  return bytes >= config.register_threshold_bytes ? PinnedMode::reg : PinnedMode::alloc;
}

}  // namespace pinstage::cuda
