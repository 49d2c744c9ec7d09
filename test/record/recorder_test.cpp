// recorder_test.cpp — commit/drain/flush, back-pressure, counted drops, threads, names.
#include "crucible/record/Recorder.h"

#include <gtest/gtest.h>
#include <malloc.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>

#include "crucible/record/TraceFile.h"
#include "test_util.h"

namespace {
using namespace crucible::record;
using crucible::record::test_util::add_matrix;
using crucible::record::test_util::commit_synthetic;

void expect_synthetic(const Trace& t, std::size_t op, std::uint64_t i) {
  ASSERT_LT(op, t.num_ops());
  const TraceEntry& e = t.ops[op];
  EXPECT_EQ(e.n_tensors, 3u);
  EXPECT_EQ(e.n_inputs, 2u);
  auto in = t.inputs(op);
  auto out = t.outputs(op);
  ASSERT_EQ(in.size(), 2u);
  ASSERT_EQ(out.size(), 1u);
  const std::int64_t rows = static_cast<std::int64_t>(i % 7 + 1);
  auto s0 = t.sizes(t.tensor_index(&in[0]));
  ASSERT_EQ(s0.size(), 2u);
  EXPECT_EQ(s0[0], rows);
  EXPECT_EQ(s0[1], 3);
  EXPECT_EQ(t.strides(t.tensor_index(&in[0]))[0], 3);
  EXPECT_EQ(t.sizes(t.tensor_index(&out[0]))[1], 5);
  EXPECT_EQ(in[0].storage_id, 2 * i + 1);
  EXPECT_EQ(out[0].storage_id, 2 * i + 3);
  EXPECT_TRUE(out[0].flags & tensor_flag::kOutput);
  auto sc = t.scalars_of(op);
  ASSERT_EQ(sc.size(), 2u);
  EXPECT_EQ(sc[0].kind, ScalarKind::Int);
  EXPECT_EQ(static_cast<std::int64_t>(sc[0].bits), static_cast<std::int64_t>(i));
  EXPECT_EQ(sc[1].kind, ScalarKind::Double);
}

TEST(Recorder, RejectsNonPowerOfTwoRings) {
  auto r = Recorder::create(RecorderConfig{1000, 1024, 1024, false});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("powers of two"), absl::string_view::npos);
}

// Rings that one recording thread could not hold are refused when the recorder is made, with
// what they would cost, not when a thread first records (in a kernel, or killed for memory).
TEST(Recorder, RejectsRingsTooLargeForTheMachine) {
  const std::uint64_t limit = Recorder::ring_memory_limit();
  ASSERT_GT(limit, 13u << 20) << "the default rings fit";
  auto r = Recorder::create(RecorderConfig{1u << 31, 1u << 31, 2, false});  // 256 GiB per thread
  if (limit >= (std::uint64_t{256} << 30)) GTEST_SKIP() << "a machine with 2 TiB of memory";
  ASSERT_FALSE(r.ok());
  const std::string msg(r.status().message());
  EXPECT_NE(msg.find("262144 MiB per recording thread"), std::string::npos) << msg;
  EXPECT_NE(msg.find("use smaller sizes"), std::string::npos) << msg;
  EXPECT_TRUE(Recorder::create(RecorderConfig{}).ok());
}

