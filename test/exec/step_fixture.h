// step_fixture.h — a hand-built training-like step as IR001 (every field an execution plan reads
// set directly: strides, offsets, storage sizes, argument positions), its front end, and a
// reference provider that computes a few float32 ops over any strides.
#pragma once

#include <gtest/gtest.h>

#include <bit>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "crucible/core/OpTable.h"
#include "crucible/exec/Backend.h"
#include "crucible/exec/BuildPlan.h"
#include "crucible/forge/Passes.h"

namespace crucible::exec::test {

// Contiguous strides of `shape`.
inline std::vector<std::int64_t> contiguous(const std::vector<std::int64_t>& shape) {
  std::vector<std::int64_t> st(shape.size(), 1);
  for (std::size_t d = shape.size(); d-- > 1;) st[d - 1] = st[d] * shape[d];
  return st;
}

class StepBuilder {
 public:
  StepBuilder() {
    ir.pool = &pool;
    ir.module_paths = {""};
  }
  StepBuilder(const StepBuilder&) = delete;
  StepBuilder& operator=(const StepBuilder&) = delete;

  forge::ExprPool pool;
  forge::Ir001 ir;

  // An external float32 tensor with a storage of its own.
  std::uint32_t external(std::vector<std::int64_t> shape, record::ExternalKind kind) {
    forge::Value v = make(shape, contiguous(shape), next_storage_++, 0);
    v.external = static_cast<std::uint8_t>(kind);
    return add(std::move(v));
  }
  // A Python number as a 0-d float64 tensor.
  std::uint32_t number(double x) {
    forge::Value v = make({}, {}, next_storage_++, 0, 7);
    v.wrapped_number = true;
    v.wrapped_value = x;
    return add(std::move(v));
  }
  // A node of `op` reading `ins`, writing a fresh contiguous float32 tensor of `shape`.
  std::uint32_t op(const std::string& name, std::vector<std::uint32_t> ins,
                   std::vector<std::int64_t> shape,
                   std::vector<record::ScalarRecord> scalars = {}) {
    return node(name, std::move(ins), make(shape, contiguous(shape), next_storage_++, 0),
                std::move(scalars));
  }
  // A view of `base` (same storage and version) with other sizes and strides.
  std::uint32_t view(const std::string& name, std::uint32_t base, std::vector<std::int64_t> shape,
                     std::vector<std::int64_t> strides) {
    const forge::Value& b = ir.values[base];
    forge::Value v = make(shape, std::move(strides), b.storage, b.version);
    v.is_view = true;
    v.storage_nbytes = b.storage_nbytes;
    return node(name, {base}, std::move(v), {});
  }
  // An in-place op: writes `target`'s storage at the next version.
  std::uint32_t in_place(const std::string& name, std::uint32_t target,
                         std::vector<std::uint32_t> others,
                         std::vector<record::ScalarRecord> scalars = {}) {
    const forge::Value& t = ir.values[target];
    forge::Value v = make(shape_of(target), t.strides, t.storage, t.version + 1);
    std::vector<std::uint32_t> ins{target};
    ins.insert(ins.end(), others.begin(), others.end());
    const std::uint32_t out = node(name, std::move(ins), std::move(v), std::move(scalars));
    ir.nodes.back().mutates = true;
    return out;
  }
  // Live-out (produced and unread, or a write to external storage) and costs, as build_ir001.
  forge::Ir001& done() {
    std::vector<bool> read(ir.values.size(), false);
    for (const forge::Node& n : ir.nodes)
      for (std::uint32_t v : n.inputs) read[v] = true;
    std::map<std::uint64_t, bool> external_storage;
    for (const forge::Value& v : ir.values)
      if (v.producer == forge::kNoNode) external_storage[v.storage] = true;
    for (std::size_t v = 0; v < ir.values.size(); ++v) {
      forge::Value& val = ir.values[v];
      if (val.producer == forge::kNoNode) continue;
      val.live_out = !read[v] || (external_storage.contains(val.storage) && !val.is_view);
    }
    return ir;
  }
  std::vector<std::int64_t> shape_of(std::uint32_t v) const {
    std::vector<std::int64_t> s;
    for (const forge::Expr* d : ir.values[v].shape) s.push_back(d->value);
    return s;
  }

