// chain_plan.h — elementwise chains for the backend tests: a spec (inputs with any sizes,
// strides and offsets; steps of ATen ops), the execution plan it stands for (built by hand, as
// build_plan would lay it out), a reference that evaluates the spec element by element in
// plain loops, a provider that performs each library call in plain loops, and the buffers of
// one run compared element by element.
//
// Reference arithmetic (BITEXACT_STRICT): each op one IEEE operation in its compute dtype (ATen's
// promotion: dimensioned tensors, then 0-d tensors, then Python numbers), scalars converted to
// it once, alpha applied as ATen applies it (Note [ATen's alpha rounding], CpuBackend.cpp):
// fma(b, alpha, a) for an op without a broadcast input where ATen rounds once, else
// a + (alpha*b); the result converted to the output dtype. This file
// is compiled with -ffp-contract=off.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "crucible/core/OpTable.h"
#include "crucible/core/ScalarType.h"
#include "crucible/exec/Backend.h"
#include "crucible/exec/ExecutionPlan.h"
#include "crucible/forge/NumericalRecipe.h"
#include "crucible/mimic/CpuBackend.h"
#include "crucible/mimic/PointwiseProgram.h"

namespace crucible::mimic::test {

constexpr std::int8_t kF32 = dtype::kFloat32, kF64 = dtype::kFloat64;

struct TensorSpec {
  std::int8_t dtype = kF32;
  std::vector<std::int64_t> sizes;
  std::vector<std::int64_t> strides;  // empty: contiguous
  std::int64_t offset = 0;
  bool wrapped = false;  // a Python number (0-d float64, a Constant slot); `value` is it
  double value = 0;
};

struct StepSpec {
  std::string op;
  std::vector<int> in;  // >= 0: an input of the chain; < 0: the output of step -(x + 1)
  std::vector<record::ScalarRecord> scalars;
  std::int8_t out_dtype = kF32;
  std::vector<std::int64_t> out_strides;  // empty: contiguous
  bool escape = false;  // an Output slot (the last step's always is); in place: input 0's memory
};

struct ChainSpec {
  std::string name;
  std::vector<std::int64_t> shape;  // every step's output shape
  std::vector<TensorSpec> inputs;
  std::vector<StepSpec> steps;
  bool split = false;  // one kernel per call (else one kernel for the chain)
};

// A step that reads its input to the host and has no output (op_trait::kHostRead).
inline bool host_read_step(const std::string& op) { return op == "aten::_local_scalar_dense"; }

inline record::ScalarRecord scalar_record(record::ScalarKind k, std::uint16_t arg,
                                          std::uint64_t bits, std::uint32_t aux = 0) {
  record::ScalarRecord r;
  r.kind = k;
  r.arg_index = arg;
  r.bits = bits;
  r.aux = aux;
  return r;
}
inline record::ScalarRecord scalar_double(std::uint16_t arg, double x) {
  record::ScalarRecord r;
  r.kind = record::ScalarKind::Double;
  r.arg_index = arg;
  r.bits = std::bit_cast<std::uint64_t>(x);
  return r;
}
inline record::ScalarRecord scalar_int(std::uint16_t arg, std::int64_t x) {
  record::ScalarRecord r;
  r.kind = record::ScalarKind::Int;
  r.arg_index = arg;
  r.bits = static_cast<std::uint64_t>(x);
  return r;
}

inline std::vector<std::int64_t> contiguous_strides(const std::vector<std::int64_t>& shape) {
  std::vector<std::int64_t> st(shape.size(), 1);
  for (std::size_t d = shape.size(); d-- > 1;)
    st[d - 1] = st[d] * std::max<std::int64_t>(shape[d], 1);
  return st;
}
inline std::int64_t numel(const std::vector<std::int64_t>& s) {
  std::int64_t n = 1;
  for (std::int64_t x : s) n *= x;
  return n;
}
inline std::uint32_t dtype_bytes(std::int8_t d) { return d == kF32 ? 4 : 8; }  // f64, int64

// ---- the elementwise semantics, shared by the reference and the provider ----

enum class Fn {
  Add,
  Sub,
  Mul,
  Div,
  Neg,
  Abs,
  Sign,
  Relu,
  Sqrt,
  Exp,
  ThresholdBackward,
  AddCMul,
  AddCDiv,
  Lerp,
  Copy,
  Zero,
  Ones,
  MseBwd,
  Mse
};
struct OpInfo {
  Fn fn;
  int tensor_inputs;
  int other_arg;  // a .Scalar overload's second operand; lerp's weight
  int alpha_arg;  // add/sub's alpha; addcmul's and addcdiv's value
  double norm = 0;  // mse_loss_backward: 2/numel(self) for a mean, else 2 (run_elementwise sets it)
};
inline bool op_info(std::string name, OpInfo* info) {
  const std::size_t dot = name.find('.');
  std::string base = name.substr(0, dot);
  const std::string overload = dot == std::string::npos ? "" : name.substr(dot + 1);
  if (base.size() > 1 && base.back() == '_') base.pop_back();
  const bool scalar = overload == "Scalar";
  struct Row {
    const char* n;
    Fn f;
    int arity;
    bool alpha;
  };
  if (base == "aten::subtract") base = "aten::sub";
  if (base == "aten::multiply") base = "aten::mul";
  if (base == "aten::divide") base = "aten::div";
  if (base == "aten::negative") base = "aten::neg";
  const Row rows[] = {{"aten::add", Fn::Add, 2, true},    {"aten::sub", Fn::Sub, 2, true},
                      {"aten::mul", Fn::Mul, 2, false},   {"aten::div", Fn::Div, 2, false},
                      {"aten::neg", Fn::Neg, 1, false},   {"aten::abs", Fn::Abs, 1, false},
                      {"aten::relu", Fn::Relu, 1, false}, {"aten::sqrt", Fn::Sqrt, 1, false},
                      {"aten::sign", Fn::Sign, 1, false}, {"aten::sgn", Fn::Sign, 1, false},
                      {"aten::exp", Fn::Exp, 1, false}};
  if (base == "aten::threshold_backward") {  // (grad_output, self, threshold)
    *info = OpInfo{Fn::ThresholdBackward, 2, 2, -1};
    return true;
  }
  if (base == "aten::addcmul" || base == "aten::addcdiv") {  // (self, t1, t2, *, value)
    *info = OpInfo{base == "aten::addcmul" ? Fn::AddCMul : Fn::AddCDiv, 3, -1, 3};
    return true;
  }
  if (base == "aten::clone" || base == "aten::copy") {  // clone(self); copy_(self, src): src
    *info = OpInfo{Fn::Copy, base == "aten::copy" ? 2 : 1, -1, -1};
    return true;
  }
  if (base == "aten::zero" || base == "aten::zeros_like" || base == "aten::ones_like") {
    *info = OpInfo{base == "aten::ones_like" ? Fn::Ones : Fn::Zero, 1, -1, -1};
    return true;
  }
  if (base == "aten::mse_loss_backward") {  // (grad_output, self, target, reduction)
    *info = OpInfo{Fn::MseBwd, 3, -1, -1};
    return true;
  }
  if (base == "aten::mse_loss") {  // (self, target, reduction): none, (self - target)^2
    *info = OpInfo{Fn::Mse, 2, -1, -1};
    return true;
  }
  if (base == "aten::lerp" && scalar) {  // (self, end, weight)
    *info = OpInfo{Fn::Lerp, 2, 2, -1};
    return true;
  }
  for (const Row& r : rows)
    if (base == r.n) {
      *info = OpInfo{r.f, scalar ? 1 : r.arity, scalar ? 1 : -1, r.alpha ? 2 : -1};
      return true;
    }
  return false;
}

// IEEE division: x / 0 is ±Inf or NaN by definition, and the reference must produce it; the
// ubsan-strict preset's float-divide-by-zero check is off for this one function.
template <class T>
__attribute__((no_sanitize("float-divide-by-zero"))) T ieee_div(T a, T b) {
  return a / b;
}

template <class T>
T apply(Fn f, T a, T b) {
  switch (f) {
    case Fn::Add:
      return a + b;
    case Fn::Sub:
      return a - b;
    case Fn::Mul:
      return a * b;
    case Fn::Div:
      return ieee_div(a, b);
    case Fn::Neg:
      return -a;
    case Fn::Abs:
      return std::fabs(a);
    case Fn::Sign:  // +0 for NaN and -0
      return a > T(0) ? T(1) : a < T(0) ? T(-1) : T(0);
    case Fn::Mse: {
      const T d = a - b;
      return d * d;
    }
    case Fn::Relu:
      return a < T(0) ? T(0) : a;  // NaN and -0 pass through (clamp_min)
    case Fn::Sqrt:
      return std::sqrt(a);
    case Fn::Exp:
      return std::exp(a);
    case Fn::ThresholdBackward:  // handled in compute
    case Fn::AddCMul:
    case Fn::AddCDiv:
    case Fn::Lerp:
    case Fn::MseBwd:
    case Fn::Copy:
    case Fn::Zero:
    case Fn::Ones:
      break;
  }
  return a;
}

template <class T>
T scalar_as(const record::ScalarRecord& r) {
  if (r.kind == record::ScalarKind::Double) return static_cast<T>(std::bit_cast<double>(r.bits));
  return static_cast<T>(static_cast<std::int64_t>(r.bits));
}

inline const record::ScalarRecord* scalar_at(std::span<const record::ScalarRecord> s, int arg) {
  if (arg < 0) return nullptr;
  for (const record::ScalarRecord& r : s)
    if (r.arg_index == arg && r.kind != record::ScalarKind::None) return &r;
  return nullptr;
}

// One operand as the element loop sees it.
struct Operand {
  std::int8_t dtype;
  int tier;                // 0 dimensioned, 1 0-d, 2 Python number
  std::int64_t numel = 1;  // its own elements (before broadcasting)
};
inline std::int8_t compute_dtype(const std::vector<Operand>& ops) {
  int best = 3;
  std::int8_t d = kF32;
  for (const Operand& o : ops) {
    if (o.tier < best)
      best = o.tier, d = o.dtype;
    else if (o.tier == best && o.dtype == kF64)
      d = kF64;
  }
  return d;
}

template <class T>
T compute(Fn f, const std::vector<double>& in_as_read, const std::vector<std::int8_t>& in_dtype,
          std::span<const record::ScalarRecord> scalars, const OpInfo& info, bool fused) {
  // Inputs were read in their own dtype (held exactly in a double); convert to T.
  auto conv = [&](std::size_t i) {
    return in_dtype[i] != kF32 ? static_cast<T>(in_as_read[i])  // float64, a Python int
                               : static_cast<T>(static_cast<float>(in_as_read[i]));
  };
  if (f == Fn::Copy) return conv(static_cast<std::size_t>(info.tensor_inputs - 1));  // the source
  if (f == Fn::Zero || f == Fn::Ones) return T(f == Fn::Ones ? 1 : 0);
  if (f == Fn::MseBwd) return (static_cast<T>(info.norm) * (conv(1) - conv(2))) * conv(0);
  if (f == Fn::ThresholdBackward) {  // self <= threshold ? +0 : grad (NaN self: grad)
    const T t = scalar_as<T>(*scalar_at(scalars, info.other_arg));
    return conv(1) <= t ? T(0) : conv(0);
  }
  if (f == Fn::AddCMul || f == Fn::AddCDiv) {  // value*t1 first (Note [Pointwise programs])
    const record::ScalarRecord* v = scalar_at(scalars, info.alpha_arg);
    const T m = v != nullptr ? scalar_as<T>(*v) * conv(1) : conv(1);
    if (f == Fn::AddCDiv) return conv(0) + ieee_div(m, conv(2));
    return fused ? std::fma(m, conv(2), conv(0)) : conv(0) + m * conv(2);
  }
  if (f == Fn::Lerp) {  // ATen's lerp: the weight or the weight minus 1, from self or end
    const T w = scalar_as<T>(*scalar_at(scalars, info.other_arg));
    const T self = conv(0), end = conv(1), diff = end - self;
    const bool small = std::fabs(w) < T(0.5);
    const T coeff = small ? w : w - T(1), base = small ? self : end;
    return fused ? std::fma(coeff, diff, base) : base + coeff * diff;
  }
  T a = conv(0);
  T b = T(0);
  if (info.tensor_inputs == 2) b = conv(1);
  if (const record::ScalarRecord* o = scalar_at(scalars, info.other_arg)) b = scalar_as<T>(*o);
  if (const record::ScalarRecord* al = scalar_at(scalars, info.alpha_arg)) {
    const T scale = scalar_as<T>(*al);
    if (fused) return std::fma(b, f == Fn::Sub ? -scale : scale, a);
    b = scale * b;
  }
  return apply<T>(f, a, b);
}

// ---- memory: a tensor's element i (row-major over its sizes), broadcast to a shape ----

struct View {
  char* base = nullptr;  // element 0
  std::int8_t dtype = kF32;
  std::vector<std::int64_t> strides;  // in the iteration shape; 0 where broadcast
};
inline View view_of(char* base, std::int8_t dt, const std::vector<std::int64_t>& sizes,
                    const std::vector<std::int64_t>& strides,
                    const std::vector<std::int64_t>& shape) {
  View v{base, dt, std::vector<std::int64_t>(shape.size(), 0)};
  const std::size_t lead = shape.size() - sizes.size();
  for (std::size_t j = 0; j < sizes.size(); ++j)
    if (sizes[j] != 1) v.strides[lead + j] = strides[j];
  return v;
}
inline char* element(const View& v, const std::vector<std::int64_t>& shape, std::int64_t i) {
  std::int64_t off = 0;
  for (std::size_t d = shape.size(); d-- > 0;) {
    off += (i % shape[d]) * v.strides[d];
    i /= shape[d];
  }
  return v.base + off * dtype_bytes(v.dtype);
}
inline double read(const View& v, const std::vector<std::int64_t>& shape, std::int64_t i) {
  const char* p = element(v, shape, i);
  if (v.dtype == kF64) {
    double x;
    std::memcpy(&x, p, 8);
    return x;
  }
  if (v.dtype == dtype::kInt64) {  // a Python int: exact in a double below 2^53
    std::int64_t x;
    std::memcpy(&x, p, 8);
    return static_cast<double>(x);
  }
  float x;
  std::memcpy(&x, p, 4);
  return x;
}
inline void write(const View& v, const std::vector<std::int64_t>& shape, std::int64_t i, double x,
                  std::int8_t from) {
  char* p = element(v, shape, i);
  if (v.dtype == kF64) {
    const double d = from == kF64 ? x : static_cast<double>(static_cast<float>(x));
    std::memcpy(p, &d, 8);
  } else {
    const float f = static_cast<float>(x);  // exact when x came from a float
    std::memcpy(p, &f, 4);
  }
}

// One step over every element: reads views, computes, writes the output view.
inline void run_elementwise(const OpInfo& op, const std::vector<View>& ins,
                            const std::vector<Operand>& ops, const View& out,
                            const std::vector<std::int64_t>& shape,
                            std::span<const record::ScalarRecord> scalars, AlphaRounding rounding) {
  const std::int8_t cd = compute_dtype(ops);
  OpInfo info = op;
  if (info.fn == Fn::MseBwd) {  // ATen's norm, from self's numel and the reduction (1: mean)
    const record::ScalarRecord* red = scalar_at(scalars, 3);
    info.norm = red != nullptr && static_cast<std::int64_t>(red->bits) == 1
                    ? 2.0 / static_cast<double>(ops[1].numel)
                    : 2.0;
  }
  std::vector<std::int8_t> dts;
  for (const View& v : ins) dts.push_back(v.dtype);
  std::vector<double> vals(ins.size());
  const std::int64_t n = numel(shape);
  // ATen rounds a + alpha*b once at every element when it does at all and no input is
  // broadcast; with a broadcast input its pattern is not modelled: twice here (the CPU backend
  // leaves such an op with alpha other than +-1 to ATen).
  bool broadcast = false;
  for (std::size_t k = 0; k < ins.size(); ++k) {
    broadcast = broadcast || (ops[k].tier != 0 && !shape.empty());
    for (std::size_t d = 0; d < shape.size(); ++d)
      broadcast = broadcast || (shape[d] != 1 && ins[k].strides[d] == 0);
  }
  const bool fused = rounding == AlphaRounding::Once && !broadcast;
  for (std::int64_t i = 0; i < n; ++i) {
    for (std::size_t k = 0; k < ins.size(); ++k) vals[k] = read(ins[k], shape, i);
    if (cd == kF64) {
      write(out, shape, i, compute<double>(info.fn, vals, dts, scalars, info, fused), kF64);
    } else {
      const float r = compute<float>(info.fn, vals, dts, scalars, info, fused);
      write(out, shape, i, r, kF32);
    }
  }
}

// ---- the plan ----

struct BuiltPlan {
  exec::ExecutionPlan plan;
  std::vector<std::uint64_t> input_bytes, output_bytes;  // per binding
  std::vector<std::uint32_t> input_slot_of;              // chain input -> input binding (or -1)
  std::vector<std::int64_t> step_output_binding;         // per step: output binding, or -1
};

inline std::uint64_t extent_bytes(const std::vector<std::int64_t>& sizes,
                                  const std::vector<std::int64_t>& strides, std::int64_t offset,
                                  std::int8_t dt) {
  std::int64_t hi = offset;
  for (std::size_t d = 0; d < sizes.size(); ++d) {
    if (sizes[d] == 0) return 0;
    hi += (sizes[d] - 1) * strides[d];
  }
  return static_cast<std::uint64_t>(hi + 1) * dtype_bytes(dt);
}

inline BuiltPlan build_chain_plan(const ChainSpec& c) {
  BuiltPlan b;
  exec::ExecutionPlan& p = b.plan;
  const std::uint64_t align = p.alignment;
  auto add_tensor = [&](std::uint32_t slot, std::int8_t dt, const std::vector<std::int64_t>& sz,
                        const std::vector<std::int64_t>& st, std::int64_t offset, bool wrapped) {
    exec::TensorRef t;
    t.slot = slot;
    t.dtype = dt;
    t.flags = wrapped ? exec::kWrappedNumber : 0;
    t.ndim = static_cast<std::uint16_t>(sz.size());
    t.dims = static_cast<std::uint32_t>(p.dims.size());
    t.offset = offset;
    t.value = static_cast<std::uint32_t>(p.tensors.size());
    p.dims.insert(p.dims.end(), sz.begin(), sz.end());
    p.dims.insert(p.dims.end(), st.begin(), st.end());
    p.tensors.push_back(t);
    return static_cast<std::uint32_t>(p.tensors.size() - 1);
  };
  std::vector<std::uint32_t> input_tensor;
  for (const TensorSpec& t : c.inputs) {
    exec::Slot s;
    if (t.wrapped) {
      s.kind = exec::SlotKind::Constant;
      s.dtype = t.dtype;  // float64, or int64 for a Python int
      s.bytes = align;
      s.offset = p.arena_bytes;
      s.value = t.value;
      p.arena_bytes += align;
      b.input_slot_of.push_back(UINT32_MAX);
    } else {
      const auto st = t.strides.empty() ? contiguous_strides(t.sizes) : t.strides;
      s.kind = exec::SlotKind::Input;
      s.binding = static_cast<std::uint32_t>(p.inputs.size());
      s.bytes = extent_bytes(t.sizes, st, t.offset, t.dtype);
      b.input_slot_of.push_back(s.binding);
      p.inputs.push_back(static_cast<std::uint32_t>(p.slots.size()));
      b.input_bytes.push_back(s.bytes);
    }
    s.storage = p.slots.size();
    s.first = UINT32_MAX;
    p.slots.push_back(s);
    const auto st = t.wrapped ? std::vector<std::int64_t>{}
                              : (t.strides.empty() ? contiguous_strides(t.sizes) : t.strides);
    input_tensor.push_back(add_tensor(static_cast<std::uint32_t>(p.slots.size() - 1),
                                      t.dtype,
                                      t.wrapped ? std::vector<std::int64_t>{} : t.sizes, st,
                                      t.wrapped ? 0 : t.offset, t.wrapped));
  }
  std::vector<std::uint32_t> step_tensor;
  auto touch = [&](std::uint32_t ti, std::uint32_t call) {
    exec::Slot& s = p.slots[p.tensors[ti].slot];
    if (s.first == UINT32_MAX) s.first = call;
    s.first = std::min(s.first, call);
    s.last = std::max(s.last, call);
  };
  for (std::size_t si = 0; si < c.steps.size(); ++si) {
    const StepSpec& st = c.steps[si];
    const auto call_index = static_cast<std::uint32_t>(p.calls.size());
    exec::Call call;
    call.node = call_index;
    call.op = static_cast<std::uint32_t>(p.op_names.size());
    p.op_names.push_back(st.op);
    call.kind = classify_op(st.op).kind;
    call.in_begin = static_cast<std::uint32_t>(p.args.size());
    for (int x : st.in) {
      const std::uint32_t ti = x >= 0 ? input_tensor[x] : step_tensor[-(x + 1)];
      p.args.push_back(exec::Arg{ti, static_cast<std::uint32_t>(p.args.size() - call.in_begin), 0});
      touch(ti, call_index);
    }
    call.in_count = static_cast<std::uint32_t>(st.in.size());
    call.out_begin = static_cast<std::uint32_t>(p.args.size());
    call.out_count = 1;
    if (host_read_step(st.op)) {
      call.out_count = 0;
      b.step_output_binding.push_back(-1);
      step_tensor.push_back(UINT32_MAX);  // no step reads it
      call.scalar_begin = static_cast<std::uint32_t>(p.scalars.size());
      p.calls.push_back(call);
      continue;
    }
    const bool in_place = st.op.find("_.") != std::string::npos || st.op.back() == '_';
    std::uint32_t out;
    if (in_place) {
      const exec::TensorRef self = p.tensors[p.args[call.in_begin].tensor];
      const auto sz = p.sizes(self), sd = p.strides(self);
      out = add_tensor(self.slot, self.dtype, {sz.begin(), sz.end()}, {sd.begin(), sd.end()},
                       self.offset, false);
      b.step_output_binding.push_back(-1);
    } else {
      const auto strides = st.out_strides.empty() ? contiguous_strides(c.shape) : st.out_strides;
      exec::Slot s;
      s.storage = p.slots.size();
      s.first = call_index;
      s.last = call_index;
      const std::uint64_t bytes = extent_bytes(c.shape, strides, 0, st.out_dtype);
      if (st.escape || si + 1 == c.steps.size()) {
        s.kind = exec::SlotKind::Output;
        s.binding = static_cast<std::uint32_t>(p.outputs.size());
        s.bytes = bytes;
        b.step_output_binding.push_back(s.binding);
        p.outputs.push_back(static_cast<std::uint32_t>(p.slots.size()));
        b.output_bytes.push_back(bytes);
      } else {
        s.kind = exec::SlotKind::Arena;
        s.bytes = std::max<std::uint64_t>(align, (bytes + align - 1) / align * align);
        s.offset = p.arena_bytes;
        p.arena_bytes += s.bytes;
        b.step_output_binding.push_back(-1);
      }
      p.slots.push_back(s);
      out = add_tensor(static_cast<std::uint32_t>(p.slots.size() - 1), st.out_dtype, c.shape,
                       strides, 0, false);
    }
    p.args.push_back(exec::Arg{out, 0, 0});
    touch(out, call_index);
    step_tensor.push_back(out);
    call.scalar_begin = static_cast<std::uint32_t>(p.scalars.size());
    p.scalars.insert(p.scalars.end(), st.scalars.begin(), st.scalars.end());
    call.scalar_count = static_cast<std::uint32_t>(st.scalars.size());
    p.calls.push_back(call);
  }
  for (exec::Slot& s : p.slots)
    if (s.first == UINT32_MAX) s.first = s.last = 0;
  const forge::NumericalRecipe* strict = forge::recipe_by_name("f32_strict");
  const auto ncalls = static_cast<std::uint32_t>(p.calls.size());
  if (c.split) {
    for (std::uint32_t i = 0; i < ncalls; ++i)
      p.kernels.push_back(exec::Kernel{i, forge::KernelTemplate::PointwiseChain, strict, i, 1});
  } else {
    p.kernels.push_back(exec::Kernel{0, forge::KernelTemplate::PointwiseChain, strict, 0, ncalls});
  }
  p.results.push_back(step_tensor.back());
  // Every scalar and every Python number is patchable.
  for (std::uint32_t i = 0; i < p.scalars.size(); ++i)
    p.patches.push_back(exec::PatchPoint{exec::PatchKind::Scalar, i, "s" + std::to_string(i)});
  for (std::uint32_t s = 0; s < p.slots.size(); ++s)
    if (p.slots[s].kind == exec::SlotKind::Constant)
      p.patches.push_back(exec::PatchPoint{exec::PatchKind::Constant, s, "c" + std::to_string(s)});
  return b;
}

// ---- buffers of one run, and the reference ----

// Random values with IEEE specials mixed in (NaN, ±Inf, ±0, subnormals, huge).
inline void fill_random(std::vector<char>& buf, std::int8_t dt, std::mt19937_64& rng) {
  std::uniform_real_distribution<double> u(-4.0, 4.0);
  std::uniform_int_distribution<int> pick(0, 99);
  const double specials[] = {NAN,   INFINITY, -INFINITY, 0.0,    -0.0,
                             1e-40, -1e-310,  3e38,      -1e300, 1.0};
  const std::size_t n = buf.size() / dtype_bytes(dt);
  for (std::size_t i = 0; i < n; ++i) {
    const int k = pick(rng);
    const double x = k < 10 ? specials[k] : u(rng);
    if (dt == kF64)
      std::memcpy(buf.data() + 8 * i, &x, 8);
    else {
      const float f = static_cast<float>(x);
      std::memcpy(buf.data() + 4 * i, &f, 4);
    }
  }
}

struct RunBuffers {
  std::vector<std::vector<char>> inputs, outputs;
};

// The chain evaluated step by step over the spec (not the plan): intermediates in buffers of
// their own, inputs and outputs in `b` (updated in place). `scalars` replaces each step's
// recorded scalars in order; `numbers` each Python number's value.
inline void reference_run(const ChainSpec& c, const BuiltPlan& bp, RunBuffers& b,
                          const std::vector<record::ScalarRecord>& scalars,
                          const std::vector<double>& numbers,
                          AlphaRounding rounding = aten_alpha_rounding()) {
  std::vector<View> in_views;
  std::vector<Operand> in_ops;
  std::vector<std::vector<char>> numbers_mem(c.inputs.size());
  std::size_t number_i = 0;
  for (std::size_t i = 0; i < c.inputs.size(); ++i) {
    const TensorSpec& t = c.inputs[i];
    if (t.wrapped) {
      numbers_mem[i].resize(8);
      std::memcpy(numbers_mem[i].data(), &numbers[number_i++], 8);
      in_views.push_back(
          View{numbers_mem[i].data(), kF64, std::vector<std::int64_t>(c.shape.size(), 0)});
      in_ops.push_back({kF64, 2});
      continue;
    }
    char* base = b.inputs[bp.input_slot_of[i]].data() + t.offset * dtype_bytes(t.dtype);
    const auto st = t.strides.empty() ? contiguous_strides(t.sizes) : t.strides;
    in_views.push_back(view_of(base, t.dtype, t.sizes, st, c.shape));
    in_ops.push_back({t.dtype, t.sizes.empty() ? 1 : 0, numel(t.sizes)});
  }
  std::vector<View> step_views;
  std::vector<Operand> step_ops;
  std::vector<std::vector<char>> temps(c.steps.size());
  std::size_t scalar_i = 0;
  for (std::size_t si = 0; si < c.steps.size(); ++si) {
    const StepSpec& st = c.steps[si];
    if (host_read_step(st.op)) {  // nothing to compute
      step_views.emplace_back();
      step_ops.push_back({kF32, 0});
      continue;
    }
    OpInfo info{};
    ASSERT_TRUE(op_info(st.op, &info)) << st.op;
    std::vector<View> ins;
    std::vector<Operand> ops;
    for (int x : st.in) {
      ins.push_back(x >= 0 ? in_views[x] : step_views[-(x + 1)]);
      ops.push_back(x >= 0 ? in_ops[x] : step_ops[-(x + 1)]);
    }
    View out;
    if (st.op.find("_.") != std::string::npos || st.op.back() == '_') {
      out = ins[0];
    } else {
      const auto strides = st.out_strides.empty() ? contiguous_strides(c.shape) : st.out_strides;
      char* base;
      if (bp.step_output_binding[si] >= 0) {
        base = b.outputs[bp.step_output_binding[si]].data();
      } else {
        temps[si].assign(extent_bytes(c.shape, strides, 0, st.out_dtype) + 8, 0);
        base = temps[si].data();
      }
      out = view_of(base, st.out_dtype, c.shape, strides, c.shape);
    }
    const std::span<const record::ScalarRecord> s(scalars.data() + scalar_i, st.scalars.size());
    scalar_i += st.scalars.size();
    std::vector<std::int64_t> shape = c.shape;
    if (out.base == ins[0].base && st.in[0] >= 0 && c.inputs[st.in[0]].sizes.empty())
      shape.assign(c.shape.size(), 1);  // in place on a 0-d input: its one element, once
    run_elementwise(info, ins, ops, out, shape, s, rounding);
    step_views.push_back(out);
    step_ops.push_back({out.dtype, c.shape.empty() ? 1 : 0, numel(c.shape)});
  }
}

// The plan's kernels whose calls are all ops the CPU backend covers: the ones it must generate.
inline std::uint32_t coverable_kernels(const exec::ExecutionPlan& p) {
  const std::vector<std::string> covered = covered_pointwise_ops();
  std::uint32_t n = 0;
  for (const exec::Kernel& k : p.kernels) {
    bool all = k.call_count > 0;
    for (std::uint32_t c = k.call_begin; c < k.call_begin + k.call_count; ++c)
      all = all && std::find(covered.begin(), covered.end(), p.op_names[p.calls[c].op]) !=
                       covered.end();
    n += all ? 1 : 0;
  }
  return n;
}

// The plan's calls of covered ops: the CPU backend generates each (Note [Kernel runs]).
inline std::uint32_t covered_calls(const exec::ExecutionPlan& p) {
  std::uint32_t n = 0;
  for (const exec::Call& c : p.calls) n += covers_op(p.op_names[c.op]) ? 1 : 0;
  return n;
}

// Performs each covered op (and aten::sqrt, aten::exp) over any strides, in plain loops.
struct LoopProvider {
  int calls = 0;
  AlphaRounding rounding = aten_alpha_rounding();
  Status call(const exec::LibraryCall& c) {
    ++calls;
    if (host_read_step(std::string(c.op))) return ok_status();
    OpInfo info{};
    if (!op_info(std::string(c.op), &info))
      return unsupported("the loop provider has no " + std::string(c.op), "add it to op_info");
    const exec::TensorArg& o = c.outputs[0];
    const std::vector<std::int64_t> shape(o.sizes.begin(), o.sizes.end());
    std::vector<View> ins;
    std::vector<Operand> ops;
    for (const exec::TensorArg& t : c.inputs) {
      ins.push_back(view_of(static_cast<char*>(t.data), t.dtype, {t.sizes.begin(), t.sizes.end()},
                            {t.strides.begin(), t.strides.end()}, shape));
      ops.push_back({t.dtype,
                     t.wrapped_number  ? 2
                     : t.sizes.empty() ? 1
                                       : 0,
                     numel({t.sizes.begin(), t.sizes.end()})});
    }
    const View out = view_of(static_cast<char*>(o.data), o.dtype, shape,
                             {o.strides.begin(), o.strides.end()}, shape);
    run_elementwise(info, ins, ops, out, shape, c.scalars, rounding);
    return ok_status();
  }
  exec::Provider provider() {
    return exec::Provider{this, [](void* self, const exec::LibraryCall& c) {
                            return static_cast<LoopProvider*>(self)->call(c);
                          }};
  }
};

// Element-by-element equality of two buffers of dtype `dt`: the same bits, or both NaN (which
// NaN an operation with two NaN operands returns is not fixed by IEEE-754). Returns the first
// differing element, or -1.
inline std::int64_t first_difference(const std::vector<char>& a, const std::vector<char>& b,
                                     std::int8_t dt) {
  if (a.size() != b.size()) return 0;
  const std::size_t es = dtype_bytes(dt);
  for (std::size_t i = 0; i + es <= a.size(); i += es) {
    if (std::memcmp(a.data() + i, b.data() + i, es) == 0) continue;
    if (dt == kF64) {
      double x, y;
      std::memcpy(&x, a.data() + i, 8);
      std::memcpy(&y, b.data() + i, 8);
      if (std::isnan(x) && std::isnan(y)) continue;
    } else {
      float x, y;
      std::memcpy(&x, a.data() + i, 4);
      std::memcpy(&y, b.data() + i, 4);
      if (std::isnan(x) && std::isnan(y)) continue;
    }
    return static_cast<std::int64_t>(i / es);
  }
  return -1;
}

}  // namespace crucible::mimic::test
