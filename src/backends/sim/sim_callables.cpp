// Callables the sim backend runs on device memory (host memory on sim).
#include <cstring>
#include <string>

#include "backends/sim/sim_backend.h"

namespace pinstage::sim {

int run_callable(const char* name, const ps_exec_arg* args, size_t n_args, std::string* error) {
  if (std::strcmp(name, "sim.fill_index") == 0) {
    // Test pattern: byte j of argument k becomes (j + 7k) & 0xff.
    for (size_t k = 0; k < n_args; ++k) {
      auto* bytes = static_cast<unsigned char*>(args[k].device_ptr);
      for (uint64_t j = 0; j < args[k].bytes; ++j)
        bytes[j] = static_cast<unsigned char>((j + 7 * k) & 0xff);
    }
    return PS_OK;
  }
  *error = std::string("sim: no callable named '") + name + "' (sim has: sim.fill_index)";
  return PS_ERR_NOT_FOUND;
}

}  // namespace pinstage::sim
