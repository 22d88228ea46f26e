// Binder: round trips, report counts, the staged path's edge cases, and every failure
// path releasing what it took.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "pinstage/bind.h"
#include "pinstage/tensor.h"
#include "pinstage/worker.h"

namespace pinstage {
namespace {

// Byte j of tensor `salt` before a bind: distinct per tensor and position.
unsigned char host_pattern(size_t salt, size_t j) {
  return static_cast<unsigned char>((j * 31 + salt * 101 + 5) & 0xff);
}
// What sim.fill_index writes into argument k.
unsigned char fill_index(size_t k, size_t j) {
  return static_cast<unsigned char>((j + 7 * k) & 0xff);
}

struct Spec {
  std::string name;
  int64_t elements;  // bf16 elements
  Direction dir;
};

TaskArgs make_task(const std::vector<Spec>& specs, HostAllocator& alloc) {
  TaskArgs args;
  for (size_t i = 0; i < specs.size(); ++i) {
    Tensor t = Tensor::empty(specs[i].name, DType::bf16, {specs[i].elements}, specs[i].dir, alloc);
    auto* p = static_cast<unsigned char*>(t.data());
    for (uint64_t j = 0; j < t.nbytes(); ++j) p[j] = host_pattern(i, j);
    args.add(std::move(t));
  }
  return args;
}

std::vector<std::vector<unsigned char>> snapshot(const TaskArgs& args) {
  std::vector<std::vector<unsigned char>> out;
  for (const Tensor& t : args) {
    const auto* p = static_cast<const unsigned char*>(t.data());
    out.emplace_back(p, p + t.nbytes());
  }
  return out;
}

// Three tensors of each direction-ish mix; sizes that are not multiples of anything.
const std::vector<Spec> kMixed = {
    {"w", 1000, Direction::in},
    {"cache", 777, Direction::inout},
    {"bias", 3, Direction::in},
    {"out", 129, Direction::out},
};

class BindTest : public ::testing::Test {
 protected:
  void SetUp() override { worker.init("sim"); }
  void expect_nothing_held(uint64_t pinned_before) {
    const WorkerStats s = worker.stats();
    EXPECT_EQ(s.device_count, 0u);
    EXPECT_EQ(s.device_bytes, 0u);
    EXPECT_EQ(s.pinned_count, pinned_before);
  }
  Worker worker;
};

struct Variant {
  DeviceLayout layout;
  UploadPath path;
  bool pinned;
};

class BindRoundTrip : public BindTest, public ::testing::WithParamInterface<Variant> {};

TEST_P(BindRoundTrip, ExecuteResultReachesInoutAndOutHostTensors) {
  const Variant v = GetParam();
  PageableAllocator pageable;
  PinnedAllocator pinned(worker);
  HostAllocator& alloc = v.pinned ? static_cast<HostAllocator&>(pinned) : pageable;
  const TaskArgs args = make_task(kMixed, alloc);
  const auto before = snapshot(args);

  BindOptions opt;
  opt.layout = v.layout;
  opt.upload = v.path;
  opt.staging_buffers = 3;
  opt.staging_buffer_bytes = 100;  // tensors span several ring turns
  opt.chunk_bytes = 300;
  opt.execute_callable = "sim.fill_index";
  const uint64_t pinned_before = worker.stats().pinned_count;
  {
    Binder binder(worker, opt);
    const BindReport rep = binder.run(args);
    EXPECT_TRUE(rep.executed);
    EXPECT_GT(rep.phase(BindPhase::execute), 0.0);  // it ran: not the skipped phase's 0

    for (size_t k = 0; k < args.size(); ++k) {
      const Tensor& t = args.at(k);
      const auto* p = static_cast<const unsigned char*>(t.data());
      for (uint64_t j = 0; j < t.nbytes(); ++j) {
        const unsigned char want = t.direction() == Direction::in ? before[k][j] : fill_index(k, j);
        ASSERT_EQ(p[j], want) << t.name() << " byte " << j;
      }
    }
    // The report: counts, bytes, directions, paths.
    EXPECT_EQ(rep.tensors.size(), 4u);
    EXPECT_EQ(rep.uploaded_count, 3u);
    EXPECT_EQ(rep.uploaded_bytes, (1000u + 777u + 3u) * 2u);
    EXPECT_EQ(rep.downloaded_count, 2u);
    EXPECT_EQ(rep.downloaded_bytes, (777u + 129u) * 2u);
    EXPECT_EQ(rep.summary(),
              "3 of 4 tensors uploaded (inputs), " + format_thousands(3560) + " bytes");
    const bool ring = v.path == UploadPath::staged && !v.pinned;
    EXPECT_EQ(rep.ring_count, ring ? 3u : 0u);
    for (const auto& t : rep.tensors) {
      EXPECT_EQ(t.pinned, v.pinned);
      if (t.uploaded()) {
        EXPECT_EQ(t.path, ring ? UploadPath::staged : UploadPath::direct) << t.name;
      } else {
        EXPECT_EQ(t.upload_seconds, 0.0);
      }
      if (!t.downloaded()) {
        EXPECT_EQ(t.download_seconds, 0.0);
      }
    }
    EXPECT_EQ(rep.tensors[3].direction, Direction::out);
    if (v.layout == DeviceLayout::arena) {
      EXPECT_EQ(rep.device_allocations, 1u);
      for (const auto& t : rep.tensors) EXPECT_EQ(t.device_offset % opt.arena_alignment, 0u);
    } else {
      EXPECT_EQ(rep.device_allocations, 4u);
      EXPECT_EQ(rep.device_bytes, (1000u + 777u + 3u + 129u) * 2u);
    }
    EXPECT_EQ(worker.stats().device_count, 0u);  // released at the end of run()
    EXPECT_EQ(binder.staging_bytes(), ring ? 300u : 0u);
  }
  expect_nothing_held(pinned_before);
}

INSTANTIATE_TEST_SUITE_P(
    Variants, BindRoundTrip,
    ::testing::Values(Variant{DeviceLayout::arena, UploadPath::direct, false},
                      Variant{DeviceLayout::arena, UploadPath::staged, false},
                      Variant{DeviceLayout::per_tensor, UploadPath::direct, false},
                      Variant{DeviceLayout::per_tensor, UploadPath::staged, false},
                      Variant{DeviceLayout::arena, UploadPath::direct, true},
                      Variant{DeviceLayout::arena, UploadPath::staged, true}),
    [](const auto& info) {
      return std::string(device_layout_name(info.param.layout)) + "_" +
             upload_path_name(info.param.path) + (info.param.pinned ? "_pinned" : "_pageable");
    });

// Without a callable the device holds exactly what was uploaded, so INOUT comes back
// unchanged; OUT was never uploaded, so it comes back as the fresh device memory (zeros
// on sim), not as its host bytes.
TEST_F(BindTest, WithoutExecuteInoutRoundTripsAndOutIsNotUploaded) {
  PageableAllocator alloc;
  for (UploadPath path : {UploadPath::direct, UploadPath::staged}) {
    const TaskArgs args = make_task(kMixed, alloc);
    const auto before = snapshot(args);
    BindOptions opt;
    opt.upload = path;
    opt.staging_buffer_bytes = 64;
    Binder binder(worker, opt);
    const BindReport rep = binder.run(args);
    EXPECT_FALSE(rep.executed);
    const auto after = snapshot(args);
    EXPECT_EQ(after[0], before[0]);
    EXPECT_EQ(after[1], before[1]);
    EXPECT_EQ(after[2], before[2]);
    EXPECT_EQ(after[3], std::vector<unsigned char>(after[3].size(), 0));
    EXPECT_NE(before[3], after[3]);
  }
}

// The fault hook counts host-to-device copies: with one chunk per tensor a bind of
// three uploaded tensors makes exactly three, none of them for OUT.
TEST_F(BindTest, UploadsExactlyTheInAndInoutTensors) {
  PageableAllocator alloc;
  const TaskArgs args = make_task(kMixed, alloc);
  Binder binder(worker);  // default chunk: one copy per tensor
  worker.inject_fault(FaultKind::copy_h2d, 4);
  EXPECT_NO_THROW(binder.run(args));  // a 4th upload would have failed
  worker.inject_fault(FaultKind::copy_h2d, 3);
  try {
    binder.run(args);
    FAIL() << "the 3rd upload should fail";
  } catch (const BindError& e) {
    EXPECT_EQ(e.phase(), BindPhase::upload);
    EXPECT_EQ(e.tensor(), "bias");  // the third uploaded tensor, not "out"
  }
}

TEST_F(BindTest, StagedPathIsBitExactForAwkwardSizes) {
  PageableAllocator alloc;
  for (size_t ring_bytes : {size_t{1}, size_t{3}, size_t{7}, size_t{8}, size_t{4096}}) {
    for (size_t count : {size_t{1}, size_t{2}, size_t{4}}) {
      std::vector<Spec> specs;
      int i = 0;
      for (int64_t n : {1, 2, 3, 4, 5, 7, 8, 9, 63, 1000, 2049})
        specs.push_back({"t" + std::to_string(i++), n, Direction::inout});
      const TaskArgs args = make_task(specs, alloc);
      const auto before = snapshot(args);
      BindOptions opt;
      opt.upload = UploadPath::staged;
      opt.staging_buffers = count;
      opt.staging_buffer_bytes = ring_bytes;
      Binder binder(worker, opt);
      const BindReport rep = binder.run(args);
      EXPECT_EQ(snapshot(args), before) << "ring " << count << " x " << ring_bytes;
      EXPECT_EQ(rep.ring_count, specs.size());
      // And the device really held the bytes: fill_index overwrites, so read back only.
      opt.execute_callable = "sim.fill_index";
      Binder filler(worker, opt);
      filler.run(args);
      for (size_t k = 0; k < args.size(); ++k) {
        const auto* p = static_cast<const unsigned char*>(args.at(k).data());
        for (uint64_t j = 0; j < args.at(k).nbytes(); ++j) ASSERT_EQ(p[j], fill_index(k, j));
      }
    }
  }
}

TEST_F(BindTest, DirectChunkingIsBitExact) {
  PageableAllocator alloc;
  const TaskArgs args =
      make_task({{"a", 5000, Direction::inout}, {"b", 1, Direction::inout}}, alloc);
  const auto before = snapshot(args);
  BindOptions opt;
  opt.chunk_bytes = 999;  // 10,000 bytes in 11 pieces, the last one short
  Binder binder(worker, opt);
  binder.run(args);
  EXPECT_EQ(snapshot(args), before);
  worker.inject_fault(FaultKind::copy_h2d, 12);  // 11 pieces for a, 1 for b
  EXPECT_THROW(binder.run(args), BindError);
  worker.inject_fault(FaultKind::copy_h2d, 13);
  EXPECT_NO_THROW(binder.run(args));
  worker.inject_fault(FaultKind::copy_h2d, 0);
}

TEST_F(BindTest, EmptyTensorsAndEmptyTasks) {
  PageableAllocator alloc;
  for (DeviceLayout layout : {DeviceLayout::arena, DeviceLayout::per_tensor}) {
    for (UploadPath path : {UploadPath::direct, UploadPath::staged}) {
      BindOptions opt;
      opt.layout = layout;
      opt.upload = path;
      opt.execute_callable = "sim.fill_index";
      Binder binder(worker, opt);

      const BindReport none = binder.run(TaskArgs{});
      EXPECT_EQ(none.summary(), "0 of 0 tensors uploaded (inputs), 0 bytes");
      EXPECT_EQ(none.device_allocations, 0u);

      const TaskArgs all_empty =
          make_task({{"e0", 0, Direction::in}, {"e1", 0, Direction::out}}, alloc);
      const BindReport r0 = binder.run(all_empty);
      EXPECT_EQ(r0.device_allocations, 0u);
      EXPECT_EQ(r0.summary(), "1 of 2 tensors uploaded (inputs), 0 bytes");

      const TaskArgs mixed = make_task({{"e0", 0, Direction::inout},
                                        {"x", 5, Direction::inout},
                                        {"e2", 0, Direction::in},
                                        {"y", 1, Direction::out}},
                                       alloc);
      const BindReport r1 = binder.run(mixed);
      EXPECT_EQ(r1.device_allocations, layout == DeviceLayout::arena ? 1u : 2u);
      for (size_t k : {size_t{1}, size_t{3}}) {
        const auto* p = static_cast<const unsigned char*>(mixed.at(k).data());
        for (uint64_t j = 0; j < mixed.at(k).nbytes(); ++j) EXPECT_EQ(p[j], fill_index(k, j));
      }
      EXPECT_EQ(worker.stats().device_count, 0u);
    }
  }
}

// ---- failure paths --------------------------------------------------------------------

struct FailureCase {
  const char* label;
  FaultKind kind;
  uint64_t nth;
  DeviceLayout layout;
  UploadPath path;
  BindPhase phase;
  const char* tensor;  // "" = no single tensor
};

class BindFailure : public BindTest, public ::testing::WithParamInterface<FailureCase> {};

TEST_P(BindFailure, ReleasesEverythingAndNamesTheStep) {
  const FailureCase c = GetParam();
  PageableAllocator alloc;
  const TaskArgs args = make_task(kMixed, alloc);
  const auto before = snapshot(args);
  const uint64_t pinned_before = worker.stats().pinned_count;
  {
    BindOptions opt;
    opt.layout = c.layout;
    opt.upload = c.path;
    opt.staging_buffer_bytes = 4096;  // one ring piece per tensor: nth counts tensors
    opt.execute_callable = "sim.fill_index";
    Binder binder(worker, opt);
    worker.inject_fault(c.kind, c.nth);
    try {
      binder.run(args);
      FAIL() << c.label << ": no failure";
    } catch (const BindError& e) {
      EXPECT_EQ(e.code(), ErrorCode::injected_fault) << e.what();
      EXPECT_EQ(e.phase(), c.phase) << e.what();
      EXPECT_EQ(e.tensor(), c.tensor) << e.what();
      const std::string msg = e.what();
      EXPECT_NE(msg.find(bind_phase_name(c.phase)), std::string::npos) << msg;
      if (*c.tensor) {
        EXPECT_NE(msg.find(std::string("'") + c.tensor + "'"), std::string::npos) << msg;
      }
      EXPECT_NE(msg.find("released"), std::string::npos) << msg;
    }
    EXPECT_EQ(worker.stats().device_count, 0u);
    EXPECT_EQ(worker.stats().device_bytes, 0u);
    if (c.phase != BindPhase::download) {
      EXPECT_EQ(snapshot(args), before) << c.label;
    }
    const auto after = snapshot(args);
    EXPECT_EQ(after[0], before[0]);  // IN tensors are never written
    EXPECT_EQ(after[2], before[2]);

    // The Binder recovers: the next run works.
    EXPECT_NO_THROW(binder.run(args));
  }
  expect_nothing_held(pinned_before);
}

// Every step a fault can stop a bind at, a case a line.
std::vector<FailureCase> failure_cases() {
  using enum DeviceLayout;
  using enum UploadPath;
  using K = FaultKind;
  using P = BindPhase;
  return {{"arena_alloc", K::device_malloc, 1, arena, direct, P::device_alloc, ""},
          {"per_tensor_alloc_3", K::device_malloc, 3, per_tensor, direct, P::device_alloc, "bias"},
          // The ring's buffers share one pool segment: its one host_alloc.
          {"ring_alloc", K::host_alloc, 1, arena, staged, P::device_alloc, ""},
          {"upload_1", K::copy_h2d, 1, arena, direct, P::upload, "w"},
          {"upload_2", K::copy_h2d, 2, per_tensor, direct, P::upload, "cache"},
          {"upload_3_staged", K::copy_h2d, 3, arena, staged, P::upload, "bias"},
          {"execute", K::execute, 1, arena, direct, P::execute, ""},
          {"download_1", K::copy_d2h, 1, arena, direct, P::download, "cache"},
          {"download_2", K::copy_d2h, 2, per_tensor, staged, P::download, "out"}};
}

INSTANTIATE_TEST_SUITE_P(Faults, BindFailure, ::testing::ValuesIn(failure_cases()),
                         [](const auto& info) { return std::string(info.param.label); });

// verify_upload reads every uploaded tensor back and catches a corrupted upload (the
// sim fault hook flips the middle byte of the nth host-to-device copy), naming it.
TEST_F(BindTest, VerifyCatchesACorruptedUploadAndNamesTheTensor) {
  PageableAllocator alloc;
  for (UploadPath path : {UploadPath::direct, UploadPath::staged}) {
    const TaskArgs args = make_task(kMixed, alloc);
    BindOptions opt;
    opt.upload = path;
    opt.verify_upload = true;
    opt.staging_buffers = 2;
    opt.staging_buffer_bytes = 4096;  // one piece per tensor: nth counts tensors
    opt.chunk_bytes = 4096;           // the same pieces on the direct path
    const uint64_t pinned_before = worker.stats().pinned_count;
    {
      Binder binder(worker, opt);
      binder.run(args);  // a clean upload verifies
      const auto before = snapshot(args);
      EXPECT_EQ(binder.staging_bytes(), 2u * 4096u);  // verify reads back through the ring

      worker.inject_fault(FaultKind::corrupt_h2d, 2);  // the 2nd upload: 'cache'
      try {
        binder.run(args);
        FAIL() << "the corrupted upload was not caught";
      } catch (const BindError& e) {
        EXPECT_EQ(e.code(), ErrorCode::mismatch) << e.what();
        EXPECT_EQ(e.phase(), BindPhase::verify);
        EXPECT_EQ(e.tensor(), "cache");
        const std::string msg = e.what();
        EXPECT_NE(msg.find("'cache'"), std::string::npos) << msg;
        EXPECT_NE(msg.find("at byte 777 of"), std::string::npos) << msg;  // 1,554 / 2
      }
      EXPECT_EQ(worker.stats().device_count, 0u);
      EXPECT_EQ(snapshot(args), before);  // failed before any download

      // Verification spans pieces: a tensor of 3 pieces corrupted in its last one.
      const TaskArgs big = make_task({{"a", 5000, Direction::in}}, alloc);  // 10,000 bytes
      worker.inject_fault(FaultKind::corrupt_h2d, 3);
      try {
        binder.run(big);
        FAIL() << "the corrupted piece was not caught";
      } catch (const BindError& e) {
        EXPECT_EQ(e.tensor(), "a");
        // Piece 3 covers bytes 8,192 .. 9,999; its middle byte is 8,192 + 904.
        EXPECT_NE(std::string(e.what()).find("at byte 9,096 of"), std::string::npos) << e.what();
      }
    }
    EXPECT_EQ(worker.stats().pinned_count, pinned_before);
  }
}

// Without verification the same corruption goes through unnoticed: the check matters.
TEST_F(BindTest, WithoutVerifyACorruptedUploadGoesThrough) {
  PageableAllocator alloc;
  const TaskArgs args = make_task(kMixed, alloc);
  const auto before = snapshot(args);
  Binder binder(worker);
  worker.inject_fault(FaultKind::corrupt_h2d, 2);
  const BindReport rep = binder.run(args);
  // verify and execute did not run: they record exactly 0 (docs/bind.md), not the few
  // nanoseconds of an early return; the phases that ran record time.
  EXPECT_EQ(rep.phase(BindPhase::verify), 0.0);
  EXPECT_EQ(rep.phase(BindPhase::execute), 0.0);
  EXPECT_FALSE(rep.executed);
  EXPECT_GT(rep.phase(BindPhase::upload), 0.0);
  EXPECT_GT(rep.phase(BindPhase::device_alloc), 0.0);
  const auto after = snapshot(args);
  ASSERT_NE(after[1], before[1]);  // INOUT came back with the flipped byte
  EXPECT_EQ(after[1][777], before[1][777] ^ 0x40);
}

TEST_F(BindTest, DeviceOutOfMemoryReleasesAndSaysSo) {
  Worker small;
  WorkerOptions wo;
  wo.device_capacity_bytes = 4096;
  small.init("sim", 0, wo);
  PageableAllocator alloc;
  const TaskArgs args = make_task({{"a", 1000, Direction::in}, {"b", 2000, Direction::in}}, alloc);
  for (DeviceLayout layout : {DeviceLayout::arena, DeviceLayout::per_tensor}) {
    BindOptions opt;
    opt.layout = layout;
    Binder binder(small, opt);
    try {
      binder.run(args);
      FAIL() << "6,000 bytes cannot fit in 4,096";
    } catch (const BindError& e) {
      EXPECT_EQ(e.code(), ErrorCode::out_of_memory);
      EXPECT_EQ(e.phase(), BindPhase::device_alloc);
      EXPECT_EQ(e.tensor(), layout == DeviceLayout::per_tensor ? "b" : "");
    }
    EXPECT_EQ(small.stats().device_count, 0u);
  }
}

TEST_F(BindTest, UnknownCallableFailsAtExecute) {
  PageableAllocator alloc;
  const TaskArgs args = make_task(kMixed, alloc);
  BindOptions opt;
  opt.execute_callable = "sim.no_such_thing";
  Binder binder(worker, opt);
  try {
    binder.run(args);
    FAIL();
  } catch (const BindError& e) {
    EXPECT_EQ(e.code(), ErrorCode::not_found);
    EXPECT_EQ(e.phase(), BindPhase::execute);
    EXPECT_NE(std::string(e.what()).find("sim.no_such_thing"), std::string::npos);
  }
  EXPECT_EQ(worker.stats().device_count, 0u);
}

TEST_F(BindTest, BadOptionsAndWorkersAreRejected) {
  auto bad = [&](auto&& edit, const char* needle) {
    BindOptions opt;
    edit(opt);
    try {
      Binder b(worker, opt);
      FAIL() << needle;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::invalid_argument);
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  bad([](BindOptions& o) { o.staging_buffers = 0; }, "staging_buffers");
  bad([](BindOptions& o) { o.staging_buffers = 65; }, "staging_buffers");
  bad([](BindOptions& o) { o.staging_buffer_bytes = 0; }, "staging_buffer_bytes");
  bad([](BindOptions& o) { o.chunk_bytes = 0; }, "chunk_bytes");
  bad([](BindOptions& o) { o.arena_alignment = 48; }, "arena_alignment");
  bad([](BindOptions& o) { o.copy_threads = -1; }, "copy_threads");
  EXPECT_EQ(worker.stats().pinned_count, 0u);

  Worker idle;
  EXPECT_THROW(Binder{idle}, Error);
  EXPECT_THROW(parse_upload_path("sideways"), Error);
  EXPECT_EQ(parse_upload_path("staged"), UploadPath::staged);
  EXPECT_EQ(parse_device_layout("per_tensor"), DeviceLayout::per_tensor);
  EXPECT_THROW(parse_device_layout("heap"), Error);
}

TEST_F(BindTest, ReportTextNamesPhasesAndTensors) {
  PageableAllocator alloc;
  const TaskArgs args = make_task(kMixed, alloc);
  BindOptions opt;
  opt.upload = UploadPath::staged;
  Binder binder(worker, opt);
  const BindReport rep = binder.run(args);
  const std::string text = rep.to_string();
  for (const char* needle :
       {"3 of 4 tensors uploaded (inputs)", "device_alloc", "upload", "execute", "download",
        "release", "cache", "INOUT", "staged", "pageable", "through the staging ring"})
    EXPECT_NE(text.find(needle), std::string::npos) << needle << "\n" << text;
  for (double s : rep.phase_seconds) EXPECT_GE(s, 0.0);  // durations; their sizes are timing
}

// "staged" means only "sent through the staging ring": a direct bind's report never says
// it, the summary counts inputs as uploaded.
TEST_F(BindTest, ReportSaysStagedOnlyForTheRing) {
  PageableAllocator alloc;
  const TaskArgs args = make_task(kMixed, alloc);
  const BindReport rep = Binder(worker).run(args);
  EXPECT_EQ(rep.summary(), "3 of 4 tensors uploaded (inputs), 3,560 bytes");
  EXPECT_EQ(rep.to_string().find("staged"), std::string::npos) << rep.to_string();
  EXPECT_EQ(rep.to_string().find("staging ring"), std::string::npos) << rep.to_string();
}

}  // namespace
}  // namespace pinstage
