// Flags from the field lists (cli_fields.h).
#include "cli_fields.h"

#include <algorithm>
#include <array>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <type_traits>
#include <utility>

#include "cli_common.h"
#include "pinstage/error.h"
#include "pinstage/settings.h"

namespace pinstage::cli {

bool FieldFlags::exposes(std::string_view field) const {
  const bool named = std::find(names.begin(), names.end(), field) != names.end();
  return named != all_but;
}

std::string flag_of(std::string_view field) {
  std::string flag = "--" + std::string(field);
  std::replace(flag.begin(), flag.end(), '_', '-');
  return flag;
}

std::string byte_text(uint64_t bytes) {
  static constexpr std::array<std::pair<int, char>, 4> kUnits = {
      {{40, 'T'}, {30, 'G'}, {20, 'M'}, {10, 'K'}}};
  for (const auto& [shift, unit] : kUnits)
    if (bytes != 0 && bytes % (uint64_t{1} << shift) == 0)
      return std::to_string(bytes >> shift) + unit;
  return std::to_string(bytes);
}

namespace {

// The names an enum field takes: its values, its name function and its parser (the library's
// own), one line per enum below.
template <class E, const char* (*Name)(E), E (*Parse)(std::string_view), E... Values>
struct EnumTextOf {
  static constexpr std::array kValues = {Values...};
  static const char* name(E v) { return Name(v); }
  static E parse(std::string_view s) { return Parse(s); }
};
template <class E>
struct EnumText;
template <>
struct EnumText<DeviceLayout> : EnumTextOf<DeviceLayout, device_layout_name, parse_device_layout,
                                           DeviceLayout::arena, DeviceLayout::per_tensor> {};
template <>
struct EnumText<UploadPath> : EnumTextOf<UploadPath, upload_path_name, parse_upload_path,
                                         UploadPath::direct, UploadPath::staged> {};
template <>
struct EnumText<LoadMode>
    : EnumTextOf<LoadMode, load_mode_name, parse_load_mode, LoadMode::copy, LoadMode::map> {};
template <>
struct EnumText<CacheUse> : EnumTextOf<CacheUse, cache_use_name, parse_cache_use, CacheUse::off,
                                       CacheUse::use, CacheUse::fill> {};

// A field's accepted range where the library's check is narrower than its type.
struct Range {
  std::string_view field;
  int64_t min, max;
  bool power_of_two = false;  // only powers of two in [min, max] (said so when refused)
};
constexpr int64_t kIntMax = std::numeric_limits<int>::max();
constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();

// validate(BindOptions)'s bounds (bind.h).
constexpr Range kBindRanges[] = {
    {"staging_buffers", 1, static_cast<int64_t>(kBindMaxStagingBuffers)},
    {"staging_buffer_bytes", 1, static_cast<int64_t>(kBindMaxStagingBufferBytes)},
    {"chunk_bytes", 1, kInt64Max},
    {"arena_alignment", 1, static_cast<int64_t>(kBindMaxArenaAlignment), true},
    {"copy_threads", 0, kIntMax}};
// The load's checks (checkpoint.h's bounds): a ring of at least 2 buffers.
constexpr Range kLoadRanges[] = {{"threads", 0, kLoadMaxThreads},
                                 {"chunk_bytes", 1, static_cast<int64_t>(kLoadMaxChunkBytes)},
                                 {"ring_bytes", 1, static_cast<int64_t>(kLoadMaxRingBytes)},
                                 {"ring_buffers", 2, kInt64Max}};
// Worker::init refuses a negative NUMA node.
constexpr Range kWorkerRanges[] = {{"host_numa_node", 0, kIntMax}};

template <class T>
struct Unwrap {
  using type = T;
};
template <class T>
struct Unwrap<std::optional<T>> {
  using type = T;
};

[[noreturn]] void refuse(const std::string& flag, const std::string& text, const std::string& why) {
  throw Error(ErrorCode::invalid_argument, flag + "='" + text + "' is not valid: " + why);
}

// A power of two in [r.min, r.max], refused as that (not as "a whole number in [...]": not
// every whole number there is accepted).
int64_t parse_power_of_two(const std::string& flag, const std::string& text, Range r) {
  const std::string expected =
      "expected a power of two in [" + std::to_string(r.min) + ", " + std::to_string(r.max) + "]";
  int64_t n = 0;
  try {
    n = parse_integer(text, r.min, r.max, flag);
  } catch (const Error&) {
    refuse(flag, text, expected);
  }
  if ((n & (n - 1)) != 0) refuse(flag, text, expected);
  return n;
}

// A byte count (parse_byte_count; "0" where 0 is in range) in [min, max].
uint64_t parse_bytes(const std::string& flag, const std::string& text, Range r) {
  const uint64_t bytes = (text == "0" && r.min == 0) ? 0 : parse_byte_count(text, flag);
  if (bytes < static_cast<uint64_t>(r.min) || bytes > static_cast<uint64_t>(r.max))
    refuse(flag, text,
           "expected a byte count in [" + std::to_string(r.min) + ", " + std::to_string(r.max) +
               "] (" + byte_text(static_cast<uint64_t>(r.min)) + ".." +
               byte_text(static_cast<uint64_t>(r.max)) + ")");
  return bytes;
}

}  // namespace

std::string field_doc(std::string_view doc) {
  // WorkerOptions' docs start with the Python type ("int: ", "dict[str, str]: ").
  const size_t colon = doc.find(": ");
  const std::string_view type = doc.substr(0, colon);
  if (colon != std::string_view::npos &&
      type.find_first_not_of("abcdefghijklmnopqrstuvwxyz[], ") == std::string_view::npos &&
      (type.starts_with("int") || type.starts_with("str") || type.starts_with("dict") ||
       type.starts_with("bool")))
    return std::string(doc.substr(colon + 2));
  return std::string(doc);
}

namespace {

// Adds the flags of one option set's fields (the X-macro calls add once per field).
template <class Options>
class FieldAdder {
 public:
  FieldAdder(CLI::App& cmd, Options& options, const FieldFlags& which,
             std::span<const Range> ranges, void (*check)(const Options&))
      : cmd_(cmd), options_(options), which_(which), ranges_(ranges), check_(check) {}

