// sim with a latch per stream (issue 41): held_streams.hold(ctx, index, hold) holds the
// index-th stream the context created (in creation order). While a stream is held, an
// event recorded on it is not reached (event_query answers PS_ERR_NOT_READY), whatever
// sim's own stream did; releasing the hold lets sim answer again. sim's hold_streams
// holds every stream of a context at once, so it cannot tell "one stream's copies ran"
// from "all of them did": this can. Used by test_gaps41's two-stream pool test.

#include <map>
#include <mutex>
#include <string_view>
#include <vector>

#include "pinstage/backend/platform_abi.h"
#include "sim_table.h"

namespace {

struct Held {
  std::mutex mu;
  std::map<ps_device_ctx*, std::vector<ps_stream*>> streams;  // creation order
  std::map<ps_stream*, bool> held;
  std::map<ps_event*, ps_stream*> recorded_on;
};
Held g;
ps_platform_api sim_api{};

int stream_create(ps_device_ctx* ctx, ps_stream** out) {
  const int status = sim_api.stream_create(ctx, out);
  if (status == PS_OK) {
    std::lock_guard lock(g.mu);
    g.streams[ctx].push_back(*out);
  }
  return status;
}

int stream_destroy(ps_device_ctx* ctx, ps_stream* stream) {
  {
    std::lock_guard lock(g.mu);
    g.held.erase(stream);
    for (auto& [c, list] : g.streams)
      for (ps_stream*& s : list)
        if (s == stream) s = nullptr;
  }
  return sim_api.stream_destroy(ctx, stream);
}

int event_record(ps_device_ctx* ctx, ps_event* event, ps_stream* stream) {
  {
    std::lock_guard lock(g.mu);
    g.recorded_on[event] = stream;
  }
  return sim_api.event_record(ctx, event, stream);
}

int event_destroy(ps_device_ctx* ctx, ps_event* event) {
  {
    std::lock_guard lock(g.mu);
    g.recorded_on.erase(event);
  }
  return sim_api.event_destroy(ctx, event);
}

int event_query(ps_device_ctx* ctx, ps_event* event) {
  {
    std::lock_guard lock(g.mu);
    const auto it = g.recorded_on.find(event);
    if (it != g.recorded_on.end() && g.held[it->second]) return PS_ERR_NOT_READY;
  }
  return sim_api.event_query(ctx, event);
}

// The test seam: PS_ERR_INVALID_ARGUMENT for a stream index the context never made.
int hold(ps_device_ctx* ctx, int index, int held) {
  std::lock_guard lock(g.mu);
  const std::vector<ps_stream*>& list = g.streams[ctx];
  if (index < 0 || static_cast<size_t>(index) >= list.size() || list[index] == nullptr)
    return PS_ERR_INVALID_ARGUMENT;
  g.held[list[index]] = held != 0;
  return PS_OK;
}

void* get_proc_address(const char* name) {
  if (std::string_view(name) == "held_streams.hold") return reinterpret_cast<void*>(&hold);
  return sim_api.get_proc_address != nullptr ? sim_api.get_proc_address(name) : nullptr;
}

ps_platform_api table = [] {
  sim_api = sim_table();
  ps_platform_api api = sim_api;
  if (api.name == nullptr) return api;  // every slot NULL: the loader refuses it
  api.name = "held_streams";
  api.get_proc_address = get_proc_address;
  api.stream_create = stream_create;
  api.stream_destroy = stream_destroy;
  api.event_record = event_record;
  api.event_destroy = event_destroy;
  api.event_query = event_query;
  return api;
}();

}  // namespace

extern "C" PINSTAGE_PLUGIN_EXPORT const ps_platform_api* pinstage_platform_entry(void) {
  return &table;
}
