// Commands that read reports: `pinstage plot REPORT.json` (the picture, drawn by the
// Python module pinstage.plot with matplotlib) and `pinstage bench compare A.json B.json`.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli_common.h"
#include "commands.h"
#include "pinstage/error.h"
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

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw Error(ErrorCode::io, "cannot read '" + path + "'");
  try {
    return nlohmann::json::parse(in);
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
  };
  auto a = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand(
      "plot",
      "Draw a bench report: bind latency and upload GB/s per group and arm, and the "
      "bind phases per arm (needs python3-matplotlib)");
  cmd->add_option("REPORT", a->report, "A report from pinstage bench --json")
      ->required()
      ->check(CLI::ExistingFile);
  cmd->add_option("--out", a->out, "The PNG to write (default: REPORT with .png)");
  cmd->callback([a] {
    const std::string out = a->out.empty() ? plot_path_for(a->report) : a->out;
    check_out_option("--out", out);
    std::string why;
    if (!plot_report(a->report, out, why)) throw Error(ErrorCode::io, "plot failed: " + why);
    std::printf("picture: %s\n", out.c_str());
  });
}

// One arm's figures from a report's summary.
struct ArmFigures {
  double bind_min_ms = 0, upload_gbps = 0, alloc_ms = 0, reduction = 0;
  bool found = false;
};

ArmFigures arm_figures(const nlohmann::json& doc, const std::string& arm) {
  ArmFigures f;
  for (const auto& a : doc.at("summary").at("arms")) {
    if (a.at("arm") != arm) continue;
    f.found = true;
    f.bind_min_ms = a.at("min_seconds").get<double>() * 1e3;
    f.upload_gbps = a.value("median_upload_gbps", 0.0);
    f.alloc_ms = a.value("median_alloc_seconds", 0.0) * 1e3;
    f.reduction = a.value("median_reduction", 0.0);
  }
  return f;
}

std::string change(double before, double after) {
  if (before <= 0.0) return "-";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%+.1f%%", (after / before - 1.0) * 100.0);
  return buf;
}

void compare_reports(const std::string& path_a, const std::string& path_b) {
  const nlohmann::json a = read_json(path_a);
  const nlohmann::json b = read_json(path_b);
  for (const auto* doc : {&a, &b})
    if (!doc->contains("summary") || !doc->contains("config"))
      throw Error(ErrorCode::invalid_argument,
                  "bench compare: both files must be reports of pinstage bench --json");
  const auto run_line = [](const char* tag, const nlohmann::json& d, const std::string& p) {
    const nlohmann::json run = d.value("run", nlohmann::json::object());
    std::printf("%s: %s  (%s, %s on %s, pinstage %s)\n", tag, p.c_str(),
                run.value("utc_time", "?").c_str(), d["config"].value("backend", "?").c_str(),
                run.value("host", "?").c_str(), run.value("pinstage_version", "?").c_str());
  };
  run_line("A", a, path_a);
  run_line("B", b, path_b);
  std::printf("\n%-9s %-22s %12s %12s %9s\n", "arm", "figure", "A", "B", "B vs A");
  for (const auto& arm_entry : a["config"]["arms"]) {
    const std::string arm = arm_entry.get<std::string>();
    const ArmFigures fa = arm_figures(a, arm), fb = arm_figures(b, arm);
    if (!fb.found) {
      std::printf("%-9s only in A\n", arm.c_str());
      continue;
    }
    std::printf("%-9s %-22s %12.2f %12.2f %9s\n", arm.c_str(), "best bind ms", fa.bind_min_ms,
                fb.bind_min_ms, change(fa.bind_min_ms, fb.bind_min_ms).c_str());
    std::printf("%-9s %-22s %12.2f %12.2f %9s\n", "", "upload GB/s (median)", fa.upload_gbps,
                fb.upload_gbps, change(fa.upload_gbps, fb.upload_gbps).c_str());
    std::printf("%-9s %-22s %12.2f %12.2f %9s\n", "", "alloc ms (median)", fa.alloc_ms, fb.alloc_ms,
                change(fa.alloc_ms, fb.alloc_ms).c_str());
    std::printf("%-9s %-22s %11.1f%% %11.1f%%\n", "", "faster than reference", fa.reduction * 100,
                fb.reduction * 100);
  }
}

}  // namespace

void add_bench_compare_command(CLI::App& bench) {
  auto files = std::make_shared<std::vector<std::string>>();
  CLI::App* cmd = bench.add_subcommand("compare", "Side-by-side change between two bench reports");
  cmd->add_option("REPORTS", *files, "A.json B.json")
      ->required()
      ->expected(2)
      ->check(CLI::ExistingFile);
  cmd->callback([files] { compare_reports(files->at(0), files->at(1)); });
}

void add_report_commands(CLI::App& app) { add_plot_command(app); }

}  // namespace pinstage::cli
