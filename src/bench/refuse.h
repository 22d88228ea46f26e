// The bench configs' one refusal of a number (internal to libpinstage).
#pragma once

#include <string>

#include "pinstage/error.h"

namespace pinstage::detail {

// Error(invalid_argument) "<what> is <value>; <rule>": --groups, --rounds, --steps, the
// size, and synthetic's --tensors and --bytes are refused in these words.
template <class T>
[[noreturn]] void refuse_number(const std::string& what, T value, const std::string& rule) {
  throw Error(ErrorCode::invalid_argument, what + " is " + std::to_string(value) + "; " + rule);
}

}  // namespace pinstage::detail
