// pinstage: the command-line front end. `pinstage --help` lists the subcommands.
#include <cstdio>
#include <exception>
#include <string_view>

#include "commands.h"
#include "pinstage/atomic_file.h"
#include "pinstage/error.h"
#include "pinstage/settings.h"
#include "pinstage/version.h"

namespace {

// Every command's callback replaced by one that only says the line parsed: what --dry-run
// runs instead of the work.
void make_dry(CLI::App& app) {
  for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) {
    if (sub->get_subcommands([](CLI::App*) { return true; }).empty())
      sub->callback([sub] {
        std::string path = sub->get_name();
        for (const CLI::App* p = sub->get_parent(); p && p->get_parent(); p = p->get_parent())
          path = p->get_name() + " " + path;
        std::printf("pinstage --dry-run: '%s' parsed; nothing was run\n", path.c_str());
      });
    make_dry(*sub);
  }
}

int run(int argc, char** argv) {
  CLI::App app{"pinstage: stage a large model's arguments onto an accelerator at link speed"};
  app.require_subcommand(1);
  bool dry_run = false;
  app.add_flag("--dry-run", dry_run,
               "Parse and check the command line (option names, numbers, ranges), then exit "
               "without running the command: how the docs tests run a long benchmark's line");
  // Known before parsing (CLI11 runs callbacks while it parses): only as the first argument.
  const bool dry = argc > 1 && std::string_view(argv[1]) == "--dry-run";
  // `pinstage --version` -> "pinstage 0.2.0": the loaded library's version (version.h).
  app.set_version_flag("--version", std::string("pinstage ") + pinstage::version(),
                       "Print the pinstage version and exit");
  pinstage::cli::add_info_command(app);
  pinstage::cli::add_demo_command(app);
  pinstage::cli::add_fixture_command(app);
  pinstage::cli::add_bench_command(app);
  pinstage::cli::add_scene_command(app);
  pinstage::cli::add_report_commands(app);
  pinstage::cli::add_load_command(app);
  pinstage::cli::add_hash_command(app);
  pinstage::cli::add_cache_command(app);
  if (dry) make_dry(app);
  try {
    pinstage::check_settings();  // a bad PINSTAGE_* variable is reported before any work
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // One exit status for every failure (docs/cli.md): 0 for --help and --version, 1 for
    // a bad option as for a failed run, whatever CLI11's own code is.
    return app.exit(e) == 0 ? 0 : 1;
  } catch (const pinstage::Error& e) {
    std::fprintf(stderr, "pinstage: error [%s]: %s\n", pinstage::error_code_name(e.code()),
                 e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "pinstage: error: %s\n", e.what());
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // Ctrl-C or a kill during `fixture --out` leaves no .tmp-XXXXXX file behind.
  pinstage::remove_temporary_files_on_signals();
  return pinstage::run_main("pinstage", run, argc, argv);
}
