// The shared command conventions (cli_common.h).
#include "cli_common.h"

#include <linux/magic.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdarg>
#include <mutex>
#include <thread>
#include <variant>

#include "pinstage/atomic_file.h"
#include "pinstage/clock.h"
#include "pinstage/error.h"
#include "pinstage/load_plan.h"
#include "pinstage/settings.h"
#include "pinstage/worker_group.h"

namespace pinstage::cli {

void add_report_options(CLI::App& cmd, ReportArgs& args) {
  cmd.add_option("--json", args.json,
                 "Write the JSON report to FILE (atomically), or to stdout with '-'")
      ->each([&args](const std::string&) { args.json_given = true; });
  cmd.add_flag("--quiet,-q", args.quiet,
               "No progress bar and no chatter (headers, notes, where files went); the result "
               "is printed all the same");
}

namespace {

// check_output_path, with the option that named the file in front of its message.
// /proc, /sys and their kin take no report: a write there fails (or does something)
// only after the run, so such a path is refused with the other up-front checks.
void refuse_kernel_file_system(const char* flag, const std::string& path) {
  struct statfs fs {};
  if (::statfs(path.c_str(), &fs) != 0) {  // a new file: its directory's file system
    const size_t slash = path.rfind('/');
    const std::string dir =
        slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
    if (::statfs(dir.c_str(), &fs) != 0) return;  // check_output_path names what is wrong
  }
  constexpr std::array<decltype(fs.f_type), 8> kKernel = {
      PROC_SUPER_MAGIC, SYSFS_MAGIC,        DEBUGFS_MAGIC,       TRACEFS_MAGIC,
      SECURITYFS_MAGIC, CGROUP_SUPER_MAGIC, CGROUP2_SUPER_MAGIC, BPF_FS_MAGIC};
  if (std::find(kKernel.begin(), kKernel.end(), fs.f_type) != kKernel.end())
    throw Error(ErrorCode::invalid_argument,
                std::string(flag) + ": '" + path +
                    "' is on a kernel file system (/proc, /sys): not a place for files; "
                    "give a path on a disk");
}

void check_named_output(const char* flag, const std::string& path) {
  refuse_kernel_file_system(flag, path);
  try {
    check_output_path(path);
  } catch (const Error& e) {
    throw Error(e.code(), std::string(flag) + ": " + e.what());
  }
}

}  // namespace

void check_report_args(const ReportArgs& args) {
  if (args.json_given && args.json.empty())
    throw Error(ErrorCode::invalid_argument, "--json is empty; give a file name or '-'");
  if (!args.json.empty() && args.json != "-") check_named_output("--json", args.json);
}

void check_out_option(const char* flag, const std::string& path) {
  if (path.empty())
    throw Error(ErrorCode::invalid_argument,
                std::string(flag) + " is empty; give a file name or omit the option");
  check_named_output(flag, path);
}

FILE* text_out(const ReportArgs& args) { return args.json == "-" ? stderr : stdout; }

void chatter(const ReportArgs& args, const char* format, ...) {
  if (args.quiet) return;
  va_list list;
  va_start(list, format);
  std::vfprintf(text_out(args), format, list);
  va_end(list);
}

void put_fields(nlohmann::ordered_json& j, const ReportFields& fields) {
  for (const ReportField& f : fields)
    std::visit([&](const auto& value) { j[f.key] = value; }, f.value);
}

void write_report(const ReportArgs& args, nlohmann::ordered_json doc, const RunInfo& run) {
  if (args.json.empty()) return;
  nlohmann::ordered_json out;
  out["run"] = nlohmann::ordered_json::parse(run_info_json(run));
  for (auto& [key, value] : doc.items())
    if (key != "run") out[key] = std::move(value);
  const std::string text = out.dump(2) + "\n";
  if (args.json == "-") {
    std::fputs(text.c_str(), stdout);
    std::fflush(stdout);
    return;
  }
  write_file_atomically(args.json, text);
}

ProgressBar::ProgressBar(const ReportArgs& args)
    : enabled_(!args.quiet && isatty(STDERR_FILENO) == 1) {}

std::function<void(uint64_t, uint64_t)> progress_of(ProgressBar& bar) {
  auto shown = std::make_shared<int>(-1);
  return [&bar, shown](uint64_t done, uint64_t total) {
    const int pct = total > 0 ? static_cast<int>(done * 100 / total) : 100;
    if (pct == *shown) return;
    *shown = pct;
    bar.show(static_cast<double>(pct) / 100.0, format_bytes(done) + " of " + format_bytes(total));
  };
}

ProgressBar::~ProgressBar() { clear(); }

void ProgressBar::show(double fraction, const std::string& text) {
  if (!enabled_) return;
  constexpr int kWidth = 30;
  fraction = std::clamp(fraction, 0.0, 1.0);
  const int filled = static_cast<int>(fraction * kWidth);
  std::string bar(static_cast<size_t>(filled), '#');
  bar += std::string(static_cast<size_t>(kWidth - filled), '.');
  std::fprintf(stderr, "\r\033[K[%s] %3d%%  %s", bar.c_str(), static_cast<int>(fraction * 100.0),
               text.c_str());
  std::fflush(stderr);
  drawn_ = true;
}

void ProgressBar::clear() {
  if (!drawn_) return;
  std::fprintf(stderr, "\r\033[K");
  std::fflush(stderr);
  drawn_ = false;
}

struct ProgressTicker::State {
  ProgressBar bar;
  std::string label;
  std::mutex mutex;
  std::condition_variable cv;
  bool stop = false;
  std::thread thread;
  explicit State(const ReportArgs& args) : bar(args) {}
};

ProgressTicker::ProgressTicker(const ReportArgs& args, std::string label)
    : state_(std::make_unique<State>(args)) {
  if (!state_->bar.enabled()) return;
  state_->label = std::move(label);
  state_->thread = std::thread([s = state_.get()] {
    const Stopwatch clock;
    std::unique_lock<std::mutex> lock(s->mutex);
    // A bar that sweeps every 10 s: there is no end to measure against.
    while (!s->cv.wait_for(lock, std::chrono::milliseconds(250), [s] { return s->stop; })) {
      const double t = clock.seconds();
      char secs[32];
      std::snprintf(secs, sizeof secs, "  %.1f s", t);
      s->bar.show(std::fmod(t, 10.0) / 10.0, s->label + secs);
    }
    s->bar.clear();
  });
}

ProgressTicker::~ProgressTicker() {
  if (!state_->thread.joinable()) return;
  {
    const std::lock_guard<std::mutex> lock(state_->mutex);
    state_->stop = true;
  }
  state_->cv.notify_one();
  state_->thread.join();
}

CLI::Validator integer_validator(const std::string& flag, int64_t min, int64_t max) {
  return CLI::Validator(
      [flag, min, max](std::string& text) {
        // Thrown, not returned: CLI11 would put the flag in front of the message again.
        text = std::to_string(parse_integer(text, min, max, flag));
        return std::string();
      },
      "", "integer");
}

std::string plural(size_t n, const char* noun) {
  return std::to_string(n) + " " + noun + (n == 1 ? "" : "s");
}

void CheckpointArgs::write(nlohmann::ordered_json doc, const Worker* worker) const {
  write_report(report, std::move(doc), collect_run_info(worker, command_options(*cmd)));
}

void add_checkpoint_read_options(CLI::App& cmd, CheckpointArgs& args, const FieldFlags& fields) {
  cmd.add_option("PATH", args.path, "A .safetensors file, or a directory of shards")->required();
  add_load_option_flags(cmd, args.options, fields);
  add_mib_alias(cmd, "--chunk-mib", "chunk_bytes", args.options.chunk_bytes,
                kLoadMaxChunkBytes >> 20);
  if (fields.exposes("ring_bytes"))
    add_mib_alias(cmd, "--ring-mib", "ring_bytes", args.options.ring_bytes,
                  kLoadMaxRingBytes >> 20);
}

void add_checkpoint_args(CLI::App& cmd, CheckpointArgs& args, const CheckpointHelp& help,
                         const FieldFlags& fields) {
  args.cmd = &cmd;
  FieldFlags read = fields;
  if (!help.threads.empty()) read.notes["threads"] = help.threads;
  add_checkpoint_read_options(cmd, args, read);
  add_backend_args(cmd, args.backend);
  add_devices_option(cmd, args.devices, help.devices);
  add_integer_option(cmd, "--tp", args.tp,
                     "Tensor-parallel ranks, 1.." + std::to_string(kTpMaxRanks) + ": " + help.tp, 1,
                     kTpMaxRanks);
  cmd.add_option("--plan", args.plan, help.plan);
}

void add_backend_args(CLI::App& cmd, BackendArgs& args) {
  // The choices are the backends built here, as each describes itself (pinstage_add_backend).
  std::vector<std::string> names;
  for (const BackendDescription& b : listed_backends()) names.push_back(b.name);
  std::string listed;
  for (const std::string& name : names) listed += (listed.empty() ? "" : ", ") + name;
  cmd.add_option("--backend", args.name, "Backend plugin, one of: " + listed)
      ->transform(kLowerCase)
      ->check(CLI::Validator(backend_choice_error, "", "backend"))
      ->capture_default_str();
  FieldFlags worker = kWorkerFlags;
  worker.notes["config"] = "e.g. link_gbps=55 on sim";
  add_worker_option_flags(cmd, args.worker, worker);
}

WorkerOptions worker_options(const BackendArgs& args) { return args.worker; }

void add_devices_option(CLI::App& cmd, DeviceArgs& args, const std::string& what) {
  cmd.add_option("--devices", args.list,
                 "Devices: 'all' (every usable one) or ids separated by commas (0,1); " + what +
                     ". Default: device 0")
      ->transform(kLowerCase)  // 'ALL' as 'all', as every choice
      ->each([&args](const std::string&) { args.given = true; });
}

std::vector<int> device_ids(const DeviceArgs& args, const BackendArgs& backend) {
  if (!args.given) return {0};
  const std::vector<DeviceInfo> devices = list_devices(backend.name, worker_options(backend));
  try {
    return parse_device_list(args.list, devices);
  } catch (const Error& e) {
    const std::string why = e.what();
    if (why.rfind("--devices", 0) == 0) throw;
    throw Error(e.code(), "--devices '" + args.list + "': " + why);
  }
}

int single_device(const DeviceArgs& args, const BackendArgs& backend, const std::string& command) {
  const std::vector<int> ids = device_ids(args, backend);
  if (ids.size() != 1)
    throw Error(ErrorCode::invalid_argument, "--devices '" + args.list + "' lists " +
                                                 plural(ids.size(), "device") + "; " + command +
                                                 " runs on one device: give one id");
  return ids[0];
}

std::string join_ids(const std::vector<int>& ids) {
  std::string text;
  for (int id : ids) text += (text.empty() ? "" : ",") + std::to_string(id);
  return text;
}

std::vector<std::pair<std::string, std::string>> command_options(const CLI::App& cmd) {
  std::string path = cmd.get_name();
  for (const CLI::App* p = cmd.get_parent(); p != nullptr && p->get_parent() != nullptr;
       p = p->get_parent())
    path = p->get_name() + " " + path;
  std::vector<std::pair<std::string, std::string>> all = {{"command", path}};
  for (const CLI::Option* opt : cmd.get_options()) {
    if (opt->get_name() == "--help") continue;
    std::string value;
    for (const std::string& r : opt->results()) value += (value.empty() ? "" : ",") + r;
    if (opt->count() == 0) value = opt->get_default_str();
    all.emplace_back(opt->get_name(), value);
  }
  return all;
}

void keep_until_exit(std::shared_ptr<void> values) {
  static std::vector<std::shared_ptr<void>> kept;  // the CLI parses on one thread
  kept.push_back(std::move(values));
}

void finish_worker(Worker& worker) {
  worker.finalize();
  if (const uint64_t n = worker.free_failures(); n > 0)
    throw Error(ErrorCode::backend,
                plural(n, "release") + " of pinned or device memory failed during this command " +
                    "(see the log above); that memory may stay locked until the process exits");
}

std::string to_lower(std::string value) {
  std::transform(value.begin(), value.end(), value.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return value;
}

}  // namespace pinstage::cli