// A thread that records into many recorders in turn keeps none of their rings once they are
// destroyed (its thread-local lookup table holds no ownership). Measured with glibc's
// mallinfo2; skipped where malloc is replaced (sanitizers), which mallinfo2 does not see.
TEST(Recorder, DestroyedRecordersRingsAreFreedWhileTheThreadLives) {
  auto in_use = [] {
    const struct mallinfo2 mi = mallinfo2();
    return mi.uordblks + mi.hblkhd;
  };
  {
    const std::size_t before = in_use();
    void* probe = std::malloc(std::size_t{16} << 20);
    static_cast<volatile char*>(probe)[0] = 1;
    const bool seen = in_use() >= before + (std::size_t{16} << 20);
    std::free(probe);
    if (!seen) GTEST_SKIP() << "malloc is not glibc's here (a sanitizer build)";
  }
  const std::size_t before = in_use();
  for (int i = 0; i < 8; ++i) {
    auto r = *Recorder::create();  // 13 MiB of rings per recording thread
    OpBuilder b;
    ASSERT_TRUE(commit_synthetic(*r, b, r->intern_schema("aten::mm"), 0));
    EXPECT_EQ(r->snapshot().num_ops(), 1u);
  }
  const std::size_t after = in_use();
  EXPECT_LT(after, before + (std::size_t{13} << 20))
      << "rings of destroyed recorders are still held";
}

// A thread that records without pause refills a ring during every drain pass. Another
// thread's flush_token() and clear() must still return while it records (they were delivered
// only once a pass found every ring empty, i.e. after the recording thread paused).
TEST(Recorder, FlushAndClearReturnWhileAnotherThreadRecordsNonstop) {
  auto r = *Recorder::create();
  const auto mm = r->intern_schema("aten::mm");
  std::atomic<bool> stop{false}, running{false};
  std::thread producer([&] {
    running.store(
        true,
        std::memory_order_relaxed);  // before the loop: a failing commit cannot leave main waiting
    OpBuilder b;
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    for (std::uint64_t i = 0;
         !stop.load(std::memory_order_relaxed) && std::chrono::steady_clock::now() < until; ++i) {
      ASSERT_TRUE(commit_synthetic(*r, b, mm, i));
    }
    running.store(false, std::memory_order_relaxed);
  });
  while (!running.load()) std::this_thread::yield();
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  r->flush_token(1);
  EXPECT_TRUE(running.load()) << "flush_token returned only after the producer stopped";
  r->clear();
  EXPECT_TRUE(running.load()) << "clear returned only after the producer stopped";
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  stop.store(true);
  producer.join();
  // Ops committed while clear() ran are either forgotten with the trace or kept in it, and
  // the stats say the same: they count from what the clear forgot, not from a snapshot of the
  // producer's counters taken before it.
  const Trace t = r->snapshot();
  std::uint64_t counted = 0;
  for (const auto& st : r->thread_stats()) counted += st.total_ops();
  EXPECT_EQ(counted, t.num_ops());
  EXPECT_GT(t.num_ops(), 0u);
}

// A reused builder hands out cells that held an earlier op's: every int64 of a tensor's dims
// cells past its sizes and strides reads 0, whatever was there before.
TEST(OpBuilder, DimsCellsAreWrittenWhole) {
  OpBuilder b;
  const std::vector<std::int64_t> s4 = {2, 3, 4, 5}, t4 = {60, 20, 5, 1};
  TensorMeta m;
  b.add_tensor(m, s4, t4);  // fills all 8 int64 of its dims cell
  b.add_tensor(m, s4, t4);
  b.reset();
  const std::vector<std::int64_t> s1 = {7}, t1 = {1};
  b.add_tensor(m, s1, t1);
  const std::vector<std::int64_t> s5 = {1, 2, 3, 4, 5}, t5 = {120, 60, 20, 5, 1};
  b.add_tensor(m, s5, t5);  // two dims cells: 10 values, then 6 zeros
  const auto cells = b.cells();
  ASSERT_EQ(cells.size(), 2u + 3u);
  EXPECT_EQ(std::vector<std::int64_t>(cells[1].dims.v, cells[1].dims.v + 8),
            (std::vector<std::int64_t>{7, 1, 0, 0, 0, 0, 0, 0}));
  const auto* d = reinterpret_cast<const std::int64_t*>(cells.data() + 3);  // cells 3 and 4
  EXPECT_EQ(std::vector<std::int64_t>(d, d + 16),
            (std::vector<std::int64_t>{1, 2, 3, 4, 5, 120, 60, 20, 5, 1, 0, 0, 0, 0, 0, 0}));
}

