// AtomicFile: temp file + fsync + rename, the one writer every output goes through.
#include "pinstage/atomic_file.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "pinstage/error.h"

namespace pinstage {
namespace {

[[noreturn]] void io_error(const std::string& path, const std::string& what) {
  throw Error(ErrorCode::io, "cannot write '" + path + "': " + what);
}

std::string errno_text(int err) { return std::strerror(err); }

std::string directory_of(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

// The file a path names once every symbolic link on it is followed: writing replaces
// that file, and the link keeps pointing at it. A dangling link names its target.
std::string follow_links(const std::string& path) {
  std::string at = path;
  for (int hops = 0; hops < 40; ++hops) {
    struct stat st {};
    if (::lstat(at.c_str(), &st) != 0 || !S_ISLNK(st.st_mode)) return at;
    std::vector<char> buf(4096);
    const ssize_t n = ::readlink(at.c_str(), buf.data(), buf.size());
    if (n <= 0 || static_cast<size_t>(n) >= buf.size()) io_error(path, "cannot read the link");
    std::string target(buf.data(), static_cast<size_t>(n));
    at = target.front() == '/' ? target : directory_of(at) + "/" + target;
  }
  io_error(path, "too many levels of symbolic links");
}

// Temporary files of live AtomicFiles, for the signal handler: fixed slots so that the
// handler touches no lock and no heap.
constexpr size_t kTempSlots = 64;
constexpr size_t kTempPathMax = 4096;
struct TempSlot {
  std::atomic<bool> used{false};
  std::atomic<bool> ready{false};
  char path[kTempPathMax];
};
TempSlot g_temp_slots[kTempSlots];

int reserve_temp_slot() {
  for (size_t i = 0; i < kTempSlots; ++i) {
    bool expected = false;
    if (g_temp_slots[i].used.compare_exchange_strong(expected, true)) return static_cast<int>(i);
  }
  return -1;  // more than kTempSlots files at once: that one is not removed on a signal
}

// Shows `temp` to the handler: done before the file exists, so that no signal finds it
// made and not listed (the handler's unlink of a name not made yet fails harmlessly).
void publish_temp(int slot, const std::string& temp) {
  if (slot < 0) return;
  g_temp_slots[slot].ready.store(false);
  if (temp.size() >= kTempPathMax) return;
  std::memcpy(g_temp_slots[slot].path, temp.c_str(), temp.size() + 1);
  g_temp_slots[slot].ready.store(true);
}

// A name no other file is likely to have: 12 characters of [0-9A-Za-z] from the kernel's
// random bytes (no generator state, so a forked child never repeats its parent's names).
std::string random_suffix(const std::string& path) {
  static constexpr char kChars[] = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
  unsigned char bytes[12];
  if (::getentropy(bytes, sizeof bytes) != 0)
    io_error(path, "no random bytes for a temporary name: " + errno_text(errno));
  std::string out(sizeof bytes, '0');
  for (size_t i = 0; i < sizeof bytes; ++i) out[i] = kChars[bytes[i] % (sizeof kChars - 1)];
  return out;
}

void unregister_temp(int slot) {
  if (slot < 0) return;
  g_temp_slots[slot].ready.store(false);
  g_temp_slots[slot].used.store(false);
}

void remove_temps_and_reraise(int sig) {
  for (TempSlot& slot : g_temp_slots)
    if (slot.ready.load()) ::unlink(slot.path);
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

// The fsync seam (set_atomic_file_fsync_for_tests): null is ::fsync.
std::atomic<FsyncFunction> g_fsync{nullptr};

int sync_file(int fd) {
  const FsyncFunction fn = g_fsync.load();
  return fn != nullptr ? fn(fd) : ::fsync(fd);
}

void fsync_directory(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;  // the rename happened; a directory we cannot open is not an error
  sync_file(fd);
  ::close(fd);
}

}  // namespace

void check_output_path(const std::string& path) {
  if (path.empty()) io_error(path, "the output path is empty");
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode)) io_error(path, "it is a directory");
    if (!S_ISREG(st.st_mode))
      io_error(path, "it exists and is not a regular file (a device, FIFO or socket)");
  } else if (errno != ENOENT) {
    io_error(path, errno_text(errno));
  }
  const std::string dir = directory_of(path);
  struct stat dst {};
  if (::stat(dir.c_str(), &dst) != 0) io_error(path, "directory '" + dir + "' does not exist");
  if (!S_ISDIR(dst.st_mode)) io_error(path, "'" + dir + "' is not a directory");
  if (::access(dir.c_str(), W_OK) != 0)
    io_error(path, "directory '" + dir + "' is not writable: " + errno_text(errno));
}

void remove_temporary_files_on_signals() {
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) {
    struct sigaction sa {};
    sa.sa_handler = remove_temps_and_reraise;
    sigemptyset(&sa.sa_mask);
    ::sigaction(sig, &sa, nullptr);
  }
}

AtomicFile::AtomicFile(const std::string& path) : path_(follow_links(path)) {
  check_output_path(path_);
  // Listed for the signal handler before it is made (publish_temp), made with O_EXCL.
  // A throw leaves the constructor without the destructor: the slot is given back here.
  temp_slot_ = reserve_temp_slot();
  try {
    for (int tries = 0; fd_ < 0; ++tries) {
      temp_path_ = path_ + ".tmp-" + random_suffix(path_);
      publish_temp(temp_slot_, temp_path_);
      fd_ = ::open(temp_path_.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
      if (fd_ < 0 && (errno != EEXIST || tries == 99))
        io_error(path_, "cannot create a temporary file next to it: " + errno_text(errno));
    }
  } catch (...) {
    unregister_temp(temp_slot_);
    throw;
  }
  ::fchmod(fd_, 0644);  // whatever the umask: outputs are ordinary files
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_ && !temp_path_.empty()) ::unlink(temp_path_.c_str());
  unregister_temp(temp_slot_);
}

void AtomicFile::write(const void* data, size_t bytes) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::write(fd_, p, bytes);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) io_error(path_, n < 0 ? errno_text(errno) : "write returned 0");
    p += n;
    bytes -= static_cast<size_t>(n);
  }
}

void AtomicFile::write_at(uint64_t offset, const void* data, size_t bytes) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::pwrite(fd_, p, bytes, static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) io_error(path_, n < 0 ? errno_text(errno) : "pwrite returned 0");
    p += n;
    offset += static_cast<uint64_t>(n);
    bytes -= static_cast<size_t>(n);
  }
}

void AtomicFile::commit() {
  if (committed_) io_error(path_, "already committed");
  if (sync_file(fd_) != 0) io_error(path_, "fsync failed: " + errno_text(errno));
  const int rc = ::close(fd_);
  fd_ = -1;
  if (rc != 0) io_error(path_, "close failed: " + errno_text(errno));
  // Re-check: the target may have become a device or directory during the work.
  struct stat st {};
  if (::stat(path_.c_str(), &st) == 0 && !S_ISREG(st.st_mode))
    io_error(path_, "it exists and is not a regular file");
  if (::rename(temp_path_.c_str(), path_.c_str()) != 0)
    io_error(path_, "rename failed: " + errno_text(errno));
  committed_ = true;
  unregister_temp(temp_slot_);
  temp_slot_ = -1;
  fsync_directory(directory_of(path_));
}

FsyncFunction set_atomic_file_fsync_for_tests(FsyncFunction fn) noexcept {
  return g_fsync.exchange(fn);
}

void write_file_atomically(const std::string& path, std::string_view text) {
  AtomicFile file(path);
  file.write(text);
  file.commit();
}

}  // namespace pinstage
