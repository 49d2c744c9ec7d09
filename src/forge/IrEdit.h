// IrEdit.h — internal helpers the passes share: cost estimates, compaction after removal, and
// whether a rule's pattern step matches a node.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "crucible/forge/Ir001.h"
#include "crucible/forge/Rules.h"

namespace crucible::forge::detail {

// A node's group while the fusers build groups: none yet.
inline constexpr std::uint32_t kNoGroup = UINT32_MAX;

// Sets every node's flops/bytes from its kind and shapes (Note [Cost model] in Report.h). The IR
// must be concrete: a symbolic IR keeps the costs of the recording it came from.
void compute_costs(Ir001& ir);

// The IR without the nodes where keep[i] is false: node and value ids renumbered (order kept);
// values nobody reads or writes any more are dropped unless live-out and still produced.
Ir001 compact(const Ir001& ir, const std::vector<bool>& keep);

// Uses of value `from` (as a node input) become uses of `to`; live-out moves along.
void replace_uses(Ir001& ir, std::uint32_t from, std::uint32_t to);

// "aten::add.Tensor" matches a step naming "aten::add.Tensor" or "aten::add" (every overload).
inline bool op_matches(std::string_view step_op, std::string_view node_op) {
  if (step_op == node_op) return true;
  const std::size_t ns = node_op.find("::");
  const std::size_t dot = node_op.find('.', ns == std::string_view::npos ? 0 : ns + 2);
  return dot != std::string_view::npos && node_op.substr(0, dot) == step_op;
}

// A step matches by kind (any of its kinds), by op name, or anything ("*").
inline bool step_matches(const PatternStep& s, const Node& n) {
  for (CKernel k : s.kinds)
    if (k == n.kind) return true;
  if (!s.kinds.empty()) return false;
  if (!s.op.empty()) return op_matches(s.op, n.op);
  return true;
}

}  // namespace crucible::forge::detail
