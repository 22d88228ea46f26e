// parse_strict_json: the depth cap, repeated-key and BOM checks of every untrusted JSON.
#include "tensor/strict_json.h"

#include <utility>
#include <vector>

namespace pinstage::detail {

namespace {

constexpr size_t kMaxQuoted = 96;  // bytes of untrusted text a message quotes

using Json = nlohmann::json;

// Builds the document as nlohmann's own DOM parser does, in one pass, with the guards: an
// object or array past the depth cap and a repeated key stop the parse at once. A key is
// inserted when it is read, so the object itself says whether it was there before (no
// second set of keys, and no callback parser, whose cost grows with the square of the
// entries of an object: 100,000 tensors took minutes).
class StrictSax final : public nlohmann::json_sax<Json> {
 public:
  StrictSax(const std::string& what, int max_depth) : what_(what), max_depth_(max_depth) {}

  Json take() { return std::move(root_); }

  bool null() override { return add(nullptr); }
  bool boolean(bool v) override { return add(v); }
  bool number_integer(number_integer_t v) override { return add(v); }
  bool number_unsigned(number_unsigned_t v) override { return add(v); }
  bool number_float(number_float_t v, const string_t& /*text*/) override { return add(v); }
  bool string(string_t& v) override { return add(std::move(v)); }
  bool binary(binary_t& v) override { return add(Json::binary(std::move(v))); }

  bool start_object(std::size_t /*elements*/) override { return open(Json::object()); }
  bool start_array(std::size_t /*elements*/) override { return open(Json::array()); }
  bool end_object() override { return close(); }
  bool end_array() override { return close(); }

  bool key(string_t& k) override {
    auto& object = open_.back()->get_ref<Json::object_t&>();
    const auto [it, inserted] = object.emplace(k, nullptr);
    if (!inserted)
      throw StrictJsonError{what_ + " repeats the key " + shown(k) +
                            (open_.size() == 1 ? "" : " inside one object")};
    slot_ = &it->second;
    return true;
  }

  bool parse_error(std::size_t /*position*/, const std::string& /*token*/,
                   const nlohmann::detail::exception& e) override {
    throw StrictJsonError{what_ + " is not valid JSON: " + shown(e.what())};
  }

 private:
  // The value's place: the root, the next element of the open array, or the slot of the
  // key just read. Returns where it went, for a container that is opened.
  Json* place(Json&& value) {
    if (open_.empty()) {
      root_ = std::move(value);
      return &root_;
    }
    Json& parent = *open_.back();
    if (parent.is_array()) {
      parent.get_ref<Json::array_t&>().push_back(std::move(value));
      return &parent.get_ref<Json::array_t&>().back();
    }
    *slot_ = std::move(value);
    return slot_;
  }
  bool add(Json&& value) {
    place(std::move(value));
    return true;
  }
  // A container's address stays valid while it is open: its parent gains no other element
  // until it is closed (a map never moves its values; an array's last element is it).
  bool open(Json&& container) {
    if (open_.size() >= static_cast<size_t>(max_depth_))
      throw StrictJsonError{what_ + " nests deeper than " + std::to_string(max_depth_) + " levels"};
    open_.push_back(place(std::move(container)));
    return true;
  }
  bool close() {
    open_.pop_back();
    return true;
  }

  const std::string& what_;
  const int max_depth_;
  Json root_;
  std::vector<Json*> open_;  // the open objects and arrays, outermost first
  Json* slot_ = nullptr;     // the value of the key just read
};

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

Json parse_strict_json(std::string_view text, const std::string& what, int max_depth) {
  if (text.size() >= 3 && text.substr(0, 3) == "\xEF\xBB\xBF")
    throw StrictJsonError{what + " starts with a byte-order mark; it must be plain JSON"};
  // nlohmann's lexer takes a raw NUL for the end of input and would ignore what follows.
  if (const size_t nul = text.find('\0'); nul != std::string_view::npos)
    throw StrictJsonError{what + " holds a NUL byte at offset " + std::to_string(nul) +
                          "; JSON text cannot contain one"};
  StrictSax sax(what, max_depth);
  try {
    Json::sax_parse(text.begin(), text.end(), &sax);
  } catch (const nlohmann::json::exception& e) {
    throw StrictJsonError{what + " is not valid JSON: " + shown(e.what())};
  }
  return sax.take();
}

std::optional<std::string> unknown_key(const nlohmann::json& obj,
                                       std::initializer_list<const char*> keys) {
  for (const auto& item : obj.items()) {
    bool known = false;
    for (const char* k : keys) known = known || item.key() == k;
    if (!known) return item.key();
  }
  return std::nullopt;
}

}  // namespace pinstage::detail
