// Note [Segment sources]
// ~~~~~~~~~~~~~~~~~~~~~~
// Where pinned memory comes from is the runtime's decision; a plugin only pins it
// (host_register / host_unregister, ABI v7), as kvikio's BounceBufferPool<Allocator> takes
// the way a buffer is made as a parameter and ggml's buffer_from_host_ptr imports memory
// someone else mapped. A source makes and releases segments; WorkerState::pin_segment (the
// one pin verdict, host_memory.cpp) pins them and enters them in the one table under the
// kind derived from their source (entry_kind):
//  - anonymous: fresh pages placed by the worker's HostPlacement (NUMA, huge pages with the
//    stall watch), faulted now or by their writers (a load's readers, HostFill); the pool's
//    segments wherever the plugin has host_register.
//  - vendor: the plugin's own host_alloc_pinned, already pinned: the pool's segments where
//    host_register is missing or refuses anonymous memory.
//  - file_shared: a file's page cache mapped read-only (MAP_SHARED) and pinned in place,
//    registered read-only: map mode. Never pinned writable: Linux >= 6.5 refuses long-term
//    writable pins of dirty-tracked shared file mappings.
//  - file_private: the file mapped MAP_PRIVATE|PROT_WRITE and populated for writing, which
//    breaks copy-on-write up front: the kernel copies each page-cache page into a fresh one
//    with no zero fill. Writable, never reaching the file; map mode where the driver cannot
//    register read-only memory (cudaDevAttrHostRegisterReadOnlySupported = 0).
//  - shared_named: a named tmpfs or hugetlbfs file mapped shared and writable, which
//    outlives the process (the restart cache's entries).
// Adding a source is its enum entry, its class here and its name (docs/design/
// architecture.md, "Where a change goes").
#include "runtime/host_memory/host_source.h"

#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "pinstage/error.h"

namespace pinstage::runtime {

const char* source_name(SourceKind kind) {
  static constexpr const char* kNames[kSourceKindCount] = {
      "anonymous", "vendor", "file_shared", "file_private", "shared_named"};  // SourceKind order
  const auto i = static_cast<size_t>(kind);
  return i < kSourceKindCount ? kNames[i] : "unknown";
}

bool HostSource::release(const ps_allocation& segment, std::string* why) noexcept {
  return unmap_pages(MappedPages{segment.ptr, segment.bytes, segment.ptr, segment.bytes, {}, 0},
                     why);
}

namespace {

HostSegment from_pages(SourceKind kind, const MappedPages& pages) {
  HostSegment s;
  s.source = kind;
  s.data = pages.data;
  s.bytes = pages.bytes;
  s.fault = pages.prefault;
  s.map_seconds = pages.map_seconds;
  return s;
}

class Anonymous final : public HostSource {
 public:
  explicit Anonymous(const HostPlacement& p) : HostSource(SourceKind::anonymous), placement_(p) {}
  HostSegment make(const SegmentRequest& r) override {
    std::string note;
    const MapOptions options = placement_.map_options(r.bytes, r.fault, &note);
    HostSegment s = from_pages(kind(), map_pages(r.bytes, options));
    if (placement_.dont_fork && madvise(s.data, s.bytes, MADV_DONTFORK) != 0) {
      const int err = errno;
      (void)munmap(s.data, s.bytes);
      throw Error(ErrorCode::backend,
                  std::string("madvise(MADV_DONTFORK) of a pinned segment: ") + std::strerror(err));
    }
    s.huge = options.huge_pages;
    s.note = std::move(note);
    return s;
  }

