// The runtime's one allocation table: exact lookups, the one range check, reclaim.
#include <gtest/gtest.h>

#include <cstdint>

#include "runtime/allocation_table.h"

namespace pinstage::runtime {
namespace {

void* at(uintptr_t address) { return reinterpret_cast<void*>(address); }

TEST(AllocationTable, TracksEntriesPerKindWithTheirHandles) {
  AllocationTable table;
  int token = 0;
  EXPECT_TRUE(table.insert(EntryKind::device, {at(0x1000), 100, &token}));
  EXPECT_FALSE(table.insert(EntryKind::device, {at(0x1000), 5, nullptr}));  // no aliasing
  EXPECT_TRUE(
      table.insert(entry_kind(SourceKind::anonymous), {at(0x1000), 7, nullptr}));  // other kind
  EXPECT_EQ(table.bytes(EntryKind::device), 100u);
  EXPECT_EQ(table.count(entry_kind(SourceKind::anonymous)), 1u);
  const auto erased = table.erase(EntryKind::device, at(0x1000));
  ASSERT_TRUE(erased);
  EXPECT_EQ(erased->handle, &token);  // handed back exactly as the backend gave it
  EXPECT_FALSE(table.erase(EntryKind::device, at(0x1000)));                  // double free: unknown
  EXPECT_FALSE(table.erase(entry_kind(SourceKind::anonymous), at(0x1001)));  // interior pointer
  EXPECT_EQ(table.bytes(EntryKind::device), 0u);
}

TEST(AllocationTable, RangeCheckNeedsOneLiveAllocation) {
  AllocationTable table;
  table.insert(EntryKind::device, {at(0x1000), 0x100, nullptr});
  table.insert(EntryKind::device, {at(0x1100), 0x100, nullptr});  // adjacent
  EXPECT_TRUE(table.contains(EntryKind::device, at(0x1000), 0x100));
  EXPECT_TRUE(table.contains(EntryKind::device, at(0x10ff), 1));
  EXPECT_FALSE(table.contains(EntryKind::device, at(0x10ff), 2));  // spans two
  EXPECT_FALSE(table.contains(EntryKind::device, at(0xfff), 1));   // before the first
  EXPECT_FALSE(table.contains(EntryKind::device, at(0x1200), 1));  // after the last
  EXPECT_FALSE(table.contains(entry_kind(SourceKind::anonymous), at(0x1000), 1));
  EXPECT_FALSE(table.contains(EntryKind::device, at(0x1000), SIZE_MAX));  // no wrap
}

TEST(AllocationTable, TakeAllEmptiesOneKind) {
  AllocationTable table;
  table.insert(EntryKind::stream, {at(0x10), 0, nullptr});
  table.insert(EntryKind::stream, {at(0x20), 0, nullptr});
  table.insert(EntryKind::event, {at(0x30), 0, nullptr});
  EXPECT_EQ(table.take_all(EntryKind::stream).size(), 2u);
  EXPECT_EQ(table.count(EntryKind::stream), 0u);
  EXPECT_EQ(table.count(EntryKind::event), 1u);
  EXPECT_TRUE(table.has(EntryKind::event, at(0x30)));
}

}  // namespace
}  // namespace pinstage::runtime
