// Passes.h — Forge's front-end passes, each a function from IR to IR in its own file, and the one
// ordered list that runs them (Pipeline.cpp).
//
//   canonicalize  (Canonicalize.cpp)  views alias their input, in-place ops marked, no-op views dropped
//   dce           (Dce.cpp)           nodes no live-out value or mutation depends on removed
//   cse           (Cse.cpp)           identical pure nodes (op, inputs, scalars) merged
//   fuse_horizontal (FuseHorizontal.cpp) horizontal rules: runs of identical per-tensor op
//                                     sequences (an optimizer's per-parameter update) -> one group
//   fuse          (Fuse.cpp)          rules matched into fusion groups (IR001 -> groups)
//   lower         (Lower.cpp)         groups -> IR002 kernels pinned to recipes, edges classified
//
// Every phase's wall time is measured against its budget. A phase over budget stops transforming:
// the untouched rest of its region stays as it was — for fuse, each remaining node becomes its own
// OPAQUE group (run op by op) — and the report says so. Nothing blocks on a slow phase.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "crucible/core/Status.h"
#include "crucible/forge/Ir001.h"
#include "crucible/forge/Ir002.h"
#include "crucible/forge/Rules.h"

namespace crucible::forge {

struct PhaseReport {
  std::string name;
  double micros = 0;
  double budget_micros = 0;
  bool over_budget = false;
  std::size_t nodes_before = 0, nodes_after = 0;
  std::size_t opaque_fallback = 0;  // nodes left OPAQUE because the budget ran out
};

struct PassContext {
  const RuleSet* rules = nullptr;
  Policy policy;
  double budget_micros = 50'000;  // per phase (50 ms); 0 = over budget immediately (tests)
  std::vector<PhaseReport> phases;
  // Phase timing helpers: start() before, finish() after; over() polls inside long loops.
  void start(std::string name, std::size_t nodes);
  bool over() const;
  void finish(std::size_t nodes_after, std::size_t opaque_fallback = 0);

 private:
  std::chrono::steady_clock::time_point t0_{};
};

Result<Ir001> canonicalize(Ir001 ir, PassContext& ctx);
Result<Ir001> dce(Ir001 ir, PassContext& ctx);
// Note [Fresh copies] (CopyForward.cpp): AccumulateGrad's new_empty_strided + copy_ of a gradient
// nothing else reads is removed, its readers reading the gradient itself. Not part of
// run_front_end: only for a caller that binds the uncopied gradient (crucible.compile).
Result<Ir001> forward_fresh_copies(Ir001 ir, std::size_t* forwarded = nullptr);
Result<Ir001> cse(Ir001 ir, PassContext& ctx);
// Note [Rematerialization] (Remat.cpp): a forward pointwise value the backward reads, whose
// inputs the backward keeps anyway, computed again right before its first backward reader
// instead of kept across. Runs after cse (which would merge the copy back) when the policy asks
// (Policy::rematerialize); `recomputed` gets how many nodes were copied.
Result<Ir001> rematerialize(Ir001 ir, PassContext& ctx, std::size_t* recomputed = nullptr);
// Multi-tensor groups from the horizontal rules (Note [Horizontal rules]); the nodes they hold
// are seeded into fuse(). Errors: those of applicable_rules().
Result<std::vector<FusionGroup>> fuse_horizontal(const Ir001& ir, PassContext& ctx);
// Groups every node exactly once: the seeded groups as they are, every other node by the
// vertical rules. Errors: an uncovered node (no rule, not even a fallback one, matches it), a
// rule reading a setting the policy does not state, a seeded node out of range or seeded twice.
Result<std::vector<FusionGroup>> fuse(const Ir001& ir, PassContext& ctx,
                                      std::vector<FusionGroup> seeded = {});
Result<Ir002> lower(const Ir001& ir, std::vector<FusionGroup> groups, PassContext& ctx);

struct FrontEndResult {
  Ir001 ir;   // after canonicalize, dce, cse (verified)
  Ir002 plan;
  std::vector<PhaseReport> phases;
  std::string plan_text;    // canonical_plan_text(ir, plan, rules)
  std::string plan_digest;  // SHA-256 hex of plan_text
  std::size_t recomputed = 0;  // nodes rematerialize copied (Policy::rematerialize)
};
// The ordered pipeline: verify, canonicalize, dce, cse, verify, fuse_horizontal, fuse, lower,
// digest. An
// inference policy (training = false) on a trace with backward or optimizer ops is an error.
Result<FrontEndResult> run_front_end(Ir001 ir, const RuleSet& rules, const Policy& policy,
                                     double budget_micros = 50'000);

}  // namespace crucible::forge