 private:
  const HostPlacement& placement_;
};

class Vendor final : public HostSource {
 public:
  Vendor(const ps_platform_api& api, ps_device_ctx* ctx)
      : HostSource(SourceKind::vendor), api_(api), ctx_(ctx) {}
  HostSegment make(const SegmentRequest& r) override {
    if (api_.host_alloc_pinned == nullptr)
      throw Error(ErrorCode::unsupported, std::string("the ") + api_.name +
                                              " backend has neither host_register nor "
                                              "host_alloc_pinned: it cannot pin host memory");
    ps_allocation a{nullptr, r.bytes, nullptr};
    const int status = api_.host_alloc_pinned(ctx_, r.bytes, &a);
    if (status != PS_OK) {
      const char* detail = api_.last_error();
      throw Error(error_code_from_status(status),
                  std::string(api_.name) + " pinned host alloc failed: " + ps_status_str(status) +
                      (detail != nullptr && *detail != '\0' ? std::string(" (") + detail + ")"
                                                            : std::string()));
    }
    if (a.ptr == nullptr)
      throw Error(ErrorCode::internal, std::string(api_.name) + " returned a null pinned segment");
    HostSegment s;
    s.source = kind();
    s.data = a.ptr;
    s.bytes = r.bytes;  // the runtime's record, whatever the backend wrote
    s.handle = a.handle;
    return s;
  }
  bool release(const ps_allocation& segment, std::string* why) noexcept override {
    const int status = api_.host_free_pinned(ctx_, &segment);
    if (status == PS_OK) return true;
    if (why != nullptr) *why = std::string(ps_status_str(status)) + " (" + api_.last_error() + ")";
    return false;
  }

 private:
  const ps_platform_api& api_;
  ps_device_ctx* ctx_;
};

// file_shared (read-only, the page cache) or file_private (a copy-on-write copy).
class FileSource final : public HostSource {
 public:
  FileSource(SourceKind kind, const HostPlacement& p) : HostSource(kind), placement_(p) {}
  HostSegment make(const SegmentRequest& r) override {
    const bool private_copy = kind() == SourceKind::file_private;
    MapOptions options;
    options.prefault = r.fault;
    options.threads = placement_.fault_threads;
    options.numa_node = placement_.numa_node;
    HostSegment s = from_pages(kind(), map_file_pages(r.fd, r.bytes, private_copy, options, r.what));
    s.read_only = !private_copy;
    return s;
  }

 private:
  const HostPlacement& placement_;
};

// A named tmpfs or hugetlbfs file: grown to `bytes` when shorter, mapped shared and
// writable, placed on the node and faulted for writing (allocating its pages).
class SharedNamed final : public HostSource {
 public:
  explicit SharedNamed(const HostPlacement& p) : HostSource(SourceKind::shared_named), placement_(p) {}
  HostSegment make(const SegmentRequest& r) override {
    struct stat st {};
    if (::fstat(r.fd, &st) != 0)
      throw Error(ErrorCode::io, "cannot map " + r.what + ": fstat: " + std::strerror(errno));
    if (static_cast<uint64_t>(st.st_size) < r.bytes &&
        ::ftruncate(r.fd, static_cast<off_t>(r.bytes)) != 0)
      throw Error(errno == ENOSPC || errno == ENOMEM ? ErrorCode::out_of_memory : ErrorCode::io,
                  "cannot size " + r.what + " to " + std::to_string(r.bytes) +
                      " bytes: " + std::strerror(errno));
    const size_t bytes = round_up_to_pages(r.bytes);
    void* data = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, r.fd, 0);
    if (data == MAP_FAILED)
      throw Error(ErrorCode::io, "cannot map " + r.what + ": mmap: " + std::strerror(errno));
    MappedPages pages{data, bytes, data, bytes, {}, 0};
    try {
      if (placement_.numa_node >= 0) numa_system().bind(data, bytes, placement_.numa_node);
      if (r.fault) pages.prefault = prefault(data, bytes, placement_.fault_threads, 0,
                                             PrefaultMethod::populate);
    } catch (...) {
      ::munmap(data, bytes);
      throw;
    }
    return from_pages(kind(), pages);
  }

 private:
  const HostPlacement& placement_;
};

}  // namespace

std::unique_ptr<HostSource> make_source(SourceKind kind, const HostPlacement& placement,
                                        const ps_platform_api& api, ps_device_ctx* ctx) {
  switch (kind) {
    case SourceKind::anonymous:
      return std::make_unique<Anonymous>(placement);
    case SourceKind::vendor:
      return std::make_unique<Vendor>(api, ctx);
    case SourceKind::file_shared:
    case SourceKind::file_private:
      return std::make_unique<FileSource>(kind, placement);
    case SourceKind::shared_named:
      return std::make_unique<SharedNamed>(placement);
  }
  throw Error(ErrorCode::internal, "unknown host source");
}

}  // namespace pinstage::runtime
