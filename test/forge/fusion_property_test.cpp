// fusion_property_test — on random training-step-like graphs and on the recorded test models,
// with the shipped rules, the fused plan computes the recording's dataflow: every op in exactly one kernel, every value produced
// before it is read, every read and write of a storage in the recorded order, no cycle between
// kernels, and the fused values that are not stored never leave their kernel.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <random>

#include "crucible/forge/Passes.h"
#include "crucible/graph/Analysis.h"
#include "crucible/record/TraceFile.h"
#include "ir_fixture.h"
#include "traces.h"

namespace crucible::forge {
namespace {

using record::ExternalKind;
using record::Phase;
using test::IrFixture;

struct Gen {
  IrFixture f;
  std::mt19937& rng;
  std::vector<std::uint32_t> vals;  // values of the current phase's shape [4, 8]

  explicit Gen(std::mt19937& r) : rng(r) {}

  std::uint32_t pick() {
    const std::size_t back = std::min<std::size_t>(vals.size(), 1 + rng() % 4);
    return vals[vals.size() - 1 - rng() % back];
  }
  std::uint32_t op(const std::string& name, std::vector<std::uint32_t> ins, Phase ph,
                   std::vector<std::int64_t> shape = {4, 8}) {
    return f.op(name, classify_op(name).kind, std::move(ins), std::move(shape), ph);
  }
  std::uint32_t in_place(const std::string& name, std::vector<std::uint32_t> ins, Phase ph) {
    const std::uint64_t storage = f.ir.values[ins[0]].storage;
    const std::uint32_t version = f.ir.values[ins[0]].version + 1;
    const std::uint32_t out = op(name, std::move(ins), ph);
    f.ir.values[out].storage = storage;
    f.ir.values[out].version = version;
    return out;
  }
  std::uint32_t view(std::uint32_t v, Phase ph) {
    const std::uint32_t out = op("aten::view", {v}, ph);
    f.ir.values[out].storage = f.ir.values[v].storage;
    f.ir.values[out].version = f.ir.values[v].version;
    f.ir.values[out].is_view = true;
    return out;
  }

