// The restart cache (issue 50, docs/cache.md): the directory's checks, an entry's atomic
// fill, hit / miss / stale, two fillers, a filler killed mid-fill, a full file system, the
// limit, ls / rm / prune, and a second user who can neither read nor plant an entry. Each
// test has its own cache directory under /dev/shm, removed after it.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "checkpoint/cache_internal.h"
#include "cli_test_util.h"
#include "numa_test_util.h"
#include "pinstage/cache.h"
#include "pinstage/checkpoint.h"
#include "pinstage/error.h"
#include "pinstage/pages.h"
#include "pinstage/safetensors.h"
#include "pinstage/tensor.h"
#include "temp_dir_test_util.h"
#include "tensor_test_util.h"

namespace pinstage {
namespace {

namespace fs = std::filesystem;
using test::error_of;

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

class Cache : public test::TempDirTest {
 protected:
  Cache() : TempDirTest("cache") {}
  void SetUp() override {
    TempDirTest::SetUp();
    cache_ = "/dev/shm/pinstage-test50-" + std::to_string(::getpid()) + "-" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name();
  }
  void TearDown() override {
    std::error_code ec;
    if (!mounted_.empty()) ::umount2(mounted_.c_str(), MNT_DETACH);
    fs::remove_all(cache_, ec);
    TempDirTest::TearDown();
  }
  // Tensors of `bytes_each` bytes, every byte known from `salt`.
  TaskArgs tensors(int count, size_t bytes_each, unsigned salt) {
    TaskArgs args;
    PageableAllocator pageable;
    for (int i = 0; i < count; ++i) {
      args.add(Tensor::empty("w" + std::to_string(i), DType::u8, {static_cast<int64_t>(bytes_each)},
                             Direction::in, pageable));
      const auto want = test::pattern(bytes_each, salt + static_cast<unsigned>(i));
      std::memcpy(args.at(i).data(), want.data(), bytes_each);
    }
    return args;
  }
  // An indexed checkpoint directory of `shards` shards.
  std::string sharded(const std::string& name, int shards = 3, size_t bytes = 100 << 10,
                      unsigned salt = 1) {
    save_sharded_checkpoint(tensors(shards, bytes, salt), path(name), bytes);
    return path(name);
  }
  std::string single(const std::string& name, size_t bytes = 64 << 10, unsigned salt = 7) {
    save_safetensors(tensors(2, bytes, salt), path(name));
    return path(name);
  }
  std::set<std::string> names() const {
    std::set<std::string> out;
    for (const auto& e : fs::directory_iterator(cache_)) out.insert(e.path().filename());
    return out;
  }
  // The names that are neither an entry nor a lock file: a temporary left behind.
  std::vector<std::string> leftovers() const {
    std::vector<std::string> out;
    for (const std::string& n : names())
      if (n.size() != 16 && !n.ends_with(".lock")) out.push_back(n);
    return out;
  }

