// Note [Pinned memory lifecycle]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A Worker holds a shared WorkerState; every buffer, stream and event it hands out holds
// the same shared_ptr as its owner token, so the state outlives all of them while the
// device context and plugin do not have to.
//  - Allocation: the backend call runs without the lock (pinning can take seconds), then
//    its ps_allocation is entered in the one table (Note [One allocation table]).
//  - Release: the entry leaves the table under the lock, then the backend frees it
//    without the lock. An untracked pointer is an error, never a silent no-op.
//  - Finalize: marks the state dead, waits for in-flight backend calls (CallGuard) to
//    finish, then releases every table entry through the backend once (streams, events,
//    device, pinned; logging the count) and destroys the bare context. The plugin stays
//    loaded for the process (plugin.h). A buffer released afterwards is a no-op.
//  - Destructors never throw; a failed release is logged with the backend's reason.
#include "pinstage/worker.h"
#include "pinstage/names.h"

#include <algorithm>
#include <cctype>
#include <utility>
#include <vector>

#include "pinstage/log.h"
#include "pinstage/pages.h"
#include "pinstage/settings.h"
#include "runtime/worker_state.h"

namespace pinstage {

const char* worker_level_name(WorkerLevel level) {
  static constexpr const char* kNames[] = {"chip"};  // WorkerLevel order
  return enum_name(level, kNames, "unknown");
}

WorkerLevel parse_worker_level(std::string_view name) {
  if (name == "chip") return WorkerLevel::chip;
  throw Error(ErrorCode::invalid_argument,
              "unknown worker level '" + std::string(name) + "' (supported: chip)");
}

namespace {
constexpr const char* kNotInitializedMessage =
    "worker is not initialized: call init(backend, device_id) first";
constexpr const char* kFinalizedMessage =
    "worker is finalized: create and init a new Worker to use the device again";
constexpr const char* kInitAfterFinalizeMessage =
    "worker was finalized: finalize is terminal, create a new Worker";
}  // namespace

const char* fault_kind_name(FaultKind kind) {
  const char* name = ps_fault_kind_name(static_cast<int>(kind));
  return name != nullptr ? name : "unknown";
}

void add_backend_option(BackendConfig& config, std::string_view key_equals_value) {
  const size_t eq = key_equals_value.find('=');
  if (eq == std::string_view::npos || eq == 0)
    throw Error(ErrorCode::invalid_argument,
                "backend option '" + std::string(key_equals_value) + "' is not key=value");
  std::string key(key_equals_value.substr(0, eq));
  for (const auto& [k, v] : config)
    if (k == key)
      throw Error(ErrorCode::invalid_argument, "backend option '" + key + "' is given twice");
  config.emplace_back(std::move(key), std::string(key_equals_value.substr(eq + 1)));
}

namespace runtime {

namespace {

const char* kind_name(MemoryKind kind) {
  return kind == MemoryKind::pinned_host ? "pinned host" : "device";
}

EntryKind entry_kind(MemoryKind kind) {
  return kind == MemoryKind::pinned_host ? EntryKind::pinned_host : EntryKind::device;
}

}  // namespace

CallGuard::CallGuard(WorkerState& state) noexcept : state_(state) {
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
  if (kind == MemoryKind::pinned_host)
    if (void* pageable = over_budget(bytes)) return pageable;
  ps_allocation a{nullptr, bytes, nullptr};
  if (kind == MemoryKind::pinned_host)
    check(api().host_alloc_pinned(ctx, bytes, &a), "pinned host alloc");
  else
    check(api().device_malloc(ctx, bytes, &a), "device malloc");
  a.bytes = bytes;  // the runtime's record, whatever the backend wrote
  bool inserted;
  {
    std::lock_guard lock(mu);
    inserted = a.ptr != nullptr && table.insert(entry_kind(kind), a);
  }
  if (!inserted) {
    // A null or already-live address: give it back, refuse to alias.
    if (a.ptr != nullptr)
      (kind == MemoryKind::pinned_host ? api().host_free_pinned : api().device_free)(ctx, &a);
    throw Error(ErrorCode::internal, name() + " returned a null address or one already in use");
  }
  return a.ptr;
}

void WorkerState::free(MemoryKind kind, void* ptr) {
  CallGuard guard(*this);
  if (!guard.entered()) return;  // reclaimed by finalize already
  std::optional<ps_allocation> a;
  std::optional<ps_allocation> pageable;
  {
    std::lock_guard lock(mu);
    a = table.erase(entry_kind(kind), ptr);
    if (!a && kind == MemoryKind::pinned_host)
      pageable = table.erase(EntryKind::pageable_host, ptr);
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
  const int status = kind == MemoryKind::pinned_host ? api().host_free_pinned(ctx, &*a)
                                                     : api().device_free(ctx, &*a);
  if (status != PS_OK) {
    // Still the backend's (and locked): counted as failed, released again at finalize.
    std::lock_guard lock(mu);
    table.add_failed(entry_kind(kind), *a);
    ++free_failures;
  }
  check(status, kind == MemoryKind::pinned_host ? "pinned host free" : "device free");
}

void* WorkerState::over_budget(size_t bytes) {
  const std::string refusal = pin_budget_refusal(bytes, read_pin_budget(pins_with_mlock));
  if (refusal.empty()) return nullptr;
  if (setting_choice(Setting::pin_policy).value_or("strict") != "fallback")
    throw Error(ErrorCode::out_of_memory, name() + ": " + refusal);
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

// Releases what finalize took from the table, through the backend, logging failures.
void release_all(WorkerState& s, EntryKind kind, const std::vector<ps_allocation>& left) {
  static constexpr const char* kNames[] = {"pinned host allocation", "device allocation", "stream",
                                           "event", "pageable fallback allocation"};
  if (left.empty()) return;
  const char* what = kNames[static_cast<size_t>(kind)];
  uint64_t bytes = 0;
  for (const ps_allocation& a : left) {
    bytes += a.bytes;
    int status = PS_OK;
    switch (kind) {
      case EntryKind::pinned_host:
        status = s.api().host_free_pinned(s.ctx, &a);
        break;
      case EntryKind::device:
        status = s.api().device_free(s.ctx, &a);
        break;
      case EntryKind::stream:
        status = s.api().stream_destroy(s.ctx, static_cast<ps_stream*>(a.ptr));
        break;
      case EntryKind::event:
        status = s.api().event_destroy(s.ctx, static_cast<ps_event*>(a.ptr));
        break;
      case EntryKind::pageable_host: {
        const size_t mapped = round_up_to_pages(a.bytes);
        status =
            unmap_pages(MappedPages{a.ptr, mapped, a.ptr, mapped, {}, 0}) ? PS_OK : PS_ERR_BACKEND;
        break;
      }
    }
    if (status != PS_OK) {
      log(LogLevel::error, std::string("finalize: releasing a ") + what +
                               " failed: " + ps_status_str(status) + " " + s.api().last_error());
      std::lock_guard lock(s.mu);
      ++s.free_failures;
    }
  }
  if (kind == EntryKind::stream || kind == EntryKind::event)
    log(LogLevel::warn, "finalize: " + std::to_string(left.size()) + " " + what +
                            "(s) still alive; released with the context");
  else
    log(LogLevel::info, "finalize reclaimed " + std::to_string(left.size()) + " outstanding " +
                            what + "(s), " + std::to_string(bytes) + " bytes");
}

}  // namespace

void WorkerState::shutdown() noexcept {
  std::array<std::vector<ps_allocation>, kEntryKindCount> left;
  std::array<std::vector<ps_allocation>, kEntryKindCount> retry;
  {
    std::unique_lock lock(mu);
    if (!live) return;
    live = false;
    idle.wait(lock, [this] { return in_flight == 0; });
    for (size_t k = 0; k < kEntryKindCount; ++k) {
      left[k] = table.take_all(static_cast<EntryKind>(k));
      retry[k] = table.take_failed(static_cast<EntryKind>(k));
    }
  }
  // Queues first (their copies may still read memory), then memory, then the context.
  for (EntryKind kind : {EntryKind::stream, EntryKind::event, EntryKind::device,
                         EntryKind::pinned_host, EntryKind::pageable_host})
    release_all(*this, kind, left[static_cast<size_t>(kind)]);
  for (EntryKind kind : {EntryKind::device, EntryKind::pinned_host}) {
    const auto& again = retry[static_cast<size_t>(kind)];
    if (again.empty()) continue;
    log(LogLevel::warn, "finalize: retrying " + std::to_string(again.size()) +
                            " release(s) the backend refused earlier");
    release_all(*this, kind, again);
  }
  const int status = api().destroy_context(ctx);
  if (status != PS_OK)
    log(LogLevel::error, std::string("finalize: destroying the device context failed: ") +
                             ps_status_str(status) + " " + api().last_error());
  ctx = nullptr;
}

}  // namespace runtime

// ---- Buffer ----

template <MemoryKind Kind>
Buffer<Kind>::Buffer(std::shared_ptr<runtime::WorkerState> owner, void* data, size_t size) noexcept
    : owner_(std::move(owner)), data_(data), size_(size) {}

template <MemoryKind Kind>
Buffer<Kind>::Buffer(Buffer&& other) noexcept
    : owner_(std::move(other.owner_)),
      data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)) {}

