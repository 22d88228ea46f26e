// WorkerState: the state behind a Worker and everything it hands out (worker_state.h),
// released once at finalize. See Note [Pinned memory lifecycle] in worker.cpp.
#include <string>
#include <utility>
#include <vector>

#include "pinstage/log.h"
#include "pinstage/pages.h"
#include "pinstage/settings.h"
#include "runtime/worker_state.h"

namespace pinstage {

namespace runtime {

namespace {

const char* kind_name(MemoryKind kind) {
  return kind == MemoryKind::pinned_host ? "pinned host" : "device";
}

}  // namespace

CallGuard::CallGuard(WorkerState& state) noexcept : state_(state) {
  if (state_.forked()) {  // a child's buffers release nothing; its calls are refused
    entered_ = false;
    return;
  }
  std::lock_guard lock(state_.mu);
  entered_ = state_.live;
  if (entered_) ++state_.in_flight;
}

CallGuard::~CallGuard() {
  if (!entered_) return;
  std::lock_guard lock(state_.mu);
  if (--state_.in_flight == 0) state_.idle.notify_all();
}

CallGuard::CallGuard(CallGuard&& other) noexcept
    : state_(other.state_), entered_(std::exchange(other.entered_, false)) {}

void CallGuard::require() const {
  if (!entered_ && state_.forked()) throw Error(ErrorCode::invalid_argument, kForkedMessage);
  if (!entered_) throw Error(ErrorCode::finalized, kFinalizedMessage);
}

void WorkerState::check(int status, const char* what) const {
  if (status == PS_OK) return;
  std::string message = name() + " " + what + " failed: " + ps_status_str(status);
  const char* detail = api().last_error();
  if (detail != nullptr && *detail != '\0') message += std::string(" (") + detail + ")";
  throw Error(error_code_from_status(status), message);
}

void* WorkerState::alloc(MemoryKind kind, size_t bytes) {
  CallGuard guard(*this);
  guard.require();
  if (bytes == 0)
    throw Error(ErrorCode::invalid_argument,
                std::string("cannot allocate 0 bytes of ") + kind_name(kind) + " memory");
  if (kind == MemoryKind::pinned_host && bytes > physical_memory_bytes())
    throw Error(ErrorCode::invalid_argument, "pinned host request of " + std::to_string(bytes) +
                                                 " bytes exceeds this machine's physical memory (" +
                                                 std::to_string(physical_memory_bytes()) +
                                                 " bytes)");
  if (kind == MemoryKind::pinned_host) return alloc_pinned(bytes);  // the pool
  ps_allocation a{nullptr, bytes, nullptr};
  check(api().device_malloc(ctx, bytes, &a), "device malloc");
  a.bytes = bytes;  // the runtime's record, whatever the backend wrote
  bool inserted;
  {
    std::lock_guard lock(mu);
    inserted = a.ptr != nullptr && table.insert(EntryKind::device, a);
  }
  if (!inserted) {
    // A null or already-live address: give it back, refuse to alias.
    if (a.ptr != nullptr) api().device_free(ctx, &a);
    throw Error(ErrorCode::internal, name() + " returned a null address or one already in use");
  }
  return a.ptr;
}

void WorkerState::free(MemoryKind kind, void* ptr) {
  CallGuard guard(*this);
  if (!guard.entered()) return;                                     // reclaimed by finalize already
  if (kind == MemoryKind::pinned_host && free_pinned(ptr)) return;  // back to the pool
  std::optional<ps_allocation> a;
  std::optional<ps_allocation> pageable;
  {
    std::lock_guard lock(mu);
    if (kind == MemoryKind::pinned_host)
      pageable = table.erase(EntryKind::pageable_host, ptr);
    else
      a = table.erase(EntryKind::device, ptr);
  }
  if (pageable) {
    const size_t mapped = round_up_to_pages(pageable->bytes);
    std::string why;
    if (!unmap_pages(MappedPages{ptr, mapped, ptr, mapped, {}, 0}, &why))
      throw Error(ErrorCode::internal, "releasing pageable fallback memory failed: " + why);
    return;
  }
  if (!a)
    throw Error(ErrorCode::unknown_pointer, std::string("free of a ") + kind_name(kind) +
                                                " pointer this worker did not allocate");
  const int status = api().device_free(ctx, &*a);
  if (status != PS_OK) {
    // Still the backend's: counted as failed, released again at finalize.
    std::lock_guard lock(mu);
    table.add_failed(EntryKind::device, *a);
    ++free_failures;
  }
  check(status, "device free");
}

void* WorkerState::pageable_fallback(size_t bytes, const std::string& refusal) {
  MapOptions options;
  options.prefault = true;  // like pinned memory, resident from the start
  const MappedPages pages = map_pages(bytes, options);
  {
    std::lock_guard lock(mu);
    if (!table.insert(EntryKind::pageable_host, ps_allocation{pages.data, bytes, nullptr})) {
      unmap_pages(pages);
      throw Error(ErrorCode::internal, "pageable fallback memory mapped at an address in use");
    }
    ++pageable_fallbacks;
  }
  log(LogLevel::warn, name() + ": " + refusal.substr(0, refusal.find(". ")) +
                          "; PINSTAGE_PIN_POLICY=fallback: serving it with pageable memory");
  return pages.data;
}

void WorkerState::add_handle(EntryKind kind, void* handle) {
  std::lock_guard lock(mu);
  if (!table.insert(kind, ps_allocation{handle, 0, nullptr}))
    throw Error(ErrorCode::internal, name() + " returned a stream or event handle already in use");
}

void WorkerState::destroy_handle(EntryKind kind, void* handle) noexcept {
  CallGuard guard(*this);
  if (!guard.entered()) return;  // released with the context at finalize
  {
    std::lock_guard lock(mu);
    if (!table.erase(kind, handle)) return;
  }
  const int status = kind == EntryKind::stream
                         ? api().stream_destroy(ctx, static_cast<ps_stream*>(handle))
                         : api().event_destroy(ctx, static_cast<ps_event*>(handle));
  if (status != PS_OK)
    log(LogLevel::error, std::string(kind == EntryKind::stream ? "stream" : "event") +
                             " destroy failed: " + ps_status_str(status) + " " +
                             api().last_error());
}

void WorkerState::require_device_range(const void* ptr, size_t bytes,
                                       const std::string& what) const {
  std::lock_guard lock(mu);
  if (!table.contains(EntryKind::device, ptr, bytes))
    throw Error(ErrorCode::invalid_argument,
                what + ": " + std::to_string(bytes) +
                    " bytes at that address are not inside one device allocation of this worker");
}

namespace {

// What an entry kind is called in finalize's log lines.
std::string entry_name(EntryKind kind) {
  static constexpr const char* kNames[] = {"device allocation", "stream", "event",
                                           "pageable fallback allocation"};
  if (is_host_segment(kind)) return "pinned host segment";
  return kNames[static_cast<size_t>(kind)];
}

// Releases one entry finalize took from the table; the status.
int release_entry(WorkerState& s, EntryKind kind, const ps_allocation& a) {
  if (is_host_segment(kind)) {
    // Pool segments are unpinned and released; a file mapping is only unpinned: its owner
    // unmaps it (file_source.cpp).
    const SourceKind source = source_of(kind);
    return s.release_host(source, a, true, pooled(source)).empty() ? PS_OK : PS_ERR_BACKEND;
  }
  switch (kind) {
    case EntryKind::device:
      return s.api().device_free(s.ctx, &a);
    case EntryKind::stream:
      return s.api().stream_destroy(s.ctx, static_cast<ps_stream*>(a.ptr));
    case EntryKind::event:
      return s.api().event_destroy(s.ctx, static_cast<ps_event*>(a.ptr));
    default: {  // pageable_host
      const size_t mapped = round_up_to_pages(a.bytes);
      return unmap_pages(MappedPages{a.ptr, mapped, a.ptr, mapped, {}, 0}) ? PS_OK : PS_ERR_BACKEND;
    }
  }
}

// Releases what finalize took from the table, through the backend, logging failures.
void release_all(WorkerState& s, EntryKind kind, const std::vector<ps_allocation>& left) {
  if (left.empty()) return;
  const std::string what = entry_name(kind);
  const std::string source =  // "(anonymous)": which source's segments they were
      is_host_segment(kind) ? std::string(" (") + source_name(source_of(kind)) + ")" : "";
  uint64_t bytes = 0;
  for (const ps_allocation& a : left) {
    bytes += a.bytes;
    const int status = release_entry(s, kind, a);
    if (status != PS_OK) {
      log(LogLevel::error, "finalize: releasing a " + what + " failed" + source + ": " +
                               ps_status_str(status) + " " + s.api().last_error());
      std::lock_guard lock(s.mu);
      ++s.free_failures;
    }
  }
  if (kind == EntryKind::stream || kind == EntryKind::event)
    log(LogLevel::warn, "finalize: " + std::to_string(left.size()) + " " + what +
                            "(s) still alive; released with the context");
  else if (is_host_segment(kind) && pooled(source_of(kind)))  // live blocks or not
    log(LogLevel::info, "finalize released " + std::to_string(left.size()) + " " + what + "(s)" +
                            source + ", " + std::to_string(bytes) + " bytes");
  else
    log(LogLevel::info, "finalize reclaimed " + std::to_string(left.size()) + " outstanding " +
                            what + "(s), " + std::to_string(bytes) + " bytes");
}

}  // namespace

void WorkerState::shutdown() noexcept {
  if (forked()) return;  // the parent's to release
  std::array<std::vector<ps_allocation>, kEntryKindCount> left;
  std::array<std::vector<ps_allocation>, kEntryKindCount> retry;
  std::vector<ps_event*> parked;
  std::vector<HostPool::Owned> unpinned;  // segments still being filled: never registered
  uint64_t live_blocks = 0;
  uint64_t live_bytes = 0;
  {
    std::unique_lock lock(mu);
    if (!live) return;
    live = false;
    idle.wait(lock, [this] { return in_flight == 0; });
    for (size_t k = 0; k < kEntryKindCount; ++k) {
      left[k] = table.take_all(static_cast<EntryKind>(k));
      retry[k] = table.take_failed(static_cast<EntryKind>(k));
    }
    live_blocks = host.live_count();
    live_bytes = host.live_bytes();
    parked = host.take_parked_events();
    for (const HostPool::Owned& seg : host.take_all_segments())
      if (!seg.pinned) unpinned.push_back(seg);  // the pinned ones are in the table
  }
  if (live_blocks > 0)
    log(LogLevel::info, "finalize reclaimed " + std::to_string(live_blocks) +
                            " outstanding pinned host allocation(s), " +
                            std::to_string(live_bytes) + " bytes");
  // Queues first (their copies may still read memory), then memory, then the context.
  for (EntryKind kind : {EntryKind::stream, EntryKind::event})
    release_all(*this, kind, left[static_cast<size_t>(kind)]);
  for (ps_event* e : parked) api().event_destroy(ctx, e);  // the pool's own
  for (size_t k = 0; k < kEntryKindCount; ++k) {
    const auto kind = static_cast<EntryKind>(k);
    if (kind != EntryKind::stream && kind != EntryKind::event) release_all(*this, kind, left[k]);
  }
  for (const HostPool::Owned& seg : unpinned)
    if (!release_host(seg.source, seg.allocation, false, true).empty()) ++free_failures;
  for (size_t k = 0; k < kEntryKindCount; ++k) {
    if (retry[k].empty()) continue;
    log(LogLevel::warn, "finalize: retrying " + std::to_string(retry[k].size()) +
                            " release(s) the backend refused earlier");
    release_all(*this, static_cast<EntryKind>(k), retry[k]);
  }
  const int status = api().destroy_context(ctx);
  if (status != PS_OK)
    log(LogLevel::error, std::string("finalize: destroying the device context failed: ") +
                             ps_status_str(status) + " " + api().last_error());
  ctx = nullptr;
}

}  // namespace runtime

}  // namespace pinstage
