// Pipeline.cpp — the one ordered list of Forge's front-end passes, and phase timing.
#include <chrono>

#include "crucible/forge/Digest.h"
#include "crucible/forge/Passes.h"

namespace crucible::forge {

void PassContext::start(std::string name, std::size_t nodes) {
  PhaseReport r;
  r.name = std::move(name);
  r.budget_micros = budget_micros;
  r.nodes_before = nodes;
  phases.push_back(std::move(r));
  t0_ = std::chrono::steady_clock::now();
}

bool PassContext::over() const {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0_).count() >=
         budget_micros;
}

void PassContext::finish(std::size_t nodes_after, std::size_t opaque_fallback) {
  PhaseReport& r = phases.back();
  r.micros = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0_).count();
  r.over_budget = r.micros >= r.budget_micros;
  r.nodes_after = nodes_after;
  r.opaque_fallback = opaque_fallback;
}

Result<FrontEndResult> run_front_end(Ir001 ir, const RuleSet& rules, const Policy& policy,
                                     double budget_micros) {
  PassContext ctx;
  ctx.rules = &rules;
  ctx.policy = policy;
  ctx.budget_micros = budget_micros;
  CRUCIBLE_RETURN_IF_ERROR(verify(ir));
  if (!policy.training) {
    // An inference plan of a training step would plan its backward and optimizer as if they
    // were inference: refuse instead of producing a plan nobody asked for.
    std::size_t not_forward = 0;
    for (const Node& n : ir.nodes) not_forward += n.phase != record::Phase::Forward ? 1 : 0;
    if (not_forward > 0) {
      return invalid_input("the trace is a training step (" + std::to_string(not_forward) +
                               " backward/optimizer ops) but the policy asks for an inference plan",
                           "record the model's forward pass under torch.no_grad() (or eval) for an "
                           "inference plan, or plan this trace for training");
    }
  }
  // The pass list, in order. Each is IR -> IR (see Passes.h).
  for (auto pass : {&canonicalize, &dce, &cse}) {
    auto next = pass(std::move(ir), ctx);
    if (!next.ok()) return next.status();
    ir = std::move(*next);
  }
  std::size_t recomputed = 0;
  if (policy.rematerialize) {
    auto next = rematerialize(std::move(ir), ctx, &recomputed);
    if (!next.ok()) return next.status();
    ir = std::move(*next);
  }
  CRUCIBLE_RETURN_IF_ERROR(verify(ir));
  auto seeded = fuse_horizontal(ir, ctx);
  if (!seeded.ok()) return seeded.status();
  auto groups = fuse(ir, ctx, std::move(*seeded));
  if (!groups.ok()) return groups.status();
  auto plan = lower(ir, std::move(*groups), ctx);
  if (!plan.ok()) return plan.status();
  FrontEndResult out;
  out.plan_text = canonical_plan_text(ir, *plan, rules);
  out.plan_digest = plan_text_digest(out.plan_text);  // rules= header field excluded
  out.ir = std::move(ir);
  out.plan = std::move(*plan);
  out.phases = std::move(ctx.phases);
  out.recomputed = recomputed;
  return out;
}

}  // namespace crucible::forge
