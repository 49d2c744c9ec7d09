// built_plan_test — the CPU backend on a plan from Forge's front end and build_plan (not built
// by hand): a view, mm + relu fused by a rule (mm a library call, relu generated), a Python
// number, alpha, abs, neg, a full sum (generated in ATen's order, Note [Generated sums]; over
// these 20 fixed values the reference's sum, accumulated in double and rounded once, has the
// same bits — a regression check, not a check of the order: 20 values never reach the
// cascade's 16-vector steps) and an in-place optimizer
// update (alpha = lr); every pointwise call and the sum are generated, and three steps (the
// state carried over, then scalars and the number patched) give the null backend's bits.
#include <gtest/gtest.h>

#include <bit>

#include "../exec/step_fixture.h"
#include "chain_plan.h"
#include "crucible/exec/NullBackend.h"
#include "crucible/exec/Runner.h"
#include "crucible/mimic/CpuBackend.h"

namespace crucible::mimic {
namespace {

using exec::test::double_arg;
using exec::test::StepBuilder;

// mm and sum go to the exec tests' reference kernels; the elementwise ops to the loop provider
// (the strict semantics the generated kernels follow).
struct MixedProvider {
  exec::test::ReferenceProvider ref;
  test::LoopProvider loops;
  Status call(const exec::LibraryCall& c) {
    return c.op == "aten::mm" || c.op == "aten::sum" ? ref.call(c) : loops.call(c);
  }
  exec::Provider provider() {
    return exec::Provider{this, [](void* self, const exec::LibraryCall& c) {
                            return static_cast<MixedProvider*>(self)->call(c);
                          }};
  }
};

struct Step {
  StepBuilder b;
  std::uint32_t third = 0, add_node = 0, update_node = 0;
  Step() {
    const auto x = b.external({4, 3}, record::ExternalKind::Input);
    const auto w = b.external({5, 3}, record::ExternalKind::Parameter);
    const auto v = b.external({4, 5}, record::ExternalKind::OptimizerState);
    const auto g = b.external({4, 5}, record::ExternalKind::Gradient);
    third = b.number(0.3);
    const auto wt = b.view("aten::t", w, {3, 5}, {1, 3});
    const auto h = b.op("aten::mm", {x, wt}, {4, 5});
    const auto r = b.op("aten::relu", {h}, {4, 5});
    const auto m = b.op("aten::mul.Tensor", {r, third}, {4, 5});
    add_node = static_cast<std::uint32_t>(b.ir.nodes.size());
    const auto a = b.op("aten::add.Tensor", {m, g}, {4, 5}, {double_arg(2, 1.0)});
    const auto q = b.op("aten::neg", {b.op("aten::abs", {a}, {4, 5})}, {4, 5});
    b.op("aten::sum", {q}, {});
    update_node = static_cast<std::uint32_t>(b.ir.nodes.size());
    b.in_place("aten::add_.Tensor", v, {q}, {double_arg(2, -0.1)});
    b.done();
  }
};

TEST(CpuBackendOnABuiltPlan, GeneratesThePointwiseKernelsAndMatchesTheNullBackend) {
  if (host_target().triple.rfind("x86_64", 0) != 0) GTEST_SKIP() << "sums are generated on x86-64 only";
  Step st;
  auto fe = forge::run_front_end(st.b.ir, exec::test::test_rules(), forge::Policy{}, 1e15);
  ASSERT_TRUE(fe.ok()) << fe.status();
  exec::PlanOptions opt;
  opt.scalar_patches = {{st.add_node, 0, "alpha"}, {st.update_node, 0, "lr"}};
  opt.constant_patches = {{st.third, "third"}};
  auto plan = exec::build_plan(fe->ir, fe->plan, opt);
  ASSERT_TRUE(plan.ok()) << plan.status();

  auto cpu = CpuBackend::make(CpuBackendOptions::memory_only());
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  MixedProvider cpu_provider, null_provider;
  auto on_cpu = exec::Runner::make(*plan, (*cpu)->backend(), cpu_provider.provider());
  ASSERT_TRUE(on_cpu.ok()) << on_cpu.status();
  auto on_null = exec::Runner::make(*plan, exec::null_backend(), null_provider.provider());
  ASSERT_TRUE(on_null.ok()) << on_null.status();

  // mul, add, abs, neg, sum and the update are generated; in mm + relu the mm is a library call
  // and the relu generated (Note [Kernel runs]).
  EXPECT_EQ((*cpu)->generated_kernels(), 6u) << exec::describe(*plan);
  for (std::uint32_t k = 0; k < plan->kernels.size(); ++k) {
    const exec::Kernel& kn = plan->kernels[k];
    const CpuKernelState& s = (*cpu)->kernels()[k];
    if (kn.call_count == 0) {  // t(w): a view kernel, no calls
      EXPECT_FALSE(s.generated);
      continue;
    }
    const std::string& first = plan->op_names[plan->calls[kn.call_begin].op];
    EXPECT_EQ(s.generated, first != "aten::mm") << first;
    EXPECT_EQ(s.generated_calls, first == "aten::mm" ? 1u : kn.call_count);
    if (!s.generated) {
      EXPECT_NE(s.why.find(first), std::string::npos) << s.why;
    }
  }

  std::vector<float> x(12), w(15), v_cpu(20), g(20), s_cpu(1), s_null(1);
  for (int i = 0; i < 12; ++i) x[i] = 0.37f * static_cast<float>(i) - 2.0f;
  for (int i = 0; i < 15; ++i) w[i] = 0.21f * static_cast<float>(i % 7) - 0.6f;
  for (int i = 0; i < 20; ++i) v_cpu[i] = 0.1f * static_cast<float>(i), g[i] = 1.1f - 0.13f * i;
  std::vector<float> v_null = v_cpu;
  auto bind = [&](std::vector<float>& v) {
    std::vector<void*> in;
    for (std::uint32_t s : plan->inputs) {
      const std::uint64_t id = plan->slots[s].storage;  // x 1, w 2, v 3, g 4
      in.push_back(id == 1 ? x.data() : id == 2 ? w.data() : id == 3 ? v.data() : g.data());
    }
    return in;
  };
  ASSERT_EQ(plan->patches.size(), 3u);
  for (int step = 0; step < 3; ++step) {
    std::vector<std::uint64_t> patches;
    if (step == 2)  // alpha, lr, the Python number: new values, as a scheduler would set
      for (const exec::PatchPoint& p : plan->patches)
        patches.push_back(std::bit_cast<std::uint64_t>(p.name == "alpha" ? -1.0
                                                       : p.name == "lr"  ? -0.037
                                                                         : 2.5));
    const auto in_cpu = bind(v_cpu), in_null = bind(v_null);
    void* out_cpu[] = {s_cpu.data()};
    void* out_null[] = {s_null.data()};
    ASSERT_TRUE((*on_cpu)->run(exec::RunArgs{in_cpu, out_cpu, patches}).ok());
    ASSERT_TRUE((*on_null)->run(exec::RunArgs{in_null, out_null, patches}).ok());
    EXPECT_EQ(std::bit_cast<std::uint32_t>(s_cpu[0]), std::bit_cast<std::uint32_t>(s_null[0]))
        << "step " << step;
    for (int i = 0; i < 20; ++i)
      EXPECT_EQ(std::bit_cast<std::uint32_t>(v_cpu[i]), std::bit_cast<std::uint32_t>(v_null[i]))
          << "step " << step << " v[" << i << "]";
  }
  // The library calls the CPU backend made: mm, three steps. The
  // update's alpha (the lr) is neither 1 nor -1, and no input of it is broadcast: it runs
  // generated, rounded as ATen rounds it (Note [ATen's alpha rounding]).
  EXPECT_EQ(cpu_provider.ref.calls + cpu_provider.loops.calls, 3);
  EXPECT_EQ((*cpu)->library_launches(), 0u);
}

}  // namespace
}  // namespace crucible::mimic
