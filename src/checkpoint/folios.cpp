// The folio census of map mode (folios.h): /proc/self/pagemap gives a sampled page's frame
// number, /proc/kpageflags the compound-head and -tail bits of the frames around it; where
// those cannot be read (no CAP_SYS_ADMIN: the frame numbers read as 0), /proc/meminfo's
// FileHugePages before and after the load, a system-wide figure.
#include "checkpoint/folios.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <utility>
#include <vector>

#include "pinstage/files.h"

namespace pinstage::detail {

namespace {

constexpr uint64_t kPage = 4096;
constexpr uint64_t kPresent = uint64_t{1} << 63;
constexpr uint64_t kPfnMask = (uint64_t{1} << 55) - 1;

std::string size_text(uint64_t bytes) {
  if (bytes >= (uint64_t{1} << 20)) return std::to_string(bytes >> 20) + " MiB";
  return std::to_string(bytes >> 10) + " KiB";
}

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

std::string gb(int64_t bytes) {
  std::ostringstream out;
  out.precision(2);
  out << std::fixed << static_cast<double>(bytes) / 1e9 << " GB";
  return out.str();
}

// splitmix64's finalizer: a fixed pseudo-random number per sample.
uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9;
  x = (x ^ (x >> 27)) * 0x94d049bb133111eb;
  return x ^ (x >> 31);
}

}  // namespace

uint64_t folio_pages(uint64_t pfn, const std::function<uint64_t(uint64_t)>& flags_of) {
  uint64_t flags = flags_of(pfn);
  if ((flags & (kKpfCompoundHead | kKpfCompoundTail)) == 0) return 1;
  // The middle frame of pfn's aligned 2 MiB block is a tail only inside a folio of 2 MiB or
  // more (a smaller folio is aligned to its size, so it starts at that frame or ends
  // before it): a huge page's sample takes two reads, not the walk's eighteen.
  constexpr uint64_t kBlock = uint64_t{1} << kMaxFolioOrder;
  if ((flags_of((pfn & ~(kBlock - 1)) + kBlock / 2) & kKpfCompoundTail) != 0) return kBlock;
  uint64_t head = pfn;
  for (unsigned o = 1; (flags & kKpfCompoundHead) == 0; ++o) {
    if (o > kMaxFolioOrder) return uint64_t{1} << kMaxFolioOrder;  // its head lies further
    head = pfn & ~((uint64_t{1} << o) - 1);
    flags = flags_of(head);
  }
  unsigned o = 1;
  while (o < kMaxFolioOrder && (flags_of(head + (uint64_t{1} << o)) & kKpfCompoundTail) != 0) ++o;
  return uint64_t{1} << o;
}

std::string folio_text(const std::map<uint64_t, uint64_t>& bytes_by_size) {
  uint64_t all = 0;
  for (const auto& [size, bytes] : bytes_by_size) all += bytes;
  std::string out;
  for (auto it = bytes_by_size.rbegin(); it != bytes_by_size.rend(); ++it) {
    const double share = all > 0 ? 100.0 * static_cast<double>(it->second) / all : 0;
    char pct[16];
    std::snprintf(pct, sizeof pct, share >= 1 || share == 0 ? "%.0f%%" : "%.1f%%", share);
    out += (out.empty() ? "" : ", ") + size_text(it->first) + " " + pct;
  }
  return out;
}

int64_t file_huge_pages_bytes(const std::string& meminfo) {
  std::istringstream in(meminfo);
  std::string key, unit;
  int64_t value = 0;
  for (std::string line; std::getline(in, line);) {
    std::istringstream fields(line);
    if (fields >> key >> value >> unit && key == "FileHugePages:" && unit == "kB")
      return value * 1024;
  }
  return -1;
}

FolioCensus::FolioCensus(std::string kpageflags, std::string pagemap, std::string meminfo)
    : kpageflags_(std::move(kpageflags)),
      pagemap_(std::move(pagemap)),
      meminfo_(std::move(meminfo)),
      huge_before_(file_huge_pages_bytes(read_text(meminfo_))) {}

bool FolioCensus::sample(const void* data, uint64_t bytes) {
  const UniqueFd pagemap(::open(pagemap_.c_str(), O_RDONLY | O_CLOEXEC));
  const UniqueFd kflags(::open(kpageflags_.c_str(), O_RDONLY | O_CLOEXEC));
  if (pagemap.get() < 0 || kflags.get() < 0) {
    why_ = (pagemap.get() < 0 ? pagemap_ : kpageflags_) + ": " + std::strerror(errno);
    return false;
  }
  const uint64_t first = reinterpret_cast<uintptr_t>(data) / kPage;
  const uint64_t pages = (bytes + kPage - 1) / kPage;
  const uint64_t samples = std::min(pages, kFolioSamples);
  bool failed = false;
  const auto flags_of = [&](uint64_t pfn) {
    uint64_t flags = 0;
    failed = failed ||
             pread_full(kflags.get(), &flags, sizeof flags, pfn * sizeof flags) != sizeof flags;
    return flags;
  };
  for (uint64_t s = 0; s < samples; ++s) {
    // One page at a pseudo-random place in each of `samples` equal strides: evenly spread,
    // yet not in step with a file's own period (a file written in 1 MiB pieces repeats its
    // folio pattern every 256 pages, and stride-aligned samples saw only its first folio).
    const uint64_t stride_begin = s * pages / samples, stride_end = (s + 1) * pages / samples;
    const uint64_t page = stride_begin + mix(s) % (stride_end - stride_begin);
    uint64_t entry = 0;
    if (pread_full(pagemap.get(), &entry, sizeof entry, (first + page) * sizeof entry) !=
        sizeof entry) {
      why_ = pagemap_ + ": " + std::strerror(errno);
      return false;
    }
    if ((entry & kPresent) == 0) continue;  // not resident (an unpinned mapping's hole)
    const uint64_t pfn = entry & kPfnMask;
    if (pfn == 0) {
      why_ = pagemap_ + " hides frame numbers (reading them needs CAP_SYS_ADMIN)";
      return false;
    }
    const uint64_t folio = folio_pages(pfn, flags_of);
    if (failed) {
      why_ = kpageflags_ + ": " + std::strerror(errno);
      return false;
    }
    // Each sample stands for pages / samples of the file's pages.
    bytes_[folio * kPage] += pages * kPage / samples;
  }
  sampled_ += samples;
  pages_ += pages;
  return true;
}

void FolioCensus::add(const void* data, uint64_t bytes, LoadReport& r) {
  if (why_.empty() && sample(data, bytes)) {
    r.map_folio_source = "kpageflags";
    r.map_folios = folio_text(bytes_) + " of the bytes (" + std::to_string(sampled_) + " of " +
                   std::to_string(pages_) + " pages sampled)";
    r.map_huge_bytes = 0;
    for (const auto& [size, in] : bytes_)
      if (size >= (kPage << kMaxFolioOrder)) r.map_huge_bytes += in;
    return;
  }
  const int64_t after = file_huge_pages_bytes(read_text(meminfo_));
  r.map_folio_source = after >= 0 ? "FileHugePages" : "";
  r.map_huge_bytes = after >= 0 ? static_cast<uint64_t>(after) : 0;
  r.map_folios = after < 0 ? "unknown (" + why_ + "; " + meminfo_ + " has no FileHugePages)"
                           : "FileHugePages " + gb(huge_before_) + " before, " + gb(after) +
                                 " after (system-wide; " + why_ + ")";
}

}  // namespace pinstage::detail
