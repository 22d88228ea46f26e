// The one atomic writer: the target is replaced whole or not at all, a non-regular
// target is refused before any work, and no temporary file is left behind.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <string>

#include "pinstage/atomic_file.h"
#include "pinstage/error.h"
#include "pinstage/files.h"

namespace fs = std::filesystem;

namespace {

class AtomicFileTest : public ::testing::Test {
 public:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("pinstage_atomic_" + std::to_string(getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  static std::string read(const std::string& p) {
    std::ifstream in(p);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  }
  size_t entries() const {
    return static_cast<size_t>(std::distance(fs::directory_iterator(dir_), {}));
  }

  fs::path dir_;
};

TEST_F(AtomicFileTest, WritesANewFile) {
  pinstage::write_file_atomically(path("a.json"), "{}\n");
  EXPECT_EQ(read(path("a.json")), "{}\n");
  EXPECT_EQ(entries(), 1u);
  struct stat st {};
  ASSERT_EQ(stat(path("a.json").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0644u);
}

TEST_F(AtomicFileTest, NothingIsVisibleUntilCommitAndAnAbandonedWriteLeavesTheOldFile) {
  pinstage::write_file_atomically(path("r.json"), "old");
  {
    pinstage::AtomicFile f(path("r.json"));
    f.write("new, half written");
    EXPECT_EQ(read(path("r.json")), "old");
    EXPECT_EQ(entries(), 2u);  // the target and the temporary file
  }                            // destroyed uncommitted: the work failed
  EXPECT_EQ(read(path("r.json")), "old");
  EXPECT_EQ(entries(), 1u);
}

TEST_F(AtomicFileTest, CommitReplacesTheTarget) {
  pinstage::write_file_atomically(path("r.json"), "old");
  pinstage::AtomicFile f(path("r.json"));
  f.write_at(3, "def", 3);
  f.write_at(0, "abc", 3);
  f.commit();
  EXPECT_EQ(read(path("r.json")), "abcdef");
  EXPECT_EQ(entries(), 1u);
}

TEST_F(AtomicFileTest, RefusesNonRegularTargetsBeforeWork) {
  for (const char* device : {"/dev/null", "/dev/full"}) {
    try {
      pinstage::AtomicFile f(device);
      FAIL() << device << " accepted";
    } catch (const pinstage::Error& e) {
      EXPECT_EQ(e.code(), pinstage::ErrorCode::io);
      EXPECT_NE(std::string(e.what()).find("not a regular file"), std::string::npos) << e.what();
    }
    struct stat st {};
    ASSERT_EQ(stat(device, &st), 0);
    EXPECT_TRUE(S_ISCHR(st.st_mode)) << device << " is still a character device";
  }
  EXPECT_THROW(pinstage::check_output_path(dir_.string()), pinstage::Error);
  EXPECT_THROW(pinstage::check_output_path(""), pinstage::Error);
  try {
    pinstage::check_output_path(path("missing/x.json"));
    FAIL();
  } catch (const pinstage::Error& e) {
    EXPECT_NE(std::string(e.what()).find("does not exist"), std::string::npos) << e.what();
  }
}

// A write that fails half-way (the file size limit, as a full disk would) throws naming
// the target and leaves the previous file whole. Run in a child: it lowers RLIMIT_FSIZE.
TEST_F(AtomicFileTest, AFailedWriteLeavesThePreviousFile) {
  pinstage::write_file_atomically(path("keep.bin"), "previous contents");
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    std::signal(SIGXFSZ, SIG_IGN);  // EFBIG instead of a signal
    rlimit limit{4096, 4096};
    setrlimit(RLIMIT_FSIZE, &limit);
    const std::string big(1 << 20, 'x');
    try {
      pinstage::write_file_atomically(path("keep.bin"), big);
    } catch (const pinstage::Error& e) {
      _exit(std::string(e.what()).find("keep.bin") != std::string::npos ? 0 : 2);
    }
    _exit(1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "the write should fail with an Error naming the file";
  EXPECT_EQ(read(path("keep.bin")), "previous contents");
  EXPECT_EQ(entries(), 1u) << "the temporary file was removed";
}

}  // namespace

namespace {

// A link is followed: the file it names gets the new bytes, and the link stays a link.
TEST_F(AtomicFileTest, ASymlinkIsFollowedAndStaysALink) {
  pinstage::write_file_atomically(path("target.json"), "old");
  fs::create_symlink("target.json", path("link.json"));  // relative, as users make them
  pinstage::write_file_atomically(path("link.json"), "new");
  EXPECT_TRUE(fs::is_symlink(path("link.json")));
  EXPECT_EQ(read(path("target.json")), "new");
  EXPECT_EQ(read(path("link.json")), "new");
  EXPECT_EQ(entries(), 2u);
  fs::create_symlink(path("absent.json"), path("dangling.json"));  // a link to be
  pinstage::write_file_atomically(path("dangling.json"), "made");
  EXPECT_TRUE(fs::is_symlink(path("dangling.json")));
  EXPECT_EQ(read(path("absent.json")), "made");
  fs::create_symlink("loop-b", path("loop-a"));
  fs::create_symlink("loop-a", path("loop-b"));
  try {
    pinstage::write_file_atomically(path("loop-a"), "x");
    ADD_FAILURE() << "a link loop was written";
  } catch (const pinstage::Error& e) {
    EXPECT_NE(std::string(e.what()).find("too many levels of symbolic links"), std::string::npos)
        << e.what();
  }
}

// A signal during a write: the child opens an AtomicFile, writes, tells the parent and
// waits on a pipe; the parent kills it there. The temporary file goes, the old file stays.
// A child writes half of out.bin (after `before`), held there; the parent sends `sig`.
void signal_during_a_write(AtomicFileTest& t, int sig, const std::function<void()>& before) {
  SCOPED_TRACE(sig);
  pinstage::write_file_atomically(t.path("out.bin"), "old");
  int ready[2], hold[2];
  ASSERT_EQ(::pipe(ready), 0);
  ASSERT_EQ(::pipe(hold), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    pinstage::remove_temporary_files_on_signals();
    before();
    pinstage::AtomicFile f(t.path("out.bin"));
    const std::string half(1 << 20, 'n');
    f.write(half);
    char c = 'r';
    (void)!::write(ready[1], &c, 1);
    (void)!::read(hold[0], &c, 1);  // never answered: the parent signals first
    ::_exit(3);
  }
  char c = 0;
  ASSERT_EQ(::read(ready[0], &c, 1), 1);
  EXPECT_EQ(t.entries(), 2u) << "the temporary file exists while the child writes";
  ASSERT_EQ(::kill(child, sig), 0);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == sig) << "ends by the signal";
  for (int fd : {ready[0], ready[1], hold[0], hold[1]}) ::close(fd);
  EXPECT_EQ(t.entries(), 1u) << "no .tmp- file left";
  EXPECT_EQ(t.read(t.path("out.bin")), "old");
}

TEST_F(AtomicFileTest, ASignalDuringAWriteRemovesTheTemporaryFileAndKeepsTheOldOne) {
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) signal_during_a_write(*this, sig, [] {});
}

// A temporary file that cannot be made (its name over NAME_MAX) is an error naming the
// target, and gives its slot in the signal handler's table back: after more failures than
// the table has slots, a write's temporary file is still removed by a signal.
TEST_F(AtomicFileTest, AFailedTemporaryFileGivesItsSignalSlotBack) {
  const std::string long_name = path(std::string(250, 'x'));  // + ".tmp-" + 12: over 255
  signal_during_a_write(*this, SIGTERM, [&] {
    for (int i = 0; i < 70; ++i) {
      try {
        pinstage::AtomicFile f(long_name);
        ::_exit(4);  // made: the name was not too long
      } catch (const pinstage::Error& e) {
        if (std::string(e.what()).find("cannot create a temporary file") == std::string::npos)
          ::_exit(5);
      }
    }
  });
}

// The one whole-file reader (pinstage/files.h): the index and the CLI's report readers.
TEST_F(AtomicFileTest, ReadRegularFileReadsTheWholeFileUpToItsLimit) {
  std::string bytes(200000, 'x');
  bytes[7] = '\0';  // binary-safe
  { std::ofstream(path("r.bin"), std::ios::binary) << bytes; }
  std::string text, why;
  ASSERT_TRUE(pinstage::read_regular_file(path("r.bin"), bytes.size(), &text, &why)) << why;
  EXPECT_EQ(text, bytes);
  text = "kept";
  EXPECT_FALSE(pinstage::read_regular_file(path("r.bin"), bytes.size() - 1, &text, &why));
  EXPECT_EQ(why, "it is 200000 bytes, over the 199999-byte limit");
  EXPECT_EQ(text, "kept");
}

// pread_full: every byte from an offset; at the end of the file fewer bytes with errno 0,
// on a failed read fewer bytes with the read's errno (what each caller's message tells).
TEST_F(AtomicFileTest, PreadFullReadsEveryByteAndSaysWhyItStopped) {
  std::string bytes(300000, '\0');
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>(i * 7);
  { std::ofstream(path("p.bin"), std::ios::binary) << bytes; }
  const int fd = ::open(path("p.bin").c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  std::string out(bytes.size() - 5, 'z');
  EXPECT_EQ(pinstage::pread_full(fd, out.data(), out.size(), 5), out.size());
  EXPECT_EQ(out, bytes.substr(5));
  errno = EIO;
  EXPECT_EQ(pinstage::pread_full(fd, out.data(), out.size(), 10), out.size() - 5);
  EXPECT_EQ(errno, 0) << "the end of the file is not an error";
  ::close(fd);
  EXPECT_EQ(pinstage::pread_full(fd, out.data(), out.size(), 0), 0u);
  EXPECT_EQ(errno, EBADF);
}

TEST_F(AtomicFileTest, ReadRegularFileRefusesAHugeFileBeforeReadingIt) {
  // A sparse 64 GiB file: refused from its size alone, so nothing is allocated or read.
  { std::ofstream(path("huge.bin")); }
  ASSERT_EQ(::truncate(path("huge.bin").c_str(), off_t{64} << 30), 0);
  std::string text = "kept", why;
  EXPECT_FALSE(pinstage::read_regular_file(path("huge.bin"), uint64_t{1} << 20, &text, &why));
  EXPECT_EQ(why, "it is 68719476736 bytes, over the 1048576-byte limit");
  EXPECT_EQ(text, "kept");
}

TEST_F(AtomicFileTest, ReadRegularFileRefusesAFifoAndAMissingFileWithoutBlocking) {
  ASSERT_EQ(::mkfifo(path("fifo").c_str(), 0600), 0);
  std::string text = "kept", why;
  EXPECT_FALSE(
      pinstage::read_regular_file(path("fifo"), 1024, &text, &why));  // would hang if opened
  EXPECT_EQ(why, "it is a FIFO, not a regular file");
  EXPECT_FALSE(pinstage::read_regular_file(path("absent"), 1024, &text, &why));
  EXPECT_EQ(why, "No such file or directory");
  EXPECT_FALSE(pinstage::read_regular_file(dir_.string(), 1024, &text, &why));
  EXPECT_EQ(why, "it is a directory, not a regular file");
  EXPECT_EQ(text, "kept");
}

}  // namespace
