// c_api_test.cpp — runs the pure C host on the fixtures (ptload_c.h from C, not C++).
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "fixture_util.h"

TEST(CApi, CHostReadsViewsAndRefusesAMaliciousFile) {
  const std::string cmd = std::string(CRUCIBLE_PTLOAD_C_HOST) + " " +
                          crucible::ptload::test::fixture("views.pt") + " " +
                          crucible::ptload::test::fixture("bad/global_os_system.pt");
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
}
