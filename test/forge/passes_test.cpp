// passes_test — canonicalize, dce and cse on synthetic IR, the phase budget, and the whole front
// end on recorded models (deterministic digest).
#include <gtest/gtest.h>

#include <filesystem>

#include "../graph/synth.h"
#include "crucible/forge/Digest.h"
#include "crucible/forge/Passes.h"
#include "crucible/graph/Analysis.h"
#include "crucible/record/TraceFile.h"
#include "traces.h"

namespace crucible::forge {
namespace {

using graph::synth::Builder;

Ir001 build(Builder& b, ExprPool& pool) {
  auto ir = build_ir001(b.trace, b.all(), pool);
  EXPECT_TRUE(ir.ok()) << ir.status();
  return std::move(*ir);
}

std::vector<std::string> ops_of(const Ir001& ir) {
  std::vector<std::string> v;
  for (const Node& n : ir.nodes) v.push_back(n.op);
  return v;
}

TEST(Canonicalize, ViewsAliasInPlaceMarkedNoOpViewsDropped) {
  Builder b;
  b.op("aten::relu", {{1, 0, {4, 4}}}, {{2, 0, {4, 4}}});
  b.op("aten::view", {{2, 0, {4, 4}}}, {{2, 0, {4, 4}, 6, 0, true}});  // same shape: a no-op
  b.op("aten::t", {{2, 0, {4, 4}, 6, 0, true}}, {{2, 0, {4, 4}, 6, 0, true}});
  b.op("aten::mul_.Tensor", {{3, 0, {4, 4}}, {2, 0, {4, 4}, 6, 0, true}}, {{3, 1, {4, 4}}});
  ExprPool pool;
  Ir001 ir = build(b, pool);
  PassContext ctx;
  auto out = canonicalize(ir, ctx);
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(ops_of(*out), (std::vector<std::string>{"aten::relu", "aten::t", "aten::mul_.Tensor"}));
  const Node& t = out->nodes[1];
  EXPECT_EQ(t.alias_of, t.inputs[0]);
  EXPECT_EQ(t.inputs[0], out->nodes[0].outputs[0]);  // the dropped view's user reads relu's output
  EXPECT_TRUE(out->values[t.outputs[0]].is_view);
  EXPECT_TRUE(out->nodes[2].in_place);
  EXPECT_TRUE(out->nodes[2].mutates);
  EXPECT_TRUE(verify(*out).ok());
  ASSERT_EQ(ctx.phases.size(), 1u);
  EXPECT_EQ(ctx.phases[0].name, "canonicalize");
  EXPECT_EQ(ctx.phases[0].nodes_before, 4u);
  EXPECT_EQ(ctx.phases[0].nodes_after, 3u);
}

TEST(Canonicalize, ALiveOutViewIsKept) {
  Builder b;
  b.op("aten::relu", {{1, 0, {4}}}, {{2, 0, {4}}});
  b.op("aten::view", {{2, 0, {4}}}, {{2, 0, {4}, 6, 0, true}});  // nobody reads it: Python may
  ExprPool pool;
  PassContext ctx;
  auto out = canonicalize(build(b, pool), ctx);
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(out->nodes.size(), 2u);
}

TEST(Dce, RemovesOnlyWhatNothingObserves) {
  Builder b;
  b.trace.externals[10] = record::ExternalKind::Parameter;
  b.op("aten::relu", {{1, 0, {4}}}, {{2, 0, {4}}});                   // feeds the loss: kept
  b.op("aten::neg", {{1, 0, {4}}}, {{3, 0, {4}}});                    // feeds only dead exp
  b.op("aten::exp", {{3, 0, {4}}}, {{4, 0, {4}}});                    // live-out (nobody reads)
  b.op("aten::sum", {{2, 0, {4}}}, {{5, 0, {}}});                     // live-out
  b.op("aten::bernoulli_.float", {{6, 0, {4}}}, {{6, 1, {4}}});       // RNG: kept
  b.op("aten::add_.Tensor", {{10, 0, {4}}, {2, 0, {4}}}, {{10, 1, {4}}});  // updates a parameter
  b.trace.ops.back().flags |= record::op_flag::kMutable;
  ExprPool pool;
  Ir001 ir = build(b, pool);
  // Mark exp's output dead (as if the pipeline knew Python dropped it): neg and exp must go.
  ir.values[ir.nodes[2].outputs[0]].live_out = false;
  PassContext ctx;
  auto out = dce(ir, ctx);
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(ops_of(*out), (std::vector<std::string>{"aten::relu", "aten::sum", "aten::bernoulli_.float",
                                                    "aten::add_.Tensor"}));
  EXPECT_TRUE(verify(*out).ok());
  // Over budget from the start: nothing is removed.
  PassContext zero;
  zero.budget_micros = 0;
  auto kept = dce(ir, zero);
  ASSERT_TRUE(kept.ok());
  EXPECT_EQ(kept->nodes.size(), ir.nodes.size());
  EXPECT_TRUE(zero.phases[0].over_budget);
}

// AccumulateGrad's copy of a gradient: mm makes it (storage 2), new_empty_strided + copy_ copy it
// into storage 3, and an optimizer update reads the copy.
Builder gradient_copy(bool second_reader) {
  Builder b;
  b.trace.externals[1] = record::ExternalKind::Parameter;
  b.trace.externals[9] = record::ExternalKind::OptimizerState;
  const auto B = record::Phase::Backward;
  b.op("aten::mm", {{1, 0, {4, 4}}, {1, 0, {4, 4}}}, {{2, 0, {4, 4}}}, B);
  b.op("aten::new_empty_strided", {{2, 0, {4, 4}}}, {{3, 0, {4, 4}}}, B);
  b.op("aten::copy_", {{3, 0, {4, 4}}, {2, 0, {4, 4}}}, {{3, 1, {4, 4}}}, B);
  b.trace.ops.back().flags |= record::op_flag::kMutable;
  if (second_reader) b.op("aten::relu", {{2, 0, {4, 4}}}, {{5, 0, {4, 4}}}, B);
  b.op("aten::add_.Tensor", {{9, 0, {4, 4}}, {3, 1, {4, 4}}}, {{9, 1, {4, 4}}}, record::Phase::Optimizer);
  b.trace.ops.back().flags |= record::op_flag::kMutable;
  return b;
}

TEST(ForwardFreshCopies, AGradientCopyNothingElseReadsGoesAndItsReadersReadTheGradient) {
  Builder b = gradient_copy(false);
  ExprPool pool;
  Ir001 ir = build(b, pool);
  // The caller binds the uncopied gradient (storage 2) after the step; the copy escapes nowhere.
  for (Value& v : ir.values)
    if (v.storage == 3) v.live_out = false;
  std::size_t n = 0;
  auto out = forward_fresh_copies(ir, &n);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(n, 1u);
  EXPECT_EQ(ops_of(*out), (std::vector<std::string>{"aten::mm", "aten::add_.Tensor"}));
  EXPECT_EQ(out->nodes[1].inputs[1], out->nodes[0].outputs[0]);  // the update reads mm's result
  EXPECT_TRUE(verify(*out).ok());
}

TEST(ForwardFreshCopies, KeepsACopyThatIsSeenOrWhoseSourceIsReadElsewhere) {
  ExprPool pool;
  {  // the copy escapes (Python holds it): kept
    Builder b = gradient_copy(false);
    Ir001 ir = build(b, pool);
    for (Value& v : ir.values)
      if (v.storage == 3) v.live_out = true;
    std::size_t n = 9;
    auto out = forward_fresh_copies(ir, &n);
    ASSERT_TRUE(out.ok());
    EXPECT_EQ(n, 0u);
    EXPECT_EQ(out->nodes.size(), ir.nodes.size());
  }
  {  // the gradient is read by another node too: the copy is a copy
    Builder b = gradient_copy(true);
    Ir001 ir = build(b, pool);
    for (Value& v : ir.values)
      if (v.storage == 3) v.live_out = false;
    std::size_t n = 9;
    auto out = forward_fresh_copies(ir, &n);
    ASSERT_TRUE(out.ok());
    EXPECT_EQ(n, 0u);
    EXPECT_EQ(out->nodes.size(), ir.nodes.size());
  }
}

TEST(Dce, AWriteToLocalStorageNobodyReadsGoesAWriteToStateStays) {
  Builder b;
  b.trace.externals[1] = record::ExternalKind::Parameter;
  b.op("aten::relu", {{1, 0, {4}}}, {{2, 0, {4}}});
  b.op("aten::empty_like", {{2, 0, {4}}}, {{3, 0, {4}}});
  b.op("aten::copy_", {{3, 0, {4}}, {2, 0, {4}}}, {{3, 1, {4}}});  // a copy nobody reads
  b.trace.ops.back().flags |= record::op_flag::kMutable;
  b.op("aten::mul_.Tensor", {{1, 0, {4}}, {2, 0, {4}}}, {{1, 1, {4}}});  // updates the parameter
  b.trace.ops.back().flags |= record::op_flag::kMutable;
  ExprPool pool;
  Ir001 ir = build(b, pool);
  PassContext ctx;
  auto kept = dce(ir, ctx);  // by default an unread value may be held by Python: all stay
  ASSERT_TRUE(kept.ok());
  EXPECT_EQ(kept->nodes.size(), 4u);
  for (Value& v : ir.values)
    if (v.storage == 3) v.live_out = false;  // the caller says storage 3 is not seen
  auto out = dce(ir, ctx);
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(ops_of(*out), (std::vector<std::string>{"aten::relu", "aten::mul_.Tensor"}));
  EXPECT_TRUE(verify(*out).ok());
}

TEST(Dce, AHiddenWriteALaterNodeReadsKeepsTheWriter) {
  // The write to storage 3 is not among the node's results (a running statistic updated in
  // place): the later read of storage 3 has no producer, so storage 3 is not local.
  Builder b;
  b.op("aten::relu", {{1, 0, {4}}}, {{3, 0, {4}}});
  b.op("aten::neg", {{1, 0, {4}}}, {{2, 0, {4}}});
  b.op("aten::native_batch_norm", {{2, 0, {4}}, {3, 0, {4}}}, {{4, 0, {4}}});
  b.trace.ops.back().flags |= record::op_flag::kMutable;
  b.op("aten::neg", {{3, 1, {4}}}, {{5, 0, {4}}});
  ExprPool pool;
  Ir001 ir = build(b, pool);
  for (Value& v : ir.values)
    if (v.storage == 4) v.live_out = false;
  PassContext ctx;
  auto out = dce(ir, ctx);
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(ops_of(*out),
            (std::vector<std::string>{"aten::relu", "aten::neg", "aten::native_batch_norm", "aten::neg"}));
}

// Note [Rematerialization]: x -> neg (9) -> relu (2), exp (3); their product (4) is read by a
// forward sum and, through a view (t), by a backward mm; the backward also reads 2 and 3 again
// (not 9: relu and exp cannot be computed again without keeping it).
Builder remat_step(bool write_x_between, bool keep_inputs) {
  Builder b;
  b.trace.externals[1] = record::ExternalKind::Input;
  const auto F = record::Phase::Forward, B = record::Phase::Backward;
  b.op("aten::neg", {{1, 0, {32, 16}}}, {{9, 0, {32, 16}}});
  b.op("aten::relu", {{9, 0, {32, 16}}}, {{2, 0, {32, 16}}});
  b.op("aten::exp", {{9, 0, {32, 16}}}, {{3, 0, {32, 16}}});
  b.op("aten::mul.Tensor", {{2, 0, {32, 16}}, {3, 0, {32, 16}}}, {{4, 0, {32, 16}}});
  b.op("aten::t", {{4, 0, {32, 16}}}, {{4, 0, {16, 32}, 6, 0, true}});
  b.op("aten::sum", {{4, 0, {32, 16}}}, {{5, 0, {}}}, F);
  b.op("aten::neg", {{5, 0, {}}}, {{6, 0, {}}}, F);
  if (write_x_between) {
    b.op("aten::mul_.Tensor", {{2, 0, {32, 16}}, {6, 0, {}}}, {{2, 1, {32, 16}}}, B);
    b.trace.ops.back().flags |= record::op_flag::kMutable;
  }
  b.op("aten::mm", {{4, 0, {16, 32}, 6, 0, true}, {1, 0, {32, 16}}}, {{7, 0, {16, 16}}}, B);
  if (keep_inputs) b.op("aten::add.Tensor", {{2, 0, {32, 16}}, {3, 0, {32, 16}}}, {{8, 0, {32, 16}}}, B);
  return b;
}

Ir001 remat(Builder& b, ExprPool& pool, std::size_t* n) {
  PassContext ctx;
  auto c = canonicalize(build(b, pool), ctx);
  EXPECT_TRUE(c.ok()) << c.status();
  auto out = rematerialize(std::move(*c), ctx, n);
  EXPECT_TRUE(out.ok()) << out.status();
  return std::move(*out);
}

TEST(Rematerialize, APointwiseValueTheBackwardReadsIsComputedAgainBeforeIt) {
  Builder b = remat_step(false, true);
  ExprPool pool;
  std::size_t n = 0;
  Ir001 ir = remat(b, pool, &n);
  EXPECT_EQ(n, 1u);
  EXPECT_EQ(ops_of(ir), (std::vector<std::string>{"aten::neg", "aten::relu", "aten::exp", "aten::mul.Tensor",
                                                   "aten::t", "aten::sum", "aten::neg", "aten::mul.Tensor",
                                                   "aten::t", "aten::mm", "aten::add.Tensor"}));
  const Node &orig = ir.nodes[3], &copy = ir.nodes[7], &tcopy = ir.nodes[8], &mm = ir.nodes[9];
  EXPECT_EQ(copy.phase, record::Phase::Backward);
  EXPECT_EQ(copy.inputs, orig.inputs) << "the same inputs, kept for the backward anyway";
  EXPECT_NE(ir.values[copy.outputs[0]].storage, ir.values[orig.outputs[0]].storage);
  EXPECT_EQ(tcopy.inputs[0], copy.outputs[0]);
  EXPECT_EQ(mm.inputs[0], tcopy.outputs[0]) << "the backward reads the copy's view";
  EXPECT_EQ(ir.values[tcopy.outputs[0]].storage, ir.values[copy.outputs[0]].storage);
  // Nothing after the forward reads the original any more.
  const std::uint64_t s = ir.values[orig.outputs[0]].storage;
  for (std::size_t j = 7; j < ir.nodes.size(); ++j)
    for (std::uint32_t in : ir.nodes[j].inputs) EXPECT_NE(ir.values[in].storage, s) << j;
  EXPECT_TRUE(verify(ir).ok()) << verify(ir);
  // cse would merge the copy back: the front end runs this after it.
  PassContext ctx;
  auto merged = cse(ir, ctx);
  ASSERT_TRUE(merged.ok());
}

TEST(Rematerialize, NotWhenAnInputChangesOrWouldBeKeptLongerForIt) {
  for (auto [write, keep] : {std::pair{true, true}, std::pair{false, false}}) {
    Builder b = remat_step(write, keep);
    ExprPool pool;
    std::size_t n = 0;
    Ir001 ir = remat(b, pool, &n);
    EXPECT_EQ(n, 0u) << "write " << write << " keep " << keep;
    const auto ops = ops_of(ir);
    EXPECT_EQ(std::count(ops.begin(), ops.end(), "aten::mul.Tensor"), 1);
  }
}

TEST(Cse, MergesIdenticalPureNodesOnly) {
  Builder b;
  b.trace.externals[1] = record::ExternalKind::Parameter;
  b.op("aten::t", {{1, 0, {4, 8}}}, {{1, 0, {8, 4}, 6, 0, true}});
  b.op("aten::relu", {{1, 0, {8, 4}, 6, 0, true}}, {{2, 0, {8, 4}}});
  b.op("aten::t", {{1, 0, {4, 8}}}, {{1, 0, {8, 4}, 6, 0, true}});    // same as the first t
  b.op("aten::neg", {{1, 0, {8, 4}, 6, 0, true}}, {{3, 0, {8, 4}}});
  b.op("aten::empty.memory_format", {}, {{4, 0, {4}}}, record::Phase::Forward, "", {4});
  b.op("aten::empty.memory_format", {}, {{5, 0, {4}}}, record::Phase::Forward, "", {4});  // factory: not merged
  b.op("aten::add", {{2, 0, {8, 4}}, {3, 0, {8, 4}}}, {{6, 0, {8, 4}}});
  b.op("aten::add", {{2, 0, {8, 4}}, {3, 0, {8, 4}}}, {{7, 0, {8, 4}}});  // live-out: kept
  b.op("aten::sum", {{6, 0, {8, 4}}, }, {{8, 0, {}}});
  b.op("aten::sum", {{4, 0, {4}}, }, {{9, 0, {}}});
  b.op("aten::sum", {{5, 0, {4}}, }, {{10, 0, {}}});
  ExprPool pool;
  Ir001 ir = build(b, pool);
  PassContext ctx;
  auto out = cse(ir, ctx);
  ASSERT_TRUE(out.ok());
  auto ops = ops_of(*out);
  EXPECT_EQ(std::count(ops.begin(), ops.end(), "aten::t"), 1);
  EXPECT_EQ(std::count(ops.begin(), ops.end(), "aten::empty.memory_format"), 2);
  EXPECT_EQ(std::count(ops.begin(), ops.end(), "aten::add"), 2);
  // neg now reads the first t's output.
  for (const Node& n : out->nodes) {
    if (n.op == "aten::neg") {
      EXPECT_EQ(out->values[n.inputs[0]].producer, 0u);
    }
  }
  EXPECT_TRUE(verify(*out).ok());
}

TEST(Cse, DifferentScalarsAreDifferentNodes) {
  Builder b;
  b.op("aten::sum.dim_IntList", {{1, 0, {4, 4}}}, {{2, 0, {4}}}, record::Phase::Forward, "", {0});
  b.op("aten::sum.dim_IntList", {{1, 0, {4, 4}}}, {{3, 0, {4}}}, record::Phase::Forward, "", {1});
  b.op("aten::add", {{2, 0, {4}}, {3, 0, {4}}}, {{4, 0, {4}}});
  ExprPool pool;
  PassContext ctx;
  auto out = cse(build(b, pool), ctx);
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(out->nodes.size(), 3u);
}

TEST(FrontEnd, AnInferencePlanOfATrainingStepIsRefused) {
  auto rules = load_rules_dir(CRUCIBLE_RULES_DIR, "cpu-avx2");
  ASSERT_TRUE(rules.ok()) << rules.status();
  Policy infer;
  infer.training = false;
  Builder fwd;
  fwd.op("aten::relu", {{1, 0, {4}}}, {{2, 0, {4}}});
  ExprPool pool;
  EXPECT_TRUE(run_front_end(build(fwd, pool), *rules, infer).ok());
  Builder step = fwd;
  step.op("aten::threshold_backward", {{3, 0, {4}}, {2, 0, {4}}}, {{4, 0, {4}}}, record::Phase::Backward);
  auto refused = run_front_end(build(step, pool), *rules, infer);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("training step (1 backward/optimizer ops)"),
            absl::string_view::npos) << refused.status();
  EXPECT_TRUE(run_front_end(build(step, pool), *rules, Policy{}).ok());
}

TEST(FrontEnd, RecordedModelsPlanDeterministically) {
  if (!std::filesystem::exists(traces_dir() / "index.json")) GTEST_SKIP() << "no recorded traces";
  auto rules = load_rules_dir(CRUCIBLE_RULES_DIR, "cpu-avx2");
  ASSERT_TRUE(rules.ok()) << rules.status();
  for (const auto& e : std::filesystem::directory_iterator(traces_dir())) {
    if (e.path().extension() != ".crtrace") continue;
    auto t = record::load_trace(e.path().string());
    ASSERT_TRUE(t.ok()) << e.path();
    auto it = graph::analyze_latest_iteration(*t, -1);
    ASSERT_TRUE(it.ok()) << e.path() << ": " << it.status();
    std::string digest;
    for (int run = 0; run < 2; ++run) {
      ExprPool pool;
      auto ir = build_ir001(*t, (*it)->ops(), pool);
      ASSERT_TRUE(ir.ok()) << e.path();
      Policy policy;
      auto fe = run_front_end(std::move(*ir), *rules, policy);
      ASSERT_TRUE(fe.ok()) << e.path() << ": " << fe.status();
      EXPECT_TRUE(verify(fe->ir).ok());
      EXPECT_EQ(fe->phases.size(), 6u);
      EXPECT_EQ(fe->plan_digest.size(), 64u);
      if (run == 0) digest = fe->plan_digest;
      else EXPECT_EQ(fe->plan_digest, digest) << e.path();
      // Every node in exactly one group.
      std::vector<int> seen(fe->ir.nodes.size(), 0);
      for (const FusionGroup& g : fe->plan.groups) for (std::uint32_t n : g.nodes) ++seen[n];
      for (int s : seen) EXPECT_EQ(s, 1);
    }
  }
}

}  // namespace
}  // namespace crucible::forge
