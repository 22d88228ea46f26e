// The one way pinstage names a dense enum: a table of names in declaration order. Every
// `*_name()` / `parse_*()` pair is built on these two functions.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

namespace pinstage {

// names[value], or `unknown` for a value outside the table.
template <class E, size_t N>
constexpr const char* enum_name(E value, const char* const (&names)[N], const char* unknown = "?") {
  const auto i = static_cast<size_t>(value);
  return i < N ? names[i] : unknown;
}

// The value whose name is `text`, or nullopt.
template <class E, size_t N>
constexpr std::optional<E> enum_from_name(std::string_view text, const char* const (&names)[N]) {
  for (size_t i = 0; i < N; ++i)
    if (text == names[i]) return static_cast<E>(i);
  return std::nullopt;
}

// "a, b, c": the accepted names, for error messages.
template <size_t N>
std::string enum_names_list(const char* const (&names)[N]) {
  std::string out;
  for (size_t i = 0; i < N; ++i) (out += i ? ", " : "") += names[i];
  return out;
}

}  // namespace pinstage
