// Commands that read reports: `pinstage plot REPORT.json` (the picture, drawn by the
// Python module pinstage.plot with matplotlib) and `pinstage bench compare A.json B.json`.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "cli_common.h"
#include "commands.h"
#include "pinstage/error.h"
#include "pinstage/files.h"
#include "pinstage/names.h"
#include "pinstage/worker.h"

namespace pinstage::cli {
namespace {

bool is_file(const std::string& path) { return access(path.c_str(), R_OK) == 0; }

// plot.py ships with the Python package: <build>/python/pinstage next to <build>/lib, or
// <prefix>/share/pinstage when installed.
std::string find_plot_script() {
  const std::string lib = library_dir();
  for (const std::string& candidate :
       {lib + "/../python/pinstage/plot.py", lib + "/../share/pinstage/plot.py",
        lib + "/../../share/pinstage/plot.py"})
    if (is_file(candidate)) return candidate;
  return "";
}

std::string quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// A report lists every tensor; 256 MiB is far above a million-tensor report's size.
constexpr uint64_t kMaxReportBytes = uint64_t{256} << 20;

nlohmann::json read_json(const std::string& path) {
  std::string text, why;
  if (!read_regular_file(path, kMaxReportBytes, &text, &why))  // a FIFO would block a read
    throw Error(ErrorCode::io, "cannot read '" + path + "': " + why);
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw Error(ErrorCode::io, "'" + path + "' is not a JSON report: " + e.what());
  }
}

}  // namespace

std::string plot_path_for(const std::string& json_path) {
  const std::string ext = ".json";
  if (json_path.size() > ext.size() &&
      json_path.compare(json_path.size() - ext.size(), ext.size(), ext) == 0)
    return json_path.substr(0, json_path.size() - ext.size()) + ".png";
  return json_path + ".png";
}

bool plot_report(const std::string& json_path, const std::string& png_path, std::string& why) {
  const std::string script = find_plot_script();
  const std::string python = is_file("/usr/bin/python3") ? "/usr/bin/python3" : "python3";
  const std::string command =
      script.empty()
          ? python + " -m pinstage.plot " + quote(json_path) + " --out " + quote(png_path)
          : python + " " + quote(script) + " " + quote(json_path) + " --out " + quote(png_path);
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) {
    why = "cannot start " + python;
    return false;
  }
  std::string output;
  char buf[512];
  while (std::fgets(buf, sizeof buf, pipe) != nullptr) output += buf;
  const int status = pclose(pipe);
  if (status == 0) return true;
  while (!output.empty() && output.back() == '\n') output.pop_back();
  const size_t last = output.rfind('\n');
  why = output.empty() ? python + " failed"
                       : (last == std::string::npos ? output : output.substr(last + 1));
  return false;
}

