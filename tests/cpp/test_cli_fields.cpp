// The CLI's flags from the field lists (apps/pinstage/cli_fields.h): every field a command
// exposes has its flag in that command's --help with the list's doc, docs/cli.md's table
// is the lists', the values reach the options and bad ones are refused naming the flag.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "cli_fields.h"
#include "cli_test_util.h"
#include "temp_dir_test_util.h"

namespace {

using pinstage::cli::FieldFlags;

struct Field {
  std::string list, name, doc;
};

// Each list's fields as the headers give them: the test's own reading of the X-macros.
std::vector<Field> fields_of(const std::string& list) {
  std::vector<Field> out;
#define BIND_(type, name, value, doc) out.push_back({"BindOptions", #name, doc});
#define LOAD_(type, name, value, doc) out.push_back({"CheckpointLoadOptions", #name, doc});
#define WORKER_(type, name, value, doc) out.push_back({"WorkerOptions", #name, doc});
  if (list == "BindOptions") {
    PINSTAGE_BIND_OPTION_FIELDS(BIND_)
  } else if (list == "CheckpointLoadOptions") {
    PINSTAGE_CHECKPOINT_LOAD_OPTION_FIELDS(LOAD_)
  } else {
    PINSTAGE_WORKER_OPTION_FIELDS(WORKER_)
  }
#undef BIND_
#undef LOAD_
#undef WORKER_
  return out;
}

// Which fields of which list each command exposes (cli_fields.h's selections).
struct Exposed {
  std::string command, list;
  const FieldFlags* which;
};
const std::vector<Exposed>& exposed() {
  using namespace pinstage::cli;
  // Each command's own list, then the worker flags every command with --backend has.
  static const std::vector<Exposed> rows = [] {
    std::vector<Exposed> r = {{"bench synthetic", "BindOptions", &kBenchBindFlags},
                              {"bench qwen3-decode", "BindOptions", &kBenchBindFlags},
                              {"scene qwen3-decode", "BindOptions", &kSceneBindFlags},
                              {"load", "CheckpointLoadOptions", &kLoadFlags},
                              {"bench load", "CheckpointLoadOptions", &kReadFlags},
                              {"hash", "CheckpointLoadOptions", &kReadFlags}};
    for (const char* command : {"bench synthetic", "bench qwen3-decode", "scene qwen3-decode",
                                "load", "bench load", "demo"})
      r.push_back({command, "WorkerOptions", &kWorkerFlags});
    return r;
  }();
  return rows;
}

struct Result {
  int status = -1;
  std::string out, all;  // stdout; stdout then stderr
};

// `pinstage <args>`; stderr after stdout, or into the file `err` (then read back into all).
Result run(const std::string& args, const std::string& err = "") {
  const pinstage::test::CommandResult c = pinstage::test::run_command(
      std::string(PINSTAGE_CLI_PATH) + " " + args + (err.empty() ? " 2>&1" : " 2>" + err));
  Result r{c.status, c.output, c.output};
  if (!err.empty()) {
    std::ifstream in(err);
    r.all += std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  }
  return r;
}

// A flag's entry in --help: its line up to the next option's.
std::string entry(const std::string& help, const std::string& flag) {
  const std::regex line("\n  " + flag + "[ ,]");
  std::smatch m;
  if (!std::regex_search(help, m, line)) return {};
  const size_t start = static_cast<size_t>(m.position(0)) + 1;
  const size_t next = help.find("\n  -", start);
  return help.substr(start, next == std::string::npos ? std::string::npos : next - start);
}

TEST(CliFields, EveryExposedFieldHasItsFlagWithTheListsDoc) {
  std::map<std::string, std::string> helps;
  for (const Exposed& e : exposed()) {
    if (!helps.count(e.command)) {
      const Result r = run(e.command + " --help");
      ASSERT_EQ(r.status, 0) << e.command << "\n" << r.all;
      helps[e.command] = r.out;
    }
    size_t shown = 0;
    for (const Field& f : fields_of(e.list)) {
      SCOPED_TRACE(e.command + ": " + f.list + "::" + f.name);
      const std::string text = entry(helps[e.command], pinstage::cli::flag_of(f.name));
      if (!e.which->exposes(f.name)) {
        EXPECT_EQ(text, "") << "a flag the command does not expose";
        continue;
      }
      ++shown;
      ASSERT_NE(text, "") << helps[e.command];
      EXPECT_NE(text.find(pinstage::cli::field_doc(f.doc)), std::string::npos) << text;
    }
    EXPECT_GT(shown, 0u) << e.command << " shows no field of " << e.list;
  }
}

// docs/cli.md's table between its markers: flag, field, commands, meaning.
std::vector<std::vector<std::string>> docs_rows() {
  std::ifstream in(PINSTAGE_DOCS_CLI);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t start = text.find("<!-- cli field flags: start -->");
  const size_t end = text.find("<!-- cli field flags: end -->");
  EXPECT_NE(start, std::string::npos) << "docs/cli.md lost its table markers";
  EXPECT_NE(end, std::string::npos);
  std::vector<std::vector<std::string>> rows;
  if (start == std::string::npos || end == std::string::npos) return rows;
  std::istringstream lines(text.substr(start, end - start));
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("| `", 0) != 0) continue;
    std::vector<std::string> cells;
    for (size_t at = 1; at < line.size();) {
      const size_t bar = line.find(" | ", at);
      std::string cell = line.substr(at, (bar == std::string::npos ? line.size() - 2 : bar) - at);
      cell.erase(0, cell.find_first_not_of(' '));
      cells.push_back(cell);
      at = bar == std::string::npos ? line.size() : bar + 2;
    }
    rows.push_back(cells);
  }
  return rows;
}

