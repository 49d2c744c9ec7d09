// rules_test — rules TOML: strict parsing with errors naming file/rule/key, extends (override,
// cycles, missing bases), the rules digest, the shipped classes; recipes and template names.
#include "crucible/forge/Rules.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <thread>

#include "crucible/forge/Digest.h"
#include "crucible/forge/NumericalRecipe.h"
#include "ir_fixture.h"

namespace crucible::forge {
namespace {

using test::rule;
using test::rules_from;

const std::string kHead = "[class]\nname = \"t\"\ncapabilities = [\"avx2\"]\n";

// The error message of parsing class "t" from `text`.
std::string error_of(const std::string& text) {
  auto r = rules_from({{"t", text}}, "t");
  EXPECT_FALSE(r.ok()) << "parsed:\n" << text;
  return r.ok() ? std::string() : std::string(r.status().message());
}

TEST(Rules, ParsesEveryKey) {
  auto r = rules_from({{"t", kHead + R"(
[[rule]]
id = "conv_bias_relu"
pattern = ["CONV", "POINTWISE_BINARY?", "aten::relu"]
kernel = "conv_epilogue"
recipe = "f32_blocked8"
modes = ["infer"]
rows = [4, 4096]
requires = ["avx2"]
numerics = "bit_identical"
priority = 300
settings = ["allow_tf32", "deterministic=true"]
note = "not hashed into plans"
)"}},
                      "t");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->hardware, "t");
  EXPECT_EQ(r->chain, std::vector<std::string>{"t"});
  EXPECT_EQ(r->capabilities, std::vector<std::string>{"avx2"});
  ASSERT_EQ(r->rules.size(), 1u);
  const Rule& x = r->rules[0];
  EXPECT_EQ(x.id, "conv_bias_relu");
  ASSERT_EQ(x.pattern.size(), 3u);
  EXPECT_EQ(x.pattern[0].kinds, std::vector<CKernel>{CKernel::Conv});
  EXPECT_FALSE(x.pattern[0].optional);
  EXPECT_EQ(x.pattern[1].kinds, std::vector<CKernel>{CKernel::PointwiseBinary});
  EXPECT_TRUE(x.pattern[1].optional);
  EXPECT_TRUE(x.pattern[2].kinds.empty());
  EXPECT_EQ(x.pattern[2].op, "aten::relu");
  EXPECT_EQ(x.kernel, KernelTemplate::ConvEpilogue);
  EXPECT_EQ(x.recipe, recipe_by_name("f32_blocked8"));
  EXPECT_FALSE(x.train);
  EXPECT_TRUE(x.infer);
  EXPECT_EQ(x.rows_min, 4);
  EXPECT_EQ(x.rows_max, 4096);
  EXPECT_EQ(x.requires_caps, std::vector<std::string>{"avx2"});
  EXPECT_EQ(x.numerics, Numerics::BitIdentical);
  EXPECT_EQ(x.priority, 300);
  EXPECT_EQ(x.settings, (std::vector<std::string>{"allow_tf32", "deterministic=true"}));
  EXPECT_EQ(x.source, "t.toml");
  EXPECT_EQ(r->digest.size(), 64u);
}

TEST(Rules, RepeatedStepsAlternativesPhasesAndHorizontal) {
  auto r = rules_from(
      {{"t", kHead +
                 rule("chain", "[\"POINTWISE_UNARY|POINTWISE_BINARY\", \"VIEW*\", \"REDUCE+\"]",
                      "reduce", 210, "recipe = \"f32_pairwise\"\n") +
                 rule("zero", "[\"aten::zero_\"]", "optimizer", 500,
                      "horizontal = true\nphases = [\"optimizer\", \"forward\"]\n")}},
      "t");
  ASSERT_TRUE(r.ok()) << r.status();
  const Rule& c = r->rules[0];
  ASSERT_EQ(c.pattern.size(), 3u);
  EXPECT_EQ(c.pattern[0].kinds,
            (std::vector<CKernel>{CKernel::PointwiseUnary, CKernel::PointwiseBinary}));
  EXPECT_FALSE(c.pattern[0].optional || c.pattern[0].repeated);
  EXPECT_EQ(c.pattern[1].kinds, std::vector<CKernel>{CKernel::View});
  EXPECT_TRUE(c.pattern[1].optional && c.pattern[1].repeated);  // "*": zero or more
  EXPECT_TRUE(!c.pattern[2].optional && c.pattern[2].repeated);  // "+": one or more
  EXPECT_FALSE(c.horizontal);
  EXPECT_TRUE(c.phases.empty());
  const Rule& z = r->rules[1];
  EXPECT_TRUE(z.horizontal);
  EXPECT_EQ(z.pattern[0].op, "aten::zero_");
  EXPECT_EQ(z.phases,
            (std::vector<record::Phase>{record::Phase::Optimizer, record::Phase::Forward}));
}

TEST(Rules, DefaultsAndTheFallback) {
  auto r = rules_from({{"t", kHead + rule("g", "[\"GEMM\"]", "gemm_epilogue", 100) +
                                 rule("any", "[\"*\"]", "opaque", 0)}},
                      "t");
  ASSERT_TRUE(r.ok()) << r.status();
  const Rule& g = r->rules[0];
  EXPECT_TRUE(g.train && g.infer);
  EXPECT_EQ(g.rows_min, 0);
  EXPECT_EQ(g.rows_max, INT64_MAX);
  EXPECT_EQ(g.numerics, Numerics::Reference);
  const Rule& any = r->rules[1];
  ASSERT_EQ(any.pattern.size(), 1u);
  EXPECT_TRUE(any.pattern[0].kinds.empty());
  EXPECT_TRUE(any.pattern[0].op.empty());
  EXPECT_EQ(any.recipe, nullptr);
}

TEST(Rules, StrictErrorsNameFileRuleAndKey) {
  struct Case {
    std::string text, needles[3];
  };
  const std::string ok_rule = rule("r1", "[\"GEMM\"]", "gemm_epilogue", 100);
  const Case cases[] = {
      {kHead + ok_rule + "colour = \"red\"\n", {"t.toml", "rule \"r1\"", "key \"colour\""}},
      {kHead + rule("r1", "[\"POINTWISE_UNARY|GEM+\"]", "pointwise_chain", 200),
       {"rule \"r1\"", "unknown kind \"GEM\"", "key \"pattern\""}},
      {kHead + rule("r1", "[\"POINTWISE_UNARY|\", \"GEMM\"]", "pointwise_chain", 200),
       {"rule \"r1\"", "ends with \"|\"", "key \"pattern\""}},
      {kHead + rule("r1", "[\"aten::mm|aten::bmm\"]", "gemm_epilogue", 100),
       {"rule \"r1\"", "joins ops", "key \"pattern\""}},
      {kHead + rule("r1", "[\"POINTWISE_UNARY+\"]", "pointwise_chain", 100),
       {"rule \"r1\"", "key \"priority\"", "200..999"}},
      {kHead + rule("r1", "[\"aten::zero_\"]", "optimizer", 100, "horizontal = true\n"),
       {"rule \"r1\"", "key \"priority\"", "200..999"}},
      {kHead + rule("r1", "[\"aten::zero_\"]", "optimizer", 300, "horizontal = 1\n"),
       {"rule \"r1\"", "key \"horizontal\"", "boolean"}},
      {kHead + rule("r1", "[\"aten::zero_\"]", "optimizer", 300, "phases = [\"opt\"]\n"),
       {"rule \"r1\"", "key \"phases\"", "unknown phase \"opt\""}},
      {kHead + rule("r1", "[\"POINTWISE_UNARY\", \"REDUCE\"]", "reduce", 300,
                    "recipe = \"f32_strict\"\n"),
       {"rule \"r1\"", "key \"recipe\"", "bit-exact but the pattern reduces (REDUCE)"}},
      {kHead + rule("r1", "[\"aten::mm\", \"POINTWISE_UNARY\"]", "gemm_epilogue", 300,
                    "recipe = \"f32_strict\"\n"),
       {"rule \"r1\"", "key \"recipe\"", "reduces (GEMM)"}},
      {kHead + rule("r1", "[\"GEM\"]", "gemm_epilogue", 100),
       {"t.toml", "unknown kind \"GEM\"", "key \"pattern\""}},
      {kHead + rule("r1", "[\"GEMM\"]", "gemm_prologue", 100),
       {"rule \"r1\"", "key \"kernel\"", "gemm_prologue"}},
      {kHead + rule("r1", "[\"GEMM\"]", "gemm_epilogue", 100, "recipe = \"f64_magic\"\n"),
       {"rule \"r1\"", "key \"recipe\"", "f64_magic"}},
      {kHead + "[[rule]]\npattern = [\"GEMM\"]\nkernel = \"opaque\"\npriority = 10\n",
       {"t.toml", "rule #1", "key \"id\""}},
      {kHead + rule("r1", "[\"GEMM\"]", "gemm_epilogue", 300),
       {"rule \"r1\"", "key \"priority\"", "10..199"}},
      {kHead + rule("r1", "[\"GEMM\", \"POINTWISE_UNARY\"]", "gemm_epilogue", 100),
       {"rule \"r1\"", "key \"priority\"", "200..999"}},
      {kHead + rule("r1", "[\"*\"]", "opaque", 10),
       {"rule \"r1\"", "key \"priority\"", "priority 0"}},
      {kHead + rule("r1", "[\"*\"]", "gemm_epilogue", 0),
       {"rule \"r1\"", "key \"kernel\"", "opaque"}},
      {kHead + rule("r1", "[\"GEMM\", \"*\"]", "gemm_epilogue", 300),
       {"rule \"r1\"", "key \"pattern\"", "\"*\""}},
      {kHead + rule("r1", "[\"GEMM?\"]", "gemm_epilogue", 100),
       {"rule \"r1\"", "key \"pattern\"", "optional"}},
      {kHead + rule("r1", "[\"GEMM\"]", "gemm_epilogue", 100, "rows = [10, 5]\n"),
       {"rule \"r1\"", "key \"rows\"", "[10, 5]"}},
      {kHead + rule("r1", "[\"GEMM\"]", "gemm_epilogue", 100, "modes = [\"serve\"]\n"),
       {"rule \"r1\"", "key \"modes\"", "serve"}},
      {kHead + rule("r1", "[\"GEMM\"]", "gemm_epilogue", 100, "numerics = \"close\"\n"),
       {"rule \"r1\"", "key \"numerics\"", "close"}},
      {kHead + rule("r1", "[\"GEMM\"]", "gemm_epilogue", 100, "settings = [\"=x\"]\n"),
       {"rule \"r1\"", "key \"settings\"", "=x"}},
      {kHead + rule("r1", "[\"GEMM\"]", "gemm_epilogue", 100, "priority = 5\n"),
       {"t.toml", "", ""}},  // duplicate key: TOML error
      {kHead + ok_rule + ok_rule, {"t.toml", "rule \"r1\"", "used twice"}},
      {kHead + rule("r1", "[\"GEMM\"]", "gemm_epilogue", 100) + "[[rule]]\nid = \"r2\"\n",
       {"rule \"r2\"", "key \"pattern\"", "missing"}},
      {"[class]\nname = \"u\"\n", {"t.toml", "[class]", "key \"name\""}},
      {"[class]\nname = \"t\"\nowner = \"me\"\n", {"t.toml", "[class]", "key \"owner\""}},
      {"[klass]\nname = \"t\"\n", {"t.toml", "key \"klass\"", "top-level"}},
      {"[[rule]]\nid = \"x\"\n", {"t.toml", "[class]", "missing"}},
      {kHead + "[[rule]\n", {"t.toml", "line 4", "TOML"}},
  };
  for (const Case& c : cases) {
    const std::string m = error_of(c.text);
    for (const std::string& needle : c.needles)
      EXPECT_NE(m.find(needle), std::string::npos) << "'" << needle << "' not in: " << m;
  }
}

TEST(Rules, ExtendsOverridesInPlaceAndAccumulatesCapabilities) {
  const std::map<std::string, std::string> files = {
      {"base", "[class]\nname = \"base\"\ncapabilities = [\"x86_64\"]\n" +
                   rule("a", "[\"GEMM\"]", "gemm_epilogue", 100) +
                   rule("b", "[\"CONV\"]", "conv_epilogue", 100) +
                   rule("c", "[\"REDUCE\"]", "reduce", 50)},
      {"mid", "[class]\nname = \"mid\"\nextends = \"base\"\ncapabilities = [\"avx2\"]\n" +
                  rule("b", "[\"CONV\"]", "conv_epilogue", 150, "recipe = \"f32_blocked8\"\n") +
                  rule("d", "[\"NORM\"]", "norm", 50)},
      {"top", "[class]\nname = \"top\"\nextends = \"mid\"\ncapabilities = [\"avx2\", \"fma\"]\n" +
                  rule("a", "[\"GEMM\"]", "gemm_epilogue", 120)},
  };
  auto r = rules_from(files, "top");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->chain, (std::vector<std::string>{"top", "mid", "base"}));
  EXPECT_EQ(r->capabilities, (std::vector<std::string>{"x86_64", "avx2", "fma"}));
  std::vector<std::string> ids;
  for (const Rule& x : r->rules) ids.push_back(x.id);
  EXPECT_EQ(ids, (std::vector<std::string>{"a", "b", "c", "d"}));
  EXPECT_EQ(r->rules[0].priority, 120);
  EXPECT_EQ(r->rules[0].source, "top.toml");
  EXPECT_EQ(r->rules[1].recipe, recipe_by_name("f32_blocked8"));
  EXPECT_EQ(r->rules[1].source, "mid.toml");
  EXPECT_EQ(r->rules[2].source, "base.toml");
}

TEST(Rules, ExtendsCycleAndMissingBaseAreErrors) {
  auto cyc = rules_from({{"a", "[class]\nname = \"a\"\nextends = \"b\"\n"},
                         {"b", "[class]\nname = \"b\"\nextends = \"c\"\n"},
                         {"c", "[class]\nname = \"c\"\nextends = \"a\"\n"}},
                        "a");
  ASSERT_FALSE(cyc.ok());
  EXPECT_NE(cyc.status().message().find("cycle: a -> b -> c -> a"), std::string::npos)
      << cyc.status();
  auto self = rules_from({{"a", "[class]\nname = \"a\"\nextends = \"a\"\n"}}, "a");
  ASSERT_FALSE(self.ok());
  EXPECT_NE(self.status().message().find("a -> a"), std::string::npos) << self.status();
  auto missing = rules_from({{"a", "[class]\nname = \"a\"\nextends = \"zz\"\n"}}, "a");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("\"zz\" (extended by \"a\")"), std::string::npos)
      << missing.status();
}

