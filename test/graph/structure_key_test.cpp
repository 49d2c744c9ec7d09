// structure_key_test.cpp — the structure key (record/Trace.h) against the analyses it stands
// for: renamed runs of one step get one key, and ops whose graph, DAG or plan differ never
// share a key. The pipeline republishes an analysis on a key match, so the second half is
// what keeps that correct.
#include <gtest/gtest.h>

#include <chrono>
#include <random>

#include "crucible/graph/Analysis.h"
#include "crucible/record/WiringLog.h"
#include "plan_compare.h"
#include "synth.h"

namespace {
using namespace crucible;
using namespace crucible::graph;
using record::ExternalKind;
using record::Phase;
using synth::T;

// How one step is wired: for each op, which earlier value each of its two inputs reads
// (-1: the parameter, -2: the batch input, k >= 0: op k's output), plus the knobs a change
// of program would turn.
struct Shape {
  std::vector<std::array<int, 2>> reads;
  std::vector<std::int64_t> width;   // per op: the output's second dimension
  std::int64_t alpha = 1;            // a scalar argument of every op ...
  int alpha_every = 1;               // ... whose index is a multiple of this (the others: 0)
  ExternalKind input_kind = ExternalKind::Input;
};

// Records one step of `s`. `rename` renames every storage (ids in another order: a bijection
// that scrambles them), moves every version by a per-storage amount and every address, as
// another run of the same step would. Every fourth op makes a second output of the same size,
// which nothing reads: two blocks of one size born at one op, placed by tie-break.
synth::Builder step(const Shape& s, std::uint64_t rename) {
  synth::Builder b;
  // Odd multiplier mod 2^32, then xor: a bijection on 32-bit ids that does not keep their order.
  auto id = [&](std::uint64_t base) -> std::uint64_t {
    if (rename == 0) return base;
    return static_cast<std::uint32_t>(static_cast<std::uint32_t>(base * 2654435761u) ^ static_cast<std::uint32_t>(rename * 40503u)) + std::uint64_t{1};
  };
  auto ver = [&](std::uint64_t sid) { return static_cast<std::uint32_t>(rename == 0 ? 0 : (sid * 7 + rename * 13) % 97); };
  auto val = [&](std::uint64_t base, std::vector<std::int64_t> shape, std::uint32_t bump = 0) {
    const std::uint64_t sid = id(base);
    return T{sid, ver(sid) + bump, std::move(shape), 6, sid * 64 + rename};
  };
  const std::uint64_t param = 7, input = 8;
  auto value = [&](int src) -> T {
    if (src == -1) return val(param, {8, 8});
    if (src == -2) return val(input, {8, 8});
    const auto k = static_cast<std::size_t>(src);
    return val(100 + k, {8, s.width[k]});
  };
  for (std::size_t op = 0; op < s.reads.size(); ++op) {
    std::vector<T> outs{val(100 + op, {8, s.width[op]})};
    if (op % 4 == 3) outs.push_back(val(5000 + op, {8, s.width[op]}));
    b.op(op % 2 ? "aten::mul" : "aten::add", {value(s.reads[op][0]), value(s.reads[op][1])}, outs,
         op < s.reads.size() / 2 ? Phase::Forward : Phase::Backward, op % 3 ? "block" : "",
         {op % static_cast<std::size_t>(s.alpha_every) == 0 ? s.alpha : 0});
  }
  // The optimizer updates the parameter in place: a new version of its storage.
  b.op("aten::add_", {val(param, {8, 8}), value(static_cast<int>(s.reads.size()) - 1)}, {val(param, {8, 8}, 1)},
       Phase::Optimizer);
  b.trace.externals[id(param)] = ExternalKind::Parameter;
  b.trace.externals[id(input)] = s.input_kind;
  return b;
}

// What a user of the analysis can observe, storage ids aside: hashes, the plan's figures and
// every block's size and offset in first-touch order.
struct Observed {
  ContentHash root;
  std::vector<ContentHash> regions;
  std::uint64_t arena, lower_bound, persistent;
  std::size_t edges, externals;
  std::vector<std::pair<std::uint64_t, std::uint64_t>> blocks;  // (bytes, offset)
  bool operator==(const Observed&) const = default;
};

Observed analyse(const synth::Builder& b) {
  auto it = build_iteration(b.trace, b.all());
  Observed o{it->dag().root(),
             {},
             it->plan()->arena_bytes,
             it->plan()->lower_bound,
             it->plan()->persistent_bytes,
             it->graph().num_edges(),
             it->graph().externals().size(),
             {}};
  for (const auto& r : it->dag().regions()) o.regions.push_back(r.hash);
  for (const auto& bl : it->plan()->blocks) o.blocks.emplace_back(bl.bytes, bl.offset);
  return o;
}

ContentHash key(const synth::Builder& b) { return record::structure_key(b.trace, b.all()); }

Shape chain(int n) {
  Shape s;
  s.reads.push_back({-2, -1});
  s.width.push_back(8);
  for (int i = 1; i < n; ++i) {
    s.reads.push_back({i - 1, -1});
    s.width.push_back(8);
  }
  return s;
}

TEST(StructureKey, RenamedRunsOfOneStepShareTheKey) {
  const Shape s = chain(6);
  EXPECT_EQ(key(step(s, 0)), key(step(s, 1)));
  EXPECT_EQ(key(step(s, 0)), key(step(s, 17)));
  EXPECT_EQ(analyse(step(s, 0)), analyse(step(s, 17)));
}

// build_iteration's BuildTimes: asking for them changes nothing built, each part takes time, and
// together they fit in the call's own wall time.
TEST(BuildIteration, TimesItsPartsWithoutChangingTheResult) {
  const synth::Builder b = step(chain(40), 0);
  BuildTimes parts;
  const auto t0 = std::chrono::steady_clock::now();
  const auto timed = build_iteration(b.trace, b.all(), {}, {}, std::nullopt, &parts);
  const auto wall = static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count());
  const auto plain = build_iteration(b.trace, b.all());
  EXPECT_EQ(timed->dag().root(), plain->dag().root());
  EXPECT_EQ(timed->plan()->arena_bytes, plain->plan()->arena_bytes);
  EXPECT_GT(parts.graph_ns, 0u);
  EXPECT_GT(parts.dag_ns, 0u);
  EXPECT_GT(parts.plan_ns, 0u);
  EXPECT_LE(parts.graph_ns + parts.dag_ns + parts.plan_ns, wall);
}

