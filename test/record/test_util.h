// test_util.h — builds synthetic ops for the record tests.
#pragma once

#include <vector>

#include "crucible/record/OpBuilder.h"
#include "crucible/record/Recorder.h"

namespace crucible::record::test_util {

// A 2-d float tensor [rows, cols] with contiguous strides, tagged by storage id.
inline void add_matrix(OpBuilder& b, std::int64_t rows, std::int64_t cols, std::uint64_t storage,
                       std::uint16_t arg, bool output = false) {
  TensorMeta m;
  m.dtype = 6;
  m.storage_id = storage;
  m.arg_index = arg;
  m.flags = output ? tensor_flag::kOutput : 0;
  const std::int64_t sizes[2] = {rows, cols};
  const std::int64_t strides[2] = {cols, 1};
  b.add_tensor(m, sizes, strides);
}

// Commits op number i: inputs [i%7+1, 3] and [3, 5], output [i%7+1, 5], scalars (alpha=i, beta=0.5).
inline bool commit_synthetic(Recorder& r, OpBuilder& b, std::uint64_t schema, std::uint64_t i,
                             Phase phase = Phase::Forward) {
  b.reset();
  add_matrix(b, static_cast<std::int64_t>(i % 7 + 1), 3, 2 * i + 1, 0);
  add_matrix(b, 3, 5, 2 * i + 2, 1);
  b.end_inputs();
  add_matrix(b, static_cast<std::int64_t>(i % 7 + 1), 5, 2 * i + 3, 0, true);
  b.add_int(2, static_cast<std::int64_t>(i));
  b.add_double(3, 0.5);
  return r.commit(r.thread_log(), b.entry(schema, phase, 0), b.cells(), b.scalars());
}

}  // namespace crucible::record::testing