TEST(Recorder, FlushMakesEveryCommittedOpVisibleInOrder) {
  auto r = *Recorder::create();
  OpBuilder b;
  const auto addmm = r->intern_schema("aten::addmm");
  for (std::uint64_t i = 0; i < 1000; ++i) ASSERT_TRUE(commit_synthetic(*r, b, addmm, i));
  Trace t = r->snapshot();
  ASSERT_EQ(t.num_ops(), 1000u);
  for (std::uint64_t i = 0; i < 1000; ++i) {
    EXPECT_EQ(t.ops[i].seq, i);
    expect_synthetic(t, i, i);
  }
  EXPECT_EQ(t.schema_name(addmm), "aten::addmm");
  EXPECT_EQ(t.total_ops(Phase::Forward), 1000u);
  EXPECT_EQ(t.total_dropped(), 0u);
}

TEST(Recorder, BackPressureLosesNothingWithTinyRings) {
  auto r = *Recorder::create(RecorderConfig{4, 8, 4, false});
  OpBuilder b;
  const auto s = r->intern_schema("aten::mm");
  constexpr std::uint64_t kOps = 20000;
  for (std::uint64_t i = 0; i < kOps; ++i) ASSERT_TRUE(commit_synthetic(*r, b, s, i));
  Trace t = r->snapshot();
  ASSERT_EQ(t.num_ops(), kOps);
  for (std::uint64_t i = 0; i < kOps; i += 997) expect_synthetic(t, i, i);
  EXPECT_GT(t.threads.at(0).waits, 0u) << "4-slot rings must have made the producer wait";
}

TEST(Recorder, OpLargerThanTheRingGoesThroughWithBackPressure) {
  auto r = *Recorder::create(RecorderConfig{4, 16, 4, false});
  OpBuilder b;
  for (std::uint16_t k = 0; k < 1000; ++k) add_matrix(b, k + 1, 2, k, 0);  // a 1000-long TensorList
  b.end_inputs();
  ASSERT_TRUE(r->commit(r->thread_log(), b.entry(r->intern_schema("aten::_foreach_add_.List"), Phase::Optimizer, 0),
                        b.cells(), b.scalars()));
  Trace t = r->snapshot();
  ASSERT_EQ(t.num_ops(), 1u);
  ASSERT_EQ(t.inputs(0).size(), 1000u);
  EXPECT_EQ(t.sizes(999)[0], 1000);
  EXPECT_EQ(t.total_ops(Phase::Optimizer), 1u);
}

TEST(Recorder, DropModeCountsDropsAndFlagsTheNextOp) {
  auto r = *Recorder::create(RecorderConfig{4, 16, 4, true});
  OpBuilder b;
  const auto s = r->intern_schema("aten::cat");
  // An op that can never fit a 16-cell ring is dropped, counted, and the next op says so.
  for (std::uint16_t k = 0; k < 40; ++k) add_matrix(b, 1, 1, k, 0);
  b.end_inputs();
  EXPECT_FALSE(r->commit(r->thread_log(), b.entry(s, Phase::Forward, 0), b.cells(), b.scalars()));
  ASSERT_TRUE(commit_synthetic(*r, b, s, 7));
  // Many small ops against the drain: recorded + dropped == attempted.
  std::uint64_t recorded = 1;
  for (std::uint64_t i = 0; i < 20000; ++i) recorded += commit_synthetic(*r, b, s, i) ? 1 : 0;
  Trace t = r->snapshot();
  EXPECT_EQ(t.num_ops(), recorded);
  EXPECT_EQ(t.total_dropped() + recorded, 20002u);
  EXPECT_TRUE(t.ops[0].flags & op_flag::kAfterDrop);
  std::uint64_t flagged = 0;
  for (const auto& e : t.ops) flagged += (e.flags & op_flag::kAfterDrop) != 0;
  EXPECT_GE(flagged, 1u);
  EXPECT_LE(flagged, t.total_dropped());
}