TEST(StructureKey, EachKindOfChangeGivesAnotherKey) {
  const Shape s = chain(6);
  const ContentHash k = key(step(s, 0));
  Shape rewired = s;  // op 4 reads op 2's output instead of op 3's: same shapes, other wiring
  rewired.reads[4][0] = 2;
  EXPECT_NE(key(step(rewired, 0)), k);
  EXPECT_NE(analyse(step(rewired, 0)), analyse(step(s, 0)));
  Shape wider = s;
  wider.width[5] = 16;
  EXPECT_NE(key(step(wider, 0)), k);
  Shape scaled = s;
  scaled.alpha = 2;
  EXPECT_NE(key(step(scaled, 0)), k);
  Shape constant = s;
  constant.input_kind = ExternalKind::Constant;
  EXPECT_NE(key(step(constant, 0)), k);
}

TEST(StructureKey, ReadingAStaleVersionIsAnotherStructure) {
  // Op 1 reads the parameter after the optimizer's in-place update in one trace and before it
  // in the other: one storage, another version, another producer.
  synth::Builder a, b;
  for (synth::Builder* x : {&a, &b}) {
    x->op("aten::add_", {T{1, 0}, T{2, 0}}, {T{1, 1}}, Phase::Optimizer);
    x->op("aten::relu", {T{1, x == &a ? 1u : 0u}}, {T{3, 0}});
    x->trace.externals[1] = ExternalKind::Parameter;
  }
  EXPECT_NE(key(a), key(b));
  EXPECT_NE(analyse(a), analyse(b));
}

TEST(StructureKey, OneStorageReadTwiceIsNotTwoStorages) {
  // Two never-produced inputs: the same storage twice, or two storages of one shape. The plan
  // counts persistent bytes per storage, so the two differ.
  synth::Builder same, two;
  same.op("aten::add", {T{1}, T{1}}, {T{3}});
  two.op("aten::add", {T{1}, T{2}}, {T{3}});
  EXPECT_NE(key(same), key(two));
  EXPECT_NE(analyse(same).persistent, analyse(two).persistent);
}

