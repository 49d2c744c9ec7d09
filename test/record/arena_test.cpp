// arena_test.cpp — the replay arena's Note [One arena] (vessel/torch/ReplayArena.h) driven from
// C++: ATen's allocations of a profiled run placed in the free bytes of an exec Runner's arena
// (here a hand-made one: slots with their offsets and calls), served from there in later runs,
// and what happens when a later run does not follow the profiled one.
#include "ReplayArena.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <memory>

namespace {
using namespace crucible::vessel;

// 4096 bytes over 10 calls: slot A [0, 1024) live over calls 0..3, B [1024, 3072) over 2..9,
// C [3072, 4096) over 5..9. Free: [0, 1024) from call 4 on, [3072, 4096) up to call 4.
struct FakeExec {
  std::shared_ptr<unsigned char> mem{static_cast<unsigned char*>(std::aligned_alloc(64, 4096)), &std::free};
  ExecArena arena() const {
    ExecArena a;
    a.base = mem.get();
    a.bytes = 4096;
    a.calls = 10;
    a.uses = {{0, 1024, 0, 3}, {1024, 2048, 2, 9}, {3072, 1024, 5, 9}};
    a.keep = mem;
    return a;
  }
};

// The step: t1 (1024 bytes) made at call 1 and let go at call 3, t2 (1024) over 6..8, t3
// (4096, fits nowhere in the exec arena) over 4..5. `hold_t1` keeps t1 past call 3.
struct StepRun {
  at::Tensor t1, t2, t3;
  const void *p1 = nullptr, *p2 = nullptr, *p3 = nullptr;  // where each was served
  std::string stopped;
  void go(bool hold_t1 = false, std::uint32_t t1_at = 1) {
    auto at = [&](std::uint32_t c, bool start) {
      const std::string why = arena_at_call(c, start);
      if (!why.empty() && stopped.empty()) stopped = why;
    };
    at(0, true);
    at(t1_at, false);
    t1 = at::empty({256}, at::kFloat);
    p1 = t1.data_ptr();
    at(3, false);
    if (!hold_t1) t1.reset();
    at(4, true);
    t3 = at::empty({1024}, at::kFloat);
    p3 = t3.data_ptr();
    at(5, false);
    t3.reset();
    at(6, true);
    t2 = at::empty({256}, at::kFloat);
    p2 = t2.data_ptr();
    at(8, false);
    t2.reset();
    at(9, false);
  }
};

class OneArena : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_EQ(ensure_arena_allocator(), ""); }
  FakeExec exec;
  ArenaPlan plan() {
    auto log = new_alloc_log();
    {
      AllocScope s = AllocScope::profile(log);
      StepRun r;
      r.go();
    }
    const ExecArena ea = exec.arena();
    return finish_profile(*log, &ea);
  }
};

TEST_F(OneArena, BlocksGoIntoTheExecArenasFreeBytesClearOfLiveSlots) {
  ArenaPlan a = plan();
  ASSERT_EQ(a.sizes.size(), 3u);
  EXPECT_EQ(a.served, 3u);
  EXPECT_EQ(a.exec_served, 2u);
  ASSERT_EQ(a.in_exec, (std::vector<std::uint8_t>{1, 0, 1}));  // made in the order t1, t3, t2
  EXPECT_EQ(a.offsets[0], 3072) << "t1 (calls 1..3) overlaps A and B in calls, not C";
  EXPECT_EQ(a.offsets[2], 0) << "t2 (calls 6..8) goes where A was";
  EXPECT_EQ(a.arena_bytes, 4096u) << "t3 fits nowhere in the exec arena: a buffer of its own";

  // A run that follows the profile is served from there, twice.
  const unsigned char* base = exec.mem.get();
  for (int run = 0; run < 2; ++run) {
    AllocScope s = AllocScope::serve(a);
    StepRun r;
    r.go();
    EXPECT_EQ(r.stopped, "");
    EXPECT_EQ(r.p1, base + 3072);
    EXPECT_EQ(r.p2, base);
    EXPECT_EQ(r.p3, a.buffer.get());
    EXPECT_FALSE(s.mismatched());
    EXPECT_FALSE(s.arena_blocks_alive());
    EXPECT_EQ(s.requests(), 3u);
  }
}

TEST_F(OneArena, ABlockHeldPastItsCallsStopsTheRunBeforeTheBytesAreReused) {
  ArenaPlan a = plan();
  AllocScope s = AllocScope::serve(a);
  StepRun r;
  r.go(/*hold_t1=*/true);  // t1 (planned to go at call 3) is still held when call 4's kernel starts
  EXPECT_NE(r.stopped.find("during call 1"), std::string::npos) << r.stopped;
  EXPECT_NE(r.stopped.find("still held at call 4"), std::string::npos) << r.stopped;
  EXPECT_TRUE(s.mismatched());
  EXPECT_TRUE(s.arena_blocks_alive());
  r.t1.reset();
}

TEST_F(OneArena, ABlockAskedForAtAnotherCallComesFromTheAllocator) {
  ArenaPlan a = plan();
  const unsigned char* base = exec.mem.get();
  AllocScope s = AllocScope::serve(a);
  StepRun r;
  r.go(false, /*t1_at=*/0);  // placed for calls 1..3: at call 0 it is not served from there
  EXPECT_TRUE(r.p1 < base || r.p1 >= base + 4096);
  EXPECT_TRUE(s.mismatched());
  EXPECT_EQ(r.stopped, "");
}

TEST_F(OneArena, WithoutAnExecArenaEverythingHasItsOwnBuffer) {
  auto log = new_alloc_log();
  {
    AllocScope s = AllocScope::profile(log);
    StepRun r;
    r.go();
  }
  ArenaPlan a = finish_profile(*log);
  EXPECT_EQ(a.exec_served, 0u);
  EXPECT_EQ(a.in_exec, (std::vector<std::uint8_t>{0, 0, 0}));
  EXPECT_GE(a.arena_bytes, 4096u);
}

}  // namespace
