// The flags that come from the library's field lists (PINSTAGE_BIND_OPTION_FIELDS,
// PINSTAGE_CHECKPOINT_LOAD_OPTION_FIELDS, PINSTAGE_WORKER_OPTION_FIELDS): one flag per field
// a command exposes, named after the field ('_' -> '-'), its help the list's doc, parsed by
// the field's type. A field added to a list reaches every command that exposes all but
// some. See docs/cli.md, "Flags from the field lists".
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "pinstage/bind.h"
#include "pinstage/checkpoint.h"
#include "pinstage/worker.h"

namespace pinstage::cli {

// Which fields of a list a command exposes as flags.
struct FieldFlags {
  std::vector<std::string> names;  // fields by their list names
  bool all_but = false;            // true: every field of the list except `names`
  // Field -> what it does in this command, printed after the list's doc.
  std::map<std::string, std::string> notes{};
  bool exposes(std::string_view field) const;
};

// What each command exposes; tests/cpp/test_cli_fields.cpp holds every command's --help
// to them.
// bench <scene>|synthetic: the arm sets upload, the scene its callable, the A/B its checks.
inline const FieldFlags kBenchBindFlags{{"upload", "execute_callable", "verify_upload"}, true};
// scene <scene>: the run sets execute_callable and verify_upload.
inline const FieldFlags kSceneBindFlags{{"execute_callable", "verify_upload"}, true};
// load: every load option.
inline const FieldFlags kLoadFlags{{}, true};
// bench load and hash: how the checkpoint is read.
inline const FieldFlags kReadFlags{{"threads", "chunk_bytes"}};
// Every command with --backend: the backend picks the plugin, so no --plugin-path.
inline const FieldFlags kWorkerFlags{{"plugin_path"}, true};

// A list's doc as a flag's help: WorkerOptions' Python type in front ("int: ") left out.
std::string field_doc(std::string_view doc);
// "staging_buffers" -> "--staging-buffers".
std::string flag_of(std::string_view field);
// 8 MiB -> "8M", 1000 -> "1000": a byte count as --*-bytes flags take it (parse_byte_count).
std::string byte_text(uint64_t bytes);

// One flag per exposed field of the list, bound to `options` (kept by the caller until the
// command has run: command_values). Integers are whole numbers (parse_integer) and *_bytes
// fields byte counts (8M, 1G, 4096), within the range the library's check enforces (bind.h's
// and checkpoint.h's bounds, else the type's); a bind option is also checked by validate()
// as it is parsed. Enums take their names (case-insensitive), config KEY=VALUE (repeatable).
// A bad value is Error(invalid_argument) naming the flag, the value and what it accepts,
// raised while the line is parsed, before any work. A name in `which` that the list lacks
// is Error(internal).
void add_bind_option_flags(CLI::App& cmd, BindOptions& options, const FieldFlags& which);
void add_load_option_flags(CLI::App& cmd, CheckpointLoadOptions& options, const FieldFlags& which);
void add_worker_option_flags(CLI::App& cmd, WorkerOptions& options, const FieldFlags& which);

// A flag in MiB that sets a *_bytes field's flag's value, the spelling the CLI had before
// the flags came from the lists (--staging-buffer-mib, --chunk-mib, --ring-mib): 1..max_mib,
// not with the field's own flag.
void add_mib_alias(CLI::App& cmd, const std::string& alias, const std::string& field,
                   uint64_t& bytes, uint64_t max_mib);

}  // namespace pinstage::cli