// Every field of a record that an analysis could read changes the key when it changes; the
// fields no analysis reads (addresses, sequence numbers, the recording thread) do not.
TEST(StructureKey, EveryFieldAnAnalysisReadsIsInTheKey) {
  Shape s = chain(4);
  s.alpha = 3;
  const synth::Builder base = step(s, 0);
  const ContentHash k = key(base);
  const Observed o = analyse(base);
  int changed_analyses = 0;
  auto expect_change = [&](const char* what, auto&& mutate) {
    synth::Builder b = base;
    mutate(b.trace);
    EXPECT_NE(key(b), k) << what;
    if (!(analyse(b) == o)) ++changed_analyses;
  };
  using record::Trace;
  expect_change("schema", [](Trace& t) { t.ops[1].schema_hash ^= 1; });
  expect_change("phase", [](Trace& t) { t.ops[1].phase = Phase::Optimizer; });
  expect_change("op flags", [](Trace& t) { t.ops[1].flags ^= record::op_flag::kGradMode; });
  expect_change("module", [](Trace& t) { t.ops[0].module_id = 1; });
  expect_change("argument count", [](Trace& t) { t.ops[1].n_args += 1; });
  const std::size_t k1 = base.trace.op_tensor_begin[1];  // op 1's first input
  expect_change("storage offset", [&](Trace& t) { t.tensors[k1].storage_offset = 2; });
  expect_change("storage bytes", [&](Trace& t) { t.tensors[k1 + 2].storage_nbytes *= 2; });  // its output
  expect_change("list index", [&](Trace& t) { t.tensors[k1].list_index = 1; });
  expect_change("argument index", [&](Trace& t) { t.tensors[k1].arg_index = 5; });
  expect_change("dtype", [&](Trace& t) { t.tensors[k1].dtype = 7; });
  expect_change("device", [&](Trace& t) { t.tensors[k1].device_kind = 1; });
  expect_change("device index", [&](Trace& t) { t.tensors[k1].device_index = 1; });
  expect_change("layout", [&](Trace& t) { t.tensors[k1].layout = 1; });
  expect_change("requires_grad", [&](Trace& t) { t.tensors[k1].flags ^= record::tensor_flag::kRequiresGrad; });
  expect_change("view", [&](Trace& t) { t.tensors[k1].flags ^= record::tensor_flag::kIsView; });
  expect_change("wrapped number", [&](Trace& t) {
    t.tensors[k1].flags |= record::tensor_flag::kWrappedNumber;
    t.tensors[k1].wrapped_value = 2.5;
  });
  expect_change("no storage", [&](Trace& t) { t.tensors[k1].flags ^= record::tensor_flag::kNoStorage; });
  expect_change("size", [&](Trace& t) { t.dims[t.tensor_dims_begin[k1]] = 9; });
  expect_change("stride", [&](Trace& t) { t.dims[t.tensor_dims_begin[k1] + 3] = 2; });
  const std::size_t s1 = base.trace.op_scalar_begin[1];
  expect_change("scalar value", [&](Trace& t) { t.scalars[s1].bits ^= 1; });
  expect_change("scalar kind", [&](Trace& t) { t.scalars[s1].kind = record::ScalarKind::Bool; });
  expect_change("scalar position", [&](Trace& t) { t.scalars[s1].arg_index += 1; });
  expect_change("scalar aux", [&](Trace& t) { t.scalars[s1].aux = 4; });
  expect_change("classification", [&](Trace& t) { t.externals[t.tensors[k1].storage_id] = ExternalKind::Buffer; });
  expect_change("version", [&](Trace& t) { t.tensors[k1].version += 1; });
  EXPECT_GT(changed_analyses, 10) << "the mutations reach the analysis";
  auto expect_same = [&](const char* what, auto&& mutate) {
    synth::Builder b = base;
    mutate(b.trace);
    EXPECT_EQ(key(b), k) << what;
    EXPECT_EQ(analyse(b), o) << what;
  };
  expect_same("addresses", [](Trace& t) { for (auto& m : t.tensors) m.data_ptr += 4096; });
  expect_same("sequence numbers", [](Trace& t) { for (auto& e : t.ops) e.seq += 100; });
  expect_same("thread", [](Trace& t) { for (auto& e : t.ops) e.thread = 3; });
}

// Note [Wiring key] (Trace.h): the key of what the graph and the plan read, without the ops'
// contents. Returns (wiring key, numbering with kinds).
std::pair<ContentHash, record::StorageNumbering> wiring_key(const synth::Builder& b) {
  record::StorageNumbering n;
  ContentHash wiring;
  (void)record::structure_body(b.trace, b.all(), n, {}, &wiring);
  record::classify_storages(b.trace, n);
  return {record::structure_key(wiring, n.kinds), std::move(n)};
}

