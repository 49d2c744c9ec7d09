// merkle_dag_test.cpp — content hashes: deterministic, address-free, sensitive to shape and
// dtype, identical for identical blocks.
#include "crucible/graph/MerkleDag.h"

#include <gtest/gtest.h>

#include "synth.h"

namespace {
using namespace crucible::graph;
using synth::T;
using crucible::record::Phase;

// A small MLP-like step. `base` shifts every storage id and address (another process).
synth::Builder mlp(std::uint64_t base, std::int64_t hidden = 16, std::int8_t dtype = 6) {
  synth::Builder b;
  auto S = [&](std::uint64_t s, std::vector<std::int64_t> shape, std::uint32_t v = 0) {
    return T{base + s, v, shape, dtype, (base + s) * 4096};
  };
  b.op("aten::t", {S(1, {hidden, 8})}, {S(1, {8, hidden})}, Phase::Forward, "fc1");
  b.op("aten::addmm", {S(2, {hidden}), S(3, {4, 8}), S(1, {8, hidden})}, {S(4, {4, hidden})}, Phase::Forward, "fc1", {1, 1});
  b.op("aten::relu", {S(4, {4, hidden})}, {S(5, {4, hidden})}, Phase::Forward, "act");
  b.op("aten::sum", {S(5, {4, hidden})}, {S(6, {})}, Phase::Forward);
  b.op("aten::ones_like", {S(6, {})}, {S(7, {})}, Phase::Backward);
  b.op("aten::expand", {S(7, {})}, {S(8, {4, hidden})}, Phase::Backward);
  return b;
}

MerkleDag dag_of(const synth::Builder& b) {
  const auto ops = b.all();
  return MerkleDag::build(b.trace, TraceGraph::build(b.trace, ops));
}

TEST(MerkleDag, SameComputationSameHashesWhateverTheAddresses) {
  auto a = dag_of(mlp(0));
  auto b = dag_of(mlp(1000));
  EXPECT_EQ(a.root(), b.root());
  for (std::size_t i = 0; i < a.num_nodes(); ++i) EXPECT_EQ(a.node_hash(i), b.node_hash(i));
  EXPECT_FALSE(a.root().is_zero());
}

TEST(MerkleDag, ShapeChangePropagatesDownstreamOnly) {
  auto a = dag_of(mlp(0, 16));
  auto b = dag_of(mlp(0, 32));
  EXPECT_NE(a.root(), b.root());
  for (std::size_t i = 0; i < a.num_nodes(); ++i) EXPECT_NE(a.node_hash(i), b.node_hash(i)) << i;
}

TEST(MerkleDag, DtypeChangeChangesTheHash) {
  EXPECT_NE(dag_of(mlp(0, 16, 6)).root(), dag_of(mlp(0, 16, 15)).root());
}

TEST(MerkleDag, ScalarArgumentsAreHashed) {
  auto a = mlp(0);
  auto b = mlp(0);
  b.trace.scalars[0].bits = 2;  // addmm's beta 1 -> 2
  EXPECT_NE(dag_of(a).root(), dag_of(b).root());
}

TEST(MerkleDag, UpstreamNodesKeepTheirHashWhenADownstreamOpChanges) {
  auto a = mlp(0);
  auto b = mlp(0);
  b.trace.schema_names[crucible::hash64("aten::gelu")] = "aten::gelu";
  b.trace.ops[2].schema_hash = crucible::hash64("aten::gelu");  // relu -> gelu
  auto da = dag_of(a), db = dag_of(b);
  EXPECT_EQ(da.node_hash(0), db.node_hash(0));
  EXPECT_EQ(da.node_hash(1), db.node_hash(1));
  for (std::size_t i = 2; i < da.num_nodes(); ++i) EXPECT_NE(da.node_hash(i), db.node_hash(i)) << i;
}

TEST(MerkleDag, IdenticalBlocksHaveIdenticalRegionHashes) {
  // Two identical blocks chained: node hashes differ (block 1 consumes block 0's output) but
  // the structural region hashes are equal; a third block with another width differs.
  synth::Builder b;
  auto block = [&](const std::string& name, std::uint64_t in, std::uint64_t w, std::uint64_t out, std::int64_t width) {
    b.op("aten::mm", {T{in, 0, {4, 8}}, T{w, 0, {8, width}}}, {T{out, 0, {4, width}}}, Phase::Forward, name + ".linear");
    b.op("aten::relu", {T{out, 0, {4, width}}}, {T{out + 1, 0, {4, width}}}, Phase::Forward, name + ".act");
    b.op("aten::add", {T{out + 1, 0, {4, width}}, T{in, 0, {4, 8}}}, {T{out + 2, 0, {4, width}}}, Phase::Forward, name);
  };
  block("blocks.0", 1, 2, 10, 8);
  block("blocks.1", 12, 3, 20, 8);
  block("blocks.2", 22, 4, 30, 16);
  auto d = dag_of(b);
  const Region *r0 = nullptr, *r1 = nullptr, *r2 = nullptr;
  for (const auto& r : d.regions()) {
    if (r.kind != RegionKind::Module) continue;
    if (r.module_path == "blocks.0") r0 = &r;
    if (r.module_path == "blocks.1") r1 = &r;
    if (r.module_path == "blocks.2") r2 = &r;
  }
  ASSERT_TRUE(r0 && r1 && r2);
  EXPECT_EQ(r0->end - r0->begin, 3u) << "a block's region holds its submodules' ops";
  EXPECT_EQ(r0->hash, r1->hash);
  EXPECT_NE(r0->hash, r2->hash);
  EXPECT_NE(d.node_hash(0), d.node_hash(3));
  // Phase regions exist and cover the nodes.
  std::size_t covered = 0;
  for (const auto& r : d.regions())
    if (r.kind == RegionKind::Phase) covered += r.end - r.begin;
  EXPECT_EQ(covered, d.num_nodes());
}
}  // namespace
