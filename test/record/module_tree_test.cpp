// module_tree_test.cpp — the scopes of a module table: which scopes each module runs inside,
// their labels (the first module id with the path, 0 for a parent never entered), their order
// by path, and paths that are not plain dotted names.
#include "crucible/record/ModuleTree.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

namespace {
using crucible::record::ModuleTree;

std::vector<std::string> paths_of(const ModuleTree& t, std::uint32_t id) {
  std::vector<std::string> out;
  for (const std::uint32_t s : t.scopes_of(id)) out.emplace_back(t.path(s));
  return out;
}

TEST(ModuleTree, ScopesLabelsAndOrder) {
  // "layer1" itself is never entered; "fc" appears twice (a loaded file may repeat a path).
  const std::vector<std::string> table = {"", "layer1.0.conv1", "layer1.0", "fc", "layer1.1", "fc"};
  const ModuleTree t(table);
  EXPECT_EQ(t.num_paths(), table.size());
  EXPECT_TRUE(t.scopes_of(0).empty()) << "the root path opens no scope";
  EXPECT_TRUE(t.scopes_of(99).empty()) << "an id past the table has no scopes";
  EXPECT_EQ(paths_of(t, 1), (std::vector<std::string>{"layer1", "layer1.0", "layer1.0.conv1"}));
  EXPECT_EQ(paths_of(t, 4), (std::vector<std::string>{"layer1", "layer1.1"}));
  EXPECT_EQ(t.scopes_of(3)[0], t.scopes_of(5)[0]) << "one scope per distinct path";
  EXPECT_EQ(t.scopes_of(1)[1], t.scopes_of(2)[1]) << "a module's path is its children's scope";
  EXPECT_EQ(t.num_scopes(), 5u);  // layer1, layer1.0, layer1.0.conv1, fc, layer1.1
  EXPECT_EQ(t.label_of("layer1.0.conv1"), 1u);
  EXPECT_EQ(t.label_of("layer1.0"), 2u);
  EXPECT_EQ(t.label_of("fc"), 3u) << "the first id with the path";
  EXPECT_EQ(t.label_of("layer1"), 0u) << "a parent scope never entered";
  EXPECT_EQ(t.label_of("layer2"), 0u) << "no such scope";
  for (std::uint32_t s = 0; s < t.num_scopes(); ++s) EXPECT_EQ(t.label(s), t.label_of(t.path(s)));
  // Ranks sort the scopes by path.
  std::vector<std::uint32_t> by_rank(t.num_scopes());
  for (std::uint32_t s = 0; s < t.num_scopes(); ++s) {
    ASSERT_LT(t.rank(s), t.num_scopes());
    by_rank[t.rank(s)] = s;
  }
  for (std::size_t r = 1; r < by_rank.size(); ++r)
    EXPECT_LT(t.path(by_rank[r - 1]), t.path(by_rank[r]));
  // Every scope the deep path opened shares one copy of it.
  EXPECT_EQ(t.owner(t.scopes_of(1)[0]).get(), t.owner(t.scopes_of(1)[2]).get());
}

// Components end at each '.' after the first character: a leading '.' belongs to the first,
// "a..b" opens "a", "a." and "a..b", a trailing '.' an empty last component.
TEST(ModuleTree, OddPaths) {
  const std::vector<std::string> table = {"", ".a", ".", "..a", "a..b", "a."};
  const ModuleTree t(table);
  EXPECT_EQ(paths_of(t, 1), (std::vector<std::string>{".a"}));
  EXPECT_EQ(paths_of(t, 2), (std::vector<std::string>{"."}));
  EXPECT_EQ(paths_of(t, 3), (std::vector<std::string>{".", "..a"}));
  EXPECT_EQ(paths_of(t, 4), (std::vector<std::string>{"a", "a.", "a..b"}));
  EXPECT_EQ(paths_of(t, 5), (std::vector<std::string>{"a", "a."}));
  EXPECT_EQ(t.label_of("a."), 5u);
  EXPECT_EQ(t.label_of("a"), 0u);
}

TEST(ModuleTree, FitsOnlyATableOfItsShape) {
  const std::vector<std::string> table = {"", "a.b", "c"};
  const ModuleTree t(table);
  EXPECT_TRUE(t.fits(table));
  EXPECT_FALSE(t.fits(std::vector<std::string>{"", "a.b"})) << "fewer paths";
  EXPECT_FALSE(t.fits(std::vector<std::string>{"", "a.b", "c", "d"})) << "more paths";
  EXPECT_FALSE(t.fits(std::vector<std::string>{"", "a.b", "cc"})) << "other lengths";
}

// The tree owns what it needs: the table it came from may go away.
TEST(ModuleTree, OutlivesItsTable) {
  auto table = std::make_unique<std::vector<std::string>>(
      std::vector<std::string>{"", std::string(200, 'm') + ".child"});
  const ModuleTree t(*table);
  table.reset();
  ASSERT_EQ(t.scopes_of(1).size(), 2u);
  EXPECT_EQ(t.path(t.scopes_of(1)[0]), std::string(200, 'm'));
  EXPECT_EQ(t.label_of(std::string(200, 'm') + ".child"), 1u);
}

}  // namespace
