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
// Each source is a class in a file of its own (anonymous and vendor here, the file sources
// in file_source.cpp, shared_named in shared_named.cpp) that registers itself: adding one
// is its file, its enum entry, its line in src/runtime/CMakeLists.txt and its row in
// docs/worker.md (docs/design/architecture.md, "Where a change goes").
#include "runtime/host_memory/host_source.h"

#include <sys/mman.h>

#include <array>
#include <cerrno>
#include <cstring>

#include "pinstage/error.h"

namespace pinstage::runtime {

namespace {

struct Registered {
  const char* name = nullptr;
  SourceMaker make = nullptr;
};
// Filled by the sources' static registrations, read only after the library has loaded.
std::array<Registered, kSourceKindCount>& registry() {
  static std::array<Registered, kSourceKindCount> sources{};
  return sources;
}

}  // namespace

SourceRegistration::SourceRegistration(SourceKind kind, const char* name,
                                       SourceMaker make) noexcept {
  registry()[static_cast<size_t>(kind)] = Registered{name, make};
}

const char* source_name(SourceKind kind) {
  const auto i = static_cast<size_t>(kind);
  return i < kSourceKindCount && registry()[i].name != nullptr ? registry()[i].name : "unknown";
}

std::unique_ptr<HostSource> make_source(SourceKind kind, const HostPlacement& placement,
                                        const ps_platform_api& api, ps_device_ctx* ctx) {
  const auto i = static_cast<size_t>(kind);
  if (i >= kSourceKindCount || registry()[i].make == nullptr)
    throw Error(ErrorCode::internal,
                "no host source of kind " + std::to_string(i) + " is built in");
  return registry()[i].make(placement, api, ctx);
}

void dont_fork(const HostPlacement& placement, const HostSegment& segment) {
  if (!placement.dont_fork || madvise(segment.data, segment.bytes, MADV_DONTFORK) == 0) return;
  const int err = errno;
  (void)munmap(segment.data, segment.bytes);
  throw Error(ErrorCode::backend,
              std::string("madvise(MADV_DONTFORK) of a pinned segment: ") + std::strerror(err));
}

bool HostSource::release(const ps_allocation& segment, std::string* why) noexcept {
  return unmap_pages(MappedPages{segment.ptr, segment.bytes, segment.ptr, segment.bytes, {}, 0},
                     why);
}

namespace {

class Anonymous final : public HostSource {
 public:
  explicit Anonymous(const HostPlacement& p) : HostSource(SourceKind::anonymous), placement_(p) {}
  HostSegment make(const SegmentRequest& r) override {
    std::string note;
    const MapOptions options = placement_.map_options(r.bytes, r.fault, &note);
    HostSegment s = segment_of(kind(), map_pages(r.bytes, options));
    // Base pages where the placement chose them, even under THP `always` (a hint).
    if (!options.huge_pages) (void)madvise(s.data, s.bytes, MADV_NOHUGEPAGE);
    dont_fork(placement_, s);
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

const SourceRegistration kAnonymous(SourceKind::anonymous, "anonymous",
                                    [](const HostPlacement& p, const ps_platform_api&,
                                       ps_device_ctx*) -> std::unique_ptr<HostSource> {
                                      return std::make_unique<Anonymous>(p);
                                    });
const SourceRegistration kVendor(SourceKind::vendor, "vendor",
                                 [](const HostPlacement&, const ps_platform_api& api,
                                    ps_device_ctx* ctx) -> std::unique_ptr<HostSource> {
                                   return std::make_unique<Vendor>(api, ctx);
                                 });

}  // namespace

}  // namespace pinstage::runtime
