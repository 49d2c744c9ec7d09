// plan_compare.h — test helper: whether two memory plans place the same blocks alike.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "crucible/graph/MemoryPlan.h"

namespace crucible::graph::testing_util {

// Block for block: the same storage, offset and share (Block::shares). The first difference is
// the failure message.
inline ::testing::AssertionResult same_placement(const MemoryPlan& a, const MemoryPlan& b) {
  if (a.blocks.size() != b.blocks.size())
    return ::testing::AssertionFailure() << a.blocks.size() << " blocks against " << b.blocks.size();
  for (std::size_t i = 0; i < a.blocks.size(); ++i) {
    const Block &x = a.blocks[i], &y = b.blocks[i];
    if (x.storage_id != y.storage_id || x.offset != y.offset || x.shares != y.shares)
      return ::testing::AssertionFailure()
             << "block " << i << ": storage " << x.storage_id << " at " << x.offset << " (shares " << x.shares
             << ") against storage " << y.storage_id << " at " << y.offset << " (shares " << y.shares << ")";
  }
  return ::testing::AssertionSuccess();
}

}  // namespace crucible::graph::testing_util
