// MerkleDag.cpp — node, region and root hashes.
#include "crucible/graph/MerkleDag.h"

#include <algorithm>
#include <map>
#include <string>
#include <tuple>
#include <unordered_map>

namespace crucible::graph {
namespace {

void hash_meta(ContentHasher& h, const record::Trace& t, std::size_t tensor_index) {
  const auto& m = t.tensors[tensor_index];
  h.update_u8(static_cast<std::uint8_t>(m.dtype)).update_u8(m.device_kind).update_u8(m.layout);
  h.update_u8(static_cast<std::uint8_t>(m.device_index));
  h.update_u8(m.flags & record::tensor_flag::kWrappedNumber);  // not requires_grad: see header
  h.update_u32(m.arg_index).update_u32(m.list_index);
  h.update_i64(m.storage_offset);
  for (std::int64_t d : t.sizes(tensor_index)) h.update_i64(d);
  h.update_u8(0xFE);
  for (std::int64_t d : t.strides(tensor_index)) h.update_i64(d);
  h.update_u8(0xFF);
  if (m.flags & record::tensor_flag::kWrappedNumber) h.update_f64(m.wrapped_value);
}

// Everything about the op itself: schema, tensor metadata, scalar arguments.
ContentHash local_hash(const record::Trace& t, std::size_t op) {
  ContentHasher h;
  h.update_u64(t.ops[op].schema_hash).update_u8(static_cast<std::uint8_t>(t.ops[op].phase));
  h.update_u32(t.ops[op].n_inputs).update_u32(t.ops[op].n_tensors);
  const std::size_t base = t.op_tensor_begin[op];
  for (std::size_t k = 0; k < t.ops[op].n_tensors; ++k) hash_meta(h, t, base + k);
  for (const auto& s : t.scalars_of(op)) {
    h.update_u8(static_cast<std::uint8_t>(s.kind)).update_u32(s.arg_index).update_u32(s.aux);
    h.update_u64(s.bits);
  }
  return h.digest();
}

}  // namespace

ContentHash region_hash(const TraceGraph& g, const std::vector<ContentHash>& local,
                        std::uint32_t begin, std::uint32_t end) {
  ContentHasher h;
  h.update_u32(end - begin);
  for (std::uint32_t n = begin; n < end; ++n) {
    h.update_hash(local[n]);
    // Only wiring inside the region: an input from outside (another region or an external) is
    // described by its metadata in the local hash, wherever it comes from.
    std::vector<std::tuple<std::uint16_t, std::int64_t, std::uint8_t>> wires;
    for (const Edge& e : g.predecessors(n))
      if (e.node >= begin && e.node < end)
        wires.emplace_back(e.slot, static_cast<std::int64_t>(n - e.node), static_cast<std::uint8_t>(e.kind));
    std::sort(wires.begin(), wires.end());
    for (auto [slot, rel, kind] : wires) h.update_u32(slot).update_i64(rel).update_u8(kind);
    h.update_u8(0xFF);
  }
  return h.digest();
}

MerkleDag MerkleDag::build(const record::Trace& t, const TraceGraph& g) {
  MerkleDag d;
  const std::size_t n = g.num_nodes();
  d.local_hashes_.resize(n);
  d.node_hashes_.resize(n);
  // Externals by consumer and slot, classified when the trace knows why they are external.
  std::vector<std::vector<std::pair<std::uint16_t, std::uint8_t>>> ext(n);
  for (const auto& x : g.externals()) {
    auto it = t.externals.find(x.storage_id);
    ext[x.node].emplace_back(x.slot, it == t.externals.end() ? 0 : static_cast<std::uint8_t>(it->second));
  }
  for (std::size_t node = 0; node < n; ++node) {
    d.local_hashes_[node] = local_hash(t, g.trace_op(node));
    ContentHasher h;
    h.update_hash(d.local_hashes_[node]);
    // Producers in slot order (edges are appended in slot order; sort to be safe).
    std::vector<std::pair<std::uint16_t, ContentHash>> ins;
    for (const Edge& e : g.predecessors(node)) ins.emplace_back(e.slot, d.node_hashes_[e.node]);
    for (auto [slot, kind] : ext[node]) {
      ContentHasher x;
      x.update_string("external").update_u8(kind);
      ins.emplace_back(slot, x.digest());
    }
    std::sort(ins.begin(), ins.end());
    for (const auto& [slot, hh] : ins) h.update_u32(slot).update_hash(hh);
    d.node_hashes_[node] = h.digest();
  }
  ContentHasher root;
  root.update_u64(n);
  for (const auto& h : d.node_hashes_) root.update_hash(h);
  d.root_ = root.digest();

  // Phase regions: maximal runs of one phase.
  const auto N = static_cast<std::uint32_t>(n);
  for (std::uint32_t b = 0, i = 1; i <= N; ++i) {
    if (i == N || g.phase(i) != g.phase(b)) {
      d.regions_.push_back(Region{RegionKind::Phase, static_cast<std::uint32_t>(g.phase(b)), b, i,
                                  region_hash(g, d.local_hashes_, b, i), ""});
      b = i;
    }
  }
  // Module scope regions: for every module path P seen, maximal runs of nodes whose path is P
  // or inside it (P + "."): a block's region holds its submodules' ops too. One pass over the
  // nodes; each node extends the open run of every scope on its path.
  std::map<std::string, std::size_t> scope_index;  // path -> scope slot
  std::vector<std::string> scope_path;
  std::unordered_map<std::uint32_t, std::vector<std::size_t>> scopes_of;  // module id -> scopes
  for (std::uint32_t i = 0; i < N; ++i) {
    const std::uint32_t mod = g.module_id(i);
    if (scopes_of.count(mod)) continue;
    std::vector<std::size_t>& list = scopes_of[mod];
    const std::string& p = t.module_path(mod);
    for (std::size_t dot = 0; !p.empty() && dot != std::string::npos;) {
      dot = p.find('.', dot + 1);
      auto [it, added] = scope_index.emplace(p.substr(0, dot), scope_path.size());
      if (added) scope_path.push_back(it->first);
      list.push_back(it->second);
    }
  }
  std::unordered_map<std::string, std::uint32_t> id_of_path;
  for (std::size_t k = 0; k < t.module_paths.size(); ++k)
    id_of_path.emplace(t.module_paths[k], static_cast<std::uint32_t>(k));
  std::vector<std::uint32_t> open_begin(scope_path.size(), 0), open_end(scope_path.size(), 0);
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
  for (std::size_t sc = 0; sc < scope_path.size(); ++sc)
    if (open_end[sc] != 0) close(sc);
  // Deterministic order: by path, then position.
  std::vector<std::size_t> order(runs.size());
  for (std::size_t k = 0; k < order.size(); ++k) order[k] = k;
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    if (scope_path[runs[a].second] != scope_path[runs[b].second])
      return scope_path[runs[a].second] < scope_path[runs[b].second];
    return runs[a].first < runs[b].first;
  });
  for (std::size_t k : order) {
    const std::string& path = scope_path[runs[k].second];
    auto idit = id_of_path.find(path);
    d.regions_.push_back(Region{RegionKind::Module, idit == id_of_path.end() ? 0 : idit->second,
                                runs[k].first, run_end[k],
                                region_hash(g, d.local_hashes_, runs[k].first, run_end[k]), path});
  }
  return d;
}

}  // namespace crucible::graph
