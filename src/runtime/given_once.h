// The one "given twice" check of every list a user writes: backend options, device lists,
// a WorkerGroup's members. Private to the runtime.
#pragma once

#include <algorithm>
#include <string>

#include "pinstage/error.h"

namespace pinstage::detail {

// Throws invalid_argument "<what> is given twice" when any element of `seen` is `same`.
template <typename Range, typename Same>
void check_given_once(const Range& seen, Same same, const std::string& what) {
  if (std::any_of(std::begin(seen), std::end(seen), same))
    throw Error(ErrorCode::invalid_argument, what + " is given twice");
}

}  // namespace pinstage::detail
