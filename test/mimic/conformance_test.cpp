// conformance_test — the conformance table (conformance_rows.h) run on every backend (null, cpu)
// against the reference evaluated in plain loops. Inputs carry NaN,
// ±Inf, ±0, subnormals and huge values. Each row runs with its recorded scalars, then with every
// scalar and Python number patched. Results must match bit for bit (any NaN matches any NaN).
#include <gtest/gtest.h>

#include <memory>
#include <random>

#include "conformance_rows.h"
#include "crucible/exec/NullBackend.h"
#include "crucible/exec/Runner.h"
#include "crucible/exec/VerifyPlan.h"
#include "crucible/mimic/CpuBackend.h"

namespace crucible::mimic {
namespace {

using namespace test;

// Backends: "null"; the CPU backend with ATen's alpha rounded once ("cpu", as ATen's AVX2 and
// AVX-512 kernels) and twice ("cpu_twice", as its default kernels), the loop provider and the
// reference rounding as the backend does (Note [ATen's alpha rounding]).
class Conformance : public ::testing::TestWithParam<std::string> {
 protected:
  AlphaRounding rounding() const {
    return GetParam() == "cpu_twice" ? AlphaRounding::Twice : AlphaRounding::Once;
  }
  // The backend for one Runner; `cpu` is set when it is the CPU backend.
  exec::Backend make_backend(std::unique_ptr<CpuBackend>* cpu) {
    if (GetParam() == "null") return exec::null_backend();
    CpuBackendOptions o = CpuBackendOptions::memory_only();
    o.alpha_rounding = rounding();
    auto b = CpuBackend::make(o);
    EXPECT_TRUE(b.ok()) << b.status();
    *cpu = std::move(*b);
    return (*cpu)->backend();
  }

