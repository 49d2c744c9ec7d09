// fuse_horizontal_test — multi-tensor groups from horizontal rules on hand-built IR: a whole
// AdamW step in one group, where runs stop (a dependent member, a foreign op, another phase),
// and the shipped rules' groups lowered with their escaping state written once.
#include <gtest/gtest.h>

#include <algorithm>

#include "crucible/forge/Passes.h"
#include "ir_fixture.h"

namespace crucible::forge {
namespace {

using record::ExternalKind;
using record::Phase;
using test::IrFixture;
using test::one_class;
using test::rule;

// An op whose kind is the op table's (so kind steps and op steps see the same node).
std::uint32_t op(IrFixture& f, const std::string& name, std::vector<std::uint32_t> ins,
                 std::vector<std::int64_t> shape, Phase phase = Phase::Optimizer) {
  return f.op(name, classify_op(name).kind, std::move(ins), std::move(shape), phase);
}
// The same op writing its first input in place: the output is that storage's next version.
std::uint32_t in_place(IrFixture& f, const std::string& name, std::vector<std::uint32_t> ins,
                       Phase phase = Phase::Optimizer) {
  const Value& self = f.ir.values[ins[0]];
  std::vector<std::int64_t> shape;
  for (const Expr* e : self.shape) shape.push_back(e->value);
  const std::uint64_t storage = self.storage;
  const std::uint32_t version = self.version + 1;
  const std::uint32_t out = op(f, name, std::move(ins), shape, phase);
  f.ir.values[out].storage = storage;
  f.ir.values[out].version = version;
  return out;
}

struct Param {
  std::uint32_t p, g, m, v, step;
};

// One parameter's AdamW update as torch's per-parameter (non-foreach) loop records it.
void adamw_member(IrFixture& f, Param& x) {
  const auto step = in_place(f, "aten::add_.Tensor", {x.step});
  const auto p1 = in_place(f, "aten::mul_.Scalar", {x.p});
  const auto m1 = in_place(f, "aten::lerp_.Scalar", {x.m, x.g});
  const auto v1 = in_place(f, "aten::mul_.Scalar", {x.v});
  const auto v2 = in_place(f, "aten::addcmul_", {v1, x.g, x.g});
  f.node("aten::_local_scalar_dense", classify_op("aten::_local_scalar_dense").kind, {step}, {},
         Phase::Optimizer);
  std::vector<std::int64_t> shape;
  for (const Expr* e : f.ir.values[x.p].shape) shape.push_back(e->value);
  const auto s = op(f, "aten::sqrt", {v2}, shape);
  const auto d = op(f, "aten::div.Scalar", {s}, shape);
  const auto denom = in_place(f, "aten::add_.Scalar", {d});
  in_place(f, "aten::addcdiv_", {p1, m1, denom});
}

Param param(IrFixture& f, std::vector<std::int64_t> shape) {
  return Param{f.input(shape, ExternalKind::Parameter), f.input(shape, ExternalKind::Gradient),
               f.input(shape, ExternalKind::OptimizerState),
               f.input(shape, ExternalKind::OptimizerState),
               f.input({}, ExternalKind::OptimizerState)};
}

// Live-out as build_ir001 marks it for state: the last version of each external storage.
void mark_state_live_out(IrFixture& f) {
  for (Value& v : f.ir.values) {
    if (v.producer == kNoNode) continue;
    bool last = true;
    for (const Value& w : f.ir.values)
      last &= !(w.producer != kNoNode && w.storage == v.storage && w.version > v.version);
    bool external = false;
    for (const Value& w : f.ir.values) external |= w.producer == kNoNode && w.storage == v.storage;
    if (external && last) v.live_out = true;
  }
}

Result<Ir002> plan_of(const Ir001& ir, const RuleSet& rules) {
  PassContext ctx;
  ctx.rules = &rules;
  ctx.budget_micros = 1e12;
  auto seeded = fuse_horizontal(ir, ctx);
  if (!seeded.ok()) return seeded.status();
  auto groups = fuse(ir, ctx, std::move(*seeded));
  if (!groups.ok()) return groups.status();
  return lower(ir, std::move(*groups), ctx);
}

RuleSet shipped() {
  auto r = load_rules_dir(CRUCIBLE_RULES_DIR, "cpu-avx2");
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *r : RuleSet{};
}

TEST(FuseHorizontal, EveryParametersAdamWUpdateIsOneGroup) {
  IrFixture f;
  std::vector<Param> ps = {param(f, {64, 32}), param(f, {32}), param(f, {10, 64})};
  for (Param& x : ps) adamw_member(f, x);
  f.done();
  mark_state_live_out(f);
  const RuleSet rules = shipped();
  auto p = plan_of(f.ir, rules);
  ASSERT_TRUE(p.ok()) << p.status();
  ASSERT_EQ(p->groups.size(), 1u);
  const FusionGroup& g = p->groups[0];
  EXPECT_EQ(g.rule, "adamw_multi_tensor");
  EXPECT_EQ(g.kernel, KernelTemplate::Optimizer);
  EXPECT_EQ(g.nodes.size(), 30u);
  ASSERT_NE(g.recipe, nullptr);
  EXPECT_EQ(g.recipe->determinism, Determinism::BitexactStrict);  // per element: ATen's order
  // Written: each parameter, both moments and the step (the live-out state), nothing else.
  const KernelNode& k = p->kernels[0];
  EXPECT_EQ(k.outputs.size(), 4u * ps.size());
  for (std::uint32_t v : k.outputs) EXPECT_TRUE(f.ir.values[v].live_out) << "v" << v;
  // The updated first moment is both stored (state) and read by addcdiv_ from registers.
  const std::uint32_t m1 = f.ir.nodes[2].outputs[0];
  bool fused_m1 = false;
  for (const Edge& e : p->edges) fused_m1 |= e.value == m1 && e.state == EdgeState::Fused;
  EXPECT_TRUE(fused_m1);
  EXPECT_NE(std::find(k.outputs.begin(), k.outputs.end(), m1), k.outputs.end());
}

const std::string kHorizontalDefaults = rule("unary", "[\"POINTWISE_UNARY\"]", "pointwise_chain", 50) +
                              rule("binary", "[\"POINTWISE_BINARY\"]", "pointwise_chain", 50) +
                              rule("fallback", "[\"*\"]", "opaque", 0);
const std::string kTwoStep =
    rule("member", "[\"aten::mul_\", \"aten::add_\"]", "optimizer", 500, "horizontal = true\n");

std::string groups_of(const Ir002& p) {
  std::string s;
  for (const FusionGroup& g : p.groups) {
    if (!s.empty()) s += " | ";
    s += g.rule + ":";
    for (std::size_t i = 0; i < g.nodes.size(); ++i)
      s += (i ? "," : "") + std::to_string(g.nodes[i]);
  }
  return s;
}

TEST(FuseHorizontal, ARunStopsAtADependentMemberAForeignOpOrAnotherPhase) {
  const RuleSet rules = one_class(kHorizontalDefaults + kTwoStep);
  {  // three independent members: one group
    IrFixture f;
    for (int i = 0; i < 3; ++i) {
      const auto b = f.input({8}, ExternalKind::OptimizerState);
      const auto g = f.input({8}, ExternalKind::Gradient);
      in_place(f, "aten::add_.Tensor", {in_place(f, "aten::mul_.Scalar", {b}), g});
    }
    f.done();
    auto p = plan_of(f.ir, rules);
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_EQ(groups_of(*p), "member:0,1,2,3,4,5");
  }
  {  // the second member reads what the first wrote: a new group starts there
    IrFixture f;
    const auto b = f.input({8}, ExternalKind::OptimizerState);
    const auto g = f.input({8}, ExternalKind::Gradient);
    const auto b2 = in_place(f, "aten::add_.Tensor", {in_place(f, "aten::mul_.Scalar", {b}), g});
    in_place(f, "aten::add_.Tensor", {in_place(f, "aten::mul_.Scalar", {b2}), g});
    f.done();
    auto p = plan_of(f.ir, rules);
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_EQ(groups_of(*p), "member:0,1 | member:2,3");
  }
  {  // an op between members ends the run (members are consecutive nodes)
    IrFixture f;
    const auto b = f.input({8}, ExternalKind::OptimizerState);
    const auto c = f.input({8}, ExternalKind::OptimizerState);
    const auto g = f.input({8}, ExternalKind::Gradient);
    in_place(f, "aten::add_.Tensor", {in_place(f, "aten::mul_.Scalar", {b}), g});
    op(f, "aten::neg", {g}, {8});
    in_place(f, "aten::add_.Tensor", {in_place(f, "aten::mul_.Scalar", {c}), g});
    f.done();
    auto p = plan_of(f.ir, rules);
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_EQ(groups_of(*p), "member:0,1 | unary:2 | member:3,4");
  }
  {  // a member does not span two phases; `phases` limits where the rule applies
    const RuleSet opt_only = one_class(
        kHorizontalDefaults + rule("member", "[\"aten::mul_\", \"aten::add_\"]", "optimizer", 500,
                         "horizontal = true\nphases = [\"optimizer\"]\n"));
    IrFixture f;
    const auto b = f.input({8}, ExternalKind::OptimizerState);
    const auto c = f.input({8}, ExternalKind::OptimizerState);
    const auto g = f.input({8}, ExternalKind::Gradient);
    in_place(f, "aten::add_.Tensor", {in_place(f, "aten::mul_.Scalar", {b}, Phase::Backward), g});
    in_place(f, "aten::add_.Tensor",
             {in_place(f, "aten::mul_.Scalar", {c}, Phase::Backward), g}, Phase::Backward);
    f.done();
    auto p = plan_of(f.ir, rules);
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_EQ(groups_of(*p), "binary:0 | binary:1 | member:2,3");
    p = plan_of(f.ir, opt_only);
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_EQ(groups_of(*p), "binary:0 | binary:1 | binary:2 | binary:3");
  }
}

TEST(FuseHorizontal, ShippedSgdRulesTakeWeightDecayMomentumAndNesterov) {
  const RuleSet rules = shipped();
  for (int variant = 0; variant < 4; ++variant) {
    const bool momentum = variant & 1, decay = variant & 2;
    IrFixture f;
    std::size_t per_member = 0;
    for (int i = 0; i < 3; ++i) {
      const auto p = f.input({8, 4}, ExternalKind::Parameter);
      auto g = f.input({8, 4}, ExternalKind::Gradient);
      per_member = 1;
      if (decay) g = op(f, "aten::add.Tensor", {g, p}, {8, 4}), ++per_member;
      if (momentum) {
        const auto buf = f.input({8, 4}, ExternalKind::OptimizerState);
        g = in_place(f, "aten::add_.Tensor", {in_place(f, "aten::mul_.Scalar", {buf}), g});
        g = op(f, "aten::add.Tensor", {g, g}, {8, 4});  // nesterov
        per_member += 3;
      }
      in_place(f, "aten::add_.Tensor", {p, g});
    }
    f.done();
    mark_state_live_out(f);
    auto plan = plan_of(f.ir, rules);
    ASSERT_TRUE(plan.ok()) << plan.status();
    ASSERT_EQ(plan->groups.size(), 1u) << "variant " << variant << ": " << groups_of(*plan);
    EXPECT_EQ(plan->groups[0].rule, momentum ? "sgd_momentum_multi_tensor" : "sgd_multi_tensor");
    EXPECT_EQ(plan->groups[0].nodes.size(), 3 * per_member);
  }
}

TEST(FuseHorizontal, ZeroOfEveryGradientIsOneKernel) {
  IrFixture f;
  for (int i = 0; i < 5; ++i)
    in_place(f, "aten::zero_", {f.input({16, 4 + i}, ExternalKind::Gradient)}, Phase::Forward);
  f.done();
  const RuleSet rules = shipped();
  auto p = plan_of(f.ir, rules);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(groups_of(*p), "zero_grad_multi_tensor:0,1,2,3,4");
  EXPECT_EQ(p->kernels[0].outputs.size(), 5u);
}

TEST(FuseHorizontal, OverBudgetNothingIsGroupedHorizontally) {
  IrFixture f;
  for (int i = 0; i < 3; ++i) in_place(f, "aten::zero_", {f.input({8}, ExternalKind::Gradient)});
  f.done();
  const RuleSet rules = shipped();
  PassContext ctx;
  ctx.rules = &rules;
  ctx.budget_micros = 0;
  auto g = fuse_horizontal(f.ir, ctx);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_TRUE(g->empty());
  ASSERT_EQ(ctx.phases.size(), 1u);
  EXPECT_EQ(ctx.phases[0].name, "fuse_horizontal");
  EXPECT_TRUE(ctx.phases[0].over_budget);
}

}  // namespace
}  // namespace crucible::forge