TEST(WiringKey, CoversWhatTheGraphAndPlanReadAndNoScalarOrShape) {
  Shape s = chain(4);
  s.alpha = 3;
  const synth::Builder base = step(s, 0);
  const ContentHash w = wiring_key(base).first, k = key(base);
  using record::Trace;
  const std::size_t k1 = base.trace.op_tensor_begin[1];
  auto expect_change = [&](const char* what, auto&& mutate) {
    synth::Builder b = base;
    mutate(b.trace);
    EXPECT_NE(wiring_key(b).first, w) << what;
  };
  expect_change("schema", [](Trace& t) { t.ops[1].schema_hash ^= 1; });
  expect_change("phase", [](Trace& t) { t.ops[1].phase = Phase::Optimizer; });
  expect_change("op flags", [](Trace& t) { t.ops[1].flags ^= record::op_flag::kGradMode; });
  expect_change("module", [](Trace& t) { t.ops[0].module_id = 1; });
  expect_change("argument count", [](Trace& t) { t.ops[1].n_args += 1; });
  expect_change("storage bytes", [&](Trace& t) { t.tensors[k1 + 2].storage_nbytes *= 2; });
  expect_change("view", [&](Trace& t) { t.tensors[k1].flags ^= record::tensor_flag::kIsView; });
  expect_change("no storage",
                [&](Trace& t) { t.tensors[k1].flags ^= record::tensor_flag::kNoStorage; });
  expect_change("classification",
                [&](Trace& t) { t.externals[t.tensors[k1].storage_id] = ExternalKind::Buffer; });
  expect_change("version", [&](Trace& t) { t.tensors[k1].version += 1; });
  expect_change("storage", [&](Trace& t) { t.tensors[k1].storage_id = 9999; });
  // What only the Merkle DAG reads (through the ops' contents): the same wiring, another key.
  auto expect_same = [&](const char* what, auto&& mutate) {
    synth::Builder b = base;
    mutate(b.trace);
    EXPECT_EQ(wiring_key(b).first, w) << what;
    EXPECT_NE(key(b), k) << what;
  };
  const std::size_t s1 = base.trace.op_scalar_begin[1];
  expect_same("scalar value", [&](Trace& t) { t.scalars[s1].bits ^= 1; });
  expect_same("scalar kind", [&](Trace& t) { t.scalars[s1].kind = record::ScalarKind::Bool; });
  expect_same("size", [&](Trace& t) { t.dims[t.tensor_dims_begin[k1]] = 9; });
  expect_same("stride", [&](Trace& t) { t.dims[t.tensor_dims_begin[k1] + 3] = 2; });
  expect_same("dtype", [&](Trace& t) { t.tensors[k1].dtype = 7; });
}

