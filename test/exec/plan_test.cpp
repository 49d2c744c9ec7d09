// plan_test — a hand-built step through Forge's front end into an execution plan: its tables
// (calls, elided views, slots by kind, fused values in the arena), and runs on the null backend
// with a reference provider checked against values computed here, with and without patches.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <limits>
#include <map>
#include <vector>

#include "crucible/exec/NullBackend.h"
#include "crucible/exec/Runner.h"
#include "crucible/exec/VerifyPlan.h"
#include "crucible/graph/ArenaPlacement.h"
#include "step_fixture.h"

namespace crucible::exec {
namespace {

using test::double_arg;
using test::ReferenceProvider;
using test::StepBuilder;

// x [4,3] (input), w [5,3] (parameter), v [4,5] (optimizer state):
//   wt = t(w)                    view, no call
//   h  = mm(x, wt)               } one gemm_epilogue kernel: h is fused, still in the arena
//   r  = relu(h)                 }
//   m  = mul.Tensor(r, 0.5)      0.5 a Python number: a Constant slot, patchable
//   a  = add.Tensor(m, r)
//   s  = sum(a)                  live-out: an Output slot
//   v.add_(a, alpha=-0.1)        a state update of an Input slot; alpha patchable ("lr")
struct Step {
  StepBuilder b;
  std::uint32_t x, w, v, half, wt, h, r, m, a, s, v1;
  std::uint32_t add_node = 0;
  Step() {
    x = b.external({4, 3}, record::ExternalKind::Input);
    w = b.external({5, 3}, record::ExternalKind::Parameter);
    v = b.external({4, 5}, record::ExternalKind::OptimizerState);
    half = b.number(0.5);
    wt = b.view("aten::t", w, {3, 5}, {1, 3});
    h = b.op("aten::mm", {x, wt}, {4, 5});
    r = b.op("aten::relu", {h}, {4, 5});
    m = b.op("aten::mul.Tensor", {r, half}, {4, 5});
    a = b.op("aten::add.Tensor", {m, r}, {4, 5});
    s = b.op("aten::sum", {a}, {});
    add_node = static_cast<std::uint32_t>(b.ir.nodes.size());
    v1 = b.in_place("aten::add_.Tensor", v, {a}, {double_arg(2, -0.1)});
    b.done();
  }
};

struct Planned {
  forge::FrontEndResult fe;
  ExecutionPlan plan;
};

Planned plan_of(Step& st, const PlanOptions& opt = {}) {
  auto fe = forge::run_front_end(st.b.ir, test::test_rules(), forge::Policy{}, 1e15);
  EXPECT_TRUE(fe.ok()) << fe.status();
  auto plan = build_plan(fe->ir, fe->plan, opt);
  EXPECT_TRUE(plan.ok()) << plan.status();
  return Planned{std::move(*fe), std::move(*plan)};
}

// The same step in plain loops: returns s; updates v in place.
double reference_step(const std::vector<float>& x, const std::vector<float>& w,
                      std::vector<float>& v, double half, double alpha) {
  double s = 0;
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 5; ++j) {
      double h = 0;
      for (int k = 0; k < 3; ++k) h += static_cast<double>(x[i * 3 + k]) * w[j * 3 + k];
      const float r = std::max(0.0f, static_cast<float>(h));
      const float m = static_cast<float>(r * half);
      const float a = static_cast<float>(m + static_cast<double>(r));
      s += a;
      v[i * 5 + j] = static_cast<float>(v[i * 5 + j] + alpha * a);
    }
  return static_cast<float>(s);
}

TEST(BuildPlan, TablesOfAHandBuiltStep) {
  Step st;
  Planned p = plan_of(st);
  const ExecutionPlan& plan = p.plan;
  ASSERT_TRUE(verify_plan(plan).ok()) << verify_plan(plan);
  EXPECT_EQ(plan.kernels.size(), p.fe.plan.kernels.size()) << "one plan kernel per IR002 kernel";
  EXPECT_EQ(plan.elided_views, 1u) << "t(w) is a view of w: a tensor, not a call";
  EXPECT_EQ(plan.calls.size(), p.fe.ir.nodes.size() - 1);
  // mm and relu share one kernel (the gemm_act rule).
  int gemm_kernels = 0;
  for (const Kernel& k : plan.kernels)
    if (k.kernel == forge::KernelTemplate::GemmEpilogue) {
      ++gemm_kernels;
      ASSERT_EQ(k.call_count, 2u);
      EXPECT_EQ(plan.op_names[plan.calls[k.call_begin].op], "aten::mm");
      EXPECT_EQ(plan.op_names[plan.calls[k.call_begin + 1].op], "aten::relu");
    }
  EXPECT_EQ(gemm_kernels, 1);
  // Slots by kind: x, w, v bound from outside; s escapes; 0.5 a constant; h, r, m, a in the arena.
  int kinds[4] = {};
  for (const Slot& s : plan.slots) ++kinds[static_cast<int>(s.kind)];
  EXPECT_EQ(kinds[static_cast<int>(SlotKind::Input)], 3);
  EXPECT_EQ(kinds[static_cast<int>(SlotKind::Output)], 1);
  EXPECT_EQ(kinds[static_cast<int>(SlotKind::Constant)], 1);
  EXPECT_EQ(kinds[static_cast<int>(SlotKind::Arena)], 4);
  EXPECT_EQ(plan.inputs.size(), 3u);
  EXPECT_EQ(plan.outputs.size(), 1u);
  // Four 80-byte float tensors (rounded to 128) and a constant: h dies at relu, so the arena
  // holds at most r, m, a and the constant at once, and reuses h's bytes.
  std::uint64_t sum = 0;
  for (const Slot& s : plan.slots)
    if (s.kind == SlotKind::Arena || s.kind == SlotKind::Constant) {
      EXPECT_EQ(s.offset % 64, 0u);
      sum += s.bytes;
    }
  EXPECT_EQ(sum, 4 * 128u + 64u);
  EXPECT_LT(plan.arena_bytes, sum) << describe(plan);
  // Results: s and the new version of v.
  EXPECT_EQ(plan.results.size(), 2u);
  const std::string text = describe(plan);
  EXPECT_NE(text.find("aten::mm"), std::string::npos);
  EXPECT_NE(text.find("constant"), std::string::npos);
}

TEST(BuildPlan, RefusesWhatItCannotPlan) {
  {
    Step st;
    forge::Ir001 ir = st.b.ir;
    ir.symbolic = true;
    auto fe = forge::run_front_end(st.b.ir, test::test_rules(), forge::Policy{}, 1e15);
    ASSERT_TRUE(fe.ok());
    auto p = build_plan(ir, fe->plan);
    ASSERT_FALSE(p.ok());
    EXPECT_NE(p.status().message().find("symbolic"), std::string_view::npos) << p.status();
    ir.symbolic = false;
    ir.recorded_geometry = false;
    p = build_plan(ir, fe->plan);
    ASSERT_FALSE(p.ok());
    EXPECT_NE(p.status().message().find("another batch"), std::string_view::npos) << p.status();
  }
  {
    Step st;
    st.b.ir.values[st.r].strides.clear();  // a hand-built IR that forgot its strides
    auto fe = forge::run_front_end(st.b.ir, test::test_rules(), forge::Policy{}, 1e15);
    ASSERT_TRUE(fe.ok());
    auto p = build_plan(fe->ir, fe->plan);
    ASSERT_FALSE(p.ok());
    EXPECT_NE(p.status().message().find("strides"), std::string_view::npos) << p.status();
  }
  {
    Step st;
    PlanOptions opt;
    opt.scalar_patches.push_back({st.add_node, 5, "lr"});  // add_ has one scalar
    auto fe = forge::run_front_end(st.b.ir, test::test_rules(), forge::Policy{}, 1e15);
    ASSERT_TRUE(fe.ok());
    auto p = build_plan(fe->ir, fe->plan, opt);
    ASSERT_FALSE(p.ok());
    EXPECT_NE(p.status().message().find("'lr'"), std::string_view::npos) << p.status();
  }
}

class RunStep : public ::testing::Test {
 protected:
  std::vector<float> x{0.5f,  -1.0f, 2.0f, 1.5f, 0.25f, -0.75f,
                       -2.0f, 1.0f,  0.5f, 3.0f, -0.5f, 0.125f};
  std::vector<float> w{1.0f, 0.5f,    -0.25f, -1.0f, 2.0f,  0.75f, 0.5f, 0.5f,
                       0.5f, -0.125f, 1.5f,   -2.0f, 0.25f, -0.5f, 1.0f};
  std::vector<float> v = std::vector<float>(20, 1.0f);
  float s_out = 0;

