// PointwiseProgram.cpp — lowering a plan kernel's elementwise calls to one per-element program
// (Note [Pointwise programs], PointwiseProgram.h).
#include "crucible/mimic/PointwiseProgram.h"

#include <algorithm>
#include <array>
#include <bit>
#include <map>
#include <optional>
#include <string_view>

#include "crucible/core/ScalarType.h"

namespace crucible::mimic {
namespace {

constexpr std::array<const char*, static_cast<std::size_t>(PwOp::kCount)> kOpNames{
    "load", "param", "convert",   "add",       "sub",          "mul",  "div",  "neg",   "abs",
    "relu", "store", "addscaled", "subscaled", "thresholdbwd", "lerp", "sqrt", "const", "sign"};
static_assert(kOpNames.size() == 18, "one name per PwOp");

// The covered ops: what each computes, how many tensor inputs it has, and where its scalar
// arguments sit in the schema (other: the second operand of a .Scalar overload,
// threshold_backward's threshold or lerp's weight; alpha, or addcmul's and addcdiv's value).
// addcmul and addcdiv are several instructions (Note [Pointwise programs]); Copy is the last
// tensor input's value (clone, copy_), Zero and Ones a constant (the inputs are not read);
// `fast`: generated only for numerics="fast".
enum class Form : std::uint8_t { One, AddCMul, AddCDiv, Copy, Zero, Ones, MseBwd, Mse };
struct OpRow {
  std::string_view name;
  PwOp op;
  std::uint8_t tensor_inputs;
  std::int8_t other_arg;  // -1: none
  std::int8_t alpha_arg;  // -1: none
  Form form = Form::One;
  bool fast = false;
};
constexpr std::array<OpRow, 46> kOps{{
    {"aten::threshold_backward", PwOp::ThresholdBwd, 2, 2, -1},
    {"aten::abs", PwOp::Abs, 1, -1, -1},
    {"aten::abs_", PwOp::Abs, 1, -1, -1},
    {"aten::sign", PwOp::Sign, 1, -1, -1},
    {"aten::sign_", PwOp::Sign, 1, -1, -1},
    {"aten::sgn", PwOp::Sign, 1, -1, -1},
    {"aten::sgn_", PwOp::Sign, 1, -1, -1},
    {"aten::add.Scalar", PwOp::Add, 1, 1, 2},
    {"aten::add.Tensor", PwOp::Add, 2, -1, 2},
    {"aten::add_.Scalar", PwOp::Add, 1, 1, 2},
    {"aten::add_.Tensor", PwOp::Add, 2, -1, 2},
    {"aten::div.Scalar", PwOp::Div, 1, 1, -1},
    {"aten::div.Tensor", PwOp::Div, 2, -1, -1},
    {"aten::div_.Scalar", PwOp::Div, 1, 1, -1},
    {"aten::div_.Tensor", PwOp::Div, 2, -1, -1},
    {"aten::mul.Scalar", PwOp::Mul, 1, 1, -1},
    {"aten::mul.Tensor", PwOp::Mul, 2, -1, -1},
    {"aten::mul_.Scalar", PwOp::Mul, 1, 1, -1},
    {"aten::mul_.Tensor", PwOp::Mul, 2, -1, -1},
    {"aten::neg", PwOp::Neg, 1, -1, -1},
    {"aten::neg_", PwOp::Neg, 1, -1, -1},
    {"aten::relu", PwOp::Relu, 1, -1, -1},
    {"aten::relu_", PwOp::Relu, 1, -1, -1},
    {"aten::sub.Scalar", PwOp::Sub, 1, 1, 2},
    {"aten::sub.Tensor", PwOp::Sub, 2, -1, 2},
    {"aten::sub_.Scalar", PwOp::Sub, 1, 1, 2},
    {"aten::sub_.Tensor", PwOp::Sub, 2, -1, 2},
    {"aten::subtract.Tensor", PwOp::Sub, 2, -1, 2},
    {"aten::multiply.Tensor", PwOp::Mul, 2, -1, -1},
    {"aten::divide.Tensor", PwOp::Div, 2, -1, -1},
    {"aten::negative", PwOp::Neg, 1, -1, -1},
    {"aten::addcmul", PwOp::AddScaled, 3, -1, 3, Form::AddCMul},
    {"aten::addcmul_", PwOp::AddScaled, 3, -1, 3, Form::AddCMul},
    {"aten::addcdiv", PwOp::Add, 3, -1, 3, Form::AddCDiv},
    {"aten::addcdiv_", PwOp::Add, 3, -1, 3, Form::AddCDiv},
    {"aten::lerp.Scalar", PwOp::Lerp, 2, 2, -1},
    {"aten::lerp_.Scalar", PwOp::Lerp, 2, 2, -1},
    {"aten::sqrt", PwOp::Sqrt, 1, -1, -1, Form::One, true},
    {"aten::sqrt_", PwOp::Sqrt, 1, -1, -1, Form::One, true},
    {"aten::clone", PwOp::Load, 1, -1, -1, Form::Copy},
    {"aten::copy_", PwOp::Load, 2, -1, -1, Form::Copy},
    {"aten::zero_", PwOp::Const, 1, -1, -1, Form::Zero},
    {"aten::zeros_like", PwOp::Const, 1, -1, -1, Form::Zero},
    {"aten::ones_like", PwOp::Const, 1, -1, -1, Form::Ones},
    {"aten::mse_loss_backward", PwOp::Mul, 3, -1, -1, Form::MseBwd},
    {"aten::mse_loss", PwOp::Mul, 2, -1, -1, Form::Mse},  // reduction none (else a sum)
}};
static_assert(kOps.size() == 46, "the covered-op table is data: update the count");

const OpRow* find_op(std::string_view name, bool fast) {
  for (const OpRow& r : kOps)
    if (r.name == name) return r.fast && !fast ? nullptr : &r;
  return nullptr;
}

bool is_float(std::int8_t d) { return d == dtype::kFloat32 || d == dtype::kFloat64; }

constexpr std::size_t kMaxInsts = 65535;

// Where an element of one tensor is: the memory location an operand stands for.
struct Key {
  std::uint32_t slot;
  std::int64_t offset;
  std::int8_t dtype;
  std::vector<std::int64_t> strides;  // iteration space; 0 where the iteration dim is 1
  auto operator<=>(const Key&) const = default;
};

class Lowering {
 public:
  // Calls [begin, begin + count) of kernel k.
  Lowering(const exec::ExecutionPlan& p, std::uint32_t k, std::uint32_t begin, std::uint32_t count,
           bool fast, std::span<const std::uint32_t> skip = {})
      : p_(p), begin_(begin), count_(count), index_(k), fast_(fast), skip_(skip) {
    out_.fast = fast;
  }

  Result<PointwiseKernel> run() {
    if (count_ == 0) return refuse("it has no calls");
    const exec::Call& first = p_.calls[begin_];
    if (first.out_count != 1)
      return refuse("its first call has " + n(first.out_count) + " outputs");
    const exec::TensorRef& out0 = p_.tensors[p_.outputs_of(first)[0].tensor];
    const auto s = p_.sizes(out0);
    out_.shape.assign(s.begin(), s.end());
    for (std::uint32_t c = begin_; c < begin_ + count_; ++c) {
      if (std::find(skip_.begin(), skip_.end(), c) != skip_.end()) continue;
      // Instruction, operand and parameter ids are 16 bits; one call adds at most 12
      // instructions (addcdiv: 3 loads, 3 conversions, its value, 3 ops, a conversion, a store).
      if (out_.program.insts.size() + 12 > kMaxInsts)
        return refuse("it needs more than " + n(kMaxInsts) + " instructions");
      CRUCIBLE_RETURN_IF_ERROR(lower_call(c));
    }
    CRUCIBLE_RETURN_IF_ERROR(check_aliasing());
    return std::move(out_);
  }

 private:
  static std::string n(std::uint64_t x) { return std::to_string(x); }
  Status refuse(const std::string& why) const {
    return unsupported(
        "kernel " + n(index_) + " is not a pointwise chain the CPU backend " + "generates: " + why,
        "it runs as library calls");
  }
  Status refuse_call(std::uint32_t c, const std::string& why) const {
    return refuse("call " + n(c) + " (" + p_.op_names[p_.calls[c].op] + ") " + why);
  }

  // t's strides in iteration space, or nothing if t does not broadcast to the shape.
  std::optional<std::vector<std::int64_t>> iteration_strides(const exec::TensorRef& t) const {
    const auto sz = p_.sizes(t), st = p_.strides(t);
    const std::size_t nd = out_.shape.size();
    if (sz.size() > nd) return std::nullopt;
    std::vector<std::int64_t> r(nd, 0);
    for (std::size_t d = 0; d < nd; ++d) {
      const std::ptrdiff_t j =
          static_cast<std::ptrdiff_t>(d) - static_cast<std::ptrdiff_t>(nd - sz.size());
      if (j < 0 || out_.shape[d] == 1) continue;
      if (sz[j] == out_.shape[d]) {
        if (st[j] < 0) return std::nullopt;
        r[d] = st[j];
      } else if (sz[j] != 1) {
        return std::nullopt;
      }
    }
    return r;
  }

  Result<Key> key_of(std::uint32_t c, std::uint32_t ti, bool output) const {
    const exec::TensorRef& t = p_.tensors[ti];
    // A Python int (a wrapped int64 number) is read and converted, as ATen converts it.
    const bool int_number = !output && (t.flags & exec::kWrappedNumber) && t.dtype == dtype::kInt64;
    if (!is_float(t.dtype) && !int_number)
      return refuse_call(c, "has a tensor of dtype " + std::string(scalar_type_info(t.dtype).name) +
                                " (float32 and float64 are generated, and Python ints)");
    if (output) {
      const auto sz = p_.sizes(t);
      if (!std::equal(sz.begin(), sz.end(), out_.shape.begin(), out_.shape.end()))
        return refuse_call(c, "writes a tensor of another shape than the kernel's first output");
    }
    auto st = iteration_strides(t);
    if (!st) return refuse_call(c, "reads a tensor that does not broadcast to its output");
    if (output && !disjoint(*st)) return refuse_call(c, "writes a tensor whose elements overlap");
    return Key{t.slot, t.offset, t.dtype, std::move(*st)};
  }

  // No two elements of the iteration space at one address: strides sorted ascending each
  // step past the extent of the dims inside them (sufficient, and true of every dense layout).
  bool disjoint(const std::vector<std::int64_t>& st) const {
    std::vector<std::pair<std::int64_t, std::int64_t>> dims;
    for (std::size_t d = 0; d < st.size(); ++d)
      if (out_.shape[d] > 1) dims.emplace_back(st[d], out_.shape[d]);
    std::sort(dims.begin(), dims.end());
    std::int64_t extent = 1;
    for (auto [stride, size] : dims) {
      if (stride < extent) return false;
      extent = stride * size;
    }
    return true;
  }

