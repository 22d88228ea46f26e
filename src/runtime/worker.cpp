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
//
// Note [Fork]
// ~~~~~~~~~~~
// fork() copies a Worker's memory but none of its threads (the backend's stream and copy
// threads, the reader pool). In the child every call is Error(invalid_argument,
// kForkedMessage), buffers release nothing, and the Worker's destructor leaks its state
// on purpose: destroying the context would join threads and destroy condition variables
// that exist only in the parent. The child makes its own Worker.
#include "pinstage/worker.h"
#include "pinstage/names.h"

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <new>
#include <utility>
#include <vector>

#include "pinstage/log.h"
#include "pinstage/pages.h"
#include "pinstage/settings.h"
#include "runtime/given_once.h"
#include "runtime/worker_state.h"

namespace pinstage {

const char* worker_level_name(WorkerLevel level) {
  static constexpr const char* kNames[] = {"chip", "node"};  // WorkerLevel order
  return enum_name(level, kNames, "unknown");
}

WorkerLevel parse_worker_level(std::string_view name) {
  if (name == "chip") return WorkerLevel::chip;
  if (name == "node") return WorkerLevel::node;
  throw Error(ErrorCode::invalid_argument,
              "unknown worker level '" + std::string(name) + "' (supported: chip, node)");
}

namespace {
constexpr const char* kNotInitializedMessage =
    "worker is not initialized: call init(backend, device_id) first";
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
  detail::check_given_once(
      config, [&](const auto& entry) { return entry.first == key; },
      "backend option '" + key + "'");
  config.emplace_back(std::move(key), std::string(key_equals_value.substr(eq + 1)));
}

// ---- Worker ----

Worker::Worker(WorkerLevel level) : level_(level) {
  if (level != WorkerLevel::chip)
    throw Error(ErrorCode::invalid_argument,
                std::string("a Worker owns one device (level chip), not level ") +
                    worker_level_name(level) +
                    ": the node level is a WorkerGroup (worker_group.h)");
}

Worker::~Worker() {
  if (state_ && state_->forked()) {
    // Note [Fork]: leaked on purpose (should even this allocation fail, the state is
    // released as usual, and finalize() and the buffers still touch nothing).
    static_cast<void>(new (std::nothrow) std::shared_ptr<runtime::WorkerState>(std::move(state_)));
    return;
  }
  finalize();
}

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
  state->plugin = &runtime::acquire_plugin(backend, options);
  state->placement =
      runtime::decide_placement(runtime::resolve_host_numa_node(options.host_numa_node));
  state->options = options;
  std::vector<ps_config_entry> entries;
  const ps_context_options ctx_options =
      runtime::context_options(options, state->placement.numa_node, entries);
  ps_device_ctx* ctx = nullptr;
  const int status = state->api().create_context(device_id, &ctx_options, &ctx);
  if (status != PS_OK)
    runtime::throw_backend_failure(*state->plugin, status,
                                   "create a context for device " + std::to_string(device_id));
  ps_capabilities caps{};
  if (state->api().get_capabilities(ctx, &caps) == PS_OK)
    state->pins_with_mlock = caps.device_memory_is_host != 0;
  state->placement.dont_fork = !state->pins_with_mlock;
  state->ctx = ctx;
  state->device_id = device_id;
  // The runtime makes the memory, the plugin pins it (Note [Segment sources]): the pool's
  // source is the plugin's own allocation only where it cannot pin memory we map.
  for (size_t k = 0; k < runtime::kSourceKindCount; ++k)
    state->sources[k] = runtime::make_source(static_cast<runtime::SourceKind>(k), state->placement,
                                             state->api(), ctx);
  if (state->api().host_register == nullptr) state->pool_source = runtime::SourceKind::vendor;
  state->host_cache_limit = options.host_cache_limit_bytes.value_or(
      setting_host_cache_max().value_or(physical_memory_bytes() / 8));
  state->live = true;
  state->owner_pid = ::getpid();
  state_ = std::move(state);
}

void Worker::finalize() noexcept {
  if (state_ && state_->forked()) return;  // Note [Fork]
  if (state_)
    state_->shutdown();
  else
    finalized_unused_ = true;  // terminal all the same: init() now refuses
}

void Worker::require_state() const {
  if (finalized_unused_) throw Error(ErrorCode::finalized, runtime::kFinalizedMessage);
  if (!state_) throw Error(ErrorCode::not_initialized, kNotInitializedMessage);
}

