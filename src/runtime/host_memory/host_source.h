// Where host memory comes from (Note [Segment sources] in host_source.cpp): a source makes
// and releases segments; the runtime pins them through the plugin's host_register (the
// vendor source excepted: its memory comes pinned).
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "pinstage/backend/platform_abi.h"
#include "pinstage/pages.h"
#include "runtime/host_memory/placement.h"

namespace pinstage::runtime {

// The sources, one list: adding one is an entry here and a file of its own that registers it
// (SourceRegistration); the table kind, the release and the reports follow from it.
enum class SourceKind {
  anonymous,     // fresh pages, placed, faulted now or by their writers: the pool's
  vendor,        // the plugin's host_alloc_pinned: the pool's, only where host_register lacks
  file_shared,   // a file's page cache, read-only, pinned in place (map mode)
  file_private,  // a private writable copy-on-write copy of a file's page cache
  shared_named,  // a named tmpfs or hugetlbfs file shared read-write (outlives the process)
};
inline constexpr size_t kSourceKindCount = 5;

// "anonymous", "vendor", "file_shared", "file_private", "shared_named".
const char* source_name(SourceKind kind);
// Whether the pool carves blocks from it (anonymous, vendor); the others belong to the
// mapping object that made them (PinnedFileMapping), which unmaps them.
constexpr bool pooled(SourceKind kind) {
  return kind == SourceKind::anonymous || kind == SourceKind::vendor;
}
// Whether its memory is pinned by host_register (all but vendor, which comes pinned).
constexpr bool registered(SourceKind kind) { return kind != SourceKind::vendor; }

// One segment a source made.
struct HostSegment {
  SourceKind source = SourceKind::anonymous;
  void* data = nullptr;
  size_t bytes = 0;        // whole pages: what is mapped, and registered
  void* handle = nullptr;  // vendor: the plugin's record
  bool read_only = false;  // file_shared: PROT_READ, registered read-only
  bool huge = false;       // advised huge pages
  bool on_fault = false;   // registered before it was faulted (PS_REGISTER_ON_FAULT)
  PrefaultReport fault;    // its pre-fault when it had one
  double map_seconds = 0;
  std::string note;  // why the placement's huge pages were not asked for, or ""
  ps_allocation allocation() const { return ps_allocation{data, bytes, handle}; }
};

// The segment of `kind` that `pages` are.
inline HostSegment segment_of(SourceKind kind, const MappedPages& pages) {
  HostSegment s;
  s.source = kind;
  s.data = pages.data;
  s.bytes = pages.bytes;
  s.fault = pages.prefault;
  s.map_seconds = pages.map_seconds;
  return s;
}

// Marks a new writable segment MADV_DONTFORK where the placement says so (a device copies
// from it: a forked child must neither share nor copy-on-write its pages); on a refusal the
// segment is unmapped and Error(backend) thrown.
void dont_fork(const HostPlacement& placement, const HostSegment& segment);

// What to make. bytes: the size (file sources: the file's, mapped from offset 0).
struct SegmentRequest {
  size_t bytes = 0;
  bool fault = true;  // fault it in now; false: its writers do (a FaultPlan)
  int fd = -1;        // file sources and shared_named: the open file (kept by the caller)
  std::string what;   // names it in errors ("'/ckpt/model.safetensors'")
};

class HostSource {
 public:
  explicit HostSource(SourceKind kind) : kind_(kind) {}
  virtual ~HostSource() = default;
  HostSource(const HostSource&) = delete;
  HostSource& operator=(const HostSource&) = delete;
  SourceKind kind() const noexcept { return kind_; }
  // A new segment; Error (out_of_memory, io, backend) with nothing left mapped.
  virtual HostSegment make(const SegmentRequest& request) = 0;
  // Undoes make() (after any registration was undone); false with `why` on a refusal.
  virtual bool release(const ps_allocation& segment, std::string* why) noexcept;

 private:
  SourceKind kind_;
};

// The source of `kind` for a worker placed by `placement`; the vendor source calls the
// plugin `api` on `ctx`. Error(internal) for a kind no file registered.
std::unique_ptr<HostSource> make_source(SourceKind kind, const HostPlacement& placement,
                                        const ps_platform_api& api, ps_device_ctx* ctx);

// How a source's file enters it in the list make_source() and source_name() read: one
// static SourceRegistration per kind, made when the library loads.
using SourceMaker = std::unique_ptr<HostSource> (*)(const HostPlacement& placement,
                                                    const ps_platform_api& api, ps_device_ctx* ctx);
struct SourceRegistration {
  SourceRegistration(SourceKind kind, const char* name, SourceMaker make) noexcept;
};

}  // namespace pinstage::runtime
