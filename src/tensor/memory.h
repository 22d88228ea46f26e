// Page-level helpers shared by the generator, the loader and the first-touch baseline.
#pragma once

#include <cstddef>

#include "pinstage/export.h"

namespace pinstage::detail {

inline constexpr size_t kPageSize = 4096;

// Asks the kernel to fault in the whole pages inside [data, data + bytes) for writing in
// one call (MADV_POPULATE_WRITE), which is cheaper than taking one fault per page. A
// hint only: does nothing where the kernel lacks it. Contents are unchanged.
PINSTAGE_API void populate_for_write(void* data, size_t bytes) noexcept;

// Writes one byte in every page of [data, data + bytes) on `threads` threads (0 = all):
// the first-touch floor that generation is measured against. Returns seconds taken.
PINSTAGE_API double first_touch(void* data, size_t bytes, int threads);

// populate_for_write over [data, data + bytes) in 256 KiB pieces on `threads` threads:
// the cheapest page population we know, shown next to the first-touch floor. Returns
// seconds taken.
PINSTAGE_API double populate_all(void* data, size_t bytes, int threads);

}  // namespace pinstage::detail