TEST(Rules, DigestIsOverTheChainTexts) {
  const std::string base =
      "[class]\nname = \"base\"\n" + rule("a", "[\"GEMM\"]", "gemm_epilogue", 100);
  const std::string top = "[class]\nname = \"top\"\nextends = \"base\"\n";
  auto d = [&](const std::string& b, const std::string& t) {
    auto r = rules_from({{"base", b}, {"top", t}}, "top");
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? r->digest : std::string();
  };
  const std::string d0 = d(base, top);
  EXPECT_EQ(d0.size(), 64u);
  EXPECT_EQ(d0, d(base, top));
  EXPECT_NE(d0, d(base + "# a comment\n", top));  // any byte of any file in the chain
  EXPECT_NE(d0, d(base, top + "# a comment\n"));
  // The base alone is another chain: another digest.
  auto b = rules_from({{"base", base}}, "base");
  ASSERT_TRUE(b.ok());
  EXPECT_NE(b->digest, d0);
}

TEST(Rules, LoadRulesDirNamesThePathAndTheClassesThere) {
  auto r = load_rules_dir(CRUCIBLE_RULES_DIR, "no-such-class");
  ASSERT_FALSE(r.ok());
  const std::string m(r.status().message());
  EXPECT_NE(m.find("no-such-class.toml"), std::string::npos) << m;
  EXPECT_NE(m.find("cpu-avx2"), std::string::npos) << m;
  EXPECT_NE(m.find("h200"), std::string::npos) << m;
}

