// CopyForward.cpp — forward_fresh_copies (Passes.h).
//
// Note [Fresh copies]: AccumulateGrad hands a new gradient over as the parameter's .grad when
// nothing else holds it, and copies it (new_empty_strided + copy_ with the parameter's layout)
// when something does; a recording holds every result, so a recorded step always shows the copy
// (resnet18: 62 copies, 44 MB a step). Where the copy's source is a whole, dense tensor with the
// copy's layout that nothing but the copy reads, every read of the copy may read the source, and
// the two nodes go. Only for a caller that binds the source, not the copy, as the gradient
// (crucible.compile's plans, Note [Gradient copies] in vessel/torch/Replay.cpp).
#include "IrEdit.h"
#include "crucible/forge/Passes.h"

namespace crucible::forge {
namespace {

bool whole_and_dense(const Value& v) {
  if (v.storage_offset != 0 || v.strides.size() != v.shape.size()) return false;
  std::int64_t expect = 1, numel = 1;
  for (std::size_t d = v.shape.size(); d-- > 0;) {
    if (v.shape[d]->kind != Expr::Kind::Const) return false;
    const std::int64_t n = v.shape[d]->value;
    if (n != 1 && v.strides[d] != expect) return false;
    expect *= n;
    numel *= n;
  }
  return v.nbytes >= 0 && v.storage_nbytes == static_cast<std::uint64_t>(v.nbytes) && numel > 0;
}

bool same_layout(const Value& a, const Value& b) {
  return a.dtype == b.dtype && a.shape == b.shape && a.strides == b.strides &&
         a.storage_offset == b.storage_offset;
}

}  // namespace

Result<Ir001> forward_fresh_copies(Ir001 ir, std::size_t* forwarded) {
  std::vector<std::uint32_t> readers(ir.values.size(), 0);
  for (const Node& n : ir.nodes)
    for (std::uint32_t v : n.inputs) ++readers[v];
  std::vector<bool> keep(ir.nodes.size(), true);
  std::size_t count = 0;
  for (std::uint32_t b = 0; b < ir.nodes.size(); ++b) {
    const Node& copy = ir.nodes[b];
    if (!detail::op_matches("aten::copy_", copy.op) || copy.inputs.size() < 2 || copy.outputs.size() != 1) continue;
    const std::uint32_t dst = copy.inputs[0], src = copy.inputs[1], out = copy.outputs[0];
    if (copy.input_args.size() >= 2 && (copy.input_args[0].arg != 0 || copy.input_args[1].arg != 1)) continue;
    const std::uint32_t a = ir.values[dst].producer;
    if (a == kNoNode || a >= b || !keep[a]) continue;
    const Node& alloc = ir.nodes[a];
    if (!detail::op_matches("aten::new_empty_strided", alloc.op) || alloc.inputs.size() != 1 || alloc.inputs[0] != src ||
        alloc.outputs.size() != 1 || alloc.outputs[0] != dst)
      continue;
    if (alloc.phase != record::Phase::Backward || copy.phase != record::Phase::Backward) continue;
    const Value &s = ir.values[src], &d = ir.values[dst], &o = ir.values[out];
    // The source: made by a node, read by these two only, never written again (no later value
    // of its storage), whole and dense like the copy; the copy's memory read only by copy_, and
    // the copy not seen after the step (the source may be: it stands for the copy).
    if (s.producer == kNoNode || readers[src] != 2 || readers[dst] != 1 || d.live_out || o.live_out) continue;
    if (!whole_and_dense(s) || !whole_and_dense(d) || !same_layout(s, d) || !same_layout(s, o)) continue;
    bool written_later = false;
    for (std::uint32_t v = 0; v < ir.values.size() && !written_later; ++v)
      written_later = v != src && ir.values[v].storage == s.storage && ir.values[v].producer != kNoNode &&
                      ir.values[v].producer > s.producer;
    if (written_later) continue;
    detail::replace_uses(ir, out, src);
    keep[a] = keep[b] = false;
    ++count;
  }
  if (forwarded != nullptr) *forwarded = count;
  if (count == 0) return ir;
  return detail::compact(ir, keep);
}

}  // namespace crucible::forge
