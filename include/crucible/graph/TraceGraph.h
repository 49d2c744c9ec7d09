// TraceGraph.h — the dataflow graph of a range of recorded ops, as bidirectional CSR.
//
// Nodes are ops (in execution order). An edge p -> c says c read a tensor p produced. Dataflow
// is keyed by (storage id, version), never by address: the caching allocator reuses addresses,
// and an in-place op produces a new version of its storage, so a reader links to the op that
// wrote the version it read. Edge kinds:
//   DATA_FLOW  c consumes the value p produced;
//   ALIAS      c is a view of p's output (c's output shares the storage at the same version).
// Inputs no op in the range produced are the graph's externals (parameters, batch, state...).
// Storages are looked up by their number in the ops' record::StorageNumbering (Note [Storage
// numbering]), not by id in a hash map.
//
// CSR: fwd_offsets[n+1] / fwd_edges for successors, rev_offsets[n+1] / rev_edges for
// predecessors; each edge stores (other node, kind, input slot of the consumer). A node's
// predecessors are in increasing slot order, at most one per slot; externals() is in node order,
// then slot order. The Merkle hashes rely on both orders.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "crucible/record/Trace.h"

namespace crucible::graph {

enum class EdgeKind : std::uint8_t { DataFlow = 0, Alias = 1 };

struct Edge {
  std::uint32_t node;  // successor (forward lists) or predecessor (reverse lists)
  std::uint32_t slot;  // which tensor input of the consumer (32 bits: a TensorList has no cap)
  EdgeKind kind;
  std::uint8_t reserved[3] = {};
};
static_assert(sizeof(Edge) == 12);

struct ExternalInput {
  std::uint32_t node;   // consumer
  std::uint32_t slot;   // its tensor input index
  std::uint8_t kind;    // the storage's record::ExternalKind, 0 when the trace does not say
  std::uint64_t storage_id;
  std::uint32_t version;
  std::uint32_t storage_number;  // in the graph's numbering (record::StorageNumbering)
};

class TraceGraph {
 public:
  // Builds the graph of trace ops `ops` (indices into t.ops, in execution order).
  static TraceGraph build(const record::Trace& t, std::span<const std::size_t> ops);
  // The same, with the ops' storage numbering already made (record::number_storages, or the
  // structure key's pass); the graph keeps it for the analyses built on it.
  static TraceGraph build(const record::Trace& t, std::span<const std::size_t> ops, record::StorageNumbering numbering);
  // This graph for other ops with the same wiring key (Note [Wiring key], Trace.h): the same
  // nodes and edges, with their numbering (whose storage ids are theirs) and the externals'
  // storage ids and versions read from them. Empty when what can be checked without the ops
  // this graph was built from shows another wiring (op count, storage numbers, versions,
  // kinds, a node's phase or module, an external's slot): build afresh then.
  std::optional<TraceGraph> rebased(const record::Trace& t, std::span<const std::size_t> ops,
                                    record::StorageNumbering numbering) const;

  std::size_t num_nodes() const { return ops_.size(); }
  std::size_t num_edges() const { return fwd_edges_.size(); }
  std::size_t trace_op(std::size_t node) const { return ops_[node]; }
  std::span<const Edge> successors(std::size_t node) const {
    return {fwd_edges_.data() + fwd_offsets_[node], fwd_offsets_[node + 1] - fwd_offsets_[node]};
  }
  std::span<const Edge> predecessors(std::size_t node) const {
    return {rev_edges_.data() + rev_offsets_[node], rev_offsets_[node + 1] - rev_offsets_[node]};
  }
  record::Phase phase(std::size_t node) const { return phases_[node]; }
  std::uint32_t module_id(std::size_t node) const { return modules_[node]; }
  const std::vector<ExternalInput>& externals() const { return externals_; }
  const record::StorageNumbering& numbering() const { return numbering_; }

 private:
  std::vector<std::size_t> ops_;
  std::vector<record::Phase> phases_;
  std::vector<std::uint32_t> modules_;
  std::vector<std::uint32_t> fwd_offsets_, rev_offsets_;
  std::vector<Edge> fwd_edges_, rev_edges_;
  std::vector<ExternalInput> externals_;
  record::StorageNumbering numbering_;
};

}  // namespace crucible::graph
