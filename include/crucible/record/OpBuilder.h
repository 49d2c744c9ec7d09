// OpBuilder.h — stages one op's tensor metadata and scalars before Recorder::commit.
//
// Reused across ops (reset() keeps capacity), so in steady state building an op allocates
// nothing. Inputs are added first, then end_inputs(), then outputs. Not thread-safe: one
// builder per thread (or per nesting depth).
#pragma once

#include <cstdint>
#include <cstring>
#include <span>
#include <string_view>
#include <vector>

#include "crucible/core/ContentHash.h"
#include "crucible/record/TraceRecord.h"

namespace crucible::record {

class OpBuilder {
 public:
  OpBuilder() {
    cells_.reserve(64);
    scalars_.reserve(32);
  }

  void reset() {
    cells_.clear();
    scalars_.clear();
    n_tensors_ = n_inputs_ = 0;
    inputs_done_ = false;
  }

  // `m.ndim` is set from sizes; sizes and strides must have equal length.
  void add_tensor(TensorMeta m, std::span<const std::int64_t> sizes,
                  std::span<const std::int64_t> strides) {
    m.ndim = static_cast<std::uint16_t>(sizes.size());
    MetaCell head;
    head.meta = m;
    cells_.push_back(head);
    const std::uint32_t n = dims_cells(m.ndim);
    const std::size_t base = cells_.size();
    cells_.resize(base + n);
    for (std::uint32_t k = 0; k < m.ndim; ++k) cells_[base + k / 8].dims.v[k % 8] = sizes[k];
    for (std::uint32_t k = 0; k < m.ndim; ++k) {
      const std::uint32_t j = m.ndim + k;
      cells_[base + j / 8].dims.v[j % 8] = strides[k];
    }
    ++n_tensors_;
    if (!inputs_done_) ++n_inputs_;
  }
  void end_inputs() { inputs_done_ = true; }

  void add_scalar(ScalarKind k, std::uint16_t arg, std::uint64_t bits, std::uint32_t aux = 0) {
    scalars_.push_back(ScalarRecord{k, 0, arg, aux, bits});
  }
  void add_int(std::uint16_t arg, std::int64_t v) {
    add_scalar(ScalarKind::Int, arg, static_cast<std::uint64_t>(v));
  }
  void add_double(std::uint16_t arg, double v) {
    std::uint64_t bits;
    std::memcpy(&bits, &v, 8);
    add_scalar(ScalarKind::Double, arg, bits);
  }
  void add_string(std::uint16_t arg, std::string_view s) {
    add_scalar(ScalarKind::String, arg, hash64(s), static_cast<std::uint32_t>(s.size()));
  }

  std::uint32_t n_tensors() const { return n_tensors_; }
  std::uint32_t n_inputs() const { return n_inputs_; }
  std::span<const MetaCell> cells() const { return cells_; }
  std::span<const ScalarRecord> scalars() const { return scalars_; }

  TraceEntry entry(std::uint64_t schema_hash, Phase phase, std::uint8_t flags) const {
    TraceEntry e;
    e.schema_hash = schema_hash;
    e.n_tensors = n_tensors_;
    e.n_inputs = n_inputs_;
    e.n_meta_cells = static_cast<std::uint32_t>(cells_.size());
    e.n_scalars = static_cast<std::uint32_t>(scalars_.size());
    e.phase = phase;
    e.flags = flags;
    return e;
  }

 private:
  std::vector<MetaCell> cells_;
  std::vector<ScalarRecord> scalars_;
  std::uint32_t n_tensors_ = 0, n_inputs_ = 0;
  bool inputs_done_ = false;
};

}  // namespace crucible::record