namespace {

void add_plot_command(CLI::App& app) {
  struct Args {
    std::string report;
    std::string out;
    ReportArgs json;
  };
  auto a = command_values<Args>();
  CLI::App* cmd = app.add_subcommand(
      "plot",
      "Draw a report: an A/B bench (latency, upload GB/s and phases per arm), a bench load "
      "(GB/s per arm, warm and cold) or a steps bench (staging and execute per step and mode); "
      "needs python3-matplotlib");
  cmd->add_option("REPORT", a->report, "A report from pinstage bench --json")
      ->required()
      ->check(CLI::ExistingFile);
  cmd->add_option("--out", a->out, "The PNG to write (default: REPORT with .png)");
  add_report_options(*cmd, a->json);
  cmd->callback([a] {
    check_report_args(a->json);
    const std::string out = a->out.empty() ? plot_path_for(a->report) : a->out;
    check_out_option("--out", out);
    std::string why;
    if (!plot_report(a->report, out, why)) throw Error(ErrorCode::io, "plot failed: " + why);
    chatter(a->json, "picture: %s\n", out.c_str());
    write_report(a->json, {{"report", a->report}, {"picture", out}},
                 collect_run_info(nullptr, {{"command", "plot"}, {"REPORT", a->report}}));
  });
}

// Reading a report: every key is looked up with a check, never through nlohmann's const
// operator[] (undefined behaviour on a missing key). A missing key or a value of another
// type is Error(invalid_argument) naming the file and the key's path
// ("A.json: config.arms is missing", "A.json: config.arms is a number, not an array").
enum class Kind { object, array, string, number };

// In the enum's order.
constexpr const char* kKindNames[] = {"an object", "an array", "a string", "a number"};

// "a number", "an array", "null": what the value at a path is.
std::string what_it_is(const nlohmann::json& value) {
  std::string name = value.type_name();
  if (value.is_null()) return name;
  return (name[0] == 'a' || name[0] == 'o' ? "an " : "a ") + name;
}

const nlohmann::json& checked(const nlohmann::json& value, const std::string& file,
                              const std::string& where, Kind kind) {
  const bool ok = kind == Kind::object   ? value.is_object()
                  : kind == Kind::array  ? value.is_array()
                  : kind == Kind::string ? value.is_string()
                                         : value.is_number();
  if (!ok)
    throw Error(ErrorCode::invalid_argument, file + ": " + (where.empty() ? "the report" : where) +
                                                 " is " + what_it_is(value) + ", not " +
                                                 enum_name(kind, kKindNames));
  return value;
}

// parent[key] of `kind`, or nullptr when the key is missing; `where` is parent's path.
const nlohmann::json* optional_key(const nlohmann::json& parent, const std::string& file,
                                   const std::string& where, const char* key, Kind kind) {
  const std::string path = where.empty() ? key : where + "." + key;
  const auto it = parent.find(key);
  return it == parent.end() ? nullptr : &checked(*it, file, path, kind);
}

const nlohmann::json& required_key(const nlohmann::json& parent, const std::string& file,
                                   const std::string& where, const char* key, Kind kind) {
  const nlohmann::json* value = optional_key(parent, file, where, key, kind);
  if (value == nullptr)
    throw Error(ErrorCode::invalid_argument,
                file + ": " + (where.empty() ? key : where + "." + key) + " is missing");
  return *value;
}

std::string string_or(const nlohmann::json& parent, const std::string& file,
                      const std::string& where, const char* key, const char* fallback) {
  const nlohmann::json* value = optional_key(parent, file, where, key, Kind::string);
  return value ? value->get<std::string>() : fallback;
}

double number_or(const nlohmann::json& parent, const std::string& file, const std::string& where,
                 const char* key, double fallback) {
  const nlohmann::json* value = optional_key(parent, file, where, key, Kind::number);
  return value ? value->get<double>() : fallback;
}

// A bench report read for compare: its config.arms, its summary's figures per arm and the
// line that says where it came from.
struct CompareReport {
  std::string file;
  nlohmann::json doc;
  std::vector<std::string> arms;  // config.arms, in run order
};

// What a report bench compare cannot compare is, or nullptr (an A/B bench's, or unknown).
const char* other_report_kind(const nlohmann::json& doc) {
  const auto kind = doc.find("kind");
  if (kind != doc.end() && *kind == "steps")
    return "a steps bench report (pinstage bench <scene> --steps N --json)";
  const auto arms = doc.find("arms");
  if (arms != doc.end() && arms->is_object() && doc.contains("targets"))
    return "a bench load report (pinstage bench load --json)";
  return nullptr;
}

CompareReport read_compare_report(const std::string& file) {
  CompareReport r{file, read_json(file), {}};
  checked(r.doc, file, "", Kind::object);
  if (const char* kind = other_report_kind(r.doc))
    throw Error(ErrorCode::invalid_argument,
                file + " is " + kind +
                    "; bench compare compares two A/B bench reports (pinstage bench <scene> "
                    "--json or bench synthetic --json). Draw this one with pinstage plot");
  const nlohmann::json& config = required_key(r.doc, file, "", "config", Kind::object);
  const nlohmann::json& arms = required_key(config, file, "config", "arms", Kind::array);
  for (size_t i = 0; i < arms.size(); ++i)
    r.arms.push_back(checked(arms[i], file, "config.arms[" + std::to_string(i) + "]", Kind::string)
                         .get<std::string>());
  required_key(required_key(r.doc, file, "", "summary", Kind::object), file, "summary", "arms",
               Kind::array);
  return r;
}

// One arm's figures from a report's summary.
struct ArmFigures {
  double bind_min_ms = 0, upload_gbps = 0, alloc_ms = 0, reduction = 0;
  bool found = false;
};

ArmFigures arm_figures(const CompareReport& r, const std::string& arm) {
  ArmFigures f;
  const nlohmann::json& arms = r.doc.at("summary").at("arms");  // read_compare_report checked
  for (size_t i = 0; i < arms.size(); ++i) {
    const std::string where = "summary.arms[" + std::to_string(i) + "]";
    const nlohmann::json& a = checked(arms[i], r.file, where, Kind::object);
    if (required_key(a, r.file, where, "arm", Kind::string) != arm) continue;
    f.found = true;
    f.bind_min_ms = required_key(a, r.file, where, "min_seconds", Kind::number).get<double>() * 1e3;
    f.upload_gbps = number_or(a, r.file, where, "median_upload_gbps", 0.0);
    f.alloc_ms = number_or(a, r.file, where, "median_alloc_seconds", 0.0) * 1e3;
    f.reduction = number_or(a, r.file, where, "median_reduction", 0.0);
  }
  return f;
}

// "+5.7%", or "-" when either figure shows as 0 at the table's precision (a percent change
// of two values printed 0.00 says nothing).
std::string change(double before, double after, int decimals) {
  const double shown = std::pow(10.0, -decimals) / 2;
  if (std::fabs(before) < shown || std::fabs(after) < shown) return "-";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%+.1f%%", (after / before - 1.0) * 100.0);
  return buf;
}

// "A: a.json  (2024-05-01T10:00:00Z, sim on host, pinstage 0.2.0)"
std::string source_line(const char* tag, const CompareReport& r) {
  static const nlohmann::json kNone = nlohmann::json::object();
  const nlohmann::json* found = optional_key(r.doc, r.file, "", "run", Kind::object);
  const nlohmann::json& run = found ? *found : kNone;
  return std::string(tag) + ": " + r.file + "  (" + string_or(run, r.file, "run", "utc_time", "?") +
         ", " + string_or(r.doc.at("config"), r.file, "config", "backend", "?") + " on " +
         string_or(run, r.file, "run", "host", "?") + ", pinstage " +
         string_or(run, r.file, "run", "pinstage_version", "?") + ")";
}

// run.options of a report as option -> value ("" for an option the run block lacks).
std::map<std::string, std::string> run_options(const CompareReport& r) {
  std::map<std::string, std::string> out;
  const nlohmann::json* run = optional_key(r.doc, r.file, "", "run", Kind::object);
  if (run == nullptr) return out;
  const nlohmann::json* options = optional_key(*run, r.file, "run", "options", Kind::object);
  if (options == nullptr) return out;
  for (const auto& [key, value] : options->items())
    out[key] = value.is_string() ? value.get<std::string>() : value.dump();
  return out;
}

// The options whose values differ between the two runs (or that one run lacks): what a
// reader must know before trusting a change.
nlohmann::ordered_json differing_options(const CompareReport& a, const CompareReport& b) {
  const auto oa = run_options(a), ob = run_options(b);
  std::map<std::string, std::pair<std::string, std::string>> diff;
  for (const auto& [key, value] : oa) {
    const auto it = ob.find(key);
    if (it == ob.end() || it->second != value)
      diff[key] = {value, it == ob.end() ? "(absent)" : it->second};
  }
  for (const auto& [key, value] : ob)
    if (oa.find(key) == oa.end()) diff[key] = {"(absent)", value};
  nlohmann::ordered_json out = nlohmann::ordered_json::array();
  for (const auto& [key, values] : diff)
    out.push_back({{"option", key}, {"a", values.first}, {"b", values.second}});
  return out;
}

nlohmann::ordered_json figures_json(const ArmFigures& f) {
  return {{"best_bind_ms", f.bind_min_ms},
          {"median_upload_gbps", f.upload_gbps},
          {"median_alloc_ms", f.alloc_ms},
          {"median_reduction", f.reduction}};
}

void compare_reports(const std::string& path_a, const std::string& path_b,
                     const ReportArgs& report) {
  check_report_args(report);
  const CompareReport a = read_compare_report(path_a);
  const CompareReport b = read_compare_report(path_b);
  // Every figure is read before anything is printed: a bad report prints no table.
  std::vector<std::pair<ArmFigures, ArmFigures>> figures;
  for (const std::string& arm : a.arms)
    figures.emplace_back(arm_figures(a, arm), arm_figures(b, arm));
  const nlohmann::ordered_json differ = differing_options(a, b);
  FILE* out = text_out(report);
  chatter(report, "%s\n%s\n", source_line("A", a).c_str(), source_line("B", b).c_str());
  std::fprintf(out, "options that differ:%s\n", differ.empty() ? " none" : "");
  for (const auto& d : differ)
    std::fprintf(out, "  %s: %s (A) vs %s (B)\n", d["option"].get<std::string>().c_str(),
                 d["a"].get<std::string>().c_str(), d["b"].get<std::string>().c_str());
  std::fprintf(out, "\n%-9s %-22s %12s %12s %9s\n", "arm", "figure", "A", "B", "B vs A");
  nlohmann::ordered_json arms = nlohmann::ordered_json::array();
  for (size_t i = 0; i < a.arms.size(); ++i) {
    const std::string& arm = a.arms[i];
    const auto& [fa, fb] = figures[i];
    if (!fb.found) {
      std::fprintf(out, "%-9s only in A\n", arm.c_str());
      arms.push_back({{"arm", arm}, {"a", figures_json(fa)}, {"b", nullptr}});
      continue;
    }
    arms.push_back({{"arm", arm}, {"a", figures_json(fa)}, {"b", figures_json(fb)}});
    std::fprintf(out, "%-9s %-22s %12.2f %12.2f %9s\n", arm.c_str(), "best bind ms", fa.bind_min_ms,
                 fb.bind_min_ms, change(fa.bind_min_ms, fb.bind_min_ms, 2).c_str());
    std::fprintf(out, "%-9s %-22s %12.2f %12.2f %9s\n", "", "upload GB/s (median)", fa.upload_gbps,
                 fb.upload_gbps, change(fa.upload_gbps, fb.upload_gbps, 2).c_str());
    std::fprintf(out, "%-9s %-22s %12.3f %12.3f %9s\n", "", "alloc ms (median)", fa.alloc_ms,
                 fb.alloc_ms, change(fa.alloc_ms, fb.alloc_ms, 3).c_str());
    std::fprintf(out, "%-9s %-22s %11.1f%% %11.1f%%\n", "", "faster than reference",
                 fa.reduction * 100, fb.reduction * 100);
  }
  for (const std::string& arm : b.arms)
    if (std::find(a.arms.begin(), a.arms.end(), arm) == a.arms.end()) {
      std::fprintf(out, "%-9s only in B\n", arm.c_str());
      arms.push_back({{"arm", arm}, {"a", nullptr}, {"b", figures_json(arm_figures(b, arm))}});
    }
  std::fflush(out);
  write_report(
      report, {{"a", path_a}, {"b", path_b}, {"differing_options", differ}, {"arms", arms}},
      collect_run_info(nullptr, {{"command", "bench compare"}, {"A", path_a}, {"B", path_b}}));
}

}  // namespace

void add_bench_compare_command(CLI::App& bench) {
  struct Args {
    std::vector<std::string> files;
    ReportArgs report;
  };
  auto a = command_values<Args>();
  CLI::App* cmd = bench.add_subcommand(
      "compare", "Side-by-side change between two bench reports, the options that differ first");
  cmd->add_option("REPORTS", a->files, "A.json B.json")
      ->required()
      ->expected(2)
      ->check(CLI::ExistingFile);
  add_report_options(*cmd, a->report);
  cmd->callback([a] { compare_reports(a->files.at(0), a->files.at(1), a->report); });
}

void add_report_commands(CLI::App& app) { add_plot_command(app); }

}  // namespace pinstage::cli
