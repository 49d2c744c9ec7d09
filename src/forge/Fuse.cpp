// Fuse.cpp — rule-driven fusion: IR001 nodes matched into fusion groups by the applicable rules.
//
// Note [Fusion matching]: the applicable rules (mode, capabilities, "differs" opt-in, settings)
// are sorted by priority descending, then id. Nodes are scanned in execution order; at each
// unassigned node the rules are tried in that order and the first that matches forms a group.
// A pattern matches a chain n0 -> n1 -> ... where each next node is a reader of the previous
// node's first output (tried in execution order) and all nodes share a phase; optional steps
// ("?") are taken when they match and skipped when the rest of the pattern then still matches,
// repeated steps ("+", "*") take as many nodes as they can (backtracking, longest first). Nodes already grouped by
// fuse_horizontal (seeded) are not matched again, and horizontal rules are not tried here.
// The search backtracks over readers, so it polls the phase budget every 256 steps: out of
// budget, the node being scanned and all after it run op by op, as for a slow phase.
//
// Note [Escaping links]: a link's value may have other readers, or be live-out (an activation
// the backward pass reads, an optimizer state): the kernel then writes it once, as an output, and
// its reader in the group takes it from registers. Such readers must run after the group (a).
// What fusing saves is the re-read, and the whole chain runs as one pass over memory. A rule
// whose kernel cannot store its intermediates (flash attention never writes the probabilities)
// says `escaping = false`: its links then need a single reader and no live-out value.
//
// Note [Group placement]: a group runs as one kernel at the position of its last node, so the
// groups are numbered in the order of their last nodes. Growing a group to node c is allowed only
// if that stays a valid execution order:
//   (a) every value the group writes that a node outside the group reads is read after c
//       (otherwise that reader would run before the kernel that produces its input);
//   (b) no node outside the group between the group's first node and c writes a storage the group
//       reads or writes, or reads one the group writes (moving the group's work to c would
//       reorder a read and a write of the same memory);
//   (c) a value both produced and read inside the group is materialized only when a node outside
//       reads it or it is live-out (Note [Escaping links]); Lower makes it a kernel output. A
//       rule with `escaping = false` allows neither.
// Inputs from outside need no check: their producers' groups end before their readers by (a).
// So "group g reads what group h writes" implies last(h) < last(g): the order is topological.
#include <algorithm>
#include <string>
#include <vector>

#include "crucible/core/Contract.h"
#include "crucible/forge/Passes.h"
#include "IrEdit.h"

namespace crucible::forge {
namespace {

using detail::kNoGroup;
using detail::step_matches;


std::string_view kind_name(CKernel k) { return ckernel_info(k).name; }

bool phase_in(const Rule& r, record::Phase p) {
  return r.phases.empty() || std::find(r.phases.begin(), r.phases.end(), p) != r.phases.end();
}

bool rows_restricted(const Rule& r) { return r.rows_min > 0 || r.rows_max < INT64_MAX; }

// Product of all but the last dim of the node's first output at the recorded batch (1 for a node
// without outputs or a 0/1-dim output). Symbols are bound to ir.batch_size.
Result<std::int64_t> rows_of(const Ir001& ir, std::uint32_t i) {
  const Node& n = ir.nodes[i];
  if (n.outputs.empty()) return std::int64_t{1};
  const Value& v = ir.values[n.outputs[0]];
  std::int64_t rows = 1;
  for (std::size_t d = 0; d + 1 < v.shape.size(); ++d) {
    const Expr* e = v.shape[d];
    std::int64_t x = 0;
    if (e != nullptr && e->kind == Expr::Kind::Const) {
      x = e->value;
    } else {
      if (e == nullptr || ir.pool == nullptr || ir.batch_size <= 0)
        return invalid_input("node #" + std::to_string(i) + " " + n.op +
                                 ": cannot count its rows (symbolic shape, unknown recorded batch)",
                             "record the batch size, or drop the rule's rows range");
      std::map<std::string, std::int64_t, std::less<>> bind;
      std::vector<const Expr*> todo{e};
      while (!todo.empty()) {
        const Expr* t = todo.back();
        todo.pop_back();
        if (t->kind == Expr::Kind::Sym) bind[t->name] = ir.batch_size;
        for (const Expr* a : t->args) todo.push_back(a);
      }
      auto val = ir.pool->evaluate(e, bind);
      if (!val.ok()) return val.status();
      x = *val;
    }
    if (x < 0) x = 0;
    if (__builtin_mul_overflow(rows, x, &rows)) rows = INT64_MAX;  // saturates: "very many"
  }
  return rows;
}

struct Fuser {
  const Ir001& ir;
  std::vector<std::vector<std::uint32_t>> readers;  // value -> distinct reading nodes, ascending
  std::vector<std::uint32_t> group_of;              // node -> group index (creation order) or kNoGroup
  std::vector<std::int64_t> rows_cache;
  std::vector<bool> rows_known;
  std::vector<std::uint32_t> chain;
  const PassContext* ctx = nullptr;
  std::uint64_t steps = 0;
  bool aborted = false;  // the budget ran out inside a match