  // Pointers in the order of plan.inputs, by the storage each slot holds (x 1, w 2, v 3).
  std::vector<void*> inputs(const ExecutionPlan& plan) {
    std::vector<void*> in;
    for (std::uint32_t s : plan.inputs) {
      const std::uint64_t id = plan.slots[s].storage;
      in.push_back(id == 1   ? static_cast<void*>(x.data())
                   : id == 2 ? static_cast<void*>(w.data())
                             : v.data());
    }
    return in;
  }
};

TEST_F(RunStep, NullBackendMatchesTheReference) {
  Step st;
  Planned p = plan_of(st);
  ReferenceProvider ref;
  auto runner = Runner::make(p.plan, null_backend(), ref.provider());
  ASSERT_TRUE(runner.ok()) << runner.status();
  EXPECT_EQ((*runner)->backend_name(), "null");
  std::vector<float> want_v = v;
  const auto in = inputs(p.plan);
  void* out[] = {&s_out};
  for (int step = 0; step < 3; ++step) {  // v carries over: each step reads the last one's update
    ASSERT_TRUE((*runner)->run(RunArgs{in, out, {}}).ok());
    const double want_s = reference_step(x, w, want_v, 0.5, -0.1);
    EXPECT_FLOAT_EQ(s_out, static_cast<float>(want_s)) << "step " << step;
    for (int i = 0; i < 20; ++i)
      EXPECT_FLOAT_EQ(v[i], want_v[i]) << "step " << step << " v[" << i << "]";
  }
  EXPECT_EQ(ref.calls, 3 * static_cast<int>(p.plan.calls.size()));
}

TEST_F(RunStep, PatchPointsChangeScalarsAndNumbersPerRun) {
  Step st;
  PlanOptions opt;
  opt.scalar_patches.push_back({st.add_node, 0, "lr"});
  opt.constant_patches.push_back({st.half, "scale"});
  Planned p = plan_of(st, opt);
  ASSERT_EQ(p.plan.patches.size(), 2u);
  ReferenceProvider ref;
  auto runner = Runner::make(p.plan, null_backend(), ref.provider());
  ASSERT_TRUE(runner.ok()) << runner.status();
  const auto in = inputs(p.plan);
  void* out[] = {&s_out};
  std::vector<float> want_v = v;
  // Recorded values when no patch is given.
  ASSERT_TRUE((*runner)->run(RunArgs{in, out, {}}).ok());
  EXPECT_FLOAT_EQ(s_out, static_cast<float>(reference_step(x, w, want_v, 0.5, -0.1)));
  // New values.
  const std::uint64_t patches[] = {std::bit_cast<std::uint64_t>(-0.01),
                                   std::bit_cast<std::uint64_t>(2.0)};
  ASSERT_TRUE((*runner)->run(RunArgs{in, out, patches}).ok());
  EXPECT_FLOAT_EQ(s_out, static_cast<float>(reference_step(x, w, want_v, 2.0, -0.01)));
  for (int i = 0; i < 20; ++i) EXPECT_FLOAT_EQ(v[i], want_v[i]) << i;
  // Back to the recorded ones: the patches of one run do not stay.
  ASSERT_TRUE((*runner)->run(RunArgs{in, out, {}}).ok());
  EXPECT_FLOAT_EQ(s_out, static_cast<float>(reference_step(x, w, want_v, 0.5, -0.1)));
  // A patch that does not fit the number's dtype (float64 takes any double) is not the issue
  // here; a wrong count is.
  const std::uint64_t one[] = {0};
  const Status bad = (*runner)->run(RunArgs{in, out, one});
  EXPECT_FALSE(bad.ok());
  EXPECT_NE(bad.message().find("patch points"), std::string_view::npos) << bad;
}

TEST_F(RunStep, BindingsAreChecked) {
  Step st;
  Planned p = plan_of(st);
  ReferenceProvider ref;
  auto runner = Runner::make(p.plan, null_backend(), ref.provider());
  ASSERT_TRUE(runner.ok());
  auto in = inputs(p.plan);
  void* out[] = {&s_out};
  Status st1 = (*runner)->run(RunArgs{std::span<void* const>(in).first(2), out, {}});
  EXPECT_FALSE(st1.ok());
  EXPECT_NE(st1.message().find("inputs"), std::string_view::npos) << st1;
  in[1] = nullptr;
  Status st2 = (*runner)->run(RunArgs{in, out, {}});
  EXPECT_FALSE(st2.ok());
  EXPECT_NE(st2.message().find("is null"), std::string_view::npos) << st2;
  EXPECT_EQ(ref.calls, 0) << "nothing runs before the bindings are checked";
}

TEST_F(RunStep, ProviderErrorsNameTheKernelAndCall) {
  Step st;
  Planned p = plan_of(st);
  struct Refuses {
    static Status call(void*, const LibraryCall& c) {
      if (c.op == "aten::relu") return unsupported("no relu here", "use another provider");
      return ok_status();
    }
  };
  auto runner = Runner::make(p.plan, null_backend(), Provider{nullptr, &Refuses::call});
  ASSERT_TRUE(runner.ok());
  const auto in = inputs(p.plan);
  void* out[] = {&s_out};
  const Status s = (*runner)->run(RunArgs{in, out, {}});
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented);
  for (const char* part : {"backend 'null'", "kernel ", "(aten::relu", "no relu here"})
    EXPECT_NE(s.message().find(part), std::string_view::npos) << part << " in " << s;
}