TEST(CliFields, DocsTableIsTheLists) {
  std::vector<std::vector<std::string>> want;
  for (const std::string list : {"BindOptions", "CheckpointLoadOptions", "WorkerOptions"})
    for (const Field& f : fields_of(list)) {
      std::string commands;
      for (const Exposed& e : exposed()) {
        // "bench synthetic" and "bench qwen3-decode" are `bench`, a scene's `scene`.
        const std::string name = e.command.substr(
            0, e.command == "bench load" ? std::string::npos : e.command.find(' '));
        if (e.list == list && e.which->exposes(f.name) &&
            (", " + commands + ", ").find(", " + name + ", ") == std::string::npos)
          commands += (commands.empty() ? "" : ", ") + name;
      }
      if (commands.empty()) continue;
      want.push_back({"`" + pinstage::cli::flag_of(f.name) + "`", "`" + list + "::" + f.name + "`",
                      commands, pinstage::cli::field_doc(f.doc)});
    }
  std::string table;  // what the docs should say, printed when they do not
  for (const auto& row : want)
    table += "| " + row[0] + " | " + row[1] + " | " + row[2] + " | " + row[3] + " |\n";
  const auto rows = docs_rows();
  ASSERT_EQ(rows.size(), want.size()) << "docs/cli.md's table should be:\n" << table;
  for (size_t i = 0; i < want.size(); ++i)
    EXPECT_EQ(rows[i], want[i]) << "row " << i << ":\n" << table;
}

// A bad value is refused while the line is parsed, naming the flag and what it takes.
TEST(CliFields, BadValuesAreRefusedNamingTheFlag) {
  const struct {
    const char* args;
    const char* says;
  } cases[] = {
      {"bench synthetic --staging-buffer-bytes 2G",
       "--staging-buffer-bytes='2G' is not valid: expected a byte count in [1, 1073741824]"},
      {"bench synthetic --staging-buffer-bytes 8X", "--staging-buffer-bytes='8X' is not valid"},
      {"bench synthetic --arena-alignment 3",
       "--arena-alignment='3' is not valid: expected a power of two in [1, 4096]"},
      {"bench synthetic --arena-alignment 5000",
       "--arena-alignment='5000' is not valid: expected a power of two in [1, 4096]"},
      {"bench synthetic --copy-threads -1", "--copy-threads='-1' is not valid"},
      {"scene qwen3-decode --layout slab", "--layout: slab not in {arena,per_tensor}"},
      {"load x --mode mmap", "--mode: mmap not in {copy,map}"},
      {"load x --ring-buffers 1", "--ring-buffers='1' is not valid: must be in [2, "},
      {"load x --cache sometimes", "--cache: sometimes not in {off,use,fill}"},
      {"load x --mode copy --map", "--mode excludes --map"},
      {"load x --chunk-bytes 8M --chunk-mib 4", "--chunk-bytes excludes --chunk-mib"},
      {"load x --host-numa-node -1", "--host-numa-node='-1' is not valid: must be in [0, "},
      {"demo --config a=1 --backend-option a=2", "--config='a=2' is not valid"},
  };
  for (const auto& c : cases) {
    const Result r = run(std::string("--dry-run ") + c.args);
    EXPECT_EQ(r.status, 1) << c.args << "\n" << r.all;
    EXPECT_NE(r.all.find(c.says), std::string::npos) << c.args << "\n" << r.all;
    EXPECT_EQ(r.all.find("parsed; nothing was run"), std::string::npos) << r.all;
  }
  for (const char* good : {"scene qwen3-decode --layout PER_TENSOR --upload Staged",
                           "load x --mode MAP --cache Use --ring-bytes 1G --ring-buffers 8",
                           "demo --host-cache-limit-bytes 0 --device-capacity-bytes 1G"}) {
    const Result r = run(std::string("--dry-run ") + good);
    EXPECT_EQ(r.status, 0) << good << "\n" << r.all;
  }
}

