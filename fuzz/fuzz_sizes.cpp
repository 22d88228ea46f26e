// Fuzzes the strict number parsers every setting and the CLI share: parse_byte_count and
// parse_integer. An accepted text must be exactly what the grammar allows and its value
// must match an independent reading; a refused one is Error(invalid_argument) naming
// the value. Input: 2 bytes pick parse_integer's bounds, the rest is the text.
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <string>
#include <utility>

#include "pinstage/error.h"
#include "pinstage/settings.h"

namespace {

[[noreturn]] void finding(const std::string& what, const std::string& text) {
  std::fprintf(stderr, "fuzz_sizes: %s for '%s'\n", what.c_str(), text.c_str());
  std::abort();
}

// Digits then one of "", K, KiB, M, MiB, G, GiB, T, TiB: the shift, or -1.
int grammar_shift(const std::string& text, std::string& digits) {
  size_t end = 0;
  while (end < text.size() && text[end] >= '0' && text[end] <= '9') ++end;
  digits = text.substr(0, end);
  const std::string suffix = text.substr(end);
  if (digits.empty()) return -1;
  if (suffix.empty()) return 0;
  const std::string units = "KMGT";
  for (size_t i = 0; i < units.size(); ++i)
    if (suffix == std::string(1, units[i]) || suffix == std::string(1, units[i]) + "iB")
      return static_cast<int>(10 * (i + 1));
  return -1;
}

void check_byte_count(const std::string& text) {
  std::string digits;
  const int shift = grammar_shift(text, digits);
  try {
    const uint64_t value = pinstage::parse_byte_count(text, "--bytes");
    if (shift < 0) finding("accepted outside the grammar", text);
    // Independent reading: strtoull on the digits, then the shift, without overflow.
    errno = 0;
    const unsigned long long n = std::strtoull(digits.c_str(), nullptr, 10);
    if (errno == ERANGE || n == 0 || n > (std::numeric_limits<uint64_t>::max() >> shift) ||
        value != (static_cast<uint64_t>(n) << shift))
      finding("wrong value " + std::to_string(value), text);
  } catch (const pinstage::Error& e) {
    if (e.code() != pinstage::ErrorCode::invalid_argument) finding("wrong error code", text);
    if (std::string(e.what()).find("--bytes='") == std::string::npos)
      finding("the error does not name the value", text);
  }
}

void check_integer(const std::string& text, int64_t min, int64_t max) {
  try {
    const int64_t value = pinstage::parse_integer(text, min, max, "n");
    if (value < min || value > max) finding("out of range", text);
    if (std::to_string(value) != text) {
      // Only leading zeros may differ ("007" is 7, "-0" is 0).
      const bool neg = !text.empty() && text[0] == '-';
      const std::string body = text.substr(neg ? 1 : 0);
      const size_t nz = body.find_first_not_of('0');
      const std::string trimmed = nz == std::string::npos ? "0" : body.substr(nz);
      if (std::to_string(value) != ((neg && trimmed != "0") ? "-" : "") + trimmed)
        finding("wrong value " + std::to_string(value), text);
    }
  } catch (const pinstage::Error& e) {
    if (e.code() != pinstage::ErrorCode::invalid_argument) finding("wrong error code", text);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  static constexpr int64_t kBounds[] = {std::numeric_limits<int64_t>::min(), -4096, -1, 0, 1, 4096,
                                        std::numeric_limits<int64_t>::max()};
  int64_t a = kBounds[data[0] % 7], b = kBounds[data[1] % 7];
  if (a > b) std::swap(a, b);
  const std::string text(reinterpret_cast<const char*>(data + 2), size - 2);
  check_byte_count(text);
  check_integer(text, a, b);
  return 0;
}
