// strong_id_test.cpp — typed IDs: default none, ordering, hashing, no implicit conversion.
#include "crucible/core/StrongId.h"

#include <gtest/gtest.h>

#include <type_traits>
#include <unordered_set>

namespace {
using namespace crucible;

TEST(StrongId, DefaultIsNoneAndInvalid) {
  OpIndex a;
  EXPECT_FALSE(a.is_valid());
  EXPECT_EQ(a, OpIndex::none());
  EXPECT_TRUE(OpIndex{0}.is_valid());
}

TEST(StrongId, OrderedAndHashable) {
  EXPECT_LT(OpIndex{1}, OpIndex{2});
  std::unordered_set<StorageId> s{StorageId{1}, StorageId{2}, StorageId{1}};
  EXPECT_EQ(s.size(), 2u);
}

TEST(StrongId, DistinctTagsDoNotConvert) {
  static_assert(!std::is_convertible_v<OpIndex, TensorSlot>);
  static_assert(!std::is_convertible_v<std::uint32_t, OpIndex>, "construction is explicit");
  static_assert(std::is_trivially_copyable_v<StorageId>);
  SUCCEED();
}
}  // namespace