// Every CKernel kind has a single-op rule that applies under a default policy (train and infer),
// so the shipped classes never report an uncovered node; the fallback sits at priority 0.
TEST(Rules, ShippedClassesCoverEveryKind) {
  for (const char* cls : {"cpu-avx2", "h200"}) {
    auto r = load_rules_dir(CRUCIBLE_RULES_DIR, cls);
    ASSERT_TRUE(r.ok()) << cls << ": " << r.status();
    EXPECT_EQ(r->chain.back(), "base") << cls;
    EXPECT_NE(r->rules[0].source.find("base.toml"), std::string::npos);
    bool fallback = false;
    for (const Rule& x : r->rules) {
      if (x.pattern.size() == 1 && x.pattern[0].kinds.empty() && x.pattern[0].op.empty()) {
        fallback = true;
        EXPECT_EQ(x.priority, 0);
        EXPECT_EQ(x.kernel, KernelTemplate::Opaque);
      }
      for (const std::string& c : x.requires_caps)
        EXPECT_NE(std::find(r->capabilities.begin(), r->capabilities.end(), c),
                  r->capabilities.end())
            << cls << " rule " << x.id << " requires " << c << ", which the class lacks";
    }
    EXPECT_TRUE(fallback) << cls;
    for (const CKernelInfo& k : ckernel_table()) {
      bool covered = false;
      for (const Rule& x : r->rules)
        covered |= x.pattern.size() == 1 && x.pattern[0].kinds == std::vector<CKernel>{k.kind} &&
                   !x.horizontal && !x.pattern[0].repeated && x.phases.empty() && x.train && x.infer &&
                   x.numerics != Numerics::Differs && x.settings.empty() && x.rows_min == 0 &&
                   x.rows_max == INT64_MAX;
      EXPECT_TRUE(covered) << cls << ": no default single-op rule for " << k.name;
    }
  }
}