  std::string cache_;
  std::string mounted_;
};

// ---- the directory ----

TEST_F(Cache, AMissingDirectoryIsCreatedPrivateAndSaysWhatItIs) {
  const WeightCache cache = WeightCache::open(cache_);
  struct stat st {};
  ASSERT_EQ(::lstat(cache_.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0700u);
  EXPECT_EQ(st.st_uid, ::geteuid());
  const CacheDirInfo info = cache.info();
  EXPECT_EQ(info.path, cache_);
  EXPECT_EQ(info.fs, "tmpfs");
  EXPECT_EQ(info.page_bytes, static_cast<uint64_t>(::sysconf(_SC_PAGESIZE)));
  const UniqueFd dir(::open(cache_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  EXPECT_EQ(file_page_bytes(dir.get()), static_cast<size_t>(::sysconf(_SC_PAGESIZE)));
  EXPECT_EQ(file_page_bytes(-1), page_size()) << "no file: the base page";
  EXPECT_GT(info.free_bytes, 0u);
  EXPECT_EQ(info.used_bytes, 0u);
  EXPECT_EQ(info.entries, 0u);
}

// Seen failing with the owner check and with the mode check removed.
TEST_F(Cache, AnUnsafeDirectoryIsRefusedNamingTheFix) {
  ASSERT_EQ(::mkdir(cache_.c_str(), 0700), 0);
  for (mode_t mode : {0770, 0707, 0755, 0750, 0701}) {
    SCOPED_TRACE(mode);
    ASSERT_EQ(::chmod(cache_.c_str(), mode), 0);
    const Error e = error_of([&] { WeightCache::open(cache_); });
    EXPECT_EQ(e.code(), ErrorCode::invalid_argument);
    EXPECT_NE(std::string(e.what()).find("chmod 700 '" + cache_ + "'"), std::string::npos)
        << e.what();
  }
  ASSERT_EQ(::chmod(cache_.c_str(), 0700), 0);
  if (::geteuid() != 0) GTEST_SKIP() << "the foreign-owner case needs root to chown";
  ASSERT_EQ(::chown(cache_.c_str(), 65534, 65534), 0);
  const Error e = error_of([&] { WeightCache::open(cache_); });
  EXPECT_EQ(e.code(), ErrorCode::invalid_argument);
  EXPECT_NE(std::string(e.what()).find("belongs to uid 65534"), std::string::npos) << e.what();
  EXPECT_EQ(leftovers().size(), 0u);
}

// Seen failing with O_NOFOLLOW taken out of the open.
TEST_F(Cache, ASymbolicLinkOrAFileOrARelativePathIsRefused) {
  const std::string real = cache_ + "-real";
  ASSERT_EQ(::mkdir(real.c_str(), 0700), 0);
  ASSERT_EQ(::symlink(real.c_str(), cache_.c_str()), 0);
  Error e = error_of([&] { WeightCache::open(cache_); });
  EXPECT_EQ(e.code(), ErrorCode::invalid_argument);
  EXPECT_NE(std::string(e.what()).find("is a symbolic link"), std::string::npos) << e.what();
  ::unlink(cache_.c_str());
  ::rmdir(real.c_str());
  std::ofstream(cache_) << "x";
  e = error_of([&] { WeightCache::open(cache_); });
  EXPECT_NE(std::string(e.what()).find("is not a directory"), std::string::npos) << e.what();
  ::unlink(cache_.c_str());
  e = error_of([&] { WeightCache::open(std::string("relative/cache")); });
  EXPECT_NE(std::string(e.what()).find("not an absolute path"), std::string::npos) << e.what();
}

TEST_F(Cache, ADirectoryOnDiskIsRefused) {
  struct statfs sf {};
  ASSERT_EQ(::statfs(dir_.c_str(), &sf), 0);
  if (sf.f_type == 0x01021994 || sf.f_type == static_cast<decltype(sf.f_type)>(0x958458f6))
    GTEST_SKIP() << dir_ << " is on tmpfs here";
  const std::string on_disk = path("cache");
  ASSERT_EQ(::mkdir(on_disk.c_str(), 0700), 0);
  const Error e = error_of([&] { WeightCache::open(on_disk); });
  EXPECT_EQ(e.code(), ErrorCode::invalid_argument);
  EXPECT_NE(std::string(e.what()).find("neither hugetlbfs nor tmpfs"), std::string::npos)
      << e.what();
}

// ---- fill and lookup ----

// An entry is the checkpoint's own files, byte for byte, a valid checkpoint; the fill
// leaves no temporary. Seen failing with the rename left out (the entry stays a temporary).
TEST_F(Cache, AFilledEntryIsTheCheckpointsOwnBytesAndThenAHit) {
  WeightCache cache = WeightCache::open(cache_);
  for (const std::string& src : {sharded("m"), single("s.safetensors")}) {
    SCOPED_TRACE(src);
    const Checkpoint c = Checkpoint::open(src);
    EXPECT_EQ(cache.lookup(c).state, "miss");
    uint64_t last = 0, calls = 0;
    CacheFillOptions o;
    o.progress = [&](uint64_t done, uint64_t total) {
      EXPECT_GT(done, last);
      EXPECT_LE(done, total);
      last = done;
      ++calls;
    };
    const CacheLookup filled = cache.fill(c, o);
    EXPECT_EQ(filled.state, "filled");
    EXPECT_EQ(filled.key, cache_key(src));
    EXPECT_GT(calls, 0u);
    const Checkpoint e = Checkpoint::open(filled.entry_path);
    ASSERT_EQ(e.files().size(), c.files().size());
    for (size_t f = 0; f < c.files().size(); ++f)
      EXPECT_EQ(slurp(e.files()[f].path), slurp(c.files()[f].path)) << c.files()[f].path;
    ASSERT_EQ(e.tensors().size(), c.tensors().size());
    const CacheLookup again = cache.lookup(c);
    EXPECT_EQ(again.state, "hit");
    EXPECT_EQ(again.entry_path, filled.entry_path);
    EXPECT_EQ(cache.fill(c).state, "hit");
  }
  EXPECT_EQ(leftovers(), std::vector<std::string>{});
  EXPECT_EQ(cache.info().entries, 2u);
}

// A source that changed is never used: its size, mtime or inode. Seen failing with the
// identity comparison removed from source_change.
TEST_F(Cache, AChangedSourceIsStaleNamingTheFieldAndIsRefilled) {
  WeightCache cache = WeightCache::open(cache_);
  const std::string src = single("s.safetensors");
  ASSERT_EQ(cache.fill(Checkpoint::open(src)).state, "filled");
  struct timespec times[2] = {{0, UTIME_OMIT}, {12345, 0}};
  ASSERT_EQ(::utimensat(AT_FDCWD, src.c_str(), times, 0), 0);
  CacheLookup l = cache.lookup(Checkpoint::open(src));
  EXPECT_EQ(l.state, "stale");
  EXPECT_NE(l.reason.find("s.safetensors: the source's mtime changed"), std::string::npos)
      << l.reason;
  EXPECT_EQ(l.entry_path, "");
  ASSERT_EQ(cache.fill(Checkpoint::open(src)).state, "filled");
  // Same bytes and mtime, another inode (a writer's rename).
  fs::copy_file(src, src + ".new");
  ASSERT_EQ(::utimensat(AT_FDCWD, (src + ".new").c_str(), times, 0), 0);
  fs::rename(src + ".new", src);
  l = cache.lookup(Checkpoint::open(src));
  EXPECT_NE(l.reason.find("inode"), std::string::npos) << l.reason;
  single("s.safetensors", 65 << 10);  // rewritten larger
  const Checkpoint changed = Checkpoint::open(src);
  l = cache.lookup(changed);
  EXPECT_EQ(l.state, "stale");
  const CacheLookup refilled = cache.fill(changed);
  EXPECT_EQ(refilled.state, "filled");
  EXPECT_EQ(slurp(refilled.entry_path), slurp(src));
  EXPECT_EQ(cache.lookup(changed).state, "hit");
  EXPECT_EQ(leftovers(), std::vector<std::string>{}) << "the stale entry was left behind";
}

// Seen failing with entry_damage's size check removed (the truncated copy was a hit).
TEST_F(Cache, ADamagedEntryIsStale) {
  WeightCache cache = WeightCache::open(cache_);
  const Checkpoint c = Checkpoint::open(sharded("m"));
  const CacheLookup filled = cache.fill(c);
  const std::string shard =
      filled.entry_path + "/" + fs::path(c.files()[1].path).filename().string();
  ASSERT_EQ(::truncate(shard.c_str(), 100), 0);
  CacheLookup l = cache.lookup(c);
  EXPECT_EQ(l.state, "stale");
  EXPECT_NE(l.reason.find("the entry is damaged"), std::string::npos) << l.reason;
  ASSERT_EQ(cache.fill(c).state, "filled");
  const std::string manifest = filled.entry_path + "/" + kCacheManifestName;
  std::string text = slurp(manifest);
  text.insert(text.find('{') + 1, "\"format\": 1,");  // a repeated key
  std::ofstream(manifest, std::ios::trunc) << text;
  l = cache.lookup(c);
  EXPECT_EQ(l.state, "stale");
  EXPECT_NE(l.reason.find("manifest"), std::string::npos) << l.reason;
}

// A safetensors file with no hashes recorded (as a Hugging Face writer makes it): tensors
// "w0" and "w1" of `bytes` U8 each.
void write_unhashed(const std::string& path, size_t bytes) {
  const std::string n = std::to_string(bytes), n2 = std::to_string(2 * bytes);
  std::string header = "{\"w0\":{\"dtype\":\"U8\",\"shape\":[" + n + "],\"data_offsets\":[0," + n +
                       "]},\"w1\":{\"dtype\":\"U8\",\"shape\":[" + n + "],\"data_offsets\":[" + n +
                       "," + n2 + "]}}";
  header.resize((header.size() + 7) / 8 * 8, ' ');
  std::string file(8, '\0');
  for (int i = 0; i < 8; ++i) file[i] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
  const auto data = test::pattern(2 * bytes, 50);
  file += header + std::string(data.begin(), data.end());
  std::ofstream(path, std::ios::binary | std::ios::trunc) << file;
}

// With verify, a byte changed in place (size, mtime and inode of the source unchanged) is
// caught by the source's hashes, which the entry carries: here a hash sidecar's (the
// writer recorded none), copied as the entry's own. Seen failing with put_sidecar skipped
// (the verified load of the entry was refused: no recorded hash).
TEST_F(Cache, VerifyCatchesADamagedEntryByTheSourcesHashes) {
  WeightCache cache = WeightCache::open(cache_);
  const std::string src = path("s.safetensors");
  write_unhashed(src, 64 << 10);
  hash_checkpoint(src);
  const Checkpoint c = Checkpoint::open(src);
  ASSERT_TRUE(c.tensors()[0].xxh3.has_value());
  const CacheLookup filled = cache.fill(c);
  Worker worker;
  worker.init("sim");
  CheckpointLoadOptions o;
  o.verify = true;
  EXPECT_TRUE(load_to_host(Checkpoint::open(filled.entry_path), worker, o).report.verified);
  {
    std::fstream f(filled.entry_path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(c.tensors()[1].offset + 5));
    f.put(static_cast<char>(0x5a ^ slurp(src)[c.tensors()[1].offset + 5]));
  }
  EXPECT_EQ(cache.lookup(c).state, "hit") << "identity alone cannot see damage in place";
  const Error e = error_of([&] { load_to_host(Checkpoint::open(filled.entry_path), worker, o); });
  EXPECT_NE(std::string(e.what()).find("'w1'"), std::string::npos) << e.what();
}

// ---- two fillers ----

// The lines of /proc/locks that wait ("->") on the file `path`.
bool someone_waits_on(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return false;
  const std::string inode = ":" + std::to_string(st.st_ino) + " ";
  std::ifstream in("/proc/locks");
  std::string line;
  while (std::getline(in, line))
    if (line.find("->") != std::string::npos && line.find(inode) != std::string::npos) return true;
  return false;
}

// Two processes filling one checkpoint make one entry: the second waits on the key's lock
// (seen in /proc/locks: a latch, not a sleep) and then finds the first's entry, a hit.
// Seen failing with the flock taken out of fill (the child filled too: "filled").
TEST_F(Cache, TwoFillersOfOneCheckpointMakeOneEntry) {
  WeightCache cache = WeightCache::open(cache_);
  const std::string src = sharded("m");
  const Checkpoint c = Checkpoint::open(src);
  int go[2];
  ASSERT_EQ(::pipe(go), 0);
  const pid_t child = ::fork();
  if (child == 0) {
    char b = 0;
    if (::read(go[0], &b, 1) != 1) ::_exit(3);
    CacheFillOptions o;
    o.threads = 1;  // no thread pool in a forked child
    try {
      WeightCache mine = WeightCache::open(cache_);
      ::_exit(mine.fill(c, o).state == "hit" ? 0 : 1);
    } catch (...) {
      ::_exit(2);
    }
  }
  bool released = false;
  CacheFillOptions o;
  o.progress = [&](uint64_t, uint64_t) {
    if (released) return;
    released = true;
    char b = 1;
    ASSERT_EQ(::write(go[1], &b, 1), 1);
    const std::string lock = cache_ + "/" + cache_key(src) + ".lock";
    for (int i = 0; i < 1000000 && !someone_waits_on(lock); ++i) ::sched_yield();
    EXPECT_TRUE(someone_waits_on(lock)) << "the second filler never waited";
  };
  const CacheLookup first = cache.fill(c, o);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ::close(go[0]);
  ::close(go[1]);
  EXPECT_EQ(first.state, "filled");
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
      << "the second filler did not get a hit: status " << status;
  EXPECT_EQ(leftovers(), std::vector<std::string>{});
  EXPECT_EQ(cache.info().entries, 1u);
}

// ---- a crash mid-fill ----

// Forks a filler of `c` that stops in its first progress call, waits for it to get there
// and SIGKILLs it.
void kill_a_filler_mid_fill(const std::string& cache_dir, const Checkpoint& c) {
  int at[2];
  ASSERT_EQ(::pipe(at), 0);
  const pid_t child = ::fork();
  if (child == 0) {
    CacheFillOptions o;
    o.threads = 1;
    o.progress = [&](uint64_t, uint64_t) {
      char b = 1;
      (void)::write(at[1], &b, 1);
      for (;;) ::pause();
    };
    try {
      WeightCache::open(cache_dir).fill(c, o);
    } catch (...) {
    }
    ::_exit(1);
  }
  char b = 0;
  ASSERT_EQ(::read(at[0], &b, 1), 1);
  ASSERT_EQ(::kill(child, SIGKILL), 0);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ::close(at[0]);
  ::close(at[1]);
}

// SIGKILL mid-fill leaves no usable entry, only a temporary that ls calls "temp" and that
// prune, or the next fill, removes. Seen failing with the fill writing into <key> directly
// (the killed fill left a partial entry that lookup found).
TEST_F(Cache, AFillerKilledMidFillLeavesNoEntryAndPruneOrTheNextFillRemovesIt) {
  WeightCache cache = WeightCache::open(cache_);
  const Checkpoint c = Checkpoint::open(sharded("m"));
  kill_a_filler_mid_fill(cache_, c);
  EXPECT_EQ(cache.lookup(c).state, "miss");
  std::vector<CacheEntryInfo> ls = cache.list();
  ASSERT_EQ(ls.size(), 1u);
  EXPECT_EQ(ls[0].state, "temp");
  EXPECT_NE(ls[0].reason.find("its filler is gone"), std::string::npos) << ls[0].reason;
  const CachePruneReport pruned = cache.prune();
  EXPECT_EQ(pruned.temps, 1u);
  EXPECT_GT(pruned.freed_bytes, 0u);
  EXPECT_EQ(leftovers(), std::vector<std::string>{});
  EXPECT_EQ(names(), std::set<std::string>{}) << "prune left a lock file";
  kill_a_filler_mid_fill(cache_, c);
  ASSERT_EQ(leftovers().size(), 1u);
  EXPECT_EQ(cache.fill(c).state, "filled");
  EXPECT_EQ(leftovers(), std::vector<std::string>{}) << "the next fill left the temporary";
}

// ---- the limits ----

// A fill past the cache's limit, or the file system's room, fails before it writes, and
// one that runs out of room mid-fill (ENOSPC at a later file's fallocate) leaves nothing.
TEST_F(Cache, AFillPastTheLimitFailsClearlyAndLeavesNothing) {
  WeightCache cache = WeightCache::open(cache_);
  const Checkpoint c = Checkpoint::open(sharded("m"));
  CacheFillOptions o;
  o.max_bytes = c.total_bytes() / 2;
  const Error e = error_of([&] { cache.fill(c, o); });
  EXPECT_EQ(e.code(), ErrorCode::out_of_memory);
  EXPECT_NE(std::string(e.what()).find("past its limit"), std::string::npos) << e.what();
  EXPECT_EQ(leftovers(), std::vector<std::string>{});
  EXPECT_EQ(cache.lookup(c).state, "miss");
}

// Seen failing with fallocate skipped (the copy through the mapping died of SIGBUS).
TEST_F(Cache, AFullTmpfsIsOutOfMemoryWithNothingPartialLeft) {
  ASSERT_EQ(::mkdir(cache_.c_str(), 0700), 0);
  if (::mount("tmpfs", cache_.c_str(), "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=0700") != 0)
    GTEST_SKIP() << "cannot mount a small tmpfs here: " << std::strerror(errno);
  mounted_ = cache_;
  WeightCache cache = WeightCache::open(cache_);
  // Too large for it at all: refused before anything is written.
  const Checkpoint big = Checkpoint::open(sharded("big", 3, 400 << 10, 3));
  Error e = error_of([&] { cache.fill(big); });
  EXPECT_EQ(e.code(), ErrorCode::out_of_memory);
  EXPECT_NE(std::string(e.what()).find("bytes free"), std::string::npos) << e.what();
  EXPECT_EQ(leftovers(), std::vector<std::string>{});
  // Room at the start, none at the second shard (another process took it meanwhile).
  const Checkpoint c = Checkpoint::open(sharded("m", 2, 300 << 10, 4));
  CacheFillOptions o;
  bool taken = false;
  o.progress = [&](uint64_t, uint64_t) {
    if (taken) return;
    taken = true;
    std::ofstream(cache_ + "/ballast") << std::string(600 << 10, 'b');
  };
  e = error_of([&] { cache.fill(c, o); });
  EXPECT_EQ(e.code(), ErrorCode::out_of_memory) << e.what();
  EXPECT_NE(std::string(e.what()).find("has no room"), std::string::npos) << e.what();
  EXPECT_EQ(leftovers(), std::vector<std::string>{"ballast"});
  EXPECT_EQ(cache.lookup(c).state, "miss");
}

// ---- the mount's huge pages ----

// Seen failing with the octal escape left as it is.
TEST(CacheMounts, AMountinfoLineParsesAndAMalformedOneIsSkipped) {
  const auto m = detail::parse_mountinfo_line(
      "36 35 0:41 / /mnt/my\\040cache rw,nosuid shared:7 master:2 - tmpfs none "
      "rw,size=8388608k,mode=700,huge=within_size");
  ASSERT_TRUE(m);
  EXPECT_EQ(m->major, 0u);
  EXPECT_EQ(m->minor, 41u);
  EXPECT_EQ(m->mount_point, "/mnt/my cache");
  EXPECT_EQ(m->fs_type, "tmpfs");
  EXPECT_EQ(m->super_options, "rw,size=8388608k,mode=700,huge=within_size");
  const auto plain = detail::parse_mountinfo_line("25 1 8:2 / / rw - ext4 /dev/sda2 rw");
  ASSERT_TRUE(plain);
  EXPECT_EQ(plain->major, 8u);
  EXPECT_EQ(plain->mount_point, "/");
  for (const char* bad : {
           "",
           "25 1 8:2 / / rw ext4 /dev/sda2 rw",          // no separator
           "25 1 8-2 / / rw - ext4 /dev/sda2 rw",        // a device that is not MAJOR:MINOR
           "25 1 8:2x / / rw - ext4 /dev/sda2 rw",       // trailing junk in the device
           "25 1 8:2 / /a\\04 rw - tmpfs none rw",       // a short escape
           "25 1 8:2 / /a\\048b rw - tmpfs none rw",     // a non-octal digit
           "25 1 8:2 / relative rw - tmpfs none rw",     // not an absolute mount point
           "25 1 8:2 / / rw - ext4 /dev/sda2",           // no super options
           "25 1 8:2 / / rw - ext4 /dev/sda2 rw extra",  // a field too many
           "25 1 8:2 / /",                               // cut short
       })
    EXPECT_FALSE(detail::parse_mountinfo_line(bad)) << "'" << bad << "' parsed";
}

// Seen failing with the first mount on the device taken (not the longest prefix), and with
// a prefix matched inside a component (/dev/shm/a for /dev/shm/ab).
TEST(CacheMounts, TheCacheDirectorysMountIsTheLongestMountPointOnItsDevice) {
  const std::string info =
      "1 0 8:1 / / rw - ext4 /dev/sda1 rw\n"
      "2 1 0:25 / /dev/shm rw - tmpfs tmpfs rw,size=64k\n"
      "this line is malformed\n"
      "3 2 0:25 /sub /dev/shm/a\\040b rw - tmpfs tmpfs rw,huge=always\n"
      "4 1 0:26 / /dev/shmx rw - tmpfs tmpfs rw,huge=advise\n"
      "5 2 0:25 /a /dev/shm/a rw - tmpfs tmpfs rw\n";
  const dev_t shm = ::makedev(0, 25);
  EXPECT_EQ(detail::mount_of(info, shm, "/dev/shm/a b/cache")->mount_point, "/dev/shm/a b");
  EXPECT_EQ(detail::mount_of(info, shm, "/dev/shm/ab")->mount_point, "/dev/shm");
  EXPECT_EQ(detail::mount_of(info, shm, "/dev/shm")->mount_point, "/dev/shm");
  // Reached through a link (no mount point on the device is a prefix): the last line on it.
  EXPECT_EQ(detail::mount_of(info, shm, "/run/shm/c")->mount_point, "/dev/shm/a");
  EXPECT_EQ(detail::mount_of(info, ::makedev(0, 26), "/dev/shmx/c")->super_options,
            "rw,huge=advise");
  EXPECT_FALSE(detail::mount_of(info, ::makedev(0, 99), "/dev/shm/c"));
  EXPECT_FALSE(detail::mount_of("", shm, "/dev/shm/c"));
}

// Seen failing with shmem_enabled's deny ignored.
TEST(CacheMounts, TmpfsHugeIsItsMountOptionUnlessTheKernelDeniesOrForcesIt) {
  const char* sysfs = "always within_size advise [never] deny force\n";
  EXPECT_EQ(detail::tmpfs_huge("rw,size=64k,mode=700", sysfs), "never");
  EXPECT_EQ(detail::tmpfs_huge("rw,huge=within_size", sysfs), "within_size");
  EXPECT_EQ(detail::tmpfs_huge("huge=always", ""), "always");
  EXPECT_EQ(detail::tmpfs_huge("rw,huge=advise,size=1m", sysfs), "advise");
  EXPECT_EQ(detail::tmpfs_huge("rw,huge=sometimes", sysfs), "unknown");
  EXPECT_EQ(detail::tmpfs_huge("rw,huge=always,huge=never", sysfs), "unknown");
  EXPECT_EQ(detail::tmpfs_huge("rw,huge=always", "always within_size advise never [deny] force"),
            "never");
  EXPECT_EQ(detail::tmpfs_huge("rw", "always within_size advise never deny [force]"), "always");
}

// ---- ls, rm, prune ----

// Seen failing with prune's sort by last use reversed (the entry just used was evicted).
TEST_F(Cache, LsRmAndPruneByLastUse) {
  WeightCache cache = WeightCache::open(cache_);
  const Checkpoint a = Checkpoint::open(sharded("a", 2, 64 << 10, 1));
  const Checkpoint b = Checkpoint::open(sharded("b", 2, 64 << 10, 2));
  const Checkpoint s = Checkpoint::open(single("s.safetensors"));
  cache.fill(a);
  cache.fill(b);
  cache.fill(s);
  ASSERT_EQ(cache.lookup(a).state, "hit");  // a: the most recent use
  std::vector<CacheEntryInfo> ls = cache.list();
  ASSERT_EQ(ls.size(), 3u);
  for (const CacheEntryInfo& e : ls) {
    EXPECT_EQ(e.state, "ok") << e.reason;
    EXPECT_GT(e.bytes, 0u);
  }
  cache.remove(s.path());
  EXPECT_EQ(cache.lookup(s).state, "miss");
  Error e = error_of([&] { cache.remove(s.path()); });
  EXPECT_EQ(e.code(), ErrorCode::not_found);
  EXPECT_NE(std::string(e.what()).find("pinstage cache ls"), std::string::npos) << e.what();
  e = error_of([&] { cache.remove(path("gone.safetensors")); });
  EXPECT_EQ(e.code(), ErrorCode::not_found);
  EXPECT_NE(std::string(e.what()).find("by its key"), std::string::npos) << e.what();
  const uint64_t a_bytes =
      cache.list()[0].key == cache_key(a.path()) ? cache.list()[0].bytes : cache.list()[1].bytes;
  const CachePruneReport r = cache.prune(a_bytes);
  EXPECT_EQ(r.evicted, 1u);
  EXPECT_EQ(cache.lookup(a).state, "hit") << "the most recently used entry was evicted";
  EXPECT_EQ(cache.lookup(b).state, "miss");
  // A stale entry: pruned without a limit.
  struct timespec times[2] = {{0, UTIME_OMIT}, {12345, 0}};
  ASSERT_EQ(::utimensat(AT_FDCWD, a.files()[0].path.c_str(), times, 0), 0);
  ls = cache.list();
  ASSERT_EQ(ls.size(), 1u);
  EXPECT_EQ(ls[0].state, "stale");
  EXPECT_EQ(cache.prune().stale, 1u);
  EXPECT_EQ(names(), std::set<std::string>{});
}

// Removing an entry a process still maps is safe for it: its mapping keeps the pages.
// (tmpfs and hugetlbfs free a file's pages when its last name and last mapping go.) Seen
// failing with remove_at truncating each file before unlinking it (SIGBUS on the read).
TEST_F(Cache, RemovingAnEntryAMappingHoldsKeepsItsBytes) {
  WeightCache cache = WeightCache::open(cache_);
  const std::string src = single("s.safetensors");
  const Checkpoint c = Checkpoint::open(src);
  const CacheLookup filled = cache.fill(c);
  Worker worker;
  worker.init("sim");
  CheckpointLoadOptions o;
  o.mode = LoadMode::map;
  const HostLoad load = load_to_host(Checkpoint::open(filled.entry_path), worker, o);
  cache.remove(filled.key);
  EXPECT_FALSE(fs::exists(filled.entry_path));
  const std::string want = slurp(src);
  for (const HostTensor& t : load.tensors)
    EXPECT_EQ(std::memcmp(t.storage->data(), want.data() + t.info.offset, t.info.bytes), 0);
}

// An entry filled for a node has its pages bound there: tmpfs keeps the policy with the
// file (a shared policy), so a fresh mapping of the entry reads it back with
// get_mempolicy. Seen failing with CacheFillOptions::numa_node left out of the placement.
TEST_F(Cache, AnEntryFilledForANodeIsBoundThere) {
  WeightCache cache = WeightCache::open(cache_);
  const Checkpoint c = Checkpoint::open(single("s.safetensors"));
  CacheFillOptions o;
  o.numa_node = 0;
  const CacheLookup filled = cache.fill(c, o);
  const int fd = ::open(filled.entry_path.c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  const size_t bytes = static_cast<size_t>(::lseek(fd, 0, SEEK_END));
  void* m = ::mmap(nullptr, bytes, PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);
  ASSERT_NE(m, MAP_FAILED);
  const test::NumaPolicy policy = test::numa_policy_of(m);
  const auto* pages = static_cast<const volatile unsigned char*>(m);
  for (size_t off = 0; off < bytes; off += 4096)
    (void)pages[off];  // page_nodes asks of mapped pages
  for (int node : test::page_nodes(m, bytes)) EXPECT_EQ(node, 0);
  ::munmap(m, bytes);
  EXPECT_EQ(policy.mode, test::kMpolBind);
  EXPECT_EQ(policy.mask, 1ul);
  o.numa_node = -2;
  EXPECT_EQ(error_of([&] { cache.fill(Checkpoint::open(single("t.safetensors")), o); }).code(),
            ErrorCode::invalid_argument);
}

// ---- another user ----

// Runs `command` as uid/gid 65534 with no groups: its exit status.
int as_nobody(const std::string& command) {
  return std::system(
      ("setpriv --reuid=65534 --regid=65534 --clear-groups " + command + " >/dev/null 2>&1")
          .c_str());
}

// Another user can neither read an entry nor plant one. Seen failing with the directory
// made 0755 (the read succeeded).
TEST_F(Cache, AnotherUserCanNeitherReadNorPlantAnEntry) {
  if (std::system("command -v setpriv >/dev/null 2>&1") != 0) GTEST_SKIP() << "no setpriv";
  if (::geteuid() != 0) GTEST_SKIP() << "setpriv to another user needs root";
  WeightCache cache = WeightCache::open(cache_);
  const Checkpoint c = Checkpoint::open(single("s.safetensors"));
  const CacheLookup filled = cache.fill(c);
  EXPECT_NE(as_nobody("cat '" + filled.entry_path + "'"), 0) << "another user read the weights";
  EXPECT_NE(as_nobody("ls '" + cache_ + "'"), 0) << "another user listed the cache";
  EXPECT_NE(as_nobody("mkdir '" + cache_ + "/0123456789abcdef'"), 0) << "another user planted";
  EXPECT_NE(as_nobody("cp /etc/hostname '" + filled.entry_path + "'"), 0);
  EXPECT_EQ(cache.lookup(c).state, "hit");
  EXPECT_EQ(slurp(filled.entry_path), slurp(c.path()));
}

// ---- loads through the cache ----

// The line of /proc/self/maps whose range holds `addr` ("" when none): its permissions and
// the file it maps.
std::string mapping_of(const void* addr) {
  const auto a = reinterpret_cast<uintptr_t>(addr);
  std::ifstream in("/proc/self/maps");
  for (std::string line; std::getline(in, line);) {
    unsigned long lo = 0, hi = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx", &lo, &hi) == 2 && a >= lo && a < hi) return line;
  }
  return "";
}

class CacheLoads : public Cache {
 protected:
  void SetUp() override {
    Cache::SetUp();
    ::setenv("PINSTAGE_CACHE_DIR", cache_.c_str(), 1);
    worker_.init("sim");
  }
  void TearDown() override {
    ::unsetenv("PINSTAGE_CACHE_DIR");
    Cache::TearDown();
  }
  void expect_source_bytes(const Checkpoint& c, const HostLoad& load) {
    ASSERT_EQ(load.tensors.size(), c.tensors().size());
    for (const HostTensor& t : load.tensors) {
      const std::string file = slurp(c.files()[t.info.file].path);
      EXPECT_EQ(std::memcmp(t.storage->data(), file.data() + t.info.offset, t.info.bytes), 0)
          << t.info.name;
    }
  }
  // A load's options through the cache, with `mode` and `verify`.
  static CheckpointLoadOptions through_cache(CacheUse use, LoadMode mode, bool verify) {
    CheckpointLoadOptions o;
    o.mode = mode;
    o.cache = use;
    o.verify = verify;
    return o;
  }
  Worker worker_;
};

// A hit in map mode is the entry mapped in place: read-only, pinned, the entry's pages (not
// the source's). Seen failing with load_host_through_cache loading the source on a hit.
TEST_F(CacheLoads, AHitInMapModeIsTheEntryPinnedInPlaceReadOnly) {
  const Checkpoint c = Checkpoint::open(sharded("m"));
  WeightCache::open(cache_).fill(c);
  const HostLoad load =
      load_to_host(c, worker_, through_cache(CacheUse::use, LoadMode::map, /*verify=*/true));
  EXPECT_EQ(load.report.cache, "hit");
  EXPECT_EQ(load.report.cache_entry, cache_ + "/" + cache_key(c.path()));
  EXPECT_TRUE(load.report.verified);
  expect_source_bytes(c, load);
  for (const HostTensor& t : load.tensors) {
    EXPECT_TRUE(t.storage->read_only());
    EXPECT_TRUE(worker_.is_pinned_host(t.storage->data(), t.info.bytes));
    const std::string map = mapping_of(t.storage->data());
    EXPECT_NE(map.find(" r--s "), std::string::npos) << map;
    EXPECT_NE(map.find(load.report.cache_entry + "/"), std::string::npos) << map;
  }
  std::vector<std::string> keys;
  for (const ReportField& f : report_fields(load.report)) keys.push_back(f.key);
  const auto at = std::find(keys.begin(), keys.end(), "cache");
  ASSERT_NE(at, keys.end());
  EXPECT_EQ(*(at + 1), "cache_entry");
  EXPECT_EQ(*(at + 2), "cache_note");
  EXPECT_EQ(*(at - 1), "host_pages");
}

// A hit in copy mode: writable private copies of the entry (file_private), pinned; a write
// reaches neither the entry nor the next load. Seen failing with map_files_pinned ignoring
// writable (the tensors were read-only views of the entry).
TEST_F(CacheLoads, AHitInCopyModeIsAWritablePrivateCopyOfTheEntry) {
  const std::string src = single("s.safetensors");
  const Checkpoint c = Checkpoint::open(src);
  const CacheLookup filled = WeightCache::open(cache_).fill(c);
  CheckpointLoadOptions o;
  o.cache = CacheUse::use;
  HostLoad load = load_to_host(c, worker_, o);
  EXPECT_EQ(load.report.cache, "hit");
  EXPECT_EQ(load.report.mode, "copy");
  EXPECT_NE(load.report.map_note.find("file_private"), std::string::npos) << load.report.map_note;
  expect_source_bytes(c, load);
  const HostTensor& t = load.tensors[1];
  ASSERT_FALSE(t.storage->read_only());
  EXPECT_TRUE(worker_.is_pinned_host(t.storage->data(), t.info.bytes));
  const std::string map = mapping_of(t.storage->data());
  ASSERT_NE(map.find(" rw-p "), std::string::npos) << map;  // before the write below
  EXPECT_NE(map.find(filled.entry_path), std::string::npos) << map;
  std::memset(t.storage->data(), 0xee, t.info.bytes);
  EXPECT_EQ(slurp(filled.entry_path), slurp(src)) << "the write reached the entry";
  const HostLoad again = load_to_host(c, worker_, o);
  expect_source_bytes(c, again);
}

// use: a miss loads the source and writes nothing; fill: fills, then loads the entry;
// a changed source is "stale" and loads the source as it is now. Seen failing with
// CacheUse::use filling a miss.
TEST_F(CacheLoads, UseLoadsTheSourceOnAMissAndFillFillsIt) {
  const std::string src = single("s.safetensors");
  CheckpointLoadOptions o = through_cache(CacheUse::use, LoadMode::map, /*verify=*/false);
  HostLoad load = load_to_host(Checkpoint::open(src), worker_, o);
  EXPECT_EQ(load.report.cache, "miss");
  EXPECT_EQ(load.report.cache_entry, "");
  EXPECT_EQ(WeightCache::open(cache_).info().entries, 0u);
  o.cache = CacheUse::fill;
  load = load_to_host(Checkpoint::open(src), worker_, o);
  EXPECT_EQ(load.report.cache, "filled");
  EXPECT_NE(mapping_of(load.tensors[0].storage->data()).find(cache_), std::string::npos);
  single("s.safetensors", 64 << 10, 99);  // rewritten
  const Checkpoint changed = Checkpoint::open(src);
  o.cache = CacheUse::use;
  load = load_to_host(changed, worker_, o);
  EXPECT_EQ(load.report.cache, "stale");
  EXPECT_NE(load.report.cache_note.find("changed"), std::string::npos) << load.report.cache_note;
  expect_source_bytes(changed, load);
  EXPECT_EQ(mapping_of(load.tensors[0].storage->data()).find(cache_), std::string::npos)
      << "a stale entry was used";
  o.cache = CacheUse::off;
  EXPECT_EQ(load_to_host(changed, worker_, o).report.cache, "off");
}

// A device load from a hit uploads from the entry's pinned mappings: map mode's path, no
// staging ring. Seen failing with the device route keeping copy mode (a ring was pinned).
TEST_F(CacheLoads, ADeviceLoadFromAHitUploadsFromTheMappingWithNoRing) {
  const Checkpoint c = Checkpoint::open(sharded("m"));
  CheckpointLoadOptions o;
  o.cache = CacheUse::fill;
  o.verify = true;
  const DeviceLoad load = load_to_device(c, worker_, o);
  EXPECT_EQ(load.report.cache, "filled");
  EXPECT_EQ(load.report.mode, "map");
  EXPECT_EQ(load.report.ring_pinned_bytes, 0u);
  EXPECT_TRUE(load.report.verified);
  for (const DeviceTensor& t : load.tensors) {
    std::string back(t.info.bytes, '\0');
    if (t.info.bytes > 0) worker_.copy_to_host(back.data(), t.buffer, 0, t.info.bytes);
    EXPECT_EQ(back, slurp(c.files()[t.info.file].path).substr(t.info.offset, t.info.bytes));
  }
  const DeviceLoad hit = load_to_device(c, worker_, o, {"w1"});
  EXPECT_EQ(hit.report.cache, "hit");
  EXPECT_EQ(hit.tensors.size(), 1u);
}

// total_s is the wall time of the whole load, the cache's route (lookup, fill, the entry's
// open) included: a fill held 100 ms in its phase callback shows in it, on the host and the
// device path. Seen failing with total_s left to the routed load (a few ms each).
TEST_F(CacheLoads, TotalSecondsCountTheRouteAndTheFill) {
  const std::string src = single("s.safetensors");
  CheckpointLoadOptions o = through_cache(CacheUse::fill, LoadMode::map, /*verify=*/false);
  o.phase = [](const char* phase) {
    if (std::string_view(phase) == "fill")
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
  };
  const HostLoad host = load_to_host(Checkpoint::open(src), worker_, o);
  EXPECT_EQ(host.report.cache, "filled");
  EXPECT_GE(host.report.total_s, 0.1);
  WeightCache::open(cache_).remove(Checkpoint::open(src).path());
  const DeviceLoad device = load_to_device(Checkpoint::open(src), worker_, o);
  EXPECT_EQ(device.report.cache, "filled");
  EXPECT_GE(device.report.total_s, 0.1);
}

// ---- the CLI ----

std::string cli(const std::string& cache, const std::string& args) {
  return "PINSTAGE_CACHE_DIR='" + cache + "' " PINSTAGE_CLI_PATH " cache " + args;
}

// put, ls, the directory's description, rm and prune, each with --json. Seen failing with
// run_ls printing nothing for a temporary (state "temp" missing).
TEST_F(Cache, TheCliPutsListsRemovesAndPrunes) {
  const std::string src = sharded("m");
  test::CommandResult r = test::run_command(cli(cache_, "put '" + src + "' --json - --quiet"));
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("\"state\": \"filled\""), std::string::npos) << r.output;
  r = test::run_command(cli(cache_, "put '" + src + "' --quiet"));
  EXPECT_NE(r.output.find("cached already"), std::string::npos) << r.output;
  r = test::run_command(cli(cache_, "--json -"));
  EXPECT_NE(r.output.find("\"fs\": \"tmpfs\""), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("\"entries\": 1"), std::string::npos) << r.output;
  kill_a_filler_mid_fill(cache_, Checkpoint::open(single("s.safetensors")));
  r = test::run_command(cli(cache_, "ls"));
  EXPECT_NE(r.output.find(cache_key(src) + "  ok"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("temp"), std::string::npos) << r.output;
  r = test::run_command(cli(cache_, "prune --json -"));
  EXPECT_NE(r.output.find("\"temps\": 1"), std::string::npos) << r.output;
  r = test::run_command(cli(cache_, "rm '" + src + "'"));
  EXPECT_EQ(r.status, 0);
  ASSERT_EQ(test::run_command(cli(cache_, "put '" + src + "' --quiet")).status, 0);
  r = test::run_command(cli(cache_, "prune --max-bytes 0 --json -"));
  EXPECT_NE(r.output.find("\"evicted\": 1"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("\"removed\": [\n    \"" + cache_key(src) + "\"\n  ]"), std::string::npos)
      << r.output;
  r = test::run_command(cli(cache_, "rm '" + src + "' 2>&1"));
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.output.find("not_found"), std::string::npos) << r.output;
  r = test::run_command(cli(cache_, "prune --max-bytes 12Q 2>&1"));
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.output.find("--max-bytes"), std::string::npos) << r.output;
  EXPECT_EQ(names(), std::set<std::string>{});
}

// Another user running pinstage against this user's cache can neither list it, load from
// it nor plant an entry in it. Seen failing with the cache directory made 0755 and both the
// owner and the mode check removed (ls listed the entry).
TEST_F(Cache, AnotherUsersPinstageCanNeitherReadNorPlant) {
  if (std::system("command -v setpriv >/dev/null 2>&1") != 0) GTEST_SKIP() << "no setpriv";
  if (::geteuid() != 0) GTEST_SKIP() << "setpriv to another user needs root";
  if (as_nobody(PINSTAGE_CLI_PATH " --version") != 0)
    GTEST_SKIP() << "user 65534 cannot run " PINSTAGE_CLI_PATH " (its folders are private)";
  const std::string src = single("s.safetensors");
  ASSERT_EQ(::chmod(dir_.c_str(), 0755), 0);  // the checkpoint is readable by the other user
  ASSERT_EQ(::chmod(src.c_str(), 0644), 0);
  WeightCache cache = WeightCache::open(cache_);
  const CacheLookup filled = cache.fill(Checkpoint::open(src));
  EXPECT_NE(as_nobody("env PINSTAGE_CACHE_DIR='" + cache_ + "' " PINSTAGE_CLI_PATH " cache ls"), 0)
      << "another user listed the cache";
  EXPECT_NE(as_nobody("env PINSTAGE_CACHE_DIR='" + cache_ +
                      "' " PINSTAGE_CLI_PATH " load --map --cache use '" + src + "'"),
            0);
  EXPECT_NE(as_nobody("env PINSTAGE_CACHE_DIR='" + cache_ + "' " PINSTAGE_CLI_PATH " cache put '" +
                      src + "'"),
            0)
      << "another user filled this user's cache";
  EXPECT_NE(as_nobody("env PINSTAGE_CACHE_DIR='" + cache_ + "' " PINSTAGE_CLI_PATH " cache rm " +
                      filled.key),
            0);
  EXPECT_EQ(cache.lookup(Checkpoint::open(src)).state, "hit");
  EXPECT_EQ(leftovers(), std::vector<std::string>{});
}

// ---- hugetlbfs ----

uint64_t free_huge_pages() {
  std::ifstream in("/proc/meminfo");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("HugePages_Free:", 0) == 0) return std::stoull(line.substr(15));
  return 0;
}

// Counts the mappings of files under `dir` in this process.
size_t mappings_under(const std::string& dir) {
  std::ifstream in("/proc/self/maps");
  size_t n = 0;
  for (std::string line; std::getline(in, line);) n += line.find(dir + "/") != std::string::npos;
  return n;
}

// On hugetlbfs (which takes no write()) an entry is filled through mappings made and unmapped
// in whole huge pages, and a hit maps it so; a fill past the reservation is refused before
// it writes. Needs root and 4 free 2 MiB pages (vm.nr_hugepages), else skipped. Seen
// failing with shared_named mapping base pages (its munmap failed: the fill's mapping
// stayed).
TEST_F(CacheLoads, OnHugetlbfsEntriesAreFilledAndMappedInWholeHugePages) {
  if (free_huge_pages() < 4) GTEST_SKIP() << "fewer than 4 free huge pages (vm.nr_hugepages)";
  ASSERT_EQ(::mkdir(cache_.c_str(), 0700), 0);
  if (::mount("none", cache_.c_str(), "hugetlbfs", MS_NOSUID | MS_NODEV, "pagesize=2M,mode=0700") !=
      0)
    GTEST_SKIP() << "cannot mount hugetlbfs here: " << std::strerror(errno);
  mounted_ = cache_;
  WeightCache cache = WeightCache::open(cache_);
  EXPECT_EQ(cache.info().fs, "hugetlbfs");
  EXPECT_EQ(cache.info().page_bytes, uint64_t{2} << 20);
  {
    const UniqueFd dir(::open(cache_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    EXPECT_EQ(file_page_bytes(dir.get()), size_t{2} << 20);
  }
  const Checkpoint c = Checkpoint::open(single("s.safetensors", 300 << 10));
  EXPECT_EQ(cache.fill(c).state, "filled");
  EXPECT_EQ(mappings_under(cache_), 0u) << "the fill left a mapping";
  {
    const HostLoad load =
        load_to_host(c, worker_, through_cache(CacheUse::use, LoadMode::map, /*verify=*/false));
    EXPECT_EQ(load.report.cache, "hit");
    expect_source_bytes(c, load);
    EXPECT_EQ(mappings_under(cache_), 1u);
  }
  EXPECT_EQ(mappings_under(cache_), 0u) << "the hit's mapping was not unmapped";
  const uint64_t pages = free_huge_pages();
  const Checkpoint big = Checkpoint::open(sharded("big", static_cast<int>(pages) + 1, 1 << 20));
  const Error e = error_of([&] { cache.fill(big); });
  EXPECT_EQ(e.code(), ErrorCode::out_of_memory);
  EXPECT_EQ(leftovers(), std::vector<std::string>{});
}

// The kB of `field` ("ShmemPmdMapped:") in the /proc/self/smaps block of the mapping that
// holds `addr`, or -1 when there is none.
long smaps_kb(const void* addr, const std::string& field) {
  const auto a = reinterpret_cast<uintptr_t>(addr);
  std::ifstream in("/proc/self/smaps");
  bool inside = false;
  for (std::string line; std::getline(in, line);) {
    unsigned long lo = 0, hi = 0;
    char dash = 0;
    if (std::sscanf(line.c_str(), "%lx%c%lx", &lo, &dash, &hi) == 3 && dash == '-')
      inside = a >= lo && a < hi;
    else if (inside && line.rfind(field, 0) == 0)
      return std::stol(line.substr(field.size()));
  }
  return -1;
}

// A tmpfs mounted huge=within_size: the cache says so, and a hit maps the entry in 2 MiB
// pages with no reservation (docs/cache.md, "tmpfs with huge pages"). Needs root to mount,
// else skipped; TearDown unmounts it. Seen failing with info() not reading the mount's
// options (it said "never").
TEST_F(CacheLoads, OnATmpfsMountedWithHugePagesAHitIsMappedIn2MiBPages) {
  ASSERT_EQ(::mkdir(cache_.c_str(), 0700), 0);
  if (::mount("none", cache_.c_str(), "tmpfs", MS_NOSUID | MS_NODEV,
              "huge=within_size,size=32m,mode=0700") != 0)
    GTEST_SKIP() << "cannot mount tmpfs here: " << std::strerror(errno);
  mounted_ = cache_;
  WeightCache cache = WeightCache::open(cache_);
  const CacheDirInfo info = cache.info();
  EXPECT_EQ(info.fs, "tmpfs");
  if (slurp("/sys/kernel/mm/transparent_hugepage/shmem_enabled").find("[deny]") !=
      std::string::npos)
    GTEST_SKIP() << "shmem_enabled is deny: no tmpfs gets huge pages here";
  EXPECT_EQ(info.huge, "within_size");
  const Checkpoint c = Checkpoint::open(single("s.safetensors", 4 << 20));
  EXPECT_EQ(cache.fill(c).state, "filled");
  const HostLoad load =
      load_to_host(c, worker_, through_cache(CacheUse::use, LoadMode::map, /*verify=*/false));
  EXPECT_EQ(load.report.cache, "hit");
  expect_source_bytes(c, load);
  const void* data = load.tensors[0].storage->data();
  EXPECT_NE(mapping_of(data).find(cache_ + "/"), std::string::npos) << mapping_of(data);
  EXPECT_GE(smaps_kb(data, "ShmemPmdMapped:"), 2048) << "the hit is not mapped in 2 MiB pages";
}

}  // namespace
}  // namespace pinstage