// The property the pipeline's rewire relies on, over random programs: a renamed run of the
// same step with another scalar (and so another structure key) shares the wiring key, and its
// analysis rebuilt from the original's (graph and plan rebased, DAG rehashed where contents
// changed) equals a fresh build of it, storage ids included. Another width changes the wiring.
TEST(WiringKey, RebuildEqualsAFreshBuildOverRandomPrograms) {
  std::mt19937 rng(777);
  for (int trial = 0; trial < 200; ++trial) {
    const int n = 2 + static_cast<int>(rng() % 6);
    Shape s;
    for (int i = 0; i < n; ++i) {
      std::array<int, 2> r{};
      for (int& src : r) src = static_cast<int>(rng() % static_cast<unsigned>(i + 2)) - 2;
      s.reads.push_back(r);
      s.width.push_back(8);
    }
    s.alpha = 1;
    // The scalar changes on some ops only: clean nodes (their externals skipped in order) come
    // before and between dirty ones, and some module regions keep their hash.
    s.alpha_every = 1 + trial % 4;
    const synth::Builder original = step(s, 0);
    Shape other = s;
    other.alpha = 2 + trial;
    const synth::Builder variant = step(other, 1 + static_cast<std::uint64_t>(trial));
    auto [w, numbering] = wiring_key(variant);
    ASSERT_EQ(w, wiring_key(original).first) << "trial " << trial;
    ASSERT_NE(key(variant), key(original)) << "trial " << trial;
    const auto last = build_iteration(original.trace, original.all());
    const auto rebuilt = rebuild_iteration(*last, variant.trace, variant.all(), {}, numbering);
    ASSERT_NE(rebuilt, nullptr) << "trial " << trial;
    const auto fresh = build_iteration(variant.trace, variant.all());
    ASSERT_EQ(rebuilt->dag().root(), fresh->dag().root()) << "trial " << trial;
    for (std::size_t node = 0; node < fresh->graph().num_nodes(); ++node)
      ASSERT_EQ(rebuilt->dag().node_hash(node), fresh->dag().node_hash(node))
          << "trial " << trial << " node " << node;
    ASSERT_EQ(rebuilt->dag().regions().size(), fresh->dag().regions().size());
    for (std::size_t i = 0; i < fresh->dag().regions().size(); ++i) {
      ASSERT_EQ(rebuilt->dag().regions()[i].hash, fresh->dag().regions()[i].hash)
          << "trial " << trial;
      ASSERT_EQ(rebuilt->dag().regions()[i].label, fresh->dag().regions()[i].label)
          << "trial " << trial;
    }
    ASSERT_EQ(rebuilt->graph().externals().size(), fresh->graph().externals().size());
    for (std::size_t i = 0; i < fresh->graph().externals().size(); ++i) {
      ASSERT_EQ(rebuilt->graph().externals()[i].storage_id,
                fresh->graph().externals()[i].storage_id);
      ASSERT_EQ(rebuilt->graph().externals()[i].version, fresh->graph().externals()[i].version);
    }
    ASSERT_EQ(rebuilt->graph().num_edges(), fresh->graph().num_edges());
    ASSERT_TRUE(testing_util::same_placement(*rebuilt->plan(), *fresh->plan())) << "trial " << trial;
    ASSERT_EQ(rebuilt->plan()->arena_bytes, fresh->plan()->arena_bytes);
    Shape wider = s;
    wider.width[0] = 16;
    ASSERT_NE(wiring_key(step(wider, 0)).first, w) << "another storage size is another wiring";
  }
  // A module scope whose path was interned only after the last build ("enc", the parent of
  // "enc.l1", entered since): the rewired region carries the path's id, as a fresh build does.
  {
    auto two_ops = [](std::int64_t alpha) {
      synth::Builder b;
      b.op("aten::relu", {T{1, 0, {8}}}, {T{2, 0, {8}}}, Phase::Forward, "enc.l1", {alpha});
      b.op("aten::neg", {T{2, 0, {8}}}, {T{3, 0, {8}}}, Phase::Forward, "enc.l1", {alpha});
      return b;
    };
    const synth::Builder before = two_ops(1);
    synth::Builder after = two_ops(2);
    const std::uint32_t enc = after.module("enc");
    const auto last = build_iteration(before.trace, before.all());
    const auto rebuilt =
        rebuild_iteration(*last, after.trace, after.all(), {}, wiring_key(after).second);
    ASSERT_NE(rebuilt, nullptr);
    const auto fresh = build_iteration(after.trace, after.all());
    bool seen = false;
    for (std::size_t i = 0; i < fresh->dag().regions().size(); ++i) {
      EXPECT_EQ(rebuilt->dag().regions()[i].label, fresh->dag().regions()[i].label)
          << fresh->dag().regions()[i].module_path();
      seen = seen || (fresh->dag().regions()[i].module_path() == "enc" &&
                      fresh->dag().regions()[i].label == enc);
    }
    EXPECT_TRUE(seen);
  }
  // A numbering of other ops is refused, not trusted: rebuild says so and the caller builds.
  const synth::Builder a = step(chain(4), 0), b = step(chain(5), 0);
  const auto last = build_iteration(a.trace, a.all());
  EXPECT_EQ(rebuild_iteration(*last, b.trace, b.all(), {}, wiring_key(b).second), nullptr);
}

