// The host-memory provider (issue 46; docs/worker.md, "Host sources" and "Placement"): every
// source on sim and on sim variants that pin as other backends do (tests/cpp/plugins/
// pin_variants.cpp), the placement (the one huge-page switch, the stall watch), a fill by
// a load's readers pinned behind them, copy-on-write, and the fault sweep over every source.
// Locks, mappings and huge pages are read from /proc, not through pinstage.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "host_source_checks.h"
#include "lock_test_util.h"
#include "pinstage/checkpoint.h"
#include "pinstage/error.h"
#include "pinstage/pages.h"
#include "pinstage/safetensors.h"
#include "pinstage/tensor.h"
#include "pinstage/worker.h"
#include "runtime/host_memory/host_source.h"
#include "runtime/host_memory/placement.h"
#include "temp_dir_test_util.h"
#include "tensor_test_util.h"

namespace pinstage {
namespace {

namespace fs = std::filesystem;
using test::error_of;

constexpr size_t kMiB = size_t{1} << 20;

using test::ScopedEnv;

bool thp_never() {
  std::ifstream in("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string line;
  std::getline(in, line);
  return line.empty() || line.find("[never]") != std::string::npos;
}

WorkerOptions plugin(const std::string& name) {
  WorkerOptions o;
  o.plugin_path = std::string(PINSTAGE_TEST_PLUGIN_DIR) + "/lib" + name + ".so";
  return o;
}

// ---- the placement ----

class Placement : public test::TempDirTest {
 protected:
  Placement() : TempDirTest("placement") {}
  // A transparent_hugepage folder saying `enabled` and `defrag`.
  std::string thp_root(const std::string& enabled, const std::string& defrag = "[madvise]") {
    std::ofstream(path("enabled")) << enabled << "\n";
    std::ofstream(path("defrag")) << defrag << "\n";
    return dir_.string();
  }
};

TEST_F(Placement, TheOneSwitchAndTheKernelDecideHugePages) {
  const std::string madvise = thp_root("always [madvise] never");
  {
    const ScopedEnv unset("PINSTAGE_HOST_HUGE_PAGES", nullptr);
    const runtime::HostPlacement p = runtime::decide_placement(-1, madvise);
    EXPECT_TRUE(p.huge_pages) << p.huge_reason;
    EXPECT_TRUE(p.huge_needs_free_blocks) << "auto takes them only where blocks are free";
    EXPECT_NE(p.huge_reason.find("'madvise'"), std::string::npos) << p.huge_reason;
  }
  {
    const ScopedEnv off("PINSTAGE_HOST_HUGE_PAGES", "off");
    const runtime::HostPlacement p = runtime::decide_placement(-1, madvise);
    EXPECT_FALSE(p.huge_pages);
    EXPECT_EQ(p.huge_reason, "PINSTAGE_HOST_HUGE_PAGES=off");
    EXPECT_FALSE(p.map_options(64 * kMiB, true).huge_pages);
  }
  {
    const ScopedEnv thp("PINSTAGE_HOST_HUGE_PAGES", "thp");
    const runtime::HostPlacement p = runtime::decide_placement(-1, madvise);
    EXPECT_TRUE(p.huge_pages);
    EXPECT_FALSE(p.huge_needs_free_blocks);
    EXPECT_TRUE(p.map_options(64 * kMiB, true).huge_pages);
    EXPECT_FALSE(p.map_options(kMiB, true).huge_pages) << "under 2 MiB: base pages";
    const runtime::HostPlacement never =
        runtime::decide_placement(-1, thp_root("always madvise [never]"));
    EXPECT_FALSE(never.huge_pages);
    EXPECT_NE(never.huge_reason.find("'never'"), std::string::npos) << never.huge_reason;
  }
  const ScopedEnv bad("PINSTAGE_HOST_HUGE_PAGES", "yes");
  const Error e = error_of([&] { runtime::decide_placement(-1, madvise); });
  EXPECT_EQ(e.code(), ErrorCode::invalid_argument);
  EXPECT_NE(std::string(e.what()).find("auto|thp|off"), std::string::npos) << e.what();
}

TEST_F(Placement, TheStallLimitComesFromItsSettingStrictly) {
  const std::string root = thp_root("[always] madvise never");
  {
    const ScopedEnv ms("PINSTAGE_HOST_HUGE_STALL_MS", "7");
    EXPECT_DOUBLE_EQ(runtime::decide_placement(-1, root).stall_seconds, 0.007);
  }
  {
    const ScopedEnv zero("PINSTAGE_HOST_HUGE_STALL_MS", "0");  // any cost is a stall
    const double s = runtime::decide_placement(-1, root).stall_seconds;
    EXPECT_GT(s, 0.0);
    EXPECT_LT(s, 1e-6);
  }
  for (const char* bad : {"-1", "60001", "5ms", ""}) {
    const ScopedEnv v("PINSTAGE_HOST_HUGE_STALL_MS", bad);
    EXPECT_EQ(error_of([&] { runtime::decide_placement(-1, root); }).code(),
              ErrorCode::invalid_argument)
        << bad;
  }
}

// A huge fault past the stall limit gives the rest of the segment base pages, and says so;
// with no limit the segment keeps its huge pages (so the check can fail).
TEST(HugePages, AStalledFaultGivesTheRestOfTheSegmentBasePages) {
  if (thp_never()) GTEST_SKIP() << "transparent huge pages are 'never' here";
  const size_t bytes = 32 * kMiB;
  MapOptions o;
  o.huge_pages = true;
  o.threads = 1;
  o.method = PrefaultMethod::populate;
  o.huge_stall_seconds = 1e-9;  // every fault stalls
  MappedPages stalled = map_pages(bytes, o);
  EXPECT_TRUE(stalled.prefault.huge_abandoned);
  EXPECT_GT(stalled.prefault.slowest_unit_seconds, 0.0);
  EXPECT_LE(test::smaps_of(stalled.data).anon_huge, 2 * kMiB) << "the first unit at most";
  EXPECT_TRUE(unmap_pages(stalled));
  o.huge_stall_seconds = 0;  // never
  MappedPages kept = map_pages(bytes, o);
  EXPECT_FALSE(kept.prefault.huge_abandoned);
  if (free_huge_page_bytes() >= 2 * bytes)  // the kernel had the blocks to give
    EXPECT_GT(test::smaps_of(kept.data).anon_huge, 2 * kMiB);
  EXPECT_TRUE(unmap_pages(kept));
}

TEST(HugePages, FreeBlocksAreReadFromBuddyinfo) {
  const uint64_t all = free_huge_page_bytes(-1);
  ASSERT_NE(all, UINT64_MAX) << "no /proc/buddyinfo";
  EXPECT_EQ(all % (2 * kMiB), 0u);
  EXPECT_LE(all, physical_memory_bytes());
  EXPECT_EQ(free_huge_page_bytes(9999), 0u) << "no such node";
}

// ---- the sources on sim ----

class HostSources : public test::TempDirTest {
 protected:
  HostSources() : TempDirTest("sources46") {}
  // A file of `bytes` known bytes.
  std::string write_file(const std::string& name, size_t bytes, unsigned salt = 1) {
    want_ = test::pattern(bytes, salt);
    std::ofstream out(path(name), std::ios::binary);
    out.write(reinterpret_cast<const char*>(want_.data()), static_cast<std::streamsize>(bytes));
    return path(name);
  }
  std::vector<unsigned char> read_file(const std::string& p) {
    std::ifstream in(p, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), {}};
  }
  std::vector<unsigned char> want_;
};

TEST_F(HostSources, AnonymousIsThePoolsSourceOnSimAndIsLockedAndPlaced) {
  Worker worker;
  worker.init("sim");
  EXPECT_EQ(worker.host_placement().pool_source, "anonymous");
  const uint64_t locked = test::vmlck_bytes();
  PinnedHostBuffer b = worker.alloc_pinned_host(8 * kMiB);
  EXPECT_TRUE(worker.is_pinned_host(b.data(), b.size()));
  EXPECT_EQ(test::smaps_of(b.data()).perms, "rw-p");
  if (test::kVmLckTracksMlock) EXPECT_GE(test::vmlck_bytes(), locked + 8 * kMiB);
}

TEST_F(HostSources, VendorWhereThePluginCannotRegister) {
  Worker worker;
  worker.init("no_register", 0, plugin("no_register"));
  EXPECT_EQ(worker.host_placement().pool_source, "vendor");
  const uint64_t locked = test::vmlck_bytes();
  PinnedHostBuffer b = worker.alloc_pinned_host(4 * kMiB);
  EXPECT_TRUE(worker.is_pinned_host(b.data(), b.size()));
  if (test::kVmLckTracksMlock) EXPECT_GE(test::vmlck_bytes(), locked + 4 * kMiB);
  // Nothing to pin a file with: the mapping stays unpinned and says why.
  const auto m = worker.map_file_pinned(write_file("f", 3 * kMiB));
  EXPECT_FALSE(m->pinned());
  EXPECT_NE(m->refusal().find("no host_register slot"), std::string::npos) << m->refusal();
  // A fill cannot defer to its writers here: the vendor's memory comes pinned.
  HostFill fill = worker.reserve_host_fill(8 * kMiB);
  EXPECT_FALSE(fill.active());
}

// ABI v8: a plugin needs one way to pin, its own allocation or host_register.
TEST_F(HostSources, APluginThatCannotPinIsRefusedAtLoad) {
  Worker worker;
  const Error e = error_of([&] { worker.init("no_pinning", 0, plugin("no_pinning")); });
  EXPECT_EQ(e.code(), ErrorCode::plugin_load);
  EXPECT_NE(std::string(e.what()).find("cannot pin host memory"), std::string::npos) << e.what();
}

TEST_F(HostSources, FileSharedIsThePageCacheReadOnlyPinnedInPlace) {
  Worker worker;
  worker.init("sim");
  const std::string p = write_file("f", 5 * kMiB + 123);
  const uint64_t locked = test::vmlck_bytes();
  const auto m = worker.map_file_pinned(p, want_.size());
  ASSERT_TRUE(m->pinned()) << m->refusal();
  EXPECT_STREQ(m->source(), "file_shared");
  EXPECT_EQ(m->note(), "");
  EXPECT_EQ(test::smaps_of(m->data()).perms, "r--s");
  EXPECT_EQ(std::memcmp(m->data(), want_.data(), want_.size()), 0);
  if (test::kVmLckTracksMlock) EXPECT_GE(test::vmlck_bytes(), locked + want_.size());
}

// A backend that cannot pin read-only memory (as a B300's CUDA driver) gets a private
// copy-on-write copy pinned writable: no copy through the pool, and the note says so.
TEST_F(HostSources, FilePrivateWhereReadOnlyPinsAreRefused) {
  Worker worker;
  worker.init("no_read_only", 0, plugin("no_read_only"));
  const std::string p = write_file("f", 5 * kMiB + 123);
  const auto m = worker.map_file_pinned(p, want_.size());
  ASSERT_TRUE(m->pinned()) << m->refusal();
  EXPECT_STREQ(m->source(), "file_private");
  EXPECT_NE(m->note().find("file_private"), std::string::npos) << m->note();
  EXPECT_EQ(test::smaps_of(m->data()).perms, "rw-p");
  EXPECT_TRUE(worker.is_pinned_host(m->data(), want_.size()));
  EXPECT_EQ(worker.host_memory_stats().segments, 0u) << "a copy through the pool";
  EXPECT_EQ(std::memcmp(m->data(), want_.data(), want_.size()), 0);
  // A map-mode load on it: the same bytes, its report says how.
  const std::string ckpt = path("ckpt.safetensors");
  {
    PageableAllocator pageable;
    TaskArgs args;
    args.add(Tensor::empty("w", DType::u8, {int64_t{3 << 20}}, Direction::in, pageable));
    std::memcpy(args.at(0).data(), want_.data(), 3 << 20);
    save_safetensors(args, ckpt);
  }
  CheckpointLoadOptions o;
  o.mode = LoadMode::map;
  const HostLoad load = load_to_host(Checkpoint::open(ckpt), worker, o);
  EXPECT_NE(load.report.map_note.find("file_private"), std::string::npos) << load.report.map_note;
  EXPECT_EQ(std::memcmp(load.tensors[0].storage->data(), want_.data(), 3 << 20), 0);
}

// Copy-on-write: a write into a file_private copy reaches neither the file nor another
// process's mapping of it.
TEST_F(HostSources, AWriteToAPrivateCopyNeverReachesTheFileOrAnotherMapping) {
  Worker worker;
  worker.init("no_read_only", 0, plugin("no_read_only"));
  const std::string p = write_file("f", 2 * kMiB + 7);
  const auto m = worker.map_file_pinned(p, want_.size());
  ASSERT_STREQ(m->source(), "file_private");
  auto* bytes = const_cast<unsigned char*>(m->data());  // writable: a private copy
  for (size_t i = 0; i < want_.size(); i += 4096) bytes[i] = static_cast<unsigned char>(~want_[i]);
  EXPECT_EQ(read_file(p), want_) << "the write reached the file";
  const pid_t child = fork();
  if (child == 0) {  // another process's shared mapping of the file: the file's own bytes
    const int fd = ::open(p.c_str(), O_RDONLY);
    void* other = mmap(nullptr, want_.size(), PROT_READ, MAP_SHARED, fd, 0);
    _exit(other != MAP_FAILED && std::memcmp(other, want_.data(), want_.size()) == 0 ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "another mapping saw the write";
  EXPECT_NE(bytes[0], want_[0]) << "the copy did not take the write";
}

// shared_named (the restart cache's source): a named tmpfs file mapped shared and writable,
// placed and faulted by the runtime, whose bytes outlive the mapping.
TEST_F(HostSources, ASharedNamedSegmentOutlivesItsMapping) {
  const std::string name = "/dev/shm/pinstage-test46-" + std::to_string(::getpid());
  const int fd = ::open(name.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  ASSERT_GE(fd, 0) << std::strerror(errno);
  const runtime::HostPlacement placement;
  ps_platform_api none{};
  const auto source =
      runtime::make_source(runtime::SourceKind::shared_named, placement, none, nullptr);
  EXPECT_EQ(source->kind(), runtime::SourceKind::shared_named);
  const size_t bytes = 3 * kMiB + 5;
  runtime::HostSegment seg = source->make({bytes, true, fd, "'" + name + "'"});
  EXPECT_EQ(seg.bytes, round_up_to_pages(bytes));
  EXPECT_EQ(test::smaps_of(seg.data).perms, "rw-s");
  EXPECT_EQ(test::smaps_of(seg.data).rss, seg.bytes) << "faulted by the runtime";
  const auto want = test::pattern(bytes, 46);
  std::memcpy(seg.data, want.data(), bytes);
  ASSERT_TRUE(source->release(seg.allocation(), nullptr));
  runtime::HostSegment again = source->make({bytes, false, fd, "'" + name + "'"});
  EXPECT_EQ(std::memcmp(again.data, want.data(), bytes), 0) << "the bytes did not outlive it";
  ASSERT_TRUE(source->release(again.allocation(), nullptr));
  ::close(fd);
  ::unlink(name.c_str());
}

// The checks the cuda fake and the acl double run (host_source_checks.h), on sim: what sim
// pins is what the kernel says is locked (smaps' Locked of the mapping), not pinstage.
test::PinView sim_view() {
  test::PinView v;
  v.backend = "sim";
  v.pinned = [](const void* p, size_t n) { return test::smaps_of(p).locked >= n; };
  return v;
}

TEST(SimSources, TheAnonymousSourceIsLockedAndRoundTrips) {
  if (!test::kVmLckTracksMlock) GTEST_SKIP() << "mlock is a no-op under a sanitizer";
  test::check_anonymous_source(sim_view());
}

TEST(SimSources, NumaPlacementIsReadBackFromTheKernel) {
  if (!test::kVmLckTracksMlock) GTEST_SKIP() << "mlock is a no-op under a sanitizer";
  test::check_numa_placement(sim_view());
}

TEST(SimSources, HugePagesFollowTheOneSwitch) {
  if (!test::kVmLckTracksMlock) GTEST_SKIP() << "mlock is a no-op under a sanitizer";
  test::check_huge_page_switch(sim_view());
}

// ---- a fill by the readers, pinned behind them ----

// Nothing is read into unregistered memory that anyone calls pinned: while the readers
// fill the fresh segment, its blocks are not pinned memory (sim locks each page as a reader
// faults it); once the load is done they are, and the report says how.
TEST_F(HostSources, AFirstLoadIsFaultedByItsReadersAndPinnedBehindThem) {
  WorkerOptions o;
  o.host_cache_limit_bytes = 0;  // a first load: fresh memory
  Worker worker;
  worker.init("sim", 0, o);
  PageableAllocator pageable;
  TaskArgs args;
  for (int i = 0; i < 4; ++i) {
    args.add(Tensor::empty("t" + std::to_string(i), DType::u8, {int64_t{3 << 20} + i},
                           Direction::in, pageable));
    const auto bytes = test::pattern(args.at(i).nbytes(), 7 + i);
    std::memcpy(args.at(i).data(), bytes.data(), bytes.size());
  }
  save_safetensors(args, path("c.safetensors"));
  const Checkpoint c = Checkpoint::open(path("c.safetensors"));
  const uint64_t locked = test::vmlck_bytes();
  PinnedAllocator pinned(worker);
  uint64_t locked_while_reading = 0;
  CheckpointLoadOptions lo;
  lo.threads = 2;
  lo.chunk_bytes = kMiB;
  lo.progress = [&](uint64_t, uint64_t) {  // after each chunk read
    locked_while_reading = std::max(locked_while_reading, test::vmlck_bytes());
  };
  // The pinned allocator, asked by each reader before it writes whether its range is
  // pinned memory yet.
  struct Probe final : HostAllocator {
    PinnedAllocator& inner;
    Worker& w;
    std::vector<bool> pinned_at_prepare;
    Probe(PinnedAllocator& a, Worker& wk) : inner(a), w(wk) {}
    std::shared_ptr<Storage> allocate(size_t bytes) override { return inner.allocate(bytes); }
    void reserve(std::span<const size_t> sizes) override { inner.reserve(sizes); }
    void prepare(void* data, size_t bytes) override {
      pinned_at_prepare.push_back(w.is_pinned_host(data, 1));
      inner.prepare(data, bytes);
    }
    void finish() override { inner.finish(); }
    bool pinned() const override { return true; }
    std::string name() const override { return "probe"; }
  } probe(pinned, worker);
  const HostLoad load = load_to_host(c, probe, lo);
  ASSERT_FALSE(probe.pinned_at_prepare.empty()) << "the readers prepared nothing";
  for (bool p : probe.pinned_at_prepare) EXPECT_FALSE(p) << "called pinned before it was";
  // sim pins the fresh pages as the readers fault them (PS_REGISTER_ON_FAULT): locked in
  // the readers' threads, never called pinned before the load is done.
  if (test::kVmLckTracksMlock) {
    EXPECT_GT(locked_while_reading, locked) << "not locked as the readers faulted it";
    EXPECT_GE(test::vmlck_bytes(), locked + 12 * kMiB) << "not locked behind them";
  }
  for (size_t i = 0; i < load.tensors.size(); ++i) {
    const HostTensor& t = load.tensors[i];
    EXPECT_TRUE(worker.is_pinned_host(t.storage->data(), t.info.bytes)) << t.info.name;
    EXPECT_EQ(std::memcmp(t.storage->data(), args.at(i).data(), t.info.bytes), 0) << t.info.name;
  }
  ASSERT_NE(pinned.fill(), nullptr);
  EXPECT_FALSE(pinned.fill()->pages().empty()) << "the fill made no segment";
  EXPECT_GT(pinned.fill()->fault_seconds(), 0.0);
}

// The fill's API itself: prepare() faults exactly the range its writer asks for.
TEST_F(HostSources, PrepareFaultsOnlyTheRangeItsWriterAsksFor) {
  WorkerOptions o;
  o.host_cache_limit_bytes = 0;
  Worker worker;
  worker.init("sim", 0, o);
  const ScopedEnv off("PINSTAGE_HOST_HUGE_PAGES", "off");  // read at init: kept for clarity
  HostFill fill = worker.reserve_host_fill(8 * kMiB);
  ASSERT_TRUE(fill.active());
  PinnedHostBuffer b = worker.alloc_pinned_host(8 * kMiB);
  EXPECT_FALSE(worker.is_pinned_host(b.data(), 1)) << "pinned before its fill ended";
  const size_t resident_before = test::smaps_of(b.data()).rss;
  fill.prepare(static_cast<char*>(b.data()) + kMiB, kMiB);
  EXPECT_GE(test::smaps_of(b.data()).rss, resident_before + kMiB);
  EXPECT_LT(test::smaps_of(b.data()).rss, resident_before + 4 * kMiB) << "faulted beyond the range";
  fill.prepare(nullptr, 0);  // outside the segment: nothing
  fill.finish();
  EXPECT_FALSE(fill.active());
  EXPECT_TRUE(worker.is_pinned_host(b.data(), b.size()));
  fill.finish();  // idempotent
}

// ---- every source failing leaves nothing behind ----

// The nth backend call of the host_alloc kind (sim's host_register and host_alloc_pinned
// both) fails, for every n until the operation succeeds: each failure leaves no lock, no
// open file, no file mapping and no resident segment behind (RssAnon within 3 MiB: the
// segments are 5 and 6 MiB, malloc's own noise is less), and the worker still works.
TEST_F(HostSources, EverySourceFailingLeavesNothingBehind) {
  const std::string file = write_file("f", 3 * kMiB + 9);
  {
    PageableAllocator pageable;
    TaskArgs args;
    args.add(Tensor::empty("w", DType::u8, {int64_t{5 << 20}}, Direction::in, pageable));
    save_safetensors(args, path("c.safetensors"));
  }
  const Checkpoint c = Checkpoint::open(path("c.safetensors"));
  struct Case {
    const char* name;
    const char* plugin;
    std::function<void(Worker&)> op;
  };
  CheckpointLoadOptions map;
  map.mode = LoadMode::map;
  const Case cases[] = {
      {"anonymous", "sim", [](Worker& w) { w.alloc_pinned_host(6 * kMiB); }},
      {"anonymous, filled by the readers", "sim",
       [&](Worker& w) { (void)load_to_host(c, w, CheckpointLoadOptions{}); }},
      {"vendor", "no_register", [](Worker& w) { w.alloc_pinned_host(6 * kMiB); }},
      {"file_shared", "sim", [&](Worker& w) { (void)load_to_host(c, w, map); }},
      {"file_private", "no_read_only", [&](Worker& w) { (void)load_to_host(c, w, map); }},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(k.name);
    const uint64_t locked = test::vmlck_bytes();
    const size_t fds = test::count_fds(), maps = test::count_maps(dir_.string());
    bool done = false;
    WorkerOptions o = std::string(k.plugin) == "sim" ? WorkerOptions{} : plugin(k.plugin);
    o.host_cache_limit_bytes = 0;
    {
      Worker warm;  // a worker's fixed costs (threads, the device pool) before the baseline
      warm.init(k.plugin, 0, o);
    }
    const uint64_t rss = test::kFaultsAreOnlyOurs ? test::rss_anon_bytes() : UINT64_MAX / 2;
    for (uint64_t nth = 1; nth <= 8 && !done; ++nth) {
      Worker w;
      w.init(k.plugin, 0, o);
      w.inject_fault(FaultKind::host_alloc, nth);
      try {
        k.op(w);
        done = true;
      } catch (const Error& e) {
        EXPECT_EQ(e.code(), ErrorCode::injected_fault) << e.what();
      }
      EXPECT_EQ(w.stats().pinned_count, 0u);
      w.finalize();
      EXPECT_LE(test::rss_anon_bytes(), rss + 3 * kMiB) << "nth " << nth << ": a segment leaked";
      if (test::kVmLckTracksMlock) EXPECT_EQ(test::vmlck_bytes(), locked) << "nth " << nth;
      EXPECT_EQ(test::count_fds(), fds) << "nth " << nth;
      EXPECT_EQ(test::count_maps(dir_.string()), maps) << "nth " << nth;
    }
    EXPECT_TRUE(done) << "never succeeded";
  }
}

// ---- map mode under the pin budget, and its files (issue 47's map-mode defects) ----

// A memlock budget of `limit` bytes over what this process had locked when it was made,
// read live (the real VmLck moves as the worker locks).
class ScriptedBudget {
 public:
  explicit ScriptedBudget(uint64_t limit) {
    const uint64_t base = test::vmlck_bytes();
    set_pin_budget_source([=](bool) {
      PinBudget b;
      b.memlock_limit_bytes = limit;
      b.locked_bytes = test::vmlck_bytes() - base;
      return b;
    });
  }
  ~ScriptedBudget() { set_pin_budget_source({}); }
  ScriptedBudget(const ScriptedBudget&) = delete;
  ScriptedBudget& operator=(const ScriptedBudget&) = delete;
};

class MapBudget : public HostSources {
 protected:
  // `n` tensors of `bytes` each, in shards of about `shard` bytes; every byte known.
  Checkpoint write(int n, size_t bytes, uint64_t shard) {
    PageableAllocator pageable;
    for (int i = 0; i < n; ++i) {
      args_.add(Tensor::empty("t" + std::to_string(i), DType::u8, {static_cast<int64_t>(bytes)},
                              Direction::in, pageable));
      const auto b = test::pattern(bytes, 30 + i);
      std::memcpy(args_.at(i).data(), b.data(), bytes);
    }
    save_sharded_checkpoint(args_, path("ckpt"), shard);
    return Checkpoint::open(path("ckpt"));
  }
  TaskArgs args_;
};

// Three 3 MiB shards under an 8 MiB memlock budget: they do not fit pinned together, each
// fits alone. A map-mode device load pins, uploads and lets go of each in turn (copy mode
// would load them through its 1 MiB ring), and says so.
TEST_F(MapBudget, ADeviceLoadWhoseFilesDoNotFitTogetherGoesFileByFile) {
  if (!test::kVmLckTracksMlock) GTEST_SKIP() << "VmLck does not move under a sanitizer";
  const Checkpoint c = write(3, 3 * kMiB - 4096, 3 * kMiB);
  ASSERT_EQ(c.files().size(), 3u);
  Worker worker;
  worker.init("sim");
  const ScriptedBudget budget(8 * kMiB);
  CheckpointLoadOptions o;
  o.mode = LoadMode::map;
  const DeviceLoad dev = load_to_device(c, worker, o);
  EXPECT_NE(dev.report.map_note.find("each was pinned, uploaded and let go in turn"),
            std::string::npos)
      << dev.report.map_note;
  for (size_t i = 0; i < dev.tensors.size(); ++i) {
    std::vector<unsigned char> back(dev.tensors[i].info.bytes);
    worker.copy_to_host(back.data(), dev.tensors[i].buffer, 0, back.size());
    EXPECT_EQ(std::memcmp(back.data(), args_.at(i).data(), back.size()), 0) << i;
  }
}

// One 4-byte tensor of a 32 MiB shard under an 8 MiB budget: the shard does not fit, the
// tensor does, so it is copied (as copy mode would load it) and the note says so; a load
// whose tensors do not fit either keeps the map's refusal, which counts the load's own
// pinned shards as this worker's.
TEST_F(MapBudget, ASmallTensorOfAShardThatDoesNotFitIsCopiedAndSaidSo) {
  if (!test::kVmLckTracksMlock) GTEST_SKIP() << "VmLck does not move under a sanitizer";
  PageableAllocator pageable;
  args_.add(Tensor::empty("big", DType::u8, {int64_t{32} << 20}, Direction::in, pageable));
  args_.add(Tensor::empty("small", DType::f32, {1}, Direction::in, pageable));
  std::memset(args_.at(0).data(), 1, args_.at(0).nbytes());
  std::memcpy(args_.at(1).data(), "\x01\x02\x03\x04", 4);
  save_safetensors(args_, path("one.safetensors"));
  const Checkpoint c = Checkpoint::open(path("one.safetensors"));
  Worker worker;
  worker.init("sim");
  const ScriptedBudget budget(8 * kMiB);
  CheckpointLoadOptions o;
  o.mode = LoadMode::map;
  const std::vector<std::string> names{"small"};
  const HostLoad load = load_to_host(c, worker, o, &names);
  ASSERT_EQ(load.tensors.size(), 1u);
  EXPECT_EQ(std::memcmp(load.tensors[0].storage->data(), "\x01\x02\x03\x04", 4), 0);
  EXPECT_NE(load.report.map_note.find("copied into pinned memory"), std::string::npos)
      << load.report.map_note;
  const Error e = error_of([&] { (void)load_to_host(c, worker, o); });
  EXPECT_EQ(e.code(), ErrorCode::out_of_memory);
  EXPECT_NE(std::string(e.what()).find("mapping '"), std::string::npos) << e.what();
}

// The pin budget's refusal of a map-mode load says whose bytes hold the budget (it said "0
// of them by this worker" while the locked bytes were the load's own shards): the files of
// one load are weighed together before any is pinned, and the request names them; a later
// load is told how much this worker holds pinned already.
TEST_F(MapBudget, ARefusalSaysWhoseBytesHoldTheBudget) {
  if (!test::kVmLckTracksMlock) GTEST_SKIP() << "VmLck does not move under a sanitizer";
  const Checkpoint c = write(3, 3 * kMiB - 4096, 3 * kMiB);
  Worker worker;
  worker.init("sim");
  const ScriptedBudget budget(8 * kMiB);
  CheckpointLoadOptions o;
  o.mode = LoadMode::map;
  Error e = error_of([&] { (void)load_to_host(c, worker, o); });
  EXPECT_EQ(e.code(), ErrorCode::out_of_memory);
  EXPECT_NE(std::string(e.what()).find("(with the 6291456 bytes of the files before it)"),
            std::string::npos)
      << e.what();
  const std::vector<std::string> first_two{"t0", "t1"};
  const HostLoad held = load_to_host(c, worker, o, &first_two);  // 6 MiB pinned, held
  const std::vector<std::string> third{"t2"};
  e = error_of([&] { (void)load_to_host(c, worker, o, &third); });
  EXPECT_NE(std::string(e.what()).find("6291456 of them by this worker"), std::string::npos)
      << e.what();
}

// A live shared mapping is never handed to a checkpoint of another size: the size the
// caller validated is checked against the file before any mapping is shared.
TEST_F(HostSources, AMappingOfAnotherSizeIsNeverShared) {
  Worker worker;
  worker.init("sim");
  const std::string p = write_file("f", 4096);
  const auto small = worker.map_file_pinned(p, 4096);
  timespec mtime[2] = {};
  {
    struct stat st {};
    ASSERT_EQ(::stat(p.c_str(), &st), 0);
    mtime[0] = st.st_atim;
    mtime[1] = st.st_mtim;
  }
  {  // restored in place, larger, with its old mtime (cp -p, rsync -t)
    std::ofstream out(p, std::ios::binary | std::ios::in | std::ios::out);
    const auto big = test::pattern(3 * kMiB, 9);
    out.write(reinterpret_cast<const char*>(big.data()), static_cast<std::streamsize>(big.size()));
  }
  ASSERT_EQ(::utimensat(AT_FDCWD, p.c_str(), mtime, 0), 0);
  const Error e = error_of([&] { worker.map_file_pinned(p, 4096); });
  EXPECT_EQ(e.code(), ErrorCode::io);
  EXPECT_NE(std::string(e.what()).find("changed since"), std::string::npos) << e.what();
  const auto big = worker.map_file_pinned(p, 3 * kMiB);
  EXPECT_NE(big.get(), small.get()) << "the one-page mapping was shared";
  EXPECT_EQ(big->size(), 3 * kMiB);
  EXPECT_EQ(big->data()[3 * kMiB - 1], test::pattern(3 * kMiB, 9).back());
}

// A FIFO renamed over a shard between the checkpoint's open and its load is refused at once;
// it never blocks the open.
TEST_F(HostSources, AFifoRenamedOverAShardIsRefusedNotWaitedFor) {
  PageableAllocator pageable;
  TaskArgs args;
  args.add(Tensor::empty("w", DType::u8, {4096}, Direction::in, pageable));
  save_safetensors(args, path("c.safetensors"));
  const Checkpoint c = Checkpoint::open(path("c.safetensors"));
  ASSERT_EQ(::mkfifo(path("fifo").c_str(), 0600), 0);
  ASSERT_EQ(::rename(path("fifo").c_str(), path("c.safetensors").c_str()), 0);
  Worker worker;
  worker.init("sim");
  CheckpointLoadOptions o;
  o.mode = LoadMode::map;
  const Error e = error_of([&] { (void)load_to_host(c, worker, o); });
  EXPECT_EQ(e.code(), ErrorCode::io);
  EXPECT_NE(std::string(e.what()).find("FIFO"), std::string::npos) << e.what();
}

}  // namespace
}  // namespace pinstage
