// synth.h — builds synthetic traces op by op (no recorder, no PyTorch) for the graph tests.
#pragma once

#include <string>
#include <vector>

#include "crucible/core/ContentHash.h"
#include "crucible/record/OpBuilder.h"
#include "crucible/record/Trace.h"

namespace crucible::graph::synth {

struct T {  // one tensor: storage, version, shape, dtype
  std::uint64_t storage;
  std::uint32_t version = 0;
  std::vector<std::int64_t> shape = {4, 4};
  std::int8_t dtype = 6;
  std::uint64_t data_ptr = 0;
  bool view = false;
};

class Builder {
 public:
  record::Trace trace;
  Builder() { trace.module_paths = {""}; }

  std::uint32_t module(const std::string& path) {
    for (std::size_t i = 0; i < trace.module_paths.size(); ++i)
      if (trace.module_paths[i] == path) return static_cast<std::uint32_t>(i);
    trace.module_paths.push_back(path);
    return static_cast<std::uint32_t>(trace.module_paths.size() - 1);
  }

  std::size_t op(const std::string& name, std::vector<T> ins, std::vector<T> outs,
                 record::Phase phase = record::Phase::Forward, const std::string& mod = "",
                 std::vector<std::int64_t> ints = {}) {
    const std::uint64_t h = hash64(name);
    trace.schema_names[h] = name;
    record::OpBuilder b;
    auto add = [&](const T& x, std::uint16_t arg, bool out) {
      record::TensorMeta m;
      m.storage_id = x.storage;
      m.version = x.version;
      m.dtype = x.dtype;
      m.data_ptr = x.data_ptr;
      m.arg_index = arg;
      std::uint64_t numel = 1;
      for (auto d : x.shape) numel *= static_cast<std::uint64_t>(d);
      m.storage_nbytes = numel * (x.dtype == 7 || x.dtype == 4 ? 8 : 4);
      m.flags = static_cast<std::uint8_t>((out ? record::tensor_flag::kOutput : 0) | (x.view ? record::tensor_flag::kIsView : 0));
      std::vector<std::int64_t> strides(x.shape.size());
      std::uint64_t s = 1;  // unsigned: the tests of impossible shapes may wrap it, defined
      for (std::size_t k = x.shape.size(); k-- > 0;) {
        strides[k] = static_cast<std::int64_t>(s);
        s *= static_cast<std::uint64_t>(x.shape[k]);
      }
      b.add_tensor(m, x.shape, strides);
    };
    for (std::size_t i = 0; i < ins.size(); ++i) add(ins[i], static_cast<std::uint16_t>(i), false);
    b.end_inputs();
    for (std::size_t i = 0; i < outs.size(); ++i) add(outs[i], static_cast<std::uint16_t>(i), true);
    for (std::size_t i = 0; i < ints.size(); ++i) b.add_int(static_cast<std::uint16_t>(ins.size() + i), ints[i]);
    record::TraceEntry e = b.entry(h, phase, 0);
    e.module_id = module(mod);
    e.seq = trace.ops.size();
    trace.append(e, b.cells(), b.scalars());
    return trace.ops.size() - 1;
  }

  std::vector<std::size_t> all() const {
    std::vector<std::size_t> v(trace.num_ops());
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = i;
    return v;
  }
};

}  // namespace crucible::graph::synth
