// Callables the sim backend runs on device memory (host memory on sim).
#include <cstring>
#include <string>
#include <vector>

#include "backends/sim/sim_backend.h"
#include "pinstage/error.h"
#include "pinstage/qwen3_golden.h"

namespace pinstage::sim {
namespace {

// Test pattern: byte j of argument k becomes (j + 7k) & 0xff.
void fill_index(const ps_exec_arg* args, size_t n_args) {
  for (size_t k = 0; k < n_args; ++k) {
    auto* bytes = static_cast<unsigned char*>(args[k].device_ptr);
    for (uint64_t j = 0; j < args[k].bytes; ++j)
      bytes[j] = static_cast<unsigned char>((j + 7 * k) & 0xff);
  }
}

// The scene's decode on the bound buffers, in place: the same implementation as the
// golden, so a run that matches it proves every byte made the trip there and back.
void qwen3_decode(const ps_exec_arg* args, size_t n_args) {
  std::vector<qwen3::DecodeArg> bound;
  bound.reserve(n_args);
  for (size_t i = 0; i < n_args; ++i)
    bound.push_back({args[i].name, args[i].device_ptr, args[i].bytes});
  int n_layers = 0;
  const qwen3::DecodeBuffers buffers = qwen3::decode_buffers(bound, &n_layers);
  qwen3::run_decode(buffers, n_layers, /*write_cache=*/true, nullptr);
}

}  // namespace

int run_callable(const char* name, const ps_exec_arg* args, size_t n_args, std::string* error) {
  try {
    if (std::strcmp(name, "sim.fill_index") == 0) {
      fill_index(args, n_args);
      return PS_OK;
    }
    if (std::strcmp(name, "qwen3_decode") == 0) {
      qwen3_decode(args, n_args);
      return PS_OK;
    }
  } catch (const Error& e) {
    *error = std::string("sim: ") + name + ": " + e.what();
    return e.code() == ErrorCode::invalid_argument ? PS_ERR_INVALID_ARGUMENT : PS_ERR_BACKEND;
  }
  *error =
      std::string("sim: no callable named '") + name + "' (sim has: sim.fill_index, qwen3_decode)";
  return PS_ERR_NOT_FOUND;
}

}  // namespace pinstage::sim