// In process: each set's flags write its struct, by type.
TEST(CliFields, ParsedValuesLandInTheOptions) {
  using namespace pinstage;
  CLI::App app;
  BindOptions bind;
  CheckpointLoadOptions load;
  WorkerOptions worker;
  cli::add_bind_option_flags(app, bind, cli::kSceneBindFlags);
  cli::add_load_option_flags(app, load, {{"chunk_bytes"}, true});
  cli::add_worker_option_flags(app, worker, cli::kWorkerFlags);
  app.parse(
      "--layout PER_TENSOR --upload staged --staging-buffer-bytes 2M --chunk-bytes 4096 "
      "--arena-alignment 64 --copy-threads 3 --mode map --cache fill --ring-bytes 1G "
      "--ring-buffers 8 --verify --direct --threads 2 --config a=1 --backend-option b=2 "
      "--host-numa-node 0 --host-cache-limit-bytes 0 --device-capacity-bytes 1G",
      false);
  EXPECT_EQ(bind.layout, DeviceLayout::per_tensor);
  EXPECT_EQ(bind.upload, UploadPath::staged);
  EXPECT_EQ(bind.staging_buffer_bytes, size_t{2} << 20);
  EXPECT_EQ(bind.chunk_bytes, 4096u);
  EXPECT_EQ(bind.arena_alignment, 64u);
  EXPECT_EQ(bind.copy_threads, 3);
  EXPECT_EQ(load.mode, LoadMode::map);
  EXPECT_EQ(load.cache, CacheUse::fill);
  EXPECT_EQ(load.ring_bytes, uint64_t{1} << 30);
  EXPECT_EQ(load.ring_buffers, 8u);
  EXPECT_TRUE(load.verify && load.direct && !load.verify_if_present);
  EXPECT_EQ(load.threads, 2);
  EXPECT_EQ(worker.config, (BackendConfig{{"a", "1"}, {"b", "2"}}));
  EXPECT_EQ(worker.host_numa_node, 0);
  EXPECT_EQ(worker.host_cache_limit_bytes, uint64_t{0});
  EXPECT_EQ(worker.device_capacity_bytes, uint64_t{1} << 30);
}

// A selection naming a field its list lacks (a renamed field) fails, naming it.
TEST(CliFields, ASelectionNamingAFieldTheListLacksIsRefused) {
  CLI::App app;
  pinstage::BindOptions bind;
  try {
    pinstage::cli::add_bind_option_flags(app, bind, FieldFlags{{"staging_buffer_count"}});
    ADD_FAILURE() << "accepted";
  } catch (const pinstage::Error& e) {
    EXPECT_EQ(e.code(), pinstage::ErrorCode::internal);
    EXPECT_NE(std::string(e.what()).find("'staging_buffer_count'"), std::string::npos) << e.what();
  }
}

class CliFieldValues : public pinstage::test::TempDirTest {
 protected:
  CliFieldValues() : TempDirTest("cli_fields") {}
};

// The generated flag and its older spelling give the options the same value.
TEST_F(CliFieldValues, TheFlagsAndTheirAliasesReachTheOptions) {
  const std::string bench =
      "bench synthetic --tensors 1 --bytes 4K --groups 1 --rounds 2 --no-baseline --no-plot "
      "--arms staged -q --json - ";
  for (const auto& [flag, bytes] : std::vector<std::pair<std::string, uint64_t>>{
           {"--staging-buffer-bytes 3M --staging-buffers 3", 3u << 20},
           {"--staging-buffer-mib 2 --staging-buffers 3", 2u << 20}}) {
    const Result r = run(bench + flag, path("err"));
    ASSERT_EQ(r.status, 0) << flag << "\n" << r.all;
    const auto config = nlohmann::json::parse(r.out)["config"];
    EXPECT_EQ(config["staging_buffer_bytes"], bytes) << flag;
    EXPECT_EQ(config["staging_buffers"], 3) << flag;
  }
  // A checkpoint of one tensor, written by hand.
  const std::string ckpt = path("m.safetensors");
  const std::string header = R"({"w":{"dtype":"F32","shape":[1024],"data_offsets":[0,4096]}})";
  std::string file(8, '\0');
  for (int i = 0; i < 8; ++i) file[i] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
  std::ofstream(ckpt, std::ios::binary) << file + header + std::string(4096, '\1');
  for (const char* mode : {"--mode map", "--map", "--mode copy", ""}) {
    const Result r = run("load " + ckpt + " " + mode + " -q --json -", path("err"));
    ASSERT_EQ(r.status, 0) << mode << "\n" << r.all;
    const auto doc = nlohmann::json::parse(r.out);
    EXPECT_EQ(doc["mode"], std::string(mode).find("map") != std::string::npos ? "map" : "copy");
  }
}

}  // namespace
