// The first-touch split of a device load's alloc_s (LoadReport::device_first_touch_*): sim's
// device memory is host RAM that its pool backs (faults in) the first time it hands a
// block out, inside device_malloc, so a first load's alloc_s holds a cost no device has.
// The pool's backed bytes and seconds (sim.stats) before and after the load tell it apart.
#include <functional>

#include "checkpoint/load_internal.h"
#include "pinstage/backend/sim_ext.h"
#include "pinstage/checkpoint.h"

namespace pinstage::detail {

namespace {

// sim's device pool figures, or false on another backend.
bool sim_pool(const Worker& w, uint64_t* backed, double* seconds) {
  if (!w.initialized()) return false;
  const auto stats = reinterpret_cast<ps_sim_stats_fn>(w.backend_extension(PS_SIM_STATS_NAME));
  ps_sim_stats s{};
  if (stats == nullptr || stats(w.native_context(), &s) != PS_OK) return false;
  *backed = s.pool_backed_bytes;
  *seconds = s.pool_backing_seconds;
  return true;
}

}  // namespace

DeviceLoad with_first_touch(Worker& worker, const std::function<DeviceLoad()>& load) {
  uint64_t backed_before = 0, backed_after = 0;
  double seconds_before = 0, seconds_after = 0;
  const bool sim = sim_pool(worker, &backed_before, &seconds_before);
  DeviceLoad out = load();
  if (!sim || !sim_pool(worker, &backed_after, &seconds_after)) return out;
  LoadReport& r = out.report;
  r.device_first_touch_bytes = backed_after - backed_before;
  r.device_first_touch_s = seconds_after - seconds_before;
  r.device_first_touch_reason =
      "sim's device memory is host RAM, faulted in the first time the pool hands a block out: "
      "these seconds are part of alloc_s, a cost of sim (a device's memory is not faulted), "
      "paid once per worker; a second load into the same worker reuses the backed pages";
  return out;
}

}  // namespace pinstage::detail