bool Worker::initialized() const noexcept {
  if (!state_ || state_->forked()) return false;
  std::lock_guard lock(state_->mu);
  return state_->live;
}

bool Worker::finalized() const noexcept {
  return state_ ? !initialized() : finalized_unused_.load();
}

const runtime::WorkerState& Worker::state() const {
  require_state();
  if (state_->forked()) throw Error(ErrorCode::invalid_argument, runtime::kForkedMessage);
  std::lock_guard lock(state_->mu);
  if (!state_->live) throw Error(ErrorCode::finalized, runtime::kFinalizedMessage);
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
  return Capabilities{caps.pinned_is_page_locked != 0,
                      caps.async_copy != 0,
                      caps.execute != 0,
                      caps.device_memory_is_host != 0,
                      state_->api().copy_d2d_async != nullptr,
                      state_->api().memset_async != nullptr};
}

WorkerStats Worker::stats() const {
  const runtime::CallGuard guard = enter();
  WorkerStats stats;
  state_->check(state_->api().mem_info(state_->ctx, &stats.device_capacity_bytes,
                                       &stats.device_committed_bytes),
                "mem_info");
  std::lock_guard lock(state_->mu);
  using runtime::EntryKind;
  stats.pinned_bytes = state_->host.live_bytes();
  stats.pinned_count = state_->host.live_count();
  stats.device_bytes = state_->table.bytes(EntryKind::device);
  stats.device_count = state_->table.count(EntryKind::device);
  for (size_t k = 0; k < runtime::kEntryKindCount; ++k) {
    const auto kind = static_cast<EntryKind>(k);
    if (kind != EntryKind::device && !runtime::is_host_segment(kind)) continue;
    stats.failed_free_count += state_->table.failed_count(kind);
    stats.failed_free_bytes += state_->table.failed_bytes(kind);
  }
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

// One copy through the backend: on `stream` when it has a handle, else synchronous. The
// one table of pinned ranges gives the copy flags and notes the stream on the block.
void copy(runtime::WorkerState& state, Direction dir, const DeviceBuffer& buffer, size_t offset,
          void* host, size_t bytes, ps_stream* stream) {
  const bool up = dir == Direction::to_device;
  const char* what = up ? (stream ? "copy_to_device_async" : "copy_to_device")
                        : (stream ? "copy_to_host_async" : "copy_to_host");
  void* device = device_range(state, buffer, offset, bytes, what);
  if (host == nullptr && bytes > 0)
    throw Error(ErrorCode::invalid_argument, std::string(what) + ": host pointer is null");
  if (bytes == 0) return;
  const auto& api = state.api();
  const uint32_t flags = state.host_flags(host, bytes, stream);
  int status;
  if (stream != nullptr)
    status = up ? api.copy_h2d_async(state.ctx, device, host, bytes, flags, stream)
                : api.copy_d2h_async(state.ctx, host, device, bytes, flags, stream);
  else
    status = up ? api.copy_h2d(state.ctx, device, host, bytes, flags)
                : api.copy_d2h(state.ctx, host, device, bytes, flags);
  state.check(status, up ? (stream ? "async copy host-to-device" : "copy host-to-device")
                         : (stream ? "async copy device-to-host" : "copy device-to-host"));
}

// Error(unsupported) naming the backend and the operation when its ABI v5 slot is NULL:
// device-side work has no host fallback, so a caller learns the backend lacks it.
template <class Slot>
Slot require_slot(const runtime::WorkerState& state, Slot slot, const char* what,
                  const char* slot_name) {
  if (slot == nullptr)
    throw Error(ErrorCode::unsupported, "backend '" + state.name() + "' has no " + what + " (its " +
                                            slot_name + " slot is NULL)");
  return slot;
}

// One device-to-device copy through the copy_d2d_async slot: on `stream`, or (null)
// complete when it returns. Both ranges checked against the table; overlap is refused,
// since the slots are memcpy-like and a backend need not handle it.
void copy_d2d(runtime::WorkerState& state, const DeviceBuffer& dst, size_t dst_offset,
              const DeviceBuffer& src, size_t src_offset, size_t bytes, ps_stream* stream,
              const char* what) {
  const auto slot =
      require_slot(state, state.api().copy_d2d_async, "device-to-device copy", "copy_d2d_async");
  void* to = device_range(state, dst, dst_offset, bytes, what);
  const void* from = device_range(state, src, src_offset, bytes, what);
  const auto a = reinterpret_cast<uintptr_t>(to), b = reinterpret_cast<uintptr_t>(from);
  if (bytes > 0 && a < b + bytes && b < a + bytes)
    throw Error(ErrorCode::invalid_argument,
                std::string(what) + ": the destination [" + std::to_string(dst_offset) + ", " +
                    std::to_string(dst_offset) + " + " + std::to_string(bytes) +
                    ") overlaps the source [" + std::to_string(src_offset) + ", " +
                    std::to_string(src_offset) + " + " + std::to_string(bytes) +
                    ") in the same device buffer");
  if (bytes == 0) return;
  state.check(slot(state.ctx, to, from, bytes, stream),
              stream ? "async copy device-to-device" : "copy device-to-device");
}

// One fill through the memset_async slot; `value` must be a byte, never truncated.
void fill(runtime::WorkerState& state, const DeviceBuffer& dst, size_t offset, int value,
          size_t bytes, ps_stream* stream, const char* what) {
  const auto slot = require_slot(state, state.api().memset_async, "device fill", "memset_async");
  if (value < 0 || value > 255)
    throw Error(ErrorCode::invalid_argument,
                std::string(what) + ": value " + std::to_string(value) + " is not a byte (0..255)");
  void* to = device_range(state, dst, offset, bytes, what);
  if (bytes == 0) return;
  state.check(slot(state.ctx, to, value, bytes, stream),
              stream ? "async device fill" : "device fill");
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
  s.add_handle(runtime::entry_kind(kind), handle);
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
  return Stream(state_, create_queue_handle(*state_, QueueKind::stream));
}

Event Worker::create_event() {
  const runtime::CallGuard guard = enter();
  return Event(state_, create_queue_handle(*state_, QueueKind::event));
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

void Worker::copy_on_device(const DeviceBuffer& dst, size_t dst_offset, const DeviceBuffer& src,
                            size_t src_offset, size_t bytes) {
  const runtime::CallGuard guard = enter();
  copy_d2d(*state_, dst, dst_offset, src, src_offset, bytes, nullptr, "copy_on_device");
}

void Worker::copy_on_device_async(const DeviceBuffer& dst, size_t dst_offset,
                                  const DeviceBuffer& src, size_t src_offset, size_t bytes,
                                  Stream& stream) {
  const runtime::CallGuard guard = enter();
  require_own(state_, stream.owner_, "stream");
  copy_d2d(*state_, dst, dst_offset, src, src_offset, bytes,
           static_cast<ps_stream*>(stream.handle_), "copy_on_device_async");
}

void Worker::fill_device(const DeviceBuffer& dst, size_t offset, int value, size_t bytes) {
  const runtime::CallGuard guard = enter();
  fill(*state_, dst, offset, value, bytes, nullptr, "fill_device");
}

void Worker::fill_device_async(const DeviceBuffer& dst, size_t offset, int value, size_t bytes,
                               Stream& stream) {
  const runtime::CallGuard guard = enter();
  require_own(state_, stream.owner_, "stream");
  fill(*state_, dst, offset, value, bytes, static_cast<ps_stream*>(stream.handle_),
       "fill_device_async");
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

bool Worker::query(Event& event) {
  const runtime::CallGuard guard = enter();
  bool reached = true;
  queue_call(*state_, event.owner_, event.handle_, "event query", [&](const auto& api, auto* e) {
    if (api.event_query == nullptr) return api.event_sync(state_->ctx, static_cast<ps_event*>(e));
    const int status = api.event_query(state_->ctx, static_cast<ps_event*>(e));
    if (status == PS_ERR_NOT_READY) {
      reached = false;
      return static_cast<int>(PS_OK);
    }
    // Reached: a copy before it that failed is reported as wait() reports it.
    return status == PS_OK ? api.event_sync(state_->ctx, static_cast<ps_event*>(e)) : status;
  });
  return reached;
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
    throw Error(
        ErrorCode::invalid_argument,
        std::string(who) + " needs an initialized chip-level worker (got a " +
            worker_level_name(worker.level()) + "-level worker that " +
            (worker.initialized() ? "is initialized"
             : worker.finalized() ? "was finalized; finalize is terminal: create a new Worker"
                                  : "is not initialized: call init() first") +
            "): pinned memory belongs to the worker that owns the device");
}

}  // namespace pinstage
