// parse_strict_json: the depth cap, repeated-key and BOM checks of every untrusted JSON.
#include "tensor/strict_json.h"

#include <set>
#include <vector>

namespace pinstage::detail {

namespace {
constexpr size_t kMaxQuoted = 96;  // bytes of untrusted text a message quotes
}  // namespace

std::string shown(std::string_view text) {
  std::string out = "'";
  for (size_t i = 0; i < text.size() && i < kMaxQuoted; ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    out += (c < 0x20 || c == 0x7f) ? '?' : static_cast<char>(c);
  }
  if (text.size() > kMaxQuoted) return out + "...' (" + std::to_string(text.size()) + " bytes)";
  return out + "'";
}

nlohmann::json parse_strict_json(std::string_view text, const std::string& what, int max_depth) {
  if (text.size() >= 3 && text.substr(0, 3) == "\xEF\xBB\xBF")
    throw StrictJsonError{what + " starts with a byte-order mark; it must be plain JSON"};
  // Keys seen per open object, by depth; the callback stops the parser at once.
  std::vector<std::set<std::string>> seen(static_cast<size_t>(max_depth) + 2);
  nlohmann::json::parser_callback_t on_event = [&](int depth, nlohmann::json::parse_event_t event,
                                                   nlohmann::json& parsed) {
    using E = nlohmann::json::parse_event_t;
    if (event == E::object_start || event == E::array_start) {
      if (depth >= max_depth)
        throw StrictJsonError{what + " nests deeper than " + std::to_string(max_depth) + " levels"};
      if (event == E::object_start) seen[static_cast<size_t>(depth) + 1].clear();
    } else if (event == E::key && !seen[static_cast<size_t>(depth)]
                                       .insert(parsed.get_ref<const std::string&>())
                                       .second) {
      throw StrictJsonError{what + " repeats the key " +
                            shown(parsed.get_ref<const std::string&>()) +
                            (depth == 1 ? "" : " inside one object")};
    }
    return true;
  };
  try {
    return nlohmann::json::parse(text.begin(), text.end(), on_event);
  } catch (const nlohmann::json::exception& e) {
    throw StrictJsonError{what + " is not valid JSON: " + shown(e.what())};
  }
}

}  // namespace pinstage::detail
