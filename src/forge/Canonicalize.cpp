// Canonicalize.cpp — views alias their input, in-place ops are marked, no-op views are dropped.
//
// After this pass: every VIEW node's output aliases its first input (alias_of) and is flagged a
// view; every "op_" (trailing underscore: add_, mul_, zero_, _foreach_add_ ...) is in_place and
// mutates its first input; a view/reshape/alias/expand whose output has its input's shape and
// dtype is removed and its users read the input (element order is unchanged by those four when
// the shape is), unless Python may observe the view (live-out).
#include <string>

#include "IrEdit.h"
#include "crucible/forge/Passes.h"

namespace crucible::forge {
namespace {

std::string_view base_name(std::string_view op) {
  const auto colons = op.find("::");
  if (colons != std::string_view::npos) op.remove_prefix(colons + 2);
  const auto dot = op.find('.');
  return dot == std::string_view::npos ? op : op.substr(0, dot);
}

bool shape_preserving_view(std::string_view base) {
  return base == "view" || base == "reshape" || base == "_reshape_alias" || base == "alias" ||
         base == "expand" || base == "_unsafe_view";
}

}  // namespace

Result<Ir001> canonicalize(Ir001 ir, PassContext& ctx) {
  ctx.start("canonicalize", ir.nodes.size());
  std::vector<bool> keep(ir.nodes.size(), true);
  std::size_t i = 0;
  for (; i < ir.nodes.size(); ++i) {
    if (ctx.over()) break;  // the rest stays as recorded
    Node& n = ir.nodes[i];
    const std::string_view base = base_name(n.op);
    if (!base.empty() && base.back() == '_' && !n.inputs.empty()) {
      n.in_place = true;
      n.mutates = true;
    }
    if (n.kind != CKernel::View || n.inputs.empty() || n.outputs.size() != 1) continue;
    n.alias_of = n.inputs[0];
    Value& out = ir.values[n.outputs[0]];
    out.is_view = true;
    const Value& in = ir.values[n.inputs[0]];
    if (shape_preserving_view(base) && out.shape == in.shape && out.dtype == in.dtype && !out.live_out) {
      detail::replace_uses(ir, n.outputs[0], n.inputs[0]);
      keep[i] = false;
    }
  }
  Ir001 result = detail::compact(ir, keep);
  ctx.finish(result.nodes.size());
  return result;
}

}  // namespace crucible::forge
