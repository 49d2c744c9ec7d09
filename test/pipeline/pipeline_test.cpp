// pipeline_test.cpp — detect/build/publish behind a Recorder: exact flush, publication of the
// latest iteration, reaction to a changed loop, and a 1M-op producer (TSan: the stress label).
#include "crucible/pipeline/Pipeline.h"

#include <gtest/gtest.h>

#include <thread>

#include "pipeline_util.h"

namespace {
using namespace crucible;
using namespace crucible::record;

using crucible::pipeline::testing_util::record_step;

TEST(Channel, ConsumerParksAndWakes) {
  pipeline::Channel<int> ch(4);
  std::thread consumer([&] {
    int v, expect = 0;
    while (ch.pop(v)) EXPECT_EQ(v, expect++);
    EXPECT_EQ(expect, 1000);
  });
  for (int i = 0; i < 1000; ++i) {
    ch.push(i);
    if (i % 100 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(2));  // let it park
  }
  ch.close();
  consumer.join();
}

TEST(Pipeline, FlushPublishesTheLatestIterationExactly) {
  auto r = *Recorder::create();
  pipeline::Pipeline p(*r);
  EXPECT_EQ(p.latest(), nullptr);
  OpBuilder b;
  std::uint64_t sid = 0;
  for (int s = 0; s < 3; ++s) record_step(*r, b, s, 40, 16, sid);
  p.flush();
  auto it = p.latest();
  ASSERT_NE(it, nullptr) << p.last_reason();
  EXPECT_EQ(it->ops.size(), 40u);
  EXPECT_TRUE(it->report.first_differs);
  ASSERT_TRUE(it->plan.has_value());
  EXPECT_TRUE(graph::check_plan(*it->plan).ok());
  const ContentHash first_root = it->dag.root();
  // The loop changes (another width): after flush the published iteration is the new one.
  for (int s = 0; s < 3; ++s) record_step(*r, b, s + 1, 40, 32, sid);
  p.flush();
  auto it2 = p.latest();
  ASSERT_NE(it2, nullptr);
  EXPECT_NE(it2->dag.root(), first_root);
  EXPECT_EQ(it2->trace->sizes(0)[1], 32);
  EXPECT_EQ(p.stats().ops_seen, 41u + 80u + 120u);
}

TEST(Pipeline, NonPeriodicPublishesNothingAndSaysWhy) {
  auto r = *Recorder::create();
  pipeline::Pipeline p(*r);
  OpBuilder b;
  std::uint64_t sid = 0;
  for (int s = 1; s < 12; ++s) record_step(*r, b, 1, 3, s, sid);  // a new width every step
  p.flush();
  EXPECT_EQ(p.latest(), nullptr);
  EXPECT_NE(p.last_reason().find("not periodic"), std::string::npos) << p.last_reason();
}

}  // namespace
