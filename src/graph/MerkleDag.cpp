// MerkleDag.cpp — node, region and root hashes.
#include "crucible/graph/MerkleDag.h"

#include <algorithm>
#include <string>
#include <string_view>

#include "absl/container/flat_hash_map.h"
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

// A module region's label: the id of its path in the trace's module table (the first entry
// with that path), 0 when the table lacks it (a parent scope that was never entered itself).
// Regions of one scope share its path (Region::path_owner) and lie next to each other (sorted
// by path), so each scope's path is looked up once.
void label_module_regions(std::vector<Region>& regions, const record::Trace& t) {
  absl::flat_hash_map<std::string_view, std::uint32_t> id_of_path;
  auto same_scope = [](const Region& a, const Region& b) {
    return a.path_owner == b.path_owner && a.path_len == b.path_len;
  };
  for (std::size_t i = 0; i < regions.size(); ++i)
    if (regions[i].kind == RegionKind::Module &&
        (i == 0 || !same_scope(regions[i], regions[i - 1])))
      id_of_path.emplace(regions[i].module_path(), 0);
  if (id_of_path.empty()) return;
  for (std::size_t k = 0; k < t.module_paths.size(); ++k)
    if (auto it = id_of_path.find(t.module_paths[k]); it != id_of_path.end() && it->second == 0)
      it->second = static_cast<std::uint32_t>(k);
  std::uint32_t label = 0;
  for (std::size_t i = 0; i < regions.size(); ++i) {
    Region& r = regions[i];
    if (r.kind != RegionKind::Module) continue;
    if (i == 0 || !same_scope(r, regions[i - 1])) label = id_of_path[r.module_path()];
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
  label_module_regions(d.regions_, t);
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
  // Module scope regions: for every module path P seen, maximal runs of nodes whose path is P
  // or inside it (P + "."): a block's region holds its submodules' ops too. One pass over the
  // nodes; each node extends the open run of every scope on its path.
  // Scopes are found once per distinct module id, one path component at a time (a scope is
  // its parent scope plus one component), so a path costs its length, however deep it is.
  // Every scope a path opens shares one copy of that path (Region::path_owner).
  std::uint32_t max_module = 0;
  for (std::uint32_t i = 0; i < N; ++i) max_module = std::max(max_module, g.module_id(i));
  constexpr std::size_t kRoot = SIZE_MAX;
  // (parent scope, component) -> scope; the components view t's strings, which outlive this.
  absl::flat_hash_map<std::pair<std::size_t, std::string_view>, std::size_t> scope_index;
  struct Scope {
    std::shared_ptr<const std::string> owner;
    std::size_t len;
    std::string_view path() const { return std::string_view(*owner).substr(0, len); }
  };
  std::vector<Scope> scopes;
  std::vector<std::vector<std::size_t>> scopes_of(
      N == 0 ? 0 : std::size_t{max_module} + 1);  // module id -> scopes
  std::vector<bool> module_seen(scopes_of.size(), false);
  for (std::uint32_t i = 0; i < N; ++i) {
    const std::uint32_t mod = g.module_id(i);
    if (module_seen[mod]) continue;
    module_seen[mod] = true;
    const std::string_view p = t.module_path(mod);
    std::shared_ptr<const std::string> owner;  // made when the path opens a scope not seen yet
    std::size_t parent = kRoot;
    // Components end at each '.' after the first character (a leading '.' belongs to the first).
    for (std::size_t start = 0; !p.empty() && start <= p.size();) {
      std::size_t dot = p.find('.', start == 0 ? 1 : start);
      if (dot == std::string_view::npos) dot = p.size();
      auto [it, added] =
          scope_index.emplace(std::pair{parent, p.substr(start, dot - start)}, scopes.size());
      if (added) {
        if (!owner) owner = std::make_shared<const std::string>(p);
        scopes.push_back(Scope{owner, dot});
      }
      scopes_of[mod].push_back(it->second);
      parent = it->second;
      start = dot + 1;
    }
  }
  std::vector<std::uint32_t> open_begin(scopes.size(), 0), open_end(scopes.size(), 0);
  std::vector<std::pair<std::uint32_t, std::size_t>> runs;  // (begin, scope) of closed runs, and ends
  std::vector<std::uint32_t> run_end;
  auto close = [&](std::size_t sc) {
    runs.emplace_back(open_begin[sc], sc);
    run_end.push_back(open_end[sc]);
  };
  for (std::uint32_t i = 0; i < N; ++i) {
    for (std::size_t sc : scopes_of[g.module_id(i)]) {
      if (open_end[sc] != 0 && open_end[sc] == i) {
        open_end[sc] = i + 1;  // contiguous: extend
      } else {
        if (open_end[sc] != 0) close(sc);
        open_begin[sc] = i;
        open_end[sc] = i + 1;
      }
    }
  }
  for (std::size_t sc = 0; sc < scopes.size(); ++sc)
    if (open_end[sc] != 0) close(sc);
  // Deterministic order: by path, then position (the scopes ranked by path once, so runs
  // compare by rank).
  std::vector<std::size_t> by_path(scopes.size());
  for (std::size_t k = 0; k < by_path.size(); ++k) by_path[k] = k;
  std::sort(by_path.begin(), by_path.end(),
            [&](std::size_t a, std::size_t b) { return scopes[a].path() < scopes[b].path(); });
  std::vector<std::size_t> rank(scopes.size());
  for (std::size_t k = 0; k < by_path.size(); ++k) rank[by_path[k]] = k;
  std::vector<std::size_t> order(runs.size());
  for (std::size_t k = 0; k < order.size(); ++k) order[k] = k;
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    if (runs[a].second != runs[b].second) return rank[runs[a].second] < rank[runs[b].second];
    return runs[a].first < runs[b].first;
  });
  for (std::size_t k : order) {
    const Scope& sc = scopes[runs[k].second];
    d.regions_.push_back(Region{RegionKind::Module, 0, runs[k].first, run_end[k],
                                region_hash(g, d.local_hashes_, runs[k].first, run_end[k]),
                                sc.owner, sc.len});
  }
  label_module_regions(d.regions_, t);
  return d;
}

}  // namespace crucible::graph