  void run_row(const ChainSpec& c, std::uint64_t seed) {
    SCOPED_TRACE(c.name);
    const BuiltPlan bp = build_chain_plan(c);
    ASSERT_TRUE(exec::verify_plan(bp.plan).ok()) << exec::verify_plan(bp.plan) << "\n"
                                                 << exec::describe(bp.plan);
    const Dtypes dts = binding_dtypes(c, bp);
    std::unique_ptr<CpuBackend> cpu;
    LoopProvider provider;
    provider.rounding = rounding();
    auto runner = exec::Runner::make(bp.plan, make_backend(&cpu), provider.provider());
    ASSERT_TRUE(runner.ok()) << runner.status();
    if (cpu) {
      EXPECT_EQ(cpu->generated_kernels(), coverable_kernels(bp.plan));
      EXPECT_EQ(generated_call_count(*cpu), covered_calls(bp.plan));
      for (const CpuKernelState& k : cpu->kernels())
        if (k.generated)
          EXPECT_EQ(k.recipe->determinism, forge::Determinism::BitexactStrict);
        else
          EXPECT_FALSE(k.why.empty());
    }
    std::mt19937_64 rng(seed);
    for (int patch = 0; patch < 2; ++patch) {
      SCOPED_TRACE(patch ? "patched" : "recorded");
      const RunBuffers initial = initial_buffers(bp, dts, rng);
      const Patches p = patches_for(c, bp, patch != 0);
      RunBuffers expect = initial, got = initial;
      reference_run(c, bp, expect, p.scalars, p.numbers, rounding());
      const Status st = run(**runner, got, p);
      ASSERT_TRUE(st.ok()) << st;
      for (std::size_t i = 0; i < got.inputs.size(); ++i)
        EXPECT_EQ(first_difference(expect.inputs[i], got.inputs[i], dts.inputs[i]), -1)
            << "input binding " << i;
      for (std::size_t i = 0; i < got.outputs.size(); ++i)
        EXPECT_EQ(first_difference(expect.outputs[i], got.outputs[i], dts.outputs[i]), -1)
            << "output binding " << i;
    }
  }
};

// Note [Kernel runs]: AdamW's step.item() between a parameter's moments and its update runs
// before the stretch it sits in. Bit-exact, sqrt splits the kernel into two generated runs
// anyway; with numerics="fast" the whole update is one run, and it gives the bits of the same
// calls generated one kernel each (the same code per op, intermediates through memory).
TEST(KernelRuns, AHostReadRunsBeforeTheStretchItSitsIn) {
  ChainSpec whole = adamw_with_step_item(1000), split = whole;
  split.split = true;
  const BuiltPlan bw = build_chain_plan(whole), bs = build_chain_plan(split);
  ASSERT_TRUE(exec::verify_plan(bw.plan).ok()) << exec::verify_plan(bw.plan);
  const Dtypes dts = binding_dtypes(whole, bw);
  std::mt19937_64 rng(7);
  const RunBuffers initial = initial_buffers(bw, dts, rng);
  RunBuffers got_whole = initial, got_split = initial;
  for (bool fast : {false, true}) {
    SCOPED_TRACE(fast ? "fast" : "bitwise");
    CpuBackendOptions o = CpuBackendOptions::memory_only();
    o.fast = fast;
    o.alpha_rounding = AlphaRounding::Once;
    auto cw = CpuBackend::make(o), cs = CpuBackend::make(o);
    ASSERT_TRUE(cw.ok() && cs.ok());
    LoopProvider lw, ls;
    auto rw = exec::Runner::make(bw.plan, (*cw)->backend(), lw.provider());
    auto rs = exec::Runner::make(bs.plan, (*cs)->backend(), ls.provider());
    ASSERT_TRUE(rw.ok() && rs.ok());
    const CpuKernelState& k = (*cw)->kernels()[0];
    EXPECT_EQ(k.generated_runs, fast ? 1u : 2u);
    EXPECT_EQ(k.generated_calls, fast ? 8u : 7u);
    EXPECT_FALSE(k.generated) << "the host read is a library call";
    if (!fast) continue;
    const Patches p = patches_for(whole, bw, false);
    ASSERT_TRUE(run(**rw, got_whole, p).ok());
    ASSERT_TRUE(run(**rs, got_split, p).ok());
    EXPECT_EQ(lw.calls, 1) << "the host read ran once";
    for (std::size_t i = 0; i < initial.inputs.size(); ++i)
      EXPECT_EQ(first_difference(got_split.inputs[i], got_whole.inputs[i], dts.inputs[i]), -1) << "input " << i;
    for (std::size_t i = 0; i < initial.outputs.size(); ++i)
      EXPECT_EQ(first_difference(got_split.outputs[i], got_whole.outputs[i], dts.outputs[i]), -1) << "output " << i;
  }
}

// Note [Launch tables]: the same plan run by a CPU backend with launch tables and by one
// without (each run alone, in call order) from the same buffers; the buffers each leaves.
struct TableRuns {
  RunBuffers tables, alone;
  CpuKernelState state;          // the kernel's, with tables
  std::uint64_t call_order = 0;  // launches with tables that ran in call order
};
TableRuns run_with_and_without_tables(const ChainSpec& spec, const BuiltPlan& bp, bool fast,
                                      const RunBuffers& initial, int alias_input = -1) {
  TableRuns r;
  for (bool tables : {true, false}) {
    CpuBackendOptions o = CpuBackendOptions::memory_only();
    o.fast = fast;
    o.alpha_rounding = AlphaRounding::Once;
    o.threads = 3;
    o.launch_tables = tables;
    auto cpu = CpuBackend::make(o);
    EXPECT_TRUE(cpu.ok());
    LoopProvider lp;
    lp.rounding = AlphaRounding::Once;
    auto runner = exec::Runner::make(bp.plan, (*cpu)->backend(), lp.provider());
    EXPECT_TRUE(runner.ok()) << runner.status();
    if (!runner.ok()) return r;
    RunBuffers& b = tables ? r.tables : r.alone;
    b = initial;
    std::vector<void*> ins, outs;
    for (auto& x : b.inputs) ins.push_back(x.data());
    for (auto& x : b.outputs) outs.push_back(x.data());
    if (alias_input >= 0) ins[alias_input + 5] = ins[alias_input];  // the next parameter's copy
    const Patches p = patches_for(spec, bp, false);
    const Status st = (*runner)->run(exec::RunArgs{ins, outs, p.bits});
    EXPECT_TRUE(st.ok()) << st;
    if (tables) {
      r.state = (*cpu)->kernels()[0];
      r.call_order = (*cpu)->call_order_launches();
    }
  }
  return r;
}

void expect_same(const RunBuffers& a, const RunBuffers& b, const Dtypes& dts, const char* what) {
  for (std::size_t i = 0; i < a.inputs.size(); ++i)
    EXPECT_EQ(first_difference(a.inputs[i], b.inputs[i], dts.inputs[i]), -1)
        << what << ", input " << i;
  for (std::size_t i = 0; i < a.outputs.size(); ++i)
    EXPECT_EQ(first_difference(a.outputs[i], b.outputs[i], dts.outputs[i]), -1)
        << what << ", output " << i;
}

// `got` against the reference run from `initial` (its recorded scalars, ATen's alpha rounded once).
void expect_reference(const ChainSpec& spec, const BuiltPlan& bp, const RunBuffers& initial,
                      const RunBuffers& got, const Dtypes& dts) {
  RunBuffers expect = initial;
  const Patches p = patches_for(spec, bp, false);
  reference_run(spec, bp, expect, p.scalars, p.numbers, AlphaRounding::Once);
  expect_same(got, expect, dts, "against the reference");
}

// An optimizer group's runs of one program launch as tables of at most 2^18 elements, split over
// threads when large (5 x 30000 values: parts end inside rows), and leave the bits of each run
// launched alone in call order — bit-exact, the reference's. AdamW makes two tables: the steps'
// increments and the moments (bit-exact: each update waits for its sqrt, a library call, and
// runs alone) or the moments and update in one run (fast).
TEST(LaunchTables, RunsOfOneProgramLaunchTogether) {
  struct Case {
    int k;
    std::int64_t n;
    bool fast;
    std::uint32_t tables, rows;
  };
  for (const Case& c :
       {Case{5, 30000, false, 2, 10}, Case{5, 30000, true, 2, 10}, Case{6, 100000, false, 4, 12},
        Case{6, 100000, true, 4, 12}, Case{3, 7, false, 2, 6}}) {
    const ChainSpec spec = adamw_params(c.k, c.n, false);
    SCOPED_TRACE(spec.name + (c.fast ? " fast" : " bitwise"));
    const BuiltPlan bp = build_chain_plan(spec);
    ASSERT_TRUE(exec::verify_plan(bp.plan).ok()) << exec::verify_plan(bp.plan);
    const Dtypes dts = binding_dtypes(spec, bp);
    std::mt19937_64 rng(11);
    const RunBuffers initial = initial_buffers(bp, dts, rng);
    const TableRuns r = run_with_and_without_tables(spec, bp, c.fast, initial);
    EXPECT_EQ(r.state.table_launches, c.tables);
    EXPECT_EQ(r.state.table_runs, c.rows);
    EXPECT_EQ(r.call_order, 0u);
    expect_same(r.tables, r.alone, dts, "tables against call order");
    if (!c.fast) expect_reference(spec, bp, initial, r.tables, dts);
  }
}

// A run waits for the library call whose result it reads: every odd parameter's gradient is the
// previous parameter's sqrt, so its moments cannot join the even parameters' table: the tables
// are [increments 0-5] and [moments 0, 2, 4]; every other run launches alone in call order.
TEST(LaunchTables, ARunWaitsForTheCallsItDependsOn) {
  const ChainSpec spec = adamw_params(6, 1000, true);
  const BuiltPlan bp = build_chain_plan(spec);
  ASSERT_TRUE(exec::verify_plan(bp.plan).ok()) << exec::verify_plan(bp.plan);
  const Dtypes dts = binding_dtypes(spec, bp);
  std::mt19937_64 rng(12);
  const RunBuffers initial = initial_buffers(bp, dts, rng);
  const TableRuns r = run_with_and_without_tables(spec, bp, false, initial);
  EXPECT_EQ(r.state.table_launches, 2u);
  EXPECT_EQ(r.state.table_runs, 9u);
  expect_same(r.tables, r.alone, dts, "tables against call order");
  expect_reference(spec, bp, initial, r.tables, dts);
}

// A run that stores an Arena value a later library call reads keeps its place: launched early in
// a table, its value would live longer than the arena placement (made for call order) allows.
// Per parameter: t = x*x (stored: sqrt reads it), u = sqrt(t), param += u, then a host read of
// param (it splits the next parameter's x*x from this one's update; the last one's update is the
// plan's result).
TEST(LaunchTables, ARunThatStoresAnArenaValueKeepsItsPlace) {
  constexpr std::int64_t n = 300;
  ChainSpec spec{"stored_values", {n}, {}, {}};
  for (int p = 0; p < 4; ++p) {
    const int in0 = static_cast<int>(spec.inputs.size()), s0 = static_cast<int>(spec.steps.size());
    spec.inputs.push_back(f32({n}));  // x
    spec.inputs.push_back(f32({n}));  // param
    spec.steps.push_back(step("aten::mul.Tensor", {in0, in0}));
    spec.steps.push_back(step("aten::sqrt", {prev(s0)}));
    spec.steps.push_back(step("aten::add_.Tensor", {in0 + 1, prev(s0 + 1)}, {scalar_int(2, 1)}));
    if (p < 3) spec.steps.push_back(step("aten::_local_scalar_dense", {in0 + 1}));
  }
  const BuiltPlan bp = build_chain_plan(spec);
  ASSERT_TRUE(exec::verify_plan(bp.plan).ok()) << exec::verify_plan(bp.plan);
  const Dtypes dts = binding_dtypes(spec, bp);
  std::mt19937_64 rng(14);
  const RunBuffers initial = initial_buffers(bp, dts, rng);
  const TableRuns r = run_with_and_without_tables(spec, bp, false, initial);
  EXPECT_EQ(r.state.table_launches, 0u);
  expect_reference(spec, bp, initial, r.tables, dts);
}

// Two parameters bound to one buffer (a caller passing one tensor twice): the tables' order
// would not be call order's, so that launch runs in call order, with its bits.
TEST(LaunchTables, OverlappingBoundMemoryRunsInCallOrder) {
  const ChainSpec spec = adamw_params(4, 1000, false);
  const BuiltPlan bp = build_chain_plan(spec);
  const Dtypes dts = binding_dtypes(spec, bp);
  std::mt19937_64 rng(13);
  const RunBuffers initial = initial_buffers(bp, dts, rng);
  const TableRuns r = run_with_and_without_tables(spec, bp, false, initial, /*alias_input=*/0);
  EXPECT_EQ(r.state.table_launches, 2u);
  EXPECT_EQ(r.call_order, 1u);
  expect_same(r.tables, r.alone, dts, "one buffer twice, against call order");
}

// Note [Memory use]: a fused chain's intermediates live in registers, so the Runner places
// them no arena memory; the results stay the ones the whole-memory plan gives (the conformance
// rows run through the same placement).
TEST(CpuBackendMemory, FusedIntermediatesTakeNoArenaMemory) {
  const ChainSpec spec = adamw_with_step_item(1000);
  const BuiltPlan bp = build_chain_plan(spec);
  CpuBackendOptions o = CpuBackendOptions::memory_only();
  o.fast = true;
  auto cpu = CpuBackend::make(o);
  ASSERT_TRUE(cpu.ok());
  LoopProvider lp;
  auto r = exec::Runner::make(bp.plan, (*cpu)->backend(), lp.provider());
  ASSERT_TRUE(r.ok()) << r.status();
  std::uint32_t unplaced = 0, arena = 0;
  for (std::uint32_t s = 0; s < bp.plan.slots.size(); ++s) {
    if (bp.plan.slots[s].kind != exec::SlotKind::Arena) continue;
    ++arena;
    unplaced += (*r)->slot_offset(s).has_value() ? 0 : 1;
  }
  EXPECT_GT(unplaced, 0u) << exec::describe(bp.plan);
  EXPECT_LT((*r)->arena_bytes(), bp.plan.arena_bytes);
  // The null backend touches every slot: all placed, the plan's arena.
  auto null_runner = exec::Runner::make(bp.plan, exec::null_backend(), lp.provider());
  ASSERT_TRUE(null_runner.ok());
  EXPECT_EQ((*null_runner)->arena_bytes(), bp.plan.arena_bytes);
  for (std::uint32_t s = 0; s < bp.plan.slots.size(); ++s)
    if (bp.plan.slots[s].kind == exec::SlotKind::Arena) {
      EXPECT_TRUE((*null_runner)->slot_offset(s).has_value());
    }
  EXPECT_GT(arena, 0u);
}

TEST_P(Conformance, FixedRows) {
  std::uint64_t seed = 1;
  for (const ChainSpec& c : fixed_rows()) run_row(c, seed++);
}

TEST_P(Conformance, EveryCoveredOp) {
  const std::vector<ChainSpec> rows = one_op_rows();
  EXPECT_EQ(rows.size(), covered_pointwise_ops().size());
  std::uint64_t seed = 50;
  for (const ChainSpec& c : rows) run_row(c, seed++);
}

TEST_P(Conformance, RandomChains) {
  std::uint64_t seed = 100;
  for (const ChainSpec& c : random_rows(60, 0x5eed)) run_row(c, seed++);
}

// Where ATen rounds a + alpha*b once, any alpha runs as generated code on contiguous operands
// with no broadcast input to the add; with a broadcast input (a [17] row against [3, 17]), whose
// rounding ATen varies by element, an alpha other than 1 or -1 runs the kernel's calls as
// library calls, and the backend counts it.
TEST(CpuBackendAlpha, AnyAlphaWithoutBroadcastElseLibraryCalls) {
  for (const bool broadcast : {false, true}) {
    SCOPED_TRACE(broadcast ? "broadcast" : "same sizes");
    ChainSpec c{"alpha",
                {3, 17},
                {f32({3, 17}), f32({3, 17})},
                {step("aten::add.Tensor", {0, 1}, {scalar_double(2, 1.0)}),
                 step("aten::relu", {prev(0)})}};
    if (broadcast) c.inputs[1] = f32({17});
    const BuiltPlan bp = build_chain_plan(c);
    CpuBackendOptions o = CpuBackendOptions::memory_only();
    o.alpha_rounding = AlphaRounding::Once;
    auto cpu = CpuBackend::make(o);
    ASSERT_TRUE(cpu.ok()) << cpu.status();
    LoopProvider provider;
    provider.rounding = AlphaRounding::Once;
    auto runner = exec::Runner::make(bp.plan, (*cpu)->backend(), provider.provider());
    ASSERT_TRUE(runner.ok()) << runner.status();
    ASSERT_EQ((*cpu)->generated_kernels(), 1u);
    std::mt19937_64 rng(3);
    std::uint64_t launches = 0;
    for (double alpha : {1.0, -1.0, 0.3, 2.0, 1.0}) {
      SCOPED_TRACE(alpha);
      RunBuffers b;
      for (std::uint64_t bytes : bp.input_bytes) {
        b.inputs.emplace_back(bytes, 0);
        fill_random(b.inputs.back(), kF32, rng);
      }
      for (std::uint64_t bytes : bp.output_bytes) b.outputs.emplace_back(bytes, 0);
      RunBuffers expect = b;
      std::vector<record::ScalarRecord> scalars = bp.plan.scalars;
      scalars[0] = scalar_double(2, alpha);
      reference_run(c, bp, expect, scalars, {}, AlphaRounding::Once);
      std::vector<void*> ins, outs;
      for (auto& x : b.inputs) ins.push_back(x.data());
      for (auto& x : b.outputs) outs.push_back(x.data());
      const int calls_before = provider.calls;
      const std::vector<std::uint64_t> patches{std::bit_cast<std::uint64_t>(alpha)};
      ASSERT_TRUE((*runner)->run(exec::RunArgs{ins, outs, patches}).ok());
      const bool library = broadcast && alpha != 1.0 && alpha != -1.0;
      launches += library ? 1 : 0;
      EXPECT_EQ((*cpu)->library_launches(), launches);
      EXPECT_EQ(provider.calls - calls_before, library ? 2 : 0);
      for (std::size_t i = 0; i < b.outputs.size(); ++i)
        EXPECT_EQ(first_difference(expect.outputs[i], b.outputs[i], kF32), -1);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, Conformance, ::testing::Values("null", "cpu", "cpu_twice"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace crucible::mimic

namespace crucible::mimic {
namespace {

using namespace test;

// Plan `bp` on a CpuBackend made with `o`, every coverable kernel generated; null (the test
// failed) when the backend or the runner cannot be made.
struct CpuRun {
  std::unique_ptr<CpuBackend> cpu;
  LoopProvider provider;
  std::unique_ptr<exec::Runner> runner;
};
std::unique_ptr<CpuRun> cpu_run(const BuiltPlan& bp, const CpuBackendOptions& o) {
  auto r = std::make_unique<CpuRun>();
  auto cpu = CpuBackend::make(o);
  EXPECT_TRUE(cpu.ok()) << cpu.status();
  if (!cpu.ok()) return nullptr;
  r->cpu = std::move(*cpu);
  auto runner = exec::Runner::make(bp.plan, r->cpu->backend(), r->provider.provider());
  EXPECT_TRUE(runner.ok()) << runner.status();
  if (!runner.ok()) return nullptr;
  r->runner = std::move(*runner);
  EXPECT_EQ(r->cpu->generated_kernels(), coverable_kernels(bp.plan));
  return r;
}

// Note [Split loops]: a long contiguous chain runs in parts on the worker pool; each part's
// elements come out as in one loop. The chain has a Python number (a broadcast operand every
// part reads whole) and an odd length (the last part ends inside a 64-element block).
TEST(CpuBackendThreads, ALoopSplitOverThreadsGivesTheBitsOfOneLoop) {
  const std::int64_t n = 1000003;
  ChainSpec c{"split",
              {n},
              {f32({n}), f32({n}), number(0.7)},
              {step("aten::mul.Tensor", {0, 1}),
               step("aten::add.Tensor", {prev(0), 2}, {scalar_double(2, 1.0)}),
               step("aten::relu", {prev(1)}), step("aten::neg", {prev(2)})}};
  const BuiltPlan bp = build_chain_plan(c);
  const Dtypes dts = binding_dtypes(c, bp);
  std::mt19937_64 rng(11);
  const RunBuffers initial = initial_buffers(bp, dts, rng);
  std::vector<RunBuffers> results;
  for (unsigned threads : {1u, 2u, 3u}) {
    SCOPED_TRACE(threads);
    CpuBackendOptions o = CpuBackendOptions::memory_only();
    o.threads = threads;
    const auto r = cpu_run(bp, o);
    ASSERT_NE(r, nullptr);
    RunBuffers b = initial;
    ASSERT_TRUE(run(*r->runner, b, patches_for(c, bp, false)).ok());
    results.push_back(std::move(b));
  }
  RunBuffers expect = initial;
  reference_run(c, bp, expect, bp.plan.scalars, {0.7}, AlphaRounding::Once);
  for (std::size_t r = 0; r < results.size(); ++r)
    for (std::size_t o = 0; o < expect.outputs.size(); ++o) {
      EXPECT_EQ(results[r].outputs[o], results[0].outputs[o]) << "threads run " << r << ", output " << o;
      EXPECT_EQ(first_difference(results[r].outputs[o], expect.outputs[o], kF32), -1) << "output " << o;
    }
}

// On the host's threads (CpuBackendOptions::parallel), a split loop runs in as many parts as
// the host's kernels would use at the launch (current_threads), not the count the backend was
// made with: the host's count can change between runs (torch.set_num_threads).
unsigned g_host_threads = 1;
std::vector<unsigned> g_parts;
// The "host's" threads: each split's part count noted in g_parts, its parts run on this thread
// in order, or in reverse (then no part can lean on one run before it).
void parts_in_order(void*, unsigned parts, void (*body)(void*, unsigned), void* arg) {
  g_parts.push_back(parts);
  for (unsigned i = 0; i < parts; ++i) body(arg, i);
}
void parts_in_reverse(void*, unsigned parts, void (*body)(void*, unsigned), void* arg) {
  g_parts.push_back(parts);
  for (unsigned i = parts; i-- > 0;) body(arg, i);
}
// A backend made for 2 threads whose split loops run on the host's, g_host_threads of them at
// each launch.
CpuBackendOptions on_host_threads(CpuBackendOptions::ParallelFn parallel) {
  CpuBackendOptions o = CpuBackendOptions::memory_only();
  o.threads = 2;  // the count when the backend is made
  o.parallel = parallel;
  o.current_threads = [] { return g_host_threads; };
  return o;
}
// The chain run at each host thread count in `hosts`: one loop, no parts, at one thread, else
// as many parts as the host has threads. Returns each run's buffers.
std::vector<RunBuffers> run_at_host_counts(CpuRun& r, const ChainSpec& c, const BuiltPlan& bp,
                                           const RunBuffers& initial, std::vector<unsigned> hosts) {
  std::vector<RunBuffers> results;
  for (unsigned host : hosts) {
    SCOPED_TRACE(host);
    g_host_threads = host;
    g_parts.clear();
    RunBuffers b = initial;
    EXPECT_TRUE(run(*r.runner, b, patches_for(c, bp, false)).ok());
    if (host == 1) EXPECT_TRUE(g_parts.empty()) << "one thread: one loop, no parts";
    else EXPECT_EQ(g_parts, std::vector<unsigned>{host});
    results.push_back(std::move(b));
  }
  return results;
}
TEST(CpuBackendThreads, ASplitLoopOnTheHostsThreadsFollowsTheirCountAtEachLaunch) {
  const std::int64_t n = 300007;
  ChainSpec c{"split_host", {n}, {f32({n}), f32({n})}, {step("aten::mul.Tensor", {0, 1}), step("aten::neg", {prev(0)})}};
  const BuiltPlan bp = build_chain_plan(c);
  const Dtypes dts = binding_dtypes(c, bp);
  std::mt19937_64 rng(12);
  const RunBuffers initial = initial_buffers(bp, dts, rng);
  const auto r = cpu_run(bp, on_host_threads(parts_in_order));
  ASSERT_NE(r, nullptr);
  const std::vector<RunBuffers> results = run_at_host_counts(*r, c, bp, initial, {4, 1, 3});
  for (std::size_t r = 1; r < results.size(); ++r)
    for (std::size_t out = 0; out < results[0].outputs.size(); ++out)
      EXPECT_EQ(results[r].outputs[out], results[0].outputs[out]) << "run " << r << ", output " << out;
}

// A strided loop splits in parts of whole lines (Note [Split loops]), as many as the host's
// threads at the launch, on any machine (the parts here run one after another on this thread):
// each part's lines start where the last one's ended, and the bits are one thread's and the
// plain-loop reference's.
TEST(CpuBackendThreads, AStridedLoopSplitInWholeLinesGivesTheBitsOfOneThread) {
  for (const ChainSpec& c : fixed_rows()) {
    if (!c.name.starts_with("strided_split")) continue;
    SCOPED_TRACE(c.name);
    const BuiltPlan bp = build_chain_plan(c);
    const Dtypes dts = binding_dtypes(c, bp);
    std::mt19937_64 rng(13);
    const RunBuffers initial = initial_buffers(bp, dts, rng);
    const auto r = cpu_run(bp, on_host_threads(parts_in_reverse));
    ASSERT_NE(r, nullptr);
    const std::vector<RunBuffers> results = run_at_host_counts(*r, c, bp, initial, {1, 2, 3, 7});
    RunBuffers expect = initial;
    reference_run(c, bp, expect, bp.plan.scalars, {}, AlphaRounding::Once);
    for (std::size_t k = 0; k < results.size(); ++k)
      for (std::size_t out = 0; out < expect.outputs.size(); ++out) {
        const auto& got = results[k].outputs[out];
        EXPECT_EQ(got, results[0].outputs[out]) << "run " << k << ", output " << out;
        EXPECT_EQ(first_difference(got, expect.outputs[out], dts.outputs[out]), -1)
            << "run " << k << ", output " << out;
      }
  }
}

}  // namespace
}  // namespace crucible::mimic
