// Remat.cpp — rematerialize (Passes.h).
//
// Note [Rematerialization]: a training step keeps what its backward reads from the end of the
// forward to the backward op that reads it, and those saved values are where the step's memory
// peaks. A pointwise value whose inputs the backward keeps anyway (dropout's output x * mask:
// backward reads x and mask again, and the output only for the next layer's weight gradient)
// need not be kept: the backward can compute it again from them, right before its first reader,
// for a few microseconds and the bytes of the saved value at the peak. Computed again from the
// same inputs by the same op it has the same bits.
//
// A node N is recomputed when: it is PointwiseUnary or PointwiseBinary in the forward, pure (no
// mutation, no RNG), with one output v of at least kMinBytes that is not live-out (its copy keeps
// N's trace op: a caller that patches an argument of that op patches both); v's storage is written
// by N alone and otherwise only aliased by views; some non-forward node reads v (or a view of
// it); let F be the first such node, after at least one node that reads nothing of v's
// (otherwise nothing is freed), and after a forward reader (else N would just run twice). Each
// input of N is still there at F: its storage is not written between N and F (no node writes a
// value of it, none mutates it), and it is an external (a parameter, an argument) or some node at F or later
// reads its storage (it is kept until then anyway, so the clone adds no lifetime). Then a copy of
// N (phase of F, a new storage) and copies of the views of v the readers at F or later use are
// put right before F, and those readers read the copies. Same bits under numerics="bitwise"
// (generated kernels give ATen's bits); under "fast" the copy may be fused differently and
// differ from the original within the fast kernels' bound.
#include <algorithm>
#include <map>

#include "IrEdit.h"
#include "crucible/forge/Passes.h"

