// conformance_rows.h — the conformance table of elementwise chains (conformance_test against
// the plain-loop reference, aten_conformance_test against ATen): fixed rows for odd sizes (1, 3,
// 17, 1000003), empty and 0-d tensors, broadcasting, non-contiguous and offset inputs, strided
// outputs with gaps, Python numbers, scalar overloads, mixed float32/float64, in-place updates,
// split kernels and a kernel that stays a library call; one row per covered op; random chains;
// and the patched value of a scalar.
#pragma once

#include <random>
#include <string>
#include <vector>

#include "chain_plan.h"
#include "crucible/exec/Runner.h"
#include "crucible/mimic/CpuBackend.h"

namespace crucible::mimic::test {

inline TensorSpec f32(std::vector<std::int64_t> s, std::vector<std::int64_t> st = {},
               std::int64_t off = 0) {
  return TensorSpec{kF32, std::move(s), std::move(st), off, false, 0};
}
inline TensorSpec f64(std::vector<std::int64_t> s, std::vector<std::int64_t> st = {},
               std::int64_t off = 0) {
  return TensorSpec{kF64, std::move(s), std::move(st), off, false, 0};
}
inline TensorSpec number(double x) { return TensorSpec{kF64, {}, {}, 0, true, x}; }
inline TensorSpec int_number(std::int64_t x) {  // a Python int
  return TensorSpec{dtype::kInt64, {}, {}, 0, true, static_cast<double>(x)};
}
inline StepSpec step(std::string op, std::vector<int> in, std::vector<record::ScalarRecord> sc = {},
              std::int8_t out = kF32) {
  StepSpec s;
  s.op = std::move(op);
  s.in = std::move(in);
  s.scalars = std::move(sc);
  s.out_dtype = out;
  return s;
}
inline constexpr int prev(int s) { return -(s + 1); }  // the output of step s

// mul(a, b) -> add(., c, alpha) -> relu -> neg over `shape`, in dtype dt.
inline ChainSpec mul_add_relu_neg(std::string name, std::vector<std::int64_t> shape, std::int8_t dt) {
  TensorSpec t{dt, shape, {}, 0, false, 0};
  return ChainSpec{std::move(name),
                   shape,
                   {t, t, t},
                   {step("aten::mul.Tensor", {0, 1}, {}, dt),
                    step("aten::add.Tensor", {prev(0), 2}, {scalar_int(2, -1)}, dt),
                    step("aten::relu", {prev(1)}, {}, dt), step("aten::neg", {prev(2)}, {}, dt)}};
}

// AdamW's update of one parameter as torch.optim records it: step.item() (a host read) between
// the moments and the step through sqrt.
inline ChainSpec adamw_with_step_item(std::int64_t n) {
  const TensorSpec t = f32({n});
  return ChainSpec{"adamw_step_item_" + std::to_string(n),
                   {n},
                   {t, t, t, t, f32({})},  // param, grad, exp_avg, exp_avg_sq, step
                   {step("aten::mul_.Scalar", {0}, {scalar_double(1, 0.999)}),
                    step("aten::lerp_.Scalar", {2, 1}, {scalar_double(2, 0.1)}),
                    step("aten::mul_.Scalar", {3}, {scalar_double(1, 0.999)}),
                    step("aten::addcmul_", {prev(2), 1, 1}, {scalar_double(3, 0.001)}),
                    step("aten::_local_scalar_dense", {4}),
                    step("aten::sqrt", {prev(3)}),
                    step("aten::div.Scalar", {prev(5)}, {scalar_double(1, 0.031)}),
                    step("aten::add_.Scalar", {prev(6)}, {scalar_double(1, 1e-8), scalar_int(2, 1)}),
                    step("aten::addcdiv_", {prev(0), prev(1), prev(7)}, {scalar_double(3, -0.01)})}};
}

// `k` parameters' updates in one kernel, as an optimizer's group: each as torch.optim.AdamW's
// single-tensor loop, its 0-d step incremented first, then adamw_with_step_item's calls. With
// `chained`, each odd parameter's gradient is the previous parameter's sqrt (a library call's
// result), so its moments wait for that call.
inline ChainSpec adamw_params(int k, std::int64_t n, bool chained) {
  const ChainSpec one = adamw_with_step_item(n);
  ChainSpec c{
      "adamw_" + std::to_string(k) + "_params_" + std::to_string(n) + (chained ? "_chained" : ""),
      {n},
      {},
      {}};
  constexpr int kGrad = 1, kStep = 4, kSqrt = 5;  // adamw_with_step_item's inputs and sqrt step
  int last_sqrt = -1;
  for (int p = 0; p < k; ++p) {
    const int in0 = static_cast<int>(c.inputs.size());
    c.inputs.insert(c.inputs.end(), one.inputs.begin(), one.inputs.end());
    c.steps.push_back(
        step("aten::add_.Scalar", {in0 + kStep}, {scalar_int(1, 1), scalar_int(2, 1)}));
    const int s0 = static_cast<int>(c.steps.size());
    for (StepSpec st : one.steps) {
      for (int& x : st.in) {
        if (x < 0)
          x = prev(-(x + 1) + s0);
        else if (chained && p % 2 == 1 && x == kGrad)
          x = prev(last_sqrt);
        else
          x += in0;
      }
      c.steps.push_back(std::move(st));
    }
    last_sqrt = s0 + kSqrt;
  }
  return c;
}

inline std::vector<ChainSpec> fixed_rows() {
  std::vector<ChainSpec> r;
  r.push_back({"add_17",
               {17},
               {f32({17}), f32({17})},
               {step("aten::add.Tensor", {0, 1}, {scalar_int(2, 1)})}});
  for (std::int64_t n : {1, 3, 17, 1000003})
    r.push_back(mul_add_relu_neg("chain_f32_" + std::to_string(n), {n}, kF32));
  r.push_back(mul_add_relu_neg("chain_f64_1000003", {1000003}, kF64));
  {
    ChainSpec c = mul_add_relu_neg("chain_split_3x17", {3, 17}, kF32);
    c.split = true;
    r.push_back(c);
  }
  {
    ChainSpec c = mul_add_relu_neg("chain_escaping_3x17", {3, 17}, kF32);
    c.steps[0].escape = c.steps[2].escape = true;
    r.push_back(c);
  }
  r.push_back(
      {"broadcast_row_col_transposed",
       {5, 7},
       {f32({5, 1}), f32({7}), f32({5, 7}, {1, 5})},
       {step("aten::sub.Tensor", {0, 1}, {scalar_double(2, -1.0)}), step("aten::abs", {prev(0)}),
        step("aten::div.Tensor", {prev(1), 2}), step("aten::neg", {prev(2)})}});
  r.push_back({"python_numbers",
               {4, 9},
               {f32({4, 9}), number(0.1), number(3.0)},
               {step("aten::mul.Tensor", {0, 1}),
                step("aten::add.Tensor", {prev(0), 2}, {scalar_int(2, 1)}),
                step("aten::div.Tensor", {prev(1), 1})}});
  // Python ints: AdamW's step += 1 on a 0-d float32 tensor, and a product and a quotient.
  r.push_back({"python_int_in_place_0d", {}, {f32({}), int_number(1)},
               {step("aten::add_.Tensor", {0, 1}, {scalar_int(2, 1)})}});
  r.push_back({"python_ints",
               {5, 7},
               {f32({5, 7}), int_number(3), int_number(-7)},
               {step("aten::mul.Tensor", {0, 1}), step("aten::div.Tensor", {prev(0), 2}),
                step("aten::sub.Tensor", {prev(1), 1}, {scalar_int(2, 1)})}});
  r.push_back(
      {"scalar_overloads",
       {33},
       {f32({33})},
       {step("aten::add.Scalar", {0}, {scalar_double(1, 0.3), scalar_int(2, 2)}),
        step("aten::mul.Scalar", {prev(0)}, {scalar_double(1, -1.7)}),
        step("aten::div.Scalar", {prev(1)}, {scalar_int(1, 3)}),
        step("aten::sub.Scalar", {prev(2)}, {scalar_double(1, 0.1), scalar_double(2, 0.7)})}});
  r.push_back({"mixed_dtypes",
               {4, 6},
               {f32({4, 6}), f64({4, 6}), f64({}), f32({4, 6}, {1, 4})},
               {step("aten::add.Tensor", {0, 1}, {scalar_double(2, -1.0)}, kF64),
                step("aten::mul.Tensor", {prev(0), 2}, {}, kF64),
                step("aten::mul.Tensor", {3, 2}, {}, kF32),  // a 0-d float64 does not promote
                step("aten::sub.Tensor", {prev(2), prev(1)}, {scalar_int(2, 1)}, kF64)}});
  r.push_back({"sgd_momentum_in_place",
               {8, 13},
               {f32({8, 13}), f32({8, 13}), f32({8, 13})},  // buf, grad, param
               {step("aten::mul_.Scalar", {0}, {scalar_double(1, 0.9)}),
                step("aten::add_.Tensor", {prev(0), 1}, {scalar_int(2, 1)}),
                step("aten::add_.Tensor", {2, prev(1)}, {scalar_double(2, -0.01)})}});
  {
    ChainSpec c{
        "strided_output_with_gaps_offset_input",
        {5, 7},
        {f32({5, 7}, {9, 1}, 3), f64({7, 5}, {5, 1})},
        {step("aten::relu", {0}), step("aten::add.Tensor", {prev(0), 0}, {scalar_int(2, 1)})}};
    c.inputs[1] = f32({5, 7}, {1, 5});
    c.steps[1].out_strides = {16, 1};
    c.steps[0].out_strides = {1, 5};
    c.steps[0].escape = true;
    r.push_back(c);
  }
  r.push_back(
      {"empty_0x5",
       {0, 5},
       {f32({0, 5}), f32({5})},
       {step("aten::add.Tensor", {0, 1}, {scalar_int(2, 1)}), step("aten::neg", {prev(0)})}});
  r.push_back({"empty_3x0", {3, 0}, {f64({3, 0})}, {step("aten::abs", {0}, {}, kF64)}});
  r.push_back({"zero_d",
               {},
               {f32({}), f32({})},
               {step("aten::div.Tensor", {0, 1}), step("aten::relu", {prev(0)})}});
  r.push_back({"unary_f64_specials",
               {257},
               {f64({257})},
               {step("aten::neg", {0}, {}, kF64), step("aten::relu", {prev(0)}, {}, kF64),
                step("aten::abs", {0}, {}, kF64), step("aten::div.Tensor", {prev(2), 0}, {}, kF64),
                step("aten::sub.Tensor", {prev(3), prev(1)}, {scalar_int(2, 1)}, kF64)}});
  // alpha other than +-1 without broadcast inputs: rounded as ATen rounds it, float32 and float64,
  // over sizes ATen splits between threads (Note [ATen's alpha rounding]).
  r.push_back({"alpha_ranges_f32_1000003",
               {1000003},
               {f32({1000003}), f32({1000003})},
               {step("aten::add.Tensor", {0, 1}, {scalar_double(2, 0.3)}),
                step("aten::sub.Tensor", {prev(0), 1}, {scalar_double(2, 0.7)})}});
  r.push_back({"alpha_ranges_f64_65537",
               {65537},
               {f64({65537}), f64({65537})},
               {step("aten::sub_.Tensor", {0, 1}, {scalar_double(2, -1.3)}, kF64),
                step("aten::mul.Tensor", {prev(0), 1}, {}, kF64)}});
  // relu's backward after a relu: threshold 0, where the forward's zeros and -0 meet NaN grads.
  r.push_back({"relu_backward",
               {4, 33},
               {f32({4, 33}), f32({4, 33})},  // x, grad
               {step("aten::relu", {0}),
                step("aten::threshold_backward", {1, prev(0)}, {scalar_int(2, 0)}),
                step("aten::mul.Tensor", {prev(1), 0})}});
  // avg-pool's backward into relu's: a gradient read through an expand (zero strides), divided,
  // then thresholded by the forward's output.
  r.push_back({"expanded_mean_backward_then_threshold",
               {4, 16, 4, 4},
               {f32({4, 16, 4, 4}, {16, 1, 0, 0}), f32({4, 16, 4, 4})},
               {step("aten::div.Scalar", {0}, {scalar_int(1, 16)}),
                step("aten::threshold_backward", {prev(0), 1}, {scalar_int(2, 0)})}});
  // AdamW's update of one parameter (torch.optim's single-tensor loop): decay, the two moments,
  // the step through sqrt (a library call: not bit-exact), over sizes ATen splits between
  // threads, float32 and float64.
  for (auto [n, dt] : {std::pair<std::int64_t, std::int8_t>{1000003, kF32}, {17, kF32}, {65537, kF64}}) {
    TensorSpec t{dt, {n}, {}, 0, false, 0};
    ChainSpec c{"adamw_" + std::to_string(n) + (dt == kF64 ? "_f64" : "_f32"),
                {n},
                {t, t, t, t},  // param, grad, exp_avg, exp_avg_sq
                {step("aten::mul_.Scalar", {0}, {scalar_double(1, 0.999)}, dt),
                 step("aten::lerp_.Scalar", {2, 1}, {scalar_double(2, 0.1)}, dt),
                 step("aten::mul_.Scalar", {3}, {scalar_double(1, 0.999)}, dt),
                 step("aten::addcmul_", {prev(2), 1, 1}, {scalar_double(3, 0.001)}, dt),
                 step("aten::sqrt", {prev(3)}, {}, dt),
                 step("aten::div.Scalar", {prev(4)}, {scalar_double(1, 0.031)}, dt),
                 step("aten::add_.Scalar", {prev(5)}, {scalar_double(1, 1e-8), scalar_int(2, 1)}, dt),
                 step("aten::addcdiv_", {prev(0), prev(1), prev(6)}, {scalar_double(3, -0.01)}, dt)}};
    r.push_back(c);
  }
  r.push_back(adamw_with_step_item(1000));
  // lerp with a small weight and a large one (patched: 0.4 and 1.6), addcmul with its default
  // value and an integer one, addcdiv's default value, out of place.
  r.push_back({"lerp_addcmul_addcdiv_3x17",
               {3, 17},
               {f32({3, 17}), f32({3, 17}), f32({3, 17}, {1, 3})},
               {step("aten::lerp.Scalar", {0, 1}, {scalar_double(2, 0.1)}),
                step("aten::lerp.Scalar", {prev(0), 2}, {scalar_double(2, 0.9)}),
                step("aten::addcmul", {prev(1), 0, 2}),
                step("aten::addcmul", {prev(2), 1, prev(0)}, {scalar_int(3, 3)}),
                step("aten::addcdiv", {prev(3), 2, 1})}});
  r.push_back(
      {"exp_stays_a_library_call",
       {19},
       {f32({19}), f32({19})},
       {step("aten::exp", {0}), step("aten::add.Tensor", {prev(0), 1}, {scalar_int(2, 1)})}});
  {
    ChainSpec c{"sqrt_stays_a_library_call",
                {3, 19},
                {f32({3, 19}), f32({3, 19})},
                {step("aten::abs", {0}), step("aten::sqrt", {prev(0)}),
                 step("aten::mul.Tensor", {prev(1), 1})}};
    c.split = true;  // abs and mul are generated, sqrt is not
    r.push_back(c);
  }
  // Strided loops large enough to run in parts of whole lines (Note [Split loops]): an odd
  // number of lines, transposed and permuted operands, an output with gaps between its rows.
  {
    ChainSpec c{"strided_split_transposed",
                {257, 301},
                {f32({257, 301}, {1, 257}), f32({257, 301}), f64({257, 301}, {1, 263}, 5)},
                {step("aten::mul.Tensor", {0, 1}),
                 step("aten::add.Tensor", {prev(0), 2}, {scalar_int(2, 1)}, kF64),
                 step("aten::relu", {prev(1)}, {}, kF64)}};
    c.steps[2].out_strides = {307, 1};
    r.push_back(c);
  }
  r.push_back({"strided_split_permuted_3d",
               {3, 129, 211},
               {f32({3, 129, 211}, {1, 633, 3}), f32({3, 129, 211}, {129 * 211, 1, 129})},
               {step("aten::sub.Tensor", {0, 1}, {scalar_int(2, 1)}),
                step("aten::neg", {prev(0)})}});
  return r;
}

// One row per op the CPU backend covers (covered_pointwise_ops): [3, 17] with a broadcast
// [17] second operand, its scalar operands and alpha, in place where the op is.
inline std::vector<ChainSpec> one_op_rows() {
  std::vector<ChainSpec> r;
  for (const std::string& op : covered_pointwise_ops()) {
    OpInfo info{};
    EXPECT_TRUE(op_info(op, &info)) << op << " has no reference";
    StepSpec s = step(op, info.tensor_inputs == 3   ? std::vector<int>{0, 1, 0}
                          : info.tensor_inputs == 2 ? std::vector<int>{0, 1}
                                                    : std::vector<int>{0});
    if (info.fn == Fn::ThresholdBackward)
      s.scalars.push_back(scalar_double(2, 0.25));
    else if (info.fn == Fn::MseBwd)  // (grad, self [17] broadcast: norm 2/17, target), a mean
      s.in = {0, 1, 2}, s.scalars.push_back(scalar_int(3, 1));
    else if (info.fn == Fn::Mse)  // reduction none: pointwise (a mean or sum is a sum)
      s.scalars.push_back(scalar_int(2, 0));
    else if (info.other_arg >= 0)
      s.scalars.push_back(scalar_double(static_cast<std::uint16_t>(info.other_arg), 0.3));
    if (info.fn == Fn::AddCMul || info.fn == Fn::AddCDiv)
      s.scalars.push_back(scalar_double(3, 0.3));
    else if (info.alpha_arg >= 0)
      s.scalars.push_back(info.other_arg >= 0 ? scalar_int(2, -1) : scalar_double(2, 1.0));
    if (info.fn == Fn::MseBwd)
      r.push_back({"op_" + op, {3, 17}, {f32({3, 17}), f32({17}), f32({3, 17})}, {s}});
    else
      r.push_back({"op_" + op, {3, 17}, {f32({3, 17}), f32({17})}, {s}});
  }
  return r;
}

// Random chains: ranks 1-4, sizes from {1, 2, 3, 5, 7, 17}, broadcast and permuted inputs with
// gaps and offsets, permuted outputs, Python numbers, in-place steps, split kernels.
inline std::vector<ChainSpec> random_rows(int count, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  auto coin = [&](int pct) { return static_cast<int>(rng() % 100) < pct; };
  auto pick = [&](auto n) { return static_cast<std::size_t>(rng() % n); };
  const std::int64_t dims[] = {1, 2, 3, 5, 7, 17};
  const char* binary[] = {"aten::add.Tensor", "aten::sub.Tensor", "aten::mul.Tensor",
                          "aten::div.Tensor"};
  const char* unary[] = {"aten::neg", "aten::abs", "aten::relu", "aten::sqrt", "aten::sgn"};
  auto permuted = [&](const std::vector<std::int64_t>& sizes, bool gap) {
    std::vector<std::size_t> order(sizes.size());
    for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::shuffle(order.begin(), order.end(), rng);
    std::vector<std::int64_t> st(sizes.size());
    std::int64_t s = 1;
    for (std::size_t i = order.size(); i-- > 0;) {
      st[order[i]] = s;
      s *= sizes[order[i]] + (gap && i == order.size() - 1 ? 2 : 0);
    }
    return st;
  };
  std::vector<ChainSpec> rows;
  for (int row = 0; row < count; ++row) {
    ChainSpec c;
    c.name = "random_" + std::to_string(row);
    const std::size_t rank = 1 + pick(4);
    for (std::size_t d = 0; d < rank; ++d) c.shape.push_back(dims[pick(6)]);
    const std::size_t ninputs = 1 + pick(3);
    for (std::size_t i = 0; i < ninputs; ++i) {
      TensorSpec t;
      t.dtype = coin(20) ? kF64 : kF32;
      t.sizes = c.shape;
      if (i > 0 && coin(50)) {
        for (std::int64_t& s : t.sizes)
          if (coin(35)) s = 1;
        if (coin(30) && t.sizes.size() > 1) t.sizes.erase(t.sizes.begin());
      }
      if (coin(50)) t.strides = permuted(t.sizes, coin(40));
      t.offset = coin(30) ? static_cast<std::int64_t>(pick(5)) : 0;
      c.inputs.push_back(t);
    }
    if (coin(30)) c.inputs.push_back(number(coin(50) ? 0.25 : -3.5));
    auto full = [&](int x) {  // an operand of the full shape, writable in place
      if (x < 0) return true;
      const TensorSpec& t = c.inputs[x];
      return !t.wrapped && t.sizes == c.shape;
    };
    std::vector<std::int8_t> out_dtype;
    auto dtype_of = [&](int x) { return x >= 0 ? c.inputs[x].dtype : out_dtype[-(x + 1)]; };
    auto tier_of = [&](int x) {
      if (x < 0) return c.shape.empty() ? 1 : 0;
      return c.inputs[x].wrapped ? 2 : c.inputs[x].sizes.empty() ? 1 : 0;
    };
    const std::size_t nsteps = 1 + pick(5);
    for (std::size_t s = 0; s < nsteps; ++s) {
      const int first =
          s > 0 && coin(70) ? prev(static_cast<int>(s) - 1) : static_cast<int>(pick(ninputs));
      StepSpec st;
      if (coin(45)) {
        st.op = unary[pick(5)];
        st.in = {first};
      } else {
        st.op = binary[pick(4)];
        const int second = s > 0 && coin(30) ? prev(static_cast<int>(pick(s)))
                                             : static_cast<int>(pick(c.inputs.size()));
        st.in = {first, second};
        if (st.op == std::string("aten::add.Tensor") || st.op == std::string("aten::sub.Tensor"))
          st.scalars.push_back(coin(60)   ? scalar_int(2, coin(50) ? 1 : -1)
                               : coin(50) ? scalar_double(2, -1.0)
                                          : scalar_double(2, coin(50) ? 0.5 : -1.3));
      }
      std::vector<Operand> ops;
      for (int x : st.in) ops.push_back({dtype_of(x), tier_of(x)});
      st.out_dtype = compute_dtype(ops);
      if (coin(20) && full(first) && tier_of(first) == 0) {  // in place on its first operand
        st.op = st.op.find('.') == std::string::npos
                    ? st.op + "_"
                    : st.op.substr(0, st.op.find('.')) + "_" + st.op.substr(st.op.find('.'));
        st.out_dtype = dtype_of(first);
      } else if (coin(20)) {
        st.out_strides = permuted(c.shape, false);
      }
      st.escape = coin(30);
      out_dtype.push_back(st.out_dtype);
      c.steps.push_back(st);
    }
    c.split = coin(30);
    rows.push_back(std::move(c));
  }
  return rows;
}

// A value for a patched scalar or Python number: changed, still of the recorded kind.
inline record::ScalarRecord patched(record::ScalarRecord r) {
  if (r.kind == record::ScalarKind::Double)
    r.bits = std::bit_cast<std::uint64_t>(std::bit_cast<double>(r.bits) * 1.5 + 0.25);
  else  // an integer alpha of 1 becomes -1: still one the CPU backend's kernels run with
    r.bits = static_cast<std::uint64_t>(r.bits == 0 ? 2 : -static_cast<std::int64_t>(r.bits));
  return r;
}

struct Dtypes {
  std::vector<std::int8_t> inputs, outputs;  // per binding
};
inline Dtypes binding_dtypes(const ChainSpec& c, const BuiltPlan& bp) {
  Dtypes d;
  d.inputs.resize(bp.input_bytes.size());
  d.outputs.resize(bp.output_bytes.size());
  for (std::size_t i = 0; i < c.inputs.size(); ++i)
    if (bp.input_slot_of[i] != UINT32_MAX) d.inputs[bp.input_slot_of[i]] = c.inputs[i].dtype;
  for (std::size_t s = 0; s < c.steps.size(); ++s)
    if (bp.step_output_binding[s] >= 0) d.outputs[bp.step_output_binding[s]] = c.steps[s].out_dtype;
  return d;
}


// Each run's starting buffers: inputs random (NaN, ±Inf, ±0, subnormals, huge), outputs 0x5a.
inline RunBuffers initial_buffers(const BuiltPlan& bp, const Dtypes& dts, std::mt19937_64& rng) {
  RunBuffers b;
  for (std::size_t i = 0; i < bp.input_bytes.size(); ++i) {
    b.inputs.emplace_back(std::max<std::uint64_t>(bp.input_bytes[i], 8), 0);
    fill_random(b.inputs.back(), dts.inputs[i], rng);
  }
  for (std::uint64_t bytes : bp.output_bytes)
    b.outputs.emplace_back(std::max<std::uint64_t>(bytes, 8), char{0x5a});
  return b;
}

// The calls the CPU backend generates, over every kernel.
inline std::uint32_t generated_call_count(const CpuBackend& cpu) {
  std::uint32_t n = 0;
  for (const CpuKernelState& k : cpu.kernels()) n += k.generated_calls;
  return n;
}

// A run's scalars and Python numbers: as recorded, or each patched (and the bits Runner::run
// takes for the patch points).
struct Patches {
  std::vector<record::ScalarRecord> scalars;
  std::vector<double> numbers;
  std::vector<std::uint64_t> bits;  // what Runner::run takes
};

inline Patches patches_for(const ChainSpec& c, const BuiltPlan& bp, bool patch) {
  Patches p;
  p.scalars = bp.plan.scalars;
  std::vector<bool> is_int;
  for (const TensorSpec& t : c.inputs)
    if (t.wrapped) p.numbers.push_back(t.value), is_int.push_back(t.dtype == dtype::kInt64);
  if (patch) {
    // mse_loss's reduction stays: another is another result shape, which no plan can take
    std::vector<bool> keep(p.scalars.size(), false);
    for (const exec::Call& call : bp.plan.calls)
      if (bp.plan.op_names[call.op] == "aten::mse_loss")
        for (std::uint32_t i = call.scalar_begin; i < call.scalar_begin + call.scalar_count; ++i)
          keep[i] = p.scalars[i].arg_index == 2;
    for (std::size_t i = 0; i < p.scalars.size(); ++i) {
      if (!keep[i]) p.scalars[i] = patched(p.scalars[i]);
      p.bits.push_back(p.scalars[i].bits);
    }
    for (std::size_t i = 0; i < p.numbers.size(); ++i) {
      double& x = p.numbers[i];
      x = x * -2.0 + (is_int[i] ? 1.0 : 0.5);  // an int stays an int
      p.bits.push_back(std::bit_cast<std::uint64_t>(x));
    }
  }
  return p;
}

inline Status run(exec::Runner& r, RunBuffers& b, const Patches& p) {
  std::vector<void*> ins, outs;
  for (auto& x : b.inputs) ins.push_back(x.data());
  for (auto& x : b.outputs) outs.push_back(x.data());
  return r.run(exec::RunArgs{ins, outs, p.bits});
}

}  // namespace crucible::mimic::test
