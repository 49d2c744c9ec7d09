// Canonicalize.cpp — views alias their input, in-place ops are marked, no-op views are dropped.
//
// After this pass: every VIEW node's output aliases its first input (alias_of) and is flagged a
// view; every "op_" (trailing underscore: add_, mul_, zero_, _foreach_add_ ...; "__iand__" but
// not "__and__") is in_place and mutates its first input; removed, with users reading the input,
// unless Python may observe the result (live-out): a view whose op the op table marks
// kShapePreservingView (view, alias, expand, ...) with its input's shape and dtype, and an op
// marked kMayReturnInput that returned its own input (to() to the same dtype, contiguous() of a
// contiguous tensor).
#include <string>

#include "IrEdit.h"
#include "crucible/core/OpTable.h"
#include "crucible/forge/Passes.h"

namespace crucible::forge {

Result<Ir001> canonicalize(Ir001 ir, PassContext& ctx) {
  ctx.start("canonicalize", ir.nodes.size());
  std::vector<bool> keep(ir.nodes.size(), true);
  std::size_t i = 0;
  for (; i < ir.nodes.size(); ++i) {
    if (ctx.over()) break;  // the rest stays as recorded
    Node& n = ir.nodes[i];
    const std::uint8_t traits = classify_op(n.op).traits;
    if (is_in_place_op(n.op) && !n.inputs.empty()) {
      n.in_place = true;
      n.mutates = true;
    }
    // An op that returned its input unchanged (to() to the same dtype and device, contiguous()
    // of a contiguous tensor, detach of a tensor nobody differentiates) is an identity: same
    // storage, version, shape and dtype. Its users read the input instead.
    if (n.outputs.size() == 1 && !n.inputs.empty() && !n.mutates &&
        (traits & op_trait::kMayReturnInput) != 0) {
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
    if ((traits & op_trait::kShapePreservingView) != 0 && out.shape == in.shape &&
        out.dtype == in.dtype && !out.live_out) {
      detail::replace_uses(ir, n.outputs[0], n.inputs[0]);
      keep[i] = false;
    }
  }
  Ir001 result = detail::compact(ir, keep);
  ctx.finish(result.nodes.size());
  return result;
}

}  // namespace crucible::forge
