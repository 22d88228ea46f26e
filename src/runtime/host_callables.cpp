// Note [Host callables]
// ~~~~~~~~~~~~~~~~~~~~~
// A backend whose device memory is host memory (sim) can run a task's execute step on
// the device pointers in place. The step itself belongs to a scene, and a plugin links
// base only, so the runtime keeps the process-wide table of callables: a scene registers
// its step here, Worker::execute range-checks the arguments against the allocation table
// and hands the call to the backend's host_execute slot (where the fault hook applies).
#include <map>
#include <mutex>

#include "pinstage/worker.h"
#include "runtime/worker_state.h"

namespace pinstage {
namespace {

struct Registry {
  std::mutex mu;
  std::map<std::string, HostCallable> callables;
};

// sim.fill_index: byte j of argument k becomes (j + 7k) & 0xff. A pattern that proves an
// execute step really ran on the uploaded bytes; the bind tests use it.
void fill_index(std::span<const ExecArg> args) {
  for (size_t k = 0; k < args.size(); ++k) {
    auto* bytes = static_cast<unsigned char*>(args[k].device_ptr);
    for (uint64_t j = 0; j < args[k].bytes; ++j)
      bytes[j] = static_cast<unsigned char>((j + 7 * k) & 0xff);
  }
}

Registry& registry() {
  static Registry* r = [] {
    auto* made = new Registry;  // never destroyed: scenes may register from static init
    made->callables.emplace("sim.fill_index", fill_index);
    return made;
  }();
  return *r;
}

}  // namespace

void register_host_callable(const std::string& name, HostCallable fn) {
  if (name.empty() || !fn)
    throw Error(ErrorCode::invalid_argument, "a host callable needs a name and a function");
  Registry& r = registry();
  std::lock_guard lock(r.mu);
  if (!r.callables.emplace(name, std::move(fn)).second)
    throw Error(ErrorCode::invalid_argument, "host callable '" + name + "' is already registered");
}

std::vector<std::string> host_callable_names() {
  Registry& r = registry();
  std::lock_guard lock(r.mu);
  std::vector<std::string> names;
  for (const auto& [name, fn] : r.callables) names.push_back(name);
  return names;
}

namespace runtime {

const HostCallable& find_host_callable(const std::string& name) {
  Registry& r = registry();
  std::lock_guard lock(r.mu);
  auto it = r.callables.find(name);
  if (it != r.callables.end()) return it->second;  // entries are never erased
  std::string known;
  for (const auto& [n, fn] : r.callables) known += (known.empty() ? "" : ", ") + n;
  throw Error(ErrorCode::not_found,
              "no host callable named '" + name + "' (registered: " + known + ")");
}

}  // namespace runtime
}  // namespace pinstage
