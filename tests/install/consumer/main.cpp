// A program built against an installed pinstage (tests/install): it sees only the
// installed headers and libraries. It checks the version, that the sim plugin comes from
// the installed plugin folder, and that a pinned tensor bound with Binder reaches the
// device: a host callable adds 1 to every byte there and the bytes come back changed.
// CONSUMER_PLUGIN_DIR is the plugin folder the package description (pinstageConfig.cmake
// or pinstage.pc) names; it must be that folder too.
//
//   pinstage_consumer <expected version> <expected plugin folder>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <span>
#include <string>

#include "pinstage/backend/acl_ext.h"   // the plugin SDK's extension headers are installed
#include "pinstage/backend/cuda_ext.h"  // (docs/acl.md and cuda.md tell users to include them)
#include "pinstage/bind.h"
#include "pinstage/tensor.h"
#include "pinstage/version.h"
#include "pinstage/worker.h"

namespace {

int fail(const std::string& why) {
  std::fprintf(stderr, "consumer: FAILED: %s\n", why.c_str());
  return 1;
}

unsigned char pattern(size_t j) { return static_cast<unsigned char>((j * 31 + 5) & 0xff); }

// Runs on the device pointers (sim's device memory is host memory).
void add_one(std::span<const pinstage::ExecArg> args) {
  for (const pinstage::ExecArg& arg : args) {
    auto* p = static_cast<unsigned char*>(arg.device_ptr);
    for (uint64_t j = 0; j < arg.bytes; ++j) ++p[j];
  }
}

int bind_and_check(pinstage::Worker& worker) {
  pinstage::register_host_callable("consumer.add_one", add_one);
  pinstage::PinnedAllocator alloc(worker);
  pinstage::Tensor x = pinstage::Tensor::empty("x", pinstage::DType::bf16, {4099},
                                               pinstage::Direction::inout, alloc);
  auto* host = static_cast<unsigned char*>(x.data());
  for (uint64_t j = 0; j < x.nbytes(); ++j) host[j] = pattern(j);
  if (!x.pinned() || worker.stats().pinned_count != 1)
    return fail("the tensor is not in the worker's pinned memory");

  pinstage::TaskArgs args;
  args.add(x);
  pinstage::BindOptions options;
  options.execute_callable = "consumer.add_one";
  pinstage::Binder binder(worker, options);
  const pinstage::BindReport report = binder.run(args);
  if (!report.executed || report.uploaded_bytes != x.nbytes() || !report.tensors.at(0).pinned)
    return fail("bind report: " + report.summary());
  for (uint64_t j = 0; j < x.nbytes(); ++j)
    if (host[j] != static_cast<unsigned char>(pattern(j) + 1))
      return fail("byte " + std::to_string(j) + " did not make the round trip");
  std::printf("consumer: %llu bytes bound, executed on the device and read back\n",
              static_cast<unsigned long long>(x.nbytes()));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) return fail("usage: pinstage_consumer <version> <plugin folder>");
  try {
    std::printf("consumer: pinstage %s (headers %s; extensions %s, %s)\n", pinstage::version(),
                PINSTAGE_VERSION_STRING, PS_ACL_PIN_STATS_NAME, PS_CUDA_PIN_STATS_NAME);
    if (std::strcmp(pinstage::version(), PINSTAGE_VERSION_STRING) != 0 ||
        std::strcmp(pinstage::version(), argv[1]) != 0)
      return fail(std::string("version: expected ") + argv[1]);
    pinstage::Worker worker;
    worker.init("sim");
    const std::string plugin = worker.backend().path;
    std::printf("consumer: sim plugin %s\n", plugin.c_str());
    if (plugin != std::string(argv[2]) + "/libpinstage_backend_sim.so")
      return fail("the sim plugin is not the one in " + std::string(argv[2]));
    if (std::filesystem::weakly_canonical(CONSUMER_PLUGIN_DIR) != argv[2])
      return fail(std::string("the package names the plugin folder ") + CONSUMER_PLUGIN_DIR);
    const int rc = bind_and_check(worker);
    worker.finalize();
    return rc;
  } catch (const std::exception& e) {
    return fail(e.what());
  }
}