// Note [Memory use]: the arena placed from a backend's spans and untouched slots — what a
// backend leaves untouched gets no memory, slots live in one span never share memory, and
// memory use that does not fit the plan is refused.
TEST(PlaceArena, UntouchedSlotsGetNoMemoryAndSpansKeepSlotsApart) {
  Step st;
  Planned p = plan_of(st);
  const ExecutionPlan& plan = p.plan;
  auto own = place_arena(plan, plan_memory_use(plan));
  ASSERT_TRUE(own.ok()) << own.status();
  EXPECT_EQ(own->arena_bytes, plan.arena_bytes) << "the plan's own use gives the plan's arena";
  std::vector<std::uint32_t> arena_slots;
  for (std::uint32_t s = 0; s < plan.slots.size(); ++s)
    if (plan.slots[s].kind == SlotKind::Arena) arena_slots.push_back(s);
  ASSERT_GE(arena_slots.size(), 2u) << describe(plan);

  // Every call alone, every Arena slot untouched: only the Constant is placed.
  MemoryUse none;
  for (std::uint32_t c = 0; c < plan.calls.size(); ++c) none.spans.push_back({c, c});
  none.untouched.assign(plan.slots.size(), false);
  for (std::uint32_t s : arena_slots) none.untouched[s] = true;
  auto bare = place_arena(plan, none);
  ASSERT_TRUE(bare.ok()) << bare.status();
  for (std::uint32_t s : arena_slots) EXPECT_FALSE(bare->placed[s]) << s;
  std::uint64_t constants = 0;
  for (const Slot& s : plan.slots) constants += s.kind == SlotKind::Constant ? s.bytes : 0;
  EXPECT_EQ(bare->arena_bytes, constants);

  // All calls one span: every placed slot is live at once, so none shares memory.
  MemoryUse one = plan_memory_use(plan);
  for (auto& sp : one.spans) sp = {0, static_cast<std::uint32_t>(plan.calls.size() - 1)};
  auto wide = place_arena(plan, one);
  ASSERT_TRUE(wide.ok());
  std::uint64_t sum = 0;
  std::vector<graph::Lifetime> blocks;
  std::vector<std::uint64_t> offsets;
  for (std::uint32_t s = 0; s < plan.slots.size(); ++s)
    if (wide->placed[s]) {
      sum += plan.slots[s].bytes;
      blocks.push_back({plan.slots[s].bytes, 0, 0});
      offsets.push_back(wide->offsets[s]);
    }
  EXPECT_EQ(wide->arena_bytes, sum);
  EXPECT_FALSE(graph::overlapping_pair(blocks, offsets).has_value());

  // Memory use that does not fit the plan.
  MemoryUse short_spans = plan_memory_use(plan);
  short_spans.spans.pop_back();
  EXPECT_FALSE(place_arena(plan, short_spans).ok());
  MemoryUse outside = plan_memory_use(plan);
  outside.spans[0] = {1, 1};
  auto o = place_arena(plan, outside);
  ASSERT_FALSE(o.ok());
  EXPECT_NE(o.status().message().find("does not hold it"), std::string_view::npos) << o.status();
  MemoryUse input_untouched = plan_memory_use(plan);
  input_untouched.untouched.assign(plan.slots.size(), false);
  input_untouched.untouched[plan.inputs[0]] = true;
  EXPECT_FALSE(place_arena(plan, input_untouched).ok());
}

