// pipeline_stress_test.cpp — a 1M-op producer through a Recorder with small rings and the
// pipeline attached, flushing concurrently: nothing lost uncounted, the right iteration
// published.
// Run under the tsan preset this checks the stage threads and their channels.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "crucible/pipeline/Pipeline.h"
#include "pipeline_util.h"

namespace {
using namespace crucible;
using namespace crucible::record;
using crucible::pipeline::testing_util::record_step;

// Back-pressure (the default): every op of a 1M-op producer reaches detect, and the step is
// published. Drop mode, same producer: what does not fit is counted, never lost silently:
// recorded + dropped = produced, detect sees exactly what was recorded, and each drop is
// flagged on the next op recorded.
class PipelineStress : public ::testing::TestWithParam<bool> {};

TEST_P(PipelineStress, MillionOpProducerLosesNothingUncounted) {
  const bool drop = GetParam();
  auto r = *Recorder::create(RecorderConfig{1u << 12, 1u << 13, 1u << 12, drop});
  pipeline::Pipeline p(*r);
  constexpr int kOpsPerStep = 100, kSteps = 10000;  // 1M ops
  // + state creation; in drop mode, + one last op that waits for room, so that a drop at the
  // very end is flagged too
  const std::uint64_t produced = std::uint64_t{kOpsPerStep} * kSteps + 1 + (drop ? 1 : 0);
  std::thread producer([&] {
    OpBuilder b;
    std::uint64_t sid = 0;
    for (int s = 0; s < kSteps; ++s) record_step(*r, b, s, kOpsPerStep, 16, sid);
    if (drop) {
      r->set_thread_drop_when_full(false);
      record_step(*r, b, 1, 1, 16, sid);
    }
  });
  // A reader of the published iteration while the pipeline publishes (latest() copies a
  // shared_ptr under a mutex): every iteration it gets is whole, its graph, plan and trace copy those of the
  // same ops. Under the tsan preset this checks the publication itself.
  std::atomic<bool> stop{false};
  std::atomic<std::uint64_t> seen{0}, torn{0};
  auto whole = [&](const std::shared_ptr<const graph::Iteration>& it) {
    std::uint64_t phases = 0;
    for (std::uint64_t n : it->ops_per_phase()) phases += n;
    return it->graph().num_nodes() == it->ops().size() && phases == it->ops().size() && it->trace != nullptr &&
           it->trace->num_ops() == it->ops().size() && it->plan().has_value() && graph::check_plan(*it->plan()).ok();
  };
  std::thread reader([&] {
    while (!stop.load(std::memory_order_acquire)) {
      if (auto it = p.latest()) {
        seen.fetch_add(1, std::memory_order_relaxed);
        if (!whole(it)) torn.fetch_add(1, std::memory_order_relaxed);
      }
      std::this_thread::yield();
    }
  });
  for (int k = 0; k < 5; ++k) p.flush();  // concurrent with the producer: must return
  producer.join();
  const auto t0 = std::chrono::steady_clock::now();
  p.flush();
  const double flush_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  stop.store(true, std::memory_order_release);
  reader.join();
  EXPECT_EQ(torn.load(), 0u) << "of " << seen.load() << " iterations read while publishing";
  RecordProperty("iterations_read_while_publishing", std::to_string(seen.load()));
  std::uint64_t recorded = 0, dropped = 0;
  for (const auto& s : r->thread_stats()) {
    recorded += s.total_ops();
    dropped += s.dropped;
  }
  EXPECT_EQ(recorded + dropped, produced);
  EXPECT_EQ(p.stats().ops_seen, recorded) << "detect saw every recorded op";
  if (!drop) {
    EXPECT_EQ(dropped, 0u);
    auto it = p.latest();
    ASSERT_NE(it, nullptr) << p.last_reason();
    EXPECT_EQ(it->ops().size(), static_cast<std::size_t>(kOpsPerStep));
    EXPECT_TRUE(whole(it));
    EXPECT_FALSE(it->incomplete());
  } else {
    const Trace t = r->snapshot();
    ASSERT_EQ(t.num_ops(), recorded);
    std::uint64_t flagged = 0;
    for (const auto& e : t.ops) flagged += (e.flags & op_flag::kAfterDrop) != 0;
    EXPECT_LE(flagged, dropped);
    EXPECT_EQ(flagged == 0, dropped == 0) << "a drop is flagged on the next op recorded";
    RecordProperty("dropped", std::to_string(dropped));
    if (dropped == 0) GTEST_SKIP() << "the drain kept up: nothing dropped, the flags were not exercised";
  }
  RecordProperty("final_flush_ms", std::to_string(flush_ms));
}

INSTANTIATE_TEST_SUITE_P(Modes, PipelineStress, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "DropWhenFull" : "BackPressure"; });
}  // namespace
