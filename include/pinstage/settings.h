// Every PINSTAGE_* environment variable, read in one place with one strict parser.
// A bad value is Error(invalid_argument) naming the variable, never a silent default.
// See docs/settings.md for the table.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "pinstage/export.h"

namespace pinstage {

// The variables pinstage reads. Adding one is one entry here and one row in kSettings
// (settings.cpp).
enum class Setting {
  log,                  // PINSTAGE_LOG: debug|info|warn|error|off
  num_threads,          // PINSTAGE_NUM_THREADS: threads for parallel loops, 1..4096
  sim_device_capacity,  // PINSTAGE_SIM_DEVICE_CAPACITY: sim device bytes ("8G", "512M"), >= 256
  sim_fault,            // PINSTAGE_SIM_FAULT: "kind:nth,..." faults for the sim backend
  gen_isa,              // PINSTAGE_GEN_ISA: generic|avx2|avx512|avx512bf16
  golden_isa,           // PINSTAGE_GOLDEN_ISA: generic|avx2|avx512
  acl_library,          // PINSTAGE_ACL_LIBRARY: path of the Ascend runtime (acl backend)
  pin_policy,           // PINSTAGE_PIN_POLICY: strict|fallback (a pin over budget)
  host_cache_max,       // PINSTAGE_HOST_CACHE_MAX: bytes the pinned pool may keep cached
  host_huge_pages,      // PINSTAGE_HOST_HUGE_PAGES: auto|thp|off, the one huge-page switch
  host_huge_stall_ms,   // PINSTAGE_HOST_HUGE_STALL_MS: a costlier 2 MiB fault gives huge pages up
  resident_check,       // PINSTAGE_RESIDENT_CHECK: off|on, ResidentBinder's write check
  cache_dir,            // PINSTAGE_CACHE_DIR: the restart cache's directory (docs/cache.md)
  test_backends,        // PINSTAGE_TEST_BACKENDS: off|on, list the tests' backends (twin)
};

// One row of the table: the variable's name, what it takes and what it does.
struct SettingInfo {
  Setting id;
  const char* name;     // "PINSTAGE_LOG"
  const char* accepts;  // "debug|info|warn|error|off"
  const char* meaning;
};

// Every setting, in declaration order.
PINSTAGE_API std::span<const SettingInfo> settings_table();
PINSTAGE_API const SettingInfo& setting_info(Setting id);

// The raw value of a variable, or nullopt when it is unset. An empty value is an error
// (Error(invalid_argument)): `PINSTAGE_X=` is almost always a scripting mistake.
PINSTAGE_API std::optional<std::string> setting_text(Setting id);

// Typed readers; each reads the environment now and parses strictly.
PINSTAGE_API std::optional<int> setting_num_threads();
PINSTAGE_API std::optional<uint64_t> setting_sim_device_capacity();
// PINSTAGE_HOST_CACHE_MAX: a byte count, or 0 (cache nothing).
PINSTAGE_API std::optional<uint64_t> setting_host_cache_max();
// PINSTAGE_HOST_HUGE_STALL_MS: milliseconds, 0..60000 (0: any huge fault counts as a stall).
PINSTAGE_API std::optional<int> setting_host_huge_stall_ms();
// PINSTAGE_CACHE_DIR: an absolute path (Error(invalid_argument) for a relative one).
PINSTAGE_API std::optional<std::string> setting_cache_dir();
// PINSTAGE_SIM_FAULT as (ps_fault_kind, nth) pairs; empty when unset.
struct FaultSetting {
  int kind = 0;  // a ps_fault_kind
  uint64_t nth = 0;
};
PINSTAGE_API std::vector<FaultSetting> setting_sim_faults();
// One of `choices` (a '|' separated list, e.g. "generic|avx2"), or nullopt when unset.
PINSTAGE_API std::optional<std::string> setting_choice(Setting id);

// Parses every variable that is set; throws for the first bad one. Worker::init, the
// CLI and the Python module call it so that a typo is reported before any work.
PINSTAGE_API void check_settings();

// The strict number parsers every setting (and the CLI) shares. `what` names the value in
// the error ("PINSTAGE_NUM_THREADS", "--bytes").
// A byte count: digits with an optional K/M/G/T (KiB, MiB, GiB, TiB) suffix; > 0.
PINSTAGE_API uint64_t parse_byte_count(std::string_view text, std::string_view what);
// A whole decimal number in [min, max]: digits with an optional '-' (no '+', space, hex or
// octal; "010" is ten). Every error names `what`, the text and the range.
PINSTAGE_API int64_t parse_integer(std::string_view text, int64_t min, int64_t max,
                                   std::string_view what);

}  // namespace pinstage
