// Trace.h — everything a recording produced, in memory: ops, tensor metadata, scalars, names.
//
// A Trace is what the drain thread accumulates, what flush() makes complete, what export writes
// to a .crtrace file and what load gives back. It is plain data (vectors of the fixed-size
// records from TraceRecord.h) plus derived per-op offsets, so it can be copied and compared.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "crucible/record/TraceRecord.h"

namespace crucible::record {

struct ThreadStats {
  std::uint32_t thread = 0;
  std::uint64_t ops[kNumPhases] = {};  // recorded, per phase
  std::uint64_t dropped = 0;           // ops counted but not recorded (drop mode, ring full)
  std::uint64_t bytes = 0;             // ring bytes written (entries + meta cells + scalars)
  std::uint64_t waits = 0;             // times the producer waited for the drain (back-pressure)
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
  std::vector<TraceEntry> ops;
  std::vector<TensorMeta> tensors;       // inputs then outputs of each op, in op order
  std::vector<std::int64_t> dims;        // per tensor: ndim sizes then ndim strides
  std::vector<ScalarRecord> scalars;     // per op, in op order
  std::map<std::uint64_t, std::string> schema_names;  // schema_hash -> "aten::add.Tensor"
  std::vector<std::string> module_paths;              // module_id -> "layer1.0.conv1"; [0] = ""
  std::vector<ThreadStats> threads;
  std::map<std::uint64_t, ExternalKind> externals;    // storage_id -> why it is external

  // Derived offsets (rebuilt by append/validate): first tensor / scalar / dim of each op/tensor.
  std::vector<std::uint64_t> op_tensor_begin, op_scalar_begin, tensor_dims_begin;

  std::size_t num_ops() const { return ops.size(); }
  std::span<const TensorMeta> inputs(std::size_t op) const;
  std::span<const TensorMeta> outputs(std::size_t op) const;
  std::span<const ScalarRecord> scalars_of(std::size_t op) const;
  std::span<const std::int64_t> sizes(std::size_t tensor) const;
  std::span<const std::int64_t> strides(std::size_t tensor) const;
  std::size_t tensor_index(const TensorMeta* t) const { return static_cast<std::size_t>(t - tensors.data()); }
  // "aten::addmm" (or "<unknown schema 0x...>" if the table lacks it: never a crash).
  std::string schema_name(std::uint64_t hash) const;
  const std::string& module_path(std::uint32_t id) const;

  std::uint64_t total_dropped() const;
  std::uint64_t total_ops(Phase p) const;

  // Appends one op whose tensor metas and dims come from a MetaLog cell sequence.
  void append(const TraceEntry& e, std::span<const MetaCell> cells,
              std::span<const ScalarRecord> scalars);
  void clear();
  bool operator==(const Trace& o) const;
};

}  // namespace crucible::record
