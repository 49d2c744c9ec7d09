// recorded_test — plans of the recorded test models (the forge fixture's traces): the whole way
// from a trace through Forge's front end and the cpu-avx2 rules to a verified plan, run on the
// null backend with a provider that checks memory instead of computing: every byte a call reads
// in the arena was last written through the same slot (the plan's no-overlap property, observed
// in a run), and every tensor lies inside the memory bound for its slot.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "crucible/core/ScalarType.h"
#include "crucible/exec/BuildPlan.h"
#include "crucible/exec/NullBackend.h"
#include "crucible/exec/Runner.h"
#include "crucible/graph/Analysis.h"
#include "crucible/record/TraceFile.h"

namespace crucible::exec {
namespace {

namespace fs = std::filesystem;

// Marks who wrote each arena byte last; checks each read against it.
struct OwnershipProvider {
  const ExecutionPlan* plan = nullptr;
  std::vector<std::uint32_t> owner;  // per arena byte: slot + 1, 0 = never written
  std::string first_error;
  int calls = 0;

  // The byte range [lo, hi) of a tensor in its slot.
  std::pair<std::uint64_t, std::uint64_t> range(const TensorArg& t) const {
    const TensorRef& tr = plan->tensors[t.tensor];
    const std::uint64_t es = *element_size(t.dtype);
    std::int64_t hi = tr.offset;
    for (std::size_t d = 0; d < t.sizes.size(); ++d) {
      if (t.sizes[d] == 0) return {0, 0};
      hi += (t.sizes[d] - 1) * t.strides[d];
    }
    return {static_cast<std::uint64_t>(tr.offset) * es, (static_cast<std::uint64_t>(hi) + 1) * es};
  }
  Status call(const LibraryCall& c) {
    ++calls;
    for (const TensorArg& t : c.inputs) {
      const Slot& s = plan->slots[plan->tensors[t.tensor].slot];
      if (s.kind != SlotKind::Arena) continue;
      const auto [lo, hi] = range(t);
      for (std::uint64_t b = s.offset + lo; b < s.offset + hi; ++b)
        if (owner[b] != plan->tensors[t.tensor].slot + 1)
          return bad_state("call " + std::to_string(c.call) + " (" + std::string(c.op) +
                               ") reads arena byte " + std::to_string(b) +
                               " last written through slot " + std::to_string(owner[b]) + " - 1",
                           "the plan overlaps live slots");
    }
    for (const TensorArg& t : c.outputs) {
      const std::uint32_t si = plan->tensors[t.tensor].slot;
      const Slot& s = plan->slots[si];
      if (s.kind != SlotKind::Arena) continue;
      const auto [lo, hi] = range(t);
      for (std::uint64_t b = s.offset + lo; b < s.offset + hi; ++b) owner[b] = si + 1;
    }
    return ok_status();
  }
};

TEST(RecordedModels, PlansVerifyAndRunOnTheNullBackend) {
  const fs::path dir = CRUCIBLE_FORGE_TRACES;
  if (!fs::exists(dir / "index.json"))
    GTEST_SKIP()
        << dir
        << " has no index.json: the forge fixture (test/forge/make_traces.py, needs torch and "
        << "the Vessel) records the test models";
  auto rules = forge::load_rules_dir(CRUCIBLE_RULES_DIR, "cpu-avx2");
  ASSERT_TRUE(rules.ok()) << rules.status();
  int planned = 0;
  for (const char* model : {"mlp_b32", "cnn_b4", "transformer_b4", "resnet18_b2"}) {
    const fs::path file = dir / (std::string(model) + ".crtrace");
    if (!fs::exists(file)) {
      ADD_FAILURE() << "no trace " << file;
      continue;
    }
    auto t = record::load_trace(file.string());
    ASSERT_TRUE(t.ok()) << t.status();
    auto it = graph::analyze_latest_iteration(*t, -1);
    ASSERT_TRUE(it.ok()) << it.status();
    forge::ExprPool pool;
    auto sp = plan_step(*t, (*it)->ops(), pool, *rules, forge::Policy{}, {}, 1e15);
    ASSERT_TRUE(sp.ok()) << model << ": " << sp.status();
    const ExecutionPlan& p = sp->plan;
    ++planned;
    EXPECT_EQ(p.calls.size() + p.elided_views, sp->ir.nodes.size()) << model;
    EXPECT_EQ(p.kernels.size(), sp->ir2.kernels.size()) << model;
    EXPECT_GT(p.elided_views, 0u) << model << " records views (t, view, ...)";
    std::uint64_t arena_sum = 0;
    for (const Slot& s : p.slots)
      if (s.kind == SlotKind::Arena || s.kind == SlotKind::Constant) arena_sum += s.bytes;
    EXPECT_LT(p.arena_bytes, arena_sum) << model << ": the arena reuses memory";
    EXPECT_FALSE(p.inputs.empty()) << model;
    EXPECT_FALSE(p.results.empty()) << model << ": the step updates its parameters";

    OwnershipProvider own;
    own.plan = &p;
    own.owner.assign(p.arena_bytes, 0);
    auto runner = Runner::make(p, null_backend(),
                               Provider{&own, [](void* s, const LibraryCall& c) {
                                          return static_cast<OwnershipProvider*>(s)->call(c);
                                        }});
    ASSERT_TRUE(runner.ok()) << model << ": " << runner.status();
    std::vector<std::vector<std::byte>> memory;
    std::vector<void*> in, out;
    for (std::uint32_t s : p.inputs) in.push_back(memory.emplace_back(p.slots[s].bytes + 1).data());
    for (std::uint32_t s : p.outputs)
      out.push_back(memory.emplace_back(p.slots[s].bytes + 1).data());
    const Status st = (*runner)->run(RunArgs{in, out, {}});
    EXPECT_TRUE(st.ok()) << model << ": " << st;
    EXPECT_EQ(own.calls, static_cast<int>(p.calls.size())) << model;
    // Note [Kernel lifetimes]: the arena slots one kernel touches are disjoint memory, so a
    // backend may run its calls fused.
    int kernels_checked = 0;
    for (std::uint32_t k = 0; k < p.kernels.size(); ++k) {
      const Kernel& kn = p.kernels[k];
      std::set<std::uint32_t> touched;
      for (std::uint32_t c = kn.call_begin; c < kn.call_begin + kn.call_count; ++c)
        for (std::uint32_t a = p.calls[c].in_begin;
             a < p.calls[c].in_begin + p.calls[c].in_count + p.calls[c].out_count; ++a) {
          const std::uint32_t sl = p.tensors[p.args[a].tensor].slot;
          if (p.slots[sl].kind == SlotKind::Arena) touched.insert(sl);
        }
      kernels_checked += touched.size() > 1 ? 1 : 0;
      for (std::uint32_t x : touched)
        for (std::uint32_t y : touched)
          if (x < y) {
            const Slot& a = p.slots[x];
            const Slot& b = p.slots[y];
            EXPECT_TRUE(a.offset + a.bytes <= b.offset || b.offset + b.bytes <= a.offset)
                << model << ": kernel " << k << " touches slots " << x << " and " << y
                << ", which share arena memory";
          }
    }
    EXPECT_GT(kernels_checked, 0) << model;
    std::printf(
        "%-16s %4zu nodes %4zu kernels %4zu calls %3u views  %3zu in %3zu out  arena %9llu B of "
        "%9llu\n",
        model, sp->ir.nodes.size(), p.kernels.size(), p.calls.size(), p.elided_views,
        p.inputs.size(), p.outputs.size(), static_cast<unsigned long long>(p.arena_bytes),
        static_cast<unsigned long long>(arena_sum));
  }
  EXPECT_EQ(planned, 4);
}

}  // namespace
}  // namespace crucible::exec
