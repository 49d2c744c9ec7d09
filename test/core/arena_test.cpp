// arena_test.cpp — bump allocation, alignment, oversize blocks, reset reuse.
#include "crucible/core/Arena.h"

#include <gtest/gtest.h>

#include <cstring>
#include <set>

namespace {
using crucible::Arena;

TEST(Arena, AllocationsAreAlignedAndDisjoint) {
  Arena a(1024);
  std::vector<std::pair<std::uintptr_t, std::size_t>> spans;
  for (std::size_t i = 1; i <= 500; ++i) {
    std::size_t align = std::size_t{1} << (i % 7);  // 1..64
    std::size_t n = (i * 37) % 300 + 1;
    auto* p = static_cast<unsigned char*>(a.allocate(n, align));
    ASSERT_EQ(reinterpret_cast<std::uintptr_t>(p) % align, 0u);
    std::memset(p, static_cast<int>(i), n);  // ASan flags any out-of-block write
    spans.emplace_back(reinterpret_cast<std::uintptr_t>(p), n);
  }
  std::sort(spans.begin(), spans.end());
  for (std::size_t i = 1; i < spans.size(); ++i)
    EXPECT_LE(spans[i - 1].first + spans[i - 1].second, spans[i].first);
}

TEST(Arena, ContentSurvivesLaterAllocations) {
  Arena a(256);
  int* xs = a.allocate_array<int>(10);
  for (int i = 0; i < 10; ++i) xs[i] = i * i;
  for (int k = 0; k < 100; ++k) (void)a.allocate(200, 8);  // forces many new blocks
  for (int i = 0; i < 10; ++i) EXPECT_EQ(xs[i], i * i);
}

TEST(Arena, OversizeRequestGetsItsOwnBlock) {
  Arena a(1024);
  (void)a.allocate(16);
  void* big = a.allocate(1 << 20, 64);
  std::memset(big, 0xAB, 1 << 20);
  EXPECT_GE(a.bytes_reserved(), std::size_t{1} << 20);
  EXPECT_EQ(a.bytes_allocated(), 16u + (1u << 20));
}

TEST(Arena, ResetKeepsOneBlockAndReusesIt) {
  Arena a(4096);
  for (int i = 0; i < 20; ++i) (void)a.allocate(1000);
  EXPECT_GT(a.block_count(), 1u);
  a.reset();
  EXPECT_EQ(a.block_count(), 1u);
  EXPECT_EQ(a.bytes_allocated(), 0u);
  const auto reserved = a.bytes_reserved();
  (void)a.allocate(100);
  EXPECT_EQ(a.bytes_reserved(), reserved) << "steady-state reuse allocates no new block";
}

TEST(Arena, MakeConstructs) {
  struct P { int x; double y; };
  Arena a;
  P* p = a.make<P>(P{3, 4.5});
  EXPECT_EQ(p->x, 3);
  EXPECT_EQ(p->y, 4.5);
}

TEST(Arena, ImpossibleSizeThrowsBadAlloc) {
  Arena a;
  EXPECT_THROW((void)a.allocate(SIZE_MAX - 8, 8), std::bad_alloc);
}

TEST(Arena, MoveTransfersOwnership) {
  Arena a(512);
  int* x = a.make<int>(42);
  Arena b(std::move(a));
  EXPECT_EQ(*x, 42);
  EXPECT_EQ(a.block_count(), 0u);
  EXPECT_EQ(b.block_count(), 1u);
}
}  // namespace