// Note [Adopted results]: a provider that computes a call's results in memory of its own and
// hands them over. The runner places those outputs no arena memory, tells the provider when
// nothing reads them any more (release), and gives memory (place) to one ATen-like memory does
// not fit.
struct AllocatingProvider {
  ReferenceProvider ref;
  bool fits = true;  // false: every adoption refused, so each result goes through place()
  std::map<std::uint32_t, std::vector<float>> own;  // per call: its results' memory
  int allocating_calls = 0, releases = 0, placed = 0, asked = 0;
  const ExecutionPlan* plan = nullptr;

  static bool allocating(std::string_view op) { return op == "aten::relu"; }
  Provider provider() {
    Provider p;
    p.self = this;
    p.call = [](void* self, const LibraryCall& c) { return static_cast<AllocatingProvider*>(self)->call(c); };
    p.allocates = [](void* self, const ExecutionPlan& plan, std::uint32_t call) {
      auto* a = static_cast<AllocatingProvider*>(self);
      a->plan = &plan;
      const bool yes = allocating(plan.op_names[plan.calls[call].op]);
      a->asked += yes ? 1 : 0;
      return yes;
    };
    p.release = [](void* self, std::uint32_t call) {
      auto* a = static_cast<AllocatingProvider*>(self);
      auto it = a->own.find(call);  // every call whose results died: only relu's are its own
      if (it == a->own.end()) return;
      ++a->releases;
      // Whoever still read it would see NaN.
      std::fill(it->second.begin(), it->second.end(), std::numeric_limits<float>::quiet_NaN());
    };
    return p;
  }
  Status call(const LibraryCall& c) {
    if (!allocating(c.op) || c.outputs[0].data != nullptr) return ref.call(c);  // placed: as usual
    ++allocating_calls;
    EXPECT_EQ(c.outputs[0].data, nullptr) << "an output the provider allocates has no arena memory";
    std::vector<float>& mem = own[c.call];
    mem.assign(static_cast<std::size_t>(ReferenceProvider::numel(c.outputs[0])), 0.0f);
    std::vector<TensorArg> outs(c.outputs.begin(), c.outputs.end());
    outs[0].data = mem.data();
    LibraryCall mine = c;
    mine.outputs = outs;
    if (Status st = ref.call(mine); !st.ok()) return st;
    if (fits && c.adopt(c.runner, 0, mem.data(), 0, mem.size() * sizeof(float))) return ok_status();
    void* at = c.place(c.runner, 0);
    if (at == nullptr) return exhausted("no memory", "free some");
    ++placed;
    TensorArg there = c.outputs[0];
    there.data = at;
    for (std::int64_t i = 0; i < ReferenceProvider::numel(there); ++i)
      ReferenceProvider::set(there, i, ReferenceProvider::get(outs[0], i));
    return ok_status();
  }
};

