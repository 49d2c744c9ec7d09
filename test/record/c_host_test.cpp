// c_host_test.cpp — runs the pure C host program and reads its trace back with the C++ loader.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "crucible/record/TraceFile.h"

namespace {
using namespace crucible::record;

TEST(CHost, RecordsTwoOpsAndTheLoaderReadsThem) {
  const std::string path = ::testing::TempDir() + "/c_host.crtrace";
  const std::string cmd = std::string(CRUCIBLE_C_HOST) + " " + path;
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  auto t = load_trace(path);
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_EQ(t->num_ops(), 2u);
  EXPECT_EQ(t->schema_name(t->ops[0].schema_hash), "aten::addmm");
  EXPECT_EQ(t->schema_name(t->ops[1].schema_hash), "aten::relu");
  EXPECT_EQ(t->module_path(t->ops[0].module_id), "fc1");
  ASSERT_EQ(t->inputs(0).size(), 3u);
  const auto w = t->tensor_index(&t->inputs(0)[2]);
  EXPECT_EQ(t->sizes(w)[1], 128);
  EXPECT_EQ(t->strides(w)[0], 128) << "NULL strides mean contiguous";
  EXPECT_TRUE(t->inputs(0)[2].flags & tensor_flag::kRequiresGrad);
  EXPECT_EQ(t->outputs(1)[0].storage_id, 5u);
  ASSERT_EQ(t->scalars_of(0).size(), 2u);
  EXPECT_EQ(t->scalars_of(0)[1].kind, ScalarKind::Double);
  EXPECT_EQ(t->total_ops(Phase::Forward), 2u);
  std::remove(path.c_str());
}
}  // namespace
