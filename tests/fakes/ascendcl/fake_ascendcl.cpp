// A strict test double of the Ascend runtime (libascendcl.so), built only for the tests and
// chosen with PINSTAGE_ACL_LIBRARY. It exports the ACL symbols the acl backend declares
// (src/backends/acl/acl_api.h) and the control functions of fake_acl.h.
//
// It is at least as strict as the real runtime about what the backend must get right:
// every rule of FAKE_ACL_VIOLATION_LIST answers with a specific ACL error code and records
// a violation that tests read back. It models:
//  - aclInit once per process (a second call answers ACL_ERROR_REPEAT_INITIALIZE, as older
//    runtimes do); aclFinalize with anything alive is a leak.
//  - N devices with M bytes of "device memory" each (plain host memory, allocated lazily);
//    aclrtSetDevice reference-counted per device, each device's default context.
//  - The current context per thread: a fresh thread has none, so a backend used from a
//    thread pool must set it on each thread.
//  - A memlock-style limit on page-locked host memory (aclrtMallocHost + registrations).
//  - Async copies queued per stream and run only at a synchronize (stream or event) or a
//    stream destroy: a caller that reads before waiting sees stale data. aclrtMemsetAsync
//    is queued the same way; its range, like a device-to-device copy's, must lie inside
//    one allocation of the current context's device, and such a copy's two ranges must
//    not overlap.
//  - Error injection: the nth call of a function fails with a given code, once.
//  - Devices a test models one by one (pinstage_fake_acl_set_device): their memory, or
//    an error aclrtSetDevice of that device answers with (a card that will not open).
// One mutex guards everything: the double is about rules, not speed.
#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "backends/acl/acl_api.h"
#include "fake_acl.h"

using namespace pinstage::acl;  // NOLINT: the ACL names, as the real header has them