TEST_F(RunStep, OutputsAProviderAllocatesTakeNoArenaMemory) {
  for (bool fits : {true, false}) {
    SCOPED_TRACE(fits ? "adopted" : "placed late");
    std::vector<float> v0 = v;
    Step st;
    Planned p = plan_of(st);
    AllocatingProvider prov;
    prov.fits = fits;
    auto runner = Runner::make(p.plan, null_backend(), prov.provider());
    ASSERT_TRUE(runner.ok()) << runner.status();
    EXPECT_LT((*runner)->arena_bytes(), p.plan.arena_bytes) << describe(p.plan);
    // relu's result has no arena memory; the other slots keep theirs.
    std::uint32_t relu_slot = kNone;
    for (const Call& c : p.plan.calls)
      if (p.plan.op_names[c.op] == "aten::relu") relu_slot = p.plan.tensors[p.plan.outputs_of(c)[0].tensor].slot;
    ASSERT_NE(relu_slot, kNone);
    EXPECT_FALSE((*runner)->slot_offset(relu_slot).has_value());
    for (std::uint32_t s = 0; s < p.plan.slots.size(); ++s)
      if (s != relu_slot && p.plan.slots[s].kind == SlotKind::Arena) {
        EXPECT_TRUE((*runner)->slot_offset(s).has_value()) << s;
      }
    std::vector<float> want_v = v;
    const auto in = inputs(p.plan);
    void* out[] = {&s_out};
    for (int step = 0; step < 3; ++step) {
      ASSERT_TRUE((*runner)->run(RunArgs{in, out, {}}).ok());
      const double want_s = reference_step(x, w, want_v, 0.5, -0.1);
      EXPECT_FLOAT_EQ(s_out, static_cast<float>(want_s)) << "step " << step;
      for (int i = 0; i < 20; ++i) EXPECT_FLOAT_EQ(v[i], want_v[i]) << "step " << step << " v[" << i << "]";
    }
    EXPECT_EQ(prov.allocating_calls, 3);
    EXPECT_EQ(prov.releases, 3) << "relu's result is let go once a run no longer reads it";
    EXPECT_EQ(prov.placed, fits ? 0 : 3);
    v = v0;
  }
}

