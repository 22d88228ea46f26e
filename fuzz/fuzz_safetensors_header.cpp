// libFuzzer target: the safetensors header parser (parse_safetensors_header), from memory.
// Input: 8 bytes of little-endian data-section size, then the header JSON text. Every
// input must either parse or throw pinstage::Error; anything else (a crash, a stack
// overflow on deep nesting, another exception type) is a bug. Seeds: corpus/<this name>/.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "pinstage/error.h"
#include "pinstage/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 8) return 0;
  uint64_t data_size = 0;
  for (int i = 7; i >= 0; --i) data_size = (data_size << 8) | data[i];
  const std::string_view text(reinterpret_cast<const char*>(data + 8), size - 8);
  try {
    const pinstage::SafetensorsHeader h =
        pinstage::parse_safetensors_header(text, data_size, "fuzz");
    // What the parser promises of a header it accepts.
    uint64_t cursor = 0;
    for (const auto& t : h.tensors) {
      if (t.begin != cursor || t.end < t.begin || t.element_size == 0) __builtin_trap();
      cursor = t.end;
    }
    if (cursor != data_size) __builtin_trap();
  } catch (const pinstage::Error&) {
  }
  return 0;
}
