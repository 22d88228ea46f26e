// pinstage cache [put PATH | ls | rm KEY|PATH | prune [--max-bytes N]]: the restart cache
// (docs/cache.md) in PINSTAGE_CACHE_DIR; alone, what the cache directory is.
#include <ctime>
#include <memory>
#include <string>

#include "cli_common.h"
#include "commands.h"
#include "pinstage/cache.h"
#include "pinstage/clock.h"
#include "pinstage/settings.h"

namespace pinstage::cli {

namespace {

struct CacheArgs {
  std::string target;     // put: the checkpoint; rm: a key or a checkpoint path
  std::string max_bytes;  // put, prune: a byte count ("8G"), empty when not given
  int threads = 0;
  ReportArgs report;
  CLI::App* cmd = nullptr;
  void write(nlohmann::ordered_json doc) const {
    write_report(report, std::move(doc), collect_run_info(nullptr, command_options(*cmd)));
  }
};

// `cache` or one of its subcommands, with --json and --quiet, running `run` on its values
// (unless a subcommand of it ran: `cache put` is not also `cache`).
std::shared_ptr<CacheArgs> add_cache_sub(CLI::App& parent, const char* name, const char* about,
                                         void (*run)(const CacheArgs&)) {
  auto a = command_values<CacheArgs>();
  a->cmd = parent.add_subcommand(name, about);
  add_report_options(*a->cmd, a->report);
  a->cmd->callback([a, run] {
    if (!a->cmd->get_subcommands().empty()) return;
    check_report_args(a->report);
    run(*a);
  });
  return a;
}

std::optional<uint64_t> max_bytes_of(const CacheArgs& a) {
  if (a.max_bytes.empty()) return std::nullopt;
  return parse_byte_count(a.max_bytes, "--max-bytes");
}

// "2026-12-07 14:03:34 UTC", or "-" for none.
std::string utc(int64_t ns) {
  if (ns <= 0) return "-";
  const std::time_t s = static_cast<std::time_t>(ns / 1'000'000'000);
  std::tm tm{};
  char text[40];
  ::gmtime_r(&s, &tm);
  std::strftime(text, sizeof text, "%Y-%m-%d %H:%M:%S UTC", &tm);
  return text;
}

// "4 KiB", "2 MiB": a page size, in the binary units pages come in.
std::string page_text(uint64_t bytes) {
  return bytes >= (uint64_t{1} << 20) ? std::to_string(bytes >> 20) + " MiB"
                                      : std::to_string(bytes >> 10) + " KiB";
}

// What `pinstage cache` says of the pages: "2 MiB pages", "4 KiB pages, huge=within_size
// (2 MiB pages where a file's size allows)", "4 KiB pages, huge=never".
std::string pages_text(const CacheDirInfo& i) {
  std::string text = page_text(i.page_bytes) + " pages";
  if (i.huge == "hugetlbfs") return text;
  text += ", huge=" + i.huge;
  if (i.huge == "within_size" || i.huge == "always")
    text += " (2 MiB pages where a file's size allows)";
  return text;
}

void run_info(const CacheArgs& a) {
  const CacheDirInfo i = WeightCache::open().info();
  FILE* out = text_out(a.report);
  std::fprintf(out, "cache %s\n  %s, %s\n  %s in %zu entries, %s free\n", i.path.c_str(),
               i.fs.c_str(), pages_text(i).c_str(), format_bytes(i.used_bytes).c_str(), i.entries,
               format_bytes(i.free_bytes).c_str());
  if (i.fs == "tmpfs" && i.huge != "within_size" && i.huge != "always")
    chatter(a.report,
            "  hint: 4 KiB pages map and lock slowly; for 2 MiB pages with no reservation, "
            "mount -t tmpfs -o huge=within_size,size=8G,mode=0700 none DIR and set "
            "PINSTAGE_CACHE_DIR=DIR (docs/cache.md#tmpfs-with-huge-pages-no-reservation)\n");
  nlohmann::ordered_json doc;
  put_fields(doc, report_fields(i));
  a.write(doc);
}

void run_put(const CacheArgs& a) {
  CacheFillOptions o;
  o.threads = a.threads;
  if (const std::optional<uint64_t> limit = max_bytes_of(a)) o.max_bytes = *limit;
  WeightCache cache = WeightCache::open();
  const Checkpoint c = Checkpoint::open(a.target);
  const Stopwatch clock;
  CacheLookup l;
  {
    ProgressBar bar(a.report);
    o.progress = progress_of(bar);
    l = cache.fill(c, o);
  }
  const double s = clock.seconds();
  std::fprintf(text_out(a.report), "%s %s: %s\n", l.state == "hit" ? "cached already" : "filled",
               a.target.c_str(), l.entry_path.c_str());
  if (l.state == "filled")
    chatter(a.report, "  %s in %.3f s (%.2f GB/s)\n", format_bytes(c.total_bytes()).c_str(), s,
            s > 0 ? static_cast<double>(c.total_bytes()) / s / 1e9 : 0.0);
  a.write({{"path", a.target},
           {"state", l.state},
           {"key", l.key},
           {"entry_path", l.entry_path},
           {"bytes", c.total_bytes()},
           {"seconds", s}});
}

void run_ls(const CacheArgs& a) {
  const WeightCache cache = WeightCache::open();
  const std::vector<CacheEntryInfo> entries = cache.list();
  FILE* out = text_out(a.report);
  chatter(a.report, "cache %s\n", cache.path().c_str());
  nlohmann::ordered_json list = nlohmann::ordered_json::array();
  for (const CacheEntryInfo& e : entries) {
    std::fprintf(out, "%-16s  %-5s  %10s  %s  %s%s%s\n", e.key.c_str(), e.state.c_str(),
                 format_bytes(e.bytes).c_str(), utc(e.last_use_ns).c_str(), e.source.c_str(),
                 e.reason.empty() ? "" : "  # ", e.reason.c_str());
    nlohmann::ordered_json entry;
    put_fields(entry, report_fields(e));
    list.push_back(entry);
  }
  if (entries.empty()) chatter(a.report, "  (empty)\n");
  a.write({{"path", cache.path()}, {"entries", list}});
}

void run_rm(const CacheArgs& a) {
  WeightCache::open().remove(a.target);
  chatter(a.report, "removed the cache entry of %s\n", a.target.c_str());
  a.write({{"removed", a.target}});
}

void run_prune(const CacheArgs& a) {
  // "0": every entry no fill holds (a byte count is otherwise at least 1).
  const std::optional<uint64_t> limit = a.max_bytes == "0" ? 0 : max_bytes_of(a);
  const CachePruneReport r = WeightCache::open().prune(limit);
  std::fprintf(text_out(a.report),
               "pruned %s: %zu leftover temporaries, %zu stale, %zu least recently used\n",
               format_bytes(r.freed_bytes).c_str(), r.temps, r.stale, r.evicted);
  nlohmann::ordered_json doc;
  put_fields(doc, report_fields(r));
  a.write(doc);
}

}  // namespace

void add_cache_command(CLI::App& app) {
  CLI::App* cache = add_cache_sub(app, "cache",
                                  "The restart cache of checkpoints in PINSTAGE_CACHE_DIR "
                                  "(hugetlbfs or tmpfs): alone, which file system and page "
                                  "size it uses and what it holds",
                                  run_info)
                        ->cmd;
  cache->require_subcommand(0, 1);
  auto put = add_cache_sub(*cache, "put", "Fill the entry of a checkpoint (a hit stays)", run_put);
  put->cmd->add_option("PATH", put->target, "A .safetensors file, or a directory of shards")
      ->required();
  put->cmd->add_option("--max-bytes", put->max_bytes,
                       "Refuse the fill when the cache would hold more than this (8G, 512M)");
  add_integer_option(*put->cmd, "--threads", put->threads, "Copy threads (0 = all cores)", 0,
                     kLoadMaxThreads);
  add_cache_sub(*cache, "ls", "List the entries, their state and last use", run_ls);
  auto rm = add_cache_sub(*cache, "rm", "Remove an entry (safe for a process mapping it)", run_rm);
  rm->cmd->add_option("KEY_OR_PATH", rm->target, "The entry's key, or its checkpoint's path")
      ->required();
  auto prune = add_cache_sub(*cache, "prune",
                             "Remove leftover temporaries and stale entries, then the least "
                             "recently used until under --max-bytes",
                             run_prune);
  prune->cmd->add_option("--max-bytes", prune->max_bytes,
                         "The size to prune to (8G, 512M; 0 removes every entry)");
}

}  // namespace pinstage::cli
