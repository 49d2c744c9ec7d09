// verify_test — verify_plan refuses corrupt plans, each with a message naming what broke; the
// plan the builder made passes, and a Runner refuses to run a corrupt one.
#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "crucible/exec/NullBackend.h"
#include "crucible/exec/Runner.h"
#include "crucible/exec/VerifyPlan.h"
#include "step_fixture.h"

namespace crucible::exec {
namespace {

// mm -> relu -> mul(0.5) -> add -> sum, as in plan_test but without the state update.
ExecutionPlan small_plan() {
  test::StepBuilder b;
  const std::uint32_t x = b.external({4, 3}, record::ExternalKind::Input);
  const std::uint32_t w = b.external({3, 5}, record::ExternalKind::Parameter);
  const std::uint32_t half = b.number(0.5);
  const std::uint32_t h = b.op("aten::mm", {x, w}, {4, 5});
  const std::uint32_t r = b.op("aten::relu", {h}, {4, 5});
  const std::uint32_t m = b.op("aten::mul.Tensor", {r, half}, {4, 5});
  const std::uint32_t a = b.op("aten::add.Tensor", {m, r}, {4, 5});
  b.op("aten::sum", {a}, {});
  b.done();
  auto fe = forge::run_front_end(b.ir, test::test_rules(), forge::Policy{}, 1e15);
  EXPECT_TRUE(fe.ok()) << fe.status();
  auto plan = build_plan(fe->ir, fe->plan);
  EXPECT_TRUE(plan.ok()) << plan.status();
  return *plan;
}

// The index of the first slot of `kind` produced at or after call `from`.
std::uint32_t slot_of_kind(const ExecutionPlan& p, SlotKind kind, std::uint32_t from = 0) {
  for (std::uint32_t s = 0; s < p.slots.size(); ++s)
    if (p.slots[s].kind == kind && p.slots[s].first >= from) return s;
  ADD_FAILURE() << "no " << slot_kind_name(kind) << " slot from call " << from;
  return 0;
}

struct Corruption {
  const char* what;
  std::function<void(ExecutionPlan&)> corrupt;
  const char* message;  // a part of the error
};

TEST(VerifyPlan, TheBuiltPlanPasses) {
  const ExecutionPlan p = small_plan();
  EXPECT_TRUE(verify_plan(p).ok()) << verify_plan(p);
}

TEST(VerifyPlan, RefusesCorruptPlansSayingWhatBroke) {
  const Corruption cases[] = {
      {"two arena slots live together at one offset",
       [](ExecutionPlan& p) {
         // relu's output r lives from relu to add; mul's output m lives over mul..add: together.
         std::uint32_t r = kNone, m = kNone;
         for (const Call& c : p.calls) {
           const std::uint32_t out = p.tensors[p.args[c.out_begin].tensor].slot;
           if (p.op_names[c.op] == "aten::relu") r = out;
           if (p.op_names[c.op] == "aten::mul.Tensor") m = out;
         }
         p.slots[m].offset = p.slots[r].offset;
       },
       "overlap in the arena"},
      {"a misaligned offset",
       [](ExecutionPlan& p) { p.slots[slot_of_kind(p, SlotKind::Arena)].offset += 8; },
       "not aligned"},
      {"a slot past the arena's end",
       [](ExecutionPlan& p) { p.slots[slot_of_kind(p, SlotKind::Arena)].offset = p.arena_bytes; },
       "ends past the arena"},
      {"an alignment that is not a power of two", [](ExecutionPlan& p) { p.alignment = 48; },
       "not a power of two"},
      {"a read before the producing call",
       [](ExecutionPlan& p) {
         // The first call reads the slot the last call writes, which is made to live from 0.
         const Call& last = p.calls.back();
         const std::uint32_t t = p.args[last.out_begin].tensor;
         p.slots[p.tensors[t].slot].first = 0;
         p.args[p.calls[0].in_begin].tensor = t;
       },
       "before any call writes it"},
      {"a use outside the slot's lifetime",
       [](ExecutionPlan& p) {
         const std::uint32_t s = slot_of_kind(p, SlotKind::Arena);
         p.slots[s].last = p.slots[s].first;
       },
       "outside its lifetime"},
      {"a tensor reaching past its slot",
       [](ExecutionPlan& p) {
         const Call& c = p.calls[0];
         const TensorRef& t = p.tensors[p.args[c.out_begin].tensor];
         p.dims[t.dims] *= 100;  // sizes first
       },
       "reaches byte"},
      {"a tensor of no known dtype", [](ExecutionPlan& p) { p.tensors[0].dtype = 100; },
       "of no known size"},
      {"kernels that skip a call", [](ExecutionPlan& p) { p.kernels.back().call_count += 1; },
       "kernels run"},
      {"an input bound twice", [](ExecutionPlan& p) { p.inputs.push_back(p.inputs[0]); },
       "input binding 2"},
      {"an output slot without its binding",
       [](ExecutionPlan& p) { p.slots[slot_of_kind(p, SlotKind::Output)].binding = 7; },
       "does not name it"},
      {"a call writing a constant",
       [](ExecutionPlan& p) {
         const std::uint32_t c = slot_of_kind(p, SlotKind::Constant);
         for (TensorRef& t : p.tensors)
           if (t.slot == c)
             p.args[p.calls[0].out_begin].tensor =
                 static_cast<std::uint32_t>(&t - p.tensors.data());
       },
       "constant"},
      {"a patch naming nothing",
       [](ExecutionPlan& p) { p.patches.push_back(PatchPoint{PatchKind::Scalar, 1000, "lr"}); },
       "('lr')"},
      {"a call naming no op", [](ExecutionPlan& p) { p.calls[1].op = 99; }, "names no op"},
      {"an argument range out of bounds", [](ExecutionPlan& p) { p.calls.back().out_count = 50; },
       "out of bounds"},
  };
  for (const Corruption& c : cases) {
    ExecutionPlan p = small_plan();
    c.corrupt(p);
    const Status st = verify_plan(p);
    ASSERT_FALSE(st.ok()) << c.what << " passed";
    EXPECT_NE(st.message().find(c.message), std::string_view::npos) << c.what << ": " << st;
  }
}

TEST(VerifyPlan, RunnerRefusesACorruptPlan) {
  ExecutionPlan p = small_plan();
  p.alignment = 3;
  test::ReferenceProvider ref;
  auto r = Runner::make(p, null_backend(), ref.provider());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("power of two"), std::string_view::npos) << r.status();
}

}  // namespace
}  // namespace crucible::exec
