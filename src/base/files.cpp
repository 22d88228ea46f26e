// Non-blocking type checks before reading files; see pinstage/files.h.
#include "pinstage/files.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

namespace pinstage {

UniqueFd::~UniqueFd() {
  if (fd_ >= 0) ::close(fd_);
}

UniqueFd& UniqueFd::operator=(UniqueFd&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = other.release();
  }
  return *this;
}

const char* file_type_name(mode_t mode) noexcept {
  if (S_ISREG(mode)) return "a regular file";
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISLNK(mode)) return "a symbolic link";
  return "a special file";
}

int open_regular_file(const std::string& path, int flags, std::string* why) {
  // O_NONBLOCK: open() of a FIFO without a writer returns at once instead of waiting.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | flags);
  if (fd < 0) {
    const int err = errno;
    *why = std::strerror(err);
    errno = err;
    return -1;
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    const int err = errno;
    *why = st.st_mode != 0
               ? std::string("it is ") + file_type_name(st.st_mode) + ", not a regular file"
               : std::string("cannot stat: ") + std::strerror(err);
    ::close(fd);
    errno = 0;
    return -1;
  }
  // Reads of a regular file never block on O_NONBLOCK's account, but clear it anyway so
  // the descriptor behaves as a plain one.
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  return fd;
}

uint64_t pread_full(int fd, void* dst, uint64_t bytes, uint64_t offset) noexcept {
  auto* p = static_cast<unsigned char*>(dst);
  uint64_t done = 0;
  while (done < bytes) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(bytes - done, uint64_t{1} << 30));
    const ssize_t r = ::pread(fd, p + done, n, static_cast<off_t>(offset + done));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      if (r == 0) errno = 0;  // the end of the file: no error to report
      break;
    }
    done += static_cast<uint64_t>(r);
  }
  return done;
}

bool read_regular_file(const std::string& path, uint64_t max_bytes, std::string* text,
                       std::string* why) {
  const UniqueFd fd(open_regular_file(path, 0, why));
  if (fd.get() < 0) return false;
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) {
    *why = std::string("cannot stat: ") + std::strerror(errno);
    return false;
  }
  const auto size = static_cast<uint64_t>(st.st_size);
  if (size > max_bytes) {
    *why = "it is " + std::to_string(size) + " bytes, over the " + std::to_string(max_bytes) +
           "-byte limit";
    return false;
  }
  std::string out(static_cast<size_t>(size), '\0');
  if (pread_full(fd.get(), out.data(), size, 0) < size) {
    *why = errno != 0 ? std::strerror(errno) : "it shrank while it was read";
    return false;
  }
  *text = std::move(out);
  return true;
}

void* dlopen_regular_file(const std::string& path, int mode, std::string* why) {
  const UniqueFd fd(open_regular_file(path, 0, why));
  if (fd.get() < 0) return nullptr;
  dlerror();
  void* handle = dlopen(path.c_str(), mode);
  if (handle == nullptr) {
    const char* text = dlerror();
    *why = text != nullptr ? text : "dlopen failed";
    return nullptr;
  }
  // The path could have been swapped between the check and dlopen's own open.
  struct stat checked {
  }, now{};
  if (::fstat(fd.get(), &checked) != 0 || ::stat(path.c_str(), &now) != 0 ||
      checked.st_dev != now.st_dev || checked.st_ino != now.st_ino) {
    dlclose(handle);
    *why = "the file changed while it was being loaded";
    return nullptr;
  }
  return handle;
}

}  // namespace pinstage
