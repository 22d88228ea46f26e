// The conventions every pinstage command shares, in one place: --json FILE|- and --quiet,
// output paths checked before any work, the progress bar, --backend with
// --backend-option, and case-insensitive choices. See docs/cli.md.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "cli_fields.h"
#include "pinstage/checkpoint.h"
#include "pinstage/error.h"
#include "pinstage/report.h"
#include "pinstage/run_info.h"
#include "pinstage/worker.h"

namespace pinstage::cli {

// --json FILE (or - for stdout) and --quiet, on every command that reports.
struct ReportArgs {
  std::string json;    // empty: no JSON report
  bool quiet = false;  // no progress bar and no text beyond errors and the result
  bool json_given = false;
};
void add_report_options(CLI::App& cmd, ReportArgs& args);
// Before any work: `--json ''` is an error; a file must be writable atomically
// (check_output_path). Throws Error(invalid_argument | io) naming the option.
void check_report_args(const ReportArgs& args);
// `--out ''` and the like: an empty or unwritable output option is an error before work.
void check_out_option(const char* flag, const std::string& path);
// Where the human-readable text goes: stderr when the JSON report has stdout.
FILE* text_out(const ReportArgs& args);
// Chatter: what --quiet drops (headers, plans, notes, where a file went), printed to
// text_out otherwise. The result (a table, a verdict, PASS/FAIL) is printed with text_out
// whatever --quiet says: --quiet has this one meaning on every command.
void chatter(const ReportArgs& args, const char* format, ...) __attribute__((format(printf, 2, 3)));
// Adds a library report's fields (pinstage/report.h) to `j`, in their order.
void put_fields(nlohmann::ordered_json& j, const ReportFields& fields);
// Writes `doc` (with the "run" block first) to stdout or, atomically, to the file.
void write_report(const ReportArgs& args, nlohmann::ordered_json doc, const RunInfo& run);

// A one-line bar on stderr, redrawn in place; drawn only on a terminal and without
// --quiet, and cleared when done or destroyed.
class ProgressBar {
 public:
  explicit ProgressBar(const ReportArgs& args);
  ~ProgressBar();
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;
  bool enabled() const noexcept { return enabled_; }
  // fraction in [0, 1]; `text` follows the bar ("group 2/5 pinned bind 3/6").
  void show(double fraction, const std::string& text);
  void clear();

