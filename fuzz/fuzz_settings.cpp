// Fuzzes the settings module: every PINSTAGE_* variable through check_settings() and its
// typed reader. A value is accepted with an in-range result or refused with
// Error(invalid_argument) naming the variable; anything else (another exception, a
// crash, a sanitizer report) is a finding. Input: one byte picks the variable, the rest
// is its value.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "pinstage/error.h"
#include "pinstage/settings.h"

namespace {

[[noreturn]] void finding(const char* what) {
  std::fprintf(stderr, "fuzz_settings: %s\n", what);
  std::abort();
}

void read_typed(pinstage::Setting id) {
  using pinstage::Setting;
  switch (id) {
    case Setting::num_threads: {
      const auto n = pinstage::setting_num_threads();
      if (n && (*n < 1 || *n > 4096)) finding("num_threads out of 1..4096");
      break;
    }
    case Setting::sim_device_capacity: {
      const auto bytes = pinstage::setting_sim_device_capacity();
      if (bytes && *bytes == 0) finding("a 0-byte capacity was accepted");
      break;
    }
    case Setting::sim_fault:
      for (const auto& f : pinstage::setting_sim_faults())
        if (f.nth == 0 || f.kind < 0) finding("a fault with nth 0 or no kind was accepted");
      break;
    default:
      break;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const auto table = pinstage::settings_table();
  const pinstage::SettingInfo& info = table[data[0] % table.size()];
  const std::string value(reinterpret_cast<const char*>(data + 1), size - 1);
  if (value.find('\0') != std::string::npos) return 0;  // the environment cannot hold one
  setenv(info.name, value.c_str(), 1);
  try {
    pinstage::check_settings();
    read_typed(info.id);  // accepted by the check: the typed reader must agree
  } catch (const pinstage::Error& e) {
    if (e.code() != pinstage::ErrorCode::invalid_argument)
      finding("an error other than invalid_argument");
    if (std::string(e.what()).find(info.name) == std::string::npos)
      finding("the error does not name the variable");
  }
  unsetenv(info.name);
  return 0;
}