TEST(Recorder, ThreadsRecordIntoTheirOwnLogsInProgramOrder) {
  auto r = *Recorder::create();
  const auto s = r->intern_schema("aten::relu");
  constexpr int kThreads = 4;
  constexpr std::uint64_t kOps = 5000;
  std::vector<std::thread> ts;
  for (int k = 0; k < kThreads; ++k)
    ts.emplace_back([&] {
      OpBuilder b;
      for (std::uint64_t i = 0; i < kOps; ++i) commit_synthetic(*r, b, s, i, Phase::Backward);
    });
  for (auto& t : ts) t.join();
  Trace t = r->snapshot();
  ASSERT_EQ(t.num_ops(), kThreads * kOps);
  std::vector<std::uint64_t> next(kThreads, 0);
  for (std::size_t op = 0; op < t.num_ops(); ++op) {
    const auto th = t.ops[op].thread;
    ASSERT_LT(th, static_cast<std::uint32_t>(kThreads));
    ASSERT_EQ(t.ops[op].seq, next[th]) << "thread " << th;
    expect_synthetic(t, op, next[th]);
    ++next[th];
  }
  EXPECT_EQ(t.threads.size(), static_cast<std::size_t>(kThreads));
  EXPECT_EQ(t.total_ops(Phase::Backward), kThreads * kOps);
}

// copy_ops takes runs of consecutive ops in bulk: the copy must equal the ops one by one, for
// one thread's ops interleaved with another's, for a strided subset, and with an index past
// the end (skipped). It carries the names and external classifications those ops use, only.
TEST(Recorder, CopyOpsEqualsTheOpsOneByOne) {
  auto r = *Recorder::create();
  const auto relu = r->intern_schema("aten::relu"), add = r->intern_schema("aten::add.Tensor");
  const auto unused = r->intern_schema("aten::unused");
  std::vector<std::thread> ts;
  for (int k = 0; k < 2; ++k)
    ts.emplace_back([&, k] {
      OpBuilder b;
      for (std::uint64_t i = 0; i < 3000; ++i) commit_synthetic(*r, b, k == 0 ? relu : add, i);
    });
  for (auto& t : ts) t.join();
  r->classify_external(1, ExternalKind::Parameter);     // the first input of op i = 0 of each thread
  r->classify_external(99999999, ExternalKind::Input);  // no op uses it
  const Trace t = r->snapshot();
  std::vector<std::size_t> thread0, strided{0};  // op 0 is some thread's i = 0: it reads storage 1
  for (std::size_t op = 0; op < t.num_ops(); ++op) {
    if (t.ops[op].thread == t.ops[0].thread) thread0.push_back(op);
    if (op % 3 == 2) strided.push_back(op);
  }
  strided.push_back(t.num_ops() + 5);
  for (const auto& ops : {thread0, strided}) {
    const Trace c = r->copy_ops(ops);
    std::size_t k = 0;
    for (std::size_t op : ops) {
      if (op >= t.num_ops()) continue;
      ASSERT_LT(k, c.num_ops());
      EXPECT_EQ(std::memcmp(&c.ops[k], &t.ops[op], sizeof(TraceEntry)), 0) << "op " << op;
      const auto ci = c.inputs(k), ti = t.inputs(op), co = c.outputs(k), to = t.outputs(op);
      ASSERT_EQ(ci.size(), ti.size());
      ASSERT_EQ(co.size(), to.size());
      for (std::size_t j = 0; j < ci.size() + co.size(); ++j) {
        const TensorMeta& a = j < ci.size() ? ci[j] : co[j - ci.size()];
        const TensorMeta& b = j < ti.size() ? ti[j] : to[j - ti.size()];
        EXPECT_EQ(std::memcmp(&a, &b, sizeof(TensorMeta)), 0);
        const auto as = c.sizes(c.tensor_index(&a)), bs = t.sizes(t.tensor_index(&b));
        const auto ast = c.strides(c.tensor_index(&a)), bst = t.strides(t.tensor_index(&b));
        EXPECT_TRUE(std::equal(as.begin(), as.end(), bs.begin(), bs.end()));
        EXPECT_TRUE(std::equal(ast.begin(), ast.end(), bst.begin(), bst.end()));
      }
      const auto cs = c.scalars_of(k), tsc = t.scalars_of(op);
      ASSERT_EQ(cs.size(), tsc.size());
      for (std::size_t j = 0; j < cs.size(); ++j) EXPECT_EQ(std::memcmp(&cs[j], &tsc[j], sizeof(ScalarRecord)), 0);
      ++k;
    }
    EXPECT_EQ(k, c.num_ops());
    EXPECT_FALSE(c.schema_names.contains(unused));
    EXPECT_EQ(c.externals.size(), 1u);
    EXPECT_TRUE(c.externals.contains(1));
  }
}

