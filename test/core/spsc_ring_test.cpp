// spsc_ring_test.cpp — single-threaded behaviour of SpscRing: FIFO, full/empty, batches, wrap.
#include "crucible/core/SpscRing.h"

#include <gtest/gtest.h>

#include <array>
#include <vector>

namespace {
using crucible::SpscRing;

TEST(SpscRing, FifoUntilFullThenRefuses) {
  SpscRing<int> r(8);
  for (int i = 0; i < 8; ++i) EXPECT_TRUE(r.try_push(i));
  EXPECT_FALSE(r.try_push(99)) << "full ring refuses, nothing overwritten";
  EXPECT_EQ(r.size_approx(), 8u);
  for (int i = 0; i < 8; ++i) {
    int v = -1;
    ASSERT_TRUE(r.try_pop(v));
    EXPECT_EQ(v, i);
  }
  int v;
  EXPECT_FALSE(r.try_pop(v));
}

TEST(SpscRing, WrapsAroundManyTimes) {
  SpscRing<std::uint64_t> r(4);
  std::uint64_t next_in = 0, next_out = 0;
  for (int round = 0; round < 1000; ++round) {
    while (r.try_push(next_in)) ++next_in;
    std::uint64_t v;
    for (int k = 0; k < 3 && r.try_pop(v); ++k) EXPECT_EQ(v, next_out++);
  }
  std::uint64_t v;
  while (r.try_pop(v)) EXPECT_EQ(v, next_out++);
  EXPECT_EQ(next_in, next_out);
}

TEST(SpscRing, BatchPushIsPartialWhenNearlyFull) {
  SpscRing<int> r(8);
  std::array<int, 5> a{1, 2, 3, 4, 5};
  EXPECT_EQ(r.try_push_n(a), 5u);
  EXPECT_EQ(r.try_push_n(a), 3u) << "only 3 slots were free";
  std::array<int, 16> out{};
  EXPECT_EQ(r.try_pop_n(out), 8u);
  const int expect[8] = {1, 2, 3, 4, 5, 1, 2, 3};
  for (int i = 0; i < 8; ++i) EXPECT_EQ(out[i], expect[i]);
  EXPECT_EQ(r.try_pop_n(out), 0u);
}

struct alignas(64) Record {
  std::uint64_t words[8];
};
TEST(SpscRing, CarriesCacheLineRecordsIntact) {
  SpscRing<Record> r(16);
  for (std::uint64_t i = 0; i < 10; ++i) {
    Record rec;
    for (int w = 0; w < 8; ++w) rec.words[w] = i * 8 + w;
    ASSERT_TRUE(r.try_push(rec));
  }
  for (std::uint64_t i = 0; i < 10; ++i) {
    Record rec;
    ASSERT_TRUE(r.try_pop(rec));
    for (int w = 0; w < 8; ++w) EXPECT_EQ(rec.words[w], i * 8 + w);
  }
}

TEST(SpscRingDeathTest, NonPowerOfTwoCapacityIsAContractViolation) {
#if CRUCIBLE_CONTRACT_SEMANTIC == 2
  EXPECT_DEATH(SpscRing<int> r(6), "power of two");
#else
  GTEST_SKIP() << "contracts are not enforced in this build";
#endif
}
}  // namespace