// A call the backend may run with code of its own (MemoryUse::library_only false) keeps its
// outputs' memory whatever the provider would do with it: the backend's code writes there.
TEST_F(RunStep, CallsABackendMayRunItselfKeepTheirOutputsMemory) {
  Step st;
  Planned p = plan_of(st);
  AllocatingProvider prov;
  Backend b = null_backend();
  b.memory_use = [](void*, const ExecutionPlan& plan, MemoryUse& use) {
    use = plan_memory_use(plan);
    use.library_only.assign(plan.calls.size(), true);
    for (std::uint32_t c = 0; c < plan.calls.size(); ++c)
      if (plan.op_names[plan.calls[c].op] == "aten::relu") use.library_only[c] = false;
    return ok_status();
  };
  auto runner = Runner::make(p.plan, b, prov.provider());
  ASSERT_TRUE(runner.ok()) << runner.status();
  EXPECT_EQ(prov.asked, 0) << "the provider is not asked about a call the backend may run itself";
  EXPECT_EQ((*runner)->arena_bytes(), p.plan.arena_bytes);
  std::vector<float> want_v = v;
  const auto in = inputs(p.plan);
  void* out[] = {&s_out};
  ASSERT_TRUE((*runner)->run(RunArgs{in, out, {}}).ok());
  EXPECT_FLOAT_EQ(s_out, static_cast<float>(reference_step(x, w, want_v, 0.5, -0.1)));
  EXPECT_EQ(prov.allocating_calls, 0);
  // A memory use that does not fit the plan is the backend's bug, said so.
  b.memory_use = [](void*, const ExecutionPlan& plan, MemoryUse& use) {
    use = plan_memory_use(plan);
    use.library_only.assign(1, true);
    return ok_status();
  };
  auto bad = Runner::make(p.plan, b, prov.provider());
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("backend bug"), std::string_view::npos) << bad.status();
}