// Note [Recycled copies]: an emptied trace equals a new one, member for member (the derived
// offsets too), and keeps its arrays' memory.
TEST(Trace, ClearKeepingCapacityEmptiesEverythingAndKeepsTheArrays) {
  auto r = *Recorder::create();
  const auto relu = r->intern_schema("aten::relu");
  ASSERT_TRUE(r->intern_module("layer1.conv").ok());
  OpBuilder b;
  for (std::uint64_t i = 0; i < 200; ++i) commit_synthetic(*r, b, relu, i);
  r->classify_external(1, ExternalKind::Parameter);
  Trace t = r->snapshot();
  ASSERT_EQ(t.num_ops(), 200u);
  ASSERT_FALSE(t.schema_names.empty() || t.module_paths.empty() || t.threads.empty() || t.externals.empty());
  const TraceEntry* ops = t.ops.data();
  const TensorMeta* tensors = t.tensors.data();
  const std::size_t dims_capacity = t.dims.capacity(), offsets_capacity = t.op_tensor_begin.capacity();
  t.clear_keeping_capacity();
  EXPECT_TRUE(t == Trace{});
  EXPECT_TRUE(t.schema_names.empty() && t.module_paths.empty() && t.threads.empty() && t.externals.empty());
  EXPECT_EQ(t.module_tree, nullptr);
  EXPECT_TRUE(t.op_tensor_begin.empty() && t.op_scalar_begin.empty() && t.tensor_dims_begin.empty());
  EXPECT_EQ(t.ops.data(), ops);
  EXPECT_EQ(t.tensors.data(), tensors);
  EXPECT_EQ(t.dims.capacity(), dims_capacity);
  EXPECT_EQ(t.op_tensor_begin.capacity(), offsets_capacity);
}