  void phase(Phase ph, int n) {
    for (int i = 0; i < n; ++i) {
      switch (rng() % 9) {
        case 0:
          vals.push_back(op("aten::mm", {pick(), f.input({8, 8}, ExternalKind::Parameter)}, ph));
          break;
        case 1: vals.push_back(op("aten::relu", {pick()}, ph)); break;
        case 2: vals.push_back(op("aten::add.Tensor", {pick(), pick()}, ph)); break;
        case 3: vals.push_back(view(pick(), ph)); break;
        case 4: op("aten::sum.dim_IntList", {pick()}, ph, {4, 1}); break;
        case 5: {  // dropout
          const std::uint32_t x = pick();
          const std::uint32_t m0 = op("aten::empty_like", {x}, ph);
          const std::uint32_t m1 = in_place("aten::bernoulli_.float", {m0}, ph);
          const std::uint32_t m = in_place("aten::div_.Scalar", {m1}, ph);
          vals.push_back(m);
          vals.push_back(op("aten::mul.Tensor", {x, m}, ph));
          break;
        }
        case 6: {  // an in-place update of a value computed earlier
          vals.push_back(in_place("aten::mul_.Tensor", {pick(), pick()}, ph));
          break;
        }
        case 7: {
          const auto id =
              f.node("aten::native_layer_norm", CKernel::Norm, {pick()}, {{4, 8}, {4, 1}}, ph);
          vals.push_back(f.ir.nodes[id].outputs[0]);
          break;
        }
        default: vals.push_back(op("aten::sigmoid", {pick()}, ph)); break;
      }
    }
  }
  // SGD with momentum over k parameters, as torch's per-parameter loop records it.
  void sgd(int k) {
    for (int i = 0; i < k; ++i) {
      const auto p = f.input({4, 8}, ExternalKind::Parameter);
      const auto buf = f.input({4, 8}, ExternalKind::OptimizerState);
      const auto g = vals.empty() ? f.input({4, 8}, ExternalKind::Gradient) : pick();
      const auto b1 = in_place("aten::mul_.Tensor", {buf, buf}, Phase::Optimizer);
      const auto b2 = in_place("aten::add_.Tensor", {b1, g}, Phase::Optimizer);
      in_place("aten::add_.Tensor", {p, b2}, Phase::Optimizer);
    }
  }
};

// Live-out as build_ir001 marks it: unread values, and the last version of external storage.
void mark_live_out(Ir001& ir) {
  std::map<std::uint64_t, std::uint32_t> last;
  std::map<std::uint64_t, bool> external;
  for (const Value& v : ir.values) {
    if (v.producer == kNoNode) external[v.storage] = true;
    else last[v.storage] = std::max(last[v.storage], v.version);
  }
  for (Value& v : ir.values)
    if (v.producer != kNoNode && external[v.storage] && v.version == last[v.storage])
      v.live_out = true;
}

struct Counts {
  std::size_t multi = 0, horizontal = 0, escaping = 0;
};

// What breaks the recording's dataflow in the plan's schedule (kernels in order, each kernel's ops
// in recorded order), or "" when nothing does.
std::string dataflow_error(const Ir001& ir, const Ir002& plan, Counts* counts) {
  std::vector<std::uint32_t> pos(ir.nodes.size(), UINT32_MAX), group_of(ir.nodes.size());
  std::uint32_t at = 0;
  for (const FusionGroup& grp : plan.groups) {
    counts->multi += grp.nodes.size() > 1;
    counts->horizontal += grp.kernel == KernelTemplate::Optimizer;
    for (std::uint32_t n : grp.nodes) {
      if (pos[n] != UINT32_MAX) return "node " + std::to_string(n) + " in two kernels";
      pos[n] = at++;
      group_of[n] = grp.id;
    }
  }
  for (std::uint32_t n = 0; n < ir.nodes.size(); ++n)
    if (pos[n] == UINT32_MAX) return "node " + std::to_string(n) + " in no kernel";
  for (std::uint32_t n = 0; n < ir.nodes.size(); ++n) {
    for (std::uint32_t v : ir.nodes[n].inputs) {
      const std::uint32_t p = ir.values[v].producer;
      if (p == kNoNode) continue;
      if (pos[p] >= pos[n]) return "v" + std::to_string(v) + " read before it is written";
      // Kernels form a DAG in their order: a kernel reads only what earlier ones wrote.
      if (group_of[p] > group_of[n]) return "kernel order: v" + std::to_string(v);
    }
  }
  // Storage order: any two accesses of one storage, at least one a write, keep their order.
  std::map<std::uint64_t, std::vector<std::pair<std::uint32_t, bool>>> access;  // node, writes
  for (std::uint32_t n = 0; n < ir.nodes.size(); ++n) {
    std::map<std::uint64_t, bool> mine;
    for (std::uint32_t v : ir.nodes[n].inputs)
      if (ir.values[v].storage != 0) mine.emplace(ir.values[v].storage, false);
    for (std::uint32_t v : ir.nodes[n].outputs)
      if (ir.values[v].storage != 0) mine[ir.values[v].storage] |= !ir.values[v].is_view;
    for (const auto& [st, w] : mine) access[st].push_back({n, w});
  }
  for (const auto& [st, list] : access)
    for (std::size_t i = 0; i < list.size(); ++i)
      for (std::size_t j = i + 1; j < list.size(); ++j)
        if ((list[i].second || list[j].second) && pos[list[i].first] > pos[list[j].first])
          return "nodes " + std::to_string(list[i].first) + " and " +
                 std::to_string(list[j].first) + " swapped on a storage";
  // A fused value that is not stored is read only inside its kernel and is not live-out.
  std::vector<bool> stored(ir.values.size(), false);
  for (const KernelNode& k : plan.kernels)
    for (std::uint32_t v : k.outputs) stored[v] = true;
  for (const Edge& e : plan.edges) {
    if (e.state != EdgeState::Fused) continue;
    if (stored[e.value]) {
      ++counts->escaping;
      continue;
    }
    if (ir.values[e.value].live_out) return "live-out v" + std::to_string(e.value) + " not stored";
    for (std::uint32_t n = 0; n < ir.nodes.size(); ++n)
      for (std::uint32_t v : ir.nodes[n].inputs)
        if (v == e.value && group_of[n] != e.to_group)
          return "unstored v" + std::to_string(e.value) + " read by another kernel";
  }
  return "";
}

TEST(FusionProperty, FusedPlansKeepTheRecordedDataflow) {
  auto rules = load_rules_dir(CRUCIBLE_RULES_DIR, "cpu-avx2");
  ASSERT_TRUE(rules.ok()) << rules.status();
  std::mt19937 rng(20240607);
  std::size_t multi = 0, horizontal = 0, escaping = 0;
  for (int trial = 0; trial < 400; ++trial) {
    Gen g(rng);
    g.vals = {g.f.input({4, 8}), g.f.input({4, 8})};
    g.phase(Phase::Forward, 3 + static_cast<int>(rng() % 12));
    g.phase(Phase::Backward, static_cast<int>(rng() % 10));
    g.sgd(static_cast<int>(rng() % 4));
    Ir001& ir = g.f.done();
    mark_live_out(ir);
    ASSERT_TRUE(verify(ir).ok()) << verify(ir);

    PassContext ctx;
    ctx.rules = &*rules;
    ctx.budget_micros = 1e12;
    auto seeded = fuse_horizontal(ir, ctx);
    ASSERT_TRUE(seeded.ok()) << seeded.status();
    auto groups = fuse(ir, ctx, std::move(*seeded));
    ASSERT_TRUE(groups.ok()) << groups.status();
    auto plan = lower(ir, std::move(*groups), ctx);
    ASSERT_TRUE(plan.ok()) << "trial " << trial << ": " << plan.status();

    Counts c;
    const std::string broken = dataflow_error(ir, *plan, &c);
    ASSERT_EQ(broken, "") << "trial " << trial;
    multi += c.multi;
    horizontal += c.horizontal;
    escaping += c.escaping;
  }
  // The generator exercises what it tests.
  EXPECT_GT(multi, 300u);
  EXPECT_GT(horizontal, 100u);
  EXPECT_GT(escaping, 100u);
}

TEST(FusionProperty, RecordedModelsKeepTheirDataflow) {
  if (!std::filesystem::exists(traces_dir() / "index.json")) GTEST_SKIP() << "no recorded traces";
  for (const char* cls : {"cpu-avx2", "h200"}) {
    auto rules = load_rules_dir(CRUCIBLE_RULES_DIR, cls);
    ASSERT_TRUE(rules.ok()) << rules.status();
    std::size_t models = 0;
    for (const auto& e : std::filesystem::directory_iterator(traces_dir())) {
      if (e.path().extension() != ".crtrace") continue;
      auto t = record::load_trace(e.path().string());
      ASSERT_TRUE(t.ok()) << e.path();
      auto it = graph::analyze_latest_iteration(*t, -1);
      ASSERT_TRUE(it.ok()) << e.path() << ": " << it.status();
      ExprPool pool;
      auto ir = build_ir001(*t, (*it)->ops(), pool);
      ASSERT_TRUE(ir.ok()) << e.path();
      auto fe = run_front_end(std::move(*ir), *rules, Policy{}, 1e15);
      ASSERT_TRUE(fe.ok()) << e.path() << ": " << fe.status();
      Counts c;
      EXPECT_EQ(dataflow_error(fe->ir, fe->plan, &c), "") << cls << " " << e.path();
      EXPECT_EQ(c.horizontal, 1u) << cls << " " << e.path() << ": one optimizer update";
      ++models;
    }
    EXPECT_GE(models, 4u);
  }
}

}  // namespace
}  // namespace crucible::forge