  explicit Fuser(const Ir001& ir_in) : ir(ir_in) {
    readers.resize(ir.values.size());
    for (std::uint32_t n = 0; n < ir.nodes.size(); ++n)
      for (std::uint32_t v : ir.nodes[n].inputs)
        if (readers[v].empty() || readers[v].back() != n) readers[v].push_back(n);
    group_of.assign(ir.nodes.size(), kNoGroup);
    rows_cache.assign(ir.nodes.size(), 0);
    rows_known.assign(ir.nodes.size(), false);
  }

  bool in_chain(std::uint32_t n) const {
    return std::find(chain.begin(), chain.end(), n) != chain.end();
  }

  // The nodes the chain may grow to from `p`: the readers of p's first output (ascending) that
  // are in no group yet and share the chain's phase (Note [Escaping links]).
  // A rule with `escaping = false` takes only the single reader of a value that is not live-out.
  std::vector<std::uint32_t> next_of(std::uint32_t p, bool escaping) const {
    std::vector<std::uint32_t> out;
    const Node& n = ir.nodes[p];
    if (n.outputs.empty()) return out;
    const std::uint32_t v = n.outputs[0];
    if (!escaping && (ir.values[v].live_out || readers[v].size() != 1)) return out;
    for (std::uint32_t c : readers[v])
      if (group_of[c] == kNoGroup && !in_chain(c) &&
          ir.nodes[c].phase == ir.nodes[chain.front()].phase)
        out.push_back(c);
    return out;
  }

  // Conditions (a)-(c) of Note [Group placement] for chain + {c}.
  bool may_grow_to(std::uint32_t c, bool escaping) const {
    auto inside = [&](std::uint32_t n) { return n == c || in_chain(n); };
    auto check_outputs = [&](std::uint32_t n) {
      for (std::uint32_t w : ir.nodes[n].outputs) {
        bool read_inside = false, read_outside = false;
        for (std::uint32_t x : readers[w]) {
          if (inside(x)) {
            read_inside = true;
          } else {
            read_outside = true;
            if (x < c) return false;  // (a)
          }
        }
        // (c) for a rule whose fused values must never be stored
        if (!escaping && read_inside && (read_outside || ir.values[w].live_out)) return false;
      }
      return true;
    };
    for (std::uint32_t n : chain)
      if (!check_outputs(n)) return false;
    if (!check_outputs(c)) return false;
    // (b): storages the group reads and writes (0 = no storage).
    std::vector<std::uint64_t> reads, writes;
    auto collect = [&](std::uint32_t n) {
      for (std::uint32_t v : ir.nodes[n].inputs)
        if (ir.values[v].storage) reads.push_back(ir.values[v].storage);
      for (std::uint32_t v : ir.nodes[n].outputs)
        if (ir.values[v].storage && !ir.values[v].is_view) writes.push_back(ir.values[v].storage);
    };
    for (std::uint32_t n : chain) collect(n);
    collect(c);
    auto has = [](const std::vector<std::uint64_t>& s, std::uint64_t x) {
      return std::find(s.begin(), s.end(), x) != s.end();
    };
    for (std::uint32_t x = chain.front() + 1; x < c; ++x) {
      if (in_chain(x)) continue;
      const Node& n = ir.nodes[x];
      for (std::uint32_t v : n.outputs) {
        const std::uint64_t s = ir.values[v].storage;
        if (s && !ir.values[v].is_view && (has(reads, s) || has(writes, s))) return false;
      }
      for (std::uint32_t v : n.inputs) {
        const std::uint64_t s = ir.values[v].storage;
        if (s && has(writes, s)) return false;
      }
    }
    return true;
  }

  Result<bool> rows_in(const Rule& r, std::uint32_t n) {
    if (!rows_restricted(r)) return true;
    if (!rows_known[n]) {
      auto rows = rows_of(ir, n);
      if (!rows.ok()) return rows.status();
      rows_cache[n] = *rows;
      rows_known[n] = true;
    }
    return rows_cache[n] >= r.rows_min && rows_cache[n] <= r.rows_max;
  }

