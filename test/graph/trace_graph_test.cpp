// trace_graph_test.cpp — dataflow keyed by (storage, version), aliases, externals, CSR.
#include "crucible/graph/TraceGraph.h"

#include <gtest/gtest.h>

#include "synth.h"

namespace {
using namespace crucible::graph;
using synth::T;

TEST(TraceGraph, ChainHasForwardAndReverseEdges) {
  synth::Builder b;
  b.op("aten::relu", {T{1}}, {T{2}});
  b.op("aten::mm", {T{2}, T{3}}, {T{4}});
  b.op("aten::sum", {T{4}}, {T{5, 0, {}}});
  const auto ops = b.all();
  auto g = TraceGraph::build(b.trace, ops);
  ASSERT_EQ(g.num_nodes(), 3u);
  ASSERT_EQ(g.num_edges(), 2u);
  ASSERT_EQ(g.successors(0).size(), 1u);
  EXPECT_EQ(g.successors(0)[0].node, 1u);
  EXPECT_EQ(g.successors(0)[0].slot, 0u);
  ASSERT_EQ(g.predecessors(2).size(), 1u);
  EXPECT_EQ(g.predecessors(2)[0].node, 1u);
  EXPECT_EQ(g.predecessors(0).size(), 0u);
  // Externals: storage 1 (into relu) and 3 (second input of mm).
  ASSERT_EQ(g.externals().size(), 2u);
  EXPECT_EQ(g.externals()[0].storage_id, 1u);
  EXPECT_EQ(g.externals()[1].node, 1u);
  EXPECT_EQ(g.externals()[1].slot, 1u);
}

TEST(TraceGraph, ReusedAddressCreatesNoFalseEdge) {
  // The allocator hands storage 2 the address storage 1 had: a pointer-keyed graph would link
  // op 2 to op 0. Keyed by storage id, op 2 reads what op 1 wrote.
  synth::Builder b;
  b.op("aten::zeros", {}, {T{1, 0, {8}, 6, 0xdead00}});
  b.op("aten::ones", {}, {T{2, 0, {8}, 6, 0xdead00}});
  b.op("aten::neg", {T{2, 0, {8}, 6, 0xdead00}}, {T{3}});
  auto g = TraceGraph::build(b.trace, b.all());
  ASSERT_EQ(g.predecessors(2).size(), 1u);
  EXPECT_EQ(g.predecessors(2)[0].node, 1u);
  EXPECT_TRUE(g.successors(0).empty());
}

TEST(TraceGraph, InPlaceOpsProduceNewVersions) {
  synth::Builder b;
  b.op("aten::zeros", {}, {T{1, 0}});
  b.op("aten::add_", {T{1, 0}, T{9}}, {T{1, 1}});  // writes version 1
  b.op("aten::mul_", {T{1, 1}, T{9}}, {T{1, 2}});  // reads v1, writes v2
  b.op("aten::neg", {T{1, 2}}, {T{2}});
  auto g = TraceGraph::build(b.trace, b.all());
  EXPECT_EQ(g.predecessors(1)[0].node, 0u);
  EXPECT_EQ(g.predecessors(2)[0].node, 1u);
  ASSERT_EQ(g.predecessors(3).size(), 1u);
  EXPECT_EQ(g.predecessors(3)[0].node, 2u) << "neg reads version 2, written by mul_";
  EXPECT_EQ(g.predecessors(1)[0].kind, EdgeKind::DataFlow);
}

TEST(TraceGraph, ViewsAreAliasEdges) {
  synth::Builder b;
  b.op("aten::randn", {}, {T{1, 0, {4, 4}}});
  b.op("aten::t", {T{1, 0, {4, 4}}}, {T{1, 0, {4, 4}, 6, 0, true}});
  b.op("aten::mm", {T{1, 0, {4, 4}, 6, 0, true}, T{1, 0}}, {T{2}});
  auto g = TraceGraph::build(b.trace, b.all());
  ASSERT_EQ(g.predecessors(1).size(), 1u);
  EXPECT_EQ(g.predecessors(1)[0].kind, EdgeKind::Alias);
  // mm reads the view (last writer of storage 1 v0 is t) on both slots.
  ASSERT_EQ(g.predecessors(2).size(), 2u);
  for (const Edge& e : g.predecessors(2)) {
    EXPECT_EQ(e.node, 1u);
    EXPECT_EQ(e.kind, EdgeKind::DataFlow);
  }
}

TEST(TraceGraph, NodesKnowPhaseAndModule) {
  synth::Builder b;
  b.op("aten::addmm", {T{1}}, {T{2}}, crucible::record::Phase::Forward, "fc1");
  b.op("aten::mm", {T{2}}, {T{3}}, crucible::record::Phase::Backward);
  auto g = TraceGraph::build(b.trace, b.all());
  EXPECT_EQ(g.phase(0), crucible::record::Phase::Forward);
  EXPECT_EQ(g.phase(1), crucible::record::Phase::Backward);
  EXPECT_EQ(b.trace.module_path(g.module_id(0)), "fc1");
  EXPECT_EQ(g.module_id(1), 0u);
}

TEST(TraceGraph, SubsetOfOpsTreatsOutsideProducersAsExternal) {
  synth::Builder b;
  b.op("aten::relu", {T{1}}, {T{2}});
  b.op("aten::neg", {T{2}}, {T{3}});
  const std::vector<std::size_t> only_second{1};
  auto g = TraceGraph::build(b.trace, only_second);
  EXPECT_EQ(g.num_edges(), 0u);
  ASSERT_EQ(g.externals().size(), 1u);
  EXPECT_EQ(g.externals()[0].storage_id, 2u);
  EXPECT_EQ(g.trace_op(0), 1u);
}
}  // namespace