 private:
  forge::Value make(const std::vector<std::int64_t>& shape, std::vector<std::int64_t> strides,
                    std::uint64_t storage, std::uint32_t version, std::int8_t dtype = 6) {
    forge::Value v;
    std::int64_t numel = 1;
    for (std::int64_t d : shape) v.shape.push_back(pool.constant(d)), numel *= d;
    v.dtype = dtype;
    v.strides = std::move(strides);
    v.storage = storage;
    v.version = version;
    v.nbytes = numel * (dtype == 7 ? 8 : 4);
    v.storage_nbytes = static_cast<std::uint64_t>(v.nbytes);
    return v;
  }
  std::uint32_t add(forge::Value v) {
    ir.values.push_back(std::move(v));
    return static_cast<std::uint32_t>(ir.values.size() - 1);
  }
  std::uint32_t node(const std::string& name, std::vector<std::uint32_t> ins, forge::Value out,
                     std::vector<record::ScalarRecord> scalars) {
    forge::Node n;
    n.op = name;
    const OpClass c = classify_op(name);
    n.kind = c.kind;
    n.opaque_reason = c.reason;
    n.inputs = std::move(ins);
    n.scalars = std::move(scalars);
    out.producer = static_cast<std::uint32_t>(ir.nodes.size());
    const std::uint32_t v = add(std::move(out));
    n.outputs = {v};
    ir.nodes.push_back(std::move(n));
    return v;
  }
  std::uint64_t next_storage_ = 1;
};

inline record::ScalarRecord double_arg(std::uint16_t arg, double x) {
  record::ScalarRecord r;
  r.kind = record::ScalarKind::Double;
  r.arg_index = arg;
  r.bits = std::bit_cast<std::uint64_t>(x);
  return r;
}

// A rules class "t": GEMM + unary epilogue fused, anything else one op per kernel.
inline forge::RuleSet test_rules() {
  const std::string text =
      "[class]\nname = \"t\"\n"
      "[[rule]]\nid = \"gemm_act\"\npattern = [\"GEMM\", \"POINTWISE_UNARY\"]\nkernel = "
      "\"gemm_epilogue\"\n"
      "recipe = \"f32_ordered\"\npriority = 200\n"
      "[[rule]]\nid = \"fallback\"\npattern = [\"*\"]\nkernel = \"opaque\"\npriority = 0\n";
  auto r = forge::parse_rules("t", [&](std::string_view) -> Result<std::string> { return text; });
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *r : forge::RuleSet{};
}

// Reference kernels on float32 (and a float64 number as the second operand of mul), any
// strides: add.Tensor (alpha), add_.Tensor (alpha), mul.Tensor, relu, mm, sum. Counts calls.
struct ReferenceProvider {
  int calls = 0;

  static std::int64_t numel(const TensorArg& t) {
    std::int64_t n = 1;
    for (std::int64_t s : t.sizes) n *= s;
    return n;
  }
  // Element i (in row-major order of t's sizes) of t.
  static std::int64_t at(const TensorArg& t, std::int64_t i) {
    std::int64_t off = 0;
    for (std::size_t d = t.sizes.size(); d-- > 0;) {
      off += (i % t.sizes[d]) * t.strides[d];
      i /= t.sizes[d];
    }
    return off;
  }
  static double get(const TensorArg& t, std::int64_t i) {
    if (t.dtype == 7) return static_cast<const double*>(t.data)[t.sizes.empty() ? 0 : at(t, i)];
    return static_cast<const float*>(t.data)[at(t, i)];
  }
  static void set(const TensorArg& t, std::int64_t i, double x) {
    static_cast<float*>(t.data)[at(t, i)] = static_cast<float>(x);
  }
  // The second operand broadcasts when it is 0-d.
  static double second(const TensorArg& t, std::int64_t i) {
    return t.sizes.empty() ? get(t, 0) : get(t, i);
  }
  static double alpha(const LibraryCall& c) {
    for (const record::ScalarRecord& r : c.scalars)
      if (r.kind == record::ScalarKind::Double) return std::bit_cast<double>(r.bits);
    return 1.0;
  }

  Status call(const LibraryCall& c) {
    ++calls;
    const std::string_view op = c.op;
    if (op == "aten::add.Tensor" || op == "aten::mul.Tensor" || op == "aten::add_.Tensor") {
      const TensorArg &a = c.inputs[0], &b = c.inputs[1], &o = c.outputs[0];
      const double al = alpha(c);
      for (std::int64_t i = 0; i < numel(o); ++i)
        set(o, i,
            op == "aten::mul.Tensor" ? get(a, i) * second(b, i) : get(a, i) + al * second(b, i));
    } else if (op == "aten::relu") {
      for (std::int64_t i = 0; i < numel(c.outputs[0]); ++i)
        set(c.outputs[0], i, std::max(0.0, get(c.inputs[0], i)));
    } else if (op == "aten::mm") {
      const TensorArg &a = c.inputs[0], &b = c.inputs[1], &o = c.outputs[0];
      const std::int64_t m = a.sizes[0], k = a.sizes[1], n = b.sizes[1];
      for (std::int64_t i = 0; i < m; ++i)
        for (std::int64_t j = 0; j < n; ++j) {
          double s = 0;
          for (std::int64_t q = 0; q < k; ++q) s += get(a, i * k + q) * get(b, q * n + j);
          set(o, i * n + j, s);
        }
    } else if (op == "aten::sum") {
      double s = 0;
      for (std::int64_t i = 0; i < numel(c.inputs[0]); ++i) s += get(c.inputs[0], i);
      set(c.outputs[0], 0, s);
    } else {
      return unsupported("the reference provider has no " + std::string(op),
                         "use add, mul, relu, mm, sum");
    }
    return ok_status();
  }
  Provider provider() {
    return Provider{this, [](void* self, const LibraryCall& c) {
                      return static_cast<ReferenceProvider*>(self)->call(c);
                    }};
  }
};

}  // namespace crucible::exec::test