  // Matches r.pattern[step..] with the chain so far; on success `chain` holds the group.
  // `again`: the chain's last node already matched this (repeated) step.
  Result<bool> match(const Rule& r, std::size_t step, std::uint32_t start, bool again = false) {
    if (step == r.pattern.size()) return !chain.empty();
    if (aborted || ((++steps & 255) == 0 && ctx != nullptr && ctx->over())) {
      aborted = true;
      return false;
    }
    const PatternStep& s = r.pattern[step];
    const std::vector<std::uint32_t> cands =
        chain.empty() ? std::vector<std::uint32_t>{start} : next_of(chain.back(), r.escaping);
    for (std::uint32_t cand : cands) {
      if (!step_matches(s, ir.nodes[cand])) continue;
      bool ok = true;
      if (chain.empty()) {
        auto in = rows_in(r, cand);  // the rows of the group's first node decide
        if (!in.ok()) return in.status();
        ok = *in && phase_in(r, ir.nodes[cand].phase);  // the chain shares its first node's
      } else {
        ok = may_grow_to(cand, r.escaping);
      }
      if (!ok) continue;
      chain.push_back(cand);
      // A repeated step tries to take one more node first (longest match), then moves on.
      auto rest = s.repeated ? match(r, step, start, true) : match(r, step + 1, start);
      if (!rest.ok()) return rest.status();
      if (*rest) return true;
      if (aborted) return false;
      chain.pop_back();
    }
    if (s.optional || again) return match(r, step + 1, start);
    return false;
  }
};

}  // namespace

Result<std::vector<FusionGroup>> fuse(const Ir001& ir, PassContext& ctx,
                                      std::vector<FusionGroup> seeded) {
  ctx.start("fuse", ir.nodes.size());
  if (ctx.rules == nullptr) {
    ctx.finish(ir.nodes.size());
    return bad_state("fuse: the pass context has no rules", "load a rules class first");
  }
  auto rules = applicable_rules(*ctx.rules, ctx.policy);
  if (!rules.ok()) {
    ctx.finish(ir.nodes.size());
    return rules.status();
  }
  Fuser f(ir);
  f.ctx = &ctx;
  std::vector<FusionGroup> groups;  // creation order
  for (FusionGroup& g : seeded) {
    for (std::uint32_t n : g.nodes) {
      if (n >= ir.nodes.size() || f.group_of[n] != kNoGroup) {
        ctx.finish(ir.nodes.size());
        return bad_state("fuse: seeded node #" + std::to_string(n) +
                             " is out of range or in two groups",
                         "seed disjoint groups of this IR (fuse_horizontal does)");
      }
      f.group_of[n] = static_cast<std::uint32_t>(groups.size());
    }
    groups.push_back(std::move(g));
  }
  std::size_t fallback = 0;
  bool over = false;
  // Out of budget: the node runs op by op, as recorded (Passes.h).
  auto run_opaque = [&](std::uint32_t i) {
    FusionGroup g;
    g.kernel = KernelTemplate::Opaque;
    g.nodes = {i};
    g.numerics = static_cast<std::uint8_t>(Numerics::Reference);
    f.group_of[i] = static_cast<std::uint32_t>(groups.size());
    groups.push_back(std::move(g));
    ++fallback;
  };
  for (std::uint32_t i = 0; i < ir.nodes.size(); ++i) {
    if (f.group_of[i] != kNoGroup) continue;
    over = over || ctx.over();
    if (over) {
      run_opaque(i);
      continue;
    }
    const Rule* chosen = nullptr;
    for (const Rule* r : *rules) {
      if (r->horizontal) continue;  // fuse_horizontal's
      f.chain.clear();
      auto m = f.match(*r, 0, i);
      if (!m.ok()) {
        ctx.finish(ir.nodes.size());
        return m.status();
      }
      if (f.aborted) break;
      // A match must contain the node being scanned (a leading optional step may be skipped).
      if (*m && f.chain.front() == i) {
        chosen = r;
        break;
      }
    }
    if (f.aborted) {
      over = true;
      run_opaque(i);
      continue;
    }
    if (chosen == nullptr) {
      const Node& n = ir.nodes[i];
      ctx.finish(ir.nodes.size());
      return invalid_input("uncovered node #" + std::to_string(i) + " " + n.op + " (" +
                               std::string(kind_name(n.kind)) + "): no rule of class \"" +
                               ctx.rules->hardware + "\" applies to it",
                           "add a rule for " + std::string(kind_name(n.kind)) +
                               " or a fallback rule (pattern [\"*\"], kernel \"opaque\", "
                               "priority 0) to the class or a base it extends");
    }
    FusionGroup g;
    g.rule = chosen->id;
    g.kernel = chosen->kernel;
    g.recipe = chosen->recipe;
    g.numerics = static_cast<std::uint8_t>(chosen->numerics);
    g.nodes = f.chain;
    for (std::uint32_t n : g.nodes) f.group_of[n] = static_cast<std::uint32_t>(groups.size());
    groups.push_back(std::move(g));
  }
  // Number the groups in the order they run: by last node (Note [Group placement]).
  std::sort(groups.begin(), groups.end(), [](const FusionGroup& a, const FusionGroup& b) {
    return a.nodes.back() < b.nodes.back();
  });
  for (std::size_t g = 0; g < groups.size(); ++g) groups[g].id = static_cast<std::uint32_t>(g);
  CRUCIBLE_POST(
      std::all_of(f.group_of.begin(), f.group_of.end(), [](std::uint32_t g) { return g != kNoGroup; }),
      "every node is in exactly one group");
  ctx.finish(groups.size(), fallback);
  return groups;
}

}  // namespace crucible::forge
