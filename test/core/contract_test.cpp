// contract_test.cpp — each contract semantic, compiled three times (CRUCIBLE_TEST_SEMANTIC).
#undef CRUCIBLE_CONTRACT_SEMANTIC
#define CRUCIBLE_CONTRACT_SEMANTIC CRUCIBLE_TEST_SEMANTIC
#include "crucible/core/Contract.h"

#include <gtest/gtest.h>

namespace {

int checked_div(int a, int b) {
  CRUCIBLE_PRE(b != 0, "divisor must be non-zero");
  int q = a / (b == 0 ? 1 : b);
  CRUCIBLE_POST(q * b == a || b == 0 || a % b != 0, "quotient times divisor is the dividend");
  return q;
}

[[maybe_unused]] int violate_post() {
  int r = -1;
  CRUCIBLE_POST(r >= 0, "result is non-negative");
  return r;
}

[[maybe_unused]] void violate_assert() { CRUCIBLE_ASSERT(1 + 1 == 3, "arithmetic holds"); }

int g_evaluations = 0;
bool counted_false() {
  ++g_evaluations;
  return false;
}
[[maybe_unused]] void violate_with_side_effect() { CRUCIBLE_ASSERT(counted_false(), "side effect"); }

TEST(Contract, SatisfiedClausesAreSilent) {
  EXPECT_EQ(checked_div(9, 3), 3);
  EXPECT_EQ(crucible::contract::observed_count(), 0u);
}

#if CRUCIBLE_TEST_SEMANTIC == 2
TEST(ContractEnforceDeathTest, PreconditionAbortsWithClauseFileLineAndMessage) {
  EXPECT_DEATH(checked_div(1, 0),
               "precondition violated: \\(b != 0\\) at .*contract_test.cpp:[0-9]+: divisor must be non-zero");
}
TEST(ContractEnforceDeathTest, PostconditionAborts) {
  EXPECT_DEATH(violate_post(), "postcondition violated: \\(r >= 0\\).*result is non-negative");
}
TEST(ContractEnforceDeathTest, AssertionAborts) {
  EXPECT_DEATH(violate_assert(), "assertion violated: \\(1 \\+ 1 == 3\\)");
}
#elif CRUCIBLE_TEST_SEMANTIC == 1
TEST(ContractObserve, LogsOncePerSiteAndCountsEveryViolation) {
  const auto before = crucible::contract::observed_count();
  testing::internal::CaptureStderr();
  for (int i = 0; i < 3; ++i) (void)violate_post();
  violate_assert();
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_EQ(crucible::contract::observed_count() - before, 4u);
  // One line for the postcondition site (not three), one for the assertion site.
  size_t lines = 0;
  for (char c : err) lines += c == '\n';
  EXPECT_EQ(lines, 2u) << err;
  EXPECT_NE(err.find("observed: postcondition violated: (r >= 0)"), std::string::npos) << err;
  EXPECT_NE(err.find("observed: assertion violated"), std::string::npos) << err;
}
TEST(ContractObserve, ExecutionContinuesAfterViolation) {
  EXPECT_EQ(violate_post(), -1);
}
#else
TEST(ContractIgnore, ConditionIsNeverEvaluated) {
  g_evaluations = 0;
  violate_with_side_effect();
  violate_assert();
  EXPECT_EQ(g_evaluations, 0);
  EXPECT_EQ(crucible::contract::observed_count(), 0u);
}
#endif

#if CRUCIBLE_TEST_SEMANTIC == 1
TEST(ContractObserve, ConditionIsEvaluatedExactlyOnce) {
  g_evaluations = 0;
  testing::internal::CaptureStderr();
  violate_with_side_effect();
  (void)testing::internal::GetCapturedStderr();
  EXPECT_EQ(g_evaluations, 1);
}
#endif

}  // namespace
