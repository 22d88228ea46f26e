// Note [One settings module]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~
// Every PINSTAGE_* variable is a row of kSettings and is read only through the functions
// below, with one strict parser for numbers. A bad value throws Error(invalid_argument)
// naming the variable and what it accepts; nothing falls back to a default silently.
#include "pinstage/settings.h"

#include <algorithm>
#include <cstdlib>
#include <iterator>
#include <limits>

#include "pinstage/backend/platform_abi.h"
#include "pinstage/error.h"

namespace pinstage {
namespace {

// " device_malloc device_free ...": the kinds from the one list, never written by hand.
#define PS_FAULT_WORD_(E, n) " " #n
#define PS_FAULT_KIND_WORDS PS_FAULT_KIND_LIST(PS_FAULT_WORD_)

constexpr SettingInfo kSettings[] = {
    {Setting::log, "PINSTAGE_LOG", "debug|info|warn|error|off",
     "log threshold on stderr (default warn)"},
    {Setting::num_threads, "PINSTAGE_NUM_THREADS", "1..4096",
     "threads for parallel loops (default: all online cores)"},
    {Setting::sim_device_capacity, "PINSTAGE_SIM_DEVICE_CAPACITY",
     "a byte count of at least 256: 8G, 512M, 4096",
     "sim device memory, per device (default: 80% of physical memory split across the "
     "devices= of sim's config)"},
    {Setting::sim_fault, "PINSTAGE_SIM_FAULT", "kind:nth[,kind:nth...]",
     "fail the nth sim call of a kind (tests); kinds:" PS_FAULT_KIND_WORDS},
    {Setting::gen_isa, "PINSTAGE_GEN_ISA", "generic|avx2|avx512|avx512bf16",
     "ask the generator for a slower kernel set (default: the best this CPU has)"},
    {Setting::golden_isa, "PINSTAGE_GOLDEN_ISA", "generic|avx2|avx512",
     "ask the golden for a kernel set (default: the best this CPU has)"},
    {Setting::acl_library, "PINSTAGE_ACL_LIBRARY", "a path to libascendcl.so",
     "the Ascend runtime the acl backend loads; when set, the only one tried (docs/acl.md)"},
    {Setting::pin_policy, "PINSTAGE_PIN_POLICY", "strict|fallback",
     "a pinned request over the pin budget (RLIMIT_MEMLOCK, cgroup memory.max, available "
     "memory) fails (strict, the default) or gets pageable memory with a warning (fallback)"},
    {Setting::resident_check, "PINSTAGE_RESIDENT_CHECK", "off|on",
     "a ResidentBinder compares an xxh3-64 digest of every IN tensor that stays on the device "
     "each step with the one taken at its upload, catching a host write not declared with "
     "mark_changed (on: a debug mode, a pass over the inputs per step; default off)"},
    {Setting::host_cache_max, "PINSTAGE_HOST_CACHE_MAX", "a byte count: 4G, 512M, or 0",
     "most freed pinned bytes a worker keeps cached for reuse; 0 keeps none (default: an "
     "eighth of physical memory)"},
    {Setting::host_huge_pages, "PINSTAGE_HOST_HUGE_PAGES", "auto|thp|off",
     "the one huge-page switch for pinned host memory on every backend: auto (the default) "
     "takes transparent huge pages where the kernel offers them and enough free 2 MiB blocks "
     "exist, thp asks for them whenever the kernel allows, off keeps base pages; a 2 MiB fault "
     "that stalls gives them up for the rest of the segment (docs/worker.md, \"Placement\")"},
    {Setting::host_huge_stall_ms, "PINSTAGE_HOST_HUGE_STALL_MS", "0..60000",
     "CPU milliseconds a 2 MiB huge-page fault may cost (memory compaction) before the "
     "segment's remaining pages fall back to base pages (default 2; 0: the first one gives up)"},
    {Setting::cache_dir, "PINSTAGE_CACHE_DIR", "an absolute path",
     "the restart cache's directory, on hugetlbfs or tmpfs, owned by the user with mode 0700 "
     "(default /dev/shm/pinstage-<uid>, created when missing; docs/cache.md)"},
    {Setting::test_backends, "PINSTAGE_TEST_BACKENDS", "off|on",
     "on: the backends of the tests (pinstage_add_backend's TEST_ONLY, e.g. twin) are listed "
     "too, by pinstage info, the CLI's --backend choices and pinstage.backends() (default off: "
     "a build tree lists what a user has)"},
};

[[noreturn]] void bad(std::string_view what, std::string_view text, const std::string& why) {
  throw Error(ErrorCode::invalid_argument,
              std::string(what) + "='" + std::string(text.substr(0, 64)) +
                  (text.size() > 64 ? "...'" : "'") + " is not valid: " + why);
}

// Digits only, no sign or space: strtoull would take "-1" as 2^64 - 1. `not_number` and
// `too_large` are the reasons given for those failures.
uint64_t parse_digits(std::string_view digits, std::string_view what, std::string_view text,
                      const std::string& not_number, const std::string& too_large) {
  if (digits.empty()) bad(what, text, not_number);
  uint64_t value = 0;
  for (char c : digits) {
    if (c < '0' || c > '9') bad(what, text, not_number);
    const uint64_t d = static_cast<uint64_t>(c - '0');
    if (value > (std::numeric_limits<uint64_t>::max() - d) / 10) bad(what, text, too_large);
    value = value * 10 + d;
  }
  return value;
}

// The smallest sim device: one of its 256-byte blocks (sim::DevicePool::kAlignment); a
// smaller capacity would round down to a device of 0 bytes.
constexpr uint64_t kMinSimDeviceCapacity = 256;

}  // namespace

std::span<const SettingInfo> settings_table() { return kSettings; }

const SettingInfo& setting_info(Setting id) {
  for (const auto& s : kSettings)
    if (s.id == id) return s;
  throw Error(ErrorCode::internal, "setting without a row in kSettings");
}

uint64_t parse_byte_count(std::string_view text, std::string_view what) {
  size_t end = 0;
  while (end < text.size() && text[end] >= '0' && text[end] <= '9') ++end;
  const std::string_view suffix = text.substr(end);
  struct Unit {
    std::string_view a, b;
    int shift;
  };
  static constexpr Unit kUnits[] = {
      {"", "", 0}, {"K", "KiB", 10}, {"M", "MiB", 20}, {"G", "GiB", 30}, {"T", "TiB", 40}};
  for (const auto& u : kUnits) {
    if (suffix != u.a && suffix != u.b) continue;
    const uint64_t value =
        parse_digits(text.substr(0, end), what, text, "expected a whole number", "too large");
    if (value == 0) bad(what, text, "must be more than 0 bytes (e.g. 8G, 512M, 4096)");
    if (value > (std::numeric_limits<uint64_t>::max() >> u.shift)) bad(what, text, "too large");
    return value << u.shift;
  }
  bad(what, text, "expected a byte count such as 8G, 512M, 64K or 4096");
}

int64_t parse_integer(std::string_view text, int64_t min, int64_t max, std::string_view what) {
  // Every failure names the range, so that an option's error says what it takes.
  const std::string range = "[" + std::to_string(min) + ", " + std::to_string(max) + "]";
  const bool negative = !text.empty() && text[0] == '-';
  const uint64_t magnitude =
      parse_digits(negative ? text.substr(1) : text, what, text,
                   "expected a whole number in " + range, "must be in " + range);
  // -2^63 is the one magnitude past INT64_MAX that fits.
  const uint64_t limit = static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) + negative;
  if (magnitude > limit) bad(what, text, "must be in " + range);
  const int64_t value =
      negative ? static_cast<int64_t>(0 - magnitude) : static_cast<int64_t>(magnitude);
  if (value < min || value > max) bad(what, text, "must be in " + range);
  return value;
}