// Note [Elementwise outputs in their input's block]: shares depend on layouts, which the wiring
// key leaves out. A rewire keeps the last plan (rebased) only when the new ops make exactly its
// shares, and otherwise plans again; either way the plan equals a fresh build's, shares and
// offsets alike. Here relu's output is laid out as its input (a share), or as float64 [2, 4]
// of the same bytes (no share): the same wiring both ways.
TEST(WiringKey, ARewireKeepsSharesOnlyWhereTheNewLayoutsMakeThem) {
  auto program = [](bool same_layout, std::int64_t alpha) {
    synth::Builder b;
    b.op("aten::randn", {}, {T{2, 0, {4, 4}}});
    T out = same_layout ? T{3, 0, {4, 4}} : T{3, 0, {2, 4}, 7};
    b.op("aten::relu", {T{2, 0, {4, 4}}}, {out}, Phase::Forward, "", {alpha});
    b.op("aten::randn", {}, {T{4, 0, {4, 4}}});
    b.op("aten::sum", {out, T{4, 0, {4, 4}}}, {T{5, 0, {}}});
    return b;
  };
  for (const bool before : {true, false})
    for (const bool after : {true, false}) {
      const synth::Builder a = program(before, 1), c = program(after, 2);
      auto [w, numbering] = wiring_key(c);
      ASSERT_EQ(w, wiring_key(a).first) << "dtypes and sizes are not in the wiring";
      const auto last = build_iteration(a.trace, a.all());
      ASSERT_EQ(last->plan()->shared_blocks, before ? 1u : 0u);
      const auto rebuilt = rebuild_iteration(*last, c.trace, c.all(), {}, numbering);
      ASSERT_NE(rebuilt, nullptr);
      const auto fresh = build_iteration(c.trace, c.all());
      ASSERT_EQ(fresh->plan()->shared_blocks, after ? 1u : 0u);
      EXPECT_EQ(rebuilt->plan()->shared_blocks, fresh->plan()->shared_blocks) << before << after;
      EXPECT_EQ(rebuilt->plan()->arena_bytes, fresh->plan()->arena_bytes) << before << after;
      EXPECT_TRUE(testing_util::same_placement(*rebuilt->plan(), *fresh->plan())) << before << after;
      EXPECT_TRUE(check_plan(*rebuilt->plan()).ok());
      EXPECT_EQ(shares_hold(*last->plan(), c.trace, fresh->graph()), before == after);
      EXPECT_EQ(rebuilt->analysis->plan_rebased, before == after) << "rebased exactly when the shares hold";
    }
}

// A loaded trace's thread fields are whatever the file says: the thread that recorded the
// most ops is found without indexing by thread (0xFFFFFFFF once wrapped a vector to size 0).
TEST(Analysis, AnyThreadFieldIsCountedNotIndexed) {
  synth::Builder b;
  for (std::uint64_t step = 0; step < 4; ++step) {
    b.op("aten::relu", {T{1, 0, {8}}}, {T{10 + 2 * step, 0, {8}}});
    b.op("aten::neg", {T{10 + 2 * step, 0, {8}}}, {T{11 + 2 * step, 0, {8}}});
  }
  for (auto& e : b.trace.ops) e.thread = 0xFFFFFFFFu;
  b.trace.ops[0].thread = 0x40000000u;  // one op elsewhere: a vector of 2^30 counters before
  auto r = analyze_latest_iteration(b.trace, -1);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ((*r)->thread, 0xFFFFFFFFu);
  EXPECT_EQ((*r)->ops().size(), 2u);
}

// An op recorded right after dropped ones (drop mode, a full ring) marks the iteration that
// holds it incomplete; a drop in an earlier step does not mark the last one.
TEST(Analysis, OpsAfterADropMarkTheirIterationIncomplete) {
  for (const std::size_t flagged : {std::size_t{7}, std::size_t{2}}) {  // in the last step; in the second
    synth::Builder b;
    for (std::uint64_t step = 0; step < 4; ++step) {
      b.op("aten::relu", {T{1, 0, {8}}}, {T{10 + 2 * step, 0, {8}}});
      b.op("aten::neg", {T{10 + 2 * step, 0, {8}}}, {T{11 + 2 * step, 0, {8}}});
    }
    b.trace.ops[flagged].flags |= record::op_flag::kAfterDrop;
    auto r = analyze_latest_iteration(b.trace, -1);
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_EQ((*r)->ops(), (std::vector<std::size_t>{6, 7}));
    const bool in_last = flagged >= 6;
    EXPECT_EQ((*r)->analysis->ops_after_drop, in_last ? 1u : 0u) << "flagged op " << flagged;
    EXPECT_EQ((*r)->incomplete(), in_last) << "flagged op " << flagged;
    // Rewired from a complete analysis, the flag still counts: it is the new ops'.
    synth::Builder c = b;
    c.trace.ops[flagged].flags &= static_cast<std::uint8_t>(~record::op_flag::kAfterDrop);
    auto last = build_iteration(c.trace, {6, 7});
    c.trace.ops[7].flags |= record::op_flag::kAfterDrop;
    const std::vector<std::size_t> ops{6, 7};
    auto re = rebuild_iteration(*last, c.trace, ops, {}, record::number_storages(c.trace, ops));
    ASSERT_NE(re, nullptr) << "rebuild_iteration takes the flagged ops (the pipeline would not: the flag is in the wiring key)";
    EXPECT_FALSE(last->incomplete());
    EXPECT_TRUE(re->incomplete());
  }
}

