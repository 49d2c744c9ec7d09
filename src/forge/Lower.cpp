// Lower.cpp — fusion groups -> IR002: one kernel per group, every IR001 edge classified.
//
// An edge is a value flowing into a group (one per (value, reading group), in order of first
// read). It is Fused when the value's producer is in the same group — the reader takes it from
// the producer's registers; unless another group reads it or it is live-out (an escaping value,
// Note [Escaping links] in Fuse.cpp) it never touches memory — and Materialized otherwise
// (written by another group, or external: from_group = UINT32_MAX). A kernel's inputs are its
// materialized edges' values; its outputs are the values it produces that another group reads
// or that are live-out.
//
// Bytes: the sum of the nodes' cost-model bytes (read + written, Note [Cost model] in Report.h)
// minus the traffic of fused values (every in-group read, and the write of one that does not
// escape), so a fused edge costs no memory traffic. Views move no bytes and are not subtracted.
#include <algorithm>
#include <string>

#include "crucible/core/Contract.h"
#include "crucible/forge/Passes.h"

namespace crucible::forge {

Result<Ir002> lower(const Ir001& ir, std::vector<FusionGroup> groups, PassContext& ctx) {
  ctx.start("lower", ir.nodes.size());
  auto fail = [&](Status s) {
    ctx.finish(0);
    return s;
  };
  constexpr std::uint32_t kNone = UINT32_MAX;
  std::vector<std::uint32_t> group_of(ir.nodes.size(), kNone);
  for (std::size_t g = 0; g < groups.size(); ++g) {
    if (groups[g].id != g)
      return fail(invalid_input(
          "group at position " + std::to_string(g) + " has id " + std::to_string(groups[g].id),
          "number groups 0, 1, ... in order (fuse() does)"));
    if (groups[g].nodes.empty())
      return fail(invalid_input("group " + std::to_string(g) + " has no nodes",
                                "every group holds at least one node"));
    for (std::uint32_t n : groups[g].nodes) {
      if (n >= ir.nodes.size() || group_of[n] != kNone)
        return fail(invalid_input("node #" + std::to_string(n) + " of group " + std::to_string(g) +
                                      " is out of range or in two groups",
                                  "every node belongs to exactly one group"));
      group_of[n] = static_cast<std::uint32_t>(g);
    }
  }
  for (std::size_t n = 0; n < ir.nodes.size(); ++n)
    if (group_of[n] == kNone)
      return fail(
          invalid_input("node #" + std::to_string(n) + " " + ir.nodes[n].op + " is in no group",
                        "every node belongs to exactly one group"));
  auto producer_group = [&](std::uint32_t v) {
    const std::uint32_t p = ir.values[v].producer;
    return p == kNoNode ? kNone : group_of[p];
  };
  // Which groups read each value (to find kernel outputs).
  std::vector<bool> read_elsewhere(ir.values.size(), false);
  for (std::size_t n = 0; n < ir.nodes.size(); ++n) {
    for (std::uint32_t v : ir.nodes[n].inputs) {
      const std::uint32_t pg = producer_group(v);
      if (pg != kNone && pg != group_of[n]) {
        if (pg > group_of[n])
          return fail(invalid_input("group " + std::to_string(group_of[n]) + " reads v" +
                                        std::to_string(v) + " written by the later group " +
                                        std::to_string(pg),
                                    "groups must be numbered in execution order"));
        read_elsewhere[v] = true;
      }
    }
  }

  Ir002 out;
  out.kernels.reserve(groups.size());
  for (const FusionGroup& g : groups) {
    KernelNode k;
    k.group = g.id;
    k.kernel = g.kernel;
    k.recipe = g.recipe;
    std::vector<std::uint32_t> seen;  // values with an edge into this group
    std::int64_t fused_traffic = 0;
    for (std::uint32_t n : g.nodes) {
      const Node& node = ir.nodes[n];
      k.flops += node.flops;
      k.bytes += node.bytes;
      for (std::uint32_t v : node.inputs) {
        const std::uint32_t from = producer_group(v);
        const bool fused = from == g.id;
        if (fused && !ir.values[v].is_view) fused_traffic += ir.values[v].nbytes;
        if (std::find(seen.begin(), seen.end(), v) != seen.end()) continue;
        seen.push_back(v);
        out.edges.push_back(
            Edge{v, from, g.id, fused ? EdgeState::Fused : EdgeState::Materialized});
        if (fused) {
          // An escaping value (read by another group or live-out) is still written once, as an
          // output; one that stays inside the group is never written.
          const bool escapes = read_elsewhere[v] || ir.values[v].live_out;
          if (!escapes && !ir.values[v].is_view) fused_traffic += ir.values[v].nbytes;
        } else {
          k.inputs.push_back(v);
        }
      }
    }
    for (std::uint32_t n : g.nodes)
      for (std::uint32_t v : ir.nodes[n].outputs)
        if (read_elsewhere[v] || ir.values[v].live_out) k.outputs.push_back(v);
    k.bytes = std::max<std::int64_t>(0, k.bytes - fused_traffic);
    out.kernels.push_back(std::move(k));
  }
  out.groups = std::move(groups);
  CRUCIBLE_POST(out.kernels.size() == out.groups.size(), "one kernel per group");
  ctx.finish(out.groups.size());
  return out;
}

}  // namespace crucible::forge
