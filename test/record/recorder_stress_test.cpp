// recorder_stress_test.cpp — two producers, 1M ops in all, through small rings; every op's
// content verified after the drain. Under the tsan preset this checks the ring/drain protocol.
#include <gtest/gtest.h>

#include <thread>

#include "test_util.h"

namespace {
using namespace crucible::record;

TEST(RecorderStress, MillionOpsTwoProducersSmallRings) {
  auto r = *Recorder::create(RecorderConfig{256, 512, 256, false});
  const auto s = r->intern_schema("aten::mm");
  constexpr std::uint64_t kPerThread = 500'000;
  std::vector<std::thread> ts;
  for (int k = 0; k < 2; ++k)
    ts.emplace_back([&] {
      OpBuilder b;
      for (std::uint64_t i = 0; i < kPerThread; ++i) test_util::commit_synthetic(*r, b, s, i);
    });
  // Flush concurrently with the producers: it must return, and never see a partial op.
  for (int k = 0; k < 20; ++k) r->flush();
  for (auto& t : ts) t.join();
  Trace t = r->snapshot();
  ASSERT_EQ(t.num_ops(), 2 * kPerThread);
  std::uint64_t next[2] = {0, 0}, bad = 0;
  for (std::size_t op = 0; op < t.num_ops(); ++op) {
    const auto th = t.ops[op].thread;
    const std::uint64_t i = next[th]++;
    bad += t.ops[op].seq != i;
    bad += t.inputs(op)[0].storage_id != 2 * i + 1;
    bad += t.sizes(t.op_tensor_begin[op])[0] != static_cast<std::int64_t>(i % 7 + 1);
    bad += t.scalars_of(op)[0].bits != i;
  }
  EXPECT_EQ(bad, 0u);
  EXPECT_EQ(t.total_dropped(), 0u);
}
}  // namespace