// A backend with its own slots: prepare once, run_kernel per kernel (delegating to library
// calls), synchronize per run, its arena allocator and free; empty slots get the defaults.
struct CountingBackend {
  int prepared = 0, kernels = 0, syncs = 0, allocs = 0, frees = 0;
  Backend backend() {
    Backend b;
    b.name = "counting";
    b.self = this;
    b.prepare = [](void* s, const ExecutionPlan&) {
      ++static_cast<CountingBackend*>(s)->prepared;
      return ok_status();
    };
    b.run_kernel = [](void* s, const KernelLaunch& l) {
      ++static_cast<CountingBackend*>(s)->kernels;
      return default_run_kernel(s, l);
    };
    b.synchronize = [](void* s) {
      ++static_cast<CountingBackend*>(s)->syncs;
      return ok_status();
    };
    b.alloc_arena = [](void* s, std::uint64_t bytes, std::uint64_t a) {
      ++static_cast<CountingBackend*>(s)->allocs;
      return default_alloc_arena(s, bytes, a);
    };
    b.free_arena = [](void* s, void* p) {
      ++static_cast<CountingBackend*>(s)->frees;
      default_free_arena(s, p);
    };
    return b;
  }
};

TEST_F(RunStep, BackendSlotsAreCalledAndDefaultsFillTheRest) {
  Step st;
  Planned p = plan_of(st);
  ReferenceProvider ref;
  CountingBackend counting;
  {
    auto runner = Runner::make(p.plan, counting.backend(), ref.provider());
    ASSERT_TRUE(runner.ok()) << runner.status();
    const auto in = inputs(p.plan);
    void* out[] = {&s_out};
    ASSERT_TRUE((*runner)->run(RunArgs{in, out, {}}).ok());
    ASSERT_TRUE((*runner)->run(RunArgs{in, out, {}}).ok());
  }
  EXPECT_EQ(counting.prepared, 1);
  EXPECT_EQ(counting.allocs, 1);
  EXPECT_EQ(counting.frees, 1);
  EXPECT_EQ(counting.kernels, 2 * static_cast<int>(p.plan.kernels.size()));
  EXPECT_EQ(counting.syncs, 2);
  // Only a name is required of a backend; a provider needs its call.
  Backend bare;
  EXPECT_FALSE(with_defaults(bare).ok());
  bare.name = "bare";
  auto full = with_defaults(bare);
  ASSERT_TRUE(full.ok());
  EXPECT_TRUE(full->prepare && full->alloc_arena && full->free_arena && full->run_kernel &&
              full->synchronize);
  EXPECT_FALSE(Runner::make(p.plan, bare, Provider{}).ok());
}