std::optional<std::string> setting_text(Setting id) {
  const SettingInfo& info = setting_info(id);
  const char* env = std::getenv(info.name);
  if (env == nullptr) return std::nullopt;
  if (*env == '\0') bad(info.name, env, std::string("empty; unset it or give ") + info.accepts);
  return std::string(env);
}

std::optional<int> setting_num_threads() {
  const auto text = setting_text(Setting::num_threads);
  if (!text) return std::nullopt;
  return static_cast<int>(parse_integer(*text, 1, 4096, setting_info(Setting::num_threads).name));
}

std::optional<uint64_t> setting_sim_device_capacity() {
  const auto text = setting_text(Setting::sim_device_capacity);
  if (!text) return std::nullopt;
  const char* name = setting_info(Setting::sim_device_capacity).name;
  const uint64_t bytes = parse_byte_count(*text, name);
  if (bytes < kMinSimDeviceCapacity)
    bad(name, *text,
        "must be at least " + std::to_string(kMinSimDeviceCapacity) +
            " bytes (one block of the sim device; less rounds down to a device of 0 bytes)");
  return bytes;
}

std::optional<uint64_t> setting_host_cache_max() {
  const auto text = setting_text(Setting::host_cache_max);
  if (!text) return std::nullopt;
  if (*text == "0") return 0;
  return parse_byte_count(*text, setting_info(Setting::host_cache_max).name);
}

