// pipeline_stress_test.cpp — a 1M-op producer through a Recorder with small rings and the
// pipeline attached, flushing concurrently: nothing dropped, the right iteration published.
// Run under the tsan preset this checks the stage threads and their channels.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "crucible/pipeline/Pipeline.h"
#include "pipeline_util.h"

namespace {
using namespace crucible;
using namespace crucible::record;
using crucible::pipeline::testing_util::record_step;

TEST(PipelineStress, MillionOpProducerNothingDropped) {
  auto r = *Recorder::create(RecorderConfig{1u << 12, 1u << 13, 1u << 12, false});
  pipeline::Pipeline p(*r);
  constexpr int kOpsPerStep = 100, kSteps = 10000;  // 1M ops
  std::thread producer([&] {
    OpBuilder b;
    std::uint64_t sid = 0;
    for (int s = 0; s < kSteps; ++s) record_step(*r, b, s, kOpsPerStep, 16, sid);
  });
  for (int k = 0; k < 5; ++k) p.flush();  // concurrent with the producer: must return
  producer.join();
  const auto t0 = std::chrono::steady_clock::now();
  p.flush();
  const double flush_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  auto it = p.latest();
  ASSERT_NE(it, nullptr) << p.last_reason();
  EXPECT_EQ(it->ops().size(), static_cast<std::size_t>(kOpsPerStep));
  EXPECT_EQ(p.stats().ops_seen, static_cast<std::uint64_t>(kOpsPerStep) * kSteps + 1);
  std::uint64_t dropped = 0;
  for (const auto& s : r->thread_stats()) dropped += s.dropped;
  EXPECT_EQ(dropped, 0u);
  RecordProperty("final_flush_ms", std::to_string(flush_ms));
}
}  // namespace