// Note [Run position] (Runner.h): the observer hears every kernel start (its first call), every
// library call and every kernel end (its last call) in order, a refusal at a kernel start stops
// the run before that kernel; arena_uses gives each placed slot's bytes and calls, which never
// overlap in memory while their calls do; renew_arena moves later runs to a new arena.
TEST_F(RunStep, RunPositionArenaUsesAndRenewal) {
  Step st;
  Planned p = plan_of(st);
  ReferenceProvider ref;
  auto runner = Runner::make(p.plan, null_backend(), ref.provider());
  ASSERT_TRUE(runner.ok()) << runner.status();
  struct Seen {
    std::vector<std::pair<std::uint32_t, bool>> events;  // (call, kernel start)
    std::uint32_t stop_at = kNone;
    static Status at(void* self, std::uint32_t call, bool kernel_start) {
      auto* s = static_cast<Seen*>(self);
      s->events.emplace_back(call, kernel_start);
      if (kernel_start && call == s->stop_at) return bad_state("stop here", "test");
      return ok_status();
    }
  } seen;
  const auto in = inputs(p.plan);
  void* out[] = {&s_out};
  RunArgs ra{in, out, {}};
  ra.at_call = &Seen::at;
  ra.observer = &seen;
  ASSERT_TRUE((*runner)->run(ra).ok());
  // The null backend runs each kernel's calls as library calls: start, each call, end.
  std::vector<std::pair<std::uint32_t, bool>> want;
  for (const Kernel& k : p.plan.kernels) {
    if (k.call_count == 0) continue;
    want.emplace_back(k.call_begin, true);
    for (std::uint32_t c = k.call_begin; c < k.call_begin + k.call_count; ++c) want.emplace_back(c, false);
    want.emplace_back(k.call_begin + k.call_count - 1, false);
  }
  EXPECT_EQ(seen.events, want);
  // Stopped before the second kernel: only the first kernel's calls ran.
  ASSERT_GE(p.plan.kernels.size(), 2u);
  seen.events.clear();
  seen.stop_at = p.plan.kernels[1].call_begin;
  const int before = ref.calls;
  const Status stopped = (*runner)->run(ra);
  ASSERT_FALSE(stopped.ok());
  EXPECT_NE(stopped.message().find("before kernel 1: stop here"), std::string_view::npos) << stopped;
  EXPECT_EQ(ref.calls - before, static_cast<int>(p.plan.kernels[0].call_count));

  const std::vector<ArenaUse> uses = (*runner)->arena_uses();
  ASSERT_FALSE(uses.empty());
  for (std::size_t i = 0; i < uses.size(); ++i) {
    EXPECT_LE(uses[i].offset + uses[i].bytes, (*runner)->arena_bytes());
    EXPECT_LE(uses[i].first, uses[i].last);
    EXPECT_LT(uses[i].last, (*runner)->calls());
    for (std::size_t j = 0; j < i; ++j) {
      const bool calls_overlap = uses[i].first <= uses[j].last && uses[j].first <= uses[i].last;
      const bool bytes_overlap = uses[i].offset < uses[j].offset + uses[j].bytes &&
                                 uses[j].offset < uses[i].offset + uses[i].bytes;
      EXPECT_FALSE(calls_overlap && bytes_overlap) << i << " and " << j;
    }
  }
  void* old = (*runner)->arena_data();
  ASSERT_TRUE((*runner)->renew_arena().ok());
  EXPECT_NE((*runner)->arena_data(), old);
  // Runs on the new arena give the same results.
  std::vector<float> want_v = v;
  ASSERT_TRUE((*runner)->run(RunArgs{in, out, {}}).ok());
  EXPECT_FLOAT_EQ(s_out, static_cast<float>(reference_step(x, w, want_v, 0.5, -0.1)));
  for (int i = 0; i < 20; ++i) EXPECT_FLOAT_EQ(v[i], want_v[i]) << i;
}

}  // namespace
}  // namespace crucible::exec
