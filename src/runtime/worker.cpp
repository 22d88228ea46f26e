// Note [Pinned memory lifecycle]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A Worker holds a shared WorkerState; every buffer, stream and event it hands out holds
// the same shared_ptr as its owner token, so the state outlives all of them while the
// device context and plugin do not have to.
//  - Allocation: the backend call runs without the lock (pinning can take seconds), then
//    the pointer is entered in the registry under the lock.
//  - Release: the pointer leaves the registry under the lock, then the backend frees it
//    without the lock. An untracked pointer is an error, never a silent no-op.
//  - Finalize: marks the state dead, waits for in-flight backend calls (CallGuard) to
//    finish, reclaims every registry entry (logging the count), destroys the context and
//    unloads the plugin. A buffer released afterwards finds the state dead: a no-op.
//  - Destructors never throw; a failed release is logged with the backend's reason.
#include "pinstage/worker.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <utility>
#include <vector>

#include "pinstage/log.h"
#include "runtime/worker_state.h"

namespace pinstage {

const char* worker_level_name(WorkerLevel level) {
  switch (level) {
    case WorkerLevel::chip:
      return "chip";
  }
  return "unknown";
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
}  // namespace

namespace detail {

namespace {

uint64_t physical_memory_bytes() {
  return static_cast<uint64_t>(sysconf(_SC_PHYS_PAGES)) *
         static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
}

const char* kind_name(MemoryKind kind) {
  return kind == MemoryKind::pinned_host ? "pinned host" : "device";
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
  std::string message = plugin.info.name + " " + what + " failed: " + ps_status_str(status);
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
  void* ptr = nullptr;
  if (kind == MemoryKind::pinned_host)
    check(api().host_alloc_pinned(ctx, bytes, &ptr), "pinned host alloc");
  else
    check(api().device_malloc(ctx, bytes, &ptr), "device malloc");
  bool inserted;
  {
    std::lock_guard lock(mu);
    inserted = (kind == MemoryKind::pinned_host ? pinned : device).insert(ptr, bytes);
  }
  if (!inserted) {
    // The backend returned an address it already handed out: give it back, refuse to alias.
    if (kind == MemoryKind::pinned_host)
      api().host_free_pinned(ctx, ptr);
    else
      api().device_free(ctx, ptr);
    throw Error(ErrorCode::internal, plugin.info.name + " returned an address already in use");
  }
  return ptr;
}

void WorkerState::free(MemoryKind kind, void* ptr) {
  CallGuard guard(*this);
  if (!guard.entered()) return;  // reclaimed by finalize already
  {
    std::lock_guard lock(mu);
    if (!(kind == MemoryKind::pinned_host ? pinned : device).erase(ptr))
      throw Error(ErrorCode::unknown_pointer, std::string("free of a ") + kind_name(kind) +
                                                  " pointer this worker did not allocate");
  }
  if (kind == MemoryKind::pinned_host)
    check(api().host_free_pinned(ctx, ptr), "pinned host free");
  else
    check(api().device_free(ctx, ptr), "device free");
}

void WorkerState::shutdown() noexcept {
  std::vector<std::pair<void*, size_t>> pinned_left, device_left;
  {
    std::unique_lock lock(mu);
    if (!live) return;
    live = false;
    idle.wait(lock, [this] { return in_flight == 0; });
    pinned_left = pinned.take_all();
    device_left = device.take_all();
  }
  if (streams + events > 0)
    log(LogLevel::warn, "finalize: " + std::to_string(streams) + " stream(s) and " +
                            std::to_string(events) +
                            " event(s) still alive; released with the context");
  auto reclaim = [&](const std::vector<std::pair<void*, size_t>>& left, MemoryKind kind) {
    if (left.empty()) return;
    uint64_t bytes = 0;
    for (const auto& [ptr, size] : left) {
      bytes += size;
      const int status = kind == MemoryKind::pinned_host ? api().host_free_pinned(ctx, ptr)
                                                         : api().device_free(ctx, ptr);
      if (status != PS_OK)
        log(LogLevel::error, std::string("finalize: releasing ") + kind_name(kind) +
                                 " memory failed: " + ps_status_str(status) + " " +
                                 api().last_error());
    }
    log(LogLevel::info, "finalize reclaimed " + std::to_string(left.size()) + " outstanding " +
                            kind_name(kind) + " allocation(s), " + std::to_string(bytes) +
                            " bytes");
  };
  reclaim(pinned_left, MemoryKind::pinned_host);
  reclaim(device_left, MemoryKind::device);
  const int status = api().destroy_context(ctx);
  if (status != PS_OK)
    log(LogLevel::error, std::string("finalize: destroying the device context failed: ") +
                             ps_status_str(status) + " " + api().last_error());
  ctx = nullptr;
  plugin.api = nullptr;
  plugin.handle.reset();
}

}  // namespace detail

// ---- Buffer ----

template <MemoryKind Kind>
Buffer<Kind>::Buffer(std::shared_ptr<detail::WorkerState> owner, void* data, size_t size) noexcept
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

Stream::Stream(Stream&& other) noexcept
    : owner_(std::move(other.owner_)), handle_(std::exchange(other.handle_, nullptr)) {}

Stream& Stream::operator=(Stream&& other) noexcept {
  if (this != &other) {
    Stream dying(std::move(*this));
    owner_ = std::move(other.owner_);
    handle_ = std::exchange(other.handle_, nullptr);
  }
  return *this;
}

Stream::~Stream() {
  if (!owner_) return;
  detail::CallGuard guard(*owner_);
  if (!guard.entered()) return;
  {
    std::lock_guard lock(owner_->mu);
    --owner_->streams;
  }
  if (handle_ == nullptr) return;
  const int status = owner_->api().stream_destroy(owner_->ctx, static_cast<ps_stream*>(handle_));
  if (status != PS_OK)
    log(LogLevel::error, std::string("stream destroy failed: ") + ps_status_str(status));
}

Event::Event(Event&& other) noexcept
    : owner_(std::move(other.owner_)), handle_(std::exchange(other.handle_, nullptr)) {}

Event& Event::operator=(Event&& other) noexcept {
  if (this != &other) {
    Event dying(std::move(*this));
    owner_ = std::move(other.owner_);
    handle_ = std::exchange(other.handle_, nullptr);
  }
  return *this;
}

Event::~Event() {
  if (!owner_) return;
  detail::CallGuard guard(*owner_);
  if (!guard.entered()) return;
  {
    std::lock_guard lock(owner_->mu);
    --owner_->events;
  }
  if (handle_ == nullptr) return;
  const int status = owner_->api().event_destroy(owner_->ctx, static_cast<ps_event*>(handle_));
  if (status != PS_OK)
    log(LogLevel::error, std::string("event destroy failed: ") + ps_status_str(status));
}

// ---- Worker ----

Worker::Worker(WorkerLevel level) : level_(level) {}

Worker::~Worker() { finalize(); }

void Worker::init(const std::string& backend, int device_id, const WorkerOptions& options) {
  if (state_) {
    throw Error(state_->live ? ErrorCode::invalid_argument : ErrorCode::finalized,
                state_->live
                    ? "worker is already initialized (backend " + state_->plugin.info.name + ")"
                    : "worker was finalized: finalize is terminal, create a new Worker");
  }
  if (backend.empty() || !std::all_of(backend.begin(), backend.end(), [](unsigned char c) {
        return std::islower(c) || std::isdigit(c) || c == '_';
      }))
    throw Error(ErrorCode::invalid_argument,
                "backend name '" + backend + "' is not valid (lower-case letters, digits, _)");
  if (device_id < 0)
    throw Error(ErrorCode::invalid_argument,
                "device id must be >= 0, got " + std::to_string(device_id));
  auto state = std::make_shared<detail::WorkerState>();
  const std::string path =
      options.plugin_path.empty() ? detail::default_plugin_path(backend) : options.plugin_path;
  state->plugin = detail::load_plugin(backend, path);
  ps_context_options ctx_options{options.device_capacity_bytes,
                                 options.config.empty() ? nullptr : options.config.c_str()};
  ps_device_ctx* ctx = nullptr;
  const int status = state->api().create_context(device_id, &ctx_options, &ctx);
  if (status != PS_OK) {
    const char* detail = state->api().last_error();
    throw Error(error_code_from_status(status),
                "backend '" + backend + "' (" + path + ") could not create a context for device " +
                    std::to_string(device_id) + ": " + ps_status_str(status) +
                    (detail && *detail ? std::string(" (") + detail + ")" : std::string()));
  }
  state->ctx = ctx;
  state->device_id = device_id;
  state->live = true;
  state_ = std::move(state);
}

void Worker::finalize() noexcept {
  if (state_) state_->shutdown();
}

bool Worker::initialized() const noexcept {
  if (!state_) return false;
  std::lock_guard lock(state_->mu);
  return state_->live;
}

bool Worker::finalized() const noexcept { return state_ && !initialized(); }

const detail::WorkerState& Worker::state() const {
  if (!state_) throw Error(ErrorCode::not_initialized, kNotInitializedMessage);
  std::lock_guard lock(state_->mu);
  if (!state_->live) throw Error(ErrorCode::finalized, kFinalizedMessage);
  return *state_;
}

detail::CallGuard Worker::enter() const {
  if (!state_) throw Error(ErrorCode::not_initialized, kNotInitializedMessage);
  detail::CallGuard guard(*state_);
  guard.require();
  return guard;
}

int Worker::device_id() const { return state().device_id; }

const BackendInfo& Worker::backend() const { return state().plugin.info; }

Capabilities Worker::capabilities() const {
  const detail::CallGuard guard = enter();
  ps_capabilities caps{};
  state_->check(state_->api().get_capabilities(state_->ctx, &caps), "capability query");
  return Capabilities{caps.pinned_is_page_locked != 0, caps.async_copy != 0,
                      caps.host_register != 0, caps.execute != 0, caps.device_memory_is_host != 0};
}

WorkerStats Worker::stats() const {
  const detail::CallGuard guard = enter();
  WorkerStats stats;
  state_->check(state_->api().mem_info(state_->ctx, &stats.device_capacity_bytes,
                                       &stats.device_committed_bytes),
                "mem_info");
  std::lock_guard lock(state_->mu);
  stats.pinned_bytes = state_->pinned.bytes();
  stats.pinned_count = state_->pinned.count();
  stats.device_bytes = state_->device.bytes();
  stats.device_count = state_->device.count();
  return stats;
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

// The device address for [offset, offset + bytes) of `buffer`, checked.
void* device_range(const DeviceBuffer& buffer, size_t offset, size_t bytes, const char* what) {
  if (!buffer)
    throw Error(ErrorCode::invalid_argument, std::string(what) + ": device buffer is empty");
  if (offset > buffer.size() || bytes > buffer.size() - offset)
    throw Error(ErrorCode::invalid_argument,
                std::string(what) + ": range [" + std::to_string(offset) + ", " +
                    std::to_string(offset) + " + " + std::to_string(bytes) +
                    ") is outside the device buffer of " + std::to_string(buffer.size()) +
                    " bytes");
  return static_cast<char*>(buffer.data()) + offset;
}

void require_host(const void* ptr, size_t bytes, const char* what) {
  if (ptr == nullptr && bytes > 0)
    throw Error(ErrorCode::invalid_argument, std::string(what) + ": host pointer is null");
}

}  // namespace

void Worker::copy_to_device(const DeviceBuffer& dst, size_t dst_offset, const void* src,
                            size_t bytes) {
  const detail::CallGuard guard = enter();
  void* d = device_range(dst, dst_offset, bytes, "copy_to_device");
  require_host(src, bytes, "copy_to_device");
  if (bytes == 0) return;
  state_->check(state_->api().copy_h2d(state_->ctx, d, src, bytes), "copy host-to-device");
}

void Worker::copy_to_host(void* dst, const DeviceBuffer& src, size_t src_offset, size_t bytes) {
  const detail::CallGuard guard = enter();
  const void* s = device_range(src, src_offset, bytes, "copy_to_host");
  require_host(dst, bytes, "copy_to_host");
  if (bytes == 0) return;
  state_->check(state_->api().copy_d2h(state_->ctx, dst, s, bytes), "copy device-to-host");
}

Stream Worker::create_stream() {
  const detail::CallGuard guard = enter();
  Stream stream;
  if (state_->api().stream_create != nullptr) {
    ps_stream* handle = nullptr;
    state_->check(state_->api().stream_create(state_->ctx, &handle), "stream create");
    stream.handle_ = handle;
  }
  stream.owner_ = state_;
  std::lock_guard lock(state_->mu);
  ++state_->streams;
  return stream;
}

Event Worker::create_event() {
  const detail::CallGuard guard = enter();
  Event event;
  if (state_->api().event_create != nullptr) {
    ps_event* handle = nullptr;
    state_->check(state_->api().event_create(state_->ctx, &handle), "event create");
    event.handle_ = handle;
  }
  event.owner_ = state_;
  std::lock_guard lock(state_->mu);
  ++state_->events;
  return event;
}

void Worker::copy_to_device_async(const DeviceBuffer& dst, size_t dst_offset, const void* src,
                                  size_t bytes, Stream& stream) {
  const detail::CallGuard guard = enter();
  if (stream.owner_ != state_)
    throw Error(ErrorCode::invalid_argument, "stream was not created by this worker");
  if (stream.handle_ == nullptr) return copy_to_device(dst, dst_offset, src, bytes);
  void* d = device_range(dst, dst_offset, bytes, "copy_to_device_async");
  require_host(src, bytes, "copy_to_device_async");
  if (bytes == 0) return;
  state_->check(state_->api().copy_h2d_async(state_->ctx, d, src, bytes,
                                             static_cast<ps_stream*>(stream.handle_)),
                "async copy host-to-device");
}

void Worker::copy_to_host_async(void* dst, const DeviceBuffer& src, size_t src_offset, size_t bytes,
                                Stream& stream) {
  const detail::CallGuard guard = enter();
  if (stream.owner_ != state_)
    throw Error(ErrorCode::invalid_argument, "stream was not created by this worker");
  if (stream.handle_ == nullptr) return copy_to_host(dst, src, src_offset, bytes);
  const void* s = device_range(src, src_offset, bytes, "copy_to_host_async");
  require_host(dst, bytes, "copy_to_host_async");
  if (bytes == 0) return;
  state_->check(state_->api().copy_d2h_async(state_->ctx, dst, s, bytes,
                                             static_cast<ps_stream*>(stream.handle_)),
                "async copy device-to-host");
}

void Worker::record(Event& event, Stream& stream) {
  const detail::CallGuard guard = enter();
  if (event.owner_ != state_ || stream.owner_ != state_)
    throw Error(ErrorCode::invalid_argument, "event or stream was not created by this worker");
  if (event.handle_ == nullptr) return;
  state_->check(state_->api().event_record(state_->ctx, static_cast<ps_event*>(event.handle_),
                                           static_cast<ps_stream*>(stream.handle_)),
                "event record");
}

void Worker::wait(Event& event) {
  const detail::CallGuard guard = enter();
  if (event.owner_ != state_)
    throw Error(ErrorCode::invalid_argument, "event was not created by this worker");
  if (event.handle_ == nullptr) return;
  state_->check(state_->api().event_sync(state_->ctx, static_cast<ps_event*>(event.handle_)),
                "event wait");
}

void Worker::synchronize(Stream& stream) {
  const detail::CallGuard guard = enter();
  if (stream.owner_ != state_)
    throw Error(ErrorCode::invalid_argument, "stream was not created by this worker");
  if (stream.handle_ == nullptr) return;
  state_->check(state_->api().stream_sync(state_->ctx, static_cast<ps_stream*>(stream.handle_)),
                "stream synchronize");
}

void Worker::execute(const std::string& callable, std::span<const ExecArg> args) {
  const detail::CallGuard guard = enter();
  if (state_->api().execute == nullptr)
    throw Error(ErrorCode::unsupported, "backend '" + state_->plugin.info.name +
                                            "' runs no callables (asked for '" + callable + "')");
  std::vector<ps_exec_arg> raw;
  raw.reserve(args.size());
  for (const auto& arg : args) raw.push_back({arg.name.c_str(), arg.device_ptr, arg.bytes});
  state_->check(state_->api().execute(state_->ctx, callable.c_str(), raw.data(), raw.size()),
                ("execute '" + callable + "'").c_str());
}

// FaultKind is passed to the plugin as its ps_fault_kind value.
static_assert(static_cast<int>(FaultKind::device_malloc) == PS_FAULT_DEVICE_MALLOC &&
              static_cast<int>(FaultKind::copy_d2h) == PS_FAULT_COPY_D2H &&
              static_cast<int>(FaultKind::execute) == PS_FAULT_EXECUTE &&
              static_cast<int>(FaultKind::corrupt_h2d) == PS_FAULT_CORRUPT_H2D &&
              static_cast<int>(FaultKind::corrupt_h2d) + 1 == PS_FAULT_KIND_COUNT);

void Worker::inject_fault(FaultKind kind, uint64_t nth) {
  const detail::CallGuard guard = enter();
  if (state_->api().inject_fault == nullptr)
    throw Error(ErrorCode::unsupported,
                "backend '" + state_->plugin.info.name + "' has no fault hook");
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
