// weights_test.cpp — Weights: float32 copies of any dtype and layout, shape checks that name the
// tensor and both shapes, missing names, and unused().
#include "crucible/runtime/Weights.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "case_util.h"
#include "crucible/ptload/StateDict.h"

namespace crucible::runtime::test {
namespace {

const ptload::StateDict& weights_file() {
  static const Result<ptload::StateDict> sd = ptload::StateDict::open(cases_path("weights.pt"));
  if (!sd.ok()) {
    ADD_FAILURE() << sd.status();
    std::abort();
  }
  return *sd;
}

std::vector<float> vec(std::span<const float> s) { return {s.begin(), s.end()}; }

std::vector<std::string> sorted(std::vector<std::string> v) {
  std::sort(v.begin(), v.end());
  return v;
}

TEST(Weights, MaterializesEveryDtypeAndLayoutAsFloat32) {
  Weights w(weights_file());
  auto dense = w.get("dense.weight", {4, 3});
  ASSERT_TRUE(dense.ok()) << dense.status();
  std::vector<float> want(12);
  for (int i = 0; i < 12; ++i) want[i] = static_cast<float>(i);
  EXPECT_EQ(vec(*dense), want);

  auto t = w.get("dense.transposed", {3, 4});
  ASSERT_TRUE(t.ok()) << t.status();
  std::vector<float> want_t;
  for (int i = 0; i < 3; ++i) {
    for (int j = 0; j < 4; ++j) want_t.push_back(static_cast<float>(j * 3 + i));
  }
  EXPECT_EQ(vec(*t), want_t) << "a transposed view comes back contiguous";

  auto h = w.get("half", {2, 2});
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(vec(*h), (std::vector<float>{0.5f, -1.25f, 2.0f, 3.0f}));

  auto i = w.get("index", {3});
  ASSERT_TRUE(i.ok()) << i.status();
  EXPECT_EQ(vec(*i), (std::vector<float>{1.0f, -2.0f, 3.0f}));

  auto nested = w.get("nested.bias", {2});
  ASSERT_TRUE(nested.ok()) << nested.status();
  EXPECT_EQ(vec(*nested), (std::vector<float>{4.0f, 5.0f}));

  auto scalar = w.get("scalar", std::span<const std::int64_t>());
  ASSERT_TRUE(scalar.ok()) << scalar.status();
  EXPECT_EQ(vec(*scalar), (std::vector<float>{2.5f}));
}

TEST(Weights, CopiesOnceAndKeepsThem) {
  Weights w(weights_file());
  auto a = w.get("dense.transposed", {3, 4});
  auto b = w.get("dense.transposed", {3, 4});
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->data(), b->data());
  // Other lookups (which grow the cache) leave earlier spans valid.
  for (const char* name : {"half", "index", "dense.weight"}) {
    auto r = w.shape_of(name);
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_TRUE(w.get(name, *r).ok());
  }
  EXPECT_EQ((*a)[1], 3.0f);
}

TEST(Weights, ShapeMismatchNamesTensorAndBothShapes) {
  Weights w(weights_file());
  auto r = w.get("dense.weight", {4, 7});
  ASSERT_FALSE(r.ok());
  const std::string msg(r.status().message());
  EXPECT_TRUE(contains_ci(msg, "dense.weight")) << msg;
  EXPECT_TRUE(contains_ci(msg, "7")) << "the expected shape: " << msg;
  EXPECT_TRUE(contains_ci(msg, "3")) << "the stored shape: " << msg;
  EXPECT_FALSE(w.get("dense.weight", {12}).ok()) << "same numel, other shape";
  EXPECT_FALSE(w.get("dense.weight", {4, 3, 1}).ok()) << "other rank";
  EXPECT_FALSE(w.get("scalar", {1}).ok());
}

TEST(Weights, MissingNameIsAnError) {
  Weights w(weights_file());
  auto r = w.get("decoder.weight", {4, 3});
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(contains_ci(r.status().message(), "decoder.weight")) << r.status();
  EXPECT_FALSE(w.contains("decoder.weight"));
  EXPECT_TRUE(w.contains("dense.weight"));
  auto s = w.shape_of("decoder.weight");
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(contains_ci(s.status().message(), "decoder.weight")) << s.status();
  EXPECT_FALSE(w.get("dense", {4, 3}).ok()) << "a prefix of a name is not the name";
}

TEST(Weights, ShapeOf) {
  Weights w(weights_file());
  auto s = w.shape_of("dense.transposed");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(*s, (std::vector<std::int64_t>{3, 4}));
  s = w.shape_of("scalar");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_TRUE(s->empty());
}

TEST(Weights, UnusedListsWhatNoLayerAskedFor) {
  Weights w(weights_file());
  const std::vector<std::string> all = {"dense.transposed", "dense.weight", "half", "index",
                                        "nested.bias",      "scalar"};
  EXPECT_EQ(sorted(w.unused()), all);
  ASSERT_TRUE(w.get("dense.weight", {4, 3}).ok());
  ASSERT_TRUE(w.get("nested.bias", {2}).ok());
  EXPECT_EQ(sorted(w.unused()),
            (std::vector<std::string>{"dense.transposed", "half", "index", "scalar"}));
  ASSERT_TRUE(w.shape_of("half").ok());
  EXPECT_EQ(sorted(w.unused()).size(), 4u) << "shape_of() is not a use";
  for (const char* n : {"dense.transposed", "half", "index"}) {
    auto shape = w.shape_of(n);
    ASSERT_TRUE(shape.ok());
    ASSERT_TRUE(w.get(n, *shape).ok());
  }
  ASSERT_TRUE(w.get("scalar", std::span<const std::int64_t>()).ok());
  EXPECT_TRUE(w.unused().empty());
}

}  // namespace
}  // namespace crucible::runtime::test
