// Strict parsing of untrusted JSON, shared by the safetensors header and the checkpoint
// index: one parser with the guards both need (internal to libpinstage).
#pragma once

#include <initializer_list>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

namespace pinstage::detail {

// Untrusted text for a message: quoted, at most 96 bytes (then "...' (N bytes)"),
// control bytes as '?', so a message never dumps a whole hostile value.
std::string shown(std::string_view text);

// Why parse_strict_json refused the text; callers add the file's name.
struct StrictJsonError {
  std::string message;
};

// Parses `text`, refusing (StrictJsonError) before any deep structure is built: a leading
// byte-order mark, nesting deeper than `max_depth`, a repeated key in any object (which
// would silently shadow the first), and invalid JSON. `what` names the document in the
// message ("the header", "the index").
nlohmann::json parse_strict_json(std::string_view text, const std::string& what, int max_depth);

// The first key of the object `obj` that is not one of `keys`, or nullopt: the check every
// file format with a closed set of keys makes (the hash sidecar, the tensor-parallel plan).
std::optional<std::string> unknown_key(const nlohmann::json& obj,
                                       std::initializer_list<const char*> keys);

}  // namespace pinstage::detail