// What the pipeline relies on in key_and_copy: the key of ops read in place equals the key of
// their copy, contents computed by a sink while draining give the same key as contents
// computed later, and after a clear() the old generation's indices are refused as stale.
TEST(Recorder, KeyAndCopyAgreeAndRefuseAStaleGeneration) {
  struct Sink final : DrainSink {
    std::vector<crucible::ContentHash> contents;
    std::vector<std::uint64_t> generations;
    void on_ops(const Trace& t, std::uint64_t generation, std::uint32_t, std::size_t first, std::size_t count) override {
      for (std::size_t k = first; k < first + count; ++k) {
        contents.push_back(op_content(t, k));
        generations.push_back(generation);
      }
    }
    void on_barrier(std::uint64_t) override {}
    void on_clear() override {}
  } sink;
  auto r = *Recorder::create();
  r->set_sink(&sink);
  const auto relu = r->intern_schema("aten::relu");
  OpBuilder b;
  for (std::uint64_t i = 0; i < 50; ++i) commit_synthetic(*r, b, relu, i);
  r->classify_external(1, ExternalKind::Input);
  r->flush_token(1);
  ASSERT_EQ(sink.contents.size(), 50u);
  std::vector<std::size_t> ops(50), all(50);
  for (std::size_t i = 0; i < 50; ++i) ops[i] = all[i] = i;
  Recorder::CopyRequest req{ops};
  req.want_key = true;
  req.contents = sink.contents;
  req.generation = sink.generations[0];
  const Recorder::KeyedCopy kc = r->key_and_copy(req);
  ASSERT_FALSE(kc.stale);
  ASSERT_TRUE(kc.copy.has_value());
  EXPECT_EQ(kc.key, structure_key(*kc.copy, all));
  EXPECT_EQ(kc.key, r->structure_key(ops));
  const crucible::ContentHash known = kc.key;
  const crucible::ContentHash other{known.lo ^ 1, known.hi};
  req.unless = std::span(&other, 1);
  EXPECT_TRUE(r->key_and_copy(req).copy.has_value()) << "another key does not skip the copy";
  const crucible::ContentHash keys[] = {other, known};
  req.unless = keys;
  EXPECT_FALSE(r->key_and_copy(req).copy.has_value()) << "a matching key skips the copy";
  r->classify_external(3, ExternalKind::Parameter);  // a storage op 1 reads: another structure
  EXPECT_NE(r->structure_key(ops), known);
  r->clear();
  for (std::uint64_t i = 0; i < 50; ++i) commit_synthetic(*r, b, relu, i);
  r->flush_token(2);
  const Recorder::KeyedCopy after = r->key_and_copy(req);
  EXPECT_TRUE(after.stale);
  EXPECT_FALSE(after.copy.has_value());
  EXPECT_NE(sink.generations.back(), sink.generations.front());
  r->set_sink(nullptr);
}

// Note [Wiring log]: the recorder keys a run of consecutive ops from its wiring log and any
// other op list from the trace; both give the key of the ops' copy, before and after a clear()
// (which empties the log with the trace), and the counters say which pass ran.
TEST(Recorder, RunsAreKeyedFromTheWiringLogAsFromTheirCopy) {
  auto r = *Recorder::create();
  const auto relu = r->intern_schema("aten::relu"), mm = r->intern_schema("aten::mm");
  OpBuilder b;
  for (int round = 0; round < 2; ++round) {
    for (std::uint64_t i = 0; i < 60; ++i) commit_synthetic(*r, b, i % 3 ? relu : mm, i % 11);
    r->classify_external(3, ExternalKind::Input);
    r->flush();
    const Trace t = r->snapshot();
    ASSERT_EQ(t.num_ops(), 60u);
    for (const auto& [first, n] :
         {std::pair<std::size_t, std::size_t>{0, 60}, {5, 20}, {59, 1}, {17, 33}}) {
      std::vector<std::size_t> ops(n), all(n);
      for (std::size_t k = 0; k < n; ++k) ops[k] = first + k, all[k] = k;
      const std::uint64_t from_log = r->keys_from_log(), from_trace = r->keys_from_trace();
      EXPECT_EQ(r->structure_key(ops), structure_key(r->copy_ops(ops), all)) << first << "+" << n;
      EXPECT_EQ(r->structure_key(ops), structure_key(t, ops));
      EXPECT_EQ(r->keys_from_log(), from_log + 2) << "a run is keyed from the log";
      EXPECT_EQ(r->keys_from_trace(), from_trace);
    }
    // Not a run: the trace's pass, with the same answer as the copy's.
    const std::vector<std::size_t> gaps{1, 3, 4, 9}, local{0, 1, 2, 3};
    const std::uint64_t from_trace = r->keys_from_trace();
    EXPECT_EQ(r->structure_key(gaps), structure_key(r->copy_ops(gaps), local));
    EXPECT_EQ(r->keys_from_trace(), from_trace + 1);
    r->clear();
  }
}