  std::uint16_t emit(PwOp op, std::int8_t dt, std::uint32_t a = 0, std::uint32_t b = 0,
                     std::uint32_t c = 0) {
    out_.program.insts.push_back(PwInst{op, dt, static_cast<std::uint16_t>(a),
                                        static_cast<std::uint16_t>(b),
                                        static_cast<std::uint16_t>(c)});
    return static_cast<std::uint16_t>(out_.program.insts.size() - 1);
  }
  std::uint32_t operand(const Key& k, std::uint32_t ti, bool write) {
    auto [it, fresh] = operands_.try_emplace(k, static_cast<std::uint32_t>(operands_.size()));
    if (fresh) {
      const bool bc =
          std::all_of(k.strides.begin(), k.strides.end(), [](std::int64_t s) { return s == 0; });
      out_.program.operands.push_back(PwOperand{k.dtype, bc, false, false});
      out_.operand_tensor.push_back(ti);
      out_.strides.push_back(k.strides);
    }
    PwOperand& o = out_.program.operands[it->second];
    (write ? o.write : o.read) = true;
    return it->second;
  }
  std::uint16_t convert(std::uint16_t v, std::int8_t to) {
    return out_.program.insts[v].dtype == to ? v : emit(PwOp::Convert, to, v);
  }
  Result<std::uint16_t> param(std::uint32_t c, std::uint32_t scalar_index, std::int8_t dt) {
    const record::ScalarRecord& r = p_.scalars[scalar_index];
    if (r.kind != record::ScalarKind::Double && r.kind != record::ScalarKind::Int &&
        r.kind != record::ScalarKind::Bool)
      return refuse_call(c, "has a scalar argument of kind " + n(static_cast<int>(r.kind)));
    out_.param_scalar.push_back(scalar_index);
    out_.program.params.push_back(dt);
    return emit(PwOp::Param, dt, static_cast<std::uint32_t>(out_.program.params.size() - 1));
  }
  // The call's scalar at schema position `arg`, if it was given.
  std::optional<std::uint32_t> scalar_at(const exec::Call& call, int arg) const {
    if (arg < 0) return std::nullopt;
    for (std::uint32_t i = call.scalar_begin; i < call.scalar_begin + call.scalar_count; ++i)
      if (p_.scalars[i].arg_index == arg && p_.scalars[i].kind != record::ScalarKind::None)
        return i;
    return std::nullopt;
  }

  Status lower_call(std::uint32_t c) {
    const exec::Call& call = p_.calls[c];
    const std::string& name = p_.op_names[call.op];
    const OpRow* row = find_op(name, fast_);
    if (row == nullptr && (name == "aten::sqrt" || name == "aten::sqrt_"))
      return refuse_call(c, "is not generated bit-exact: ATen's sqrt is not IEEE sqrt, so no "
                            "generated kernel gives its bits (numerics=\"fast\" generates it)");
    if (row == nullptr) return refuse_call(c, "is not a covered op");
    if (call.in_count != row->tensor_inputs || call.out_count != 1)
      return refuse_call(
          c, "has " + n(call.in_count) + " tensor inputs and " + n(call.out_count) + " outputs");
    if (row->form == Form::Copy || row->form == Form::Zero || row->form == Form::Ones) {
      std::uint16_t r = 0;
      if (row->form == Form::Copy) {  // the source: the last tensor input (copy_'s src)
        const exec::Arg& src = p_.inputs_of(call)[call.in_count - 1];
        auto v = load(c, src.tensor);
        if (!v.ok()) return v.status();
        r = *v;
      } else {  // the constant in the output's dtype; the input only gives the shape
        const exec::TensorRef& o = p_.tensors[p_.outputs_of(call)[0].tensor];
        if (!is_float(o.dtype)) return refuse_call(c, "makes a tensor of another dtype than float32 or float64");
        r = emit(PwOp::Const, o.dtype, row->form == Form::Ones ? 1 : 0);
      }
      return finish_call(c, call, r);
    }
    // Compute dtype: the widest float among the highest tier present (dimensioned tensors,
    // then 0-d tensors, then Python numbers).
    int best_tier = 3;
    std::int8_t compute = dtype::kFloat32;
    std::vector<std::uint16_t> vals;
    for (const exec::Arg& a : p_.inputs_of(call)) {
      const exec::TensorRef& t = p_.tensors[a.tensor];
      auto key = key_of(c, a.tensor, false);
      if (!key.ok()) return key.status();
      const int tier = (t.flags & exec::kWrappedNumber) ? 2 : t.ndim == 0 ? 1 : 0;
      if (tier < best_tier)
        best_tier = tier, compute = t.dtype;
      else if (tier == best_tier && t.dtype == dtype::kFloat64)
        compute = dtype::kFloat64;
      vals.push_back(value_of(*key, a.tensor));
    }
    if (row->form == Form::MseBwd) return lower_mse_backward(c, call, vals);
    if (row->form == Form::Mse) return lower_mse_none(c, call, vals);
    for (std::uint16_t& v : vals) v = convert(v, compute);
    if (row->other_arg >= 0) {
      auto other = scalar_at(call, row->other_arg);
      if (!other) return refuse_call(c, "has no recorded scalar operand");
      auto v = param(c, *other, compute);
      if (!v.ok()) return v.status();
      vals.push_back(*v);
    }
    std::uint16_t r = 0;
    if (row->form != Form::One) {  // (self, t1, t2): value*t1 first, as ATen
      std::uint16_t m = vals[1];
      if (auto value = scalar_at(call, row->alpha_arg)) {
        auto v = param(c, *value, compute);
        if (!v.ok()) return v.status();
        m = emit(PwOp::Mul, compute, *v, vals[1]);
      }
      if (row->form == Form::AddCMul) {
        r = emit(PwOp::AddScaled, compute, vals[0], vals[2], m);
        out_.always_scaled = true;
        note_scaled(call);
      } else {
        r = emit(PwOp::Add, compute, vals[0], emit(PwOp::Div, compute, m, vals[2]));
      }
    } else if (row->op == PwOp::ThresholdBwd) {  // inputs (grad, self), then the threshold
      r = emit(PwOp::ThresholdBwd, compute, vals[1], vals[0], vals[2]);
    } else if (row->op == PwOp::Lerp) {  // (self, end), then the weight
      r = emit(PwOp::Lerp, compute, vals[0], vals[1], vals[2]);
      out_.always_scaled = true;
      note_scaled(call);
    } else if (vals.size() == 2) {
      std::uint16_t b = vals[1];
      if (auto alpha = scalar_at(call, row->alpha_arg)) {
        auto al = param(c, *alpha, compute);
        if (!al.ok()) return al.status();
        out_.unit_params.push_back(out_.program.insts[*al].a);
        note_scaled(call);
        r = emit(row->op == PwOp::Sub ? PwOp::SubScaled : PwOp::AddScaled, compute, vals[0], b, *al);
      } else {
        r = emit(row->op, compute, vals[0], b);
      }
    } else {
      r = emit(row->op, compute, vals[0]);
    }
    return finish_call(c, call, r);
  }

  // Whether every input of `call` is a tensor of dtype dt (no Python number among them).
  bool one_dtype(const exec::Call& call, std::int8_t dt) const {
    for (const exec::Arg& a : p_.inputs_of(call))
      if (p_.tensors[a.tensor].dtype != dt || (p_.tensors[a.tensor].flags & exec::kWrappedNumber))
        return false;
    return true;
  }

  // Note [Pointwise programs]: mse_loss_backward(grad_output, self, target, reduction) is
  // (norm * (self - target)) * grad_output in the tensors' one dtype, norm fixed here from
  // self's size (2/numel for a mean, else 2).
  Status lower_mse_backward(std::uint32_t c, const exec::Call& call,
                            const std::vector<std::uint16_t>& vals) {
    const std::int8_t dt = p_.tensors[p_.outputs_of(call)[0].tensor].dtype;
    if (!one_dtype(call, dt)) return refuse_call(c, "has tensors of more than one dtype");
    auto reduction = scalar_at(call, 3);
    if (!reduction || p_.scalars[*reduction].kind != record::ScalarKind::Int)
      return refuse_call(c, "has no recorded reduction");
    const auto red = static_cast<std::int64_t>(p_.scalars[*reduction].bits);
    if (red < 0 || red > 2)
      return refuse_call(c, "has an unknown reduction " + std::to_string(red));
    std::int64_t numel = 1;  // self's (ATen's input.numel()), which may broadcast
    for (std::int64_t d : p_.sizes(p_.tensors[p_.inputs_of(call)[1].tensor])) numel *= d;
    const double norm =
        red == 1 ? 2.0 / static_cast<double>(numel) : 2.0;  // ATen's Reduction::Mean is 1
    record::ScalarRecord fixed;
    fixed.kind = record::ScalarKind::Double;
    fixed.bits = std::bit_cast<std::uint64_t>(norm);
    out_.fixed_scalars.push_back(fixed);
    out_.fixed_from.emplace_back(*reduction, p_.scalars[*reduction].bits);
    out_.param_scalar.push_back(PointwiseKernel::kFixedScalar |
                                static_cast<std::uint32_t>(out_.fixed_scalars.size() - 1));
    out_.program.params.push_back(dt);
    const std::uint16_t n =
        emit(PwOp::Param, dt, static_cast<std::uint32_t>(out_.program.params.size() - 1));
    const std::uint16_t diff = emit(PwOp::Sub, dt, vals[1], vals[2]);
    return finish_call(c, call, emit(PwOp::Mul, dt, emit(PwOp::Mul, dt, n, diff), vals[0]));
  }

  // mse_loss(self, target, reduction none): (self - target) * (self - target), ATen's mse_kernel,
  // in the tensors' one dtype. A mean or sum is a sum with a prologue (lower_mse_loss).
  Status lower_mse_none(std::uint32_t c, const exec::Call& call,
                        const std::vector<std::uint16_t>& vals) {
    const std::int8_t dt = p_.tensors[p_.outputs_of(call)[0].tensor].dtype;
    if (!one_dtype(call, dt)) return refuse_call(c, "has tensors of more than one dtype");
    if (is_mse_loss_sum(p_, c))
      return refuse_call(c, "has reduction mean or sum: a sum, not a pointwise op");
    // none, fixed here: a launch with another (a patch) runs ATen's call, which says the shapes
    // differ
    if (auto reduction = scalar_at(call, 2))
      out_.fixed_from.emplace_back(*reduction, p_.scalars[*reduction].bits);
    const std::uint16_t diff = emit(PwOp::Sub, dt, vals[0], vals[1]);
    return finish_call(c, call, emit(PwOp::Mul, dt, diff, diff));
  }

  // The register holding what location `key` (of tensor ti) holds now: loaded on first use.
  std::uint16_t value_of(const Key& key, std::uint32_t ti) {
    accesses_.push_back({key.slot, key, false});
    auto it = values_.find(key);
    if (it != values_.end()) return it->second;
    const std::uint32_t o = operand(key, ti, false);
    const std::uint16_t v = emit(PwOp::Load, key.dtype, o);
    values_.emplace(key, v);
    return v;
  }
  Result<std::uint16_t> load(std::uint32_t c, std::uint32_t ti) {
    auto key = key_of(c, ti, false);
    if (!key.ok()) return key.status();
    return value_of(*key, ti);
  }

  // The call's result r, converted to its output's dtype, becomes that location's value; stored
  // when anything outside the run may read it.
  Status finish_call(std::uint32_t c, const exec::Call& call, std::uint16_t r) {
    const std::uint32_t out_t = p_.outputs_of(call)[0].tensor;
    auto key = key_of(c, out_t, true);
    if (!key.ok()) return key.status();
    r = convert(r, key->dtype);
    values_.insert_or_assign(*key, r);
    accesses_.push_back({key->slot, *key, true});
    if (must_store(out_t)) emit(PwOp::Store, key->dtype, r, operand(*key, out_t, true));
    return ok_status();
  }

