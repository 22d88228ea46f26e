// Opening files to read without ever blocking on a special file: a FIFO, a terminal or a
// socket listed where a checkpoint shard, an index or a library is expected would block
// open(), read() or dlopen() forever. The type is checked on a descriptor opened with
// O_NONBLOCK (which returns at once for any type), so no path is opened twice.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>

#include "pinstage/export.h"

namespace pinstage {

// A descriptor closed on destruction (movable, not copyable).
class PINSTAGE_API UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) noexcept : fd_(fd) {}
  ~UniqueFd();
  UniqueFd(UniqueFd&& other) noexcept : fd_(other.release()) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept;
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  int get() const noexcept { return fd_; }
  int release() noexcept {
    const int fd = fd_;
    fd_ = -1;
    return fd;
  }

 private:
  int fd_ = -1;
};

// "a FIFO", "a directory", "a character device", ... for a stat st_mode.
PINSTAGE_API const char* file_type_name(mode_t mode) noexcept;

// Opens `path` read-only (O_CLOEXEC, plus `flags`, e.g. O_DIRECT) when it is a regular
// file, without blocking whatever it is. Returns the descriptor, or -1 with `why` set
// ("No such file or directory", "it is a FIFO, not a regular file") and errno kept from
// the failed open (0 when the file was not regular).
PINSTAGE_API int open_regular_file(const std::string& path, int flags, std::string* why);

// Reads exactly `bytes` at `offset` of `fd` into `dst` by pread, retrying EINTR, in pieces
// of at most 1 GiB (one Linux read stops short of 2 GiB). Returns the bytes read: `bytes`,
// or fewer when the file ended first (errno 0) or a read failed (errno set to its error).
// The one full-read loop of checkpoint loads, safetensors, hash sidecars and the benches.
PINSTAGE_API uint64_t pread_full(int fd, void* dst, uint64_t bytes, uint64_t offset) noexcept;

// Reads the whole of a regular file (opened as above, so nothing blocks) of at most
// `max_bytes`, into `text`. Returns false with `why` set and `text` untouched: the open's
// reason, "it is 70000000 bytes, over the 67108864-byte limit" (checked before any byte
// is read or allocated), strerror's text, or "it shrank while it was read". The one
// whole-file reader of the checkpoint index and the CLI's report readers.
PINSTAGE_API bool read_regular_file(const std::string& path, uint64_t max_bytes, std::string* text,
                                    std::string* why);

// dlopen(path, mode) for a path naming a regular file (checked as above, then re-checked
// after the load: the file dlopen mapped must be the one checked). nullptr with `why` set
// (dlerror's text, or the file's type) on failure.
PINSTAGE_API void* dlopen_regular_file(const std::string& path, int mode, std::string* why);

}  // namespace pinstage
