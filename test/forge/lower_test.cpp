// lower_test — groups -> IR002: one kernel per group, every edge classified, fused edges never
// materialized, kernel inputs/outputs and cost sums, and refusal of inconsistent groups.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "crucible/forge/Passes.h"
#include "ir_fixture.h"

namespace crucible::forge {
namespace {

using test::IrFixture;
using test::one_class;
using test::rule;

// x, w (parameter) -> mm -> relu -> (live-out)      group 0 = {mm, relu}
//                          relu -> neg -> sum       group 1 = {neg}, group 2 = {sum}
struct Small {
  IrFixture f;
  std::uint32_t x, w, y, r, n, s;
  Small() {
    x = f.input({16, 8});
    w = f.input({8, 4}, record::ExternalKind::Parameter);
    y = f.op("aten::mm", CKernel::Gemm, {x, w}, {16, 4});
    r = f.op("aten::relu", CKernel::PointwiseUnary, {y}, {16, 4});
    n = f.op("aten::neg", CKernel::PointwiseUnary, {r}, {16, 4});
    s = f.op("aten::sum", CKernel::Reduce, {n, r}, {});
    f.done();
  }
  std::vector<FusionGroup> groups() const {
    std::vector<FusionGroup> g(3);
    g[0].id = 0;
    g[0].rule = "gemm_act";
    g[0].kernel = KernelTemplate::GemmEpilogue;
    g[0].recipe = recipe_by_name("f32_ordered");
    g[0].nodes = {0, 1};
    g[1].id = 1;
    g[1].nodes = {2};
    g[2].id = 2;
    g[2].nodes = {3};
    return g;
  }
};

TEST(Lower, OneKernelPerGroupEveryEdgeClassified) {
  Small t;
  PassContext ctx;
  auto p = lower(t.f.ir, t.groups(), ctx);
  ASSERT_TRUE(p.ok()) << p.status();
  ASSERT_EQ(p->kernels.size(), 3u);
  ASSERT_EQ(p->groups.size(), 3u);
  const KernelNode& k0 = p->kernels[0];
  EXPECT_EQ(k0.group, 0u);
  EXPECT_EQ(k0.kernel, KernelTemplate::GemmEpilogue);
  EXPECT_EQ(k0.recipe, recipe_by_name("f32_ordered"));
  EXPECT_EQ(k0.inputs, (std::vector<std::uint32_t>{t.x, t.w}));
  EXPECT_EQ(k0.outputs, (std::vector<std::uint32_t>{t.r}));  // y is fused: never written
  const Ir001& ir = t.f.ir;
  EXPECT_EQ(k0.flops, ir.nodes[0].flops + ir.nodes[1].flops);
  // Fused y: its write (by mm) and its read (by relu) are not memory traffic.
  EXPECT_EQ(k0.bytes, ir.nodes[0].bytes + ir.nodes[1].bytes - 2 * ir.values[t.y].nbytes);
  EXPECT_EQ(p->kernels[2].inputs, (std::vector<std::uint32_t>{t.n, t.r}));
  EXPECT_EQ(p->kernels[2].outputs, (std::vector<std::uint32_t>{t.s}));  // live-out

  // Every (node, input) has exactly one edge (value, its group): Fused iff same group.
  std::vector<std::uint32_t> group_of(ir.nodes.size());
  for (const FusionGroup& g : p->groups)
    for (std::uint32_t n : g.nodes) group_of[n] = g.id;
  std::set<std::pair<std::uint32_t, std::uint32_t>> want, got;
  for (std::uint32_t n = 0; n < ir.nodes.size(); ++n)
    for (std::uint32_t v : ir.nodes[n].inputs) want.insert({v, group_of[n]});
  for (const Edge& e : p->edges) {
    EXPECT_TRUE(got.insert({e.value, e.to_group}).second) << "duplicate edge v" << e.value;
    const std::uint32_t prod = ir.values[e.value].producer;
    const std::uint32_t from = prod == kNoNode ? UINT32_MAX : group_of[prod];
    EXPECT_EQ(e.from_group, from);
    EXPECT_EQ(e.state, from == e.to_group ? EdgeState::Fused : EdgeState::Materialized);
  }
  EXPECT_EQ(got, want);
  ASSERT_EQ(ctx.phases.size(), 1u);
  EXPECT_EQ(ctx.phases[0].name, "lower");
  EXPECT_EQ(ctx.phases[0].nodes_after, 3u);
}

TEST(Lower, FusedEdgesAreNeverMaterialized) {
  // The shipped cpu-avx2 rules over a layer with a residual: conv -> add -> relu -> conv.
  IrFixture f;
  const auto x = f.input({2, 4, 8, 8});
  const auto w = f.input({4, 4, 3, 3}, record::ExternalKind::Parameter);
  const auto c1 = f.op("aten::convolution", CKernel::Conv, {x, w}, {2, 4, 8, 8});
  const auto a = f.op("aten::add.Tensor", CKernel::PointwiseBinary, {c1, x}, {2, 4, 8, 8});
  const auto r = f.op("aten::relu", CKernel::PointwiseUnary, {a}, {2, 4, 8, 8});
  const auto c2 = f.op("aten::convolution", CKernel::Conv, {r, w}, {2, 4, 8, 8});
  f.op("aten::sigmoid", CKernel::PointwiseUnary, {c2}, {2, 4, 8, 8});
  f.done();
  auto rules = load_rules_dir(CRUCIBLE_RULES_DIR, "cpu-avx2");
  ASSERT_TRUE(rules.ok()) << rules.status();
  PassContext ctx;
  ctx.rules = &*rules;
  auto groups = fuse(f.ir, ctx);
  ASSERT_TRUE(groups.ok()) << groups.status();
  auto p = lower(f.ir, std::move(*groups), ctx);
  ASSERT_TRUE(p.ok()) << p.status();
  ASSERT_EQ(p->groups.size(), 2u);
  EXPECT_EQ(p->groups[0].rule, "cpu_conv_act");
  std::set<std::uint32_t> written, read;
  for (const KernelNode& k : p->kernels) {
    written.insert(k.outputs.begin(), k.outputs.end());
    read.insert(k.inputs.begin(), k.inputs.end());
  }
  std::size_t fused = 0;
  for (const Edge& e : p->edges) {
    if (e.state != EdgeState::Fused) continue;
    ++fused;
    EXPECT_FALSE(written.contains(e.value)) << "v" << e.value;
    EXPECT_FALSE(read.contains(e.value)) << "v" << e.value;
  }
  EXPECT_EQ(fused, 3u);  // c1, a, c2
  EXPECT_TRUE(written.contains(r));
}

TEST(Lower, RefusesInconsistentGroups) {
  Small t;
  PassContext ctx;
  auto g = t.groups();
  g[1].nodes = {1, 2};  // node 1 in two groups
  EXPECT_FALSE(lower(t.f.ir, g, ctx).ok());
  g = t.groups();
  g.pop_back();  // node 3 in none
  auto p = lower(t.f.ir, g, ctx);
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("node #3 aten::sum is in no group"), std::string::npos);
  g = t.groups();
  std::swap(g[1].nodes, g[2].nodes);  // sum's group before neg's, which it reads
  p = lower(t.f.ir, g, ctx);
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("later group"), std::string::npos) << p.status();
  g = t.groups();
  g[0].nodes = {0};
  g[1].nodes = {1, 2};
  g[2].nodes = {3};
  // relu's output r is fused into {relu, neg} and also read by sum: it escapes, so the kernel
  // stores it (an output) while neg's edge stays fused (Note [Escaping links] in Fuse.cpp).
  p = lower(t.f.ir, g, ctx);
  ASSERT_TRUE(p.ok()) << p.status();
  const auto& outs = p->kernels[1].outputs;
  EXPECT_NE(std::find(outs.begin(), outs.end(), t.r), outs.end());
  bool fused_r = false;
  for (const Edge& e : p->edges)
    fused_r |= e.value == t.r && e.to_group == 1 && e.state == EdgeState::Fused;
  EXPECT_TRUE(fused_r);
}

}  // namespace
}  // namespace crucible::forge