  template <class T>
  void add(const char* name, const char* doc, T Options::*member) {
    listed_.emplace_back(name);
    if (!which_.exposes(name)) return;
    const std::string flag = flag_of(name);
    std::string help = field_doc(doc);
    if (const auto note = which_.notes.find(name); note != which_.notes.end())
      help += "; " + note->second;
    using V = typename Unwrap<T>::type;
    if constexpr (std::is_same_v<T, bool>) {
      cmd_.add_flag(flag, options_.*member, help);
    } else if constexpr (std::is_same_v<T, BackendConfig>) {
      add_config(flag, help, options_.*member);
    } else if constexpr (std::is_same_v<T, std::string>) {
      cmd_.add_option(flag, options_.*member, help);
    } else if constexpr (std::is_enum_v<V>) {
      add_enum<T>(flag, help, member);
    } else {
      static_assert(std::is_integral_v<V>, "a field type the CLI cannot parse: teach cli_fields");
      add_number<T>(name, flag, help, member);
    }
  }

  // A name the selection gives that the list lacks (a renamed field) is the CLI's bug:
  // Error(internal) on every run of the command, so a test sees it.
  void finish() const {
    std::vector<std::string> named = which_.names;
    for (const auto& [field, note] : which_.notes) named.push_back(field);
    for (const std::string& field : named)
      if (std::find(listed_.begin(), listed_.end(), field) == listed_.end())
        throw Error(ErrorCode::internal, cmd_.get_name() + ": the CLI names field '" + field +
                                             "', which its option list lacks (cli_fields.h)");
  }

 private:
  Range range_of(std::string_view name, int64_t type_min, int64_t type_max) const {
    for (const Range& r : ranges_)
      if (r.field == name) return r;
    return {name, type_min, type_max, false};
  }

  // The field's value checked by the library as it is parsed (validate() for a bind option),
  // its message behind the flag's.
  template <class T>
  static void check(void (*check_fn)(const Options&), const std::string& flag,
                    const std::string& text, T Options::*member, T value) {
    if (check_fn == nullptr) return;
    Options probe;
    probe.*member = std::move(value);
    try {
      check_fn(probe);
    } catch (const Error& e) {
      refuse(flag, text, e.what());
    }
  }

  // One value parsed from its text by `parse`, which throws naming the flag; the text is
  // rewritten to `show` of the value, for the run block's option list.
  template <class T>
  CLI::Option* add_parsed(const std::string& flag, const std::string& help, T Options::*member,
                          std::function<T(const std::string&)> parse,
                          std::function<std::string(T)> show, const std::string& shown_default) {
    T& value = options_.*member;
    return cmd_
        .add_option_function<std::string>(
            flag, [&value, parse](const std::string& text) { value = parse(text); }, help)
        ->default_str(shown_default)
        ->transform(CLI::Validator(
            [check_fn = check_, flag, member, parse, show](std::string& text) {
              T parsed = parse(text);
              check<T>(check_fn, flag, text, member, parsed);
              text = show(std::move(parsed));
              return std::string();
            },
            "", "field"));
  }

  template <class T>
  void add_enum(const std::string& flag, std::string help, T Options::*member) {
    using Text = EnumText<T>;
    std::vector<std::string> names;
    names.reserve(std::size(Text::kValues));
    for (T v : Text::kValues) names.emplace_back(Text::name(v));
    add_parsed<T>(
        flag, help, member,
        [flag](const std::string& text) {
          try {
            return Text::parse(to_lower(text));
          } catch (const Error& e) {
            refuse(flag, text, e.what());
          }
        },
        [](T v) { return std::string(Text::name(v)); }, Text::name(options_.*member))
        ->transform(CLI::IsMember(names, CLI::ignore_case));  // {a,b} in help and errors
  }

