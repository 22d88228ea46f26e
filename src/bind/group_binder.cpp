// GroupBinder: one Binder per member of a WorkerGroup, run on every device at once
// (docs/node.md, "Group bind"). run_each starts the members together, so their uploads
// overlap: what the aggregate rate measures.
#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "pinstage/bind.h"
#include "pinstage/clock.h"

namespace pinstage {

GroupBinder::GroupBinder(WorkerGroup& group, BindOptions options)
    : group_(&group), options_(std::move(options)) {
  validate(options_);
  if (group.size() == 0)
    throw Error(ErrorCode::invalid_argument, "GroupBinder: the group has no device");
  for (size_t i = 0; i < group.size(); ++i) {
    try {
      binders_.push_back(std::make_unique<Binder>(group.worker(i), options_));
    } catch (const Error& e) {
      throw GroupError(e.code(), i, group.device_ids()[i], e.what());
    }
  }
}

GroupBinder::~GroupBinder() = default;

GroupBindReport GroupBinder::run(const std::vector<TaskArgs>& args) {
  if (args.size() != binders_.size())
    throw Error(ErrorCode::invalid_argument,
                "GroupBinder::run: " + std::to_string(args.size()) + " TaskArgs for " +
                    std::to_string(binders_.size()) + " devices (one per device)");
  GroupBindReport out;
  out.devices = group_->device_ids();
  out.reports.resize(binders_.size());
  const Stopwatch total;
  group_->run_each([&](size_t i, Worker&) { out.reports[i] = binders_[i]->run(args[i]); });
  out.total_seconds = total.seconds();
  for (const BindReport& r : out.reports) {
    out.uploaded_bytes += r.uploaded_bytes;
    out.downloaded_bytes += r.downloaded_bytes;
    out.longest_upload_s = std::max(out.longest_upload_s, r.phase(BindPhase::upload));
    out.longest_download_s = std::max(out.longest_download_s, r.phase(BindPhase::download));
  }
  return out;
}

}  // namespace pinstage
