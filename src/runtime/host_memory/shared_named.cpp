// The shared_named source (Note [Segment sources] in host_source.cpp): a named tmpfs or
// hugetlbfs file mapped shared and writable, whose bytes outlive the process (the restart
// cache's entries). The caller names, opens and secures the file; the source sizes it,
// maps it, places it and faults it.
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "pinstage/error.h"
#include "runtime/host_memory/host_source.h"

namespace pinstage::runtime {
namespace {

// A named tmpfs or hugetlbfs file: grown to `bytes` when shorter, mapped shared and
// writable, placed on the node and faulted for writing (allocating its pages).
class SharedNamed final : public HostSource {
 public:
  explicit SharedNamed(const HostPlacement& p)
      : HostSource(SourceKind::shared_named), placement_(p) {}
  HostSegment make(const SegmentRequest& r) override {
    struct stat st {};
    if (::fstat(r.fd, &st) != 0)
      throw Error(ErrorCode::io, "cannot map " + r.what + ": fstat: " + std::strerror(errno));
    if (static_cast<uint64_t>(st.st_size) < r.bytes &&
        ::ftruncate(r.fd, static_cast<off_t>(r.bytes)) != 0)
      throw Error(errno == ENOSPC || errno == ENOMEM ? ErrorCode::out_of_memory : ErrorCode::io,
                  "cannot size " + r.what + " to " + std::to_string(r.bytes) +
                      " bytes: " + std::strerror(errno));
    const size_t page = file_page_bytes(r.fd);  // whole huge pages on hugetlbfs
    const size_t bytes = (r.bytes + page - 1) / page * page;
    // Mapped read-only, then made writable: hugetlbfs grows a file to the end of a mapping
    // made writable (to whole huge pages), which would leave a restart-cache entry that is
    // no longer the checkpoint's size; mprotect does not.
    void* data = ::mmap(nullptr, bytes, PROT_READ, MAP_SHARED, r.fd, 0);
    if (data == MAP_FAILED)
      throw Error(ErrorCode::io, "cannot map " + r.what + ": mmap: " + std::strerror(errno));
    if (::mprotect(data, bytes, PROT_READ | PROT_WRITE) != 0) {
      const int err = errno;
      ::munmap(data, bytes);
      throw Error(ErrorCode::io, "cannot map " + r.what + " writable: " + std::strerror(err));
    }
    MappedPages pages{data, bytes, data, bytes, {}, 0};
    try {
      if (placement_.numa_node >= 0) numa_system().bind(data, bytes, placement_.numa_node);
      if (r.fault)
        pages.prefault =
            prefault(data, bytes, placement_.fault_threads, 0, PrefaultMethod::populate);
    } catch (...) {
      ::munmap(data, bytes);
      throw;
    }
    return segment_of(kind(), pages);
  }

 private:
  const HostPlacement& placement_;
};

const SourceRegistration kSharedNamed(SourceKind::shared_named, "shared_named",
                                      [](const HostPlacement& p, const ps_platform_api&,
                                         ps_device_ctx*) -> std::unique_ptr<HostSource> {
                                        return std::make_unique<SharedNamed>(p);
                                      });

}  // namespace
}  // namespace pinstage::runtime