TEST(Recipes, RegistryNamesTextsAndInterning) {
  const NumericalRecipe* o = recipe_by_name("f32_ordered");
  ASSERT_NE(o, nullptr);
  EXPECT_EQ(recipe_text(*o), "acc=f32 io=f32 red=seq round=rne scale=none det=ordered fma");
  EXPECT_EQ(recipe_text(*recipe_by_name("f32_strict")),
            "acc=f32 io=f32 red=seq round=rne scale=none det=bitexact_strict");
  EXPECT_EQ(recipe_text(*recipe_by_name("bf16_f32acc_tc")),
            "acc=f32 io=bf16 red=blocked round=rne scale=none det=ordered block=64 fma");
  EXPECT_EQ(recipe_by_name("nope"), nullptr);
  std::set<std::string> names, texts;
  for (const NamedRecipe& n : recipe_registry()) {
    EXPECT_TRUE(names.insert(std::string(n.name)).second) << n.name;
    EXPECT_TRUE(texts.insert(recipe_text(n.recipe)).second) << "two names, one recipe: " << n.name;
    EXPECT_EQ(recipe_by_name(n.name), intern_recipe(n.recipe));
    EXPECT_EQ(recipe_name(recipe_by_name(n.name)), n.name);
  }
  for (const char* want : {"f32_ordered", "f32_unordered", "f32_strict", "f32_pairwise",
                           "bf16_f32acc_tc", "f16_f32acc_tc", "bf16_f32acc_bitexact_tc"})
    EXPECT_TRUE(names.contains(want)) << want;
  NumericalRecipe odd = *o;
  odd.block = 7;
  const NumericalRecipe* p = intern_recipe(odd);
  EXPECT_NE(p, o);
  EXPECT_EQ(recipe_name(p), "");
  EXPECT_EQ(*p, odd);
}

