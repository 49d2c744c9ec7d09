// MerkleDag.h — content hashes of a TraceGraph's nodes and of its regions.
//
// Node hash (Merkle): the node's local hash, record::op_content (schema, every tensor's shape,
// stride, dtype, device, layout, the scalar arguments; not requires_grad: the first layer's
// input needs no grad, the second layer's does, and they still compute the same thing), and
// for each input the hash of the node that produced it (or, for an external input, its
// classification as the graph recorded it when it was built; its metadata is in the local hash). Data pointers,
// storage ids and versions are never hashed: the same model recorded in two processes gets the
// same hashes, and changing one shape or dtype changes the hash of that node and everything
// downstream.
//
// Region hash (structural): the hash of a contiguous group of nodes as a computation on its
// own: each member's local content plus the shape of its internal wiring (which member and
// slot feeds which), with inputs from outside the region described by metadata only. Two
// identical transformer blocks therefore get the same region hash though their node hashes
// differ (their inputs come from different places). Regions: one per phase, one per module
// scope (consecutive nodes of one module path).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "crucible/core/ContentHash.h"
#include "crucible/graph/TraceGraph.h"

namespace crucible::graph {

enum class RegionKind : std::uint8_t { Phase = 0, Module = 1 };

struct Region {
  RegionKind kind;
  std::uint32_t label;          // Phase value, or module id (0 if the path was never entered)
  std::uint32_t begin, end;     // node range [begin, end)
  ContentHash hash;             // structural (see above)
  // A module region's path is the first path_len bytes of *path_owner: a copy of the first
  // module path that opened the scope, shared by every scope that path opened and by all their
  // regions. A module called again and again (its regions one per run) or a deep path costs one
  // copy of the path, not one per region and per level.
  std::shared_ptr<const std::string> path_owner;
  std::size_t path_len = 0;
  std::string_view module_path() const {
    return path_owner ? std::string_view(*path_owner).substr(0, path_len) : std::string_view();
  }
};

class MerkleDag {
 public:
  // `locals`: the nodes' local hashes (record::op_content of each node's op) when the caller
  // has them already (the pipeline's drain computes them); empty, they are computed here.
  static MerkleDag build(const record::Trace& t, const TraceGraph& g, std::span<const ContentHash> locals = {});
  // The same DAG, built from `last`, the DAG of a graph with g's wiring (Note [Wiring key],
  // Trace.h: same nodes, edges, externals' kinds, phases and modules): a node is hashed again
  // only when its local hash or a predecessor's node hash differs from last's, and a region
  // only when a member's local hash does. The regions are last's. AdamW's steps differ in the
  // scalars of a few optimizer ops, whose updates feed nothing else in the step.
  static MerkleDag rebuild(const MerkleDag& last, const record::Trace& t, const TraceGraph& g,
                           std::span<const ContentHash> locals = {});

  const ContentHash& node_hash(std::size_t node) const { return node_hashes_[node]; }
  const ContentHash& root() const { return root_; }  // hash of every node hash, in order
  const std::vector<Region>& regions() const { return regions_; }
  std::size_t num_nodes() const { return node_hashes_.size(); }

 private:
  std::vector<ContentHash> node_hashes_;
  std::vector<ContentHash> local_hashes_;
  std::vector<Region> regions_;
  ContentHash root_;
};

// Hash of the region [begin, end) of g (structural, as described above).
ContentHash region_hash(const TraceGraph& g, const std::vector<ContentHash>& local_hashes,
                        std::uint32_t begin, std::uint32_t end);

}  // namespace crucible::graph
