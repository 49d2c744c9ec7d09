// pipeline_test.cpp — detect/build/publish behind a Recorder: exact flush, publication of the
// latest iteration, reaction to a changed loop, and a 1M-op producer (TSan: the stress label).
#include "crucible/pipeline/Pipeline.h"

#include <gtest/gtest.h>

#include <bit>
#include <ctime>
#include <map>
#include <thread>

#include "../graph/plan_compare.h"
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

// Waiting is parking: a consumer that finds nothing for 100 ms spends a small part of that on
// the CPU (a spinning one would spend all of it).
TEST(Channel, AnIdleConsumerSleeps) {
  pipeline::Channel<int> ch(4);
  double cpu_ms = -1;
  std::thread consumer([&] {
    timespec a{}, b{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &a);
    int v = 0;
    EXPECT_TRUE(ch.pop(v));
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &b);
    cpu_ms = static_cast<double>(b.tv_sec - a.tv_sec) * 1e3 + static_cast<double>(b.tv_nsec - a.tv_nsec) / 1e6;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  ch.push(1);
  consumer.join();
  ch.close();
  EXPECT_GE(cpu_ms, 0.0);
  EXPECT_LT(cpu_ms, 30.0) << "the consumer spun instead of parking";
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
  EXPECT_EQ(it->ops().size(), 40u);
  EXPECT_TRUE(it->report.first_differs);
  ASSERT_TRUE(it->plan().has_value());
  EXPECT_TRUE(graph::check_plan(*it->plan()).ok());
  const ContentHash first_root = it->dag().root();
  // The loop changes (another width): after flush the published iteration is the new one.
  for (int s = 0; s < 3; ++s) record_step(*r, b, s + 1, 40, 32, sid);
  p.flush();
  auto it2 = p.latest();
  ASSERT_NE(it2, nullptr);
  EXPECT_NE(it2->dag().root(), first_root);
  EXPECT_EQ(it2->trace->sizes(0)[1], 32);
  EXPECT_EQ(p.stats().ops_seen, 41u + 80u + 120u);
}

// Note [Reusing earlier builds] in Pipeline.cpp: later runs of one step (new storage ids,
// versions) republish the last analysis without building; a changed step is built again.
TEST(Pipeline, AnotherRunOfTheSameStepReusesTheLastBuild) {
  auto r = *Recorder::create();
  pipeline::Pipeline p(*r);
  OpBuilder b;
  std::uint64_t sid = 0;
  for (int s = 0; s < 3; ++s) record_step(*r, b, s, 40, 16, sid);
  p.flush();
  const auto first = p.latest();
  ASSERT_NE(first, nullptr) << p.last_reason();
  EXPECT_EQ(p.stats().builds, 1u);
  // The build's parts after the key and copy: each took time, and together they fit in the rest.
  const pipeline::PipelineStats built = p.stats();
  EXPECT_GT(built.last_graph_ns, 0u);
  EXPECT_GT(built.last_dag_ns, 0u);
  EXPECT_GT(built.last_plan_ns, 0u);
  EXPECT_LE(built.last_graph_ns + built.last_dag_ns + built.last_plan_ns,
            built.last_build_ns - built.last_copy_ns);
  const std::uint64_t recycled_before = p.stats().recycled;
  for (int s = 3; s < 6; ++s) record_step(*r, b, s, 40, 16, sid);
  p.flush();
  const auto again = p.latest();
  ASSERT_NE(again, nullptr);
  EXPECT_NE(again, first);  // published anew, with the new detection report
  EXPECT_EQ(p.stats().builds, 1u);
  EXPECT_EQ(p.stats().reused, 1u);
  // A hit copies nothing, so no spare trace is used (Note [Recycled copies]: the one taken is
  // given back untouched), and it shares the cached build's trace.
  EXPECT_EQ(p.stats().recycled, recycled_before);
  EXPECT_EQ(again->trace, first->trace);
  EXPECT_GT(again->report.segments.size(), first->report.segments.size());
  EXPECT_EQ(again->dag().root(), first->dag().root());
  EXPECT_EQ(again->plan()->arena_bytes, first->plan()->arena_bytes);
  EXPECT_GT(p.stats().last_reuse_ns, 0u);

  // What a fresh build of those last ops gives, from a snapshot of the whole trace.
  const Trace all = r->snapshot();
  const std::vector<std::size_t> last_ops = [&] {
    std::vector<std::size_t> v(40);
    for (std::size_t i = 0; i < 40; ++i) v[i] = all.num_ops() - 40 + i;
    return v;
  }();
  const auto fresh = graph::build_iteration(all, last_ops);
  EXPECT_EQ(fresh->dag().root(), again->dag().root());
  EXPECT_EQ(fresh->plan()->arena_bytes, again->plan()->arena_bytes);
  EXPECT_EQ(fresh->graph().num_edges(), again->graph().num_edges());
  // The recorder's in-place key is the key of a copy of the same ops.
  EXPECT_EQ(r->structure_key(last_ops), record::structure_key(r->copy_ops(last_ops), [] {
              std::vector<std::size_t> v(40);
              for (std::size_t i = 0; i < 40; ++i) v[i] = i;
              return v;
            }()));

  // A cache keyed by content: it survives clear(), and what follows is published again.
  r->clear();
  p.flush();
  EXPECT_EQ(p.latest(), nullptr);
  for (int s = 6; s < 9; ++s) record_step(*r, b, s, 40, 16, sid);
  p.flush();
  ASSERT_NE(p.latest(), nullptr);
  EXPECT_EQ(p.latest()->dag().root(), first->dag().root());
  EXPECT_EQ(p.stats().builds, 1u);

  // The same step recorded by another thread: reused, and published as that thread's.
  const std::uint64_t reused_before = p.stats().reused;
  std::thread other([&] {
    OpBuilder ob;
    for (int s = 0; s < 3; ++s) record_step(*r, ob, s, 40, 16, sid);
  });
  other.join();
  p.flush();
  ASSERT_NE(p.latest(), nullptr);
  EXPECT_EQ(p.stats().reused, reused_before + 1);
  EXPECT_EQ(first->thread, 0u);  // thread indices in order of first recording
  EXPECT_EQ(p.latest()->thread, 1u);

  // Another width: built from scratch. With reuse off, the same step is built again too.
  for (int s = 9; s < 12; ++s) record_step(*r, b, s, 40, 24, sid);
  p.flush();
  EXPECT_EQ(p.stats().builds, 2u);
  EXPECT_NE(p.latest()->dag().root(), first->dag().root());
  p.set_reuse(false);
  for (int s = 12; s < 15; ++s) record_step(*r, b, s, 40, 24, sid);
  p.flush();
  EXPECT_EQ(p.stats().builds, 3u);
  EXPECT_EQ(p.stats().cached, 2u) << "built again, it replaces its own entry";
}

// A loop that alternates steps (training and evaluation) reuses each one's analysis: build
// keeps the last kCachedBuilds structures, most recently used first, and drops the oldest.
// Each phase starts after a clear(), so that the detector's window holds that phase alone (in
// a real run, a phase of a few hundred steps fills the window the same way).
TEST(Pipeline, AlternatingStepsReuseTheirOwnBuilds) {
  auto r = *Recorder::create();
  pipeline::Pipeline p(*r);
  OpBuilder b;
  std::uint64_t sid = 0;
  int step = 1;
  std::map<std::int64_t, ContentHash> root_of;  // width -> root of its first build
  auto run = [&](std::int64_t width) {
    r->clear();
    for (int s = 0; s < 3; ++s) record_step(*r, b, step++, 40, width, sid);
    p.flush();
    const auto it = p.latest();
    EXPECT_NE(it, nullptr) << p.last_reason();
    if (it == nullptr) return;
    EXPECT_EQ(it->trace->sizes(0)[1], width) << "the published iteration is the step just run";
    const auto [at, first] = root_of.emplace(width, it->dag().root());
    if (!first) {
      EXPECT_EQ(it->dag().root(), at->second);
    }
  };
  run(16);
  run(24);
  EXPECT_EQ(p.stats().builds, 2u);
  EXPECT_EQ(p.stats().cached, 2u);
  run(16);
  run(24);
  run(16);
  EXPECT_EQ(p.stats().builds, 2u) << "each switch back is a reuse";
  EXPECT_EQ(p.stats().reused, 3u);
  // Four more structures: the cache keeps four, so 16 and 24, the least recently used, go.
  static_assert(pipeline::Pipeline::kCachedBuilds == 4);
  for (std::int64_t w : {32, 40, 48, 56}) run(w);
  EXPECT_EQ(p.stats().builds, 6u);
  EXPECT_EQ(p.stats().cached, 4u);
  run(32);  // still cached, and now the most recently used
  EXPECT_EQ(p.stats().builds, 6u);
  EXPECT_EQ(p.stats().reused, 4u);
  run(64);  // a fifth: 40 goes (first in, first out would drop 32)
  EXPECT_EQ(p.stats().builds, 7u);
  run(32);
  EXPECT_EQ(p.stats().builds, 7u) << "32 was used more recently than 40";
  EXPECT_EQ(p.stats().reused, 5u);
  run(40);  // dropped: built again, to the same analysis (run() compares the roots)
  EXPECT_EQ(p.stats().builds, 8u);
  run(16);
  EXPECT_EQ(p.stats().builds, 9u);
  EXPECT_EQ(p.stats().cached, 4u);
}

// A pipeline that builds every iteration afresh (reuse off), its recorder, and the state
// record_step carries from step to step.
class PipelineWithoutReuse : public ::testing::Test {
 protected:
  PipelineWithoutReuse() { p.set_reuse(false); }
  std::unique_ptr<Recorder> r = *Recorder::create();
  pipeline::Pipeline p{*r};
  OpBuilder b;
  std::uint64_t sid = 0;
  int step = 1;
};

// Note [Recycled copies] (Pipeline.cpp): with reuse off every run is built, each copy made
// into the memory of an earlier copy once no iteration holds that any more. A recycled trace
// must hold exactly the new ops: longer and shorter steps alternate, so leftovers of a bigger
// copy would show as extra ops, tensors, dims or offsets.
TEST_F(PipelineWithoutReuse, RecycledCopiesHoldExactlyTheNewOps) {
  // Five structures A-E (ops, width); the cache keeps four analyses, and with them their traces.
  const std::pair<int, std::int64_t> runs[] = {{80, 16}, {40, 24}, {80, 32}, {24, 16}, {60, 8},
                                               {40, 24}, {80, 16}, {24, 16}, {60, 8}};
  for (const auto& [n, width] : runs) {
    r->clear();
    for (int s = 0; s < 3; ++s) record_step(*r, b, step++, n, width, sid);
    p.flush();
    const auto it = p.latest();
    ASSERT_NE(it, nullptr) << p.last_reason();
    ASSERT_EQ(it->trace->num_ops(), static_cast<std::size_t>(n));
    std::vector<std::size_t> last(static_cast<std::size_t>(n));
    const std::size_t total = r->snapshot().num_ops();
    for (std::size_t i = 0; i < last.size(); ++i) last[i] = total - last.size() + i;
    const Trace fresh = r->copy_ops(last);
    EXPECT_TRUE(*it->trace == fresh) << n << " ops of width " << width;
    // The derived offsets, which operator== leaves out.
    EXPECT_EQ(it->trace->op_tensor_begin, fresh.op_tensor_begin);
    EXPECT_EQ(it->trace->op_scalar_begin, fresh.op_scalar_begin);
    EXPECT_EQ(it->trace->tensor_dims_begin, fresh.tensor_dims_begin);
    EXPECT_EQ(it->trace->sizes(0)[1], width);
    // The same analysis as a build from that fresh copy.
    const auto rebuilt = graph::build_iteration(fresh, [&] {
      std::vector<std::size_t> v(last.size());
      for (std::size_t i = 0; i < v.size(); ++i) v[i] = i;
      return v;
    }());
    EXPECT_EQ(rebuilt->dag().root(), it->dag().root());
    EXPECT_EQ(rebuilt->plan()->arena_bytes, it->plan()->arena_bytes);
  }
  const pipeline::PipelineStats st = p.stats();
  EXPECT_EQ(st.builds, std::size(runs));
  EXPECT_EQ(st.reused, 0u);
  // Runs 1-4 fill the cache and nothing is free; run 5 (E) evicts run 1's analysis, whose trace
  // run 6 (B again, 40 ops into 80 ops' memory) is copied into; from then on each run replaces
  // or evicts one cached analysis, and the next run reuses its trace (80 into 40, 24 into 80,
  // 60 into 24).
  EXPECT_EQ(st.recycled, 4u);
}

// Note [Recycled copies]: a trace goes back to the pool only when nothing holds it. An iteration
// a caller keeps while later builds run (each of them a different structure, so that the cache
// evicts the kept one's analysis and the pool hands traces round) keeps exactly what it held.
TEST_F(PipelineWithoutReuse, AHeldIterationKeepsItsTraceAcrossLaterBuilds) {
  for (int s = 0; s < 3; ++s) record_step(*r, b, step++, 50, 16, sid);
  p.flush();
  const std::shared_ptr<const graph::Iteration> held = p.latest();
  ASSERT_NE(held, nullptr) << p.last_reason();
  const Trace before = *held->trace;
  const auto root = held->dag().root();
  for (int k = 0; k < 8; ++k) {  // eight more structures, built one after another
    r->clear();
    for (int s = 0; s < 3; ++s) record_step(*r, b, step++, 30 + 10 * (k % 4), 8 * (k + 3), sid);
    p.flush();
    ASSERT_NE(p.latest(), nullptr) << p.last_reason();
    EXPECT_NE(p.latest()->trace, held->trace);
  }
  EXPECT_GT(p.stats().recycled, 0u) << "later builds recycled traces (the kept one not among them)";
  EXPECT_TRUE(*held->trace == before);
  EXPECT_EQ(held->trace->op_tensor_begin, before.op_tensor_begin);
  EXPECT_EQ(held->trace->tensor_dims_begin, before.tensor_dims_begin);
  EXPECT_EQ(held->dag().root(), root);
}

// An iteration may outlive the pipeline that published it: its trace's deleter shares the pool,
// so letting go of it afterwards hands the trace to a pool that still exists (ASan checks it).
TEST(Pipeline, AnIterationOutlivesItsPipeline) {
  auto r = *Recorder::create();
  std::shared_ptr<const graph::Iteration> kept;
  std::uint64_t sid = 0;
  {
    pipeline::Pipeline p(*r);
    OpBuilder b;
    for (int s = 0; s < 3; ++s) record_step(*r, b, s, 40, 16, sid);
    p.flush();
    kept = p.latest();
    ASSERT_NE(kept, nullptr) << p.last_reason();
  }
  EXPECT_EQ(kept->trace->num_ops(), 40u);
  EXPECT_EQ(kept->trace->sizes(0)[1], 16);
  std::weak_ptr<const record::Trace> trace = kept->trace;
  kept.reset();
  EXPECT_TRUE(trace.expired());
}

// Note [Wiring key] (Trace.h): a step whose scalars change every step keeps its wiring key;
// build rebases the last graph and plan and builds the Merkle DAG alone, and what it publishes
// equals a fresh build of the same ops, storage ids and versions included.
TEST(Pipeline, ChangedScalarsRebuildOnlyTheDag) {
  auto r = *Recorder::create();
  pipeline::Pipeline p(*r);
  OpBuilder b;
  std::uint64_t sid = 0;
  for (int s = 0; s < 3; ++s) record_step(*r, b, s, 40, 16, sid, 0.5 + s);
  p.flush();
  const auto first = p.latest();
  ASSERT_NE(first, nullptr) << p.last_reason();
  EXPECT_EQ(p.stats().builds, 1u);
  for (int s = 3; s < 6; ++s) record_step(*r, b, s, 40, 16, sid, 0.5 + s);
  p.flush();
  const auto again = p.latest();
  ASSERT_NE(again, nullptr);
  EXPECT_EQ(p.stats().builds, 1u);
  EXPECT_EQ(p.stats().reused, 0u);
  EXPECT_EQ(p.stats().rewired, 1u);
  EXPECT_GT(p.stats().last_rewire_ns, 0u);
  EXPECT_NE(again->dag().root(), first->dag().root());  // the scalars are in the content hashes

  // The reference: a fresh build of the last 40 ops of a snapshot. Its trace indices differ
  // from the published copy's (0..39); everything else must be equal.
  const Trace all = r->snapshot();
  std::vector<std::size_t> last_ops(40);
  for (std::size_t i = 0; i < 40; ++i) last_ops[i] = all.num_ops() - 40 + i;
  const auto fresh = graph::build_iteration(all, last_ops);
  EXPECT_EQ(fresh->dag().root(), again->dag().root());
  for (std::size_t n = 0; n < 40; ++n)
    EXPECT_EQ(fresh->dag().node_hash(n), again->dag().node_hash(n)) << n;
  ASSERT_EQ(fresh->dag().regions().size(), again->dag().regions().size());
  for (std::size_t i = 0; i < fresh->dag().regions().size(); ++i)
    EXPECT_EQ(fresh->dag().regions()[i].hash, again->dag().regions()[i].hash);
  ASSERT_EQ(fresh->graph().num_nodes(), again->graph().num_nodes());
  for (std::size_t n = 0; n < fresh->graph().num_nodes(); ++n) {
    const auto fp = fresh->graph().predecessors(n), ap = again->graph().predecessors(n);
    ASSERT_EQ(fp.size(), ap.size());
    for (std::size_t k = 0; k < fp.size(); ++k) {
      EXPECT_EQ(fp[k].node, ap[k].node);
      EXPECT_EQ(fp[k].slot, ap[k].slot);
    }
  }
  ASSERT_EQ(fresh->graph().externals().size(), again->graph().externals().size());
  for (std::size_t i = 0; i < fresh->graph().externals().size(); ++i) {
    EXPECT_EQ(fresh->graph().externals()[i].storage_id, again->graph().externals()[i].storage_id);
    EXPECT_EQ(fresh->graph().externals()[i].version, again->graph().externals()[i].version);
  }
  EXPECT_EQ(fresh->graph().numbering().storages, again->graph().numbering().storages);
  ASSERT_TRUE(fresh->plan() && again->plan());
  EXPECT_TRUE(graph::testing_util::same_placement(*fresh->plan(), *again->plan()));
  EXPECT_GT(again->plan()->shared_blocks, 0u) << "relu's outputs take over their inputs' blocks";
  EXPECT_NE(again->plan()->blocks[0].storage_id, first->plan()->blocks[0].storage_id);  // rebased
  EXPECT_TRUE(graph::check_plan(*again->plan()).ok());
  // The published trace is the new ops' copy: its scalars are the last step's.
  ASSERT_NE(again->trace, nullptr);
  EXPECT_EQ(again->trace->scalars_of(39).size(), 1u);
  EXPECT_EQ(std::bit_cast<double>(again->trace->scalars_of(39)[0].bits), 5.5);

  // The same scalars again: the whole analysis is reused. Another width: a full build.
  for (int s = 3; s < 6; ++s) record_step(*r, b, s, 40, 16, sid, 0.5 + s);
  p.flush();
  EXPECT_EQ(p.stats().reused, 1u);
  EXPECT_EQ(p.stats().builds, 1u);
  EXPECT_EQ(p.latest()->dag().root(), again->dag().root());
  r->clear();  // the detector would find the 120 ops of the new width too few of the window
  for (int s = 6; s < 9; ++s) record_step(*r, b, s, 40, 24, sid, 0.5 + s);
  p.flush();
  EXPECT_EQ(p.stats().builds, 2u) << p.last_reason();
  EXPECT_EQ(p.stats().rewired, 1u);
  // Reuse off: built, never rewired.
  p.set_reuse(false);
  for (int s = 9; s < 12; ++s) record_step(*r, b, s, 40, 24, sid, 0.5 + s);
  p.flush();
  EXPECT_EQ(p.stats().builds, 3u);
  EXPECT_EQ(p.stats().rewired, 1u);
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

// A loop, then ops that are no loop: the loop's iteration stays published (it is the last one
// found), and last_detection() says that what followed it on its thread is not periodic, which
// crucible.iteration() turns into a warning. Another loop after them is periodic again.
TEST(Pipeline, OpsAfterALoopThatAreNoLoopAreReportedAsSuch) {
  auto r = *Recorder::create();
  pipeline::Pipeline p(*r);
  EXPECT_FALSE(p.last_detection().any);
  OpBuilder b;
  std::uint64_t sid = 0;
  for (int s = 0; s < 4; ++s) record_step(*r, b, s, 20, 16, sid);
  p.flush();
  const auto loop = p.latest();
  ASSERT_NE(loop, nullptr) << p.last_reason();
  pipeline::Pipeline::Detection d = p.last_detection();
  EXPECT_TRUE(d.any && d.periodic) << d.reason;
  EXPECT_EQ(d.thread, loop->thread);
  for (int w = 1; w < 30; ++w) record_step(*r, b, 1, 3, w, sid);  // a new width every step
  p.flush();
  EXPECT_EQ(p.latest(), loop) << "the last iteration found stays published";
  d = p.last_detection();
  EXPECT_TRUE(d.any);
  EXPECT_FALSE(d.periodic);
  EXPECT_EQ(d.thread, loop->thread);
  EXPECT_NE(d.reason.find("not periodic"), std::string::npos) << d.reason;
  // Enough steps that the repeating tail covers a third of the window (IterationDetector).
  for (int s = 0; s < 10; ++s) record_step(*r, b, s + 1, 20, 8, sid);
  p.flush();
  d = p.last_detection();
  EXPECT_TRUE(d.periodic) << d.reason;
  ASSERT_NE(p.latest(), loop);
  EXPECT_EQ(p.latest()->ops().size(), 20u);
  r->clear();
  p.flush();
  EXPECT_FALSE(p.last_detection().any) << "clear() forgets the detections";
}

}  // namespace