namespace crucible::forge {
namespace {

constexpr std::int64_t kMinBytes = 1024;

bool is_view_node(const Node& n) { return n.kind == CKernel::View || n.alias_of != UINT32_MAX; }

// Inserts `added` (their outputs already appended to ir.values, producers set to their final
// indices) before node `pos`: nodes at pos and after move up, and so do their values' producers.
void insert_nodes(Ir001& ir, std::uint32_t pos, std::vector<Node> added,
                  const std::vector<std::uint32_t>& added_values) {
  const auto k = static_cast<std::uint32_t>(added.size());
  for (std::uint32_t v = 0; v < ir.values.size(); ++v) {
    Value& val = ir.values[v];
    if (std::find(added_values.begin(), added_values.end(), v) != added_values.end()) continue;
    if (val.producer != kNoNode && val.producer >= pos) val.producer += k;
  }
  ir.nodes.insert(ir.nodes.begin() + pos, std::make_move_iterator(added.begin()),
                  std::make_move_iterator(added.end()));
}

// Tries node i; true when it was recomputed (the IR changed).
bool remat_one(Ir001& ir, std::uint32_t i, std::uint64_t& next_storage) {
  const Node& n = ir.nodes[i];
  if (n.phase != record::Phase::Forward || n.mutates || n.in_place || is_view_node(n)) return false;
  if (n.kind != CKernel::PointwiseUnary && n.kind != CKernel::PointwiseBinary) return false;
  if (n.outputs.size() != 1 || n.inputs.empty()) return false;
  const std::uint32_t v = n.outputs[0];
  const Value& val = ir.values[v];
  if (val.live_out || val.is_view || val.storage == 0 || val.nbytes < kMinBytes) return false;
  const std::uint64_t sv = val.storage;

  // v's family: v and views of it (transitively); nothing else may touch its storage.
  std::vector<bool> family(ir.values.size(), false);
  family[v] = true;
  for (std::uint32_t j = 0; j < ir.nodes.size(); ++j) {
    const Node& m = ir.nodes[j];
    bool touches = false;
    for (std::uint32_t o : m.outputs) touches = touches || ir.values[o].storage == sv;
    if (!touches || j == i) continue;
    if (!is_view_node(m) || m.inputs.empty() || j < i) return false;
    bool from_family = false;
    for (std::uint32_t in : m.inputs) from_family = from_family || family[in];
    if (!from_family) return false;
    for (std::uint32_t o : m.outputs) {
      if (ir.values[o].storage != sv || ir.values[o].live_out) return false;
      family[o] = true;
    }
  }
  // Readers (not views) of the family; F: the first one outside the forward.
  std::uint32_t f = kNoNode, last_before = i;
  for (std::uint32_t j = i + 1; j < ir.nodes.size(); ++j) {
    const Node& m = ir.nodes[j];
    if (is_view_node(m)) continue;
    bool reads = false;
    for (std::uint32_t in : m.inputs) reads = reads || family[in];
    if (!reads) continue;
    if (m.phase != record::Phase::Forward) {
      f = j;
      break;
    }
    last_before = j;
  }
  // A forward reader first (else N would only be computed twice), and a gap before F.
  if (f == kNoNode || last_before == i || f <= last_before + 1) return false;

  // The inputs are still there at F, at no extra cost.
  for (std::uint32_t u : n.inputs) {
    const Value& in = ir.values[u];
    if (in.storage == 0) return false;
    for (std::uint32_t j = i + 1; j < f; ++j) {  // no write to its storage in between
      const Node& m = ir.nodes[j];
      if (!is_view_node(m))
        for (std::uint32_t o : m.outputs)
          if (ir.values[o].storage == in.storage) return false;
      if (!(m.mutates || m.in_place)) continue;
      for (std::uint32_t x : m.inputs)
        if (ir.values[x].storage == in.storage) return false;
    }
    if (in.producer == kNoNode) continue;
    bool kept = false;
    for (std::uint32_t j = f; j < ir.nodes.size() && !kept; ++j)
      for (std::uint32_t x : ir.nodes[j].inputs) kept = kept || ir.values[x].storage == in.storage;
    if (!kept) return false;
  }

  // The copies: N, then the family's views read at F or later (in their order).
  std::vector<bool> needed(ir.values.size(), false);
  for (std::uint32_t j = f; j < ir.nodes.size(); ++j)
    if (!is_view_node(ir.nodes[j]))
      for (std::uint32_t in : ir.nodes[j].inputs)
        if (family[in]) needed[in] = true;
  std::vector<std::uint32_t> views;  // view nodes to copy
  for (std::uint32_t j = ir.nodes.size(); j-- > i + 1;) {
    const Node& m = ir.nodes[j];
    if (!is_view_node(m)) continue;
    bool out_needed = false;
    for (std::uint32_t o : m.outputs) out_needed = out_needed || needed[o];
    if (!out_needed) continue;
    views.push_back(j);
    for (std::uint32_t in : m.inputs)
      if (family[in]) needed[in] = true;
  }
  std::reverse(views.begin(), views.end());
  if (views.size() > 0 && views.back() >= f) return false;  // a view made after F: leave it

  const std::uint64_t storage = next_storage++;
  std::map<std::uint32_t, std::uint32_t> copy_of;  // family value -> its copy
  std::vector<Node> added;
  std::vector<std::uint32_t> added_values;
  auto copy_node = [&](std::uint32_t j) {
    Node c = ir.nodes[j];
    c.phase = ir.nodes[f].phase;
    for (std::uint32_t& in : c.inputs) {
      auto it = copy_of.find(in);
      if (it != copy_of.end()) in = it->second;
    }
    for (std::uint32_t k = 0; k < c.outputs.size(); ++k) {
      Value nv = ir.values[c.outputs[k]];
      nv.storage = storage;
      nv.live_out = false;
      nv.version = 0;
      nv.producer = f + static_cast<std::uint32_t>(added.size());
      nv.producer_output = k;
      const auto id = static_cast<std::uint32_t>(ir.values.size());
      ir.values.push_back(std::move(nv));
      copy_of[c.outputs[k]] = id;
      added_values.push_back(id);
      c.outputs[k] = id;
    }
    if (c.alias_of != UINT32_MAX) {  // canonicalize's alias: an input value id
      auto it = copy_of.find(c.alias_of);
      if (it != copy_of.end()) c.alias_of = it->second;
    }
    added.push_back(std::move(c));
  };
  copy_node(i);
  for (std::uint32_t j : views) copy_node(j);
  // Readers at F or later read the copies.
  for (std::uint32_t j = f; j < ir.nodes.size(); ++j) {
    Node& m = ir.nodes[j];
    if (is_view_node(m)) continue;
    for (std::uint32_t& in : m.inputs) {
      auto it = copy_of.find(in);
      if (it != copy_of.end()) in = it->second;
    }
  }
  insert_nodes(ir, f, std::move(added), added_values);
  return true;
}

}  // namespace

Result<Ir001> rematerialize(Ir001 ir, PassContext& ctx, std::size_t* recomputed) {
  ctx.start("rematerialize", ir.nodes.size());
  std::uint64_t next_storage = 1;
  for (const Value& v : ir.values) next_storage = std::max(next_storage, v.storage + 1);
  std::size_t count = 0;
  for (std::uint32_t i = 0; i < ir.nodes.size(); ++i) {
    if (ctx.over() || next_storage == 0) break;
    if (remat_one(ir, i, next_storage)) ++count;
  }
  if (recomputed != nullptr) *recomputed = count;
  CRUCIBLE_RETURN_IF_ERROR(verify(ir));
  ctx.finish(ir.nodes.size());
  return ir;
}

}  // namespace crucible::forge
