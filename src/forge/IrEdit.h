// IrEdit.h — internal helpers the passes share: cost estimates and compaction after removal.
#pragma once

#include <string_view>
#include <vector>

#include "crucible/forge/Ir001.h"

namespace crucible::forge::detail {

// Sets every node's flops/bytes from its kind and shapes (Note [Cost model] in Report.h). The IR
// must be concrete: a symbolic IR keeps the costs of the recording it came from.
void compute_costs(Ir001& ir);

// The IR without the nodes where keep[i] is false: node and value ids renumbered (order kept);
// values nobody reads or writes any more are dropped unless live-out and still produced.
Ir001 compact(const Ir001& ir, const std::vector<bool>& keep);

// Uses of value `from` (as a node input) become uses of `to`; live-out moves along.
void replace_uses(Ir001& ir, std::uint32_t from, std::uint32_t to);

}  // namespace crucible::forge::detail
