// Trace.cpp — accessors and append for the in-memory trace.
#include "crucible/record/Trace.h"

#include <cstdio>
#include <cstring>

#include "crucible/core/Contract.h"

namespace crucible::record {

const char* phase_name(Phase p) noexcept {
  switch (p) {
    case Phase::Forward: return "forward";
    case Phase::Backward: return "backward";
    case Phase::Optimizer: return "optimizer";
  }
  return "unknown";
}

const char* external_kind_name(ExternalKind k) noexcept {
  switch (k) {
    case ExternalKind::Parameter: return "parameter";
    case ExternalKind::Buffer: return "buffer";
    case ExternalKind::Gradient: return "gradient";
    case ExternalKind::OptimizerState: return "optimizer_state";
    case ExternalKind::Input: return "input";
    case ExternalKind::Constant: return "constant";
  }
  return "unknown";
}

std::span<const TensorMeta> Trace::inputs(std::size_t op) const {
  CRUCIBLE_PRE(op < ops.size(), "op index in range");
  return {tensors.data() + op_tensor_begin[op], ops[op].n_inputs};
}
std::span<const TensorMeta> Trace::outputs(std::size_t op) const {
  CRUCIBLE_PRE(op < ops.size(), "op index in range");
  return {tensors.data() + op_tensor_begin[op] + ops[op].n_inputs,
          ops[op].n_tensors - ops[op].n_inputs};
}
std::span<const ScalarRecord> Trace::scalars_of(std::size_t op) const {
  CRUCIBLE_PRE(op < ops.size(), "op index in range");
  return {scalars.data() + op_scalar_begin[op], ops[op].n_scalars};
}
std::span<const std::int64_t> Trace::sizes(std::size_t t) const {
  CRUCIBLE_PRE(t < tensors.size(), "tensor index in range");
  return {dims.data() + tensor_dims_begin[t], tensors[t].ndim};
}
std::span<const std::int64_t> Trace::strides(std::size_t t) const {
  CRUCIBLE_PRE(t < tensors.size(), "tensor index in range");
  return {dims.data() + tensor_dims_begin[t] + tensors[t].ndim, tensors[t].ndim};
}

std::string Trace::schema_name(std::uint64_t hash) const {
  auto it = schema_names.find(hash);
  if (it != schema_names.end()) return it->second;
  char buf[48];
  std::snprintf(buf, sizeof buf, "<unknown schema 0x%016llx>", static_cast<unsigned long long>(hash));
  return buf;
}

const std::string& Trace::module_path(std::uint32_t id) const {
  static const std::string kUnknown = "<unknown module>";
  return id < module_paths.size() ? module_paths[id] : kUnknown;
}

std::uint64_t Trace::total_dropped() const {
  std::uint64_t n = 0;
  for (const auto& t : threads) n += t.dropped;
  return n;
}
std::uint64_t Trace::total_ops(Phase p) const {
  std::uint64_t n = 0;
  for (const auto& t : threads) n += t.ops[static_cast<int>(p)];
  return n;
}

void Trace::append(const TraceEntry& e, std::span<const MetaCell> cells,
                   std::span<const ScalarRecord> sc) {
  op_tensor_begin.push_back(tensors.size());
  op_scalar_begin.push_back(scalars.size());
  ops.push_back(e);
  std::size_t c = 0;
  for (std::uint32_t t = 0; t < e.n_tensors; ++t) {
    CRUCIBLE_ASSERT(c < cells.size(), "entry's cell count covers its tensors");
    const TensorMeta& m = cells[c++].meta;
    tensors.push_back(m);
    tensor_dims_begin.push_back(dims.size());
    const std::uint32_t nd = dims_cells(m.ndim);
    CRUCIBLE_ASSERT(c + nd <= cells.size(), "entry's cell count covers its dims");
    // Sizes then strides, 2 * ndim values, filling whole cells of 8 but the last.
    for (std::uint32_t left = 2u * m.ndim, k = 0; left != 0; ++k) {
      const std::uint32_t take = left < 8 ? left : 8;
      dims.insert(dims.end(), cells[c + k].dims.v, cells[c + k].dims.v + take);
      left -= take;
    }
    c += nd;
  }
  scalars.insert(scalars.end(), sc.begin(), sc.end());
}

void Trace::clear() { *this = Trace{}; }

bool Trace::operator==(const Trace& o) const {
  auto bytes_eq = [](const auto& a, const auto& b) {
    return a.size() == b.size() &&
           (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(a[0])) == 0);
  };
  return bytes_eq(ops, o.ops) && bytes_eq(tensors, o.tensors) && dims == o.dims &&
         bytes_eq(scalars, o.scalars) && schema_names == o.schema_names &&
         module_paths == o.module_paths && threads == o.threads && externals == o.externals;
}

}  // namespace crucible::record