 private:
  bool enabled_ = false;
  bool drawn_ = false;
};

// A progress callback (CheckpointLoadOptions::progress, CacheFillOptions::progress) that
// redraws `bar` with "<done> of <total>" when the percentage changes.
std::function<void(uint64_t, uint64_t)> progress_of(ProgressBar& bar);

// A bar with no known end (generating, writing): the label and the seconds so far,
// redrawn by a thread of its own while the object lives; only on a terminal, not --quiet.
class ProgressTicker {
 public:
  ProgressTicker(const ReportArgs& args, std::string label);
  ~ProgressTicker();
  ProgressTicker(const ProgressTicker&) = delete;
  ProgressTicker& operator=(const ProgressTicker&) = delete;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// The validator behind add_integer_option: parse_integer(text, min, max, flag), throwing its
// Error, then the text rewritten to the number's plain decimal for CLI11 to convert.
CLI::Validator integer_validator(const std::string& flag, int64_t min, int64_t max);

// A whole-number option bound to `value`, parsed by the one strict parser (parse_integer,
// settings.h): decimal digits with an optional '-', in [min, max]. Hex, an empty value, a
// fraction, trailing text or a value out of range is Error(invalid_argument) naming the
// option, the value and the range ("--threads='0x10' is not valid: expected a whole number
// in [0, 1024]"), raised while the command line is parsed, before any work. "010" is ten.
// Every numeric option takes this: CLI11 alone reads 0x10 as 16, '' as 0, 010 as 8 and -1
// into a size_t as 2^64 - 1.
template <typename T>
CLI::Option* add_integer_option(CLI::App& cmd, const std::string& flag, T& value,
                                const std::string& help, int64_t min, int64_t max) {
  static_assert(std::is_integral_v<T> && !std::is_same_v<T, bool>);
  if (min > max || !std::in_range<T>(min) || !std::in_range<T>(max))
    throw Error(ErrorCode::internal, flag + ": its range does not fit the option's type");
  return cmd.add_option(flag, value, help)->transform(integer_validator(flag, min, max));
}

// "1 tensor", "3 tensors".
std::string plural(size_t n, const char* noun);

// --backend NAME (case-insensitive) and the worker option flags (cli_fields.h, kWorkerFlags):
// --config KEY=VALUE (repeatable, also spelt --backend-option), --host-numa-node, ...
struct BackendArgs {
  std::string name = "sim";
  WorkerOptions worker;  // parsed strictly (add_backend_option) while the line is parsed
};
void add_backend_args(CLI::App& cmd, BackendArgs& args);
// The worker options the flags gave.
WorkerOptions worker_options(const BackendArgs& args);

// --devices LIST: "all" (every usable device) or ids separated by commas ("0,1"). Absent:
// device 0 alone, as before the option existed.
struct DeviceArgs {
  std::string list;
  bool given = false;
};
// `what` says what the command does with several devices.
void add_devices_option(CLI::App& cmd, DeviceArgs& args, const std::string& what);
// The ids, before any work: {0} when --devices is absent, else parse_device_list against
// list_devices(backend, worker_options(backend)). Error(invalid_argument) naming --devices.
std::vector<int> device_ids(const DeviceArgs& args, const BackendArgs& backend);
// The one device of a command that runs on one: device_ids, refused when it lists several
// ("--devices '0,1': `command` runs on one device").
int single_device(const DeviceArgs& args, const BackendArgs& backend, const std::string& command);
// "0,1": the ids as the option takes them.
std::string join_ids(const std::vector<int>& ids);

// What load, bench load and hash share: the checkpoint and how it is read, the backend, the
// devices, the tensor-parallel split and the report. One declaration (below) gives every
// command the same flags, with the library's ranges (checkpoint.h) and defaults.
struct CheckpointArgs {
  std::string path;
  CheckpointLoadOptions options;  // the load option flags (cli_fields.h) write here
  BackendArgs backend;
  DeviceArgs devices;
  int tp = 0;        // 0: not tensor-parallel
  std::string plan;  // --plan FILE; none: every tensor replicated
  ReportArgs report;
  CLI::App* cmd = nullptr;
  // The options the flags gave; the ranges were checked while parsing.
  CheckpointLoadOptions load_options() const { return options; }
  // write_report with the run block of this command (and `worker`'s backend, when given).
  void write(nlohmann::ordered_json doc, const Worker* worker) const;
};
// What a command's options do there.
struct CheckpointHelp {
  std::string threads;  // what --threads does besides reading ("" = nothing)
  std::string devices;  // what several devices do
  std::string tp;       // what N ranks do
  std::string plan;     // what the plan file is for
};
// PATH and the load option flags of `fields` (cli_fields.h), with --chunk-mib and, where
// ring_bytes is exposed, --ring-mib: hash and bench load expose kReadFlags, load kLoadFlags.
void add_checkpoint_read_options(CLI::App& cmd, CheckpointArgs& args, const FieldFlags& fields);
// Keeps `values` until the program exits. A command's option values are owned there, not
// by its callback alone: --dry-run replaces every callback, which would free them while
// CLI11 still writes into them.
void keep_until_exit(std::shared_ptr<void> values);
// A new T for a command's option values, kept until exit (keep_until_exit).
template <typename T>
std::shared_ptr<T> command_values() {
  auto values = std::make_shared<T>();
  keep_until_exit(values);
  return values;
}
// The read options (`fields`), --backend with the worker flags, --devices, --tp N and
// --plan FILE: what load and bench load share.
void add_checkpoint_args(CLI::App& cmd, CheckpointArgs& args, const CheckpointHelp& help,
                         const FieldFlags& fields);
// Registers `name` under `parent` with add_checkpoint_args (`fields`) and --json/--quiet, bound to
// a new Args (a CheckpointArgs) that the callback passes to `run`; the command then adds its own
// options to args->cmd.
template <typename Args>
std::shared_ptr<Args> add_checkpoint_command(CLI::App& parent, const std::string& name,
                                             const std::string& about, const CheckpointHelp& help,
                                             const FieldFlags& fields, void (*run)(Args&)) {
  auto args = command_values<Args>();
  CLI::App* cmd = parent.add_subcommand(name, about);
  add_checkpoint_args(*cmd, *args, help, fields);
  add_report_options(*cmd, args->report);
  cmd->callback([args, run] { run(*args); });
  return args;
}
// Every option of `cmd` for the "run" block: the command path, then each option's
// value as given, or its default ("" when it has none).
std::vector<std::pair<std::string, std::string>> command_options(const CLI::App& cmd);

// Finalizes `worker` and turns any release the backend refused during the command into
// Error(backend): memory may still be locked, so the command must not exit 0.
void finish_worker(Worker& worker);

// CLI11 transform: lower-cases the value so that choices are case-insensitive.
std::string to_lower(std::string value);
inline const auto kLowerCase = CLI::Validator(
    [](std::string& value) {
      value = to_lower(value);
      return std::string();
    },
    "", "lower-case");

}  // namespace pinstage::cli
