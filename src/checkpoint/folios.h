// The page cache's folio sizes under a map-mode load's mappings (docs/loading.md, "Folios"):
// pinning a mapping costs per folio, so 2.2 GB of 4 KiB folios pin in ~400 ms and of 2 MiB
// folios in ~3 ms, and the report says which it found. Internal to libpinstage.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>

#include "pinstage/checkpoint.h"

namespace pinstage::detail {

// /proc/kpageflags bits (Documentation/admin-guide/mm/pagemap.rst).
inline constexpr uint64_t kKpfCompoundHead = uint64_t{1} << 15;
inline constexpr uint64_t kKpfCompoundTail = uint64_t{1} << 16;

// The largest folio the census tells apart: 2 MiB (order 9, x86-64's PMD size, the page
// cache's largest there); a larger one counts as 2 MiB.
inline constexpr unsigned kMaxFolioOrder = 9;

// The pages of the folio holding frame `pfn`, asking flags_of(frame) for kpageflags entries:
// 1 for a frame that is neither compound head nor tail. A folio is naturally aligned, so its
// head is the first head among pfn rounded down to 2, 4, ... 512 frames, and it ends at the
// first head + 2^o (o = 1, 2, ...) that is not a tail: at most 2 x kMaxFolioOrder + 2 reads
// of one entry each (a whole 2 MiB block of entries cost ~150 us to read; one, ~2 us); a
// frame of a 2 MiB folio takes two (its block's middle frame is a tail), one of 4 KiB one.
uint64_t folio_pages(uint64_t pfn, const std::function<uint64_t(uint64_t)>& flags_of);

// "2 MiB 97%, 64 KiB 2%, 4 KiB 1%": each folio size's share of `bytes_by_size`, largest
// size first.
std::string folio_text(const std::map<uint64_t, uint64_t>& bytes_by_size);

// FileHugePages of a /proc/meminfo text, in bytes; -1 when it has no such line.
int64_t file_huge_pages_bytes(const std::string& meminfo);

// The census of one map-mode load, file by file: construct it before the first file is
// mapped (it reads FileHugePages then), then add(mapping, report) after each file is
// pinned; each add() leaves the report's map_folio_* fields up to date. Each file is
// sampled at kFolioSamples pages, one at a pseudo-random place in each of as many equal
// strides (every page of a smaller file): one
// pagemap and one kpageflags read each, about 1 ms per file whatever its size (reading
// every page's flags cost as much as pinning). The paths are seams for tests.
inline constexpr uint64_t kFolioSamples = 64;
class FolioCensus {
 public:
  explicit FolioCensus(std::string kpageflags = "/proc/kpageflags",
                       std::string pagemap = "/proc/self/pagemap",
                       std::string meminfo = "/proc/meminfo");
  void add(const void* data, uint64_t bytes, LoadReport& report);
  void add(const PinnedFileMapping& mapping, LoadReport& report) {
    add(mapping.data(), mapping.size(), report);
  }

 private:
  // The mapping's sampled folios from pagemap and kpageflags into bytes_; false (why_
  // set) when those cannot be read.
  bool sample(const void* data, uint64_t bytes);

  std::string kpageflags_, pagemap_, meminfo_;
  int64_t huge_before_ = -1;
  std::map<uint64_t, uint64_t> bytes_;  // folio size -> estimated bytes in such folios
  uint64_t sampled_ = 0, pages_ = 0;
  std::string why_;  // why kpageflags could not be read ("" while it could)
};

}  // namespace pinstage::detail
