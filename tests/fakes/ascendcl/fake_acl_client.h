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

struct FakeAcl {
  std::unique_ptr<acl::Runtime> rt;  // the ACL symbols
  fake_acl_configure_fn configure = nullptr;
  fake_acl_set_device_fn set_device = nullptr;
  fake_acl_reset_fn reset = nullptr;
  fake_acl_violations_fn violations = nullptr;
  fake_acl_violation_text_fn violation_text = nullptr;
  fake_acl_fail_nth_fn fail_nth = nullptr;
  fake_acl_calls_fn calls = nullptr;
  fake_acl_trace_on_fn trace_on = nullptr;
  fake_acl_trace_size_fn trace_size = nullptr;
  fake_acl_trace_at_fn trace_at = nullptr;
  fake_acl_live_fn live_fn = nullptr;
  fake_acl_pinned_fn pinned = nullptr;

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
    f->configure = reinterpret_cast<fake_acl_configure_fn>(sym("pinstage_fake_acl_configure"));
    f->set_device = reinterpret_cast<fake_acl_set_device_fn>(sym("pinstage_fake_acl_set_device"));
    f->reset = reinterpret_cast<fake_acl_reset_fn>(sym("pinstage_fake_acl_reset"));
    f->violations = reinterpret_cast<fake_acl_violations_fn>(sym("pinstage_fake_acl_violations"));
    f->violation_text =
        reinterpret_cast<fake_acl_violation_text_fn>(sym("pinstage_fake_acl_violation_text"));
    f->fail_nth = reinterpret_cast<fake_acl_fail_nth_fn>(sym("pinstage_fake_acl_fail_nth"));
    f->calls = reinterpret_cast<fake_acl_calls_fn>(sym("pinstage_fake_acl_calls"));
    f->trace_on = reinterpret_cast<fake_acl_trace_on_fn>(sym("pinstage_fake_acl_trace_on"));
    f->trace_size = reinterpret_cast<fake_acl_trace_size_fn>(sym("pinstage_fake_acl_trace_size"));
    f->trace_at = reinterpret_cast<fake_acl_trace_at_fn>(sym("pinstage_fake_acl_trace_at"));
    f->live_fn = reinterpret_cast<fake_acl_live_fn>(sym("pinstage_fake_acl_live"));
    f->pinned = reinterpret_cast<fake_acl_pinned_fn>(sym("pinstage_fake_acl_pinned"));
    return f;
  }();
  return *fake;
}

}  // namespace pinstage::test
