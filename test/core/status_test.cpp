// status_test.cpp — error values carry what is wrong and what to do.
#include "crucible/core/Status.h"

#include <gtest/gtest.h>

#include <cerrno>

namespace {
using namespace crucible;

Result<int> parse_positive(int v) {
  if (v <= 0) return invalid_input("value must be positive, got " + std::to_string(v), "pass a count >= 1");
  return v;
}
Status chain(int v) {
  CRUCIBLE_RETURN_IF_ERROR(parse_positive(v).status());
  return ok_status();
}

TEST(Status, MessagesSayWhatAndWhatToDo) {
  auto r = parse_positive(-2);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().message(), "value must be positive, got -2; pass a count >= 1");
  EXPECT_EQ(unsupported("x", "y").code(), absl::StatusCode::kUnimplemented);
  EXPECT_EQ(exhausted("x", "y").code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(bad_state("x", "y").code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(os_error("open /nope", ENOENT).message().find("No such file"), std::string_view::npos);
}

TEST(Status, ReturnIfErrorPropagates) {
  EXPECT_TRUE(chain(3).ok());
  EXPECT_EQ(chain(0).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(*parse_positive(7), 7);
}
}  // namespace
