// Checks of where a worker's pinned host memory comes from and where it lies (issue 46),
// written once and run on every backend that pins through a fake or a double: the cuda
// fake (test_cuda_gpu.cpp, with and without read-only registration) and the acl double
// (test_acl_plugin.cpp). What was pinned is asked of the fake's own tables (PinView), and
// where it lies of the kernel (get_mempolicy, /proc/self/smaps), never of pinstage.
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "numa_test_util.h"
#include "pinstage/pages.h"
#include "pinstage/worker.h"
#include "tensor_test_util.h"

namespace pinstage::test {

// What a backend's fake says about host memory, from its own tables.
struct PinView {
  std::string backend;
  BackendConfig config;  // the worker's backend keys
  // True when [p, p + n) lies inside one range the fake holds pinned (registered, or its
  // own pinned allocation).
  std::function<bool(const void*, size_t)> pinned;
  // Alive now: ranges registered (host_register) and the fake's own pinned allocations
  // (the vendor source). Empty on a real runtime, which cannot count them.
  std::function<size_t()> registrations, vendor_allocations;
  // Read-only registrations made so far; empty where the runtime has no such flag (acl).
  std::function<size_t()> read_only_registrations;
  // Makes the fake refuse to register anonymous memory as "not supported" from now on
  // (at least once: the pool remembers the refusal).
  std::function<void()> refuse_registration;
};

// Sets (or, with nullptr, unsets) an environment variable for one scope, then restores it.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value != nullptr)
      setenv(name, value, 1);
    else
      unsetenv(name);
  }
  ~ScopedEnv() {
    if (old_)
      setenv(name_, old_->c_str(), 1);
    else
      unsetenv(name_);
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  std::optional<std::string> old_;
};

// A file of `bytes` pattern bytes in the test temp folder, removed with the object.
struct PatternFile {
  explicit PatternFile(size_t bytes, unsigned seed = 11)
      : path(::testing::TempDir() + "pinstage_host_source_" + std::to_string(::getpid()) + "_" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name()),
        bytes(pattern(bytes, seed)) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(this->bytes.data()),
              static_cast<std::streamsize>(this->bytes.size()));
  }
  ~PatternFile() { std::remove(path.c_str()); }
  PatternFile(const PatternFile&) = delete;
  PatternFile& operator=(const PatternFile&) = delete;
  // The file's bytes as read now (pread), not through any mapping of ours.
  std::vector<unsigned char> read_back() const {
    std::vector<unsigned char> out(bytes.size());
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    const ssize_t got = fd < 0 ? -1 : ::pread(fd, out.data(), out.size(), 0);
    if (fd >= 0) ::close(fd);
    if (got != static_cast<ssize_t>(out.size())) out.clear();
    return out;
  }
  std::string path;
  std::vector<unsigned char> bytes;
};

// The node the page at `addr` lies on, by the raw get_mempolicy(MPOL_F_NODE|MPOL_F_ADDR);
// -1 when the kernel refuses.
inline int kernel_node_of(const void* addr) {
  int node = -1;
  if (syscall(SYS_get_mempolicy, &node, nullptr, 0, addr, 1 /*MPOL_F_NODE*/ | 2 /*MPOL_F_ADDR*/) !=
      0)
    return -1;
  return node;
}

// A field of the /proc/self/smaps entry of the mapping holding `p` ("AnonHugePages:",
// "VmFlags:"): the rest of its line, or nullopt when no mapping holds `p`.
inline std::optional<std::string> smaps_field(const void* p, const std::string& field) {
  std::ifstream smaps("/proc/self/smaps");
  const auto want = reinterpret_cast<uintptr_t>(p);
  std::string line;
  bool inside = false;
  while (std::getline(smaps, line)) {
    uintptr_t lo = 0, hi = 0;
    char dash = 0;
    std::istringstream in(line);
    if (in >> std::hex >> lo >> dash >> hi && dash == '-') {
      inside = lo <= want && want < hi;
      continue;
    }
    if (inside && line.rfind(field, 0) == 0) return line.substr(field.size()) + " ";
  }
  return std::nullopt;
}

// The options every check starts its worker with: the view's keys, no pool cache (a
// segment per request, released at its free, so the fake sees exactly one range).
inline WorkerOptions check_options(const PinView& v) {
  WorkerOptions o;
  o.config = v.config;
  o.host_cache_limit_bytes = 0;
  return o;
}

// [p, p + n) is this worker's pinned memory and the fake's, and its bytes reach the device
// by an asynchronous (pinned) copy and come back unchanged.
inline void expect_pinned_round_trip(Worker& w, const PinView& v, const void* p, size_t n) {
  EXPECT_TRUE(w.is_pinned_host(p, n));
  EXPECT_TRUE(v.pinned(p, n)) << "the " << v.backend << " fake does not hold it pinned";
  const auto* bytes = static_cast<const unsigned char*>(p);
  const std::vector<unsigned char> want(bytes, bytes + n);
  DeviceBuffer dev = w.alloc_device(n);
  Stream stream = w.create_stream();
  w.copy_to_device_async(dev, 0, p, n, stream);
  w.synchronize(stream);
  std::vector<unsigned char> back(n);
  w.copy_to_host(back.data(), dev, 0, n);
  EXPECT_TRUE(back == want) << "the bytes did not round-trip through the device";
}

