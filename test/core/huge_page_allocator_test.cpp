// huge_page_allocator_test.cpp — big arrays are 2 MiB-aligned and behave as vectors; small
// ones and failures behave as std::allocator's.
#include "crucible/core/HugePageAllocator.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <vector>

namespace {
using crucible::HugePageAllocator;

TEST(HugePageAllocator, BigArraysAreHugePageAlignedAndKeepTheirContentsAcrossGrowth) {
  std::vector<std::uint64_t, HugePageAllocator<std::uint64_t>> v;
  std::vector<std::uint64_t> ref;
  for (std::uint64_t i = 0; i < (std::uint64_t{3} << 20) / 8 * 3; ++i) {  // grows past 2 MiB, twice
    v.push_back(i * 2654435761u);
    ref.push_back(i * 2654435761u);
  }
  ASSERT_GE(v.capacity() * sizeof(std::uint64_t), HugePageAllocator<std::uint64_t>::kHugePage);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(v.data()) % HugePageAllocator<std::uint64_t>::kHugePage, 0u);
  EXPECT_TRUE(std::equal(v.begin(), v.end(), ref.begin(), ref.end()));
  v.shrink_to_fit();  // a huge block handed back as one
  EXPECT_TRUE(std::equal(v.begin(), v.end(), ref.begin(), ref.end()));
}

TEST(HugePageAllocator, SmallArraysAreOrdinary) {
  std::vector<int, HugePageAllocator<int>> v(1000);
  std::iota(v.begin(), v.end(), 0);
  EXPECT_EQ(std::accumulate(v.begin(), v.end(), 0), 999 * 1000 / 2);
  auto copy = v;  // allocators compare equal: copies and moves mix freely
  EXPECT_EQ(copy, v);
}

TEST(HugePageAllocator, ImpossibleSizesThrow) {
  HugePageAllocator<std::uint64_t> a;
  EXPECT_THROW((void)a.allocate(SIZE_MAX / 4), std::bad_array_new_length);
  // Byte counts that fit in size_t but not once rounded up to whole huge pages.
  EXPECT_THROW((void)a.allocate(SIZE_MAX / sizeof(std::uint64_t)), std::bad_alloc);
}
}  // namespace