template <MemoryKind Kind>
Buffer<Kind>& Buffer<Kind>::operator=(Buffer&& other) noexcept {
  if (this != &other) {
    reset();
    owner_ = std::move(other.owner_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

template <MemoryKind Kind>
Buffer<Kind>::~Buffer() {
  reset();
}

template <MemoryKind Kind>
bool Buffer<Kind>::valid() const noexcept {
  if (!owner_ || data_ == nullptr) return false;
  std::lock_guard lock(owner_->mu);
  return owner_->live;
}

template <MemoryKind Kind>
void Buffer<Kind>::reset() noexcept {
  if (data_ == nullptr) return;
  void* ptr = std::exchange(data_, nullptr);
  size_ = 0;
  auto owner = std::move(owner_);
  try {
    owner->free(Kind, ptr);
  } catch (const std::exception& e) {
    log(LogLevel::error, std::string("releasing a buffer failed: ") + e.what());
  }
}

template class Buffer<MemoryKind::pinned_host>;
template class Buffer<MemoryKind::device>;

// ---- Stream and Event ----

namespace {
constexpr runtime::EntryKind entry_kind(QueueKind kind) {
  return kind == QueueKind::stream ? runtime::EntryKind::stream : runtime::EntryKind::event;
}
}  // namespace

template <QueueKind Kind>
QueueHandle<Kind>::QueueHandle(QueueHandle&& other) noexcept {
  *this = std::move(other);
}

template <QueueKind Kind>
QueueHandle<Kind>& QueueHandle<Kind>::operator=(QueueHandle&& other) noexcept {
  if (this == &other) return *this;
  if (owner_ && handle_ != nullptr) owner_->destroy_handle(entry_kind(Kind), handle_);
  owner_ = std::move(other.owner_);
  handle_ = std::exchange(other.handle_, nullptr);
  return *this;
}

template <QueueKind Kind>
QueueHandle<Kind>::~QueueHandle() {
  if (owner_ && handle_ != nullptr) owner_->destroy_handle(entry_kind(Kind), handle_);
}

template class QueueHandle<QueueKind::stream>;
template class QueueHandle<QueueKind::event>;

// ---- Worker ----

Worker::Worker(WorkerLevel level) : level_(level) {}

Worker::~Worker() { finalize(); }

void Worker::init(const std::string& backend, int device_id, const WorkerOptions& options) {
  if (finalized_unused_) throw Error(ErrorCode::finalized, kInitAfterFinalizeMessage);
  if (state_) {
    throw Error(state_->live ? ErrorCode::invalid_argument : ErrorCode::finalized,
                state_->live ? "worker is already initialized (backend " + state_->name() + ")"
                             : kInitAfterFinalizeMessage);
  }
  if (backend.empty() || !std::all_of(backend.begin(), backend.end(), [](unsigned char c) {
        return std::islower(c) || std::isdigit(c) || c == '_';
      }))
    throw Error(ErrorCode::invalid_argument,
                "backend name '" + backend + "' is not valid (lower-case letters, digits, _)");
  if (device_id < 0)
    throw Error(ErrorCode::invalid_argument,
                "device id must be >= 0, got " + std::to_string(device_id));
  check_settings();
  auto state = std::make_shared<runtime::WorkerState>();
  const std::string path =
      options.plugin_path.empty() ? default_backend_path(backend) : options.plugin_path;
  state->plugin = &runtime::acquire_plugin(backend, path);
  std::vector<ps_config_entry> entries;
  for (const auto& [key, value] : options.config) {
    for (const auto& e : entries)
      if (key == e.key)
        throw Error(ErrorCode::invalid_argument, "backend option '" + key + "' is given twice");
    entries.push_back({key.c_str(), value.c_str()});
  }
  const ps_context_options ctx_options{.device_capacity_bytes = options.device_capacity_bytes,
                                       .config = entries.data(),
                                       .config_count = entries.size()};
  ps_device_ctx* ctx = nullptr;
  const int status = state->api().create_context(device_id, &ctx_options, &ctx);
  if (status != PS_OK) {
    const char* detail = state->api().last_error();
    throw Error(error_code_from_status(status),
                "backend '" + backend + "' (" + path + ") could not create a context for device " +
                    std::to_string(device_id) + ": " + ps_status_str(status) +
                    (detail && *detail ? std::string(" (") + detail + ")" : std::string()));
  }
  ps_capabilities caps{};
  if (state->api().get_capabilities(ctx, &caps) == PS_OK)
    state->pins_with_mlock = caps.device_memory_is_host != 0;
  state->ctx = ctx;
  state->device_id = device_id;
  state->live = true;
  state_ = std::move(state);
}

void Worker::finalize() noexcept {
  if (state_)
    state_->shutdown();
  else
    finalized_unused_ = true;  // terminal all the same: init() now refuses
}

void Worker::require_state() const {
  if (finalized_unused_) throw Error(ErrorCode::finalized, kFinalizedMessage);
  if (!state_) throw Error(ErrorCode::not_initialized, kNotInitializedMessage);
}

bool Worker::initialized() const noexcept {
  if (!state_) return false;
  std::lock_guard lock(state_->mu);
  return state_->live;
}

bool Worker::finalized() const noexcept {
  return state_ ? !initialized() : finalized_unused_.load();
}

const runtime::WorkerState& Worker::state() const {
  require_state();
  std::lock_guard lock(state_->mu);
  if (!state_->live) throw Error(ErrorCode::finalized, kFinalizedMessage);
  return *state_;
}

runtime::CallGuard Worker::enter() const {
  require_state();
  runtime::CallGuard guard(*state_);
  guard.require();
  return guard;
}

int Worker::device_id() const { return state().device_id; }

const BackendInfo& Worker::backend() const { return state().plugin->info; }

Capabilities Worker::capabilities() const {
  const runtime::CallGuard guard = enter();
  ps_capabilities caps{};
  state_->check(state_->api().get_capabilities(state_->ctx, &caps), "capability query");
  return Capabilities{caps.pinned_is_page_locked != 0, caps.async_copy != 0, caps.execute != 0,
                      caps.device_memory_is_host != 0};
}

WorkerStats Worker::stats() const {
  const runtime::CallGuard guard = enter();
  WorkerStats stats;
  state_->check(state_->api().mem_info(state_->ctx, &stats.device_capacity_bytes,
                                       &stats.device_committed_bytes),
                "mem_info");
  std::lock_guard lock(state_->mu);
  using runtime::EntryKind;
  stats.pinned_bytes = state_->table.bytes(EntryKind::pinned_host);
  stats.pinned_count = state_->table.count(EntryKind::pinned_host);
  stats.device_bytes = state_->table.bytes(EntryKind::device);
  stats.device_count = state_->table.count(EntryKind::device);
  stats.failed_free_count = state_->table.failed_count(EntryKind::pinned_host) +
                            state_->table.failed_count(EntryKind::device);
  stats.failed_free_bytes = state_->table.failed_bytes(EntryKind::pinned_host) +
                            state_->table.failed_bytes(EntryKind::device);
  stats.free_failures = state_->free_failures;
  stats.pageable_fallback_count = state_->table.count(EntryKind::pageable_host);
  stats.pageable_fallback_bytes = state_->table.bytes(EntryKind::pageable_host);
  stats.pageable_fallbacks = state_->pageable_fallbacks;
  return stats;
}

uint64_t Worker::free_failures() const noexcept {
  if (!state_) return 0;
  std::lock_guard lock(state_->mu);
  return state_->free_failures;
}

PinnedHostBuffer Worker::alloc_pinned_host(size_t bytes) {
  state();
  void* ptr = state_->alloc(MemoryKind::pinned_host, bytes);
  return PinnedHostBuffer(state_, ptr, bytes);
}

DeviceBuffer Worker::alloc_device(size_t bytes) {
  state();
  void* ptr = state_->alloc(MemoryKind::device, bytes);
  return DeviceBuffer(state_, ptr, bytes);
}

namespace {

// The device address for [offset, offset + bytes) of `buffer`, checked against the
// buffer and against the worker's table (a buffer of another worker is refused).
void* device_range(const runtime::WorkerState& state, const DeviceBuffer& buffer, size_t offset,
                   size_t bytes, const char* what) {
  if (!buffer)
    throw Error(ErrorCode::invalid_argument, std::string(what) + ": device buffer is empty");
  if (offset > buffer.size() || bytes > buffer.size() - offset)
    throw Error(ErrorCode::invalid_argument,
                std::string(what) + ": range [" + std::to_string(offset) + ", " +
                    std::to_string(offset) + " + " + std::to_string(bytes) +
                    ") is outside the device buffer of " + std::to_string(buffer.size()) +
                    " bytes");
  void* ptr = static_cast<char*>(buffer.data()) + offset;
  // Ownership: a buffer of another worker is not in this table. A 0-byte range at the
  // buffer's end is valid, so the check then asks about the buffer's first byte.
  state.require_device_range(bytes > 0 ? ptr : buffer.data(), std::max<size_t>(bytes, 1), what);
  return ptr;
}

enum class Direction { to_device, to_host };

// One copy through the backend: on `stream` when it has a handle, else synchronous.
void copy(const runtime::WorkerState& state, Direction dir, const DeviceBuffer& buffer,
          size_t offset, void* host, size_t bytes, ps_stream* stream) {
  const bool up = dir == Direction::to_device;
  const char* what = up ? (stream ? "copy_to_device_async" : "copy_to_device")
                        : (stream ? "copy_to_host_async" : "copy_to_host");
  void* device = device_range(state, buffer, offset, bytes, what);
  if (host == nullptr && bytes > 0)
    throw Error(ErrorCode::invalid_argument, std::string(what) + ": host pointer is null");
  if (bytes == 0) return;
  const auto& api = state.api();
  int status;
  if (stream != nullptr)
    status = up ? api.copy_h2d_async(state.ctx, device, host, bytes, stream)
                : api.copy_d2h_async(state.ctx, host, device, bytes, stream);
  else
    status = up ? api.copy_h2d(state.ctx, device, host, bytes)
                : api.copy_d2h(state.ctx, host, device, bytes);
  state.check(status, up ? (stream ? "async copy host-to-device" : "copy host-to-device")
                         : (stream ? "async copy device-to-host" : "copy device-to-host"));
}

using Owner = std::shared_ptr<runtime::WorkerState>;

// One slot call on a stream or event of this worker (`owner` must be this state); a
// no-op for the null handle of a backend without async slots.
template <class Call>
void queue_call(runtime::WorkerState& state, const Owner& owner, void* handle, const char* what,
                Call&& call) {
  if (owner.get() != &state)
    throw Error(ErrorCode::invalid_argument, std::string(what) +
                                                 ": the stream or event was "
                                                 "not created by this worker");
  if (handle != nullptr) state.check(call(state.api(), handle), what);
}

// A backend stream or event entered in the table; null where the backend has no async
// slots (they come as a set), so callers keep one code path.
void* create_queue_handle(runtime::WorkerState& s, QueueKind kind) {
  if (s.api().stream_create == nullptr) return nullptr;
  void* handle = nullptr;
  if (kind == QueueKind::stream)
    s.check(s.api().stream_create(s.ctx, reinterpret_cast<ps_stream**>(&handle)), "stream create");
  else
    s.check(s.api().event_create(s.ctx, reinterpret_cast<ps_event**>(&handle)), "event create");
  s.add_handle(entry_kind(kind), handle);
  return handle;
}

void require_own(const Owner& state, const Owner& owner, const char* what) {
  if (owner != state)
    throw Error(ErrorCode::invalid_argument, std::string(what) + " was not created by this worker");
}

// Runs a host callable under the backend's host_execute slot, keeping its exception.
struct HostCall {
  const HostCallable* fn;
  std::span<const ExecArg> args;
  std::exception_ptr error;
  static int run(void* self) noexcept {
    auto* call = static_cast<HostCall*>(self);
    try {
      (*call->fn)(call->args);
      return PS_OK;
    } catch (...) {
      call->error = std::current_exception();
      return PS_ERR_BACKEND;
    }
  }
};

}  // namespace

void Worker::copy_to_device(const DeviceBuffer& dst, size_t dst_offset, const void* src,
                            size_t bytes) {
  const runtime::CallGuard guard = enter();
  copy(*state_, Direction::to_device, dst, dst_offset, const_cast<void*>(src), bytes, nullptr);
}

void Worker::copy_to_host(void* dst, const DeviceBuffer& src, size_t src_offset, size_t bytes) {
  const runtime::CallGuard guard = enter();
  copy(*state_, Direction::to_host, src, src_offset, dst, bytes, nullptr);
}

Stream Worker::create_stream() {
  const runtime::CallGuard guard = enter();
  Stream stream;
  stream.owner_ = state_;
  stream.handle_ = create_queue_handle(*state_, QueueKind::stream);
  return stream;
}

Event Worker::create_event() {
  const runtime::CallGuard guard = enter();
  Event event;
  event.owner_ = state_;
  event.handle_ = create_queue_handle(*state_, QueueKind::event);
  return event;
}

void Worker::copy_to_device_async(const DeviceBuffer& dst, size_t dst_offset, const void* src,
                                  size_t bytes, Stream& stream) {
  const runtime::CallGuard guard = enter();
  require_own(state_, stream.owner_, "stream");
  copy(*state_, Direction::to_device, dst, dst_offset, const_cast<void*>(src), bytes,
       static_cast<ps_stream*>(stream.handle_));
}

void Worker::copy_to_host_async(void* dst, const DeviceBuffer& src, size_t src_offset, size_t bytes,
                                Stream& stream) {
  const runtime::CallGuard guard = enter();
  require_own(state_, stream.owner_, "stream");
  copy(*state_, Direction::to_host, src, src_offset, dst, bytes,
       static_cast<ps_stream*>(stream.handle_));
}

void Worker::record(Event& event, Stream& stream) {
  const runtime::CallGuard guard = enter();
  require_own(state_, stream.owner_, "stream");
  queue_call(*state_, event.owner_, event.handle_, "event record", [&](const auto& api, auto* e) {
    return api.event_record(state_->ctx, static_cast<ps_event*>(e),
                            static_cast<ps_stream*>(stream.handle_));
  });
}

void Worker::wait(Event& event) {
  const runtime::CallGuard guard = enter();
  queue_call(*state_, event.owner_, event.handle_, "event wait", [&](const auto& api, auto* e) {
    return api.event_sync(state_->ctx, static_cast<ps_event*>(e));
  });
}

void Worker::synchronize(Stream& stream) {
  const runtime::CallGuard guard = enter();
  queue_call(*state_, stream.owner_, stream.handle_, "stream synchronize",
             [&](const auto& api, auto* h) {
               return api.stream_sync(state_->ctx, static_cast<ps_stream*>(h));
             });
}

void Worker::execute(const std::string& callable, std::span<const ExecArg> args) {
  const runtime::CallGuard guard = enter();
  if (state_->api().host_execute == nullptr)
    throw Error(ErrorCode::unsupported, "backend '" + state_->name() +
                                            "' runs no host callables (asked for '" + callable +
                                            "'): its device memory is not host memory");
  HostCall call{&runtime::find_host_callable(callable), args, nullptr};
  for (const auto& arg : args)
    if (arg.bytes > 0)
      state_->require_device_range(arg.device_ptr, arg.bytes,
                                   "execute '" + callable + "': argument '" + arg.name + "'");
  const int status = state_->api().host_execute(state_->ctx, &HostCall::run, &call);
  if (call.error) std::rethrow_exception(call.error);
  state_->check(status, ("execute '" + callable + "'").c_str());
}

void* Worker::backend_extension(const std::string& name) const {
  const runtime::CallGuard guard = enter();
  const auto lookup = state_->api().get_proc_address;
  return lookup != nullptr ? lookup(name.c_str()) : nullptr;
}

ps_device_ctx* Worker::native_context() const {
  const runtime::CallGuard guard = enter();
  return state_->ctx;
}

void Worker::inject_fault(FaultKind kind, uint64_t nth) {
  const runtime::CallGuard guard = enter();
  if (state_->api().inject_fault == nullptr)
    throw Error(ErrorCode::unsupported, "backend '" + state_->name() + "' has no fault hook");
  state_->check(state_->api().inject_fault(state_->ctx, static_cast<int>(kind), nth),
                "inject_fault");
}

void require_chip_worker(const Worker& worker, std::string_view who) {
  if (worker.level() != WorkerLevel::chip || !worker.initialized())
    throw Error(ErrorCode::invalid_argument,
                std::string(who) + " needs an initialized chip-level worker (got a " +
                    worker_level_name(worker.level()) + "-level worker that is " +
                    (worker.initialized() ? "initialized" : "not initialized") +
                    "): pinned memory belongs to the worker that owns the device");
}

}  // namespace pinstage
