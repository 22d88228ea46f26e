// The file-reading arms of `pinstage bench load` (bench_load_arms.h).
#include "bench_load_arms.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <csetjmp>
#include <csignal>
#include <cstring>
#include <memory>
#include <mutex>
#include <vector>

#include "pinstage/error.h"
#include "pinstage/files.h"

namespace pinstage::cli {

void bench_io(const std::string& path, const char* what) {
  throw Error(ErrorCode::io, "bench load: '" + path + "': " + what + ": " + std::strerror(errno));
}

namespace {

[[noreturn]] void truncated(const std::string& path) {
  throw Error(ErrorCode::io, "bench load: '" + path +
                                 "' was truncated while being read (it is shorter than when "
                                 "the checkpoint was opened)");
}

// Note [SIGBUS guard]: a read of a mapped page past the end of a file that was truncated
// after it was mapped raises SIGBUS, which by default kills the process, and a size check
// before the copy cannot see a truncation during it. While a copy from a mapping runs, its
// thread's Guard is armed; the handler jumps back to it only for a fault inside the armed
// range. Any other SIGBUS gets back the action from before the handler was installed (for
// good: such a fault ends the process by default).
struct Guard {
  sigjmp_buf jump;
  const char* begin = nullptr;
  const char* end = nullptr;
};
thread_local Guard* t_guard = nullptr;
struct sigaction g_previous_sigbus;

void on_sigbus(int sig, siginfo_t* info, void*) {
  Guard* g = t_guard;
  const auto* addr = static_cast<const char*>(info->si_addr);
  if (g != nullptr && info->si_code > 0 && addr >= g->begin && addr < g->end)
    siglongjmp(g->jump, 1);
  // Not ours: restore the previous action. A fault re-runs the access on return and meets
  // it; a SIGBUS sent by kill() is sent again (blocked until this handler returns).
  sigaction(SIGBUS, &g_previous_sigbus, nullptr);
  if (info->si_code <= 0) raise(sig);
}

void install_sigbus_handler() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction action {};
    action.sa_sigaction = on_sigbus;
    action.sa_flags = SA_SIGINFO;
    sigemptyset(&action.sa_mask);
    if (sigaction(SIGBUS, &action, &g_previous_sigbus) != 0)
      throw Error(
          ErrorCode::internal,
          std::string("bench load: cannot install the SIGBUS handler: ") + std::strerror(errno));
  });
}

// memcpy from `src`, which lies in a mapping of `path`: Error(io) naming the file, instead
// of SIGBUS, when the file was truncated under the mapping (Note [SIGBUS guard]).
void copy_from_mapping(void* dst, const void* src, size_t bytes, const std::string& path) {
  install_sigbus_handler();
  Guard guard;
  guard.begin = static_cast<const char*>(src);
  guard.end = guard.begin + bytes;
  if (sigsetjmp(guard.jump, 1) != 0) {
    t_guard = nullptr;
    truncated(path);
  }
  t_guard = &guard;
  std::atomic_signal_fence(std::memory_order_seq_cst);  // armed before the first read
  std::memcpy(dst, src, bytes);
  std::atomic_signal_fence(std::memory_order_seq_cst);
  t_guard = nullptr;
}

// munmap on every way out of the copies.
struct Mapping {
  void* data;
  size_t bytes;
  ~Mapping() { ::munmap(data, bytes); }
};

}  // namespace

int open_shard(const std::string& path) {
  std::string why;
  const int fd = open_regular_file(path, 0, &why);
  if (fd < 0) throw Error(ErrorCode::io, "bench load: '" + path + "': cannot open: " + why);
  return fd;
}

void arm_read_then_copy(const Checkpoint& c, HostAllocator& pinned) {
  std::vector<std::shared_ptr<Storage>> out;
  PageableAllocator pageable;
  for (size_t f = 0; f < c.files().size(); ++f) {
    const CheckpointFile& file = c.files()[f];
    const auto buf = pageable.allocate(file.size);
    const int fd = open_shard(file.path);
    auto* p = static_cast<unsigned char*>(buf->data());
    if (pread_full(fd, p, file.size, 0) < file.size) {
      const int err = errno;
      ::close(fd);
      if (err == 0) truncated(file.path);  // end of file early: errno says nothing
      errno = err;
      bench_io(file.path, "read");
    }
    ::close(fd);
    for (const CheckpointTensor& t : c.tensors()) {
      if (t.file != f) continue;
      out.push_back(pinned.allocate(t.bytes));
      if (t.bytes > 0) std::memcpy(out.back()->data(), p + t.offset, t.bytes);
    }
  }
}

void arm_mmap_copy(const Checkpoint& c, HostAllocator& pinned,
                   const std::function<void(const CheckpointFile&)>& after_map) {
  std::vector<std::shared_ptr<Storage>> out;
  for (size_t f = 0; f < c.files().size(); ++f) {
    const CheckpointFile& file = c.files()[f];
    const int fd = open_shard(file.path);
    void* map = ::mmap(nullptr, file.size, PROT_READ, MAP_PRIVATE, fd, 0);
    const int err = errno;
    ::close(fd);
    errno = err;
    if (map == MAP_FAILED) bench_io(file.path, "mmap");
    const Mapping mapping{map, file.size};
    if (after_map) after_map(file);
    for (const CheckpointTensor& t : c.tensors()) {
      if (t.file != f) continue;
      out.push_back(pinned.allocate(t.bytes));
      if (t.bytes > 0)
        copy_from_mapping(out.back()->data(), static_cast<const char*>(map) + t.offset, t.bytes,
                          file.path);
    }
  }
}

}  // namespace pinstage::cli
