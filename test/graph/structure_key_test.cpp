// structure_key_test.cpp — the structure key (record/Trace.h) against the analyses it stands
// for: renamed runs of one step get one key, and ops whose graph, DAG or plan differ never
// share a key. The pipeline republishes an analysis on a key match, so the second half is
// what keeps that correct.
#include <gtest/gtest.h>

#include <random>

#include "crucible/graph/Analysis.h"
#include "synth.h"

namespace {
using namespace crucible;
using namespace crucible::graph;
using record::ExternalKind;
using record::Phase;
using synth::T;

// How one step is wired: for each op, which earlier value each of its two inputs reads
// (-1: the parameter, -2: the batch input, k >= 0: op k's output), plus the knobs a change
// of program would turn.
struct Shape {
  std::vector<std::array<int, 2>> reads;
  std::vector<std::int64_t> width;   // per op: the output's second dimension
  std::int64_t alpha = 1;            // a scalar argument of every op
  ExternalKind input_kind = ExternalKind::Input;
};

// Records one step of `s`. `rename` moves every storage id, version and address, as another
// run of the same step would.
synth::Builder step(const Shape& s, std::uint64_t rename) {
  synth::Builder b;
  const std::uint64_t param = 7 + rename * 1000, input = 8 + rename * 1000;
  const std::uint32_t pv = static_cast<std::uint32_t>(3 * rename);  // the parameter's version
  auto value = [&](int src) -> T {
    if (src == -1) return T{param, pv, {8, 8}, 6, param * 64};
    if (src == -2) return T{input, 0, {8, 8}, 6, input * 64};
    const auto k = static_cast<std::size_t>(src);
    return T{100 + k + rename * 1000, 0, {8, s.width[k]}, 6, (100 + k + rename * 1000) * 64};
  };
  for (std::size_t op = 0; op < s.reads.size(); ++op) {
    T out{100 + op + rename * 1000, 0, {8, s.width[op]}, 6, (100 + op + rename * 1000) * 64};
    b.op(op % 2 ? "aten::mul" : "aten::add", {value(s.reads[op][0]), value(s.reads[op][1])}, {out},
         op < s.reads.size() / 2 ? Phase::Forward : Phase::Backward, op % 3 ? "block" : "", {s.alpha});
  }
  // The optimizer updates the parameter in place: a new version of its storage.
  b.op("aten::add_", {T{param, pv, {8, 8}, 6, param * 64}, value(static_cast<int>(s.reads.size()) - 1)},
       {T{param, pv + 1, {8, 8}, 6, param * 64}}, Phase::Optimizer);
  b.trace.externals[param] = ExternalKind::Parameter;
  b.trace.externals[input] = s.input_kind;
  return b;
}

// What a user of the analysis can observe, storage ids aside.
struct Observed {
  ContentHash root;
  std::vector<ContentHash> regions;
  std::uint64_t arena, lower_bound, persistent;
  std::size_t edges, externals;
  bool operator==(const Observed&) const = default;
};

Observed analyse(const synth::Builder& b) {
  auto it = build_iteration(b.trace, b.all());
  Observed o{it->dag.root(), {}, it->plan->arena_bytes, it->plan->lower_bound, it->plan->persistent_bytes,
             it->graph.num_edges(), it->graph.externals().size()};
  for (const auto& r : it->dag.regions()) o.regions.push_back(r.hash);
  return o;
}

ContentHash key(const synth::Builder& b) { return record::structure_key(b.trace, b.all()); }

Shape chain(int n) {
  Shape s;
  s.reads.push_back({-2, -1});
  s.width.push_back(8);
  for (int i = 1; i < n; ++i) {
    s.reads.push_back({i - 1, -1});
    s.width.push_back(8);
  }
  return s;
}

TEST(StructureKey, RenamedRunsOfOneStepShareTheKey) {
  const Shape s = chain(6);
  EXPECT_EQ(key(step(s, 0)), key(step(s, 1)));
  EXPECT_EQ(key(step(s, 0)), key(step(s, 17)));
  EXPECT_EQ(analyse(step(s, 0)), analyse(step(s, 17)));
}

TEST(StructureKey, EachKindOfChangeGivesAnotherKey) {
  const Shape s = chain(6);
  const ContentHash k = key(step(s, 0));
  Shape rewired = s;  // op 4 reads op 2's output instead of op 3's: same shapes, other wiring
  rewired.reads[4][0] = 2;
  EXPECT_NE(key(step(rewired, 0)), k);
  EXPECT_NE(analyse(step(rewired, 0)), analyse(step(s, 0)));
  Shape wider = s;
  wider.width[5] = 16;
  EXPECT_NE(key(step(wider, 0)), k);
  Shape scaled = s;
  scaled.alpha = 2;
  EXPECT_NE(key(step(scaled, 0)), k);
  Shape constant = s;
  constant.input_kind = ExternalKind::Constant;
  EXPECT_NE(key(step(constant, 0)), k);
}

TEST(StructureKey, ReadingAStaleVersionIsAnotherStructure) {
  // Op 1 reads the parameter after the optimizer's in-place update in one trace and before it
  // in the other: one storage, another version, another producer.
  synth::Builder a, b;
  for (synth::Builder* x : {&a, &b}) {
    x->op("aten::add_", {T{1, 0}, T{2, 0}}, {T{1, 1}}, Phase::Optimizer);
    x->op("aten::relu", {T{1, x == &a ? 1u : 0u}}, {T{3, 0}});
    x->trace.externals[1] = ExternalKind::Parameter;
  }
  EXPECT_NE(key(a), key(b));
  EXPECT_NE(analyse(a), analyse(b));
}

TEST(StructureKey, OneStorageReadTwiceIsNotTwoStorages) {
  // Two never-produced inputs: the same storage twice, or two storages of one shape. The plan
  // counts persistent bytes per storage, so the two differ.
  synth::Builder same, two;
  same.op("aten::add", {T{1}, T{1}}, {T{3}});
  two.op("aten::add", {T{1}, T{2}}, {T{3}});
  EXPECT_NE(key(same), key(two));
  EXPECT_NE(analyse(same).persistent, analyse(two).persistent);
}

// The property the pipeline relies on, over random programs: whenever two steps share a key
// their analyses are equal, and a renamed step always shares its original's key.
TEST(StructureKey, EqualKeysMeanEqualAnalysesOverRandomPrograms) {
  std::mt19937 rng(12345);
  std::vector<std::pair<ContentHash, Observed>> seen;
  int shared = 0;
  for (int trial = 0; trial < 300; ++trial) {
    const int n = 2 + static_cast<int>(rng() % 5);
    Shape s;
    for (int i = 0; i < n; ++i) {
      std::array<int, 2> r{};
      for (int& src : r) src = static_cast<int>(rng() % static_cast<unsigned>(i + 2)) - 2;  // -2..i-1
      s.reads.push_back(r);
      s.width.push_back(8);  // one shape everywhere: wiring alone tells programs apart
    }
    s.alpha = static_cast<std::int64_t>(rng() % 2);
    const ContentHash k = key(step(s, 0));
    const Observed o = analyse(step(s, 0));
    ASSERT_EQ(key(step(s, 1 + trial)), k) << "a renamed run got another key, trial " << trial;
    for (const auto& [k2, o2] : seen) {
      if (k2 != k) continue;
      ++shared;
      ASSERT_EQ(o2, o) << "two programs share a key but not their analysis, trial " << trial;
    }
    seen.emplace_back(k, o);
  }
  EXPECT_GT(shared, 0) << "small random programs repeat: the check above must have run";
}

}  // namespace
