// FuseHorizontal.cpp — horizontal rules matched into multi-tensor groups (IR001 -> seed groups).
//
// Note [Horizontal rules]: a rule with `horizontal = true` describes one *member*: its pattern
// is a run of consecutive nodes in execution order (not a dataflow chain), matched step by step
// ("?" zero or one, "+" one or more, "*" zero or more, greedily). An optimizer step that loops
// over its parameters records the same run once per parameter (AdamW: add_ step, mul_ decay,
// lerp_, mul_, addcmul_, item, sqrt, div, add_, addcdiv_). Consecutive members form one group:
// one kernel that walks a table of (pointer, size) per tensor, so its code does not grow with
// the number of parameters. Members may differ in their scalar arguments (a parameter group's
// own lr or weight decay: consecutive groups' loops join one run), so the table carries each
// member's scalars too. A member joins the group only if
//   * all its nodes share the group's phase and are in no group yet, and
//   * it reads nothing an earlier member of the group wrote (members are independent: the
//     kernel may run them in any order, or all at once).
// A group covers a contiguous range of nodes, so running it at its last node's position (Note
// [Group placement] in Fuse.cpp) moves no node past an outside reader or writer: it is valid
// without the checks vertical growth needs. Inside a member the ops keep their order and their
// roundings, so the rule's recipe can stay bit-exact; the values a member writes and reads again
// (the updated exp_avg read by addcdiv_) are taken from registers, and written once when they
// are state (live-out).
//
// Rules are tried by priority descending, then id, each over the whole IR; the nodes they group
// are seeded into fuse(), which matches the rest vertically.
#include <algorithm>
#include <string>
#include <vector>

#include "crucible/forge/Passes.h"
#include "IrEdit.h"

namespace crucible::forge {
namespace {

using detail::kNoGroup;
using detail::step_matches;


// The length of the member of `r` starting at node i (0: none). Greedy, no backtracking.
std::uint32_t member_at(const Ir001& ir, const Rule& r, std::uint32_t i,
                        const std::vector<std::uint32_t>& group_of, record::Phase phase) {
  std::uint32_t j = i;
  auto free_at = [&](std::uint32_t n) {
    return n < ir.nodes.size() && group_of[n] == kNoGroup && ir.nodes[n].phase == phase;
  };
  for (const PatternStep& s : r.pattern) {
    std::uint32_t taken = 0;
    while (free_at(j) && step_matches(s, ir.nodes[j]) && (taken == 0 || s.repeated)) {
      ++j;
      ++taken;
    }
    if (taken == 0 && !s.optional) return 0;
  }
  return j - i;
}

}  // namespace

Result<std::vector<FusionGroup>> fuse_horizontal(const Ir001& ir, PassContext& ctx) {
  ctx.start("fuse_horizontal", ir.nodes.size());
  if (ctx.rules == nullptr) {
    ctx.finish(ir.nodes.size());
    return bad_state("fuse_horizontal: the pass context has no rules", "load a rules class first");
  }
  auto rules = applicable_rules(*ctx.rules, ctx.policy);
  if (!rules.ok()) {
    ctx.finish(ir.nodes.size());
    return rules.status();
  }
  std::vector<std::uint32_t> group_of(ir.nodes.size(), kNoGroup);
  std::vector<FusionGroup> groups;
  std::size_t grouped = 0;
  for (const Rule* r : *rules) {
    if (!r->horizontal) continue;
    for (std::uint32_t i = 0; i < ir.nodes.size();) {
      if (ctx.over()) break;  // the rest is matched vertically (or falls back) by fuse()
      if (group_of[i] != kNoGroup) {
        ++i;
        continue;
      }
      const record::Phase phase = ir.nodes[i].phase;
      if (!r->phases.empty() &&
          std::find(r->phases.begin(), r->phases.end(), phase) == r->phases.end()) {
        ++i;
        continue;
      }
      std::vector<bool> written(ir.values.size(), false);  // by the group's members so far
      std::uint32_t j = i;
      while (true) {
        const std::uint32_t len = member_at(ir, *r, j, group_of, phase);
        if (len == 0) break;
        bool independent = true;
        for (std::uint32_t n = j; n < j + len && independent; ++n)
          for (std::uint32_t v : ir.nodes[n].inputs) independent &= !written[v];
        if (!independent) break;
        for (std::uint32_t n = j; n < j + len; ++n)
          for (std::uint32_t v : ir.nodes[n].outputs) written[v] = true;
        j += len;
      }
      if (j == i) {
        ++i;
        continue;
      }
      FusionGroup g;
      g.rule = r->id;
      g.kernel = r->kernel;
      g.recipe = r->recipe;
      g.numerics = static_cast<std::uint8_t>(r->numerics);
      for (std::uint32_t n = i; n < j; ++n) {
        g.nodes.push_back(n);
        group_of[n] = static_cast<std::uint32_t>(groups.size());
      }
      grouped += j - i;
      groups.push_back(std::move(g));
      i = j;
    }
  }
  ctx.finish(ir.nodes.size() - grouped + groups.size());
  return groups;
}

}  // namespace crucible::forge
