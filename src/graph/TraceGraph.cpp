// TraceGraph.cpp — producer lookup by (storage, version) and CSR construction.
#include "crucible/graph/TraceGraph.h"

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "crucible/core/Contract.h"

namespace crucible::graph {

TraceGraph TraceGraph::build(const record::Trace& t, std::span<const std::size_t> ops) {
  return build(t, ops, record::number_storages(t, ops));
}

TraceGraph TraceGraph::build(const record::Trace& t, std::span<const std::size_t> ops, record::StorageNumbering numbering) {
  TraceGraph g;
  const std::size_t n = ops.size();
  // The numbering must be of these ops: one number per tensor, naming the tensor's own storage
  // (checked per tensor: a numbering of other ops with as many tensors would give wrong edges,
  // and a number past the table would index out of bounds below).
  bool fits = numbering.kinds.size() == numbering.storages.size();
  std::size_t n_tensors = 0;
  for (std::size_t op : ops) {
    const std::size_t base = t.op_tensor_begin[op], count = t.ops[op].n_tensors;
    fits = fits && n_tensors + count <= numbering.storage.size();
    for (std::size_t k = 0; fits && k < count; ++k) {
      const std::uint32_t s = numbering.storage[n_tensors + k];
      const std::uint64_t id = t.tensors[base + k].storage_id;
      fits = s == 0 ? id == 0 : s <= numbering.storages.size() && numbering.storages[s - 1] == id;
    }
    n_tensors += count;
  }
  fits = fits && numbering.storage.size() == n_tensors && numbering.version.size() == n_tensors;
  CRUCIBLE_PRE(fits, "the numbering is of these ops, with their kinds");
  if (!fits) numbering = record::number_storages(t, ops);  // observed (release): go on with a right one
  g.ops_.assign(ops.begin(), ops.end());
  g.phases_.resize(n);
  g.modules_.resize(n);
  // Every write of each storage, newest first: head[number] indexes writes, and each write
  // links to the one before. A reader almost always wants the newest; an older version (a
  // tensor whose version counter is not its storage's, as .data gives) walks back, and a
  // version no op wrote (an external) walks them all. A real step writes a storage a few times
  // (an in-place op or two), but a loaded trace can write one storage at every op and read
  // unwritten versions: past kWalk steps the lookup goes to an index of (storage, version) ->
  // newest write, built then and kept up from there on, so no trace makes this quadratic.
  constexpr std::uint32_t kNone = UINT32_MAX;
  constexpr int kWalk = 8;
  struct Write {
    std::uint32_t version, node, prev;
  };
  std::vector<std::uint32_t> head(numbering.num_storages() + 1, kNone);
  std::vector<Write> writes;
  writes.reserve(n_tensors);
  std::vector<std::uint32_t> write_number;  // for the index: each write's storage number
  write_number.reserve(n_tensors);
  bool indexed = false;
  absl::flat_hash_map<std::uint64_t, std::uint32_t> newest;  // (number << 32 | version) -> write
  auto key = [](std::uint32_t s, std::uint32_t v) { return std::uint64_t{s} << 32 | v; };
  auto find_write = [&](std::uint32_t s, std::uint32_t v) {
    std::uint32_t w = head[s];
    for (int step = 0; w != kNone && writes[w].version != v; ++step) {
      if (step == kWalk) {
        if (!indexed) {
          indexed = true;
          for (std::uint32_t i = 0; i < writes.size(); ++i)
            newest[key(write_number[i], writes[i].version)] = i;
        }
        auto it = newest.find(key(s, v));
        return it == newest.end() ? kNone : it->second;
      }
      w = writes[w].prev;
    }
    return w;
  };
  // An output equal to an input in storage and version (a view op's) makes the input's edge an
  // alias: out_mark[number] is node + 1 when the node outputs that storage, with its version
  // (kMixed: several versions, then a set of the op's output pairs answers), so the check is
  // O(1) per input.
  constexpr std::uint32_t kMixed = UINT32_MAX;
  std::vector<std::uint32_t> out_mark(numbering.num_storages() + 1, 0),
      out_mark_version(numbering.num_storages() + 1, 0);
  absl::flat_hash_set<std::uint64_t> mixed_outputs;
  struct Raw {
    std::uint32_t from, to, slot;
    EdgeKind kind;
  };
  std::vector<Raw> raw;
  raw.reserve(3 * n);
  const std::uint32_t* number = numbering.storage.data();
  const std::uint32_t* version = numbering.version.data();
  for (std::size_t node = 0; node < n; ++node) {
    const std::size_t op = ops[node];
    g.phases_[node] = t.ops[op].phase;
    g.modules_[node] = t.ops[op].module_id;
    const auto ins = t.inputs(op);
    const auto outs = t.outputs(op);
    const std::uint32_t* out_number = number + ins.size();
    const std::uint32_t* out_version = version + ins.size();
    const auto mark = static_cast<std::uint32_t>(node + 1);
    bool mixed = false;
    for (std::size_t j = 0; j < outs.size(); ++j) {
      const std::uint32_t s = out_number[j];
      if (out_mark[s] != mark) {
        out_mark[s] = mark;
        out_mark_version[s] = out_version[j];
      } else if (out_mark_version[s] != out_version[j]) {
        out_mark_version[s] = kMixed;
        mixed = true;
      }
    }
    mixed_outputs.clear();  // (storage, version) of every output, for storages marked kMixed
    if (mixed)
      for (std::size_t j = 0; j < outs.size(); ++j)
        mixed_outputs.insert(key(out_number[j], out_version[j]));
    for (std::size_t k = 0; k < ins.size(); ++k) {
      const std::uint32_t s = number[k], v = version[k];
      if (ins[k].flags & record::tensor_flag::kNoStorage || s == 0) continue;
      const std::uint32_t w = find_write(s, v);
      // A view op's output shares the input's storage at the same version: an alias edge.
      bool alias = false;
      if (out_mark[s] == mark) {
        alias = out_mark_version[s] != kMixed ? out_mark_version[s] == v
                                              : mixed_outputs.contains(key(s, v));
      }
      if (w == kNone) {
        g.externals_.push_back({static_cast<std::uint32_t>(node), static_cast<std::uint32_t>(k),
                                numbering.kinds[s - 1], ins[k].storage_id, ins[k].version, s});
      } else if (writes[w].node != node) {
        raw.push_back({writes[w].node, static_cast<std::uint32_t>(node),
                       static_cast<std::uint32_t>(k),
                       alias ? EdgeKind::Alias : EdgeKind::DataFlow});
      }
    }
    for (std::size_t j = 0; j < outs.size(); ++j) {
      const std::uint32_t s = out_number[j];
      if (outs[j].flags & record::tensor_flag::kNoStorage || s == 0) continue;
      writes.push_back({out_version[j], static_cast<std::uint32_t>(node), head[s]});
      head[s] = static_cast<std::uint32_t>(writes.size() - 1);
      write_number.push_back(s);
      if (indexed) newest[key(s, out_version[j])] = head[s];
    }
    number += ins.size() + outs.size();
    version += ins.size() + outs.size();
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
  g.numbering_ = std::move(numbering);
  return g;
}

std::optional<TraceGraph> TraceGraph::rebased(const record::Trace& t,
                                              std::span<const std::size_t> ops,
                                              record::StorageNumbering numbering) const {
  if (ops.size() != ops_.size() || numbering.storage != numbering_.storage ||
      numbering.version != numbering_.version || numbering.kinds != numbering_.kinds ||
      numbering.storages.size() != numbering_.storages.size())
    return std::nullopt;
  for (std::size_t node = 0; node < ops.size(); ++node) {
    const std::size_t op = ops[node];
    if (op >= t.num_ops() || t.ops[op].phase != phases_[node] ||
        t.ops[op].module_id != modules_[node])
      return std::nullopt;
  }
  TraceGraph g = *this;
  g.ops_.assign(ops.begin(), ops.end());
  for (ExternalInput& x : g.externals_) {
    const std::size_t op = ops[x.node];
    if (x.slot >= t.ops[op].n_inputs || x.storage_number == 0 ||
        x.storage_number > numbering.storages.size())
      return std::nullopt;
    const record::TensorMeta& m = t.tensors[t.op_tensor_begin[op] + x.slot];
    if (m.storage_id != numbering.storages[x.storage_number - 1]) return std::nullopt;
    x.storage_id = m.storage_id;
    x.version = m.version;
  }
  g.numbering_ = std::move(numbering);
  return g;
}

}  // namespace crucible::graph
