// BuildPlan.h — an execution plan from Forge's IR: the step's IR001 (after the passes) and the
// IR002 that lowering made of it. No third IR: the plan is tables over IR001's nodes and values,
// in IR002's kernel order.
//
// Every kernel is a sequence of library calls, one per IR001 node that does work (a VIEW node
// whose outputs alias its input's storage becomes tensors, not a call). So each fused value
// still gets memory: a backend that generates a kernel for a group does not need it, and the
// plan places it anyway (short-lived, it costs the arena little). Slots are storages; memory is
// placed by the graph stage's planner (graph::place_in_arena).
//
// plan_step runs the whole way from a recorded iteration: build_ir001 → run_front_end
// (canonicalize, dce, cse, fuse by the rules, lower) → build_plan.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "crucible/core/Status.h"
#include "crucible/exec/ExecutionPlan.h"
#include "crucible/forge/Ir001.h"
#include "crucible/forge/Ir002.h"
#include "crucible/forge/Rules.h"
#include "crucible/record/Trace.h"

namespace crucible::exec {

struct PlanOptions {
  std::uint64_t alignment = 64;  // of every arena offset; a power of two up to 2^30
  // The values the caller reads after the step (Python holds them). Unset: every live-out value
  // (Note [Live-out], Ir001.h), which includes outputs nothing reads (a layer norm's mean). A
  // produced storage holding one of them is an Output slot; the others are in the arena.
  std::optional<std::vector<std::uint32_t>> escaping;
  // Scalar arguments the caller sets each run: node, position in its scalars, a name.
  struct ScalarPatch {
    std::uint32_t node = 0;
    std::uint32_t scalar = 0;
    std::string name;
  };
  std::vector<ScalarPatch> scalar_patches;
  // Python numbers (wrapped 0-d tensors) the caller sets each run: value id, a name.
  struct ConstantPatch {
    std::uint32_t value = 0;
    std::string name;
  };
  std::vector<ConstantPatch> constant_patches;
};

// The plan of `ir` as `ir2` groups it. Errors: a symbolic IR or one whose geometry is not a
// recording's (build from one recording, or from a recording at the batch to run), a hand-built
// IR without strides, a tensor without storage that is not a Python number, a produced storage
// read before it is written, a patch naming nothing. The plan returned passes verify_plan.
Result<ExecutionPlan> build_plan(const forge::Ir001& ir, const forge::Ir002& ir2,
                                 const PlanOptions& options = {});

// The recorded iteration `ops` of `t` through Forge's front end (each phase within
// budget_micros, as run_front_end) and build_plan.
struct SteppedPlan {
  forge::Ir001 ir;  // after the passes
  forge::Ir002 ir2;
  ExecutionPlan plan;
};
Result<SteppedPlan> plan_step(const record::Trace& t, std::span<const std::size_t> ops,
                              forge::ExprPool& pool, const forge::RuleSet& rules,
                              const forge::Policy& policy, const PlanOptions& options = {},
                              double budget_micros = 50'000);

}  // namespace crucible::exec