  // A call that rounds a product into a sum: does an input of it have other sizes than its
  // output (Note [ATen's alpha rounding], CpuBackend.cpp)?
  void note_scaled(const exec::Call& call) {
    const auto out = p_.sizes(p_.tensors[p_.outputs_of(call)[0].tensor]);
    for (const exec::Arg& a : p_.inputs_of(call)) {
      const auto in = p_.sizes(p_.tensors[a.tensor]);
      if (!std::equal(in.begin(), in.end(), out.begin(), out.end())) out_.scaled_broadcast = true;
    }
  }

  // A call outside the kernel or the caller may read what this tensor's slot holds.
  bool must_store(std::uint32_t ti) const {
    const exec::TensorRef& t = p_.tensors[ti];
    const exec::Slot& s = p_.slots[t.slot];
    if (s.kind != exec::SlotKind::Arena) return true;
    if (s.first < begin_ || s.last >= begin_ + count_) return true;
    for (std::uint32_t r : p_.results)
      if (p_.tensors[r].slot == t.slot) return true;
    return false;
  }

  Status check_aliasing() const {
    std::map<std::uint32_t, const Key*> first;
    std::map<std::uint32_t, bool> written;
    for (const Access& a : accesses_) written[a.slot] = written[a.slot] || a.write;
    for (const Access& a : accesses_) {
      auto [it, fresh] = first.try_emplace(a.slot, &a.key);
      if (!fresh && written[a.slot] && !(*it->second == a.key))
        return refuse("it writes slot " + n(a.slot) +
                      " and touches it through two different views");
    }
    return ok_status();
  }

