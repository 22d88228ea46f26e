// libFuzzer target: the checkpoint index parser (parse_checkpoint_index), from memory.
// Input: the text of a model.safetensors.index.json. Every input must either parse or
// throw pinstage::Error. Seeds: corpus/<this name>/.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "pinstage/checkpoint.h"
#include "pinstage/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    const pinstage::CheckpointIndex index = pinstage::parse_checkpoint_index(text, "fuzz");
    // What the parser promises of an index it accepts: plain shard file names.
    for (const auto& [tensor, shard] : index.weight_map)
      if (tensor.empty() || shard.find('/') != std::string_view::npos) __builtin_trap();
  } catch (const pinstage::Error&) {
  }
  return 0;
}