  template <class T>
  void add_number(std::string_view name, const std::string& flag, std::string help,
                  T Options::*member) {
    using V = typename Unwrap<T>::type;
    const bool bytes = name.ends_with("_bytes");
    const int64_t type_min = std::max<int64_t>(std::numeric_limits<V>::min(), INT64_MIN);
    const auto type_max = static_cast<int64_t>(
        std::min<uint64_t>(std::numeric_limits<V>::max(), static_cast<uint64_t>(kInt64Max)));
    const Range r = range_of(name, type_min, type_max);
    const auto text = [bytes](int64_t n) {
      return bytes ? byte_text(static_cast<uint64_t>(n)) : std::to_string(n);
    };
    const std::string range =
        r.max == type_max ? ">= " + text(r.min) : text(r.min) + ".." + text(r.max);
    if (help.find(range) == std::string::npos) help += " (" + range + ")";
    const std::function<T(const std::string&)> parse = [flag, r, bytes](const std::string& text) {
      if (bytes) return T(static_cast<V>(parse_bytes(flag, text, r)));
      return T(static_cast<V>(r.power_of_two ? parse_power_of_two(flag, text, r)
                                             : parse_integer(text, r.min, r.max, flag)));
    };
    const T& current = options_.*member;
    std::string shown = "unset";
    if constexpr (std::is_same_v<T, V>)
      shown = bytes ? byte_text(current) : std::to_string(current);
    else if (current)
      shown = bytes ? byte_text(*current) : std::to_string(*current);
    add_parsed<T>(
        flag, help, member, parse,
        [bytes](T v) {
          const V n = static_cast<V>(*std::optional<V>(v));
          return bytes ? byte_text(static_cast<uint64_t>(n)) : std::to_string(n);
        },
        shown)
        ->type_name(bytes ? "BYTES" : "INT");
  }

  void add_config(const std::string& flag, const std::string& help, BackendConfig& config) {
    // Also --backend-option, its name before the flags came from the list.
    auto kept = std::make_shared<std::vector<std::string>>();  // CLI11 writes here
    keep_until_exit(kept);
    cmd_.add_option(flag + ",--backend-option", *kept, help + " (repeatable)")
        ->type_name("KEY=VALUE")
        ->each([flag, &config](const std::string& kv) {
          try {
            add_backend_option(config, kv);
          } catch (const Error& e) {
            refuse(flag, kv, e.what());
          }
        });
  }

  CLI::App& cmd_;
  Options& options_;
  const FieldFlags& which_;
  std::span<const Range> ranges_;
  void (*check_)(const Options&);
  std::vector<std::string> listed_;  // the list's fields, in order
};

void check_bind(const BindOptions& options) { validate(options); }

}  // namespace

#define PINSTAGE_ADD_BIND_FIELD_(type, name, value, doc) adder.add(#name, doc, &BindOptions::name);
#define PINSTAGE_ADD_LOAD_FIELD_(type, name, value, doc) \
  adder.add(#name, doc, &CheckpointLoadOptions::name);
#define PINSTAGE_ADD_WORKER_FIELD_(type, name, value, doc) \
  adder.add(#name, doc, &WorkerOptions::name);

void add_bind_option_flags(CLI::App& cmd, BindOptions& options, const FieldFlags& which) {
  FieldAdder<BindOptions> adder(cmd, options, which, kBindRanges, check_bind);
  PINSTAGE_BIND_OPTION_FIELDS(PINSTAGE_ADD_BIND_FIELD_)
  adder.finish();
}

void add_load_option_flags(CLI::App& cmd, CheckpointLoadOptions& options, const FieldFlags& which) {
  FieldAdder<CheckpointLoadOptions> adder(cmd, options, which, kLoadRanges, nullptr);
  PINSTAGE_CHECKPOINT_LOAD_OPTION_FIELDS(PINSTAGE_ADD_LOAD_FIELD_)
  adder.finish();
}

void add_worker_option_flags(CLI::App& cmd, WorkerOptions& options, const FieldFlags& which) {
  FieldAdder<WorkerOptions> adder(cmd, options, which, kWorkerRanges, nullptr);
  PINSTAGE_WORKER_OPTION_FIELDS(PINSTAGE_ADD_WORKER_FIELD_)
  adder.finish();
}

#undef PINSTAGE_ADD_BIND_FIELD_
#undef PINSTAGE_ADD_LOAD_FIELD_
#undef PINSTAGE_ADD_WORKER_FIELD_

void add_mib_alias(CLI::App& cmd, const std::string& alias, const std::string& field,
                   uint64_t& bytes, uint64_t max_mib) {
  CLI::Option* own = cmd.get_option(flag_of(field));  // OptionNotFound: expose the field first
  cmd.add_option_function<std::string>(
         alias, [&bytes](const std::string& mib) { bytes = std::stoull(mib) << 20; },
         own->get_name() + " in MiB, 1.." + std::to_string(max_mib) +
             " (its spelling before the flags came from the field lists)")
      ->default_str(std::to_string(bytes >> 20))
      ->transform(integer_validator(alias, 1, static_cast<int64_t>(max_mib)))
      ->excludes(own);
}

}  // namespace pinstage::cli
