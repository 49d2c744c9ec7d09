// pipeline_util.h — a synthetic training-like step for the pipeline tests.
#pragma once

#include "crucible/record/OpBuilder.h"
#include "crucible/record/Recorder.h"

namespace crucible::pipeline::testing_util {
using namespace crucible::record;

// One synthetic training-like step of `ops` ops; `width` changes every tensor's shape.
// Step k > 0 reuses storages chained through the step; step 0 has an extra op (state creation).
// With `lr` (not 0), each backward op has one double argument, lr
// (an optimizer whose scalars change every step, as AdamW's bias corrections do).
inline void record_step(Recorder& r, OpBuilder& b, int step, int ops, std::int64_t width,
                        std::uint64_t& sid, double lr = 0) {
  const std::uint64_t mm = r.intern_schema("aten::mm"), relu = r.intern_schema("aten::relu"),
                      init = r.intern_schema("aten::zeros");
  auto commit = [&](std::uint64_t schema, bool with_input, Phase phase) {
    b.reset();
    const std::int64_t sz[2] = {8, width}, st[2] = {width, 1};
    TensorMeta m;
    m.dtype = 6;
    m.storage_nbytes = static_cast<std::uint64_t>(8 * width * 4);
    if (with_input) {
      m.storage_id = sid;
      b.add_tensor(m, sz, st);
    }
    b.end_inputs();
    if (lr != 0 && phase == Phase::Backward) b.add_double(1, lr);
    m.storage_id = ++sid;
    m.flags = tensor_flag::kOutput;
    b.add_tensor(m, sz, st);
    r.commit(r.thread_log(), b.entry(schema, phase, 0), b.cells(), b.scalars());
  };
  if (step == 0) commit(init, false, Phase::Optimizer);
  commit(init, false, Phase::Forward);
  for (int i = 1; i < ops; ++i) commit(i % 2 ? mm : relu, true, i < ops / 2 ? Phase::Forward : Phase::Backward);
}

}  // namespace crucible::pipeline::testing_util
