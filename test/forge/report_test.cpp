// report_test — the hardware table, plan_report (edges, memory fit, roofline) and venn_report on
// hand-built plans, text and JSON.
#include "crucible/forge/Report.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "crucible/forge/Digest.h"
#include "crucible/graph/Analysis.h"
#include "crucible/record/TraceFile.h"
#include "ir_fixture.h"

namespace crucible::forge {
namespace {

using test::IrFixture;

TEST(Hardware, TableEntries) {
  const auto names = hardware_names();
  EXPECT_EQ(names, (std::vector<std::string_view>{"cpu-avx2", "h200"}));
  EXPECT_EQ(hardware_by_name("tpu"), nullptr);
  const Hardware* h = hardware_by_name("h200");
  ASSERT_NE(h, nullptr);
  EXPECT_DOUBLE_EQ(h->bandwidth, 4.8e12);
  EXPECT_DOUBLE_EQ(h->peak_flops, 989e12);
  EXPECT_LE(h->memory_bytes, static_cast<std::int64_t>(141e9));
  EXPECT_GE(h->memory_bytes, static_cast<std::int64_t>(120e9));
  EXPECT_FALSE(h->measured);
  const Hardware* c = hardware_by_name("cpu-avx2");
  ASSERT_NE(c, nullptr);
  EXPECT_GT(c->peak_flops, 1e10);
  EXPECT_LT(c->peak_flops, 1e12);
  EXPECT_GT(c->bandwidth, 1e9);
  for (std::string_view n : names) {  // every hardware class has its rules file
    auto r = load_rules_dir(CRUCIBLE_RULES_DIR, n);
    EXPECT_TRUE(r.ok()) << n << ": " << r.status();
  }
}

// x(input) -> relu -> a -> neg -> b -> exp -> c -> sin -> d (live-out), one group per node, every
// activation 64 KiB; plus a 1 KiB parameter read by the first node and a 4 KiB optimizer state.
struct Chain {
  IrFixture f;
  FrontEndResult fe;
  Chain() {
    const auto x = f.input({16384});
    const auto p = f.input({256}, record::ExternalKind::Parameter);
    const auto s = f.input({1024}, record::ExternalKind::OptimizerState);
    auto v = f.op("aten::add.Tensor", CKernel::PointwiseBinary, {x, p}, {16384});
    v = f.op("aten::neg", CKernel::PointwiseUnary, {v}, {16384});
    v = f.op("aten::exp", CKernel::PointwiseUnary, {v}, {16384});
    v = f.op("aten::mul.Tensor", CKernel::PointwiseBinary, {v, s}, {16384});
    f.done();
    std::vector<FusionGroup> groups;
    for (std::uint32_t n = 0; n < 4; ++n) {
      FusionGroup g;
      g.id = n;
      g.rule = "r";
      g.kernel = KernelTemplate::PointwiseChain;
      g.recipe = recipe_by_name("f32_strict");
      g.nodes = {n};
      groups.push_back(g);
    }
    groups[2].kernel = KernelTemplate::Opaque;  // exp runs op by op
    groups[2].recipe = nullptr;
    PassContext ctx;
    auto plan = lower(f.ir, groups, ctx);
    EXPECT_TRUE(plan.ok()) << plan.status();
    fe.plan = std::move(*plan);
    fe.phases = ctx.phases;
    RuleSet rs;
    rs.hardware = "cpu-avx2";
    fe.plan_text = canonical_plan_text(f.ir, fe.plan, rs);
    fe.plan_digest = plan_text_digest(fe.plan_text);
    fe.ir = f.ir;
  }
};

TEST(PlanReport, EdgesMemoryFitAndRoofline) {
  Chain c;
  RuleSet rs;
  rs.hardware = "cpu-avx2";
  rs.chain = {"cpu-avx2", "base"};
  rs.digest = std::string(64, 'a');
  const Hardware& hw = *hardware_by_name("cpu-avx2");
  const PlanReport r = plan_report(c.fe, rs, hw);
  const auto j = nlohmann::json::parse(r.json);
  EXPECT_EQ(j["plan_digest"], c.fe.plan_digest);
  EXPECT_EQ(j["groups"].size(), 4u);
  EXPECT_EQ(j["edges"]["fused"], 0);
  EXPECT_EQ(j["edges"]["materialized"], 6);  // x, p, a, b, c, s
  EXPECT_EQ(j["edges"]["materialized_bytes"], 4 * 65536 + 1024 + 4096);
  EXPECT_EQ(j["memory"]["weights"], 1024);
  EXPECT_EQ(j["memory"]["state"], 4096);
  // a lives [0,1], b [1,2], c [2,3], d [3,3] (live-out: to the end): two blocks at a time.
  EXPECT_EQ(j["memory"]["activation_arena"], 2 * 65536);
  EXPECT_EQ(j["memory"]["materialized_bytes"], 4 * 65536);
  EXPECT_EQ(j["memory"]["fits"], true);
  // Roofline: every node here is memory-bound on the CPU (1 FLOP per 8+ bytes).
  double want = 0;
  for (const KernelNode& k : c.fe.plan.kernels)
    want += std::max(static_cast<double>(k.bytes) / hw.bandwidth,
                     static_cast<double>(k.flops) / hw.peak_flops);
  EXPECT_NEAR(j["roofline"]["time_s"].get<double>(), want, want * 1e-12);
  EXPECT_EQ(j["roofline"]["memory_bound_groups"], 4);
  EXPECT_EQ(j["roofline"]["label"], std::string(hw.measured ? "measured" : hw.source));
  EXPECT_NE(r.text.find(std::string(hw.source)), std::string::npos) << r.text;
  EXPECT_NE(r.text.find("aten::exp"), std::string::npos);
  EXPECT_NE(r.text.find("fits"), std::string::npos);
  EXPECT_NE(r.text.find("1 run op by op"), std::string::npos) << r.text;
  EXPECT_EQ(j["phases"].size(), 1u);
}

TEST(PlanReport, DoesNotFitIsSaid) {
  Chain c;
  Hardware tiny = *hardware_by_name("cpu-avx2");
  tiny.memory_bytes = 1000;
  const PlanReport r = plan_report(c.fe, RuleSet{}, tiny);
  EXPECT_NE(r.text.find("DOES NOT FIT"), std::string::npos) << r.text;
  EXPECT_EQ(nlohmann::json::parse(r.json)["memory"]["fits"], false);
}

TEST(PlanReport, TensorCoreRecipesUseTheTensorCorePeak) {
  // One big GEMM on the H200: bf16 recipe -> 989 TFLOPS, f32 recipe -> 67 TFLOPS.
  IrFixture f;
  const auto a = f.input({4096, 4096});
  f.op("aten::mm", CKernel::Gemm, {a, a}, {4096, 4096});
  f.done();
  f.ir.nodes[0].flops = 2LL * 4096 * 4096 * 4096;
  std::vector<FusionGroup> g(1);
  g[0].kernel = KernelTemplate::GemmEpilogue;
  g[0].nodes = {0};
  const Hardware& hw = *hardware_by_name("h200");
  double times[2];
  for (int i = 0; i < 2; ++i) {
    g[0].recipe = recipe_by_name(i == 0 ? "bf16_f32acc_tc" : "f32_ordered");
    PassContext ctx;
    FrontEndResult fe;
    fe.ir = f.ir;
    fe.plan = *lower(f.ir, g, ctx);
    const auto j = nlohmann::json::parse(plan_report(fe, RuleSet{}, hw).json);
    EXPECT_EQ(j["groups"][0]["bound"], "compute");
    times[i] = j["roofline"]["time_s"].get<double>();
  }
  EXPECT_NEAR(times[0], 2.0 * 4096 * 4096 * 4096 / 989e12, 1e-12);
  EXPECT_NEAR(times[1], 2.0 * 4096 * 4096 * 4096 / 67e12, 1e-12);
}

TEST(VennReport, ClassesRankedByShare) {
  Chain c;
  const Hardware& hw = *hardware_by_name("cpu-avx2");
  const PlanReport r = venn_report(c.fe, hw);
  const auto j = nlohmann::json::parse(r.json);
  ASSERT_EQ(j["kinds"].size(), 2u);
  // Binary nodes read more bytes (two inputs) than the unary ones: they rank first.
  EXPECT_EQ(j["kinds"][0]["kind"], "POINTWISE_BINARY");
  EXPECT_EQ(j["kinds"][0]["native"], 2);
  EXPECT_EQ(j["kinds"][1]["kind"], "POINTWISE_UNARY");
  EXPECT_EQ(j["kinds"][1]["native"], 1);
  EXPECT_EQ(j["kinds"][1]["fallback"], 1);  // exp's group is opaque
  EXPECT_EQ(j["native"], 3);
  EXPECT_EQ(j["fallback"], 1);
  double share = 0;
  for (const auto& k : j["kinds"]) share += k["share"].get<double>();
  EXPECT_NEAR(share, 1.0, 1e-9);
  EXPECT_NE(r.text.find("aten::exp x1"), std::string::npos) << r.text;
  // A kind the target has no family for is a fallback even in a non-opaque group.
  Hardware no_pointwise = hw;
  no_pointwise.families = {CKernel::Gemm};
  EXPECT_EQ(nlohmann::json::parse(venn_report(c.fe, no_pointwise).json)["fallback"], 4);
}

// Both reports on every recorded model (first batch size) for every hardware class.
TEST(Reports, RecordedModels) {
  const std::filesystem::path dir = CRUCIBLE_FORGE_TRACES;
  if (!std::filesystem::exists(dir / "index.json")) GTEST_SKIP() << "no recorded traces in " << dir;
  std::ifstream in(dir / "index.json");
  const nlohmann::json index = nlohmann::json::parse(in);
  for (std::string_view cls : hardware_names()) {
    auto rules = load_rules_dir(CRUCIBLE_RULES_DIR, cls);
    ASSERT_TRUE(rules.ok()) << rules.status();
    const Hardware& hw = *hardware_by_name(cls);
    for (const auto& [model, batches] : index.items()) {
      const auto path = dir / (model + "_b" + std::to_string(batches[0].get<int>()) + ".crtrace");
      auto t = record::load_trace(path.string());
      ASSERT_TRUE(t.ok()) << path;
      auto it = graph::analyze_latest_iteration(*t, -1);
      ASSERT_TRUE(it.ok()) << path;
      ExprPool pool;
      auto ir = build_ir001(*t, (*it)->ops(), pool);
      ASSERT_TRUE(ir.ok()) << path;
      auto fe = run_front_end(std::move(*ir), *rules, Policy{}, 1e15);
      ASSERT_TRUE(fe.ok()) << path << ": " << fe.status();
      const PlanReport plan = plan_report(*fe, *rules, hw);
      const auto j = nlohmann::json::parse(plan.json);
      EXPECT_EQ(j["groups"].size(), fe->plan.groups.size());
      EXPECT_EQ(
          j["edges"]["fused"].get<std::size_t>() + j["edges"]["materialized"].get<std::size_t>(),
          fe->plan.edges.size());
      EXPECT_GT(j["memory"]["weights"].get<std::int64_t>(), 0) << model;
      EXPECT_GT(j["memory"]["activation_arena"].get<std::int64_t>(), 0) << model;
      EXPECT_LE(j["memory"]["activation_arena"].get<std::int64_t>(),
                j["memory"]["materialized_bytes"].get<std::int64_t>() + 256 * 4096);
      EXPECT_TRUE(j["memory"]["fits"].get<bool>()) << model << " on " << cls;
      EXPECT_GT(j["roofline"]["time_s"].get<double>(), 0);
      const PlanReport venn = venn_report(*fe, hw);
      const auto v = nlohmann::json::parse(venn.json);
      EXPECT_EQ(v["native"].get<std::size_t>() + v["fallback"].get<std::size_t>(),
                fe->ir.nodes.size());
      EXPECT_NE(plan.text.find(cls == std::string("h200") ? "datasheet ceiling" : "estimate"),
                std::string::npos);
      EXPECT_NE(venn.text.find(" native, "), std::string::npos);
    }
  }
}

}  // namespace
}  // namespace crucible::forge
