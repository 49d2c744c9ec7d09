// fuse_test — rule-driven fusion on hand-built IR: rule order (priority, then id), optional steps,
// the single-consumer rule, applicability (mode, capabilities, rows, differs opt-in, settings),
// hard errors, the budget fallback, determinism, and valid group order on random graphs.
#include <gtest/gtest.h>

#include <random>

#include "crucible/forge/Passes.h"
#include "ir_fixture.h"

namespace crucible::forge {
namespace {

using record::Phase;
using test::IrFixture;
using test::one_class;
using test::rule;

Result<std::vector<FusionGroup>> run_fuse(const Ir001& ir, const RuleSet& rules, Policy policy = {},
                                          double budget = 1e9) {
  PassContext ctx;
  ctx.rules = &rules;
  ctx.policy = std::move(policy);
  ctx.budget_micros = budget;
  return fuse(ir, ctx);
}

// "rule:n0,n1 | rule:n2" — what the tests compare.
std::string shape_of(const std::vector<FusionGroup>& groups) {
  std::string s;
  for (const FusionGroup& g : groups) {
    if (!s.empty()) s += " | ";
    s += g.rule + ":";
    for (std::size_t i = 0; i < g.nodes.size(); ++i)
      s += (i ? "," : "") + std::to_string(g.nodes[i]);
  }
  return s;
}

const std::string kDefaults = rule("gemm", "[\"GEMM\"]", "gemm_epilogue", 100) +
                              rule("unary", "[\"POINTWISE_UNARY\"]", "pointwise_chain", 50) +
                              rule("binary", "[\"POINTWISE_BINARY\"]", "pointwise_chain", 50) +
                              rule("fallback", "[\"*\"]", "opaque", 0);

// x -> addmm -> add(bias) -> relu -> live-out
void mlp_layer(IrFixture& f) {
  const auto x = f.input({32, 64});
  const auto w = f.input({64, 16}, record::ExternalKind::Parameter);
  const auto b = f.input({16}, record::ExternalKind::Parameter);
  const auto y = f.op("aten::mm", CKernel::Gemm, {x, w}, {32, 16});
  const auto z = f.op("aten::add.Tensor", CKernel::PointwiseBinary, {y, b}, {32, 16});
  f.op("aten::relu", CKernel::PointwiseUnary, {z}, {32, 16});
  f.done();
}

TEST(Fuse, OptionalStepsAreTakenWhenTheyMatch) {
  IrFixture f;
  mlp_layer(f);
  const RuleSet rs = one_class(
      kDefaults + rule("gemm_act", "[\"GEMM\", \"POINTWISE_BINARY?\", \"POINTWISE_UNARY\"]",
                       "gemm_epilogue", 300));
  auto g = run_fuse(f.ir, rs);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(shape_of(*g), "gemm_act:0,1,2");
  EXPECT_EQ((*g)[0].kernel, KernelTemplate::GemmEpilogue);
  EXPECT_EQ((*g)[0].recipe, recipe_by_name("f32_ordered"));
  EXPECT_EQ((*g)[0].id, 0u);

  // Without the add, the optional step is skipped.
  IrFixture h;
  const auto x = h.input({8, 8});
  const auto y = h.op("aten::mm", CKernel::Gemm, {x, x}, {8, 8});
  h.op("aten::relu", CKernel::PointwiseUnary, {y}, {8, 8});
  h.done();
  auto g2 = run_fuse(h.ir, rs);
  ASSERT_TRUE(g2.ok()) << g2.status();
  EXPECT_EQ(shape_of(*g2), "gemm_act:0,1");
}

TEST(Fuse, PriorityThenIdDecides) {
  IrFixture f;
  mlp_layer(f);
  // Equal priority: the smaller id wins, whatever the file order.
  const RuleSet tie = one_class(
      kDefaults + rule("zz_gemm_bias", "[\"GEMM\", \"POINTWISE_BINARY\"]", "gemm_epilogue", 300) +
      rule("aa_gemm_bias", "[\"GEMM\", \"POINTWISE_BINARY\"]", "gemm_epilogue", 300));
  auto g = run_fuse(f.ir, tie);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(shape_of(*g), "aa_gemm_bias:0,1 | unary:2");
  // A higher priority wins over a smaller id.
  const RuleSet prio = one_class(
      kDefaults + rule("aa_gemm_bias", "[\"GEMM\", \"POINTWISE_BINARY\"]", "gemm_epilogue", 300) +
      rule("zz_gemm_bias_act", "[\"GEMM\", \"POINTWISE_BINARY\", \"POINTWISE_UNARY\"]",
           "gemm_epilogue", 310));
  g = run_fuse(f.ir, prio);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(shape_of(*g), "zz_gemm_bias_act:0,1,2");
  // Single-op defaults only: one group per node.
  g = run_fuse(f.ir, one_class(kDefaults));
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(shape_of(*g), "gemm:0 | binary:1 | unary:2");
}

TEST(Fuse, OpNameStepsMatchWithOrWithoutOverload) {
  IrFixture f;
  mlp_layer(f);
  const RuleSet rs =
      one_class(kDefaults + rule("by_name", "[\"aten::mm\", \"aten::add\", \"aten::relu\"]",
                                 "gemm_epilogue", 300));
  auto g = run_fuse(f.ir, rs);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(shape_of(*g), "by_name:0,1,2");
  const RuleSet other = one_class(
      kDefaults + rule("by_name", "[\"aten::mm\", \"aten::add.Scalar\"]", "gemm_epilogue", 300));
  g = run_fuse(f.ir, other);
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(shape_of(*g), "gemm:0 | binary:1 | unary:2");
}

TEST(Fuse, AChainGrowsThroughEscapingValuesWhoseOtherReadersRunLater) {
  const RuleSet rs = one_class(
      kDefaults + rule("gemm_act", "[\"GEMM\", \"POINTWISE_UNARY\"]", "gemm_epilogue", 300));
  {  // mm's output also read by a later node: the group stores it (Note [Escaping links])
    IrFixture f;
    const auto x = f.input({8, 8});
    const auto y = f.op("aten::mm", CKernel::Gemm, {x, x}, {8, 8});
    f.op("aten::relu", CKernel::PointwiseUnary, {y}, {8, 8});
    f.op("aten::neg", CKernel::PointwiseUnary, {y}, {8, 8});
    f.done();
    auto g = run_fuse(f.ir, rs);
    ASSERT_TRUE(g.ok());
    EXPECT_EQ(shape_of(*g), "gemm_act:0,1 | unary:2");
  }
  {  // ... but not past a reader that runs before the grown node: (a) of Note [Group placement]
    IrFixture f;
    const auto x = f.input({8, 8});
    const auto y = f.op("aten::mm", CKernel::Gemm, {x, x}, {8, 8});
    f.op("aten::mm", CKernel::Gemm, {y, y}, {8, 8});
    f.op("aten::relu", CKernel::PointwiseUnary, {y}, {8, 8});
    f.done();
    auto g = run_fuse(f.ir, rs);
    ASSERT_TRUE(g.ok());
    EXPECT_EQ(shape_of(*g), "gemm:0 | gemm:1 | unary:2");
  }
  {  // a rule with escaping = false keeps the single-reader chain
    const RuleSet strict = one_class(
        kDefaults + rule("gemm_act", "[\"GEMM\", \"POINTWISE_UNARY\"]", "gemm_epilogue", 300,
                         "escaping = false\n"));
    IrFixture f;
    const auto x = f.input({8, 8});
    const auto y = f.op("aten::mm", CKernel::Gemm, {x, x}, {8, 8});
    f.op("aten::relu", CKernel::PointwiseUnary, {y}, {8, 8});
    f.op("aten::neg", CKernel::PointwiseUnary, {y}, {8, 8});
    f.done();
    auto g = run_fuse(f.ir, strict);
    ASSERT_TRUE(g.ok());
    EXPECT_EQ(shape_of(*g), "gemm:0 | unary:1 | unary:2");
    f.ir.nodes.pop_back();  // relu is now y's only reader ...
    f.ir.values.pop_back();
    g = run_fuse(f.ir, strict);
    ASSERT_TRUE(g.ok());
    EXPECT_EQ(shape_of(*g), "gemm_act:0,1");
    f.ir.values[y].live_out = true;  // ... but y is live-out
    g = run_fuse(f.ir, strict);
    ASSERT_TRUE(g.ok());
    EXPECT_EQ(shape_of(*g), "gemm:0 | unary:1");
  }
  {  // mm's output is live-out (Python holds it): stored, and still fused into relu
    IrFixture f;
    const auto x = f.input({8, 8});
    const auto y = f.op("aten::mm", CKernel::Gemm, {x, x}, {8, 8});
    f.op("aten::relu", CKernel::PointwiseUnary, {y}, {8, 8});
    f.done();
    f.ir.values[y].live_out = true;
    auto g = run_fuse(f.ir, rs);
    ASSERT_TRUE(g.ok());
    EXPECT_EQ(shape_of(*g), "gemm_act:0,1");
  }
  {  // another phase
    IrFixture f;
    const auto x = f.input({8, 8});
    const auto y = f.op("aten::mm", CKernel::Gemm, {x, x}, {8, 8});
    f.op("aten::relu", CKernel::PointwiseUnary, {y}, {8, 8}, Phase::Backward);
    f.done();
    auto g = run_fuse(f.ir, rs);
    ASSERT_TRUE(g.ok());
    EXPECT_EQ(shape_of(*g), "gemm:0 | unary:1");
  }
  {  // the same node reading the value twice is still its only reader
    IrFixture f;
    const auto x = f.input({8, 8});
    const auto y = f.op("aten::mm", CKernel::Gemm, {x, x}, {8, 8});
    f.op("aten::mul.Tensor", CKernel::PointwiseUnary, {y, y}, {8, 8});
    f.done();
    auto g = run_fuse(f.ir, rs);
    ASSERT_TRUE(g.ok());
    EXPECT_EQ(shape_of(*g), "gemm_act:0,1");
  }
}

TEST(Fuse, AGroupNeverRunsBeforeAReaderOfItsOtherOutputs) {
  // norm writes (y, mean); a node between norm and relu reads mean: the group {norm, relu}
  // would run at relu, after that reader — refused (Note [Group placement] (a)).
  const RuleSet rs =
      one_class(kDefaults + rule("norm", "[\"NORM\"]", "norm", 50, "recipe = \"f32_pairwise\"\n") +
                rule("norm_act", "[\"NORM\", \"POINTWISE_UNARY\"]", "norm", 260,
                     "recipe = \"f32_pairwise\"\n"));
  IrFixture f;
  const auto x = f.input({8, 8});
  const auto n = f.node("aten::native_layer_norm", CKernel::Norm, {x}, {{8, 8}, {8}});
  const auto y = f.ir.nodes[n].outputs[0], mean = f.ir.nodes[n].outputs[1];
  f.op("aten::neg", CKernel::PointwiseUnary, {mean}, {8});
  f.op("aten::relu", CKernel::PointwiseUnary, {y}, {8, 8});
  f.done();
  auto g = run_fuse(f.ir, rs);
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(shape_of(*g), "norm:0 | unary:1 | unary:2");
  // Read after the relu instead: fine.
  IrFixture h;
  const auto x2 = h.input({8, 8});
  const auto n2 = h.node("aten::native_layer_norm", CKernel::Norm, {x2}, {{8, 8}, {8}});
  h.op("aten::relu", CKernel::PointwiseUnary, {h.ir.nodes[n2].outputs[0]}, {8, 8});
  h.op("aten::neg", CKernel::PointwiseUnary, {h.ir.nodes[n2].outputs[1]}, {8});
  h.done();
  g = run_fuse(h.ir, rs);
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(shape_of(*g), "norm_act:0,1 | unary:2");
}

TEST(Fuse, AGroupIsNotMovedPastAWriteOfWhatItReads) {
  // mm reads p; an in-place update of p's storage sits between mm and relu: running the group at
  // relu would read the new p (Note [Group placement] (b)).
  const RuleSet rs = one_class(
      kDefaults + rule("gemm_act", "[\"GEMM\", \"POINTWISE_UNARY\"]", "gemm_epilogue", 300));
  IrFixture f;
  const auto x = f.input({8, 8});
  const auto p = f.input({8, 8}, record::ExternalKind::Parameter);
  const auto y = f.op("aten::mm", CKernel::Gemm, {x, p}, {8, 8});
  const auto upd = f.op("aten::add_.Tensor", CKernel::PointwiseBinary, {p, x}, {8, 8});
  f.ir.values[upd].storage = f.ir.values[p].storage;
  f.ir.values[upd].version = 1;
  f.op("aten::relu", CKernel::PointwiseUnary, {y}, {8, 8});
  f.done();
  auto g = run_fuse(f.ir, rs);
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(shape_of(*g), "gemm:0 | binary:1 | unary:2");
}

TEST(Fuse, ModeCapabilitiesAndRowsDecideApplicability) {
  IrFixture f;
  mlp_layer(f);  // rows = 32
  const std::string pat = "[\"GEMM\", \"POINTWISE_BINARY\", \"POINTWISE_UNARY\"]";
  auto with = [&](const std::string& extra) {
    return one_class(kDefaults + rule("fused", pat, "gemm_epilogue", 300, extra));
  };
  Policy train, infer;
  infer.training = false;
  auto g = run_fuse(f.ir, with("modes = [\"infer\"]\n"), train);
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(g->size(), 3u);
  g = run_fuse(f.ir, with("modes = [\"infer\"]\n"), infer);
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(shape_of(*g), "fused:0,1,2");
  g = run_fuse(f.ir, with("requires = [\"avx512\"]\n"));  // the class offers only avx2
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(g->size(), 3u);
  g = run_fuse(f.ir, with("requires = [\"avx2\"]\n"));
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(g->size(), 1u);
  g = run_fuse(f.ir, with("rows = [64, 1000]\n"));
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(g->size(), 3u);
  g = run_fuse(f.ir, with("rows = [32, 32]\n"));
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(g->size(), 1u);
}

TEST(Fuse, RowsOfASymbolicShapeUseTheRecordedBatch) {
  IrFixture f;
  mlp_layer(f);
  ExprPool& pool = f.pool();
  const Expr* b = pool.symbol("B");
  f.ir.values[f.ir.nodes[0].outputs[0]].shape[0] = pool.mul(pool.constant(2), b);  // 2B x 16
  f.ir.symbolic = true;
  const RuleSet rs = one_class(
      kDefaults + rule("big_gemm", "[\"GEMM\"]", "gemm_epilogue", 150, "rows = [64, 64]\n"));
  f.ir.batch_size = 32;
  auto g = run_fuse(f.ir, rs);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ((*g)[0].rule, "big_gemm");
  f.ir.batch_size = 16;
  g = run_fuse(f.ir, rs);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ((*g)[0].rule, "gemm");
  f.ir.batch_size = 0;
  g = run_fuse(f.ir, rs);
  ASSERT_FALSE(g.ok());
  EXPECT_NE(g.status().message().find("node #0 aten::mm"), std::string::npos) << g.status();
}

TEST(Fuse, DiffersRulesNeedAnExplicitOptIn) {
  IrFixture f;
  mlp_layer(f);
  const RuleSet rs =
      one_class(kDefaults + rule("bf16_gemm", "[\"GEMM\"]", "gemm_epilogue", 150,
                                 "recipe = \"bf16_f32acc_tc\"\nnumerics = \"differs\"\n"));
  auto g = run_fuse(f.ir, rs);
  ASSERT_TRUE(g.ok());
  EXPECT_EQ((*g)[0].rule, "gemm");
  Policy p;
  p.allow_differs = {"bf16_gemm"};
  g = run_fuse(f.ir, rs, p);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ((*g)[0].rule, "bf16_gemm");
  EXPECT_EQ((*g)[0].numerics, static_cast<std::uint8_t>(Numerics::Differs));
  EXPECT_EQ((*g)[0].recipe, recipe_by_name("bf16_f32acc_tc"));
  p.allow_differs = {"bf16_gemm_typo"};
  g = run_fuse(f.ir, rs, p);
  ASSERT_FALSE(g.ok());
  EXPECT_NE(g.status().message().find("bf16_gemm_typo"), std::string::npos);
  EXPECT_NE(g.status().message().find("bf16_gemm"), std::string::npos);
}

TEST(Fuse, ARuleReadingAnUnstatedSettingIsAnError) {
  IrFixture f;
  mlp_layer(f);
  const RuleSet rs = one_class(kDefaults + rule("tf32_gemm", "[\"GEMM\"]", "gemm_epilogue", 150,
                                                "settings = [\"allow_tf32=true\"]\n"));
  auto g = run_fuse(f.ir, rs);
  ASSERT_FALSE(g.ok());
  const std::string m(g.status().message());
  EXPECT_NE(m.find("rule \"tf32_gemm\""), std::string::npos) << m;
  EXPECT_NE(m.find("setting \"allow_tf32\""), std::string::npos) << m;
  Policy p;
  p.settings["allow_tf32"] = "false";
  g = run_fuse(f.ir, rs, p);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ((*g)[0].rule, "gemm");
  p.settings["allow_tf32"] = "true";
  g = run_fuse(f.ir, rs, p);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ((*g)[0].rule, "tf32_gemm");
}

TEST(Fuse, ShippedH200TensorCoreRulesNeedOptInAndTheirSetting) {
  auto rules = load_rules_dir(CRUCIBLE_RULES_DIR, "h200");
  ASSERT_TRUE(rules.ok()) << rules.status();
  IrFixture f;
  const auto x = f.input({128, 256});
  const auto w = f.input({256, 64}, record::ExternalKind::Parameter);
  f.op("aten::mm", CKernel::Gemm, {x, w}, {128, 64});
  f.done();
  auto g = run_fuse(f.ir, *rules);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ((*g)[0].recipe, recipe_by_name("f32_ordered"));  // f32 by default
  Policy p;
  p.allow_differs = {"h200_gemm_bf16_bitexact_tc", "h200_gemm_bf16_tc"};
  g = run_fuse(f.ir, *rules, p);
  ASSERT_FALSE(g.ok());
  EXPECT_NE(g.status().message().find("\"deterministic\""), std::string::npos) << g.status();
  p.settings["deterministic"] = "false";
  g = run_fuse(f.ir, *rules, p);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ((*g)[0].rule, "h200_gemm_bf16_tc");
  p.settings["deterministic"] = "true";
  g = run_fuse(f.ir, *rules, p);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ((*g)[0].rule, "h200_gemm_bf16_bitexact_tc");
  EXPECT_EQ((*g)[0].recipe, recipe_by_name("bf16_f32acc_bitexact_tc"));
}

TEST(Fuse, AnUncoveredNodeIsAnError) {
  IrFixture f;
  const auto x = f.input({8, 8});
  const auto y = f.op("aten::relu", CKernel::PointwiseUnary, {x}, {8, 8});
  f.op("aten::nll_loss_forward", CKernel::Loss, {y}, {});
  f.done();
  const RuleSet rs = one_class(rule("unary", "[\"POINTWISE_UNARY\"]", "pointwise_chain", 50));
  auto g = run_fuse(f.ir, rs);
  ASSERT_FALSE(g.ok());
  EXPECT_NE(g.status().message().find("uncovered node #1 aten::nll_loss_forward (LOSS)"),
            std::string::npos)
      << g.status();
}

TEST(Fuse, OverBudgetEveryRemainingNodeRunsOpaque) {
  IrFixture f;
  mlp_layer(f);
  const RuleSet rs = one_class(
      kDefaults + rule("gemm_act", "[\"GEMM\", \"POINTWISE_BINARY?\", \"POINTWISE_UNARY\"]",
                       "gemm_epilogue", 300));
  PassContext ctx;
  ctx.rules = &rs;
  ctx.budget_micros = 0;
  auto g = fuse(f.ir, ctx);
  ASSERT_TRUE(g.ok()) << g.status();
  ASSERT_EQ(g->size(), 3u);
  for (std::size_t i = 0; i < 3; ++i) {
    EXPECT_EQ((*g)[i].rule, "");
    EXPECT_EQ((*g)[i].kernel, KernelTemplate::Opaque);
    EXPECT_EQ((*g)[i].nodes, std::vector<std::uint32_t>{static_cast<std::uint32_t>(i)});
    EXPECT_EQ((*g)[i].id, i);
  }
  ASSERT_EQ(ctx.phases.size(), 1u);
  EXPECT_EQ(ctx.phases[0].name, "fuse");
  EXPECT_EQ(ctx.phases[0].opaque_fallback, 3u);
  EXPECT_TRUE(ctx.phases[0].over_budget);
  EXPECT_EQ(ctx.phases[0].nodes_before, 3u);
  EXPECT_EQ(ctx.phases[0].nodes_after, 3u);
}

// Random DAGs of GEMM/pointwise/norm nodes (some with two outputs, some in-place on a
// parameter's storage): fusing twice gives the same groups, every node is in one group, and
// lower() accepts the order (it refuses a group that reads from a later one, and a fused value
// that escapes its group).
TEST(Fuse, RandomGraphsGiveDeterministicValidGroups) {
  const RuleSet rs =
      one_class(kDefaults + rule("norm", "[\"NORM\"]", "norm", 50, "recipe = \"f32_pairwise\"\n") +
                rule("gemm_act", "[\"GEMM\", \"POINTWISE_BINARY?\", \"POINTWISE_UNARY\"]",
                     "gemm_epilogue", 300) +
                rule("norm_act", "[\"NORM\", \"POINTWISE_UNARY\", \"POINTWISE_UNARY?\"]", "norm",
                     260, "recipe = \"f32_pairwise\"\n") +
                rule("chain", "[\"POINTWISE_BINARY\", \"POINTWISE_UNARY\", \"POINTWISE_BINARY?\"]",
                     "pointwise_chain", 220));
  std::mt19937 rng(1234);
  std::size_t multi = 0;
  for (int trial = 0; trial < 300; ++trial) {
    IrFixture f;
    std::vector<std::uint32_t> vals = {f.input({4, 4}), f.input({4, 4})};
    const auto param = f.input({4, 4}, record::ExternalKind::Parameter);
    const int n = 3 + static_cast<int>(rng() % 14);
    for (int i = 0; i < n; ++i) {
      auto pick = [&] {
        // Mostly recent values, so chains form.
        const std::size_t back = std::min<std::size_t>(vals.size(), 1 + rng() % 3);
        return vals[vals.size() - 1 - rng() % back];
      };
      switch (rng() % 6) {
        case 0:
          vals.push_back(f.op("aten::mm", CKernel::Gemm, {pick(), pick()}, {4, 4}));
          break;
        case 1:
          vals.push_back(f.op("aten::relu", CKernel::PointwiseUnary, {pick()}, {4, 4}));
          break;
        case 2:
          vals.push_back(
              f.op("aten::add.Tensor", CKernel::PointwiseBinary, {pick(), pick()}, {4, 4}));
          break;
        case 3: {
          const auto id =
              f.node("aten::native_layer_norm", CKernel::Norm, {pick()}, {{4, 4}, {4, 4}});
          vals.push_back(f.ir.nodes[id].outputs[0]);
          vals.push_back(f.ir.nodes[id].outputs[1]);
          break;
        }
        case 4: {  // in-place update of the parameter's storage
          const auto out =
              f.op("aten::add_.Tensor", CKernel::PointwiseBinary, {param, pick()}, {4, 4});
          f.ir.values[out].storage = f.ir.values[param].storage;
          f.ir.values[out].version = static_cast<std::uint32_t>(i + 1);
          f.ir.values[out].live_out = true;
          break;
        }
        default:
          vals.push_back(f.op("aten::sigmoid", CKernel::PointwiseUnary, {pick()}, {4, 4}));
          break;
      }
    }
    f.done();
    auto a = run_fuse(f.ir, rs);
    auto b = run_fuse(f.ir, rs);
    ASSERT_TRUE(a.ok() && b.ok()) << a.status();
    ASSERT_EQ(shape_of(*a), shape_of(*b));
    std::vector<int> seen(f.ir.nodes.size(), 0);
    for (const FusionGroup& g : *a) {
      for (std::uint32_t x : g.nodes) ++seen[x];
      multi += g.nodes.size() > 1;
    }
    for (int s : seen) ASSERT_EQ(s, 1);
    PassContext ctx;
    auto lowered = lower(f.ir, *a, ctx);
    ASSERT_TRUE(lowered.ok()) << "trial " << trial << ": " << lowered.status() << "\n"
                              << shape_of(*a);
  }
  EXPECT_GT(multi, 100u);  // the generator does exercise fusion
}

// The shipped cpu-avx2 rules on the shapes a training step records (Note [Escaping links]:
// saved activations have a second, later reader).
RuleSet cpu_avx2() {
  auto r = load_rules_dir(CRUCIBLE_RULES_DIR, "cpu-avx2");
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *r : RuleSet{};
}
std::uint32_t op_of(IrFixture& f, const std::string& name, std::vector<std::uint32_t> ins,
                    std::vector<std::int64_t> shape, Phase phase = Phase::Forward) {
  return f.op(name, classify_op(name).kind, std::move(ins), std::move(shape), phase);
}
std::uint32_t view_of(IrFixture& f, std::uint32_t v, std::vector<std::int64_t> shape) {
  const std::uint32_t out = op_of(f, "aten::view", {v}, std::move(shape));
  f.ir.values[out].storage = f.ir.values[v].storage;
  f.ir.values[out].is_view = true;
  return out;
}

TEST(Fuse, ShippedRulesMergePointwiseChainsWholeThroughViews) {
  IrFixture f;
  const auto x = f.input({32, 16});
  const auto y = f.input({32, 16});
  const auto a = op_of(f, "aten::mul.Tensor", {x, y}, {32, 16});
  const auto b = op_of(f, "aten::sigmoid", {a}, {32, 16});
  const auto c = view_of(f, b, {512});
  const auto d = op_of(f, "aten::add.Tensor", {c, c}, {512});
  const auto e = op_of(f, "aten::tanh", {d}, {512});
  op_of(f, "aten::mul.Tensor", {e, c}, {512});
  op_of(f, "aten::neg", {b}, {32, 16}, Phase::Backward);  // b saved for the backward
  f.done();
  const RuleSet rs = cpu_avx2();
  auto g = run_fuse(f.ir, rs);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(shape_of(*g), "cpu_pointwise_chain:0,1,2,3,4,5 | pointwise_unary:6");
  ASSERT_NE((*g)[0].recipe, nullptr);
  EXPECT_EQ((*g)[0].recipe->determinism, Determinism::BitexactStrict);
  EXPECT_EQ((*g)[0].recipe->flags & NumericalRecipe::kAllowFma, 0u);  // no FMA contraction
  PassContext ctx;
  auto p = lower(f.ir, *g, ctx);
  ASSERT_TRUE(p.ok()) << p.status();
  // b escapes (read in the backward): stored once; nothing else in the chain is written but
  // the chain's result.
  EXPECT_EQ(p->kernels[0].outputs, (std::vector<std::uint32_t>{b, f.ir.nodes[5].outputs[0]}));
}

TEST(Fuse, ShippedRulesPutAPointwisePrologueAndEpilogueIntoAReduction) {
  IrFixture f;
  const auto x = f.input({8, 64});
  const auto a = op_of(f, "aten::sub.Tensor", {x, x}, {8, 64});
  const auto b = op_of(f, "aten::mul.Tensor", {a, a}, {8, 64});
  const auto s = op_of(f, "aten::sum.dim_IntList", {b}, {8, 1});
  op_of(f, "aten::sqrt", {s}, {8, 1});
  f.done();
  const RuleSet rs = cpu_avx2();
  auto g = run_fuse(f.ir, rs);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(shape_of(*g), "cpu_pointwise_reduce:0,1,2,3");
  EXPECT_EQ((*g)[0].kernel, KernelTemplate::Reduce);
  EXPECT_NE((*g)[0].recipe->determinism, Determinism::BitexactStrict);  // it reduces
}

TEST(Fuse, ShippedRulesFuseAGemmsBiasActivationAndResidual) {
  IrFixture f;
  const auto x = f.input({48, 32});
  const auto w = f.input({32, 32}, record::ExternalKind::Parameter);
  const auto bias = f.input({32}, record::ExternalKind::Parameter);
  const auto mm = op_of(f, "aten::mm", {x, w}, {48, 32});
  const auto v = view_of(f, mm, {4, 12, 32});
  const auto xb = view_of(f, x, {4, 12, 32});
  const auto biased = op_of(f, "aten::add.Tensor", {v, bias}, {4, 12, 32});
  const auto act = op_of(f, "aten::relu", {biased}, {4, 12, 32});
  const auto res = op_of(f, "aten::add.Tensor", {act, xb}, {4, 12, 32});
  op_of(f, "aten::threshold_backward", {res, act}, {4, 12, 32}, Phase::Backward);
  f.done();
  const RuleSet rs = cpu_avx2();
  auto g = run_fuse(f.ir, rs);
  ASSERT_TRUE(g.ok()) << g.status();
  // The view of x (node 2) is not on the chain: it stays its own (view) group, before.
  EXPECT_EQ(shape_of(*g), "view:2 | cpu_gemm_act:0,1,3,4,5 | pointwise_binary:6");
}

TEST(Fuse, ShippedRulesComputeAGemmOperandAsItIsPacked) {
  // Attention's q * scale and the contiguous copy of a permuted tensor feed bmm / mm directly.
  IrFixture f;
  const auto q = f.input({16, 12, 8});
  const auto k = f.input({16, 8, 12});
  const auto scaled = op_of(f, "aten::mul.Scalar", {q}, {16, 12, 8});
  const auto scores = op_of(f, "aten::bmm", {scaled, k}, {16, 12, 12});
  const auto perm = view_of(f, scores, {12, 16, 12});
  const auto c = op_of(f, "aten::clone", {perm}, {12, 16, 12});
  const auto flat = view_of(f, c, {192, 12});
  const auto w = f.input({12, 4}, record::ExternalKind::Parameter);
  op_of(f, "aten::mm", {flat, w}, {192, 4});
  f.done();
  const RuleSet rs = cpu_avx2();
  auto g = run_fuse(f.ir, rs);
  ASSERT_TRUE(g.ok()) << g.status();
  // The first GEMM takes its prologue and its output's copy; the second starts a new kernel.
  EXPECT_EQ(shape_of(*g), "cpu_gemm_prologue:0,1,2,3,4 | cpu_gemm:5");
  EXPECT_EQ((*g)[0].kernel, KernelTemplate::GemmEpilogue);
  EXPECT_EQ((*g)[0].numerics, static_cast<std::uint8_t>(Numerics::Reference));
}

TEST(Fuse, ShippedRulesRunDropoutAsOneKernel) {
  IrFixture f;
  const auto x = f.input({4, 12, 32});
  const auto mask0 = op_of(f, "aten::empty_like", {x}, {4, 12, 32});
  const auto mask1 = op_of(f, "aten::bernoulli_.float", {mask0}, {4, 12, 32});
  f.ir.values[mask1].storage = f.ir.values[mask0].storage;
  f.ir.values[mask1].version = 1;
  const auto mask = op_of(f, "aten::div_.Scalar", {mask1}, {4, 12, 32});
  f.ir.values[mask].storage = f.ir.values[mask0].storage;
  f.ir.values[mask].version = 2;
  const auto y = op_of(f, "aten::mul.Tensor", {x, mask}, {4, 12, 32});
  op_of(f, "aten::add.Tensor", {y, x}, {4, 12, 32});
  op_of(f, "aten::mul.Tensor", {x, mask}, {4, 12, 32}, Phase::Backward);  // the saved mask
  f.done();
  const RuleSet rs = cpu_avx2();
  auto g = run_fuse(f.ir, rs);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(shape_of(*g), "cpu_dropout:0,1,2,3,4 | pointwise_binary:5");
  PassContext ctx;
  auto p = lower(f.ir, *g, ctx);
  ASSERT_TRUE(p.ok()) << p.status();
  const auto& outs = p->kernels[0].outputs;
  EXPECT_NE(std::find(outs.begin(), outs.end(), mask), outs.end());  // stored for the backward
  EXPECT_EQ(std::find(outs.begin(), outs.end(), y), outs.end());     // never written
}

}  // namespace
}  // namespace crucible::forge
