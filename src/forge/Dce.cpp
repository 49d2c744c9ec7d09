// Dce.cpp — dead-code elimination: a node stays if it draws random numbers (the generator's
// state is observable), is OPAQUE or COLLECTIVE, produces a value that a kept node reads or that
// is live-out (Note [Live-out] in Ir001.h), or mutates anything but local storage. Everything
// else is removed.
//
// A mutating node goes too when it has results, none needed, and every storage it touches is
// local: each value of the storage in the IR has a producer. A write the trace does not show as
// a result (a running statistic updated in place) and that a later node reads makes that read's
// value one without a producer, so its storage is not local and the node stays. What this
// removes: AccumulateGrad's copy of a gradient (new_empty_strided + copy_) when the caller says
// that only the original escapes (Note [Exec replay], vessel/torch/ReplayPlan.h).
#include "IrEdit.h"
#include "absl/container/flat_hash_set.h"
#include "crucible/forge/Passes.h"

namespace crucible::forge {

Result<Ir001> dce(Ir001 ir, PassContext& ctx) {
  ctx.start("dce", ir.nodes.size());
  std::vector<bool> needed_value(ir.values.size(), false), keep(ir.nodes.size(), false);
  for (std::size_t v = 0; v < ir.values.size(); ++v) needed_value[v] = ir.values[v].live_out;
  // Storages with a value from outside the IR (no producer): not local.
  absl::flat_hash_set<std::uint64_t> outside;
  for (const Value& v : ir.values)
    if (v.producer == kNoNode) outside.insert(v.storage);
  auto local_only = [&](const Node& n) {
    if (n.outputs.empty()) return false;
    for (int o = 0; o < 2; ++o)
      for (std::uint32_t v : o ? n.outputs : n.inputs) {
        const std::uint64_t s = ir.values[v].storage;
        if (s == 0 || outside.contains(s)) return false;
      }
    return true;
  };
  for (std::size_t i = ir.nodes.size(); i-- > 0;) {
    const Node& n = ir.nodes[i];
    // Over budget: keep the rest (removal is an optimization, keeping is always correct).
    bool need = ctx.over() || n.kind == CKernel::Rng || n.kind == CKernel::Opaque ||
                n.kind == CKernel::Collective || ((n.mutates || n.in_place) && !local_only(n));
    for (std::uint32_t v : n.outputs) need |= needed_value[v];
    if (!need) continue;
    keep[i] = true;
    for (std::uint32_t v : n.inputs) needed_value[v] = true;
  }
  Ir001 out = detail::compact(ir, keep);
  ctx.finish(out.nodes.size());
  return out;
}

}  // namespace crucible::forge
