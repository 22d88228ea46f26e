// BindReport formatting and the bind enums' names.
#include <cstdio>
#include <iterator>
#include <string>

#include "pinstage/bind.h"
#include "pinstage/names.h"

namespace pinstage {

namespace {

double gbps(uint64_t bytes, double seconds) {
  return seconds > 0.0 ? static_cast<double>(bytes) / seconds / 1e9 : 0.0;
}

std::string fixed(double value, int decimals) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, value);
  return buf;
}

std::string pad(std::string s, size_t width, bool left = true) {
  if (s.size() >= width) return s;
  return left ? s + std::string(width - s.size(), ' ') : std::string(width - s.size(), ' ') + s;
}

}  // namespace

namespace {
// In enum order.
constexpr const char* kLayoutNames[] = {"arena", "per_tensor"};
constexpr const char* kUploadNames[] = {"direct", "staged"};
constexpr const char* kPhaseNames[] = {"device_alloc", "upload",   "verify",
                                       "execute",      "download", "release"};
static_assert(std::size(kPhaseNames) == kBindPhaseCount);
}  // namespace

const char* device_layout_name(DeviceLayout layout) {
  return enum_name(layout, kLayoutNames, "unknown");
}

const char* upload_path_name(UploadPath path) { return enum_name(path, kUploadNames, "unknown"); }

DeviceLayout parse_device_layout(std::string_view name) {
  if (name == "per-tensor") return DeviceLayout::per_tensor;
  if (auto layout = enum_from_name<DeviceLayout>(name, kLayoutNames)) return *layout;
  throw Error(ErrorCode::invalid_argument,
              "unknown device layout '" + std::string(name) + "'; use arena or per_tensor");
}

UploadPath parse_upload_path(std::string_view name) {
  if (auto path = enum_from_name<UploadPath>(name, kUploadNames)) return *path;
  throw Error(ErrorCode::invalid_argument,
              "unknown upload path '" + std::string(name) + "'; use direct or staged");
}

const char* bind_phase_name(BindPhase phase) { return enum_name(phase, kPhaseNames, "unknown"); }

double TensorBindReport::upload_gbps() const noexcept { return gbps(bytes, upload_seconds); }
double TensorBindReport::download_gbps() const noexcept { return gbps(bytes, download_seconds); }

double BindReport::upload_gbps() const noexcept {
  return gbps(uploaded_bytes, phase(BindPhase::upload));
}
double BindReport::download_gbps() const noexcept {
  return gbps(downloaded_bytes, phase(BindPhase::download));
}

double BindReport::staging_seconds() const noexcept {
  double sum = 0.0;
  for (size_t p = 0; p < kBindPhaseCount; ++p)
    if (static_cast<BindPhase>(p) != BindPhase::execute) sum += phase_seconds[p];
  return sum;
}

ReportFields phase_fields(const std::array<double, kBindPhaseCount>& phase_seconds) {
  ReportFields fields;
  for (size_t p = 0; p < kBindPhaseCount; ++p)
    fields.push_back({bind_phase_name(static_cast<BindPhase>(p)), phase_seconds[p]});
  return fields;
}

ReportFields report_fields(const BindReport& r) {
  ReportFields fields;
#define PINSTAGE_BIND_COMPUTED_(name, doc) fields.push_back({#name, r.name()});
  PINSTAGE_BIND_REPORT_FIELDS(PINSTAGE_REPORT_FIELD, PINSTAGE_BIND_COMPUTED_)
#undef PINSTAGE_BIND_COMPUTED_
  return fields;
}

std::string BindReport::summary() const {
  std::string text = std::to_string(uploaded_count) + " of " + std::to_string(tensors.size()) +
                     " tensors uploaded (inputs), " + format_thousands(uploaded_bytes) + " bytes";
  if (step > 0) text += " (" + std::to_string(stayed_count) + " stayed on the device)";
  return text;
}

std::string BindReport::to_string() const {
  std::string out = summary();
  if (ring_count > 0)
    out += " (" + std::to_string(ring_count) + " through the staging ring, " +
           format_thousands(ring_bytes) + " bytes)";
  out += "; device memory " + format_thousands(device_bytes) + " bytes in " +
         std::to_string(device_allocations) + " allocation" + (device_allocations == 1 ? "" : "s") +
         " (" + device_layout_name(layout) + ")\n";
  out += "phases:";
  for (size_t p = 0; p < kBindPhaseCount; ++p)
    out += std::string(" ") + bind_phase_name(static_cast<BindPhase>(p)) + " " +
           fixed(phase_seconds[p] * 1e3, 3) + " ms";
  out += "; total " + fixed(total_seconds * 1e3, 3) + " ms\n";
  out += "upload " + fixed(upload_gbps(), 2) + " GB/s, download " + fixed(download_gbps(), 2) +
         " GB/s" + (executed ? "" : ", execute skipped") + "\n";
  if (step > 0)
    out += "resident step " + std::to_string(step) + ": " + std::to_string(stayed_count) +
           " inputs (" + format_thousands(stayed_bytes) + " bytes) stayed on the device\n";
  out += pad("tensor", 18) + pad("dir", 6) + pad("host", 9) + pad("path", 7) +
         pad("bytes", 18, false) + pad("up ms", 11, false) + pad("up GB/s", 9, false) +
         pad("down ms", 11, false) + pad("down GB/s", 10, false) + "\n";
  for (const auto& t : tensors) {
    out += pad(t.name, 18) + pad(direction_name(t.direction), 6) +
           pad(t.pinned ? "pinned" : "pageable", 9) +
           pad(t.uploaded() ? upload_path_name(t.path)
               : t.stayed   ? "stayed"
                            : "-",
               7) +
           pad(format_thousands(t.bytes), 18, false) +
           pad(t.uploaded() ? fixed(t.upload_seconds * 1e3, 3) : "-", 11, false) +
           pad(t.uploaded() ? fixed(t.upload_gbps(), 2) : "-", 9, false) +
           pad(t.downloaded() ? fixed(t.download_seconds * 1e3, 3) : "-", 11, false) +
           pad(t.downloaded() ? fixed(t.download_gbps(), 2) : "-", 10, false) + "\n";
  }
  return out;
}

}  // namespace pinstage

namespace pinstage {

double GroupBindReport::upload_gbps() const noexcept {
  return gbps(uploaded_bytes, longest_upload_s);
}
double GroupBindReport::download_gbps() const noexcept {
  return gbps(downloaded_bytes, longest_download_s);
}

std::string GroupBindReport::to_string() const {
  std::string out = std::to_string(reports.size()) + " device" + (reports.size() == 1 ? "" : "s") +
                    ", " + format_thousands(uploaded_bytes) + " bytes uploaded in all; upload " +
                    fixed(upload_gbps(), 2) + " GB/s aggregate (longest upload " +
                    fixed(longest_upload_s * 1e3, 3) + " ms), download " +
                    fixed(download_gbps(), 2) + " GB/s; total " + fixed(total_seconds * 1e3, 3) +
                    " ms\n";
  for (size_t i = 0; i < reports.size(); ++i)
    out += "  device " + std::to_string(devices[i]) + ": " + reports[i].summary() + ", upload " +
           fixed(reports[i].upload_gbps(), 2) + " GB/s, download " +
           fixed(reports[i].download_gbps(), 2) + " GB/s\n";
  return out;
}

}  // namespace pinstage
