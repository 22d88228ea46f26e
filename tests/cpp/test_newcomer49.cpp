// Issue 49's library side: the phase callback of CheckpointLoadOptions (named as each phase
// begins, before the first byte and after the last), map mode's folio census (the census
// itself on made-up frames and flags, the /proc readers, and a real map-mode load's
// report), and the first-touch split of a device load's alloc_s in the C++ LoadReport.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "checkpoint/folios.h"
#include "pinstage/checkpoint.h"
#include "pinstage/report.h"
#include "pinstage/tensor.h"
#include "pinstage/worker.h"
#include "temp_dir_test_util.h"

namespace pinstage {
namespace {

using detail::kKpfCompoundHead;
using detail::kKpfCompoundTail;

class Newcomer49 : public test::TempDirTest {
 protected:
  Newcomer49() : TempDirTest("newcomer49") {}
  void SetUp() override {
    TempDirTest::SetUp();
    worker_.init("sim");
  }
  // Six f32 tensors of 64 KiB in shards of about 128 KiB.
  Checkpoint checkpoint() {
    PageableAllocator pageable;
    TaskArgs args;
    for (int i = 0; i < 6; ++i) {
      args.add(
          Tensor::empty("t" + std::to_string(i), DType::f32, {16384}, Direction::in, pageable));
      std::memset(args.at(i).data(), i + 1, args.at(i).nbytes());
    }
    save_sharded_checkpoint(args, path("m"), 128 << 10);
    return Checkpoint::open(path("m"));
  }
  // The options with a phase callback recording the phases, and "bytes" once where the
  // first progress call came.
  CheckpointLoadOptions recording(std::vector<std::string>& events) {
    CheckpointLoadOptions o;
    o.phase = [&events](const char* p) { events.emplace_back(p); };
    o.progress = [&events](uint64_t, uint64_t) {
      if (events.empty() || events.back() != "bytes") events.emplace_back("bytes");
    };
    return o;
  }