TEST(Recipes, InterningIsThreadSafeAndPointerStable) {
  constexpr int kThreads = 4, kPer = 500;
  std::vector<std::vector<const NumericalRecipe*>> got(kThreads);
  std::vector<std::thread> ts;
  for (int t = 0; t < kThreads; ++t) {
    ts.emplace_back([t, &got] {
      for (int i = 0; i < kPer; ++i) {
        NumericalRecipe r;
        r.block = static_cast<std::uint16_t>(1000 + i);  // distinct from every named recipe
        got[t].push_back(intern_recipe(r));
      }
    });
  }
  for (auto& t : ts) t.join();
  for (int i = 0; i < kPer; ++i) {
    for (int t = 1; t < kThreads; ++t) EXPECT_EQ(got[t][i], got[0][i]);
    EXPECT_EQ(got[0][i]->block, 1000 + i);  // still valid after all the later inserts
  }
}

TEST(KernelTemplates, NamesRoundTrip) {
  std::set<std::string_view> seen;
  for (int i = 0; i < static_cast<int>(KernelTemplate::kCount); ++i) {
    const auto t = static_cast<KernelTemplate>(i);
    const std::string_view n = kernel_template_name(t);
    EXPECT_TRUE(seen.insert(n).second) << n;
    KernelTemplate back = KernelTemplate::kCount;
    EXPECT_TRUE(kernel_template_from_name(n, &back));
    EXPECT_EQ(back, t);
  }
  EXPECT_EQ(kernel_template_name(KernelTemplate::GemmEpilogue), "gemm_epilogue");
  EXPECT_FALSE(kernel_template_from_name("gemm", nullptr));
}

}  // namespace
}  // namespace crucible::forge