// anonymous: the pool's segment is the runtime's own memory, registered by the plugin.
inline void check_anonymous_source(const PinView& v) {
  Worker w;
  w.init(v.backend, 0, check_options(v));
  EXPECT_EQ(w.host_placement().pool_source, "anonymous");
  const size_t bytes = (size_t{3} << 20) + 5;
  PinnedHostBuffer b = w.alloc_pinned_host(bytes);
  std::memcpy(b.data(), pattern(bytes, 3).data(), bytes);
  if (v.registrations) {
    EXPECT_EQ(v.registrations(), 1u);
    EXPECT_EQ(v.vendor_allocations(), 0u);
  }
  expect_pinned_round_trip(w, v, b.data(), bytes);
  const void* p = b.data();
  b.reset();
  EXPECT_FALSE(v.pinned(p, 1)) << "still registered after its free";
}

// vendor: a fake that refuses to register anonymous memory gives the pool the plugin's
// own pinned allocation, for this and every later segment. `inspect` then reads the
// worker (its backend's statistics).
inline void check_vendor_source(const PinView& v,
                                const std::function<void(const Worker&)>& inspect = {}) {
  Worker w;
  w.init(v.backend, 0, check_options(v));
  v.refuse_registration();
  PinnedHostBuffer a = w.alloc_pinned_host(size_t{1} << 20);
  PinnedHostBuffer b = w.alloc_pinned_host(4096);
  EXPECT_EQ(w.host_placement().pool_source, "vendor");
  if (v.registrations) {
    EXPECT_EQ(v.registrations(), 0u);
    EXPECT_EQ(v.vendor_allocations(), 2u);
  }
  std::memcpy(a.data(), pattern(a.size(), 5).data(), a.size());
  expect_pinned_round_trip(w, v, a.data(), a.size());
  expect_pinned_round_trip(w, v, b.data(), b.size());
  if (inspect) inspect(w);
}

// A file mapping a worker on `v` makes of `file`: pinned, of the source expected, one
// registration (read-only where the runtime has the flag, unless `private_copy`), the
// file's bytes, and they round-trip to the device. Null (a failure) when not pinned.
inline std::shared_ptr<PinnedFileMapping> map_and_check(Worker& w, const PinView& v,
                                                        const PatternFile& file,
                                                        bool private_copy) {
  w.init(v.backend, 0, check_options(v));
  const size_t read_only = v.read_only_registrations ? v.read_only_registrations() : 0;
  std::shared_ptr<PinnedFileMapping> m = w.map_file_pinned(file.path, file.bytes.size());
  if (!m->pinned()) {
    ADD_FAILURE() << "not pinned: " << m->refusal();
    return nullptr;
  }
  EXPECT_STREQ(m->source(), private_copy ? "file_private" : "file_shared");
  EXPECT_EQ(m->note().find("file_private") != std::string::npos, private_copy) << m->note();
  if (v.registrations) {
    EXPECT_EQ(v.registrations(), 1u) << "one registration, whole";
  }
  if (v.read_only_registrations) {
    EXPECT_EQ(v.read_only_registrations() - read_only, private_copy ? 0u : 1u)
        << "read-only registrations";
  }
  EXPECT_EQ(std::memcmp(m->data(), file.bytes.data(), file.bytes.size()), 0);
  expect_pinned_round_trip(w, v, m->data(), file.bytes.size());
  return m;
}

// file_shared: the file's page cache, mapped read-only and registered in place.
inline void check_file_shared_source(const PinView& v) {
  const PatternFile file((size_t{2} << 20) + 300);
  Worker w;
  map_and_check(w, v, file, false);
}

