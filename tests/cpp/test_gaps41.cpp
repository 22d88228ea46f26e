// Issue 41, "Tests that do not catch what they guard": each test here fails when the bug
// its comment names is planted (scripts/mutation-check.sh plants each one). The pool's
// two streams, its trim and pending figures, a group's device ids that differ from the
// member indexes, check_writes after a later upload, the thread team's default, sidecar
// hashing across chunks, and the atomic writer's fsyncs (through its test seam).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "pinstage/atomic_file.h"
#include "pinstage/bind.h"
#include "pinstage/checkpoint.h"
#include "pinstage/parallel.h"
#include "pinstage/safetensors.h"
#include "pinstage/worker.h"
#include "pinstage/worker_group.h"
#include "temp_dir_test_util.h"
#include "tensor_test_util.h"

namespace pinstage {
namespace {

using test::error_of;
using test::pattern;

constexpr size_t kMiB = size_t{1} << 20;

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// ---- The pool: a block two streams' copies touched (tests/cpp/plugins/held_streams) ----

using HoldFn = int (*)(ps_device_ctx*, int, int);

class TwoStreamPool : public ::testing::Test {
 protected:
  void SetUp() override {
    WorkerOptions o;
    o.plugin_path = std::string(PINSTAGE_TEST_PLUGIN_DIR) + "/libheld_streams.so";
    worker.init("held_streams", 0, o);
    hold_fn = reinterpret_cast<HoldFn>(worker.backend_extension("held_streams.hold"));
    ASSERT_NE(hold_fn, nullptr);
  }
  void hold(int stream, bool held) {
    ASSERT_EQ(hold_fn(worker.native_context(), stream, held ? 1 : 0), PS_OK);
  }
  Worker worker;
  HoldFn hold_fn = nullptr;
};

// Planted bug: the block comes back once the first stream's event is reached, though a
// copy queued on the second may still read it (pool_first_stream_event_only,
// pool_poll_first_event); or a recycled block is never taken out of pending_bytes
// (pool_pending_bytes_kept).
TEST_F(TwoStreamPool, ABlockCopiedOnTwoStreamsComesBackOnlyWhenBothEventsAreReached) {
  DeviceBuffer dev = worker.alloc_device(2 * kMiB);
  Stream first = worker.create_stream();
  Stream second = worker.create_stream();
  PinnedHostBuffer a = worker.alloc_pinned_host(kMiB);
  void* const freed = a.data();
  hold(0, true);
  hold(1, true);
  worker.copy_to_device_async(dev, 0, freed, kMiB, first);
  worker.copy_to_device_async(dev, kMiB, freed, kMiB, second);
  a.reset();
  HostMemoryStats s = worker.host_memory_stats();
  EXPECT_EQ(s.pending_blocks, 1u);
  EXPECT_EQ(s.pending_bytes, kMiB);
  // sim ran both copies and both records; from here only the holds answer event_query.
  worker.synchronize(first);
  worker.synchronize(second);
  hold(0, false);  // the first stream's copies ran; the second's may not have
  s = worker.host_memory_stats();
  EXPECT_EQ(s.pending_blocks, 1u) << "recycled after the first stream's event alone";
  EXPECT_EQ(s.pending_bytes, kMiB);
  PinnedHostBuffer b = worker.alloc_pinned_host(kMiB);
  EXPECT_NE(b.data(), freed) << "handed out while the second stream may still read it";
  hold(1, false);
  s = worker.host_memory_stats();
  EXPECT_EQ(s.pending_blocks, 0u);
  EXPECT_EQ(s.pending_bytes, 0u) << "a recycled block still counted as pending";
  EXPECT_EQ(s.cached_bytes, kMiB);
  PinnedHostBuffer c = worker.alloc_pinned_host(kMiB);
  EXPECT_EQ(c.data(), freed) << "reusable once both streams' events are reached";
}

// ---- The pool's trim figures ----

// Planted bug: trim_host_cache(n) releases one segment more than n asks for
// (pool_trim_one_too_many).
TEST(Gaps41Pool, TrimReleasesWholeSegmentsUntilTheBytesAskedForAndNoMore) {
  Worker worker;
  WorkerOptions o;
  o.host_cache_limit_bytes = 64 * kMiB;
  worker.init("sim", 0, o);
  {
    PinnedHostBuffer a = worker.alloc_pinned_host(2 * kMiB);
    PinnedHostBuffer b = worker.alloc_pinned_host(2 * kMiB);
    PinnedHostBuffer c = worker.alloc_pinned_host(2 * kMiB);
  }
  HostMemoryStats s = worker.host_memory_stats();
  ASSERT_EQ(s.segments, 3u);
  ASSERT_EQ(s.cached_bytes, 6 * kMiB);
  EXPECT_EQ(worker.trim_host_cache(0), 0u) << "nothing asked, nothing released";
  EXPECT_EQ(worker.trim_host_cache(2 * kMiB), 2 * kMiB) << "exactly one segment";
  s = worker.host_memory_stats();
  EXPECT_EQ(s.segments, 2u);
  EXPECT_EQ(s.reserved_bytes, 4 * kMiB);
  EXPECT_EQ(s.cached_bytes, 4 * kMiB);
  EXPECT_EQ(s.num_host_free, 1u);
  EXPECT_EQ(worker.trim_host_cache(1), 2 * kMiB) << "one byte asked: one whole segment";
  s = worker.host_memory_stats();
  EXPECT_EQ(s.segments, 1u);
  EXPECT_EQ(s.num_host_free, 2u);
  EXPECT_EQ(worker.empty_cache(), 2 * kMiB);
  EXPECT_EQ(worker.host_memory_stats().reserved_bytes, 0u);
}

// ---- A group whose device ids are not its member indexes ----

// Planted bug: the GroupError of a failing member names its index, not its device id
// (group_error_names_index).
TEST(Gaps41Group, AFailingMemberIsNamedByItsDeviceIdNotItsIndex) {
  WorkerGroupOptions o;
  o.worker.config = {{"devices", "3"}};
  o.worker.device_capacity_bytes = 64 << 20;
  o.threads = 2;
  WorkerGroup group("sim", {1, 2}, o);
  ASSERT_EQ(group.device_ids(), (std::vector<int>{1, 2}));
  try {
    group.run_each([](size_t i, Worker& w) {
      if (w.device_id() == 2)
        throw Error(ErrorCode::invalid_argument, "member " + std::to_string(i));
    });
    FAIL() << "run_each returned";
  } catch (const GroupError& e) {
    EXPECT_EQ(e.device(), 2);
    EXPECT_EQ(e.index(), 1u);
    EXPECT_EQ(e.code(), ErrorCode::invalid_argument);
    EXPECT_TRUE(std::string(e.what()).starts_with("device 2: ")) << e.what();
  }
}

// ---- check_writes after a later upload ----

// Planted bug: the digest is taken at the first upload only, so after a declared change
// the check compares with bytes the device no longer holds (resident_digest_first_only).
TEST(Gaps41Resident, TheWriteCheckComparesWithTheLatestUpload) {
  Worker worker;
  worker.init("sim", 0, {});
  PinnedAllocator pinned(worker);
  TaskArgs args;
  Tensor x = Tensor::empty("x", DType::u8, {int64_t{5000}}, Direction::in, pinned);
  std::memset(x.data(), 1, 5000);
  args.add(std::move(x));
  ResidentBinder rb(worker, args, {}, true);
  rb.step();
  unsigned char* bytes = args.get("x").data_as<unsigned char>();
  bytes[4999] = 2;  // declared: step 2 uploads it and the check takes its digest again
  rb.mark_changed("x");
  EXPECT_EQ(rb.step().uploaded_bytes, 5000u);
  EXPECT_NO_THROW(rb.step()) << "the bytes are those uploaded at step 2";
  bytes[0] = 3;  // undeclared
  const Error e = error_of([&] { rb.step(); });
  EXPECT_EQ(e.code(), ErrorCode::mismatch);
  EXPECT_TRUE(contains(e.what(), "'x' changed since its upload at step 2")) << e.what();
}

// ---- The thread team's default ----

// Planted bug: default_thread_count() ignores the team and answers the process's count,
// which a test with the team's size equal to it cannot tell (thread_team_default_ignored).
TEST(Gaps41Threads, InsideATeamTheDefaultIsTheTeamsSizeWhateverTheProcesss) {
  const int process = process_thread_count();
  for (const int size : {1, process + 1, process + 2}) {
    if (size == process) continue;
    ThreadTeam team(size);
    int seen = 0;
    team.run([&] { seen = default_thread_count(); });
    EXPECT_EQ(seen, size) << "the process's count is " << process;
  }
  EXPECT_EQ(default_thread_count(), process);
}

// ---- Sidecar hashing of a tensor longer than one chunk ----

class Gaps41Files : public test::TempDirTest {
 protected:
  Gaps41Files() : TempDirTest("gaps41") {}
};

std::string read_file(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

// Planted bug: each chunk after the first reads the tensor's first chunk again
// (sidecar_rereads_first_chunk). Every earlier test tensor fit one 8 MiB chunk.
TEST_F(Gaps41Files, ASidecarHashesEveryChunkOfATensorLongerThanOne) {
  constexpr size_t kBytes = 5 * 4096 + 123;
  const std::vector<unsigned char> data = pattern(kBytes, 41);
  std::string header = R"({"t":{"dtype":"U8","shape":[)" + std::to_string(kBytes) +
                       R"(],"data_offsets":[0,)" + std::to_string(kBytes) + "]}}";
  header.append((8 - header.size() % 8) % 8, ' ');
  const std::string f = path("long.safetensors");
  {
    std::ofstream out(f, std::ios::binary);
    const uint64_t n = header.size();
    out.write(reinterpret_cast<const char*>(&n), 8);
    out << header;
    out.write(reinterpret_cast<const char*>(data.data()), static_cast<std::streamsize>(kBytes));
  }
  CheckpointLoadOptions small;
  small.chunk_bytes = 4096;
  small.threads = 1;
  hash_checkpoint(Checkpoint::open(f), small);
  const Checkpoint c = Checkpoint::open(f);
  ASSERT_TRUE(c.get("t").xxh3.has_value());
  EXPECT_EQ(*c.get("t").xxh3, xxh3_64(data.data(), kBytes)) << "the recorded hash";
  CheckpointLoadOptions verify;
  verify.verify = true;
  PageableAllocator pageable;
  EXPECT_TRUE(load_to_host(c, pageable, verify).report.verified);
}

// ---- The atomic writer's fsyncs (the seam in atomic_file.h) ----

struct SyncCall {
  bool directory = false;
  std::string target;  // the target's bytes when the call was made
};
std::vector<SyncCall> g_calls;
std::string g_target;
int g_fail_errno = 0;

int recording_fsync(int fd) {
  struct stat st {};
  EXPECT_EQ(::fstat(fd, &st), 0);
  g_calls.push_back({S_ISDIR(st.st_mode), read_file(g_target)});
  if (g_fail_errno != 0 && !S_ISDIR(st.st_mode)) {
    errno = g_fail_errno;
    return -1;
  }
  return ::fsync(fd);
}

struct FsyncSeam {
  FsyncSeam(const std::string& target, int fail_errno) {
    g_calls.clear();
    g_target = target;
    g_fail_errno = fail_errno;
    previous = set_atomic_file_fsync_for_tests(recording_fsync);
  }
  ~FsyncSeam() { set_atomic_file_fsync_for_tests(previous); }
  FsyncFunction previous = nullptr;
};

// Planted bugs: commit renames without fsyncing the file (atomic_commit_no_fsync), or
// without fsyncing the folder after the rename (atomic_commit_no_dir_fsync).
TEST_F(Gaps41Files, CommitSyncsTheFileBeforeTheRenameAndTheFolderAfterIt) {
  const std::string f = path("out.json");
  write_file_atomically(f, "old");
  const FsyncSeam seam(f, 0);
  write_file_atomically(f, "new");
  ASSERT_EQ(g_calls.size(), 2u) << "one fsync of the file, one of its folder";
  EXPECT_FALSE(g_calls[0].directory);
  EXPECT_EQ(g_calls[0].target, "old") << "the file is synced before the rename";
  EXPECT_TRUE(g_calls[1].directory);
  EXPECT_EQ(g_calls[1].target, "new") << "the folder is synced after the rename";
}

// A failed fsync is a failed commit: the target keeps its old bytes, no temporary stays.
TEST_F(Gaps41Files, AFailedFsyncLeavesTheTargetAsItWasAndNoTemporaryFile) {
  const std::string f = path("out.json");
  write_file_atomically(f, "old");
  {
    const FsyncSeam seam(f, EIO);
    const Error e = error_of([&] { write_file_atomically(f, "new"); });
    EXPECT_EQ(e.code(), ErrorCode::io);
    EXPECT_TRUE(contains(e.what(), "fsync failed")) << e.what();
  }
  EXPECT_EQ(read_file(f), "old");
  size_t entries = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir_)) {
    ++entries;
    EXPECT_EQ(entry.path().filename(), "out.json");
  }
  EXPECT_EQ(entries, 1u);
}

}  // namespace
}  // namespace pinstage
