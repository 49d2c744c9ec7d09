// merkle_dag_test.cpp — content hashes: deterministic, address-free, sensitive to shape and
// dtype, identical for identical blocks.
#include <gtest/gtest.h>

#include <tuple>

#include "crucible/graph/MerkleDag.h"
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
    if (r.module_path() == "blocks.0") r0 = &r;
    if (r.module_path() == "blocks.1") r1 = &r;
    if (r.module_path() == "blocks.2") r2 = &r;
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
// Module regions of a deep path and of modules called in turn: every prefix scope gets its
// runs, paths and labels as before, and all regions opened by one module path share one copy
// of it (Region::path_owner), so a loaded trace's long, deep paths cost their length once, not
// once per region and level.
TEST(MerkleDag, ModuleScopesShareTheirPathAcrossLevelsAndRuns) {
  synth::Builder b;
  std::string deep = "m";
  for (int i = 0; i < 300; ++i) deep += ".l" + std::to_string(i);
  for (std::uint64_t i = 0; i < 20; ++i)  // the deep module and "other" in turn, 10 runs each
    b.op("aten::relu", {T{1 + i, 0, {4}}}, {T{2 + i, 0, {4}}}, Phase::Forward,
         i % 2 ? "other" : deep);
  b.module("m.l0");  // a parent scope that is in the module table too
  auto d = dag_of(b);
  std::size_t deep_regions = 0, other_regions = 0;
  const std::string* owner = nullptr;
  for (const auto& r : d.regions()) {
    if (r.kind != RegionKind::Module) continue;
    EXPECT_EQ(r.end - r.begin, 1u) << "every run is one node long";
    if (r.module_path() == "other") {
      ++other_regions;
      EXPECT_EQ(r.label, b.module("other"));
      continue;
    }
    ++deep_regions;
    ASSERT_EQ(deep.compare(0, r.module_path().size(), r.module_path()), 0)
        << "a prefix of the deep path";
    if (owner == nullptr) owner = r.path_owner.get();
    EXPECT_EQ(r.path_owner.get(), owner) << "one copy of the path for every level and run";
    if (r.module_path() == deep)
      EXPECT_EQ(r.label, b.module(deep));
    else if (r.module_path() == "m.l0")
      EXPECT_EQ(r.label, b.module("m.l0"));
    else
      EXPECT_EQ(r.label, 0u) << r.module_path();
  }
  EXPECT_EQ(other_regions, 10u);
  EXPECT_EQ(deep_regions, 10u * 301) << "301 scopes (m, m.l0, ..., the path) with 10 runs each";
  // Sorted by path, then position.
  std::string_view last;
  std::uint32_t last_begin = 0;
  for (const auto& r : d.regions()) {
    if (r.kind != RegionKind::Module) continue;
    ASSERT_TRUE(last < r.module_path() || (last == r.module_path() && last_begin < r.begin));
    last = r.module_path();
    last_begin = r.begin;
  }
}

// Module regions of a small table: every scope's runs, sorted by path then position, labelled
// with the first id of the path (a repeated path keeps the first; a parent never entered is
// 0). The same whether the trace carries its module tree (as the recorder's copies do) or the
// DAG works the scopes out from the table; a tree made for another table (another count of
// paths, or of bytes in all) is not used.
TEST(MerkleDag, ModuleRegionsTheSameWithTheTracesTreeOrWithout) {
  synth::Builder b;
  const char* paths[] = {"enc.0.attn", "enc.0.ffn", "enc.1.attn", "", "enc.1", "head", "enc.0.attn"};
  for (std::uint64_t i = 0; i < 7; ++i)
    b.op("aten::relu", {T{1 + i, 0, {4}}}, {T{20 + i, 0, {4}}}, Phase::Forward, paths[i]);
  const std::uint32_t enc0 = b.module("enc.0");  // an entered parent, after its children
  b.trace.module_paths.push_back("enc.0");        // a repeated path (a loaded file may have one)
  const MerkleDag plain = dag_of(b);
  std::vector<std::tuple<std::string, std::uint32_t, std::uint32_t, std::uint32_t>> got;
  for (const Region& r : plain.regions())
    if (r.kind == RegionKind::Module)
      got.emplace_back(std::string(r.module_path()), r.begin, r.end, r.label);
  const std::vector<std::tuple<std::string, std::uint32_t, std::uint32_t, std::uint32_t>> want = {
      {"enc", 0, 3, 0},        {"enc", 4, 5, 0},          {"enc", 6, 7, 0},
      {"enc.0", 0, 2, enc0},   {"enc.0", 6, 7, enc0},     {"enc.0.attn", 0, 1, 1},
      {"enc.0.attn", 6, 7, 1}, {"enc.0.ffn", 1, 2, 2},    {"enc.1", 2, 3, 4},
      {"enc.1", 4, 5, 4},      {"enc.1.attn", 2, 3, 3},   {"head", 5, 6, 5}};
  EXPECT_EQ(got, want);
  auto same = [&](const MerkleDag& d, const char* what) {
    ASSERT_EQ(d.regions().size(), plain.regions().size()) << what;
    for (std::size_t i = 0; i < d.regions().size(); ++i) {
      const Region &x = d.regions()[i], &y = plain.regions()[i];
      EXPECT_EQ(std::tie(x.kind, x.label, x.begin, x.end, x.hash),
                std::tie(y.kind, y.label, y.begin, y.end, y.hash)) << what << ", region " << i;
      EXPECT_EQ(x.module_path(), y.module_path()) << what << ", region " << i;
    }
  };
  b.trace.module_tree = std::make_shared<const crucible::record::ModuleTree>(b.trace.module_paths);
  same(dag_of(b), "with the trace's tree");
  std::vector<std::string> fewer(b.trace.module_paths.begin(), b.trace.module_paths.end() - 1);
  b.trace.module_tree = std::make_shared<const crucible::record::ModuleTree>(fewer);
  same(dag_of(b), "with a tree of another table");
  std::vector<std::string> renamed = b.trace.module_paths;
  renamed[5] = "tails";  // as many paths, not the same ones
  b.trace.module_tree = std::make_shared<const crucible::record::ModuleTree>(renamed);
  same(dag_of(b), "with a tree of a table of the same size");
}

// Path components as before the scopes were built component by component: a leading '.'
// belongs to the first component, "a..b" opens "a", "a." and "a..b", a trailing '.' an empty
// last component.
TEST(MerkleDag, ModuleScopesOfOddPaths) {
  synth::Builder b;
  const char* paths[] = {".a", ".", "..a", "a..b", "a."};
  for (std::uint64_t i = 0; i < 5; ++i)
    b.op("aten::relu", {T{1 + i, 0, {4}}}, {T{10 + i, 0, {4}}}, Phase::Forward, paths[i]);
  auto d = dag_of(b);
  std::vector<std::tuple<std::string, std::uint32_t, std::uint32_t>> got;
  for (const auto& r : d.regions())
    if (r.kind == RegionKind::Module)
      got.emplace_back(std::string(r.module_path()), r.begin, r.end);
  const std::vector<std::tuple<std::string, std::uint32_t, std::uint32_t>> want = {
      {".", 1, 3}, {"..a", 2, 3}, {".a", 0, 1}, {"a", 3, 5}, {"a.", 3, 5}, {"a..b", 3, 4}};
  EXPECT_EQ(got, want);
}

}  // namespace