// file_private (a runtime that refuses read-only registration): a private copy-on-write
// copy, registered writable; a write to it never reaches the file or another mapping of it.
inline void check_file_private_source(const PinView& v) {
  const PatternFile file((size_t{2} << 20) + 300);
  Worker w;
  const std::shared_ptr<PinnedFileMapping> m = map_and_check(w, v, file, true);
  if (!m) return;
  // Another mapping of the file (the page cache), made before the write.
  const int fd = ::open(file.path.c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  void* shared = mmap(nullptr, file.bytes.size(), PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);
  ASSERT_NE(shared, MAP_FAILED);
  auto* writable = const_cast<unsigned char*>(m->data());
  std::memset(writable + 4096, 0xA5, 8192);
  EXPECT_EQ(writable[4096], 0xA5);
  EXPECT_TRUE(file.read_back() == file.bytes) << "a write to the private copy reached the file";
  EXPECT_EQ(std::memcmp(shared, file.bytes.data(), file.bytes.size()), 0)
      << "a write to the private copy reached another mapping of the file";
  munmap(shared, file.bytes.size());
}

// Bound to node 0 (MPOL_BIND, mask {0}) and lying there, at its first, middle and last byte.
inline void expect_on_node_zero(const void* p, size_t n, const char* what) {
  SCOPED_TRACE(what);
  const auto* c = static_cast<const char*>(p);
  for (const char* at : {c, c + n / 2, c + n - 1}) {
    const NumaPolicy policy = numa_policy_of(at);
    EXPECT_EQ(policy, (NumaPolicy{kMpolBind, 1ul})) << "mode " << policy.mode << " (MPOL_BIND is "
                                                    << kMpolBind << "), node mask " << policy.mask;
    EXPECT_EQ(kernel_node_of(at), 0);
  }
}

// NUMA: a worker on node 0 has its pool memory bound to node 0, and so is a private copy
// of a file; a file_shared mapping is the page cache, which nobody binds (MPOL_DEFAULT).
// The memory is asked of the kernel, on ranges the fake holds pinned. Skipped where sysfs
// has no node 0.
inline void check_numa_placement(const PinView& v) {
  if (numa_node_cpus(0).empty()) GTEST_SKIP() << "no NUMA node 0 with a CPU of ours here";
  const PatternFile file((size_t{1} << 20) + 77);
  WorkerOptions o = check_options(v);
  o.host_numa_node = 0;
  Worker w;
  w.init(v.backend, 0, o);
  EXPECT_EQ(w.host_numa_node(), 0);
  for (const size_t bytes : {size_t{4096}, (size_t{3} << 20) + 5}) {
    PinnedHostBuffer b = w.alloc_pinned_host(bytes);
    EXPECT_TRUE(v.pinned(b.data(), bytes));
    expect_on_node_zero(b.data(), bytes, "the pool's segment");
  }
  const std::shared_ptr<PinnedFileMapping> m = w.map_file_pinned(file.path, file.bytes.size());
  ASSERT_TRUE(m->pinned()) << m->refusal();
  EXPECT_TRUE(v.pinned(m->data(), file.bytes.size()));
  if (std::string(m->source()) == "file_private") {
    expect_on_node_zero(m->data(), file.bytes.size(), "a private copy of a file");
  } else {
    EXPECT_EQ(numa_policy_of(m->data()).mode, kMpolDefault) << "the page cache is not bound";
  }
  // A worker not placed keeps the default policy: the checks above can fail.
  Worker plain;
  plain.init(v.backend, 0, check_options(v));
  PinnedHostBuffer b = plain.alloc_pinned_host(1 << 20);
  EXPECT_TRUE(v.pinned(b.data(), b.size()));
  EXPECT_EQ(numa_policy_of(b.data()).mode, kMpolDefault);
}

// The one huge-page switch, PINSTAGE_HOST_HUGE_PAGES, read at init: =thp gives the pool's
// 8 MiB segment huge pages (AnonHugePages of its mapping, and the MADV_HUGEPAGE flag "hg"),
// =off none. Skipped where the kernel has transparent huge pages [never].
inline void check_huge_page_switch(const PinView& v) {
  std::string thp;
  std::getline(std::ifstream("/sys/kernel/mm/transparent_hugepage/enabled"), thp);
  if (thp.empty() || thp.find("[never]") != std::string::npos)
    GTEST_SKIP() << "transparent huge pages are off here: '" << thp << "'";
  const ScopedEnv no_stall("PINSTAGE_HOST_HUGE_STALL_MS", "60000");  // no fallback mid-way
  for (const char* mode : {"thp", "off"}) {
    SCOPED_TRACE(std::string("PINSTAGE_HOST_HUGE_PAGES=") + mode);
    const bool huge = std::string(mode) == "thp";
    const ScopedEnv env("PINSTAGE_HOST_HUGE_PAGES", mode);
    Worker w;
    w.init(v.backend, 0, check_options(v));
    EXPECT_EQ(w.host_placement().huge_pages, huge) << w.host_placement().huge_reason;
    PinnedHostBuffer b = w.alloc_pinned_host(size_t{8} << 20);
    EXPECT_TRUE(v.pinned(b.data(), b.size()));
    const std::string flags = smaps_field(b.data(), "VmFlags:").value_or("");
    EXPECT_EQ(flags.find(" hg ") != std::string::npos, huge) << "VmFlags:" << flags;
    const long kb = std::atol(smaps_field(b.data(), "AnonHugePages:").value_or("-1").c_str());
    if (huge) {
      EXPECT_GT(kb, 0) << "no huge page in the segment's mapping";
    } else {
      EXPECT_EQ(kb, 0) << "huge pages with the switch off";
    }
  }
}

}  // namespace pinstage::test
