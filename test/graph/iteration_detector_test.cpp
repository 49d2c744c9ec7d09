// iteration_detector_test.cpp — boundaries from signatures on synthetic sequences.
#include "crucible/graph/IterationDetector.h"

#include <gtest/gtest.h>

#include <random>

namespace {
using namespace crucible::graph;
using Seq = std::vector<std::uint64_t>;

Seq repeat(const Seq& block, int n) {
  Seq s;
  for (int i = 0; i < n; ++i) s.insert(s.end(), block.begin(), block.end());
  return s;
}
Seq cat(Seq a, const Seq& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

TEST(IterationDetector, PlainLoop) {
  const Seq s = repeat({10, 11, 12, 11, 13}, 4);  // 11 occurs twice per iteration
  auto r = detect_iterations(s);
  ASSERT_TRUE(r.periodic) << r.reason;
  EXPECT_EQ(r.period_ops, 5u);
  EXPECT_EQ(r.segments.size(), 4u);
  EXPECT_EQ(r.steady_count(), 4u);
  EXPECT_FALSE(r.first_differs);
  for (const auto& sg : r.segments) EXPECT_EQ(sg.end - sg.begin, 5u);
}

TEST(IterationDetector, FirstIterationDiffers) {
  // The first step creates optimizer state: an extra op, and one op replaced.
  const Seq s = cat({10, 11, 12, 20, 21, 13}, repeat({10, 11, 12, 22, 13}, 3));
  auto r = detect_iterations(s);
  ASSERT_TRUE(r.periodic) << r.reason;
  EXPECT_TRUE(r.first_differs);
  EXPECT_EQ(r.segments.size(), 4u);
  EXPECT_EQ(r.steady_count(), 3u);
  EXPECT_EQ(r.segments[0].end - r.segments[0].begin, 6u);
  EXPECT_EQ(r.period_ops, 5u);
  EXPECT_EQ(r.last_steady(), 3);
}

TEST(IterationDetector, OpEveryThirdIteration) {
  // A logging op (99) every third step: the repeating block is 3 iterations long, but the
  // iterations are still found, with the variant reported.
  const Seq three = cat(repeat({10, 11, 12}, 2), Seq{10, 11, 12, 99});
  const Seq s = repeat(three, 3);
  auto r = detect_iterations(s);
  ASSERT_TRUE(r.periodic) << r.reason;
  EXPECT_EQ(r.segments.size(), 9u);
  EXPECT_EQ(r.steady_count(), 6u);
  EXPECT_EQ(r.variant_every, 3);
  EXPECT_EQ(r.period_ops, 3u);
}

TEST(IterationDetector, PrologueAndPartialTail) {
  const Seq s = cat(cat({1, 2}, repeat({10, 11, 12, 13}, 3)), Seq{10, 11});
  auto r = detect_iterations(s);
  ASSERT_TRUE(r.periodic) << r.reason;
  EXPECT_EQ(r.prologue_ops, 2u);
  EXPECT_EQ(r.steady_count(), 3u);
  EXPECT_EQ(r.segments.back().end, 14u) << "the 2 ops of an unfinished iteration are not one";
}

TEST(IterationDetector, NonPeriodicIsReportedNotGuessed) {
  std::mt19937_64 rng(7);
  Seq s(500);
  for (auto& x : s) x = rng();
  auto r = detect_iterations(s);
  EXPECT_FALSE(r.periodic);
  EXPECT_NE(r.reason.find("not periodic"), std::string::npos);
  EXPECT_TRUE(r.segments.empty());
  auto tiny = detect_iterations(Seq{1});
  EXPECT_FALSE(tiny.periodic);
}

TEST(IterationDetector, ShapeThatChangesEveryStepIsNotPeriodic) {
  // A loop whose input length grows every step: same ops, different shapes, so different
  // signatures in every iteration. It must not be cut into "iterations".
  Seq s;
  for (std::uint64_t step = 0; step < 20; ++step) s = cat(s, Seq{10, 1000 + step, 12});
  auto r = detect_iterations(s);
  EXPECT_FALSE(r.periodic);
  EXPECT_NE(r.reason.find("not periodic"), std::string::npos);
}

// A loaded trace's ops can be crafted (ops with no tensors are 64 bytes each), so detection
// must stay near-linear on sequences built against its search. Each of these took time
// quadratic in k before (a hash per improving anchor, every candidate's segments hashed in
// full, a linear search over the prologue's kinds): about 10^9 steps at k = 40000 by a count
// of the old code, against 52 ms for all three now (release). Time is not asserted; what is
// detected is.
TEST(IterationDetector, CraftedSequencesStayNearLinear) {
  constexpr std::uint64_t k = 40000;
  {  // a prologue u_k .. u_1, then u_1 .. u_k twice: each u_i anchors earlier than the last
    Seq s;
    for (std::uint64_t i = k; i >= 1; --i) s.push_back(1000 + i);
    for (int rep = 0; rep < 2; ++rep)
      for (std::uint64_t i = 1; i <= k; ++i) s.push_back(1000 + i);
    const auto r = detect_iterations(s);
    ASSERT_TRUE(r.periodic) << r.reason;
    EXPECT_EQ(r.period_ops, k);
    EXPECT_GE(r.steady_count(), 1u);
  }
  {  // A x1 A x2 .. A xk, twice: A occurs k times and cuts the block into k kinds
    Seq block;
    for (std::uint64_t i = 1; i <= k; ++i) {
      block.push_back(7);
      block.push_back(100000 + i);
    }
    const auto r = detect_iterations(repeat(block, 2));
    ASSERT_TRUE(r.periodic) << r.reason;
    EXPECT_EQ(r.period_ops, 2 * k);
    EXPECT_EQ(r.steady_count(), 1u);
  }
  {  // a prologue A y1 A y2 .. A yk (each segment its own kind), then A B C, m times
    constexpr std::uint64_t m = 30000;  // the loop covers more than a third of the sequence
    Seq s;
    for (std::uint64_t i = 1; i <= k; ++i) {
      s.push_back(7);
      s.push_back(200000 + i);
    }
    s = cat(s, repeat({7, 8, 9}, static_cast<int>(m)));
    const auto r = detect_iterations(s);
    ASSERT_TRUE(r.periodic) << r.reason;
    EXPECT_EQ(r.period_ops, 3u);
    EXPECT_EQ(r.steady_count(), m);
    EXPECT_TRUE(r.first_differs);
    EXPECT_EQ(r.segments.size(), k + m);
  }
}

}  // namespace