  Worker worker_;
};

using Events = std::vector<std::string>;

TEST_F(Newcomer49, EachLoadNamesItsPhasesAsTheyBegin) {
  const Checkpoint c = checkpoint();
  struct Case {
    LoadMode mode;
    bool verify, device;
    Events want;
  };
  const std::vector<Case> cases{
      {LoadMode::copy, false, false, {"allocate", "read", "bytes"}},
      {LoadMode::copy, true, false, {"allocate", "read", "bytes", "verify"}},
      {LoadMode::map, true, false, {"pin", "bytes", "verify"}},
      {LoadMode::map, false, true, {"pin", "allocate", "upload", "bytes"}},
      {LoadMode::copy, false, true, {"allocate", "read+upload", "bytes"}},
  };
  for (const Case& k : cases) {
    Events events;
    CheckpointLoadOptions o = recording(events);
    o.mode = k.mode;
    o.verify = o.verify_if_present = k.verify;
    if (k.device)
      (void)load_to_device(c, worker_, o);
    else
      (void)load_to_host(c, worker_, o);
    EXPECT_EQ(events, k.want) << load_mode_name(k.mode) << (k.device ? " device" : " host")
                              << (k.verify ? " verify" : "");
  }
}

TEST_F(Newcomer49, APhaseCallbackThatThrowsStopsTheLoad) {
  const Checkpoint c = checkpoint();
  CheckpointLoadOptions o;
  bool read = false;
  o.phase = [](const char* p) {
    if (std::string(p) == "read") throw Error(ErrorCode::invalid_argument, "stop at read");
  };
  o.progress = [&read](uint64_t, uint64_t) { read = true; };
  try {
    (void)load_to_host(c, worker_, o);
    ADD_FAILURE() << "the load went on";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "stop at read");
  }
  EXPECT_FALSE(read) << "a byte was read after the phase callback threw";
}

// ---- the census ----

// Frames from 1024 on: a 16 KiB folio at 1024, 4 KiB pages at 1028 and 1029, a 64 KiB
// folio at 1040 (tails to 1055), an 8 KiB folio at 1056, a 2 MiB folio at 2048; the rest
// 4 KiB pages. Every flags_of() call is counted.
struct Frames {
  std::map<uint64_t, uint64_t> flags;
  size_t reads = 0;
  Frames() {
    for (uint64_t head : {1024, 1040, 1056, 2048}) flags[head] = kKpfCompoundHead;
    for (uint64_t tail : {1025, 1026, 1027, 1057}) flags[tail] = kKpfCompoundTail;
    for (uint64_t tail = 1041; tail < 1056; ++tail) flags[tail] = kKpfCompoundTail;
    for (uint64_t tail = 2049; tail < 2560; ++tail) flags[tail] = kKpfCompoundTail;
  }
  uint64_t pages_of(uint64_t pfn) {
    reads = 0;
    return detail::folio_pages(pfn, [this](uint64_t f) {
      ++reads;
      const auto it = flags.find(f);
      return it == flags.end() ? uint64_t{0} : it->second;
    });
  }
};

TEST(FolioCensus, AFramesFolioRunsFromItsAlignedHeadToItsLastTail) {
  Frames f;
  EXPECT_EQ(f.pages_of(1024), 4u);  // a head
  EXPECT_EQ(f.pages_of(1026), 4u);  // a tail: back to its head
  EXPECT_EQ(f.pages_of(1028), 1u);  // neither: a 4 KiB folio, one read
  EXPECT_EQ(f.reads, 1u);
  EXPECT_EQ(f.pages_of(1055), 16u);  // the last tail of the 64 KiB one
  EXPECT_EQ(f.pages_of(1057), 2u);   // the next head ends the one before
  EXPECT_LE(f.reads, 2 * detail::kMaxFolioOrder + 2);
  EXPECT_EQ(f.pages_of(2048 + 301), 512u);  // a 2 MiB folio, sampled mid-way:
  EXPECT_EQ(f.reads, 2u);                   // its flags, then its block's middle frame's
  f.flags[2560] = kKpfCompoundTail;         // a folio past 2 MiB counts as 2 MiB
  f.flags.erase(2048);
  for (uint64_t tail = 2048; tail < 2560; ++tail) f.flags[tail] = kKpfCompoundTail;
  EXPECT_EQ(f.pages_of(2100), 512u);
}

TEST(FolioCensus, TheTextGivesEachSizesShareOfTheBytesLargestFirst) {
  EXPECT_EQ(detail::folio_text({{4096, 10}, {uint64_t{2} << 20, 970}, {65536, 20}}),
            "2 MiB 97%, 64 KiB 2%, 4 KiB 1%");
  EXPECT_EQ(detail::folio_text({{4096, 1}, {uint64_t{2} << 20, 999}}), "2 MiB 100%, 4 KiB 0.1%");
}

TEST(FolioCensus, FileHugePagesIsReadInBytesAndMissingIsMinusOne) {
  EXPECT_EQ(detail::file_huge_pages_bytes("MemTotal: 10 kB\nFileHugePages:    4096 kB\n"),
            int64_t{4096} * 1024);
  EXPECT_EQ(detail::file_huge_pages_bytes("FileHugePages: 12\n"), -1);  // no unit: not it
  EXPECT_EQ(detail::file_huge_pages_bytes("MemTotal: 10 kB\n"), -1);
}

// Fake /proc files for the census: `pagemap` maps the 1024 pages of a mapping at
// kFakeAddress to frames 4096 + i (present; frame 0 when hidden), `kpageflags` gives those
// frames a pattern of period 16: a 32 KiB folio, then eight 4 KiB pages.
constexpr uint64_t kFakeAddress = uint64_t{1} << 28;
void write_entries(const std::string& file, uint64_t first, const std::vector<uint64_t>& values) {
  std::fstream out(file, std::ios::in | std::ios::out | std::ios::binary);
  if (!out) out.open(file, std::ios::out | std::ios::binary);
  out.seekp(static_cast<std::streamoff>(first * sizeof(uint64_t)));
  out.write(reinterpret_cast<const char*>(values.data()),
            static_cast<std::streamsize>(values.size() * sizeof(uint64_t)));
}
void write_fake_proc(const std::string& dir, bool hidden) {
  std::vector<uint64_t> entries, flags;
  for (uint64_t i = 0; i < 1024; ++i) {
    entries.push_back((uint64_t{1} << 63) | (hidden ? 0 : 4096 + i));
    flags.push_back(i % 16 == 0 ? kKpfCompoundHead : i % 16 < 8 ? kKpfCompoundTail : 0);
  }
  write_entries(dir + "/pagemap", kFakeAddress / 4096, entries);
  write_entries(dir + "/kpageflags", 4096, flags);
  std::ofstream(dir + "/meminfo") << "FileHugePages:   2048 kB\n";
}

TEST_F(Newcomer49, TheCensusSamplesOutOfStepWithAFilesPeriod) {
  write_fake_proc(dir_.string(), false);
  detail::FolioCensus census(path("kpageflags"), path("pagemap"), path("meminfo"));
  LoadReport r;
  census.add(reinterpret_cast<const void*>(kFakeAddress), 1024 * 4096, r);
  EXPECT_EQ(r.map_folio_source, "kpageflags");
  // Half the bytes in each size: samples in step with the period (every 16th page, the
  // head) would say 32 KiB 100%.
  const size_t big = r.map_folios.find("32 KiB "), small = r.map_folios.find("4 KiB ");
  ASSERT_NE(big, std::string::npos) << r.map_folios;
  ASSERT_NE(small, std::string::npos) << r.map_folios;
  const int big_pct = std::stoi(r.map_folios.substr(big + 7));
  EXPECT_GE(big_pct, 30) << r.map_folios;
  EXPECT_LE(big_pct, 70) << r.map_folios;
  EXPECT_NE(r.map_folios.find("(64 of 1024 pages sampled)"), std::string::npos) << r.map_folios;
  EXPECT_EQ(r.map_huge_bytes, 0u);
}

TEST_F(Newcomer49, HiddenFrameNumbersFallBackToFileHugePages) {
  write_fake_proc(dir_.string(), true);  // what a process without CAP_SYS_ADMIN reads
  detail::FolioCensus census(path("kpageflags"), path("pagemap"), path("meminfo"));
  LoadReport r;
  census.add(reinterpret_cast<const void*>(kFakeAddress), 1024 * 4096, r);
  EXPECT_EQ(r.map_folio_source, "FileHugePages");
  EXPECT_NE(r.map_folios.find("hides frame numbers (reading them needs CAP_SYS_ADMIN)"),
            std::string::npos)
      << r.map_folios;
}

TEST_F(Newcomer49, WithoutKpageflagsTheCensusSaysFileHugePagesBeforeAndAfter) {
  const std::string meminfo = path("meminfo");
  std::ofstream(meminfo) << "FileHugePages:   2048 kB\n";
  detail::FolioCensus census(path("no-kpageflags"), "/proc/self/pagemap", meminfo);
  std::ofstream(meminfo) << "FileHugePages:   6144 kB\n";
  const std::vector<unsigned char> bytes(8192, 1);
  LoadReport r;
  census.add(bytes.data(), bytes.size(), r);
  EXPECT_EQ(r.map_folio_source, "FileHugePages");
  EXPECT_EQ(r.map_huge_bytes, uint64_t{6144} * 1024);
  EXPECT_EQ(r.map_folios.find("FileHugePages 0.00 GB before, 0.01 GB after (system-wide; "), 0u)
      << r.map_folios;
  EXPECT_NE(r.map_folios.find("no-kpageflags: No such file or directory"), std::string::npos)
      << r.map_folios;
}

TEST_F(Newcomer49, AMapModeReportGivesTheFoliosItPinned) {
  const Checkpoint c = checkpoint();
  CheckpointLoadOptions o;
  o.mode = LoadMode::map;
  const HostLoad load = load_to_host(c, worker_, o);
  const LoadReport& r = load.report;
  ASSERT_TRUE(r.map_folio_source == "kpageflags" || r.map_folio_source == "FileHugePages")
      << r.map_folio_source << ": " << r.map_folios;
  if (r.map_folio_source == "kpageflags") {  // every file's every page, sampled
    uint64_t pages = 0;
    for (const CheckpointFile& f : c.files()) pages += (f.size + 4095) / 4096;
    EXPECT_NE(r.map_folios.find(" of the bytes (" + std::to_string(pages) + " of " +
                                std::to_string(pages) + " pages sampled)"),
              std::string::npos)
        << r.map_folios;  // files of under 64 pages: every page
    EXPECT_LE(r.map_huge_bytes, pages * 4096);
  }
  const ReportFields fields = report_fields(r);
  std::vector<std::string> keys;
  for (const ReportField& f : fields) keys.push_back(f.key);
  EXPECT_EQ(std::vector<std::string>(keys.end() - 3, keys.end()),
            (std::vector<std::string>{"map_folio_source", "map_folios", "map_huge_bytes"}));
}

// ---- first touch ----

TEST_F(Newcomer49, ADeviceLoadOnSimSplitsItsFirstTouchOutOfAllocS) {
  const Checkpoint c = checkpoint();
  {
    const DeviceLoad first = load_to_device(c, worker_);
    const LoadReport& r = first.report;
    EXPECT_GE(r.device_first_touch_bytes, c.total_bytes());  // backed in the pool's blocks
    EXPECT_GE(r.device_first_touch_s, 0.0);
    EXPECT_LE(r.device_first_touch_s, r.alloc_s);
    EXPECT_NE(r.device_first_touch_reason.find("part of alloc_s, a cost of sim"),
              std::string::npos);
    std::vector<std::string> keys;
    for (const ReportField& f : report_fields(r)) keys.push_back(f.key);
    EXPECT_EQ(std::vector<std::string>(keys.end() - 3, keys.end()),
              (std::vector<std::string>{"device_first_touch_bytes", "device_first_touch_s",
                                        "device_first_touch_reason"}));
  }
  const DeviceLoad second = load_to_device(c, worker_);  // the freed blocks stay backed
  EXPECT_EQ(second.report.device_first_touch_bytes, 0u);
  EXPECT_FALSE(second.report.device_first_touch_reason.empty());
  const HostLoad host = load_to_host(c, worker_);  // a host load has none of it
  EXPECT_TRUE(host.report.device_first_touch_reason.empty());
  for (const ReportField& f : report_fields(host.report))
    EXPECT_EQ(std::string(f.key).find("device_first_touch"), std::string::npos);
}

}  // namespace
}  // namespace pinstage
