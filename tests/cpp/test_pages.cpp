// The one page module: sizes, the parallel pre-fault and anonymous mappings.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdint>
#include <vector>

#include "pinstage/pages.h"
#include "tensor_test_util.h"

namespace pinstage {
namespace {

using test::error_of;

// Pages of [data, data + bytes) resident now, by mincore.
size_t resident_pages(void* data, size_t bytes) {
  std::vector<unsigned char> vec((bytes + page_size() - 1) / page_size());
  EXPECT_EQ(mincore(data, bytes, vec.data()), 0);
  size_t n = 0;
  for (unsigned char v : vec) n += v & 1;
  return n;
}

TEST(Pages, SizesComeFromTheKernel) {
  EXPECT_EQ(page_size(), static_cast<size_t>(sysconf(_SC_PAGESIZE)));
  EXPECT_EQ(physical_memory_bytes(),
            static_cast<uint64_t>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGESIZE));
  EXPECT_GT(available_memory_bytes(), 0u);
  EXPECT_LE(available_memory_bytes(), physical_memory_bytes());
  EXPECT_EQ(round_up_to_pages(1), page_size());
  EXPECT_EQ(round_up_to_pages(page_size()), page_size());
  EXPECT_EQ(error_of([] { round_up_to_pages(SIZE_MAX - 1); }).code(), ErrorCode::invalid_argument);
}

TEST(Pages, MapsPrefaultedZeroedPagesOnSeveralThreads) {
  const size_t bytes = (size_t{96} << 20) + 123;
  MappedPages pages = map_pages(bytes, MapOptions{.prefault = true, .threads = 3});
  ASSERT_NE(pages.data, nullptr);
  EXPECT_EQ(pages.bytes, round_up_to_pages(bytes));  // the page, never further
  EXPECT_EQ(pages.map_bytes, pages.bytes);
  EXPECT_EQ(pages.prefault.threads, 3);
  EXPECT_EQ(resident_pages(pages.data, pages.bytes), pages.bytes / page_size());
  const auto* p = static_cast<const unsigned char*>(pages.data);
  for (size_t i = 0; i < pages.bytes; i += 4093) ASSERT_EQ(p[i], 0);
  EXPECT_TRUE(unmap_pages(pages));
}

TEST(Pages, WithoutPrefaultNothingIsResident) {
  MappedPages pages = map_pages(size_t{8} << 20, MapOptions{.prefault = false});
  EXPECT_EQ(resident_pages(pages.data, pages.bytes), 0u);
  const PrefaultReport report = prefault(pages.data, pages.bytes, 2);
  EXPECT_EQ(resident_pages(pages.data, pages.bytes), pages.bytes / page_size());
  EXPECT_GE(report.threads, 1);
  EXPECT_TRUE(unmap_pages(pages));
}

TEST(Pages, HugePageMappingsAreAlignedAndTrimmed) {
  const size_t bytes = size_t{6} << 20;
  MappedPages pages = map_pages(bytes, MapOptions{.prefault = true, .huge_pages = true});
  EXPECT_EQ(reinterpret_cast<uintptr_t>(pages.data) % (size_t{2} << 20), 0u);
  EXPECT_EQ(pages.bytes, bytes);
  EXPECT_GE(pages.map_bytes, pages.bytes);
  EXPECT_TRUE(unmap_pages(pages));
}

TEST(Pages, BadSizesFailWithNothingMapped) {
  EXPECT_EQ(error_of([] { map_pages(0); }).code(), ErrorCode::invalid_argument);
  EXPECT_EQ(error_of([] { map_pages(SIZE_MAX - 10); }).code(), ErrorCode::out_of_memory);
  EXPECT_TRUE(unmap_pages(MappedPages{}));  // nothing to undo
  std::string error;
  MappedPages bogus;
  bogus.base = reinterpret_cast<void*>(uintptr_t{1});  // not page aligned: munmap refuses
  bogus.map_bytes = 4096;
  EXPECT_FALSE(unmap_pages(bogus, &error));
  EXPECT_NE(error.find("munmap failed"), std::string::npos);
}

TEST(Pages, ThreadCountFollowsSizeAndRequest) {
  EXPECT_EQ(prefault_thread_count(1, 8), 1);
  EXPECT_EQ(prefault_thread_count(size_t{64} << 20, 8), 2);
  EXPECT_EQ(prefault_thread_count(size_t{8} << 30, 8), 8);
  const int automatic = prefault_thread_count(size_t{64} << 30, 0);
  EXPECT_GE(automatic, 1);
  EXPECT_LE(automatic, 32);
}

TEST(Pages, EveryMethodMakesPagesResident) {
  const size_t quarter = size_t{2} << 20;
  MappedPages pages = map_pages(4 * quarter, MapOptions{.prefault = false});
  char* base = static_cast<char*>(pages.data);
  EXPECT_FALSE(prefault(base, quarter, 2, 0, PrefaultMethod::touch).populate_write);
  EXPECT_EQ(resident_pages(base, quarter), quarter / page_size());
  prefault(base + quarter, quarter, 2, 0, PrefaultMethod::populate);  // or a touch
  EXPECT_EQ(resident_pages(base + quarter, quarter), quarter / page_size());
  EXPECT_EQ(resident_pages(base + 2 * quarter, 2 * quarter), 0u);  // nothing else
  if (populate_for_write(base + 2 * quarter, quarter))
    EXPECT_EQ(resident_pages(base + 2 * quarter, quarter), quarter / page_size());
  EXPECT_TRUE(unmap_pages(pages));
}

// NUMA placement (MapOptions::numa_node): the range carries an MPOL_BIND policy before its
// first touch, asked of the kernel here by get_mempolicy(MPOL_F_ADDR) rather than through
// pinstage, and every page landed on the node. This machine has one node, so the policy,
// not a move between nodes, is what the test can see; a 2-socket host shows the rest.
TEST(Pages, ANumaNodeBindsTheRangeBeforeTheFirstTouch) {
  if (numa_node_cpus(0).empty()) GTEST_SKIP() << "no NUMA node 0 in sysfs";
  const size_t bytes = size_t{8} << 20;
  MappedPages pages = map_pages(bytes, MapOptions{.threads = 2, .numa_node = 0});
  int mode = -1;
  unsigned long mask[16] = {};
  ASSERT_EQ(syscall(SYS_get_mempolicy, &mode, mask, 1024 + 1, pages.data, 2 /*MPOL_F_ADDR*/), 0);
  EXPECT_EQ(mode, 2 /*MPOL_BIND*/);
  EXPECT_EQ(mask[0], 1ul);
  for (size_t off = 0; off < bytes; off += bytes / 8)
    EXPECT_EQ(numa_node_of(static_cast<char*>(pages.data) + off), 0);
  EXPECT_EQ(resident_pages(pages.data, bytes), bytes / page_size());
  EXPECT_TRUE(unmap_pages(pages));
  // Unplaced memory keeps the default policy: the check above can fail.
  MappedPages plain = map_pages(bytes, MapOptions{.prefault = false});
  ASSERT_EQ(syscall(SYS_get_mempolicy, &mode, mask, 1024 + 1, plain.data, 2), 0);
  EXPECT_EQ(mode, 0 /*MPOL_DEFAULT*/);
  EXPECT_TRUE(unmap_pages(plain));
}

TEST(Pages, AMissingNumaNodeIsRefusedAndNothingStaysMapped) {
  const Error e = test::error_of([] { map_pages(size_t{1} << 20, MapOptions{.numa_node = 999}); });
  EXPECT_EQ(e.code(), ErrorCode::invalid_argument);
  EXPECT_NE(std::string(e.what()).find("NUMA node 999"), std::string::npos) << e.what();
}

}  // namespace
}  // namespace pinstage
