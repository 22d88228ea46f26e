// The file-reading arms of `pinstage bench load` (bench_load_arms.h).
#include "bench_load_arms.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>
#include <vector>

#include "pinstage/error.h"

namespace pinstage::cli {

void bench_io(const std::string& path, const char* what) {
  throw Error(ErrorCode::io, "bench load: '" + path + "': " + what + ": " + std::strerror(errno));
}

void arm_read_then_copy(const Checkpoint& c, HostAllocator& pinned) {
  std::vector<std::shared_ptr<Storage>> out;
  PageableAllocator pageable;
  for (size_t f = 0; f < c.files().size(); ++f) {
    const CheckpointFile& file = c.files()[f];
    const auto buf = pageable.allocate(file.size);
    const int fd = ::open(file.path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) bench_io(file.path, "open");
    auto* p = static_cast<unsigned char*>(buf->data());
    for (uint64_t done = 0; done < file.size;) {
      const ssize_t r = ::read(fd, p + done, std::min<uint64_t>(file.size - done, 1 << 30));
      if (r <= 0) {
        ::close(fd);
        bench_io(file.path, "read");
      }
      done += static_cast<uint64_t>(r);
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
    const int fd = ::open(file.path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) bench_io(file.path, "open");
    void* map = ::mmap(nullptr, file.size, PROT_READ, MAP_PRIVATE, fd, 0);
    ::close(fd);
    if (map == MAP_FAILED) bench_io(file.path, "mmap");
    if (after_map) after_map(file);
    for (const CheckpointTensor& t : c.tensors()) {
      if (t.file != f) continue;
      out.push_back(pinned.allocate(t.bytes));
      if (t.bytes > 0) std::memcpy(out.back()->data(), static_cast<char*>(map) + t.offset, t.bytes);
    }
    ::munmap(map, file.size);
  }
}

}  // namespace pinstage::cli
