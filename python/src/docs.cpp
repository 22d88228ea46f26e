// Docstrings that inspect.signature() and help() can read (see common.h).
#include <algorithm>
#include <forward_list>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "common.h"

namespace pinstage::python {
namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && s.front() == ' ') s.remove_prefix(1);
  while (!s.empty() && s.back() == ' ') s.remove_suffix(1);
  return s;
}

// Splits "a: tuple[int, int] = (1, 0), *, b: str" at the commas outside brackets and
// quotes.
std::vector<std::string_view> split_params(std::string_view params) {
  std::vector<std::string_view> out;
  int depth = 0;
  char quote = 0;
  size_t start = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    const char c = params[i];
    if (quote != 0) {
      if (c == quote) quote = 0;
    } else if (c == '\'' || c == '"') {
      quote = c;
    } else if (c == '[' || c == '(' || c == '{') {
      ++depth;
    } else if (c == ']' || c == ')' || c == '}') {
      --depth;
    } else if (c == ',' && depth == 0) {
      out.push_back(trim(params.substr(start, i - start)));
      start = i + 1;
    }
  }
  if (depth != 0 || quote != 0) throw std::logic_error("unbalanced docstring signature");
  if (!trim(params.substr(start)).empty()) out.push_back(trim(params.substr(start)));
  return out;
}

// "a: int = 3" -> "a=3"; "b: str" -> "b"; "*", "**options" stay.
std::string untyped(std::string_view param) {
  const size_t colon = param.find(':');
  const size_t equals = param.find(" = ");
  std::string name(trim(param.substr(0, std::min(colon, equals))));
  if (equals != std::string_view::npos) name += "=" + std::string(trim(param.substr(equals + 3)));
  return name;
}

}  // namespace

const char* signed_doc(std::string_view typed, std::string_view text, bool method) {
  const size_t open = typed.find('(');
  const size_t close = typed.rfind(')');
  if (open == std::string_view::npos || close == std::string_view::npos || close < open)
    throw std::logic_error("docstring signature without parentheses: " + std::string(typed));
  std::string sig(typed.substr(0, open));
  sig += '(';
  bool first = true;
  if (method) {
    sig += "self";
    first = false;
  }
  for (std::string_view param : split_params(typed.substr(open + 1, close - open - 1))) {
    if (!first) sig += ", ";
    sig += untyped(param);
    first = false;
  }
  sig += ")\n--\n\n";
  sig += typed;
  if (!text.empty()) {
    sig += "\n\n";
    sig += text;
  }
  static std::forward_list<std::string> kept;  // never freed: the functions keep pointing
  kept.push_front(std::move(sig));
  return kept.front().c_str();
}

}  // namespace pinstage::python
