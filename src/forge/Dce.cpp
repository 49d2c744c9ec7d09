// Dce.cpp — dead-code elimination: a node stays if it mutates, draws random numbers (the
// generator's state is observable), or produces a value that a kept node reads or that is
// live-out (Note [Live-out] in Ir001.h). Everything else is removed.
#include "IrEdit.h"
#include "crucible/forge/Passes.h"

namespace crucible::forge {

Result<Ir001> dce(Ir001 ir, PassContext& ctx) {
  ctx.start("dce", ir.nodes.size());
  std::vector<bool> needed_value(ir.values.size(), false), keep(ir.nodes.size(), false);
  for (std::size_t v = 0; v < ir.values.size(); ++v) needed_value[v] = ir.values[v].live_out;
  for (std::size_t i = ir.nodes.size(); i-- > 0;) {
    const Node& n = ir.nodes[i];
    // Over budget: keep the rest (removal is an optimization, keeping is always correct).
    bool need = ctx.over() || n.mutates || n.in_place || n.kind == CKernel::Rng ||
                n.kind == CKernel::Opaque || n.kind == CKernel::Collective;
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
