// arena_placement_test — the one lifetime planner: no two blocks live at one step overlap (brute
// force over all pairs), greedy by size and time order alike; known answers on small cases; and
// overlapping_pair finds a planted overlap.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "crucible/graph/ArenaPlacement.h"

namespace crucible::graph {
namespace {

// The pair (i, j) of blocks live together and overlapping, or (-1, -1); by brute force.
std::pair<int, int> brute_overlap(const std::vector<Lifetime>& b,
                                  const std::vector<std::uint64_t>& off) {
  for (std::size_t i = 0; i < b.size(); ++i)
    for (std::size_t j = i + 1; j < b.size(); ++j) {
      const bool together = b[i].first <= b[j].last && b[j].first <= b[i].last;
      const bool overlap = off[i] < off[j] + b[j].bytes && off[j] < off[i] + b[i].bytes;
      if (together && overlap) return {static_cast<int>(i), static_cast<int>(j)};
    }
  return {-1, -1};
}

TEST(ArenaPlacement, KnownAnswers) {
  // a [0,1] 64 B, b [1,2] 128 B, c [2,3] 64 B: b first at 0, a and c above it at 128 (they do
  // not live together, so they share it).
  const std::vector<Lifetime> blocks = {{64, 0, 1}, {128, 1, 2}, {64, 2, 3}};
  const ArenaPlacement p = place_in_arena(blocks);
  EXPECT_TRUE(p.first_fit);
  EXPECT_EQ(p.offsets, (std::vector<std::uint64_t>{128, 0, 128}));
  EXPECT_EQ(p.arena_bytes, 192u);
  // Time order: a at 0, b at 64 (a is still live), a freed after step 1, c at 0.
  const ArenaPlacement t = place_in_arena(blocks, 0);
  EXPECT_FALSE(t.first_fit);
  EXPECT_EQ(t.offsets, (std::vector<std::uint64_t>{0, 64, 0}));
  EXPECT_EQ(t.arena_bytes, 192u);
  EXPECT_EQ(place_in_arena(std::vector<Lifetime>{}).arena_bytes, 0u);
}

TEST(ArenaPlacement, RandomLifetimesNeverOverlapWhileLiveTogether) {
  std::mt19937 rng(11);
  for (int trial = 0; trial < 400; ++trial) {
    std::vector<Lifetime> blocks(1 + rng() % 60);
    std::uint64_t total = 0;
    for (Lifetime& b : blocks) {
      b.bytes = 64 * (1 + rng() % 16);
      b.first = static_cast<std::uint32_t>(rng() % 40);
      b.last = b.first + static_cast<std::uint32_t>(rng() % 10);
      total += b.bytes;
    }
    for (std::uint64_t visits : {kDefaultFirstFitVisits, std::uint64_t{0}, std::uint64_t{50}}) {
      const ArenaPlacement p = place_in_arena(blocks, visits);
      ASSERT_EQ(p.offsets.size(), blocks.size());
      EXPECT_EQ(brute_overlap(blocks, p.offsets), std::make_pair(-1, -1)) << "trial " << trial;
      EXPECT_FALSE(overlapping_pair(blocks, p.offsets).has_value());
      std::uint64_t top = 0;
      for (std::size_t i = 0; i < blocks.size(); ++i) {
        EXPECT_EQ(p.offsets[i] % 64, 0u);
        top = std::max(top, p.offsets[i] + blocks[i].bytes);
      }
      EXPECT_EQ(p.arena_bytes, top);
      EXPECT_LE(p.arena_bytes, total);
    }
  }
}

TEST(ArenaPlacement, OverlappingPairFindsAPlantedOverlap) {
  const std::vector<Lifetime> blocks = {{64, 0, 2}, {64, 3, 4}, {128, 1, 1}};
  // 0 and 1 never live together: the same offset is fine. 2 lives with 0 and overlaps it.
  const auto bad = overlapping_pair(blocks, std::vector<std::uint64_t>{0, 0, 32});
  ASSERT_TRUE(bad.has_value());
  EXPECT_EQ(*bad, std::make_pair(std::uint32_t{0}, std::uint32_t{2}));
  EXPECT_FALSE(overlapping_pair(blocks, std::vector<std::uint64_t>{0, 0, 64}).has_value());
}

}  // namespace
}  // namespace crucible::graph
