// load_tp_to_devices: a tensor-parallel load onto every device of a WorkerGroup
// (docs/node.md, "Tensor-parallel loading"). One read of the checkpoint for the node, into
// each member's own pinned memory, then all members upload their slices at once.
#include <memory>
#include <string>
#include <vector>

#include "pinstage/clock.h"
#include "pinstage/error.h"
#include "pinstage/load_plan.h"

namespace pinstage {

TpDeviceLoad load_tp_to_devices(const Checkpoint& checkpoint, const TpPlan& plan,
                                WorkerGroup& group, const CheckpointLoadOptions& options) {
  const Stopwatch total;
  const auto tp = static_cast<int>(group.size());
  if (tp < 1)
    throw Error(ErrorCode::invalid_argument, "load_tp_to_devices: the group has no device");
  std::vector<std::unique_ptr<PinnedAllocator>> owned;
  std::vector<HostAllocator*> allocators;
  for (size_t r = 0; r < group.size(); ++r) {
    owned.push_back(std::make_unique<PinnedAllocator>(group.worker(r)));
    allocators.push_back(owned.back().get());
  }
  TpHostLoad host = load_tp_to_host(checkpoint, plan, tp, allocators, options);

  TpDeviceLoad out;
  out.tp = tp;
  out.devices = group.device_ids();
  out.ranks.resize(group.size());
  out.uploads.resize(group.size());
  const Stopwatch upload;
  group.run_each([&](size_t r, Worker& worker) {
    const Stopwatch clock;
    TpDeviceReport& rep = out.uploads[r];
    rep.device = out.devices[r];
    std::vector<DeviceTensor>& mine = out.ranks[r];
    mine.reserve(host.ranks[r].size());
    for (const TpTensor& t : host.ranks[r]) {
      DeviceTensor d;
      d.info = t.info;
      d.info.shape = t.shape;
      d.info.bytes = t.bytes;
      if (t.dim >= 0) d.info.xxh3.reset();  // the recorded hash is the whole tensor's
      if (t.bytes > 0) {
        d.buffer = worker.alloc_device(static_cast<size_t>(t.bytes));
        worker.copy_to_device(d.buffer, 0, t.storage->data(), static_cast<size_t>(t.bytes));
      }
      rep.bytes += t.bytes;
      ++rep.tensors;
      mine.push_back(std::move(d));
    }
    rep.upload_s = clock.seconds();
  });
  out.upload_s = upload.seconds();
  for (const TpDeviceReport& rep : out.uploads) out.uploaded_bytes += rep.bytes;
  out.host = std::move(host.report);
  out.total_s = total.seconds();
  return out;  // host's storages go back to each member's pool here
}

}  // namespace pinstage
