// MerkleDag.h — content hashes of a TraceGraph's nodes and of its regions.
//
// Node hash (Merkle): schema, every input's (shape, stride, dtype, device, layout), every
// output's metadata (requires_grad is not part of it: the first layer's input needs no grad,
// the second layer's does, and they still compute the same thing), the scalar arguments, and for each input the hash of the node that
// produced it (or, for an external input, its classification and metadata). Data pointers,
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
#include <string>
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
  std::string module_path;      // for module regions
};

class MerkleDag {
 public:
  static MerkleDag build(const record::Trace& t, const TraceGraph& g);

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
