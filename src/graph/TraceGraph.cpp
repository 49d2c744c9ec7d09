// TraceGraph.cpp — producer lookup by (storage, version) and CSR construction.
#include "crucible/graph/TraceGraph.h"

#include "absl/container/flat_hash_map.h"

namespace crucible::graph {
namespace {
struct Key {
  std::uint64_t storage;
  std::uint32_t version;
  bool operator==(const Key&) const = default;
  template <class H>
  friend H AbslHashValue(H h, const Key& k) { return H::combine(std::move(h), k.storage, k.version); }
};
struct Producer {
  std::uint32_t node;
};
}  // namespace

TraceGraph TraceGraph::build(const record::Trace& t, std::span<const std::size_t> ops) {
  TraceGraph g;
  const std::size_t n = ops.size();
  g.ops_.assign(ops.begin(), ops.end());
  g.phases_.resize(n);
  g.modules_.resize(n);
  absl::flat_hash_map<Key, Producer> last_writer;
  last_writer.reserve(3 * n);
  struct Raw { std::uint32_t from, to; std::uint16_t slot; EdgeKind kind; };
  std::vector<Raw> raw;
  raw.reserve(3 * n);
  for (std::size_t node = 0; node < n; ++node) {
    const std::size_t op = ops[node];
    g.phases_[node] = t.ops[op].phase;
    g.modules_[node] = t.ops[op].module_id;
    const auto ins = t.inputs(op);
    const auto outs = t.outputs(op);
    for (std::size_t k = 0; k < ins.size(); ++k) {
      const auto& m = ins[k];
      if (m.flags & record::tensor_flag::kNoStorage || m.storage_id == 0) continue;
      auto it = last_writer.find(Key{m.storage_id, m.version});
      // A view op's output shares the input's storage at the same version: an alias edge.
      bool alias = false;
      for (const auto& o : outs)
        alias |= o.storage_id == m.storage_id && o.version == m.version;
      if (it == last_writer.end()) {
        g.externals_.push_back({static_cast<std::uint32_t>(node), static_cast<std::uint16_t>(k), m.storage_id, m.version});
      } else if (it->second.node != node) {
        raw.push_back({it->second.node, static_cast<std::uint32_t>(node), static_cast<std::uint16_t>(k),
                       alias ? EdgeKind::Alias : EdgeKind::DataFlow});
      }
    }
    for (const auto& o : outs) {
      if (o.flags & record::tensor_flag::kNoStorage || o.storage_id == 0) continue;
      last_writer[Key{o.storage_id, o.version}] = Producer{static_cast<std::uint32_t>(node)};
    }
  }
  // CSR in both directions (counting sort by endpoint keeps edges in input order).
  g.fwd_offsets_.assign(n + 1, 0);
  g.rev_offsets_.assign(n + 1, 0);
  for (const Raw& e : raw) {
    ++g.fwd_offsets_[e.from + 1];
    ++g.rev_offsets_[e.to + 1];
  }
  for (std::size_t i = 0; i < n; ++i) {
    g.fwd_offsets_[i + 1] += g.fwd_offsets_[i];
    g.rev_offsets_[i + 1] += g.rev_offsets_[i];
  }
  g.fwd_edges_.resize(raw.size());
  g.rev_edges_.resize(raw.size());
  std::vector<std::uint32_t> fpos(g.fwd_offsets_.begin(), g.fwd_offsets_.end() - 1);
  std::vector<std::uint32_t> rpos(g.rev_offsets_.begin(), g.rev_offsets_.end() - 1);
  for (const Raw& e : raw) {
    g.fwd_edges_[fpos[e.from]++] = Edge{e.to, e.slot, e.kind};
    g.rev_edges_[rpos[e.to]++] = Edge{e.from, e.slot, e.kind};
  }
  return g;
}

}  // namespace crucible::graph
