// MerkleDag.cpp — node, region and root hashes.
#include "crucible/graph/MerkleDag.h"

#include <algorithm>
#include <string>
#include <string_view>

#include "crucible/core/Contract.h"

namespace crucible::graph {

ContentHash region_hash(const TraceGraph& g, const std::vector<ContentHash>& local,
                        std::uint32_t begin, std::uint32_t end) {
  ContentHasher h;
  h.update_u32(end - begin);
  {
    WordBatch w(h);
    for (std::uint32_t n = begin; n < end; ++n) {
      w.add(local[n].lo);
      w.add(local[n].hi);
      // Only wiring inside the region: an input from outside (another region or an external)
      // is described by its metadata in the local hash, wherever it comes from. Predecessors
      // come in increasing slot order (TraceGraph), so no sort is needed.
      for (const Edge& e : g.predecessors(n)) {
        if (e.node >= begin && e.node < end) {
          w.add(std::uint64_t{e.slot} | std::uint64_t{static_cast<std::uint8_t>(e.kind)} << 32);
          w.add(std::uint64_t{n - e.node});
        }
      }
      w.add(~std::uint64_t{0});  // ends the member (no edge's first word is all ones)
    }
  }
  return h.digest();
}

namespace {
// An external input hashes as its classification (0 when the trace does not know why it is
// external): one hash per kind, computed once.
struct ExternalHashes {
  ContentHash of[record::kMaxExternalKind + 1];
  ExternalHashes() {
    for (std::uint8_t k = 0; k <= record::kMaxExternalKind; ++k) {
      ContentHasher x;
      x.update_string("external").update_u8(k);
      of[k] = x.digest();
    }
  }
};

// The Merkle hash of `node`: its local hash, then every input in slot order, as its
// producer's node hash or its external classification. Externals are listed in node order,
// then slot order, as are each node's predecessors: merging the two by slot feeds every input
// in slot order. `xi` is the first external of `node` or a later node; on return, of a later
// node.
ContentHash hash_node(const TraceGraph& g, std::size_t node, const ContentHash& local,
                      const std::vector<ContentHash>& node_hashes, const ExternalHashes& ext,
                      std::size_t& xi) {
  const auto& externals = g.externals();
  ContentHasher h;
  h.update_hash(local);
  const auto preds = g.predecessors(node);
  std::size_t pi = 0;
  while (pi < preds.size() || (xi < externals.size() && externals[xi].node == node)) {
    const bool take_external = xi < externals.size() && externals[xi].node == node &&
                               (pi == preds.size() || externals[xi].slot < preds[pi].slot);
    if (take_external) {
      std::uint8_t kind = externals[xi].kind;         // from the graph's numbering: no lookup by id
      if (kind > record::kMaxExternalKind) kind = 0;  // a kind this build cannot name
      h.update_words(std::uint64_t{externals[xi].slot}, ext.of[kind].lo, ext.of[kind].hi);
      ++xi;
    } else {
      const ContentHash& p = node_hashes[preds[pi].node];
      h.update_words(std::uint64_t{preds[pi].slot}, p.lo, p.hi);
      ++pi;
    }
  }
  return h.digest();
}

// A module region's label: the first module id with its path in the trace's table (0 when the
// table lacks it: a parent scope that was never entered itself). Regions of one scope share
// its path (Region::path_owner) and lie next to each other (sorted by path), so each scope's
// path is looked up once.
void label_module_regions(std::vector<Region>& regions, const record::ModuleTree& tree) {
  std::uint32_t label = 0;
  for (std::size_t i = 0; i < regions.size(); ++i) {
    Region& r = regions[i];
    if (r.kind != RegionKind::Module) continue;
    const bool same_scope = i > 0 && regions[i - 1].path_owner == r.path_owner &&
                            regions[i - 1].path_len == r.path_len;
    if (!same_scope) label = tree.label_of(r.module_path());
    r.label = label;
  }
}

ContentHash root_of(const std::vector<ContentHash>& node_hashes) {
  ContentHasher root;
  root.update_u64(node_hashes.size());
  {
    WordBatch w(root);
    for (const auto& h : node_hashes) {  // update_hash(h) each: lo, then hi
      w.add(h.lo);
      w.add(h.hi);
    }
  }
  return root.digest();
}
}  // namespace

MerkleDag MerkleDag::rebuild(const MerkleDag& last, const record::Trace& t, const TraceGraph& g,
                             std::span<const ContentHash> locals) {
  const std::size_t n = g.num_nodes();
  CRUCIBLE_PRE(locals.empty() || locals.size() == n, "one local hash per node, or none");
  CRUCIBLE_PRE(last.num_nodes() == n, "the last DAG is of a graph with this wiring");
  if (last.num_nodes() != n) return build(t, g, locals);  // observed (release): build afresh
  static const ExternalHashes ext;
  MerkleDag d;
  d.local_hashes_.resize(n);
  d.node_hashes_.resize(n);
  // changed_before[i]: how many of nodes 0..i-1 have a local hash other than last's.
  std::vector<std::uint32_t> changed_before(n + 1, 0);
  std::vector<bool> hash_changed(n, false);
  std::size_t xi = 0;
  const auto& externals = g.externals();
  for (std::size_t node = 0; node < n; ++node) {
    const ContentHash local =
        locals.empty() ? record::op_content(t, g.trace_op(node)) : locals[node];
    d.local_hashes_[node] = local;
    const bool local_changed = local != last.local_hashes_[node];
    changed_before[node + 1] = changed_before[node] + (local_changed ? 1u : 0u);
    bool dirty = local_changed;
    for (const Edge& e : g.predecessors(node)) dirty = dirty || hash_changed[e.node];
    if (dirty) {
      d.node_hashes_[node] = hash_node(g, node, local, d.node_hashes_, ext, xi);
      hash_changed[node] = d.node_hashes_[node] != last.node_hashes_[node];
    } else {
      d.node_hashes_[node] = last.node_hashes_[node];
      while (xi < externals.size() && externals[xi].node == node) ++xi;
    }
  }
  d.root_ = root_of(d.node_hashes_);
  // The same regions (they follow phases and modules, which the wiring fixes); a region's hash
  // reads its members' local hashes and internal wiring, so only regions with a changed local
  // hash are hashed again.
  d.regions_ = last.regions_;
  for (Region& r : d.regions_)
    if (changed_before[r.end] != changed_before[r.begin])
      r.hash = region_hash(g, d.local_hashes_, r.begin, r.end);
  // Labels from this trace's table: a path that was not interned when `last` was built (a
  // parent scope entered since) may have an id now.
  std::shared_ptr<const record::ModuleTree> own_tree;
  label_module_regions(d.regions_, t.module_tree_of(own_tree));
  return d;
}

MerkleDag MerkleDag::build(const record::Trace& t, const TraceGraph& g, std::span<const ContentHash> locals) {
  MerkleDag d;
  const std::size_t n = g.num_nodes();
  CRUCIBLE_PRE(locals.empty() || locals.size() == n, "one local hash per node, or none");
  d.local_hashes_.resize(n);
  d.node_hashes_.resize(n);
  static const ExternalHashes ext;
  std::size_t xi = 0;
  for (std::size_t node = 0; node < n; ++node) {
    d.local_hashes_[node] = locals.empty() ? record::op_content(t, g.trace_op(node)) : locals[node];
    d.node_hashes_[node] = hash_node(g, node, d.local_hashes_[node], d.node_hashes_, ext, xi);
  }
  d.root_ = root_of(d.node_hashes_);

  // Phase regions: maximal runs of one phase.
  const auto N = static_cast<std::uint32_t>(n);
  for (std::uint32_t b = 0, i = 1; i <= N; ++i) {
    if (i == N || g.phase(i) != g.phase(b)) {
      d.regions_.push_back(Region{RegionKind::Phase, static_cast<std::uint32_t>(g.phase(b)), b, i,
                                  region_hash(g, d.local_hashes_, b, i), nullptr, 0});
      b = i;
    }
  }
  // Module scope regions: for every scope (record::ModuleTree: a module path or a prefix of
  // one), maximal runs of nodes whose module runs inside it: a block's region holds its
  // submodules' ops too. One pass over the nodes; each node extends the open run of every scope
  // on its path. The scopes come with the trace (the recorder works them out once per module
  // table), else from its table here.
  std::shared_ptr<const record::ModuleTree> own_tree;
  const record::ModuleTree& tree = t.module_tree_of(own_tree);
  // Sized by the whole table's scopes, not the iteration's: zeroing them is the per-build cost
  // that grows with the table (as does the copy of the table itself, Recorder::key_and_copy).
  std::vector<std::uint32_t> open_begin(tree.num_scopes(), 0), open_end(tree.num_scopes(), 0);
  std::vector<std::uint32_t> touched;  // scopes with a run, in the order their first run opened
  struct Run {
    std::uint32_t scope, begin, end;
  };
  std::vector<Run> runs;
  for (std::uint32_t i = 0; i < N; ++i) {
    for (const std::uint32_t sc : tree.scopes_of(g.module_id(i))) {
      if (open_end[sc] == i && open_end[sc] != 0) {
        open_end[sc] = i + 1;  // contiguous: extend
        continue;
      }
      if (open_end[sc] != 0) runs.push_back(Run{sc, open_begin[sc], open_end[sc]});
      else touched.push_back(sc);
      open_begin[sc] = i;
      open_end[sc] = i + 1;
    }
  }
  for (const std::uint32_t sc : touched) runs.push_back(Run{sc, open_begin[sc], open_end[sc]});
  // Deterministic order: by path, then position.
  std::sort(runs.begin(), runs.end(), [&](const Run& a, const Run& b) {
    if (a.scope != b.scope) return tree.rank(a.scope) < tree.rank(b.scope);
    return a.begin < b.begin;
  });
  d.regions_.reserve(d.regions_.size() + runs.size());
  for (const Run& r : runs)
    d.regions_.push_back(Region{RegionKind::Module, tree.label(r.scope), r.begin, r.end,
                                region_hash(g, d.local_hashes_, r.begin, r.end),
                                tree.owner(r.scope), tree.path_len(r.scope)});
  return d;
}

}  // namespace crucible::graph
