// Reading a backend extension's stats struct (sim.stats, acl.pin_stats) in tests: the one
// place that looks the extension up, calls it on the worker's context and checks both.
#pragma once

#include <gtest/gtest.h>

#include "pinstage/backend/sim_ext.h"
#include "pinstage/worker.h"

namespace pinstage::test {

// The extension `name` of `w`'s backend, a function `int(ps_device_ctx*, Stats*)`, called
// now; a missing extension or a failed call is a test failure (and zeros).
template <class Stats>
Stats extension_stats(const Worker& w, const char* name) {
  using Fn = int (*)(ps_device_ctx*, Stats*);
  auto fn = reinterpret_cast<Fn>(w.backend_extension(name));
  Stats s{};
  EXPECT_NE(fn, nullptr) << name;
  if (fn != nullptr) {
    EXPECT_EQ(fn(w.native_context(), &s), PS_OK) << name;
  }
  return s;
}

// sim's copies by path and its device pool, now.
inline ps_sim_stats sim_stats(const Worker& w) {
  return extension_stats<ps_sim_stats>(w, PS_SIM_STATS_NAME);
}

}  // namespace pinstage::test