// The property the pipeline relies on, over random programs: a renamed step (ids permuted,
// versions moved) always shares its original's key and its analysis, block offsets included;
// and programs that share a key have equal analyses.
TEST(StructureKey, EqualKeysMeanEqualAnalysesOverRandomPrograms) {
  std::mt19937 rng(12345);
  std::vector<std::pair<ContentHash, Observed>> seen;
  int shared = 0;
  for (int trial = 0; trial < 300; ++trial) {
    const int n = 2 + static_cast<int>(rng() % 5);
    Shape s;
    for (int i = 0; i < n; ++i) {
      std::array<int, 2> r{};
      for (int& src : r) src = static_cast<int>(rng() % static_cast<unsigned>(i + 2)) - 2;  // -2..i-1
      s.reads.push_back(r);
      s.width.push_back(8);  // one shape everywhere: wiring alone tells programs apart
    }
    s.alpha = static_cast<std::int64_t>(rng() % 2);
    const ContentHash k = key(step(s, 0));
    const Observed o = analyse(step(s, 0));
    const synth::Builder renamed = step(s, 1 + static_cast<std::uint64_t>(trial));
    ASSERT_EQ(key(renamed), k) << "a renamed run got another key, trial " << trial;
    ASSERT_EQ(analyse(renamed), o) << "a renamed run got another analysis, trial " << trial;
    for (const auto& [k2, o2] : seen) {
      if (k2 != k) continue;
      ++shared;
      ASSERT_EQ(o2, o) << "two programs share a key but not their analysis, trial " << trial;
    }
    seen.emplace_back(k, o);
  }
  EXPECT_GT(shared, 0) << "small random programs repeat: the check above must have run";
}

