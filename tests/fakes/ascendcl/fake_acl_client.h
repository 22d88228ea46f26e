// Tests' handle on the libascendcl double: its ACL functions (through the backend's own
// loader, so the same prototypes) and its control functions (fake_acl.h). It opens the
// library PINSTAGE_ACL_LIBRARY names, which is the object the acl plugin loads too (dlopen
// of one path gives one object), so what the plugin did is visible here.
#pragma once

#include <dlfcn.h>

#include <cstdlib>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "backends/acl/acl_runtime.h"
#include "fake_acl.h"

namespace pinstage::test {

// X(member, stem): the control functions of fake_acl.h, each the member of FakeAcl that
// holds its fake_acl_<stem>_fn, looked up as pinstage_fake_acl_<stem>.
#define FAKE_ACL_CONTROL_LIST(X)    \
  X(configure, configure)           \
  X(set_device, set_device)         \
  X(reset, reset)                   \
  X(violations, violations)         \
  X(violation_text, violation_text) \
  X(fail_nth, fail_nth)             \
  X(calls, calls)                   \
  X(trace_on, trace_on)             \
  X(trace_size, trace_size)         \
  X(trace_at, trace_at)             \
  X(live_fn, live)                  \
  X(pinned, pinned)

struct FakeAcl {
  std::unique_ptr<acl::Runtime> rt;  // the ACL symbols
#define FAKE_ACL_MEMBER_(member, stem) fake_acl_##stem##_fn member = nullptr;
  FAKE_ACL_CONTROL_LIST(FAKE_ACL_MEMBER_)
#undef FAKE_ACL_MEMBER_

  // All violations' texts, one per line (for failure messages).
  std::string all_violations() const {
    std::string out;
    for (uint64_t i = 0; const char* t = violation_text(i); ++i) out += std::string(t) + "\n";
    return out;
  }
  fake_acl_live live(int device = -1) const {
    fake_acl_live out{};
    live_fn(device, &out);
    return out;
  }
  // The traced calls' names, without results, that are in `only` (all when empty).
  std::vector<std::string> trace(const std::vector<std::string>& only = {}) const {
    std::vector<std::string> out;
    for (uint64_t i = 0; i < trace_size(); ++i) {
      std::string t = trace_at(i);
      const std::string name = t.substr(0, t.find('='));
      bool keep = only.empty();
      for (const auto& o : only) keep = keep || o == name;
      if (keep) out.push_back(t);
    }
    return out;
  }
};

// The double, opened once per process.
inline FakeAcl& fake_acl() {
  static FakeAcl* fake = [] {
    const char* path = std::getenv("PINSTAGE_ACL_LIBRARY");
    if (path == nullptr) throw std::runtime_error("PINSTAGE_ACL_LIBRARY is not set");
    auto* f = new FakeAcl();
    f->rt = acl::load_runtime(acl::SearchInputs{std::string(path), {}, {}});
    void* h = dlopen(path, RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
    if (h == nullptr) throw std::runtime_error(std::string("cannot reopen ") + path);
    auto sym = [h](const char* name) {
      void* p = dlsym(h, name);
      if (p == nullptr) throw std::runtime_error(std::string("the double has no ") + name);
      return p;
    };
#define FAKE_ACL_LOAD_(member, stem) \
  f->member = reinterpret_cast<fake_acl_##stem##_fn>(sym("pinstage_fake_acl_" #stem));
    FAKE_ACL_CONTROL_LIST(FAKE_ACL_LOAD_)
#undef FAKE_ACL_LOAD_
    return f;
  }();
  return *fake;
}

}  // namespace pinstage::test