namespace {

struct Alloc {
  size_t bytes;
  int device;
};
struct Op {
  void* dst;
  const void* src;  // NULL for a memset
  size_t bytes;
  int fill = -1;  // aclrtMemsetAsync: the byte dst is set to
};
struct Ctx {
  int device;
  bool is_default;
  bool alive = true;
};
struct Stream {
  int device;
  std::deque<Op> queue{};
};
struct Event {
  int device;
  Stream* stream = nullptr;
};

uint64_t env_u64(const char* name, uint64_t fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::strtoull(v, nullptr, 10) : fallback;
}

struct State {
  std::mutex mu;
  int devices = static_cast<int>(env_u64("PINSTAGE_FAKE_ACL_DEVICES", 2));
  uint64_t device_bytes = env_u64("PINSTAGE_FAKE_ACL_MEM_MB", 8192) << 20;
  uint64_t memlock = env_u64("PINSTAGE_FAKE_ACL_MEMLOCK_MB", 0) << 20;
  bool register_ok = env_u64("PINSTAGE_FAKE_ACL_REGISTER", 1) != 0;
  bool initialized = false;
  std::map<int, std::pair<uint64_t, int>> models;  // device -> (bytes or 0, SetDevice error)
  std::map<int, uint64_t> used, refs;
  std::map<int, Ctx*> default_ctx;
  std::vector<std::unique_ptr<Ctx>> contexts;   // never freed: a stale handle stays unique
  std::map<const char*, Alloc> host, reg, dev;  // by start address
  std::set<Stream*> streams;
  std::set<Event*> events;
  uint64_t locked = 0;
  std::vector<std::string> violations;
  std::vector<int> violation_kinds;
  std::map<std::string, std::pair<uint64_t, int>> inject;  // function -> (countdown, code)
  std::map<std::string, uint64_t> calls;
  bool trace_on = false;
  std::vector<std::string> trace;
};

State& S() {
  static State* s = new State();  // never destroyed: the backend may call in at exit
  return *s;
}

// Device memory of `device`: its model's, else the configured size.
uint64_t device_bytes(int device) {
  auto it = S().models.find(device);
  return it != S().models.end() && it->second.first != 0 ? it->second.first : S().device_bytes;
}

thread_local Ctx* t_ctx = nullptr;
thread_local std::string t_msg, t_read;

const char* const kRuleText[] = {
#define FAKE_ACL_TEXT_(E, text) text,
    FAKE_ACL_VIOLATION_LIST(FAKE_ACL_TEXT_)
#undef FAKE_ACL_TEXT_
};

// Records a failure's message for aclGetRecentErrMsg; returns `code`.
aclError error(const char* fn, aclError code, const std::string& why) {
  t_msg = std::string("fake ascendcl: ") + fn + ": " + why;
  return code;
}

// Records a violation of `kind` and fails with `code`.
aclError violation(const char* fn, fake_acl_violation kind, aclError code,
                   const std::string& detail = {}) {
  std::string text = std::string(fn) + ": " + kRuleText[kind];
  if (!detail.empty()) text += " (" + detail + ")";
  // On stderr too, so a CLI run over the double fails its ctest on any violation.
  std::fprintf(stderr, "fake ascendcl VIOLATION: %s\n", text.c_str());
  S().violations.push_back(text);
  S().violation_kinds.push_back(kind);
  return error(fn, code, kRuleText[kind]);
}

aclError done(const char* fn, aclError code) {
  if (S().trace_on) S().trace.push_back(std::string(fn) + "=" + std::to_string(code));
  return code;
}

// Counts the call and applies an injected failure; nonzero ends the call.
aclError enter(const char* fn, bool needs_init = true) {
  State& s = S();
  ++s.calls[fn];
  auto it = s.inject.find(fn);
  if (it != s.inject.end() && it->second.first != 0 && --it->second.first == 0) {
    const int code = it->second.second;
    s.inject.erase(it);
    return error(fn, code, "injected failure");
  }
  if (needs_init && !s.initialized)
    return violation(fn, FAKE_ACL_UNINITIALIZED, ACL_ERROR_UNINITIALIZE);
  return ACL_SUCCESS;
}

aclError need_ctx(const char* fn) {
  if (t_ctx == nullptr || !t_ctx->alive)
    return violation(fn, FAKE_ACL_NO_CONTEXT, ACL_ERROR_RT_CONTEXT_NULL,
                     t_ctx == nullptr ? "none set" : "the current one was destroyed");
  return ACL_SUCCESS;
}

#define BEGIN(fn, ...)           \
  std::lock_guard lock_(S().mu); \
  if (aclError e_ = enter(fn, ##__VA_ARGS__)) return done(fn, e_)
#define NEED_CTX(fn) \
  if (aclError e_ = need_ctx(fn)) return done(fn, e_)

// The entry of `m` whose range holds `p`, or nullptr.
const std::pair<const char* const, Alloc>* find_in(const std::map<const char*, Alloc>& m,
                                                   const void* p) {
  const auto* c = static_cast<const char*>(p);
  auto it = m.upper_bound(c);
  if (it == m.begin()) return nullptr;
  --it;
  return c < it->first + it->second.bytes ? &*it : nullptr;
}

const std::pair<const char* const, Alloc>* pinned_at(const void* p) {
  const auto* e = find_in(S().host, p);
  return e != nullptr ? e : find_in(S().reg, p);
}

size_t page() { return static_cast<size_t>(sysconf(_SC_PAGESIZE)); }

// "Device memory" is host memory mapped whole and populated up front (page faults one by
// one are slow in VMs), and kept for the next aclrtMalloc of the same size: a bind frees
// and reallocates the same sizes every round. Up to kCacheBytes are kept.
constexpr size_t kCacheBytes = size_t{4} << 30;
std::multimap<size_t, void*> g_cache;
size_t g_cached = 0;

void* map_device(size_t bytes) {
  auto it = g_cache.find(bytes);
  if (it != g_cache.end()) {
    void* p = it->second;
    g_cache.erase(it);
    g_cached -= bytes;
    return p;
  }
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE,
                 -1, 0);
  return p == MAP_FAILED ? nullptr : p;
}

void unmap_device(void* p, size_t bytes) {
  if (g_cached + bytes <= kCacheBytes) {
    g_cache.emplace(bytes, p);
    g_cached += bytes;
  } else {
    munmap(p, bytes);
  }
}

void run_queue(Stream* s) {
  for (const Op& op : s->queue) {
    if (op.fill >= 0)
      std::memset(op.dst, op.fill, op.bytes);
    else
      std::memcpy(op.dst, op.src, op.bytes);
  }
  s->queue.clear();
}

// FREE_IN_USE when a queued copy touches [p, p+n); the queue is then run so a retry works.
aclError check_not_queued(const char* fn, const void* p, size_t n) {
  const auto* a = static_cast<const char*>(p);
  for (Stream* s : S().streams)
    for (const Op& op : s->queue)
      for (const void* q : {static_cast<const void*>(op.dst), op.src}) {
        if (q == nullptr) continue;  // a memset has no source
        const auto* b = static_cast<const char*>(q);
        if (a < b + op.bytes && b < a + n) {
          run_queue(s);
          return violation(fn, FAKE_ACL_FREE_IN_USE, ACL_ERROR_RT_MEMORY_FREE);
        }
      }
  return ACL_SUCCESS;
}

// The device side of a copy: inside one allocation of the current context's device, and
// destMax no more than the room there when it is the destination.
aclError check_device_side(const char* fn, const void* p, size_t count, size_t dest_max,
                           bool is_dst) {
  const auto* e = find_in(S().dev, p);
  const auto* c = static_cast<const char*>(p);
  if (e == nullptr || c + count > e->first + e->second.bytes)
    return violation(fn, FAKE_ACL_COPY_OUTSIDE, ACL_ERROR_RT_PARAM_INVALID,
                     e == nullptr ? "device pointer in no allocation" : "runs past its end");
  if (is_dst && dest_max > static_cast<size_t>(e->first + e->second.bytes - c))
    return violation(fn, FAKE_ACL_DESTMAX_OVERSTATED, ACL_ERROR_INVALID_PARAM);
  if (e->second.device != t_ctx->device)
    return violation(fn, FAKE_ACL_WRONG_DEVICE, ACL_ERROR_RT_PARAM_INVALID);
  return ACL_SUCCESS;
}

// The host side: for async it must be page-locked; where it is a known pinned block the
// copy must stay inside it.
aclError check_host_side(const char* fn, const void* p, size_t count, size_t dest_max, bool is_dst,
                         bool async) {
  if (find_in(S().dev, p) != nullptr)
    return violation(fn, FAKE_ACL_HOST_SIDE_ON_DEVICE, ACL_ERROR_INVALID_PARAM);
  const auto* e = pinned_at(p);
  const auto* c = static_cast<const char*>(p);
  if (e == nullptr) {
    if (async) return violation(fn, FAKE_ACL_ASYNC_PAGEABLE, ACL_ERROR_RT_PARAM_INVALID);
    return ACL_SUCCESS;
  }
  if (c + count > e->first + e->second.bytes)
    return violation(fn, FAKE_ACL_COPY_OUTSIDE, ACL_ERROR_RT_PARAM_INVALID,
                     "runs past the end of a pinned block");
  if (is_dst && dest_max > static_cast<size_t>(e->first + e->second.bytes - c))
    return violation(fn, FAKE_ACL_DESTMAX_OVERSTATED, ACL_ERROR_INVALID_PARAM);
  return ACL_SUCCESS;
}

aclError check_copy(const char* fn, void* dst, size_t dest_max, const void* src, size_t count,
                    aclrtMemcpyKind kind, bool async) {
  if (dst == nullptr || src == nullptr) return error(fn, ACL_ERROR_INVALID_PARAM, "NULL pointer");
  if (count > dest_max) return violation(fn, FAKE_ACL_COPY_OVERFLOW, ACL_ERROR_INVALID_PARAM);
  const bool dst_dev = kind == ACL_MEMCPY_HOST_TO_DEVICE || kind == ACL_MEMCPY_DEVICE_TO_DEVICE;
  const bool src_dev = kind == ACL_MEMCPY_DEVICE_TO_HOST || kind == ACL_MEMCPY_DEVICE_TO_DEVICE;
  if (kind < ACL_MEMCPY_HOST_TO_HOST || kind > ACL_MEMCPY_DEVICE_TO_DEVICE)
    return error(fn, ACL_ERROR_INVALID_PARAM, "unknown aclrtMemcpyKind");
  aclError e = dst_dev ? check_device_side(fn, dst, count, dest_max, true)
                       : check_host_side(fn, dst, count, dest_max, true, async);
  if (e == ACL_SUCCESS)
    e = src_dev ? check_device_side(fn, src, count, 0, false)
                : check_host_side(fn, src, count, 0, false, async);
  const auto *d = static_cast<const char*>(dst), *s = static_cast<const char*>(src);
  if (e == ACL_SUCCESS && dst_dev && src_dev && d < s + count && s < d + count)
    return violation(fn, FAKE_ACL_COPY_OVERLAP, ACL_ERROR_INVALID_PARAM);
  return e;
}

Stream* find_stream(aclrtStream s) {
  auto* p = static_cast<Stream*>(s);
  return S().streams.count(p) != 0 ? p : nullptr;
}

Event* find_event(aclrtEvent e) {
  auto* p = static_cast<Event*>(e);
  return S().events.count(p) != 0 ? p : nullptr;
}

// What is alive on `device` (-1: everywhere).
fake_acl_live live_on(int device) {
  const State& s = S();
  fake_acl_live out{};
  const auto on = [device](int d) { return device < 0 || d == device; };
  for (const auto& [p, a] : s.host) out.host_allocs += on(a.device);
  for (const auto& [p, a] : s.reg) out.registrations += on(a.device);
  for (const auto& [p, a] : s.dev) out.device_allocs += on(a.device);
  for (const Stream* x : s.streams) out.streams += on(x->device);
  for (const Event* x : s.events) out.events += on(x->device);
  for (const auto& c : s.contexts) out.contexts += c->alive && !c->is_default && on(c->device);
  for (const auto& [d, n] : s.refs) out.device_refs += on(d) ? n : 0;
  out.locked_bytes = s.locked;
  out.initialized = s.initialized ? 1 : 0;
  return out;
}

std::string live_text(const fake_acl_live& l) {
  return std::to_string(l.host_allocs) + " aclrtMallocHost, " + std::to_string(l.registrations) +
         " registered, " + std::to_string(l.device_allocs) + " aclrtMalloc, " +
         std::to_string(l.streams) + " streams, " + std::to_string(l.events) + " events, " +
         std::to_string(l.contexts) + " contexts";
}

bool any_live(const fake_acl_live& l) {
  return l.host_allocs + l.registrations + l.device_allocs + l.streams + l.events + l.contexts > 0;
}

// aclFinalize: releases everything, whatever is left.
void release_everything() {
  State& s = S();
  for (auto& [p, a] : s.host) std::free(const_cast<char*>(p));
  for (auto& [p, a] : s.dev) unmap_device(const_cast<char*>(p), a.bytes);
  for (Stream* x : s.streams) delete x;
  for (Event* x : s.events) delete x;
  s.host.clear();
  s.reg.clear();
  s.dev.clear();
  s.streams.clear();
  s.events.clear();
  for (auto& c : s.contexts) c->alive = false;
  s.default_ctx.clear();
  s.refs.clear();
  s.used.clear();
  s.locked = 0;
  s.initialized = false;
}

// Stream and event calls: a known handle, used from a context of its device.
aclError check_queue_handle(const char* fn, int device, bool known) {
  if (aclError e = need_ctx(fn)) return e;
  if (!known) return violation(fn, FAKE_ACL_BAD_HANDLE, ACL_ERROR_INVALID_PARAM);
  if (device != t_ctx->device)
    return violation(fn, FAKE_ACL_WRONG_DEVICE, ACL_ERROR_RT_PARAM_INVALID);
  return ACL_SUCCESS;
}

// Stream and event calls: `var` is the handle `found`, known and of the current context's
// device (check_queue_handle), or the call ends.
#define NEED_QUEUE(fn, var, found)                                                  \
  auto* var = found;                                                                \
  if (aclError e_ = check_queue_handle(fn, var ? var->device : -1, var != nullptr)) \
  return done(fn, e_)

// aclrtCreateStream and aclrtCreateEvent: a new T of the current context's device, kept in
// `live`.
template <class T>
aclError create_queue_object(const char* fn, std::set<T*>& live, void** out) {
  BEGIN(fn);
  NEED_CTX(fn);
  if (out == nullptr) return done(fn, ACL_ERROR_INVALID_PARAM);
  auto* x = new T{t_ctx->device};
  live.insert(x);
  *out = x;
  return done(fn, ACL_SUCCESS);
}

// The frees and aclrtHostUnregister: `unknown()` when no block of `m` starts at `ptr`,
// FREE_IN_USE while a queued copy touches it, else `release(block)` and it is forgotten.
template <class Unknown, class Release>
aclError release_block(const char* fn, std::map<const char*, Alloc>& m, void* ptr,
                       Unknown&& unknown, Release&& release) {
  auto it = m.find(static_cast<const char*>(ptr));
  if (it == m.end()) return unknown();
  if (aclError e = check_not_queued(fn, ptr, it->second.bytes)) return e;
  release(it->second);
  m.erase(it);
  return ACL_SUCCESS;
}

}  // namespace

extern "C" {

// ---- the ACL symbols ----

aclError aclInit(const char* /*configPath*/) {
  BEGIN("aclInit", false);
  if (S().initialized)
    return done("aclInit", error("aclInit", ACL_ERROR_REPEAT_INITIALIZE, "already initialised"));
  S().initialized = true;
  return done("aclInit", ACL_SUCCESS);
}

aclError aclFinalize() {
  BEGIN("aclFinalize");
  const fake_acl_live left = live_on(-1);
  aclError code = ACL_SUCCESS;
  if (any_live(left) || left.device_refs > 0)
    code = violation(
        "aclFinalize", FAKE_ACL_LEAK_AT_FINALIZE, ACL_ERROR_INTERNAL_ERROR,
        live_text(left) + ", " + std::to_string(left.device_refs) + " aclrtSetDevice not reset");
  release_everything();
  return done("aclFinalize", code);
}

const char* aclGetRecentErrMsg() {
  if (t_msg.empty()) return nullptr;
  t_read = std::move(t_msg);
  t_msg.clear();
  return t_read.c_str();
}

aclError aclrtGetDeviceCount(uint32_t* count) {
  BEGIN("aclrtGetDeviceCount");
  if (count == nullptr) return done("aclrtGetDeviceCount", ACL_ERROR_INVALID_PARAM);
  *count = static_cast<uint32_t>(S().devices);
  return done("aclrtGetDeviceCount", ACL_SUCCESS);
}

aclError aclrtSetDevice(int32_t device) {
  BEGIN("aclrtSetDevice");
  State& s = S();
  if (device < 0 || device >= s.devices)
    return done("aclrtSetDevice", error("aclrtSetDevice", ACL_ERROR_RT_INVALID_DEVICEID,
                                        "no device " + std::to_string(device)));
  if (auto m = s.models.find(device); m != s.models.end() && m->second.second != ACL_SUCCESS)
    return done("aclrtSetDevice",
                error("aclrtSetDevice", m->second.second, "the device will not open (modelled)"));
  ++s.refs[device];
  Ctx*& def = s.default_ctx[device];
  if (def == nullptr) {
    s.contexts.push_back(std::make_unique<Ctx>(Ctx{device, true}));
    def = s.contexts.back().get();
  }
  t_ctx = def;
  return done("aclrtSetDevice", ACL_SUCCESS);
}

aclError aclrtResetDevice(int32_t device) {
  BEGIN("aclrtResetDevice");
  State& s = S();
  if (device < 0 || device >= s.devices || s.refs[device] == 0)
    return done("aclrtResetDevice", error("aclrtResetDevice", ACL_ERROR_RT_INVALID_DEVICEID,
                                          "device " + std::to_string(device) + " is not set"));
  if (s.refs[device] == 1) {
    const fake_acl_live left = live_on(device);
    if (any_live(left))
      return done(
          "aclrtResetDevice",
          violation("aclrtResetDevice", FAKE_ACL_RESET_WITH_LIVE, ACL_ERROR_RT_DRV_INTERNAL_ERROR,
                    "device " + std::to_string(device) + ": " + live_text(left)));
    s.default_ctx[device]->alive = false;
    s.default_ctx.erase(device);
  }
  --s.refs[device];
  return done("aclrtResetDevice", ACL_SUCCESS);
}

aclError aclrtCreateContext(aclrtContext* context, int32_t device) {
  BEGIN("aclrtCreateContext");
  State& s = S();
  if (context == nullptr || device < 0 || device >= s.devices || s.refs[device] == 0)
    return done("aclrtCreateContext", error("aclrtCreateContext", ACL_ERROR_RT_INVALID_DEVICEID,
                                            "device not set or out of range"));
  s.contexts.push_back(std::make_unique<Ctx>(Ctx{device, false}));
  t_ctx = s.contexts.back().get();
  *context = t_ctx;
  return done("aclrtCreateContext", ACL_SUCCESS);
}

aclError aclrtDestroyContext(aclrtContext context) {
  BEGIN("aclrtDestroyContext");
  auto* c = static_cast<Ctx*>(context);
  bool known = false;
  for (const auto& x : S().contexts) known = known || (x.get() == c && c->alive && !c->is_default);
  if (!known)
    return done("aclrtDestroyContext",
                violation("aclrtDestroyContext", FAKE_ACL_BAD_HANDLE, ACL_ERROR_INVALID_PARAM));
  c->alive = false;
  if (t_ctx == c) t_ctx = nullptr;
  return done("aclrtDestroyContext", ACL_SUCCESS);
}

aclError aclrtSetCurrentContext(aclrtContext context) {
  BEGIN("aclrtSetCurrentContext");
  auto* c = static_cast<Ctx*>(context);
  bool known = false;
  for (const auto& x : S().contexts) known = known || (x.get() == c && c->alive);
  if (!known)
    return done("aclrtSetCurrentContext", violation("aclrtSetCurrentContext", FAKE_ACL_BAD_HANDLE,
                                                    ACL_ERROR_RT_CONTEXT_NULL));
  t_ctx = c;
  return done("aclrtSetCurrentContext", ACL_SUCCESS);
}

aclError aclrtCreateStream(aclrtStream* stream) {
  return create_queue_object("aclrtCreateStream", S().streams, stream);
}

aclError aclrtDestroyStream(aclrtStream stream) {
  BEGIN("aclrtDestroyStream");
  NEED_QUEUE("aclrtDestroyStream", s, find_stream(stream));
  run_queue(s);
  for (Event* e : S().events)
    if (e->stream == s) e->stream = nullptr;
  S().streams.erase(s);
  delete s;
  return done("aclrtDestroyStream", ACL_SUCCESS);
}

aclError aclrtSynchronizeStream(aclrtStream stream) {
  BEGIN("aclrtSynchronizeStream");
  NEED_QUEUE("aclrtSynchronizeStream", s, find_stream(stream));
  run_queue(s);
  return done("aclrtSynchronizeStream", ACL_SUCCESS);
}

aclError aclrtCreateEvent(aclrtEvent* event) {
  return create_queue_object("aclrtCreateEvent", S().events, event);
}

aclError aclrtRecordEvent(aclrtEvent event, aclrtStream stream) {
  BEGIN("aclrtRecordEvent");
  Event* e = find_event(event);
  Stream* s = find_stream(stream);
  if (aclError r =
          check_queue_handle("aclrtRecordEvent", s ? s->device : -1, e != nullptr && s != nullptr))
    return done("aclrtRecordEvent", r);
  e->stream = s;
  return done("aclrtRecordEvent", ACL_SUCCESS);
}

aclError aclrtSynchronizeEvent(aclrtEvent event) {
  BEGIN("aclrtSynchronizeEvent");
  NEED_QUEUE("aclrtSynchronizeEvent", e, find_event(event));
  if (e->stream != nullptr) run_queue(e->stream);
  return done("aclrtSynchronizeEvent", ACL_SUCCESS);
}

aclError aclrtDestroyEvent(aclrtEvent event) {
  BEGIN("aclrtDestroyEvent");
  NEED_QUEUE("aclrtDestroyEvent", e, find_event(event));
  S().events.erase(e);
  delete e;
  return done("aclrtDestroyEvent", ACL_SUCCESS);
}

aclError aclrtMallocHost(void** ptr, size_t size) {
  BEGIN("aclrtMallocHost");
  NEED_CTX("aclrtMallocHost");
  State& s = S();
  if (ptr == nullptr || size == 0) return done("aclrtMallocHost", ACL_ERROR_INVALID_PARAM);
  if (s.memlock != 0 && s.locked + size > s.memlock)
    return done("aclrtMallocHost", error("aclrtMallocHost", ACL_ERROR_RT_MEMORY_ALLOCATION,
                                         "page-locked memory over the memlock limit"));
  const size_t rounded = (size + page() - 1) / page() * page();
  void* p = std::aligned_alloc(page(), rounded);
  if (p == nullptr) return done("aclrtMallocHost", ACL_ERROR_RT_MEMORY_ALLOCATION);
  s.host[static_cast<const char*>(p)] = Alloc{size, t_ctx->device};
  s.locked += size;
  *ptr = p;
  return done("aclrtMallocHost", ACL_SUCCESS);
}

aclError aclrtFreeHost(void* ptr) {
  BEGIN("aclrtFreeHost");
  NEED_CTX("aclrtFreeHost");
  State& s = S();
  const auto unknown = [&] {
    const bool foreign = find_in(s.reg, ptr) != nullptr || find_in(s.dev, ptr) != nullptr ||
                         find_in(s.host, ptr) != nullptr;
    return violation("aclrtFreeHost",
                     foreign ? FAKE_ACL_FREEHOST_NOT_MALLOCHOST : FAKE_ACL_FREE_UNKNOWN,
                     ACL_ERROR_RT_MEMORY_FREE);
  };
  return done("aclrtFreeHost",
              release_block("aclrtFreeHost", s.host, ptr, unknown, [&](const Alloc& a) {
                s.locked -= a.bytes;
                std::free(ptr);
              }));
}

aclError aclrtMalloc(void** ptr, size_t size, aclrtMemMallocPolicy policy) {
  BEGIN("aclrtMalloc");
  NEED_CTX("aclrtMalloc");
  State& s = S();
  if (ptr == nullptr || size == 0 || policy != ACL_MEM_MALLOC_HUGE_FIRST)
    return done("aclrtMalloc", error("aclrtMalloc", ACL_ERROR_INVALID_PARAM,
                                     "NULL pointer, 0 bytes or an unexpected policy"));
  uint64_t& used = s.used[t_ctx->device];
  if (used + size > device_bytes(t_ctx->device))
    return done("aclrtMalloc",
                error("aclrtMalloc", ACL_ERROR_RT_MEMORY_ALLOCATION, "device memory exhausted"));
  void* p = map_device(size);
  if (p == nullptr) return done("aclrtMalloc", ACL_ERROR_RT_MEMORY_ALLOCATION);
  s.dev[static_cast<const char*>(p)] = Alloc{size, t_ctx->device};
  used += size;
  *ptr = p;
  return done("aclrtMalloc", ACL_SUCCESS);
}

aclError aclrtFree(void* ptr) {
  BEGIN("aclrtFree");
  NEED_CTX("aclrtFree");
  State& s = S();
  const auto unknown = [] {
    return violation("aclrtFree", FAKE_ACL_FREE_UNKNOWN, ACL_ERROR_RT_MEMORY_FREE,
                     "not the start of an aclrtMalloc block");
  };
  return done("aclrtFree", release_block("aclrtFree", s.dev, ptr, unknown, [&](const Alloc& a) {
                s.used[a.device] -= a.bytes;
                unmap_device(ptr, a.bytes);
              }));
}

aclError aclrtMemcpy(void* dst, size_t destMax, const void* src, size_t count,
                     aclrtMemcpyKind kind) {
  BEGIN("aclrtMemcpy");
  NEED_CTX("aclrtMemcpy");
  if (aclError e = check_copy("aclrtMemcpy", dst, destMax, src, count, kind, false))
    return done("aclrtMemcpy", e);
  std::memmove(dst, src, count);
  return done("aclrtMemcpy", ACL_SUCCESS);
}

aclError aclrtMemcpyAsync(void* dst, size_t destMax, const void* src, size_t count,
                          aclrtMemcpyKind kind, aclrtStream stream) {
  BEGIN("aclrtMemcpyAsync");
  NEED_QUEUE("aclrtMemcpyAsync", s, find_stream(stream));
  if (aclError e = check_copy("aclrtMemcpyAsync", dst, destMax, src, count, kind, true))
    return done("aclrtMemcpyAsync", e);
  s->queue.push_back(Op{dst, src, count});
  return done("aclrtMemcpyAsync", ACL_SUCCESS);
}

// Not in acl_api.h's list of required symbols (acl_runtime.cpp looks it up on its own).
aclError aclrtMemsetAsync(void* devPtr, size_t maxCount, int32_t value, size_t count,
                          aclrtStream stream) {
  BEGIN("aclrtMemsetAsync");
  NEED_QUEUE("aclrtMemsetAsync", s, find_stream(stream));
  if (devPtr == nullptr)
    return done("aclrtMemsetAsync", error("aclrtMemsetAsync", ACL_ERROR_INVALID_PARAM, "NULL"));
  if (count > maxCount)
    return done("aclrtMemsetAsync",
                violation("aclrtMemsetAsync", FAKE_ACL_COPY_OVERFLOW, ACL_ERROR_INVALID_PARAM));
  if (aclError e = check_device_side("aclrtMemsetAsync", devPtr, count, maxCount, true))
    return done("aclrtMemsetAsync", e);
  s->queue.push_back(Op{devPtr, nullptr, count, static_cast<int>(value & 0xff)});
  return done("aclrtMemsetAsync", ACL_SUCCESS);
}

aclError aclrtGetMemInfo(aclrtMemAttr attr, size_t* free, size_t* total) {
  BEGIN("aclrtGetMemInfo");
  NEED_CTX("aclrtGetMemInfo");
  if (free == nullptr || total == nullptr || attr != ACL_HBM_MEM)
    return done("aclrtGetMemInfo", ACL_ERROR_INVALID_PARAM);
  *total = device_bytes(t_ctx->device);
  *free = *total - S().used[t_ctx->device];
  return done("aclrtGetMemInfo", ACL_SUCCESS);
}

aclError aclrtHostRegister(void* ptr, uint64_t size, int type, void** devPtr) {
  BEGIN("aclrtHostRegister");
  NEED_CTX("aclrtHostRegister");
  State& s = S();
  constexpr const char* fn = "aclrtHostRegister";
  if (!s.register_ok)
    return done(fn, error(fn, ACL_ERROR_RT_FEATURE_NOT_SUPPORT, "host registration unsupported"));
  if (ptr == nullptr || size == 0 || devPtr == nullptr || type != 0)
    return done(fn, ACL_ERROR_INVALID_PARAM);
  if (reinterpret_cast<uintptr_t>(ptr) % page() != 0)
    return done(fn, violation(fn, FAKE_ACL_REGISTER_UNALIGNED, ACL_ERROR_RT_DRV_INTERNAL_ERROR));
  const auto* c = static_cast<const char*>(ptr);
  for (const auto* m : {&s.reg, &s.host})
    for (const auto& [p, a] : *m)
      if (c < p + a.bytes && p < c + size)
        return done(fn, violation(fn, FAKE_ACL_REGISTER_OVERLAP, ACL_ERROR_RT_PARAM_INVALID));
  if (s.memlock != 0 && s.locked + size > s.memlock)
    return done(fn, error(fn, ACL_ERROR_RT_MEMORY_ALLOCATION, "over the memlock limit"));
  s.reg[c] = Alloc{static_cast<size_t>(size), t_ctx->device};
  s.locked += size;
  *devPtr = ptr;
  return done(fn, ACL_SUCCESS);
}

aclError aclrtHostUnregister(void* ptr) {
  BEGIN("aclrtHostUnregister");
  NEED_CTX("aclrtHostUnregister");
  State& s = S();
  const auto unknown = [] {
    return violation("aclrtHostUnregister", FAKE_ACL_UNREGISTER_UNKNOWN,
                     ACL_ERROR_RT_PARAM_INVALID);
  };
  return done("aclrtHostUnregister", release_block("aclrtHostUnregister", s.reg, ptr, unknown,
                                                   [&](const Alloc& a) { s.locked -= a.bytes; }));
}

// ---- control (fake_acl.h) ----

void pinstage_fake_acl_configure(int devices, uint64_t device_bytes, uint64_t memlock_bytes,
                                 int register_supported) {
  std::lock_guard lock(S().mu);
  S().devices = devices;
  S().device_bytes = device_bytes;
  S().memlock = memlock_bytes;
  S().register_ok = register_supported != 0;
  S().models.clear();
}

void pinstage_fake_acl_set_device(int device, uint64_t device_bytes, int set_device_error) {
  std::lock_guard lock(S().mu);
  S().models[device] = {device_bytes, set_device_error};
}

void pinstage_fake_acl_reset() {
  std::lock_guard lock(S().mu);
  State& s = S();
  s.violations.clear();
  s.violation_kinds.clear();
  s.trace.clear();
  s.inject.clear();
  s.calls.clear();
}

uint64_t pinstage_fake_acl_violations(int kind) {
  std::lock_guard lock(S().mu);
  uint64_t n = 0;
  for (int k : S().violation_kinds) n += kind < 0 || k == kind;
  return n;
}

const char* pinstage_fake_acl_violation_text(uint64_t index) {
  std::lock_guard lock(S().mu);
  return index < S().violations.size() ? S().violations[index].c_str() : nullptr;
}

int pinstage_fake_acl_fail_nth(const char* function, uint64_t nth, int code) {
  std::lock_guard lock(S().mu);
  if (function == nullptr) return -1;
  if (nth == 0)
    S().inject.erase(function);
  else
    S().inject[function] = {nth, code};
  return 0;
}

uint64_t pinstage_fake_acl_calls(const char* function) {
  std::lock_guard lock(S().mu);
  auto it = S().calls.find(function != nullptr ? function : "");
  return it == S().calls.end() ? 0 : it->second;
}

void pinstage_fake_acl_trace_on(int on) {
  std::lock_guard lock(S().mu);
  S().trace_on = on != 0;
}

uint64_t pinstage_fake_acl_trace_size() {
  std::lock_guard lock(S().mu);
  return S().trace.size();
}

const char* pinstage_fake_acl_trace_at(uint64_t index) {
  std::lock_guard lock(S().mu);
  return index < S().trace.size() ? S().trace[index].c_str() : nullptr;
}

void pinstage_fake_acl_live(int device, fake_acl_live* out) {
  std::lock_guard lock(S().mu);
  if (out != nullptr) *out = live_on(device);
}

int pinstage_fake_acl_pinned(const void* ptr, uint64_t bytes) {
  std::lock_guard lock(S().mu);
  const auto* c = static_cast<const char*>(ptr);
  const auto inside = [&](const std::map<const char*, Alloc>& m) {
    const auto* e = find_in(m, ptr);
    return e != nullptr && bytes <= static_cast<uint64_t>(e->first + e->second.bytes - c);
  };
  if (inside(S().host)) return FAKE_ACL_PINNED_MALLOC_HOST;
  return inside(S().reg) ? FAKE_ACL_PINNED_REGISTERED : FAKE_ACL_PINNED_NONE;
}

}  // extern "C"
