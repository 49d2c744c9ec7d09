// Canonicalize.cpp — views alias their input, in-place ops are marked, no-op views are dropped.
//
// After this pass: every VIEW node's output aliases its first input (alias_of) and is flagged a
// view; every "op_" (trailing underscore: add_, mul_, zero_, _foreach_add_ ...; "__iand__" but
// not "__and__") is in_place and mutates its first input; removed, with users reading the input,
// unless Python may observe the result (live-out): a view/reshape/alias/expand whose output has
// its input's shape and dtype (element order is unchanged by those when the shape is), and an
// op that returned its own input (to() to the same dtype, contiguous() of a contiguous tensor).
#include <string>

#include "IrEdit.h"
#include "crucible/forge/Passes.h"

namespace crucible::forge {
namespace {

bool shape_preserving_view(std::string_view base) {
  return base == "view" || base == "reshape" || base == "_reshape_alias" || base == "alias" ||
         base == "expand" || base == "_unsafe_view";
}

// Ops that may hand back their input itself (same TensorImpl or an alias with equal geometry).
bool identity_capable(std::string_view base) {
  return base == "to" || base == "contiguous" || base == "detach" || base == "alias" ||
         base == "type_as" || base == "lift_fresh";
}

}  // namespace

Result<Ir001> canonicalize(Ir001 ir, PassContext& ctx) {
  ctx.start("canonicalize", ir.nodes.size());
  std::vector<bool> keep(ir.nodes.size(), true);
  std::size_t i = 0;
  for (; i < ir.nodes.size(); ++i) {
    if (ctx.over()) break;  // the rest stays as recorded
    Node& n = ir.nodes[i];
    const std::string_view base = detail::base_name(n.op);
    // "add_" is in place; a dunder ("__and__") is not, except the in-place ones ("__iand__").
    const bool dunder = base.size() > 4 && base.starts_with("__") && base.ends_with("__");
    const bool in_place = dunder ? base.starts_with("__i") : (!base.empty() && base.back() == '_');
    if (in_place && !n.inputs.empty()) {
      n.in_place = true;
      n.mutates = true;
    }
    // An op that returned its input unchanged (to() to the same dtype and device, contiguous()
    // of a contiguous tensor, detach of a tensor nobody differentiates) is an identity: same
    // storage, version, shape and dtype. Its users read the input instead.
    if (n.outputs.size() == 1 && !n.inputs.empty() && !n.mutates && identity_capable(base)) {
      const Value& out = ir.values[n.outputs[0]];
      const Value& in = ir.values[n.inputs[0]];
      if (out.storage != 0 && out.storage == in.storage && out.version == in.version &&
          out.shape == in.shape && out.dtype == in.dtype && out.is_view == in.is_view && !out.live_out) {
        detail::replace_uses(ir, n.outputs[0], n.inputs[0]);
        keep[i] = false;
        continue;
      }
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
