// The regex of a tensor-parallel plan rule (internal to libpinstage): the subset of
// ECMAScript syntax docs/loading.md lists, compiled to an NFA and run as a Thompson
// simulation. Time is O(name x pattern) and no step recurses on the name, so a name of any
// length is safe (std::regex's recursion overflowed the stack at ~30,000 characters).
#pragma once

#include <bitset>
#include <cstdint>
#include <string_view>
#include <vector>

namespace pinstage::detail {

class PlanRegex {
 public:
  // Throws std::invalid_argument saying why `pattern` is refused (bad or unsupported
  // syntax, groups nested over 100 deep, a repeat count over 1000, over 100,000 steps).
  explicit PlanRegex(std::string_view pattern);
  // Whether the pattern matches the whole of `text` (bytes, as std::regex saw them).
  bool full_match(std::string_view text) const;

  enum class Op : uint8_t { byte, split, jump, begin, end, match };
  struct Inst {
    Op op = Op::match;
    int x = 0;  // byte: index into sets; split, jump: target
    int y = 0;  // split: the second target
  };

 private:
  std::vector<Inst> prog_;
  std::vector<std::bitset<256>> sets_;
};

}  // namespace pinstage::detail