TEST(Recorder, ModulePathsAreInternedOnce) {
  auto r = *Recorder::create();
  EXPECT_EQ(r->intern_module("").value(), 0u);
  const auto a = r->intern_module("layer1.0.conv1").value();
  EXPECT_EQ(r->intern_module("layer1.0.conv1").value(), a);
  EXPECT_NE(r->intern_module("layer1.0.bn1").value(), a);
  Trace t = r->snapshot();
  ASSERT_GT(t.module_paths.size(), a);
  EXPECT_EQ(t.module_path(a), "layer1.0.conv1");
  EXPECT_EQ(t.module_path(999), "<unknown module>");
}

// Copies share the recorder's module scopes, worked out once per table: the same tree until a
// new path is interned, then one that describes the longer table.
TEST(Recorder, CopiesShareOneModuleTreePerTable) {
  auto r = *Recorder::create();
  ASSERT_TRUE(r->intern_module("block.0").ok());
  const Trace a = r->snapshot(), b = r->snapshot();
  ASSERT_NE(a.module_tree, nullptr);
  EXPECT_EQ(a.module_tree.get(), b.module_tree.get()) << "the table did not change";
  EXPECT_EQ(a.module_tree->num_paths(), a.module_paths.size());
  const auto id = r->intern_module("block.1").value();
  const Trace c = r->snapshot();
  ASSERT_NE(c.module_tree, nullptr);
  EXPECT_NE(c.module_tree.get(), a.module_tree.get());
  EXPECT_EQ(c.module_tree->num_paths(), c.module_paths.size());
  EXPECT_EQ(c.module_tree->label_of("block.1"), id);
  EXPECT_EQ(c.module_tree->label_of("block"), 0u);
  EXPECT_EQ(a.module_tree->label_of("block.1"), 0u) << "the older copy keeps its own table's tree";
}

// A path a .crtrace file cannot hold is refused when interned (with the reader's bounds), not
// recorded and then refused by export.
TEST(Recorder, ModulePathsPastTheFileBoundsAreRefusedWhenInterned) {
  auto r = *Recorder::create();
  std::string levels;  // kMaxModuleLevels components: the most a file holds
  for (std::size_t k = 0; k < kMaxModuleLevels; ++k) levels += k == 0 ? "b" : ".b";
  ASSERT_TRUE(r->intern_module(levels).ok());
  const auto deeper = r->intern_module(levels + ".b");
  ASSERT_FALSE(deeper.ok());
  EXPECT_NE(deeper.status().message().find("257 levels deep"), std::string_view::npos) << deeper.status();
  EXPECT_NE(deeper.status().message().find("256 levels"), std::string_view::npos) << deeper.status();
  ASSERT_TRUE(r->intern_module(std::string(kMaxModulePathBytes, 'x')).ok());
  const auto longer = r->intern_module(std::string(kMaxModulePathBytes + 1, 'x'));
  ASSERT_FALSE(longer.ok());
  EXPECT_NE(longer.status().message().find("65537 bytes"), std::string_view::npos) << longer.status();
  // What was accepted exports and loads back.
  const std::string path = ::testing::TempDir() + "/module_bounds.crtrace";
  ASSERT_TRUE(save_trace(r->snapshot(), path).ok());
  auto loaded = load_trace(path);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->module_paths.size(), 3u);  // "", and the two at the bounds
  std::remove(path.c_str());
}

TEST(Recorder, ClearForgetsDrainedOpsAndRestartsCounters) {
  auto r = *Recorder::create();
  OpBuilder b;
  const auto s = r->intern_schema("aten::add.Tensor");
  for (std::uint64_t i = 0; i < 10; ++i) commit_synthetic(*r, b, s, i);
  r->clear();
  EXPECT_EQ(r->snapshot().num_ops(), 0u);
  commit_synthetic(*r, b, s, 3);
  Trace t = r->snapshot();
  ASSERT_EQ(t.num_ops(), 1u);
  EXPECT_EQ(t.ops[0].seq, 10u) << "sequence numbers keep counting";
  EXPECT_EQ(t.total_ops(Phase::Forward), 1u);
}
}  // namespace
