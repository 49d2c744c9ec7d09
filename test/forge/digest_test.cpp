// digest_test — the canonical plan text and its digests: same IR -> same text, what runs changes
// it, rule ids / module paths / comments do not move the plan digest, SHA-256 known answers, and
// the golden plans of the recorded test models (test/forge/golden/README.md).
#include "crucible/forge/Digest.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "crucible/forge/Passes.h"
#include "crucible/graph/Analysis.h"
#include "crucible/record/TraceFile.h"
#include "ir_fixture.h"
#include "traces.h"

namespace crucible::forge {
namespace {

using test::IrFixture;
using test::rule;
using test::rules_from;

TEST(Sha256, KnownAnswers) {
  EXPECT_EQ(sha256_hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(sha256_hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
}

const std::string kBase = "[class]\nname = \"base\"\n" +
                          rule("gemm", "[\"GEMM\"]", "gemm_epilogue", 100) +
                          rule("unary", "[\"POINTWISE_UNARY\"]", "pointwise_chain", 50) +
                          rule("fallback", "[\"*\"]", "opaque", 0);
const std::string kTop = "[class]\nname = \"top\"\nextends = \"base\"\n" +
                         rule("gemm_act", "[\"GEMM\", \"POINTWISE_UNARY\"]", "gemm_epilogue", 300) +
                         rule("unused", "[\"CONV\", \"POINTWISE_UNARY\"]", "conv_epilogue", 300);

RuleSet rules_of(const std::string& base, const std::string& top) {
  auto r = rules_from({{"base", base}, {"top", top}}, "top");
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *r : RuleSet{};
}

// x -> mm(w) -> relu -> sigmoid; `edit` changes one thing before done().
template <class Edit>
std::string plan_text_of(const RuleSet& rules, Edit edit) {
  IrFixture f;
  const auto x = f.input({32, 64});
  const auto w = f.input({64, 16}, record::ExternalKind::Parameter);
  const auto y = f.op("aten::mm", CKernel::Gemm, {x, w}, {32, 16});
  const auto r = f.op("aten::relu", CKernel::PointwiseUnary, {y}, {32, 16});
  f.op("aten::sigmoid", CKernel::PointwiseUnary, {r}, {32, 16});
  f.ir.module_paths = {"", "fc1", "act"};
  f.ir.nodes[0].module_id = 1;
  edit(f);
  f.done();
  PassContext ctx;
  ctx.rules = &rules;
  auto groups = fuse(f.ir, ctx);
  EXPECT_TRUE(groups.ok()) << groups.status();
  auto plan = lower(f.ir, std::move(*groups), ctx);
  EXPECT_TRUE(plan.ok()) << plan.status();
  return canonical_plan_text(f.ir, *plan, rules);
}
std::string plan_text_of(const RuleSet& rules) {
  return plan_text_of(rules, [](IrFixture&) {});
}

TEST(PlanText, HeaderGroupsAndEdges) {
  const RuleSet rules = rules_of(kBase, kTop);
  const std::string t = plan_text_of(rules);
  EXPECT_EQ(t.rfind("crucible-plan v1 hardware=top rules=" + rules.digest + "\n", 0), 0u) << t;
  const std::string expected =
      "group 0 gemm_epilogue numerics=reference recipe=[acc=f32 io=f32 red=seq round=rne "
      "scale=none det=ordered fma] ops=2 | n0=aten::mm@fwd(v0,v1)->(v2:float32[32,16]) | "
      "n1=aten::relu@fwd(v2)->(v3:float32[32,16])\n"
      "group 1 pointwise_chain numerics=reference recipe=[acc=f32 io=f32 red=seq round=rne "
      "scale=none det=ordered fma] ops=1 | n2=aten::sigmoid@fwd(v3)->(v4:float32[32,16])\n"
      "edge v0 ext(input)->g0 materialized float32[32,64]\n"
      "edge v1 ext(parameter)->g0 materialized float32[64,16]\n"
      "edge v2 g0->g0 fused float32[32,16]\n"
      "edge v3 g0->g1 materialized float32[32,16]\n";
  EXPECT_EQ(t.substr(t.find('\n') + 1), expected);
  // No rule ids, no module paths.
  EXPECT_EQ(t.find("gemm_act"), std::string::npos);
  EXPECT_EQ(t.find("fc1"), std::string::npos);
}

TEST(PlanText, SameIrSameTextWhatRunsChangesIt) {
  const RuleSet rules = rules_of(kBase, kTop);
  const std::string t0 = plan_text_of(rules);
  EXPECT_EQ(t0, plan_text_of(rules));  // fresh pool, fresh IR: same bytes
  const std::string d0 = plan_text_digest(t0);
  EXPECT_EQ(d0.size(), 64u);
  auto differs = [&](auto edit, const char* what) {
    const std::string t = plan_text_of(rules, edit);
    EXPECT_NE(t, t0) << what;
    EXPECT_NE(plan_text_digest(t), d0) << what;
  };
  differs([](IrFixture& f) { f.ir.values[2].shape[1] = f.pool().constant(17); }, "a shape");
  differs([](IrFixture& f) { f.ir.values[3].dtype = 15; }, "a dtype");
  differs([](IrFixture& f) { f.ir.nodes[2].op = "aten::tanh"; }, "an op");
  differs([](IrFixture& f) { f.ir.nodes[2].phase = record::Phase::Backward; }, "a phase");
  differs([](IrFixture& f) { f.ir.values[1].external = 5; }, "an external's kind");
  differs(
      [](IrFixture& f) {
        f.ir.nodes[1].scalars.push_back({record::ScalarKind::Double, 0, 1, 0, 42});
      },
      "a scalar argument");
  differs([](IrFixture& f) { f.ir.values[2].live_out = true; },
          "what the kernel stores (live-out intermediate: fused+stored)");
  // A symbolic dim prints as its expression.
  const std::string sym = plan_text_of(rules, [](IrFixture& f) {
    f.ir.values[0].shape[0] = f.pool().mul(f.pool().constant(32), f.pool().symbol("B"));
  });
  EXPECT_NE(sym.find("float32[B*32,64]"), std::string::npos) << sym;
}

TEST(PlanText, RuleIdsModulePathsAndCommentsDoNotMoveThePlanDigest) {
  const RuleSet r0 = rules_of(kBase, kTop);
  const std::string t0 = plan_text_of(r0);
  const std::string d0 = plan_text_digest(t0);
  // Rename the rule that formed group 0, edit an unused rule, add a comment.
  std::string renamed = kTop;
  renamed.replace(renamed.find("\"gemm_act\""), 10, "\"mm_relu\"");
  std::string unused = kTop;
  unused.replace(unused.find("\"conv_epilogue\""), 15, "\"pointwise_chain\"");
  for (const RuleSet& r :
       {rules_of(kBase, renamed), rules_of(kBase, unused), rules_of(kBase + "# why\n", kTop)}) {
    EXPECT_NE(r.digest, r0.digest);
    const std::string t = plan_text_of(r);
    EXPECT_NE(t, t0);  // the header carries the rules digest ...
    EXPECT_EQ(t.substr(t.find('\n')), t0.substr(t0.find('\n')));
    EXPECT_EQ(plan_text_digest(t), d0);  // ... which the plan digest leaves out
  }
  // Module paths are not in the text at all.
  const std::string t1 =
      plan_text_of(r0, [](IrFixture& f) { f.ir.module_paths[1] = "encoder.fc"; });
  EXPECT_EQ(t1, t0);
  // A rule change that changes what runs moves it.
  std::string weaker = kTop;
  weaker.replace(weaker.find("[\"GEMM\", \"POINTWISE_UNARY\"]"), 27,
                 "[\"CONV\", \"POINTWISE_UNARY\"]");
  EXPECT_NE(plan_text_digest(plan_text_of(rules_of(kBase, weaker))), d0);
}

// Golden plans: each recorded model (symbolic over its first two batch sizes) planned for each
// shipped class under the default training policy, compared byte for byte with
// test/forge/golden/<model>_<class>.plan.txt. CRUCIBLE_UPDATE_GOLDEN=1 rewrites the files.
std::filesystem::path golden_dir() {
  return std::filesystem::path(CRUCIBLE_SOURCE_DIR) / "test" / "forge" / "golden";
}

Result<Ir001> model_ir(const std::string& model, std::int64_t b1, std::int64_t b2, ExprPool& pool) {
  Ir001 irs[2];
  const std::int64_t batches[2] = {b1, b2};
  for (int i = 0; i < 2; ++i) {
    const auto path = traces_dir() / (model + "_b" + std::to_string(batches[i]) + ".crtrace");
    auto t = record::load_trace(path.string());
    if (!t.ok()) return t.status();
    auto it = graph::analyze_latest_iteration(*t, -1);
    if (!it.ok()) return it.status();
    auto ir = build_ir001(*t, (*it)->ops(), pool);
    if (!ir.ok()) return ir.status();
    irs[i] = std::move(*ir);
  }
  return symbolize_batch(irs[0], irs[1], pool);
}

TEST(GoldenPlans, RecordedModelsMatchByteForByte) {
  if (!std::filesystem::exists(traces_dir() / "index.json"))
    GTEST_SKIP() << "no recorded traces in " << traces_dir();
  const char* env = std::getenv("CRUCIBLE_UPDATE_GOLDEN");
  const bool update = env != nullptr && std::string(env) == "1";
  std::ifstream in(traces_dir() / "index.json");
  const nlohmann::json index = nlohmann::json::parse(in);
  std::size_t checked = 0;
  for (const char* cls : {"cpu-avx2", "h200"}) {
    auto rules = load_rules_dir(CRUCIBLE_RULES_DIR, cls);
    ASSERT_TRUE(rules.ok()) << rules.status();
    for (const auto& [model, batches] : index.items()) {
      ASSERT_GE(batches.size(), 2u) << model;
      ExprPool pool;
      auto ir =
          model_ir(model, batches[0].get<std::int64_t>(), batches[1].get<std::int64_t>(), pool);
      ASSERT_TRUE(ir.ok()) << model << ": " << ir.status();
      // No budget: a plan cut short by a slow (sanitized) build would not be reproducible.
      auto fe = run_front_end(std::move(*ir), *rules, Policy{}, 1e15);
      ASSERT_TRUE(fe.ok()) << model << " on " << cls << ": " << fe.status();
      const std::string text =
          fe->plan_text + "plan-digest " + plan_text_digest(fe->plan_text) + "\n";
      const auto path = golden_dir() / (model + "_" + cls + ".plan.txt");
      if (update) {
        std::filesystem::create_directories(golden_dir());
        std::ofstream(path, std::ios::binary) << text;
        continue;
      }
      std::ifstream g(path, std::ios::binary);
      ASSERT_TRUE(g.good()) << path
                            << " is missing; run with CRUCIBLE_UPDATE_GOLDEN=1 "
                               "(test/forge/golden/README.md)";
      std::stringstream want;
      want << g.rdbuf();
      const std::string w = want.str();
      ++checked;
      if (w == text) continue;
      // Only the header (the rules digest) moved: the rules were edited, the plan is the same.
      const std::string tail_w = w.substr(w.find('\n') + 1),
                        tail_t = text.substr(text.find('\n') + 1);
      if (tail_w == tail_t) {
        ADD_FAILURE() << path.filename() << ": only the rules digest line changed (the rules "
                      << "were edited; the plan itself is the same). Regenerate: "
                      << "CRUCIBLE_UPDATE_GOLDEN=1 ctest -R GoldenPlans";
        continue;
      }
      std::size_t line = 1, i = 0;
      while (i < w.size() && i < text.size() && w[i] == text[i]) line += w[i++] == '\n';
      ADD_FAILURE() << path.filename() << ": the plan changed, first at line " << line
                    << " (a changed plan digest means what runs changed). If intended, "
                    << "regenerate: CRUCIBLE_UPDATE_GOLDEN=1 ctest -R GoldenPlans";
    }
  }
  if (!update) {
    EXPECT_GT(checked, 0u);
  }
}

}  // namespace
}  // namespace crucible::forge