std::optional<int> setting_host_huge_stall_ms() {
  const auto text = setting_text(Setting::host_huge_stall_ms);
  if (!text) return std::nullopt;
  return static_cast<int>(
      parse_integer(*text, 0, 60000, setting_info(Setting::host_huge_stall_ms).name));
}

std::optional<std::string> setting_choice(Setting id) {
  auto text = setting_text(id);
  if (!text) return std::nullopt;
  const SettingInfo& info = setting_info(id);
  const std::string_view accepts = info.accepts;
  size_t start = 0;
  while (start <= accepts.size()) {
    const size_t bar = std::min(accepts.find('|', start), accepts.size());
    if (accepts.substr(start, bar - start) == *text) return text;
    start = bar + 1;
  }
  bad(info.name, *text, std::string("expected one of ") + info.accepts);
}

std::vector<FaultSetting> setting_sim_faults() {
  const auto text = setting_text(Setting::sim_fault);
  if (!text) return {};
  const char* name = setting_info(Setting::sim_fault).name;
  std::vector<FaultSetting> faults;
  size_t start = 0;
  while (start <= text->size()) {
    const size_t end = std::min(text->find(',', start), text->size());
    const std::string item = text->substr(start, end - start);
    const size_t colon = item.find(':');
    FaultSetting f{-1, 0};
    for (int k = 0; k < PS_FAULT_KIND_COUNT && colon != std::string::npos; ++k)
      if (item.compare(0, colon, ps_fault_kind_name(k)) == 0) f.kind = k;
    if (f.kind < 0)
      bad(name, *text,
          "item '" + item + "' is not kind:nth with a known kind (" +
              setting_info(Setting::sim_fault).meaning + ")");
    try {
      f.nth = static_cast<uint64_t>(
          parse_integer(item.substr(colon + 1), 1, std::numeric_limits<int64_t>::max(), "nth"));
    } catch (const Error& e) {
      bad(name, *text, "item '" + item + "': " + e.what());
    }
    for (const auto& seen : faults)
      if (seen.kind == f.kind) bad(name, *text, "kind '" + item.substr(0, colon) + "' is repeated");
    faults.push_back(f);
    start = end + 1;
  }
  return faults;
}

std::optional<std::string> setting_cache_dir() {
  const Setting id = Setting::cache_dir;
  std::optional<std::string> text = setting_text(id);
  if (text && text->front() != '/')
    bad(setting_info(id).name, *text,
        "it must be an absolute path (the cache is shared by "
        "every process, whatever its working directory)");
  return text;
}

void check_settings() {
  // The settings read by a typed reader (or, a path, as text); every other one is a
  // choice among the words of its `accepts`.
  struct Reader {
    Setting id;
    void (*read)();
  };
  static constexpr Reader kReaders[] = {
      {Setting::num_threads, [] { setting_num_threads(); }},
      {Setting::sim_device_capacity, [] { setting_sim_device_capacity(); }},
      {Setting::host_cache_max, [] { setting_host_cache_max(); }},
      {Setting::host_huge_stall_ms, [] { setting_host_huge_stall_ms(); }},
      {Setting::sim_fault, [] { setting_sim_faults(); }},
      // Any non-empty path; the acl backend reports a bad one.
      {Setting::acl_library, [] { setting_text(Setting::acl_library); }},
      {Setting::cache_dir, [] { setting_cache_dir(); }},
  };
  for (const auto& s : kSettings) {
    const auto* r = std::find_if(std::begin(kReaders), std::end(kReaders),
                                 [&](const Reader& x) { return x.id == s.id; });
    if (r != std::end(kReaders))
      r->read();
    else
      setting_choice(s.id);
  }
}

}  // namespace pinstage
