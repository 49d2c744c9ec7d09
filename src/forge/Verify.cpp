// Verify.cpp — structural checks on IR001, run before and after the rewriting passes.
#include <string>

#include "crucible/forge/Ir001.h"

namespace crucible::forge {
namespace {
Status bad(std::size_t node, const std::string& what) {
  return bad_state("IR001 verifier: node #" + std::to_string(node) + ": " + what,
                   "this is a Forge bug: report it with the trace");
}
}  // namespace

Status verify(const Ir001& ir) {
  if (ir.pool == nullptr) return bad_state("IR001 verifier: no ExprPool", "build IR001 with build_ir001()");
  const std::size_t nv = ir.values.size();
  std::vector<bool> defined(nv, false);
  for (std::size_t v = 0; v < nv; ++v) {
    const Value& val = ir.values[v];
    if (val.producer == kNoNode) defined[v] = true;  // external: available from the start
    else if (val.producer >= ir.nodes.size()) {
      return bad_state("IR001 verifier: value " + std::to_string(v) + " names producer #" +
                           std::to_string(val.producer) + " past the last node",
                       "this is a Forge bug: report it with the trace");
    }
    for (const Expr* d : val.shape) {
      if (d == nullptr) return bad_state("IR001 verifier: value " + std::to_string(v) + " has a null dim", "this is a Forge bug");
      if (d->kind == Expr::Kind::Const && d->value < 0) {
        return bad_state("IR001 verifier: value " + std::to_string(v) + " has a negative dim", "this is a Forge bug");
      }
      if (!ir.symbolic && d->kind != Expr::Kind::Const) {
        return bad_state("IR001 verifier: value " + std::to_string(v) + " has a symbolic dim in a concrete IR", "this is a Forge bug");
      }
    }
  }
  for (std::size_t i = 0; i < ir.nodes.size(); ++i) {
    const Node& n = ir.nodes[i];
    if ((n.kind == CKernel::Opaque) != !n.opaque_reason.empty()) {
      return bad(i, n.kind == CKernel::Opaque ? "OPAQUE without a reason" : "a reason on a non-OPAQUE node");
    }
    if (static_cast<std::uint8_t>(n.kind) >= static_cast<std::uint8_t>(CKernel::kCount)) return bad(i, "kernel kind out of range");
    for (std::uint32_t v : n.inputs) {
      if (v >= nv) return bad(i, "input value " + std::to_string(v) + " out of range");
      if (!defined[v]) return bad(i, "reads value " + std::to_string(v) + " before it is produced");
    }
    for (std::size_t k = 0; k < n.outputs.size(); ++k) {
      const std::uint32_t v = n.outputs[k];
      if (v >= nv) return bad(i, "output value " + std::to_string(v) + " out of range");
      if (ir.values[v].producer != i || ir.values[v].producer_output != k) {
        return bad(i, "output value " + std::to_string(v) + " does not name this node as its producer");
      }
      if (defined[v]) return bad(i, "value " + std::to_string(v) + " is produced twice");
      defined[v] = true;
    }
    if (n.alias_of != UINT32_MAX) {
      bool found = false;
      for (std::uint32_t v : n.inputs) found |= v == n.alias_of;
      if (!found) return bad(i, "aliases value " + std::to_string(n.alias_of) + ", which it does not read");
    }
    if (n.in_place && (n.inputs.empty() || !n.mutates)) return bad(i, "in-place without a mutated input");
  }
  return ok_status();
}

}  // namespace crucible::forge