// Note [Wiring log]: the log's pass gives what the trace's pass gives, for every run of
// consecutive ops it accepts, and it accepts every run within its window. Storages are drawn
// from a small pool (uses near and far apart, across window boundaries), some tensors have
// no storage, versions move, new storages take growing ids (past the tables' size, so slots
// collide), and the window is small, so the generations turn over often.
TEST(WiringLog, KeyEqualsTheTracesOverRandomRuns) {
  std::mt19937 rng(777);
  // Small ids, and ids as a C host that passes buffer addresses would (4 KiB apart, large).
  for (const std::uint64_t scale : {std::uint64_t{1}, std::uint64_t{4096}})
    for (const std::size_t window : {std::size_t{4}, std::size_t{9}, std::size_t{64}}) {
      synth::Builder b;
      record::WiringLog log(window);
      std::vector<std::uint32_t> version(40, 0);
      // The storage each of 40 places holds; a place now and then gets a new storage, with the
      // next id (as the Vessel numbers them: growing), and the old one is never seen again.
      std::vector<std::uint64_t> pool(40);
      for (std::size_t i = 0; i < pool.size(); ++i) pool[i] = i + 1;
      std::uint64_t next_id = pool.size() + 1;
      for (int op = 0; op < 400; ++op) {
        std::vector<T> ins, outs;
        std::uint64_t n = 0;  // the pool index of the last pick (0: no storage)
        auto pick = [&]() -> T {
          // Mostly a few recent storages, sometimes any of 40, sometimes none.
          n = rng() % 8 == 0 ? 0 : (rng() % 3 == 0 ? rng() % 40 : rng() % 5) + 1;
          if (n != 0 && rng() % 6 == 0) {
            pool[n - 1] = next_id++;
            version[n - 1] = 0;
          }
          const std::uint64_t id = n == 0 ? 0 : pool[n - 1];
          const std::uint64_t sid = n == 0 ? 0 : (scale == 1 ? id : 0x7f0000000000ull + id * scale);
          T x{sid, n == 0 ? 0 : version[n - 1], {2, static_cast<std::int64_t>(1 + rng() % 3)}};
          x.view = rng() % 5 == 0;
          return x;
        };
        for (unsigned k = rng() % 3; k-- > 0;) ins.push_back(pick());
        for (unsigned k = rng() % 3; k-- > 0;) {
          T x = pick();
          if (n != 0 && rng() % 2) x.version = ++version[n - 1];  // written in place
          outs.push_back(x);
        }
        const std::size_t i =
            b.op(op % 3 ? "aten::mul" : "aten::add_", ins, outs,
                 op % 7 ? Phase::Forward : Phase::Backward, op % 2 ? "m" : "", {op % 4});
        log.append(b.trace, i);
      }
      ASSERT_EQ(log.num_ops(), b.trace.num_ops());
      int accepted = 0, refused = 0;
      for (int trial = 0; trial < 600; ++trial) {
        const std::size_t first = rng() % b.trace.num_ops();
        const std::size_t n = 1 + rng() % std::min<std::size_t>(b.trace.num_ops() - first, window);
        std::vector<std::size_t> ops(n);
        for (std::size_t k = 0; k < n; ++k) ops[k] = first + k;
        std::vector<ContentHash> contents;
        if (trial % 2)
          for (const std::size_t op : ops) contents.push_back(record::op_content(b.trace, op));
        record::StorageNumbering want, got;
        ContentHash want_wiring, got_wiring, got_body;
        const ContentHash want_body =
            record::structure_body(b.trace, ops, want, contents, &want_wiring);
        std::size_t n_tensors = 0;
        for (const std::size_t op : ops) n_tensors += b.trace.ops[op].n_tensors;
        if (!log.structure_body(b.trace, first, n, got, contents, got_body, &got_wiring)) {
          ASSERT_GT(n_tensors, window) << "a run within the window was refused";
          ++refused;
          continue;
        }
        ++accepted;
        ASSERT_EQ(got_body, want_body) << "window " << window << " ops " << first << "+" << n;
        ASSERT_EQ(got_wiring, want_wiring);
        ASSERT_EQ(got.storages, want.storages);
        ASSERT_EQ(got.storage, want.storage);
        ASSERT_EQ(got.version, want.version);
      }
      EXPECT_GT(accepted, 100);
      EXPECT_GT(refused, 10);
      // Past the end, or empty: refused.
      record::StorageNumbering n;
      ContentHash body;
      EXPECT_FALSE(log.structure_body(b.trace, b.trace.num_ops(), 1, n, {}, body, nullptr));
      EXPECT_FALSE(log.structure_body(b.trace, 0, 0, n, {}, body, nullptr));
      log.clear();
      EXPECT_EQ(log.num_ops(), 0u);
      EXPECT_FALSE(log.structure_body(b.trace, 0, 1, n, {}, body, nullptr));
    }
}

// Note [Seeded table hash]: storage ids chosen so that the fixed hashes used before put them
// all in one slot: j * inverse(0x9E3779B97F4A7C15) for the trace's key pass (that hash gives
// j, whose top bits are 0), and the same shifted left by 6 for the wiring log (which hashed
// id >> 6; only j whose product has its top 6 bits clear survive the shift). Each op reads one
// kind and writes the other. Both passes must still agree, and finish (they were quadratic).
TEST(StructureKey, CraftedStorageIdsDoNotPileIntoOneSlot) {
  const std::uint64_t golden = 0x9E3779B97F4A7C15ull;
  std::uint64_t inv = golden;  // Newton's iteration for the inverse mod 2^64
  for (int i = 0; i < 6; ++i) inv *= 2 - golden * inv;
  ASSERT_EQ(golden * inv, 1u);
  synth::Builder b;
  record::WiringLog log;
  constexpr std::uint64_t n = 30000;
  std::uint64_t j = 0;
  for (std::uint64_t i = 1; i <= n; ++i) {
    do ++j;
    while ((j * inv) >> 58 != 0);
    const std::size_t op = b.op("aten::relu", {T{i * inv, 0, {1}}}, {T{(j * inv) << 6, 0, {1}}});
    log.append(b.trace, op);
  }
  std::vector<std::size_t> ops(n);
  for (std::size_t i = 0; i < n; ++i) ops[i] = i;
  record::StorageNumbering want, got;
  ContentHash log_body;
  ASSERT_TRUE(log.structure_body(b.trace, 0, n, got, {}, log_body,
                                 nullptr));  // 60000 tensors: in the window
  EXPECT_EQ(log_body, record::structure_body(b.trace, ops, want));
  EXPECT_EQ(got.storage, want.storage);
  EXPECT_EQ(got.storages, want.storages);
  EXPECT_GT(want.num_storages(), n);
}

}  // namespace