  struct Access {
    std::uint32_t slot;
    Key key;
    bool write;
  };
  const exec::ExecutionPlan& p_;
  std::uint32_t begin_, count_;
  std::uint32_t index_;
  bool fast_;
  std::span<const std::uint32_t> skip_;
  PointwiseKernel out_;
  std::map<Key, std::uint32_t> operands_;
  std::map<Key, std::uint16_t> values_;  // the register holding each location's current value
  std::vector<Access> accesses_;
};

}  // namespace

const char* pw_op_name(PwOp op) noexcept {
  const auto i = static_cast<std::size_t>(op);
  return i < kOpNames.size() ? kOpNames[i] : "?";
}

ContentHash PointwiseProgram::hash() const {
  ContentHasher h;
  h.update_string("mimic.pointwise.v3");
  h.update_u64(insts.size());
  for (const PwInst& i : insts)
    h.update_u64(std::uint64_t{static_cast<std::uint8_t>(i.op)} |
                 std::uint64_t{static_cast<std::uint8_t>(i.dtype)} << 8 | std::uint64_t{i.a} << 16 |
                 std::uint64_t{i.b} << 32 | std::uint64_t{i.c} << 48);
  h.update_u64(operands.size());
  for (const PwOperand& o : operands)
    h.update_u64(std::uint64_t{static_cast<std::uint8_t>(o.dtype)} |
                 std::uint64_t{o.broadcast} << 8 | std::uint64_t{o.read} << 9 |
                 std::uint64_t{o.write} << 10);
  h.update_u64(params.size());
  for (std::int8_t d : params) h.update_u8(static_cast<std::uint8_t>(d));
  if (reduce != ReduceKind::None) {  // Note [Generated sums]
    h.update_string("reduce.sum.v1");
    h.update_u8(static_cast<std::uint8_t>(reduce));
    if (!insts.empty()) h.update_u64(reduced);  // Note [Sum prologues]
    h.update_u8(mean ? 1 : 0);
    h.update_u8(affine ? 1 : 0);
    if (reduce == ReduceKind::ArgExtreme || reduce == ReduceKind::ExtremeInner ||
        reduce == ReduceKind::ExtremeOuter)
      h.update_u8(smallest ? 1 : 0);  // Note [Generated max and argmax], [Generated amax and amin]
    if (reduce == ReduceKind::Variance) {  // Note [Generated var and std]
      h.update_u8(root ? 1 : 0);
      h.update_u8(int_param ? 1 : 0);
      h.update_u8(two_pass ? 1 : 0);
    }
    // Note [Generated batch norm], Note [Generated layer norm backward]
    if (reduce == ReduceKind::BatchNorm || reduce == ReduceKind::BatchNormBwd ||
        reduce == ReduceKind::LayerNormBwd) {
      h.update_u8(running ? 1 : 0);
      h.update_u8(outputs);
    }
    if (reduce >= ReduceKind::Softmax && reduce <= ReduceKind::LogSoftmaxBwd) {  // Note [Generated softmax]
      h.update_u8(safe ? 1 : 0);
      h.update_u8(vec_bytes);
      h.update_string(math);
    }
  }
  return h.digest();
}

std::string PointwiseProgram::text() const {
  std::string s;
  if (reduce == ReduceKind::Variance) {
    s += std::string(root ? "std" : "var") + (operands.size() == 3 ? "_mean " : " ") +
         std::string(scalar_type_info(operands[0].dtype).name) +
         (int_param ? " int correction" : " correction") + (two_pass ? " about the mean" : "") +
         (operands.size() == 3 ? ": op0 -> op1, op2\n" : ": op0 -> op1\n");
  } else if (reduce == ReduceKind::ExtremeInner || reduce == ReduceKind::ExtremeOuter) {
    s += std::string(smallest ? "amin " : "amax ") +
         (reduce == ReduceKind::ExtremeInner ? "rows " : "columns ") +
         std::string(scalar_type_info(operands[0].dtype).name) + ": op0 -> op1\n";
  } else if (reduce == ReduceKind::ArgExtreme) {
    s += std::string(smallest ? "min" : "max") + (operands.size() == 3 ? ".dim " : " index ") +
         std::string(scalar_type_info(operands[0].dtype).name) +
         (operands.size() == 3 ? ": op0 -> op1, op2\n" : ": op0 -> op1\n");
  } else if (reduce == ReduceKind::BatchNorm || reduce == ReduceKind::BatchNormBwd ||
             reduce == ReduceKind::LayerNormBwd) {
    s += std::string(reduce == ReduceKind::BatchNorm      ? "batch_norm"
                     : reduce == ReduceKind::BatchNormBwd ? "batch_norm_backward"
                                                          : "layer_norm_backward") +
         (affine ? " affine" : "") + (running ? " running" : "") + " " +
         std::string(scalar_type_info(operands[0].dtype).name) + ":";
    for (std::size_t o = 0; o < operands.size(); ++o)
      s += std::string(o == 0 ? " " : ", ") +
           (operands[o].write ? (operands[o].read ? "rw " : "w ") : "") + "op" + std::to_string(o);
    s += "\n";
  } else if (reduce == ReduceKind::LayerNorm)
    s += std::string("layer_norm ") + (affine ? "affine " : "") + std::string(scalar_type_info(operands[0].dtype).name) +
         (affine ? ": op0, op1, op2 -> op3, op4, op5\n" : ": op0 -> op1, op2, op3\n");
  else if (reduce == ReduceKind::NllLoss || reduce == ReduceKind::NllLossBwd)
    s += std::string(reduce == ReduceKind::NllLoss ? "nll_loss " : "nll_loss_backward ") + (mean ? "mean " : "sum ") +
         std::string(scalar_type_info(operands[0].dtype).name) +
         (reduce == ReduceKind::NllLoss ? ": op0, op1 -> op2, op3\n" : ": op0, op1, op2 -> op3\n");
  else if (reduce >= ReduceKind::Softmax)
    s += std::string(reduce == ReduceKind::LogSoftmax      ? "log_softmax"
                     : reduce == ReduceKind::SoftmaxBwd    ? "softmax_backward"
                     : reduce == ReduceKind::LogSoftmaxBwd ? "log_softmax_backward"
                     : safe                                ? "safe_softmax"
                                                           : "softmax") +
         " " + std::string(scalar_type_info(operands[0].dtype).name) + " " + std::to_string(vec_bytes) + "-byte " +
         math + (operands.size() == 3 ? ": op0, op1 -> op2\n" : ": op0 -> op1\n");
  else if (reduce != ReduceKind::None)
    s += std::string(mean ? "mean" : "sum") +
         (reduce == ReduceKind::SumInner ? " inner" : " outer") + " " +
         std::string(scalar_type_info(operands[0].dtype).name) +
         (insts.empty() ? std::string(": op0 -> op1\n")
                        : " of %" + std::to_string(reduced) + " -> op" +
                              std::to_string(operands.size() - 1) + "\n");
  for (std::size_t i = 0; i < insts.size(); ++i) {
    const PwInst& in = insts[i];
    s += "%" + std::to_string(i) + " = " + pw_op_name(in.op) + "." +
         std::string(scalar_type_info(in.dtype).name);
    switch (in.op) {
      case PwOp::Load:
        s += " op" + std::to_string(in.a);
        break;
      case PwOp::Param:
        s += " p" + std::to_string(in.a);
        break;
      case PwOp::Const:
        s += " " + std::to_string(in.a);
        break;
      case PwOp::Store:
        s += " %" + std::to_string(in.a) + " -> op" + std::to_string(in.b);
        break;
      case PwOp::Add:
      case PwOp::Sub:
      case PwOp::Mul:
      case PwOp::Div:
        s += " %" + std::to_string(in.a) + ", %" + std::to_string(in.b);
        break;
      case PwOp::AddScaled:
      case PwOp::SubScaled:
        s += " %" + std::to_string(in.a) + ", %" + std::to_string(in.b) + " * %" +
             std::to_string(in.c);
        break;
      case PwOp::ThresholdBwd:
        s += " %" + std::to_string(in.a) + " <= %" + std::to_string(in.c) + " ? 0 : %" +
             std::to_string(in.b);
        break;
      case PwOp::Lerp:
        s += " %" + std::to_string(in.a) + ", %" + std::to_string(in.b) + ", w %" +
             std::to_string(in.c);
        break;
      default:
        s += " %" + std::to_string(in.a);
        break;
    }
    s += "\n";
  }
  return s;
}

bool PointwiseProgram::scaled() const {
  for (const PwInst& i : insts)
    if (i.op == PwOp::AddScaled || i.op == PwOp::SubScaled || i.op == PwOp::Lerp) return true;
  return false;
}

Result<PointwiseKernel> lower_pointwise(const exec::ExecutionPlan& plan, std::uint32_t kernel,
                                        bool fast) {
  if (kernel >= plan.kernels.size())
    return invalid_input(
        "kernel " + std::to_string(kernel) + " of " + std::to_string(plan.kernels.size()),
        "name a kernel of the plan");
  return Lowering(plan, kernel, plan.kernels[kernel].call_begin, plan.kernels[kernel].call_count,
                  fast)
      .run();
}

Result<PointwiseKernel> lower_pointwise_calls(const exec::ExecutionPlan& plan,
                                              std::uint32_t kernel, std::uint32_t call_begin,
                                              std::uint32_t call_count, bool fast,
                                              std::span<const std::uint32_t> skip) {
  if (kernel >= plan.kernels.size())
    return invalid_input(
        "kernel " + std::to_string(kernel) + " of " + std::to_string(plan.kernels.size()),
        "name a kernel of the plan");
  const exec::Kernel& k = plan.kernels[kernel];
  if (call_begin < k.call_begin || call_begin + call_count > k.call_begin + k.call_count)
    return invalid_input("calls [" + std::to_string(call_begin) + ", " +
                             std::to_string(call_begin + call_count) + ") are not in kernel " +
                             std::to_string(kernel),
                         "name calls of the kernel");
  return Lowering(plan, kernel, call_begin, call_count, fast, skip).run();
}

bool is_reduction_op(std::string_view op) {
  return op == "aten::sum.dim_IntList" || op == "aten::sum" || op == "aten::mean.dim" ||
         op == "aten::mean";
}

namespace {
// Call c is not generated as `what` ("a sum"), for `why`.
Status not_generated(const exec::ExecutionPlan& p, std::uint32_t c, std::string_view what, const std::string& why) {
  return unsupported("call " + std::to_string(c) + " (" + p.op_names[p.calls[c].op] + ") is not " + std::string(what) +
                         " the CPU backend generates: " + why,
                     "it runs as a library call");
}

// Tensor t's element count if its dims of size above 1 are dense in row-major order, else -1.
std::int64_t dense_numel(const exec::ExecutionPlan& p, std::uint32_t t) {
  const auto sz = p.sizes(p.tensors[t]), st = p.strides(p.tensors[t]);
  std::int64_t e = 1;
  for (std::size_t d = sz.size(); d-- > 0;) {
    if (sz[d] == 1) continue;
    if (st[d] != e) return -1;
    e *= sz[d];
  }
  return e;
}

// The dim list of call `call` at schema position `arg` (`int[1] dim`, recorded as a ListBegin
// and its ints) marks `reduced` (sized to the input's rank `nd`); `listed` is how many dims it
// names, -1 when no list was recorded there. Null, or why it cannot be read.
const char* read_dim_list(const exec::ExecutionPlan& p, const exec::Call& call, std::uint16_t arg,
                          std::int64_t nd, std::vector<bool>& reduced, std::int64_t& listed) {
  listed = -1;
  for (std::uint32_t i = call.scalar_begin; i < call.scalar_begin + call.scalar_count; ++i) {
    const record::ScalarRecord& r = p.scalars[i];
    if (r.arg_index != arg || r.kind != record::ScalarKind::ListBegin) continue;
    if (i + r.aux >= call.scalar_begin + call.scalar_count) return "its dim list is cut short";
    listed = r.aux;
    if (r.aux == 0) return nullptr;
    std::fill(reduced.begin(), reduced.end(), false);
    for (std::uint32_t e = 1; e <= r.aux; ++e) {
      const record::ScalarRecord& d = p.scalars[i + e];
      if (d.kind != record::ScalarKind::Int) return "its dim list holds a non-integer";
      std::int64_t dim = static_cast<std::int64_t>(d.bits);
      if (dim < 0) dim += nd;
      if (dim < 0 || dim >= nd) return "a dim is out of range";
      reduced[static_cast<std::size_t>(dim)] = true;
    }
    return nullptr;
  }
  return nullptr;
}

// A reduction's input `in` over the dims marked in `reduced`, as ATen's reduction kernels walk
// it: its dims of size above 1 dense in row-major order, the reduced ones all innermost (rows of
// reduced_n elements, kept_n of them) or all outermost (reduced_n rows of kept_n columns); every
// dim reduced is both. Null, or why not.
struct ReducedBlock {
  bool inner = false, outer = false;
  std::int64_t reduced_n = 1, kept_n = 1;
};
const char* reduced_block(const exec::ExecutionPlan& p, const exec::TensorRef& in,
                          const std::vector<bool>& reduced, ReducedBlock& b) {
  const auto sz = p.sizes(in), st = p.strides(in);
  std::int64_t expect = 1;
  std::string pattern;  // outermost first: 'r' reduced, 'k' kept
  for (std::size_t i = sz.size(); i-- > 0;) {
    if (sz[i] == 0) return "it has an empty dim";
    if (sz[i] == 1) continue;
    if (st[i] != expect) return "its input is not dense in row-major order";
    expect *= sz[i];
    (reduced[i] ? b.reduced_n : b.kept_n) *= sz[i];
    pattern.insert(pattern.begin(), reduced[i] ? 'r' : 'k');
  }
  if (b.reduced_n == 1) return "no dim of size above 1 is reduced";
  const auto first_r = pattern.find('r'), last_r = pattern.rfind('r');
  b.inner = pattern.find('k', first_r) == std::string::npos;  // k...k r...r
  b.outer = pattern.rfind('k', last_r) == std::string::npos;  // r...r k...k
  if (!b.inner && !b.outer) return "its reduced dims are neither all innermost nor all outermost";
  return nullptr;
}
}  // namespace

// Note [Generated sums].
Result<PointwiseKernel> lower_reduction(const exec::ExecutionPlan& p, std::uint32_t c) {
  const exec::Call& call = p.calls[c];
  const std::string& name = p.op_names[call.op];
  auto refuse = [&](const std::string& why) { return not_generated(p, c, "a sum", why); };
  if (!is_reduction_op(name)) return refuse("not a sum or mean");
  if (call.in_count != 1 || call.out_count != 1) return refuse("it has other than one input and one output");
  const std::uint32_t in_t = p.inputs_of(call)[0].tensor, out_t = p.outputs_of(call)[0].tensor;
  const exec::TensorRef& in = p.tensors[in_t];
  const exec::TensorRef& out = p.tensors[out_t];
  if (!is_float(in.dtype) || out.dtype != in.dtype)
    return refuse("its input and result are not both float32 or both float64");
  const auto nd = static_cast<std::int64_t>(p.sizes(in).size());
  // The reduced dims: `dim` (schema position 1 of sum.dim_IntList and mean.dim); none given,
  // or aten::sum and aten::mean, reduces every dim. dtype (position 3, or 1 of aten::sum and
  // aten::mean) must not be given.
  std::vector<bool> reduced(static_cast<std::size_t>(nd), true);
  const bool has_dim = name != "aten::sum" && name != "aten::mean";
  for (std::uint32_t i = call.scalar_begin; i < call.scalar_begin + call.scalar_count; ++i)
    if (p.scalars[i].arg_index == (has_dim ? 3 : 1) &&
        p.scalars[i].kind != record::ScalarKind::None)
      return refuse("a dtype was given");
  std::int64_t listed = -1;
  if (has_dim) {
    if (const char* why = read_dim_list(p, call, 1, nd, reduced, listed)) return refuse(why);
    if (listed == 0) return refuse("its dim list is empty");
  }
  if (has_dim && listed < 0 && nd > 0) {
    bool none = false;  // dim=None: every dim
    for (std::uint32_t i = call.scalar_begin; i < call.scalar_begin + call.scalar_count; ++i)
      none |= p.scalars[i].arg_index == 1 && p.scalars[i].kind == record::ScalarKind::None;
    if (!none) return refuse("its dim argument was not recorded");
  }
  ReducedBlock blk;
  if (const char* why = reduced_block(p, in, reduced, blk)) return refuse(why);
  const bool inner = blk.inner, outer = blk.outer;
  const std::int64_t reduced_n = blk.reduced_n, kept_n = blk.kept_n;
  if (kept_n == 1 && reduced_n > 32768)
    return refuse("a full reduction of more than 32768 elements, which ATen splits over its threads");
  // ATen splits an outer sum of 32768 elements or more over its threads by columns, in ranges
  // of whole 128 bytes but the last, which ends at the last column: a last range of 4 to 7
  // float32 columns (narrower than a vector) takes ATen's scalar path, which sums its first 4
  // columns in another order than one thread does. Whether that range exists depends on the
  // thread count at the time (misc/ATEN_ORDER.md 2.6).
  if (outer && !inner && in.dtype == dtype::kFloat32 && reduced_n * kept_n >= 32768 && kept_n > 32 &&
      kept_n % 32 >= 4 && kept_n % 32 < 8)
    return refuse("an outer float32 sum whose last 4 to 7 columns ATen sums in another order when it runs "
                  "on several threads");
  // The result: kept_n elements, dense.
  const std::int64_t out_n = dense_numel(p, out_t);
  if (out_n < 0) return refuse("its result is not dense");
  if (out_n != kept_n) return refuse("its result has another element count than its kept dims");
  PointwiseKernel k;
  k.program.reduce = inner ? ReduceKind::SumInner : ReduceKind::SumOuter;
  k.program.mean = name == "aten::mean.dim" || name == "aten::mean";
  k.program.operands = {PwOperand{in.dtype, false, true, false}, PwOperand{in.dtype, false, false, true}};
  k.operand_tensor = {in_t, out_t};
  k.reduce_rows = inner ? kept_n : reduced_n;
  k.reduce_cols = inner ? reduced_n : kept_n;
  return k;
}

bool sum_prologue_ok(const PointwiseProgram& pg) {
  if (pg.reduce != ReduceKind::SumInner && pg.reduce != ReduceKind::SumOuter) return false;
  if (pg.insts.empty() || pg.reduced >= pg.insts.size() || pg.operands.size() < 2) return false;
  const std::int8_t dt = pg.operands.back().dtype;
  for (std::size_t o = 0; o + 1 < pg.operands.size(); ++o) {  // another dtype: a Python number
    const PwOperand& op = pg.operands[o];
    if (op.write ||
        (op.dtype != dt && !(op.broadcast && (is_float(op.dtype) || op.dtype == dtype::kInt64))))
      return false;
  }
  if (!pg.operands.back().write || pg.operands.back().read || pg.operands.back().broadcast)
    return false;
  for (std::int8_t d : pg.params)
    if (d != dt) return false;
  for (std::size_t i = 0; i < pg.insts.size(); ++i) {
    const PwInst& in = pg.insts[i];
    if (in.op == PwOp::Load) {  // in its operand's dtype
      if (in.a + 1u >= pg.operands.size() || in.dtype != pg.operands[in.a].dtype) return false;
      continue;
    }
    if (in.dtype != dt) return false;
    switch (in.op) {
      case PwOp::Convert:  // of a Python number's load
        if (in.a >= i || pg.insts[in.a].op != PwOp::Load) return false;
        break;
      case PwOp::Param:
        if (in.a >= pg.params.size()) return false;
        break;
      case PwOp::Const:
        break;
      case PwOp::Add:
      case PwOp::Sub:
      case PwOp::Mul:
      case PwOp::Div:
        if (in.a >= i || in.b >= i) return false;
        break;
      case PwOp::Neg:
      case PwOp::Abs:
      case PwOp::Relu:
      case PwOp::Sign:
        if (in.a >= i) return false;
        break;
      case PwOp::ThresholdBwd:
      case PwOp::AddScaled:  // with an alpha of 1 or -1 (checked each launch): a ± b
      case PwOp::SubScaled:
        if (in.a >= i || in.b >= i || in.c >= i) return false;
        break;
      default:
        return false;
    }
  }
  return true;
}

// Note [Sum prologues].
Result<PointwiseKernel> lower_mse_loss(const exec::ExecutionPlan& p, std::uint32_t c) {
  const exec::Call& call = p.calls[c];
  auto refuse = [&](const std::string& why) { return not_generated(p, c, "an mse_loss", why); };
  if (p.op_names[call.op] != "aten::mse_loss") return refuse("not mse_loss");
  if (call.in_count != 2 || call.out_count != 1)
    return refuse("it has other than two inputs and one output");
  std::optional<std::uint32_t> self, target;
  for (const exec::Arg& a : p.inputs_of(call)) (a.arg_index == 0 ? self : target) = a.tensor;
  if (!self || !target) return refuse("its self or target was not recorded");
  std::optional<std::int64_t> reduction;
  std::uint32_t reduction_at = 0;
  for (std::uint32_t i = call.scalar_begin; i < call.scalar_begin + call.scalar_count; ++i)
    if (p.scalars[i].arg_index == 2 && p.scalars[i].kind == record::ScalarKind::Int) {
      reduction = static_cast<std::int64_t>(p.scalars[i].bits);
      reduction_at = i;
    }
  if (!reduction) return refuse("its reduction was not recorded");
  if (*reduction != 1 && *reduction != 2) return refuse("its reduction is not mean or sum");
  const exec::TensorRef& x = p.tensors[*self];
  const exec::TensorRef& y = p.tensors[*target];
  const std::uint32_t out_t = p.outputs_of(call)[0].tensor;
  if (!is_float(x.dtype) || y.dtype != x.dtype || p.tensors[out_t].dtype != x.dtype)
    return refuse("its self, target and result are not all float32 or all float64");
  const auto xs = p.sizes(x), ys = p.sizes(y);
  if (!std::equal(xs.begin(), xs.end(), ys.begin(), ys.end()))
    return refuse("its target has other sizes than its self (broadcast)");
  std::int64_t numel = 1;
  for (std::int64_t d : xs) numel *= d;
  if (numel < 2) return refuse("it has fewer than two elements");
  if (numel > 32768)
    return refuse(
        "a full reduction of more than 32768 elements, which ATen splits over its threads");
  if (dense_numel(p, *self) != numel || dense_numel(p, *target) != numel)
    return refuse("its self or target is not dense in row-major order");
  if (dense_numel(p, out_t) != 1) return refuse("its result is not one element");
  PointwiseKernel k;
  PointwiseProgram& pg = k.program;
  pg.reduce = ReduceKind::SumInner;
  pg.mean = *reduction == 1;
  const PwOperand rd{x.dtype, false, true, false};
  pg.operands = {rd, rd, PwOperand{x.dtype, false, false, true}};
  k.operand_tensor = {*self, *target, out_t};
  pg.insts = {PwInst{PwOp::Load, x.dtype, 0, 0, 0}, PwInst{PwOp::Load, x.dtype, 1, 0, 0},
              PwInst{PwOp::Sub, x.dtype, 0, 1, 0}, PwInst{PwOp::Mul, x.dtype, 2, 2, 0}};
  pg.reduced = 3;
  k.fixed_from.emplace_back(reduction_at, p.scalars[reduction_at].bits);  // mean or sum, fixed here
  k.reduce_rows = 1;
  k.reduce_cols = numel;
  return k;
}

Result<PointwiseKernel> lower_sum_with_prologue(const exec::ExecutionPlan& p, std::uint32_t kernel,
                                                std::uint32_t begin, std::uint32_t count,
                                                bool fast) {
  const std::uint32_t sum_call = begin + count;
  auto refuse = [&](const std::string& why) {
    return unsupported("calls " + std::to_string(begin) + " to " + std::to_string(sum_call) +
                           " are not a sum with a prologue the CPU backend generates: " + why,
                       "the chain and the sum run as programs of their own");
  };
  if (count == 0 || sum_call >= p.calls.size()) return refuse("no chain before a call");
  auto red = lower_reduction(p, sum_call);
  if (!red.ok()) return red.status();
  const std::uint32_t in_t = red->operand_tensor[0];
  const exec::TensorRef& in = p.tensors[in_t];
  const exec::Slot& slot = p.slots[in.slot];
  // Checked before the chain is lowered: the usual refusal (a training step's chains also feed
  // its backward), and the caller lowers the chain again on its own then.
  if (slot.kind != exec::SlotKind::Arena || slot.last != sum_call ||
      std::ranges::any_of(p.results, [&](std::uint32_t r) { return p.tensors[r].slot == in.slot; }))
    return refuse("the sum's input is read after the sum or is a result");
  auto pw = lower_pointwise_calls(p, kernel, begin, count, fast);
  if (!pw.ok()) return pw.status();
  const auto in_sizes = p.sizes(in);
  if (!std::ranges::equal(in_sizes, pw->shape))
    return refuse("the chain's shape is not the sum's input's");
  // The dense row-major strides of the shape, 0 where a dim is 1 (as iteration strides are).
  std::vector<std::int64_t> dense(pw->shape.size(), 0);
  for (std::int64_t e = 1, d = static_cast<std::int64_t>(dense.size()); d-- > 0;) {
    if (pw->shape[d] != 1) dense[d] = e;
    e *= pw->shape[d];
  }
  PointwiseProgram& pg = pw->program;
  std::optional<std::size_t> store;
  for (std::size_t i = 0; i < pg.insts.size(); ++i) {
    if (pg.insts[i].op != PwOp::Store) continue;
    const std::uint32_t t = pw->operand_tensor[pg.insts[i].b];
    if (store || p.tensors[t].slot != in.slot || p.tensors[t].offset != in.offset ||
        pw->strides[pg.insts[i].b] != dense)
      return refuse("the chain stores a result other than the sum's input");
    store = i;
  }
  if (!store) return refuse("the chain does not make the sum's input");
  const std::uint16_t written = pg.insts[*store].b;
  pg.reduced = pg.insts[*store].a;
  pg.insts[*store] =
      PwInst{PwOp::Const, pg.insts[pg.reduced].dtype, 0, 0, 0};  // dead: never stored
  // The operands: the chain's loads (the sum's input dropped where only written), then the output.
  PointwiseKernel k;
  std::vector<std::uint16_t> renumber(pg.operands.size(), 0);
  for (std::size_t o = 0; o < pg.operands.size(); ++o) {
    PwOperand op = pg.operands[o];
    if (o == written) {
      if (!op.read) continue;
      op.write = false;
    }
    if (!op.broadcast && pw->strides[o] != dense)
      return refuse("an operand of the chain is not dense in the sum's order");
    renumber[o] = static_cast<std::uint16_t>(k.program.operands.size());
    k.program.operands.push_back(op);
    k.operand_tensor.push_back(pw->operand_tensor[o]);
  }
  for (PwInst& i : pg.insts)
    if (i.op == PwOp::Load) i.a = renumber[i.a];
  k.program.operands.push_back(red->program.operands[1]);
  k.operand_tensor.push_back(red->operand_tensor[1]);
  k.program.insts = std::move(pg.insts);
  k.program.params = std::move(pg.params);
  k.program.reduced = pg.reduced;
  k.program.reduce = red->program.reduce;
  k.program.mean = red->program.mean;
  k.param_scalar = std::move(pw->param_scalar);
  k.fixed_scalars = std::move(pw->fixed_scalars);
  k.fixed_from = std::move(pw->fixed_from);
  k.unit_params = std::move(pw->unit_params);
  k.fast = pw->fast;
  k.reduce_rows = red->reduce_rows;
  k.reduce_cols = red->reduce_cols;
  if (pw->always_scaled || !sum_prologue_ok(k.program))
    return refuse(
        "the chain holds an operation a sum's prologue does not take (a conversion of a tensor, "
        "sqrt, "
        "addcmul, lerp)");
  return k;
}

// Note [Generated layer norm].
Result<PointwiseKernel> lower_layer_norm(const exec::ExecutionPlan& p, std::uint32_t c) {
  const exec::Call& call = p.calls[c];
  const std::string& name = p.op_names[call.op];
  auto refuse = [&](const std::string& why) { return not_generated(p, c, "a layer norm", why); };
  if (name != "aten::native_layer_norm") return refuse("not native_layer_norm");
  if (call.out_count != 3) return refuse("it has other than three results");
  std::optional<std::uint32_t> x, w, b;
  for (const exec::Arg& a : p.inputs_of(call)) {
    if (a.arg_index == 0) x = a.tensor;
    else if (a.arg_index == 2) w = a.tensor;
    else if (a.arg_index == 3) b = a.tensor;
    else return refuse("a tensor argument at schema position " + std::to_string(a.arg_index));
  }
  if (!x) return refuse("it has no input tensor");
  if (w.has_value() != b.has_value()) return refuse("one of weight and bias is given, not both");
  const exec::TensorRef& in = p.tensors[*x];
  if (!is_float(in.dtype)) return refuse("its input is not float32 or float64");
  // normalized_shape (schema position 1) and eps (position 4)
  std::int64_t n_dims = -1;
  std::optional<std::uint32_t> eps;
  for (std::uint32_t i = call.scalar_begin; i < call.scalar_begin + call.scalar_count; ++i) {
    const record::ScalarRecord& r = p.scalars[i];
    if (r.arg_index == 1 && r.kind == record::ScalarKind::ListBegin) n_dims = r.aux;
    if (r.arg_index == 4 && r.kind == record::ScalarKind::Double) eps = i;
  }
  if (n_dims < 1 || !eps) return refuse("its normalized shape or eps was not recorded");
  const auto sz = p.sizes(in), st = p.strides(in);
  if (n_dims > static_cast<std::int64_t>(sz.size())) return refuse("its normalized shape has more dims than its input");
  std::int64_t expect = 1, cols = 1, rows = 1;
  for (std::size_t d = sz.size(); d-- > 0;) {
    if (sz[d] == 0) return refuse("it has an empty dim");
    const bool normalized = static_cast<std::int64_t>(sz.size() - d) <= n_dims;
    (normalized ? cols : rows) *= sz[d];
    if (sz[d] == 1) continue;
    if (st[d] != expect) return refuse("its input is not dense in row-major order");
    expect *= sz[d];
  }
  auto dense = [&](std::uint32_t t, std::int64_t numel) {
    return p.tensors[t].dtype == in.dtype && dense_numel(p, t) == numel;
  };
  if (w && (!dense(*w, cols) || !dense(*b, cols))) return refuse("its weight or bias is not a dense tensor of its dtype");
  const auto outs = p.outputs_of(call);
  std::uint32_t y = 0, mean = 0, rstd = 0;
  for (const exec::Arg& a : outs) (a.arg_index == 0 ? y : a.arg_index == 1 ? mean : rstd) = a.tensor;
  if (!dense(y, rows * cols) || !dense(mean, rows) || !dense(rstd, rows))
    return refuse("its results are not dense tensors of its input's dtype");
  PointwiseKernel k;
  k.program.reduce = ReduceKind::LayerNorm;
  k.program.affine = w.has_value();
  const PwOperand rd{in.dtype, false, true, false}, wr{in.dtype, false, false, true};
  k.program.operands = {rd};
  k.operand_tensor = {*x};
  if (w) {
    k.program.operands.insert(k.program.operands.end(), {rd, rd});
    k.operand_tensor.insert(k.operand_tensor.end(), {*w, *b});
  }
  k.program.operands.insert(k.program.operands.end(), {wr, wr, wr});
  k.operand_tensor.insert(k.operand_tensor.end(), {y, mean, rstd});
  k.reduce_rows = rows;
  k.reduce_cols = cols;
  k.eps_scalar = *eps;
  return k;
}

// Note [Generated layer norm backward].
Result<PointwiseKernel> lower_layer_norm_backward(const exec::ExecutionPlan& p, std::uint32_t c) {
  const exec::Call& call = p.calls[c];
  const std::string& name = p.op_names[call.op];
  auto refuse = [&](const std::string& why) {
    return not_generated(p, c, "a layer norm backward", why);
  };
  if (name != "aten::native_layer_norm_backward") return refuse("not native_layer_norm_backward");
  // schema positions: grad_out 0, input 1, normalized_shape 2, mean 3, rstd 4, weight 5, bias 6,
  // output_mask 7
  std::array<std::optional<std::uint32_t>, 7> in{};
  for (const exec::Arg& a : p.inputs_of(call)) {
    if (a.arg_index >= in.size() || a.arg_index == 2)
      return refuse("a tensor argument at schema position " + std::to_string(a.arg_index));
    in[a.arg_index] = a.tensor;
  }
  if (!in[0] || !in[1] || !in[3] || !in[4]) return refuse("a tensor argument was not recorded");
  std::int64_t n_dims = -1;
  for (std::uint32_t i = call.scalar_begin; i < call.scalar_begin + call.scalar_count; ++i) {
    const record::ScalarRecord& r = p.scalars[i];
    if (r.arg_index == 2 && r.kind == record::ScalarKind::ListBegin) n_dims = r.aux;
  }
  if (n_dims < 1) return refuse("its normalized shape was not recorded");
  const exec::TensorRef& xt = p.tensors[*in[1]];
  if (!is_float(xt.dtype)) return refuse("its input is not float32 or float64");
  const auto sz = p.sizes(xt);
  if (n_dims > static_cast<std::int64_t>(sz.size()))
    return refuse("its normalized shape has more dims than its input");
  std::int64_t rows = 1, cols = 1;
  for (std::size_t d = 0; d < sz.size(); ++d)
    (static_cast<std::int64_t>(sz.size() - d) <= n_dims ? cols : rows) *= sz[d];
  // ATen writes zeros to grad_weight and grad_bias when there are no rows
  if (rows == 0 || cols == 0) return refuse("it has an empty dim");
  auto dense = [&](std::uint32_t t, std::int64_t count) {
    return p.tensors[t].dtype == xt.dtype && dense_numel(p, t) == count;
  };
  if (!dense(*in[0], rows * cols) || !dense(*in[1], rows * cols) || !dense(*in[3], rows) ||
      !dense(*in[4], rows))
    return refuse("its grad_out, input, mean or rstd is not a dense tensor of its input's dtype");
  if (in[5] && !dense(*in[5], cols)) return refuse("its weight is not a dense tensor of its dtype");
  std::array<std::optional<std::uint32_t>, 3> out{};
  for (const exec::Arg& a : p.outputs_of(call))
    if (a.arg_index < out.size()) out[a.arg_index] = a.tensor;
  if ((out[1] && !in[5]) || (out[2] && !in[6]))
    return refuse("it has a grad_weight without a weight or a grad_bias without a bias");
  PointwiseKernel k;
  k.program.reduce = ReduceKind::LayerNormBwd;
  k.program.affine = in[5].has_value();
  const PwOperand rd{xt.dtype, false, true, false}, wr{xt.dtype, false, false, true};
  k.program.operands = {rd, rd, rd, rd};
  k.operand_tensor = {*in[0], *in[1], *in[3], *in[4]};
  if (in[5]) {
    k.program.operands.push_back(rd);
    k.operand_tensor.push_back(*in[5]);
  }
  for (std::size_t i = 0; i < out.size(); ++i) {
    if (!out[i]) continue;
    if (!dense(*out[i], i == 0 ? rows * cols : cols))
      return refuse("its results are not dense tensors of its input's dtype");
    k.program.outputs = static_cast<std::uint8_t>(k.program.outputs | (1u << i));
    k.program.operands.push_back(wr);
    k.operand_tensor.push_back(*out[i]);
  }
  if (k.program.outputs == 0) return refuse("none of its results is used");
  k.reduce_rows = rows;
  k.reduce_cols = cols;
  return k;
}

bool is_softmax_op(std::string_view op) {
  return op == "aten::_softmax" || op == "aten::_log_softmax" || op == "aten::_safe_softmax" ||
         op == "aten::_softmax_backward_data" || op == "aten::_log_softmax_backward_data";
}

// Note [Generated softmax].
Result<PointwiseKernel> lower_softmax(const exec::ExecutionPlan& p, std::uint32_t c, unsigned vec_bytes,
                                      std::string_view math, std::string_view no_math) {
  const exec::Call& call = p.calls[c];
  const std::string& name = p.op_names[call.op];
  auto refuse = [&](const std::string& why) { return not_generated(p, c, "a softmax", why); };
  if (!is_softmax_op(name)) return refuse("not _softmax, _log_softmax, _safe_softmax or their backward");
  if (math.empty() || (vec_bytes != 32 && vec_bytes != 64))
    return refuse("no exp and log of ATen's were given (Note [Vector math])" +
                  (no_math.empty() ? std::string() : ": " + std::string(no_math)));
  const bool backward = name.ends_with("_backward_data");
  if (call.in_count != (backward ? 2u : 1u) || call.out_count != 1)
    return refuse(backward ? "it has other than two inputs and one output" : "it has other than one input and one output");
  std::vector<std::uint32_t> ins(call.in_count);
  for (const exec::Arg& a : p.inputs_of(call)) {
    if (a.arg_index >= call.in_count) return refuse("a tensor argument at schema position " + std::to_string(a.arg_index));
    ins[a.arg_index] = a.tensor;
  }
  const std::uint32_t in_t = ins[0], out_t = p.outputs_of(call)[0].tensor;
  const exec::TensorRef& in = p.tensors[in_t];
  if (!is_float(in.dtype) || p.tensors[out_t].dtype != in.dtype || (backward && p.tensors[ins[1]].dtype != in.dtype))
    return refuse("its tensors are not all float32 or all float64");
  const auto sz = p.sizes(in);
  if (backward && !std::ranges::equal(p.sizes(p.tensors[ins[1]]), sz)) return refuse("its grad and output differ in shape");
  const auto nd = static_cast<std::int64_t>(sz.size());
  std::optional<std::int64_t> dim;
  bool other = false;  // half_to_float true, a dtype given, or (backward) an input dtype of another type
  const std::uint32_t dim_arg = backward ? 2 : 1;
  for (std::uint32_t i = call.scalar_begin; i < call.scalar_begin + call.scalar_count; ++i) {
    const record::ScalarRecord& r = p.scalars[i];
    if (r.arg_index == dim_arg && r.kind == record::ScalarKind::Int) dim = static_cast<std::int64_t>(r.bits);
    if (!backward && r.arg_index == 2 && r.kind != record::ScalarKind::None &&
        !(r.kind == record::ScalarKind::Bool && r.bits == 0))
      other = true;
    if (backward && r.arg_index == 3 &&
        !(r.kind == record::ScalarKind::Int && static_cast<std::int64_t>(r.bits) == in.dtype))
      other = true;
  }
  if (!dim) return refuse("its dim was not recorded");
  if (other)
    return refuse(backward ? "its input dtype is not its grad's" : name == "aten::_safe_softmax" ? "a dtype was given"
                                                                                               : "half_to_float is set");
  const std::int64_t d = *dim < 0 ? *dim + std::max<std::int64_t>(nd, 1) : *dim;
  if (d != std::max<std::int64_t>(nd, 1) - 1) return refuse("its dim is not the last");
  const std::int64_t cols = nd == 0 ? 1 : sz[static_cast<std::size_t>(nd - 1)];
  std::int64_t numel = 1;
  for (std::int64_t s : sz) numel *= s;
  if (numel == 0) return refuse("it has an empty dim");
  if (dense_numel(p, in_t) != numel || dense_numel(p, out_t) != numel || (backward && dense_numel(p, ins[1]) != numel))
    return refuse("its inputs or result are not dense in row-major order");
  PointwiseKernel k;
  k.program.reduce = name == "aten::_log_softmax"                 ? ReduceKind::LogSoftmax
                     : name == "aten::_softmax_backward_data"     ? ReduceKind::SoftmaxBwd
                     : name == "aten::_log_softmax_backward_data" ? ReduceKind::LogSoftmaxBwd
                                                                  : ReduceKind::Softmax;
  k.program.safe = name == "aten::_safe_softmax";
  k.program.vec_bytes = static_cast<std::uint8_t>(vec_bytes);
  k.program.math = std::string(math);
  const PwOperand rd{in.dtype, false, true, false}, wr{in.dtype, false, false, true};
  k.program.operands = backward ? std::vector<PwOperand>{rd, rd, wr} : std::vector<PwOperand>{rd, wr};
  k.operand_tensor = backward ? std::vector<std::uint32_t>{in_t, ins[1], out_t} : std::vector<std::uint32_t>{in_t, out_t};
  k.reduce_rows = numel / cols;
  k.reduce_cols = cols;
  return k;
}

// Note [Generated nll_loss].
Result<PointwiseKernel> lower_nll_loss(const exec::ExecutionPlan& p, std::uint32_t c) {
  const exec::Call& call = p.calls[c];
  const std::string& name = p.op_names[call.op];
  auto refuse = [&](const std::string& why) { return not_generated(p, c, "an nll_loss", why); };
  const bool backward = name == "aten::nll_loss_backward";
  if (!backward && name != "aten::nll_loss_forward") return refuse("not nll_loss_forward or nll_loss_backward");
  // schema positions: forward self 0, target 1, weight 2, reduction 3, ignore_index 4;
  // backward grad_output 0, self 1, target 2, weight 3, reduction 4, ignore_index 5, total_weight 6
  const std::uint32_t self_arg = backward ? 1 : 0, target_arg = backward ? 2 : 1, weight_arg = backward ? 3 : 2;
  std::optional<std::uint32_t> self, target, go, tw;
  for (const exec::Arg& a : p.inputs_of(call)) {
    if (a.arg_index == weight_arg) return refuse("a class weight is given");
    if (a.arg_index == self_arg) self = a.tensor;
    else if (a.arg_index == target_arg) target = a.tensor;
    else if (backward && a.arg_index == 0) go = a.tensor;
    else if (backward && a.arg_index == 6) tw = a.tensor;
    else return refuse("a tensor argument at schema position " + std::to_string(a.arg_index));
  }
  if (!self || !target || (backward && (!go || !tw))) return refuse("a tensor argument was not recorded");
  const exec::TensorRef& in = p.tensors[*self];
  if (!is_float(in.dtype)) return refuse("its input is not float32 or float64");
  const auto sz = p.sizes(in);
  if (sz.size() != 2) return refuse("its input is not 2-d (N, C)");
  const std::int64_t n = sz[0], cls = sz[1];
  if (n == 0 || cls == 0) return refuse("it has an empty dim");
  if (p.tensors[*target].dtype != dtype::kInt64 || dense_numel(p, *target) != n || p.sizes(p.tensors[*target]).size() != 1)
    return refuse("its target is not a dense int64 tensor of N elements");
  std::optional<std::int64_t> reduction;
  std::optional<std::uint32_t> ignore;
  for (std::uint32_t i = call.scalar_begin; i < call.scalar_begin + call.scalar_count; ++i) {
    const record::ScalarRecord& r = p.scalars[i];
    if (r.kind != record::ScalarKind::Int) continue;
    if (r.arg_index == (backward ? 4u : 3u)) reduction = static_cast<std::int64_t>(r.bits);
    if (r.arg_index == (backward ? 5u : 4u)) ignore = i;
  }
  if (!reduction || !ignore) return refuse("its reduction or ignore_index was not recorded");
  if (*reduction != 1 && *reduction != 2) return refuse("its reduction is not mean or sum");
  auto scalar_of = [&](std::uint32_t t) { return p.tensors[t].dtype == in.dtype && dense_numel(p, t) == 1; };
  const auto outs = p.outputs_of(call);
  PointwiseKernel k;
  k.program.reduce = backward ? ReduceKind::NllLossBwd : ReduceKind::NllLoss;
  k.program.mean = *reduction == 1;
  const PwOperand rd{in.dtype, false, true, false}, wr{in.dtype, false, false, true};
  const PwOperand tg{dtype::kInt64, false, true, false};
  if (backward) {
    if (outs.size() != 1 || !scalar_of(*go) || !scalar_of(*tw) || dense_numel(p, outs[0].tensor) != n * cls ||
        p.tensors[outs[0].tensor].dtype != in.dtype)
      return refuse("its grad_output, total_weight or result is not of the dense shape and dtype ATen gives");
    k.program.operands = {rd, tg, rd, wr};
    k.operand_tensor = {*go, *target, *tw, outs[0].tensor};
  } else {
    if (dense_numel(p, *self) != n * cls) return refuse("its input is not dense in row-major order");
    std::optional<std::uint32_t> out, total;
    for (const exec::Arg& a : outs) (a.arg_index == 0 ? out : total) = a.tensor;
    if (outs.size() != 2 || !out || !total || !scalar_of(*out) || !scalar_of(*total))
      return refuse("its results are not two one-element tensors of its dtype");
    k.program.operands = {rd, tg, wr, wr};
    k.operand_tensor = {*self, *target, *out, *total};
  }
  k.reduce_rows = n;
  k.reduce_cols = cls;
  k.param_scalar = {*ignore};
  return k;
}

bool is_batch_norm_op(std::string_view op) {
  return op == "aten::native_batch_norm" || op == "aten::native_batch_norm_backward";
}

// Note [Generated batch norm].
Result<PointwiseKernel> lower_batch_norm(const exec::ExecutionPlan& p, std::uint32_t c) {
  const exec::Call& call = p.calls[c];
  const std::string& name = p.op_names[call.op];
  auto refuse = [&](const std::string& why) { return not_generated(p, c, "a batch norm", why); };
  if (!is_batch_norm_op(name)) return refuse("not native_batch_norm or native_batch_norm_backward");
  const bool backward = name == "aten::native_batch_norm_backward";
  // schema positions: forward input 0, weight 1, bias 2, running_mean 3, running_var 4,
  // training 5, momentum 6, eps 7; backward grad_out 0, input 1, weight 2, running_mean 3,
  // running_var 4, save_mean 5, save_invstd 6, train 7, eps 8, output_mask 9
  std::array<std::optional<std::uint32_t>, 7> in{};
  for (const exec::Arg& a : p.inputs_of(call)) {
    if (a.arg_index >= in.size())
      return refuse("a tensor argument at schema position " + std::to_string(a.arg_index));
    in[a.arg_index] = a.tensor;
  }
  const std::uint32_t x_arg = backward ? 1 : 0, w_arg = backward ? 2 : 1;
  if (!in[x_arg] || (backward && (!in[0] || !in[5] || !in[6])))
    return refuse("a tensor argument was not recorded");
  bool train = false;
  std::optional<std::uint32_t> momentum, eps;
  for (std::uint32_t i = call.scalar_begin; i < call.scalar_begin + call.scalar_count; ++i) {
    const record::ScalarRecord& r = p.scalars[i];
    if (r.arg_index == (backward ? 7u : 5u) && r.kind == record::ScalarKind::Bool)
      train = r.bits != 0;
    if (!backward && r.arg_index == 6 && r.kind == record::ScalarKind::Double) momentum = i;
    if (!backward && r.arg_index == 7 && r.kind == record::ScalarKind::Double) eps = i;
  }
  if (!train) return refuse("it is not in training mode");
  if (!backward && (!momentum || !eps)) return refuse("its momentum or eps was not recorded");
  const std::uint32_t x = *in[x_arg];
  const exec::TensorRef& xt = p.tensors[x];
  if (!is_float(xt.dtype)) return refuse("its input is not float32 or float64");
  const auto sz = p.sizes(xt);
  if (sz.size() < 2) return refuse("its input has fewer than two dims");
  std::int64_t numel = 1;
  for (std::int64_t s : sz) numel *= s;
  if (numel == 0) return refuse("it has an empty dim");
  const std::int64_t n = sz[0], ch = sz[1], plane = numel / (n * ch);
  if (plane == 1)
    return refuse(
        "its input has one element per channel and image, whose statistics ATen gathers in "
        "per-thread buffers (the bits depend on the thread count)");
  auto dense = [&](std::uint32_t t, std::int64_t count) {
    return p.tensors[t].dtype == xt.dtype && dense_numel(p, t) == count;
  };
  if (!dense(x, numel) || (backward && !dense(*in[0], numel)))
    return refuse("its input or grad_out is not dense in row-major order");
  // ATen's backward picks its kernel from the memory format its input and grad_out suggest, and
  // a dense tensor whose dim of size 1 has another stride, (N, 1, H, W)@(HW, 1, W, 1), suggests
  // channels-last. Row-major strides on every dim, size-1 ones included, suggest the contiguous
  // format; anything else is refused rather than reasoned about.
  auto row_major = [&](std::uint32_t t) {
    const auto tsz = p.sizes(p.tensors[t]), tst = p.strides(p.tensors[t]);
    std::int64_t expect = 1;
    for (std::size_t d = tsz.size(); d-- > 0;) {
      if (tst[d] != expect) return false;
      expect *= tsz[d];
    }
    return true;
  };
  if (backward && (!row_major(x) || !row_major(*in[0])))
    return refuse(
        "its input or grad_out has strides other than row-major on a dim of size 1, "
        "which can make ATen choose another kernel");
  const bool affine = in[w_arg].has_value();
  if (!backward && affine != in[2].has_value())
    return refuse("one of weight and bias is given, not both");
  if (affine && (!dense(*in[w_arg], ch) || (!backward && !dense(*in[2], ch))))
    return refuse("its weight or bias is not a dense tensor of its dtype");
  const PwOperand rd{xt.dtype, false, true, false}, wr{xt.dtype, false, false, true};
  const PwOperand rw{xt.dtype, false, true, true};
  PointwiseKernel k;
  k.program.affine = affine;
  k.reduce_rows = ch;
  k.reduce_cols = plane;
  k.images = n;
  const auto outs = p.outputs_of(call);
  std::array<std::optional<std::uint32_t>, 3> out{};
  for (const exec::Arg& a : outs)
    if (a.arg_index < out.size()) out[a.arg_index] = a.tensor;
  if (!backward) {
    const bool running = in[3].has_value();
    if (running != in[4].has_value())
      return refuse("one of running_mean and running_var is given, not both");
    if (running && (!dense(*in[3], ch) || !dense(*in[4], ch)))
      return refuse("its running statistics are not dense tensors of its dtype");
    if (!out[0] || !out[1] || !out[2] || !dense(*out[0], numel) || !dense(*out[1], ch) ||
        !dense(*out[2], ch))
      return refuse("its results are not dense tensors of its input's dtype");
    k.program.reduce = ReduceKind::BatchNorm;
    k.program.running = running;
    k.program.operands = {rd};
    k.operand_tensor = {x};
    if (affine) {
      k.program.operands.insert(k.program.operands.end(), {rd, rd});
      k.operand_tensor.insert(k.operand_tensor.end(), {*in[1], *in[2]});
    }
    if (running) {
      k.program.operands.insert(k.program.operands.end(), {rw, rw});
      k.operand_tensor.insert(k.operand_tensor.end(), {*in[3], *in[4]});
    }
    k.program.operands.insert(k.program.operands.end(), {wr, wr, wr});
    k.operand_tensor.insert(k.operand_tensor.end(), {*out[0], *out[1], *out[2]});
    k.param_scalar = {*eps, *momentum};
    return k;
  }
  if (!dense(*in[5], ch) || !dense(*in[6], ch))
    return refuse("its save_mean or save_invstd is not a dense tensor of its dtype");
  k.program.reduce = ReduceKind::BatchNormBwd;
  k.program.operands = {rd, rd};
  k.operand_tensor = {*in[0], x};
  if (affine) {
    k.program.operands.push_back(rd);
    k.operand_tensor.push_back(*in[w_arg]);
  }
  k.program.operands.insert(k.program.operands.end(), {rd, rd});
  k.operand_tensor.insert(k.operand_tensor.end(), {*in[5], *in[6]});
  for (std::size_t i = 0; i < out.size(); ++i) {
    if (!out[i]) continue;
    if (!dense(*out[i], i == 0 ? numel : ch))
      return refuse("its results are not dense tensors of its input's dtype");
    k.program.outputs = static_cast<std::uint8_t>(k.program.outputs | (1u << i));
    k.program.operands.push_back(wr);
    k.operand_tensor.push_back(*out[i]);
  }
  if (k.program.outputs == 0) return refuse("none of its results is used");
  return k;
}

namespace {
// A call of one input and `results` results, its input float32 or float64: nullptr and `x` its
// input tensor, or why not.
const char* one_float_input(const exec::ExecutionPlan& p, const exec::Call& call,
                            std::uint32_t results, std::uint32_t& x) {
  if (call.in_count != 1 || call.out_count != results) return "it has other results than ATen's";
  x = p.inputs_of(call)[0].tensor;
  if (!is_float(p.tensors[x].dtype)) return "its input is not float32 or float64";
  return nullptr;
}
}  // namespace

bool is_arg_extreme_op(std::string_view op) {
  return op == "aten::max.dim" || op == "aten::min.dim" || op == "aten::argmax" ||
         op == "aten::argmin";
}

// Note [Generated max and argmax].
Result<PointwiseKernel> lower_arg_extreme(const exec::ExecutionPlan& p, std::uint32_t c) {
  const exec::Call& call = p.calls[c];
  const std::string& name = p.op_names[call.op];
  auto refuse = [&](const std::string& why) { return not_generated(p, c, "a max or argmax", why); };
  if (!is_arg_extreme_op(name)) return refuse("not max.dim, min.dim, argmax or argmin");
  const bool arg = name == "aten::argmax" || name == "aten::argmin";
  std::uint32_t x = 0;
  if (const char* why = one_float_input(p, call, arg ? 1u : 2u, x)) return refuse(why);
  const exec::TensorRef& xt = p.tensors[x];
  const auto sz = p.sizes(xt);
  const auto nd = static_cast<std::int64_t>(sz.size());
  std::optional<std::int64_t> dim;
  bool whole = false;  // argmax(dim=None)
  for (std::uint32_t i = call.scalar_begin; i < call.scalar_begin + call.scalar_count; ++i) {
    const record::ScalarRecord& r = p.scalars[i];
    if (r.arg_index != 1) continue;
    if (r.kind == record::ScalarKind::Int) dim = static_cast<std::int64_t>(r.bits);
    if (arg && r.kind == record::ScalarKind::None) whole = true;
  }
  if (!dim && !whole) return refuse("its dim was not recorded");
  std::int64_t numel = 1;
  for (std::int64_t s : sz) numel *= s;
  if (numel == 0) return refuse("it has an empty dim");
  if (dense_numel(p, x) != numel) return refuse("its input is not dense in row-major order");
  std::int64_t outer = 1, cols = numel, inner = 1;
  if (!whole && nd > 0) {
    const std::int64_t d = *dim < 0 ? *dim + nd : *dim;
    if (d < 0 || d >= nd) return refuse("its dim is out of range");
    cols = sz[static_cast<std::size_t>(d)];
    for (std::int64_t k = 0; k < d; ++k) outer *= sz[static_cast<std::size_t>(k)];
    for (std::int64_t k = d + 1; k < nd; ++k) inner *= sz[static_cast<std::size_t>(k)];
  }
  std::optional<std::uint32_t> values, indices;
  for (const exec::Arg& a : p.outputs_of(call))
    (arg || a.arg_index == 1 ? indices : values) = a.tensor;
  const bool ok = indices && p.tensors[*indices].dtype == dtype::kInt64 &&
                  dense_numel(p, *indices) == outer * inner &&
                  (arg || (values && p.tensors[*values].dtype == xt.dtype &&
                           dense_numel(p, *values) == outer * inner));
  if (!ok) return refuse("its results are not dense tensors of ATen's dtypes");
  PointwiseKernel k;
  k.program.reduce = ReduceKind::ArgExtreme;
  k.program.smallest = name == "aten::min.dim" || name == "aten::argmin";
  k.program.operands = {PwOperand{xt.dtype, false, true, false}};
  k.operand_tensor = {x};
  if (values) {
    k.program.operands.push_back(PwOperand{xt.dtype, false, false, true});
    k.operand_tensor.push_back(*values);
  }
  k.program.operands.push_back(PwOperand{dtype::kInt64, false, false, true});
  k.operand_tensor.push_back(*indices);
  k.reduce_rows = outer;
  k.reduce_cols = cols;
  k.reduce_inner = inner;
  return k;
}

bool is_extreme_values_op(std::string_view op) { return op == "aten::amax" || op == "aten::amin"; }

// Note [Generated amax and amin]. Schema: self 0, dim 1 (int[1], [] for every dim), keepdim 2.
Result<PointwiseKernel> lower_extreme_values(const exec::ExecutionPlan& p, std::uint32_t c) {
  const exec::Call& call = p.calls[c];
  const std::string& name = p.op_names[call.op];
  auto refuse = [&](const std::string& why) { return not_generated(p, c, "an amax or amin", why); };
  if (!is_extreme_values_op(name)) return refuse("not amax or amin");
  std::uint32_t x = 0;
  if (const char* why = one_float_input(p, call, 1u, x)) return refuse(why);
  const exec::TensorRef& in = p.tensors[x];
  const std::uint32_t out_t = p.outputs_of(call)[0].tensor;
  if (p.tensors[out_t].dtype != in.dtype)
    return refuse("its result has another dtype than its input");
  const auto nd = static_cast<std::int64_t>(p.sizes(in).size());
  std::vector<bool> reduced(static_cast<std::size_t>(nd), true);
  std::int64_t listed = -1;
  if (const char* why = read_dim_list(p, call, 1, nd, reduced, listed)) return refuse(why);
  if (listed < 0 && nd > 0) return refuse("its dim argument was not recorded");
  ReducedBlock
      blk;  // no dim of size above 1 reduced: ATen's loop gives a NaN other bits than a copy
  if (const char* why = reduced_block(p, in, reduced, blk)) return refuse(why);
  if (blk.kept_n == 1 && blk.reduced_n > 32768)
    return refuse(
        "one result of more than 32768 elements, which ATen reduces over its threads in parts");
  if (dense_numel(p, out_t) != blk.kept_n)
    return refuse("its result is not dense, or not of its kept dims' size");
  PointwiseKernel k;
  k.program.reduce = blk.inner ? ReduceKind::ExtremeInner : ReduceKind::ExtremeOuter;
  k.program.smallest = name == "aten::amin";
  k.program.operands = {PwOperand{in.dtype, false, true, false},
                        PwOperand{in.dtype, false, false, true}};
  k.operand_tensor = {x, out_t};
  k.reduce_rows = blk.inner ? blk.kept_n : blk.reduced_n;
  k.reduce_cols = blk.inner ? blk.reduced_n : blk.kept_n;
  return k;
}

bool is_variance_op(std::string_view op) {
  return op == "aten::var.correction" || op == "aten::std.correction" ||
         op == "aten::var_mean.correction" || op == "aten::std_mean.correction";
}

// Note [Generated var and std]. Schema: self 0, dim 1 (int[1]?), correction 2 (Scalar?),
// keepdim 3; results var or std 0, [mean 1].
Result<PointwiseKernel> lower_variance(const exec::ExecutionPlan& p, std::uint32_t c) {
  const exec::Call& call = p.calls[c];
  const std::string& name = p.op_names[call.op];
  auto refuse = [&](const std::string& why) { return not_generated(p, c, "a var or std", why); };
  if (!is_variance_op(name)) return refuse("not var, std, var_mean or std_mean");
  const bool with_mean = name.find("_mean") != std::string::npos;
  std::uint32_t x = 0;
  if (const char* why = one_float_input(p, call, with_mean ? 2u : 1u, x)) return refuse(why);
  const exec::TensorRef& xt = p.tensors[x];
  const auto sz = p.sizes(xt);
  const auto nd = static_cast<std::int64_t>(sz.size());
  std::vector<bool> reduced(sz.size(), true);  // dim=None: every dim
  bool dim_seen = false, correction_seen = false;
  std::optional<std::uint32_t> correction;  // the plan scalar; none: 1
  for (std::uint32_t i = call.scalar_begin; i < call.scalar_begin + call.scalar_count; ++i) {
    const record::ScalarRecord& r = p.scalars[i];
    if (r.arg_index == 2) {
      correction_seen = true;
      if (r.kind == record::ScalarKind::Int || r.kind == record::ScalarKind::Double ||
          r.kind == record::ScalarKind::Bool)  // ATen's toDouble(): True is 1
        correction = i;
      else if (r.kind != record::ScalarKind::None)
        return refuse("its correction is neither an int nor a float");
      continue;
    }
    if (r.arg_index != 1) continue;
    dim_seen = true;
    if (r.kind == record::ScalarKind::None) continue;
    if (r.kind != record::ScalarKind::ListBegin) return refuse("its dim is not a list");
    if (i + r.aux >= call.scalar_begin + call.scalar_count)
      return refuse("its dim list is cut short");
    if (r.aux > 0) std::fill(reduced.begin(), reduced.end(), false);  // [] reduces every dim
    for (std::uint32_t e = 1; e <= r.aux; ++e) {
      const record::ScalarRecord& d = p.scalars[i + e];
      if (d.kind != record::ScalarKind::Int) return refuse("its dim list holds a non-integer");
      std::int64_t dim = static_cast<std::int64_t>(d.bits);
      if (nd == 0 && (dim == 0 || dim == -1)) continue;  // a 0-d input: dim 0 is itself
      if (dim < 0) dim += nd;
      if (dim < 0 || dim >= nd) return refuse("a dim is out of range");
      reduced[static_cast<std::size_t>(dim)] = true;
    }
    i += r.aux;
  }
  if (!dim_seen || !correction_seen) return refuse("its dim or correction was not recorded");
  // Dims of size > 1: dense in row-major order, the reduced ones one block.
  std::int64_t expect = 1, numel = 1, outer = 1, cols = 1, inner = 1;
  std::string pattern;  // outermost first: 'r' reduced, 'k' kept
  for (std::int64_t d = nd; d-- > 0;) {
    const auto i = static_cast<std::size_t>(d);
    if (sz[i] == 0) return refuse("it has an empty dim");
    numel *= sz[i];
    if (sz[i] == 1) continue;
    if (p.strides(xt)[i] != expect) return refuse("its input is not dense in row-major order");
    expect *= sz[i];
    pattern.insert(pattern.begin(), reduced[i] ? 'r' : 'k');
    if (reduced[i])
      cols *= sz[i];
    else if (pattern.find('r') == std::string::npos)
      inner *= sz[i];
    else
      outer *= sz[i];
  }
  const auto first_r = pattern.find('r');
  if (first_r != std::string::npos && pattern.find('k', first_r) != std::string::npos &&
      pattern.find('r', pattern.find('k', first_r)) != std::string::npos)
    return refuse("its reduced dims are not one block of adjacent dims");
  if (outer * inner == 1 && numel > 32768)
    return refuse(with_mean ? "one result over more than 32768 elements, whose Welford states "
                              "ATen splits over its threads"
                            : "one result over more than 32768 elements, whose squares about "
                              "the mean ATen adds in parts over its threads");
  std::vector<std::uint32_t> results(call.out_count);
  for (const exec::Arg& a : p.outputs_of(call)) {
    if (a.arg_index >= results.size()) return refuse("it has other results than ATen's");
    results[a.arg_index] = a.tensor;
  }
  for (std::uint32_t t : results)
    if (p.tensors[t].dtype != xt.dtype || dense_numel(p, t) != outer * inner)
      return refuse("its results are not dense tensors of its input's dtype");
  PointwiseKernel k;
  k.program.reduce = ReduceKind::Variance;
  k.program.root = name.starts_with("aten::std");
  k.program.two_pass = !with_mean && outer * inner == 1;  // ATen's all-reduce path
  k.program.operands = {PwOperand{xt.dtype, false, true, false}};
  k.operand_tensor = {x};
  for (std::uint32_t t : results) {
    k.program.operands.push_back(PwOperand{xt.dtype, false, false, true});
    k.operand_tensor.push_back(t);
  }
  if (correction) {
    k.param_scalar = {*correction};
    k.program.int_param = p.scalars[*correction].kind != record::ScalarKind::Double;
  } else {
    k.fixed_param = std::bit_cast<std::uint64_t>(1.0);
  }
  k.reduce_rows = outer;
  k.reduce_cols = cols;
  k.reduce_inner = inner;
  return k;
}

bool covers_op(std::string_view op, bool fast) { return find_op(op, fast) != nullptr; }

bool is_mse_loss_sum(const exec::ExecutionPlan& p, std::uint32_t c) {
  const exec::Call& call = p.calls[c];
  if (p.op_names[call.op] != "aten::mse_loss") return false;
  for (std::uint32_t i = call.scalar_begin; i < call.scalar_begin + call.scalar_count; ++i)
    if (p.scalars[i].arg_index == 2 && p.scalars[i].kind == record::ScalarKind::Int)
      return p.scalars[i].bits != 0;
  return true;  // no reduction recorded: its default, mean
}

std::vector<std::string> covered_pointwise_ops(bool fast) {
  std::vector<std::string> r;
  for (const OpRow& o : kOps)
    if (fast || !o.fast) r.emplace_back(o.name);
  return r;
}

}  // namespace crucible::mimic
