// Trace.h — everything a recording produced, in memory: ops, tensor metadata, scalars, names.
//
// A Trace is what the drain thread accumulates, what flush() makes complete, what export writes
// to a .crtrace file and what load gives back. It is plain data (vectors of the fixed-size
// records from TraceRecord.h) plus derived per-op offsets, so it can be copied and compared.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "crucible/core/ContentHash.h"
#include "crucible/core/Contract.h"
#include "crucible/core/HugePageAllocator.h"
#include "crucible/record/ModuleTree.h"
#include "crucible/record/TraceRecord.h"

namespace crucible::record {

struct ThreadStats {
  std::uint32_t thread = 0;
  std::uint64_t ops[kNumPhases] = {};  // recorded, per phase
  std::uint64_t dropped = 0;           // ops counted but not recorded (drop mode, ring full)
  std::uint64_t bytes = 0;             // ring bytes written (entries + meta cells + scalars)
  std::uint64_t waits = 0;             // times the producer waited for the drain (back-pressure)
  std::uint64_t total_ops() const {
    std::uint64_t n = 0;
    for (const std::uint64_t o : ops) n += o;
    return n;
  }
  bool operator==(const ThreadStats&) const = default;
};

// Why a tensor that no recorded op produced is an input of the trace.
enum class ExternalKind : std::uint8_t {
  Parameter = 1, Buffer = 2, Gradient = 3, OptimizerState = 4, Input = 5, Constant = 6,
};
inline constexpr std::uint8_t kMaxExternalKind = 6;
const char* external_kind_name(ExternalKind k) noexcept;

class Trace {
 public:
  // The arrays that grow with the recording ask for huge pages (Note [Huge pages for the trace]).
  template <class T>
  using Array = std::vector<T, HugePageAllocator<T>>;
  Array<TraceEntry> ops;
  Array<TensorMeta> tensors;        // inputs then outputs of each op, in op order
  Array<std::int64_t> dims;         // per tensor: ndim sizes then ndim strides
  Array<ScalarRecord> scalars;      // per op, in op order
  std::map<std::uint64_t, std::string> schema_names;  // schema_hash -> "aten::add.Tensor"
  std::vector<std::string> module_paths;              // module_id -> "layer1.0.conv1"; [0] = ""
  // The scopes of module_paths, when whoever made this trace had them (the recorder's copies
  // share the recorder's, built once per table); null otherwise, and then worked out where
  // needed (module_tree_of). Whoever edits module_paths resets it. Not part of the trace's
  // value: operator== ignores it.
  std::shared_ptr<const ModuleTree> module_tree;
  std::vector<ThreadStats> threads;
  // storage_id -> why it is external. A hash map: every build looks up hundreds of storages in
  // it (a std::map's pointer chase was a tenth of the Merkle DAG's time); save sorts it.
  absl::flat_hash_map<std::uint64_t, ExternalKind> externals;

  // Derived offsets (rebuilt by append/validate): first tensor / scalar / dim of each op/tensor.
  Array<std::uint64_t> op_tensor_begin, op_scalar_begin, tensor_dims_begin;

  std::size_t num_ops() const { return ops.size(); }
  // Inline: the graph stage calls these once or twice per op in every pass.
  std::span<const TensorMeta> inputs(std::size_t op) const {
    CRUCIBLE_PRE(op < ops.size(), "op index in range");
    return {tensors.data() + op_tensor_begin[op], ops[op].n_inputs};
  }
  std::span<const TensorMeta> outputs(std::size_t op) const {
    CRUCIBLE_PRE(op < ops.size(), "op index in range");
    return {tensors.data() + op_tensor_begin[op] + ops[op].n_inputs,
            ops[op].n_tensors - ops[op].n_inputs};
  }
  std::span<const ScalarRecord> scalars_of(std::size_t op) const {
    CRUCIBLE_PRE(op < ops.size(), "op index in range");
    return {scalars.data() + op_scalar_begin[op], ops[op].n_scalars};
  }
  std::span<const std::int64_t> sizes(std::size_t tensor) const {
    CRUCIBLE_PRE(tensor < tensors.size(), "tensor index in range");
    return {dims.data() + tensor_dims_begin[tensor], tensors[tensor].ndim};
  }
  std::span<const std::int64_t> strides(std::size_t tensor) const {
    CRUCIBLE_PRE(tensor < tensors.size(), "tensor index in range");
    return {dims.data() + tensor_dims_begin[tensor] + tensors[tensor].ndim, tensors[tensor].ndim};
  }
  std::size_t tensor_index(const TensorMeta* t) const { return static_cast<std::size_t>(t - tensors.data()); }
  // "aten::addmm" (or "<unknown schema 0x...>" if the table lacks it: never a crash).
  std::string schema_name(std::uint64_t hash) const;
  const std::string& module_path(std::uint32_t id) const;
  // module_tree if it fits this table (ModuleTree::fits), else one built into `own`.
  const ModuleTree& module_tree_of(std::shared_ptr<const ModuleTree>& own) const;

  std::uint64_t total_dropped() const;
  std::uint64_t total_ops(Phase p) const;

  // Appends one op whose tensor metas and dims come from a MetaLog cell sequence.
  void append(const TraceEntry& e, std::span<const MetaCell> cells,
              std::span<const ScalarRecord> scalars);
  void clear();
  // Empty, like clear(), but the big arrays keep their memory: a trace refilled with about as
  // many ops does not allocate them again (the names, module paths and externals are refilled
  // anew; the pipeline's recycled copies, Note [Recycled copies]). Every other member is
  // reset to its default, whatever members Trace has.
  void clear_keeping_capacity();
  bool operator==(const Trace& o) const;
};

// What an op computes, from its own record: schema, phase, input and tensor counts, and for every
// tensor its dtype, device, layout, storage offset, sizes, strides and argument position (and
// the value of a wrapped Python number), and every scalar argument. Not its storages' ids,
// versions, sizes or addresses, not requires_grad (the first layer's input needs no grad, the
// second's does, and they compute the same thing), not the module it ran in (two identical
// blocks compute alike). The Merkle DAG's local hash of a node (graph/MerkleDag.h).
ContentHash op_content(const Trace& t, std::size_t op);

// Note [Structure key]
// Two runs of one training step record the same ops on different storages: fresh storage ids
// for every intermediate, version counters that keep counting, other data pointers. The
// structure key of a list of ops hashes everything an analysis of them reads (schema, op flags
// and module, every tensor's metadata and dims, every scalar, and how each storage the ops
// touch is classified when external) with each storage id replaced by the order in which the
// ops first touch it and each version by its distance from the version first seen there; data
// pointers, sequence numbers and the recording thread are left out. Two runs of one step get
// equal keys, and anything that could change a graph, DAG or plan built from the ops (one
// shape, one scalar, one input wired to another producer) gives a different key, up to
// XXH3-128 collisions.
//
// The body and the classification come apart so that a recorder can hash the body under its
// trace lock and look the storages up in its external table afterwards.
//
// The body hashes the ops' contents (op_content, in order) and their wiring: per op the rest
// of its entry (schema, tensor counts, phase, module, argument count, flags), and then each
// tensor's storage identity, version distance, storage size and flags. A caller that already has
// the ops' contents (the pipeline's drain computes them while the ops are in cache) passes them,
// one per op, and the ops' dims and scalars are not read again.
//
// The same pass numbers the ops' storages (Note [Storage numbering]) into `numbering`; its
// kinds are left empty (the caller knows the classification it wants).
//
// Note [Wiring key]
// The graph and the memory plan of a list of ops read less than the structure key covers:
// per op its schema, tensor counts, phase, module, argument count and flags, per tensor its
// storage number, version distance, storage size and flags, and the storages'
// classification; never a shape, a stride, a dtype or a scalar (the plan sizes blocks by
// storage bytes). The wiring body is the structure body without the ops' contents, and the
// structure body is the hash of the wiring body and of the contents, so one pass gives both.
// structure_key(wiring body, kinds) is the wiring key: two lists of ops with equal wiring
// keys have the same graph and plan up to their storage ids (TraceGraph::rebased,
// rebased_plan), though scalars differ — AdamW's bias corrections change every step, and the
// pipeline then hashes again only what changed in the Merkle DAG (MerkleDag::rebuild, Note
// [Reusing earlier builds]).
struct StorageNumbering;
ContentHash structure_body(const Trace& t, std::span<const std::size_t> ops,
                           StorageNumbering& numbering, std::span<const ContentHash> contents = {},
                           ContentHash* wiring = nullptr);
// kinds[i]: the ExternalKind of storages[i], 0 when it is not classified.
ContentHash structure_key(const ContentHash& body, std::span<const std::uint8_t> kinds);
// Both, with the classification from t.externals.
ContentHash structure_key(const Trace& t, std::span<const std::size_t> ops);

// Note [Storage numbering]
// The graph, the Merkle DAG and the memory plan of a list of ops all ask, per tensor, "which
// storage, at which version, and how is it classified". Asking a hash map keyed by storage id
// for each tensor, in each of them, was most of a build. Instead the storages the ops touch
// are numbered 1, 2, ... in first-touch order, once, by the same pass that computes the
// structure key (the pipeline needs the key anyway), and the analyses index plain arrays by
// number. Number 0 means no storage (storage id 0; a tensor flagged kNoStorage with a
// nonzero id still gets a number, and the analyses skip it by its flag). A version is kept as
// its distance from the first version seen on its storage: two tensors have equal (number,
// version) exactly when they have equal (storage id, version).
struct StorageNumbering {
  std::vector<std::uint64_t> storages;  // [n - 1]: the storage id numbered n
  std::vector<std::uint8_t> kinds;      // [n - 1]: its ExternalKind, 0 when not classified
  // Per tensor of the ops, in order (each op's inputs, then its outputs), as the ops' tensors
  // appear in t: its storage's number (0: none) and its version distance.
  std::vector<std::uint32_t> storage, version;
  std::size_t num_storages() const { return storages.size(); }
};
// The numbering of the ops' storages alone, with kinds from t.externals.
StorageNumbering number_storages(const Trace& t, std::span<const std::size_t> ops);
// Sets n.kinds from a table of classifications (storage id -> kind): t.externals, or a
// recorder's own table.
void classify_storages(const absl::flat_hash_map<std::uint64_t, ExternalKind>& externals, StorageNumbering& n);
inline void classify_storages(const Trace& t, StorageNumbering& n) { classify_storages(t.externals, n); }

}  // namespace crucible::record
