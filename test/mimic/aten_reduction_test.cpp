// aten_reduction_test — the CPU backend's generated reductions against ATen itself, one call per
// plan: sums and means over the innermost or outermost dims (Note [Generated sums]), softmax and
// log-softmax forward and backward (Note [Generated softmax]), layer norm (Note [Generated
// layer norm]), nll_loss forward and backward (Note [Generated nll_loss]), batch norm forward and
// backward (Note [Generated batch norm]), max.dim, min.dim, argmax and argmin (Note
// [Generated max and argmax]) and amax and amin (Note [Generated amax and amin]), each in float32
// and float64 over odd sizes (1, 3, 17, 1000, 100003 elements in a row) and seeded random shapes,
// with finite inputs and with NaN, ±Inf, ±0, subnormals and huge values mixed in. The reference is
// the null backend with the ATen provider (Note [ATen provider]); the CPU backend must generate
// each row meant to be generated and give ATen's bits, any NaN matching any NaN. Rows the backend
// refuses (a dim that is not the last, an input not dense, a full float32 reduction of more than
// 32768 elements, ...) must run as library calls that say why, with ATen's bits too.
#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "AtenMath.h"
#include "AtenProvider.h"
#include "chain_plan.h"
#include "crucible/exec/NullBackend.h"
#include "crucible/exec/Runner.h"
#include "crucible/exec/VerifyPlan.h"
#include "crucible/mimic/CpuBackend.h"
#include "crucible/mimic/CpuTarget.h"

namespace crucible::mimic {
namespace {

using namespace test;

struct Tensor {
  std::uint32_t pos = 0;  // schema position (inputs) or return position (outputs)
  std::int8_t dtype = kF32;
  std::vector<std::int64_t> sizes, strides;  // strides empty: contiguous
};

struct Row {
  std::string name, op;
  std::vector<Tensor> ins, outs;
  std::vector<record::ScalarRecord> scalars;
  bool generated = true;  // else a library call, its reason containing `why`
  std::string why;
  std::int64_t classes = 0;  // nll_loss: the class count its int64 targets index
  double center = 0.0;       // finite inputs: center + uniform(-4, 4)
  bool exact_nans = false;   // a NaN must have ATen's bits too (amax, amin)
};

constexpr std::int64_t kIgnore = -100;  // nll_loss's default ignore_index


struct Plan {
  exec::ExecutionPlan plan;
  std::vector<std::uint64_t> in_bytes, out_bytes;
};

// One kernel of one call; every tensor an Input or Output slot of its own.
Plan build(const Row& r) {
  Plan b;
  exec::ExecutionPlan& p = b.plan;
  auto add = [&](const Tensor& t, exec::SlotKind kind) {
    const auto st = t.strides.empty() ? contiguous_strides(t.sizes) : t.strides;
    exec::Slot s;
    s.kind = kind;
    s.dtype = t.dtype;
    s.storage = p.slots.size();
    s.first = s.last = 0;
    s.bytes = extent_bytes(t.sizes, st, 0, t.dtype);
    auto& bindings = kind == exec::SlotKind::Input ? p.inputs : p.outputs;
    s.binding = static_cast<std::uint32_t>(bindings.size());
    bindings.push_back(static_cast<std::uint32_t>(p.slots.size()));
    (kind == exec::SlotKind::Input ? b.in_bytes : b.out_bytes).push_back(s.bytes);
    p.slots.push_back(s);
    exec::TensorRef tr;
    tr.slot = static_cast<std::uint32_t>(p.slots.size() - 1);
    tr.dtype = t.dtype;
    tr.ndim = static_cast<std::uint16_t>(t.sizes.size());
    tr.dims = static_cast<std::uint32_t>(p.dims.size());
    tr.value = static_cast<std::uint32_t>(p.tensors.size());
    p.dims.insert(p.dims.end(), t.sizes.begin(), t.sizes.end());
    p.dims.insert(p.dims.end(), st.begin(), st.end());
    p.tensors.push_back(tr);
    p.args.push_back(exec::Arg{static_cast<std::uint32_t>(p.tensors.size() - 1), t.pos, 0});
  };
  exec::Call call;
  call.op = 0;
  p.op_names.push_back(r.op);
  call.kind = classify_op(r.op).kind;
  call.in_begin = 0;
  for (const Tensor& t : r.ins) add(t, exec::SlotKind::Input);
  call.in_count = static_cast<std::uint32_t>(r.ins.size());
  call.out_begin = call.in_count;
  for (const Tensor& t : r.outs) add(t, exec::SlotKind::Output);
  call.out_count = static_cast<std::uint32_t>(r.outs.size());
  call.scalar_begin = 0;
  call.scalar_count = static_cast<std::uint32_t>(r.scalars.size());
  p.scalars = r.scalars;
  p.calls.push_back(call);
  p.kernels.push_back(
      exec::Kernel{0, forge::KernelTemplate::Reduce, forge::recipe_by_name("f32_strict"), 0, 1});
  for (std::uint32_t t = call.out_begin; t < call.out_begin + call.out_count; ++t)
    p.results.push_back(t);
  return b;
}

using Buffers = std::vector<std::vector<char>>;

Status run(exec::Runner& r, Buffers& ins, Buffers& outs) {
  std::vector<void*> i, o;
  for (auto& x : ins) i.push_back(x.data());
  for (auto& x : outs) o.push_back(x.data());
  return r.run(exec::RunArgs{i, o, {}});
}

void run_row(const Row& r, std::uint64_t seed) {
  SCOPED_TRACE(r.name);
  // ATen's order of operations is known for x86-64 only: elsewhere every reduction is a
  // library call (CpuBackend.cpp)
  if (host_target().triple.rfind("x86_64", 0) != 0)
    GTEST_SKIP() << "reductions are generated on x86-64 only";
  const Plan bp = build(r);
  ASSERT_TRUE(exec::verify_plan(bp.plan).ok()) << exec::verify_plan(bp.plan);
  vessel::AtenProvider aten_ref, aten_lib;
  auto reference = exec::Runner::make(bp.plan, exec::null_backend(), aten_ref.provider());
  ASSERT_TRUE(reference.ok()) << reference.status();
  CpuBackendOptions o = CpuBackendOptions::memory_only();
  o.threads = static_cast<unsigned>(std::max(1, at::get_num_threads()));  // ATen's, as the Vessel
  auto cpu = CpuBackend::make(o);
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  auto generated = exec::Runner::make(bp.plan, (*cpu)->backend(), aten_lib.provider());
  ASSERT_TRUE(generated.ok()) << generated.status();
  const CpuKernelState& k = (*cpu)->kernels()[0];
  EXPECT_EQ(k.generated_calls, r.generated ? 1u : 0u) << k.why;
  if (!r.generated) {
    EXPECT_NE(k.why.find(r.why), std::string::npos) << k.why;
  }
  std::mt19937_64 rng(seed);
  // finite values first (a NaN in a row would make any order of its sum give NaN), then with
  // the IEEE specials mixed in
  for (const bool specials : {false, true}) {
    SCOPED_TRACE(specials ? "with NaN, Inf, subnormals" : "finite");
    Buffers ins;
    for (std::size_t i = 0; i < r.ins.size(); ++i) {
      ins.emplace_back(std::max<std::uint64_t>(bp.in_bytes[i], 8));  // an empty tensor's too
      if (r.ins[i].dtype == dtype::kInt64) {  // class indices: in [0, classes), one in ten ignored
        std::uniform_int_distribution<std::int64_t> cls(0, r.classes - 1);
        std::uniform_int_distribution<int> pick(0, 9);
        for (std::size_t e = 0; e < ins.back().size() / 8; ++e) {
          const std::int64_t t = pick(rng) == 0 ? kIgnore : cls(rng);
          std::memcpy(ins.back().data() + 8 * e, &t, 8);
        }
        continue;
      }
      if (specials) {
        fill_random(ins.back(), r.ins[i].dtype, rng);
        continue;
      }
      std::uniform_real_distribution<double> u(-4.0, 4.0);
      for (std::size_t e = 0; e < ins.back().size() / dtype_bytes(r.ins[i].dtype); ++e) {
        const double x = r.center + u(rng);
        const float f = static_cast<float>(x);
        if (r.ins[i].dtype == kF64) std::memcpy(ins.back().data() + 8 * e, &x, 8);
        else std::memcpy(ins.back().data() + 4 * e, &f, 4);
      }
    }
    Buffers want, got;
    for (std::size_t i = 0; i < r.outs.size(); ++i) {
      want.emplace_back(std::max<std::uint64_t>(bp.out_bytes[i], 8), '\x5a');
      got.emplace_back(std::max<std::uint64_t>(bp.out_bytes[i], 8), '\x3c');
    }
    Buffers ins_ref = ins;
    const Status sr = run(**reference, ins_ref, want);
    ASSERT_TRUE(sr.ok()) << sr;
    const Status sg = run(**generated, ins, got);
    ASSERT_TRUE(sg.ok()) << sg;
    for (std::size_t i = 0; i < r.outs.size(); ++i) {
      want[i].resize(bp.out_bytes[i]);  // the tensor's bytes, not the padding
      got[i].resize(bp.out_bytes[i]);
      std::int64_t d = first_difference(want[i], got[i], r.outs[i].dtype);
      if (r.exact_nans && d < 0 && want[i] != got[i])  // a NaN of other bits
        d = static_cast<std::int64_t>(
                std::mismatch(want[i].begin(), want[i].end(), got[i].begin()).first -
                want[i].begin()) /
            static_cast<std::int64_t>(dtype_bytes(r.outs[i].dtype));
      EXPECT_LT(d, 0) << "output " << i << " differs from ATen's at element " << d;
    }
    // inputs are left as ATen leaves them (batch norm's running statistics are written)
    for (std::size_t i = 0; i < r.ins.size(); ++i) {
      const std::int64_t d = first_difference(ins_ref[i], ins[i], r.ins[i].dtype);
      EXPECT_LT(d, 0) << "input " << i << " differs from ATen's at element " << d;
    }
  }
}

std::vector<std::int64_t> last_cols() { return {1, 3, 17, 1000}; }

// sum.dim_IntList / mean.dim over `dims` of a [rows, cols] (or [cols, rows] for outer) input.
using Sizes = std::vector<std::int64_t>;
using K = record::ScalarKind;

Row sum_row(const std::string& op, std::int8_t dt, Sizes sizes, Sizes dims, bool keepdim) {
  Row r;
  r.op = op;
  r.name = op + (dt == kF64 ? " f64 " : " f32 ") + "[";
  for (std::int64_t s : sizes) r.name += std::to_string(s) + ",";
  r.name += "] dims";
  for (std::int64_t d : dims) r.name += " " + std::to_string(d);
  Sizes out;
  for (std::size_t d = 0; d < sizes.size(); ++d) {
    const bool reduced = std::ranges::find(dims, static_cast<std::int64_t>(d)) != dims.end();
    if (!reduced) out.push_back(sizes[d]);
    else if (keepdim) out.push_back(1);
  }
  r.ins = {Tensor{0, dt, sizes, {}}};
  r.outs = {Tensor{0, dt, out, {}}};
  r.scalars.push_back(scalar_record(K::ListBegin, 1, 0, static_cast<std::uint32_t>(dims.size())));
  for (std::int64_t d : dims) r.scalars.push_back(scalar_int(1, d));
  r.scalars.push_back(scalar_record(K::Bool, 2, keepdim ? 1 : 0));
  r.scalars.push_back(scalar_record(K::None, 3, 0));
  return r;
}

TEST(AtenReductions, SumsAndMeans) {
  std::uint64_t seed = 1;
  for (std::int8_t dt : {kF32, kF64})
    for (const char* op : {"aten::sum.dim_IntList", "aten::mean.dim"})
      for (std::int64_t rows : {1, 3, 17})
        for (std::int64_t cols : last_cols()) {
          if (cols == 1) continue;  // no dim of size above 1 reduced: a library call (below)
          Row inner = sum_row(op, dt, {rows, cols}, {1}, false);
          Row outer = sum_row(op, dt, {cols, rows}, {0}, true);
          run_row(inner, seed++);
          run_row(outer, seed++);
        }
  // a row of 100003 elements, three rows (not a full reduction), and two leading dims reduced
  run_row(sum_row("aten::sum.dim_IntList", kF32, {3, 100003}, {1}, false), seed++);
  run_row(sum_row("aten::mean.dim", kF64, {5, 7, 9}, {0, 1}, false), seed++);
}

TEST(AtenReductions, RefusedSumsRunAsLibraryCalls) {
  Row full = sum_row("aten::sum.dim_IntList", kF32, {100003}, {0}, false);
  full.generated = false;
  full.why = "more than 32768 elements";
  run_row(full, 7);
  Row strided = sum_row("aten::sum.dim_IntList", kF32, {17, 9}, {1}, false);
  strided.ins[0].strides = {1, 17};  // a transposed input
  strided.generated = false;
  strided.why = "not dense in row-major order";
  run_row(strided, 8);
  Row ones = sum_row("aten::mean.dim", kF64, {5, 1}, {1}, false);
  ones.generated = false;
  ones.why = "no dim of size above 1 is reduced";
  run_row(ones, 9);
  Row empty = sum_row("aten::sum.dim_IntList", kF32, {3, 0}, {1}, false);  // zeros
  empty.generated = false;
  empty.why = "it has an empty dim";
  run_row(empty, 11);
  Row middle = sum_row("aten::sum.dim_IntList", kF64, {3, 4, 5}, {1}, false);
  middle.generated = false;
  middle.why = "neither all innermost nor all outermost";
  run_row(middle, 10);
}

// aten::sum or aten::mean of every element (`Tensor.mean()`), dtype not given.
Row full_row(const std::string& op, std::int8_t dt, Sizes sizes) {
  Row r;
  r.op = op;
  r.name = op + (dt == kF64 ? " f64 [" : " f32 [");
  for (std::int64_t s : sizes) r.name += std::to_string(s) + ",";
  r.name += "]";
  r.ins = {Tensor{0, dt, sizes, {}}};
  r.outs = {Tensor{0, dt, {}, {}}};
  r.scalars.push_back(scalar_record(K::None, 1, 0));
  return r;
}

// Tensor.mean() and sum(): ATen's mean is its sum over the element count (both dtypes, rows of
// 1 to 32768 elements, any rank); a float32 one of more than 32768 elements ATen reduces over
// its threads: a library call, as the sum's.
TEST(AtenReductions, FullMeansAndSums) {
  std::uint64_t seed = 300;
  for (std::int8_t dt : {kF32, kF64})
    for (const char* op : {"aten::mean", "aten::sum"})
      for (const Sizes& s :
           {Sizes{3}, Sizes{17}, Sizes{1000}, Sizes{3, 17}, Sizes{7, 1, 9, 11}, Sizes{32768}})
        run_row(full_row(op, dt, s), seed++);
  Row big = full_row("aten::mean", kF32, {100003});
  big.generated = false;
  big.why = "more than 32768 elements";
  run_row(big, seed++);
  Row strided = full_row("aten::mean", kF64, {9, 17});
  strided.ins[0].strides = {1, 9};
  strided.generated = false;
  strided.why = "not dense in row-major order";
  run_row(strided, seed++);
}

// mse_loss(self, target, reduction): 1 mean, 2 sum, 0 none.
Row mse_row(std::int8_t dt, Sizes sizes, std::int64_t reduction) {
  Row r;
  r.op = "aten::mse_loss";
  r.name = std::string("aten::mse_loss") + (dt == kF64 ? " f64 [" : " f32 [");
  for (std::int64_t s : sizes) r.name += std::to_string(s) + ",";
  r.name += "] reduction " + std::to_string(reduction);
  r.ins = {Tensor{0, dt, sizes, {}}, Tensor{1, dt, sizes, {}}};
  r.outs = {Tensor{0, dt, reduction == 0 ? sizes : Sizes{}, {}}};
  r.scalars.push_back(scalar_int(2, reduction));
  return r;
}

// Note [Sum prologues]: mse_loss's mean and sum are (self - target)^2 computed as the sum reads
// each element, with the bits of ATen's mse_kernel and cascade_sum; past 32768 elements, with a
// broadcast target or a strided self, a library call that says why. Reduction none is the
// pointwise (self - target)^2 (Note [Pointwise programs]).
TEST(AtenReductions, MseLossSumsItsSquaresAsItReadsThem) {
  std::uint64_t seed = 400;
  for (std::int8_t dt : {kF32, kF64})
    for (std::int64_t reduction : {1, 2})
      for (const Sizes& s : {Sizes{2}, Sizes{3}, Sizes{17}, Sizes{1000}, Sizes{6, 4},
                             Sizes{7, 1, 9, 11}, Sizes{32768}})
        run_row(mse_row(dt, s, reduction), seed++);
  Row big = mse_row(kF32, {100003}, 1);
  big.generated = false;
  big.why = "more than 32768 elements";
  run_row(big, seed++);
  // reduction none: the pointwise (self - target)^2, generated
  run_row(mse_row(kF64, {5, 3}, 0), seed++);
  run_row(mse_row(kF32, {7, 1000}, 0), seed++);
  Row strided = mse_row(kF32, {9, 17}, 2);
  strided.ins[0].strides = {1, 9};
  strided.generated = false;
  strided.why = "not dense in row-major order";
  run_row(strided, seed++);
  Row broadcast = mse_row(kF32, {9, 17}, 1);
  broadcast.ins[1].sizes = {17};
  broadcast.generated = false;
  broadcast.why = "other sizes than its self";
  run_row(broadcast, seed++);
}

std::string dt_text(std::int8_t dt) { return dt == kF64 ? " f64 [" : " f32 ["; }

Row softmax_row(const std::string& op, std::int8_t dt, Sizes sizes, std::int64_t dim) {
  Row r;
  r.op = op;
  r.name = op + dt_text(dt) + std::to_string(sizes[0]) + "," + std::to_string(sizes.back()) +
           "] dim " + std::to_string(dim);
  const bool backward = op.ends_with("_backward_data");
  r.ins = {Tensor{0, dt, sizes, {}}};
  if (backward) r.ins.push_back(Tensor{1, dt, sizes, {}});
  r.outs = {Tensor{0, dt, sizes, {}}};
  if (backward) {
    r.scalars = {scalar_int(2, dim), scalar_int(3, dt)};
  } else {
    r.scalars = {scalar_int(1, dim), scalar_record(K::Bool, 2, 0)};
  }
  return r;
}

TEST(AtenReductions, SoftmaxForwardAndBackward) {
  const std::string& no_math = vessel::provide_aten_vector_math();
  if (!no_math.empty()) GTEST_SKIP() << "softmax is not generated here: " << no_math;
  std::uint64_t seed = 100;
  for (std::int8_t dt : {kF32, kF64})
    for (const char* op : {"aten::_softmax", "aten::_log_softmax", "aten::_softmax_backward_data",
                           "aten::_log_softmax_backward_data"})
      for (std::int64_t rows : {1, 3, 17})
        for (std::int64_t cols : last_cols())
          run_row(softmax_row(op, dt, {rows, cols}, -1), seed++);
  Row other_dim = softmax_row("aten::_softmax", kF32, {17, 5}, 0);
  other_dim.generated = false;
  other_dim.why = "its dim is not the last";
  run_row(other_dim, seed++);
}

Row layer_norm_row(std::int8_t dt, std::int64_t rows, std::int64_t cols, bool affine) {
  Row r;
  r.op = "aten::native_layer_norm";
  r.name = "layer_norm" + dt_text(dt) + std::to_string(rows) + "," + std::to_string(cols) + "]" +
           (affine ? " affine" : "");
  r.ins = {Tensor{0, dt, {rows, cols}, {}}};
  if (affine) r.ins.insert(r.ins.end(), {Tensor{2, dt, {cols}, {}}, Tensor{3, dt, {cols}, {}}});
  r.outs = {Tensor{0, dt, {rows, cols}, {}}, Tensor{1, dt, {rows, 1}, {}},
            Tensor{2, dt, {rows, 1}, {}}};
  r.scalars = {scalar_record(K::ListBegin, 1, 0, 1), scalar_int(1, cols)};
  if (!affine) {
    r.scalars.push_back(scalar_record(K::None, 2, 0));
    r.scalars.push_back(scalar_record(K::None, 3, 0));
  }
  r.scalars.push_back(scalar_double(4, 1e-5));
  return r;
}

TEST(AtenReductions, LayerNorm) {
  std::uint64_t seed = 200;
  for (std::int8_t dt : {kF32, kF64})
    for (bool affine : {false, true})
      for (std::int64_t rows : {1, 3, 17})
        for (std::int64_t cols : last_cols())
          run_row(layer_norm_row(dt, rows, cols, affine), seed++);
}

// A backward's `bool[3] output_mask` at schema position `arg` and the results it asks for:
// result 0 of `first` sizes, results 1 and 2 of `rest`.
void output_mask(Row& r, std::uint16_t arg, unsigned mask, std::int8_t dt, const Sizes& first,
                 const Sizes& rest) {
  r.scalars.push_back(scalar_record(K::ListBegin, arg, 0, 3));
  for (unsigned i = 0; i < 3; ++i)
    r.scalars.push_back(scalar_record(K::Bool, arg, (mask >> i) & 1));
  for (std::uint32_t i = 0; i < 3; ++i)
    if ((mask >> i) & 1) r.outs.push_back(Tensor{i, dt, i == 0 ? first : rest, {}});
}

// native_layer_norm_backward (grad_out, input, normalized_shape, mean, rstd, weight, bias,
// output_mask) over `sizes` normalized over the last `norm_dims`; `weight`/`bias` given or None,
// `mask` bit i result i.
Row layer_norm_backward_row(std::int8_t dt, Sizes sizes, std::int64_t norm_dims, bool weight,
                            bool bias, unsigned mask) {
  Row r;
  r.op = "aten::native_layer_norm_backward";
  r.name = "layer_norm_backward" + dt_text(dt);
  for (std::int64_t s : sizes) r.name += std::to_string(s) + ",";
  r.name += "] over " + std::to_string(norm_dims) + (weight ? " weight" : "") +
            (bias ? " bias" : "") + " mask " + std::to_string(mask);
  const auto split = sizes.end() - norm_dims;
  Sizes stats(sizes.begin(), split), normalized(split, sizes.end());
  stats.resize(sizes.size(), 1);  // mean and rstd keep the normalized dims as size 1
  r.ins = {Tensor{0, dt, sizes, {}}, Tensor{1, dt, sizes, {}}, Tensor{3, dt, stats, {}},
           Tensor{4, dt, stats, {}}};
  r.scalars = {scalar_record(K::ListBegin, 2, 0, static_cast<std::uint32_t>(norm_dims))};
  for (std::int64_t s : normalized) r.scalars.push_back(scalar_int(2, s));
  if (weight)
    r.ins.push_back(Tensor{5, dt, normalized, {}});
  else
    r.scalars.push_back(scalar_record(K::None, 5, 0));
  if (bias)
    r.ins.push_back(Tensor{6, dt, normalized, {}});
  else
    r.scalars.push_back(scalar_record(K::None, 6, 0));
  output_mask(r, 7, mask, dt, sizes, normalized);
  return r;
}

// grad_input is the same on any thread count; grad_weight and grad_bias follow ATen's row split
// for its thread count at the call, so each row runs at 1, 2 and 3 threads (ATen's and the
// backend's), and at 2 with parts of 65536 elements or more run on two threads.
TEST(AtenReductions, LayerNormBackward) {
  const int threads_before = at::get_num_threads();
  std::uint64_t seed = 250;
  const std::vector<std::pair<Sizes, std::int64_t>> shapes{
      {{1, 1}, 1},     {{1, 17}, 1},     {{2, 3}, 1},    {{5, 7}, 1},       {{3, 8}, 1},
      {{4, 9}, 1},     {{17, 16}, 1},    {{5, 1000}, 1}, {{2, 3, 4, 5}, 2}, {{3, 1, 33}, 1},
      {{7, 2, 12}, 2}, {{160, 1000}, 1}, {{2, 70000}, 1}};
  for (int threads : {1, 2, 3}) {
    at::set_num_threads(threads);
    SCOPED_TRACE(std::to_string(threads) + " threads");
    for (std::int8_t dt : {kF32, kF64})
      for (const auto& [sizes, nd] : shapes)
        for (const bool affine : {false, true})
          run_row(layer_norm_backward_row(dt, sizes, nd, affine, affine, affine ? 7 : 1), seed++);
    // some results only, weight without bias and bias without weight
    for (std::int8_t dt : {kF32, kF64})
      for (unsigned mask : {1u, 2u, 3u, 4u, 5u, 6u}) {
        run_row(layer_norm_backward_row(dt, {9, 13}, 1, true, true, mask), seed++);
        if ((mask & 4) == 0)
          run_row(layer_norm_backward_row(dt, {6, 20}, 1, true, false, mask), seed++);
        if ((mask & 2) == 0)
          run_row(layer_norm_backward_row(dt, {6, 20}, 1, false, true, mask), seed++);
      }
    // seeded random shapes: 1..40 rows of 1..300 elements
    std::mt19937_64 rng(0x1a7b + static_cast<std::uint64_t>(threads));
    std::uniform_int_distribution<std::int64_t> rows(1, 40), cols(1, 300);
    for (int i = 0; i < 12; ++i)
      run_row(layer_norm_backward_row(i % 2 == 0 ? kF32 : kF64, {rows(rng), cols(rng)}, 1,
                                      i % 3 != 0, i % 3 != 0, i % 3 != 0 ? 7 : 1),
              seed++);
  }
  at::set_num_threads(threads_before);
  Row strided = layer_norm_backward_row(kF32, {4, 6}, 1, true, true, 7);
  strided.ins[1].strides = {1, 4};  // the input transposed
  strided.generated = false;
  strided.why = "not a dense tensor";
  run_row(strided, seed++);
  Row empty = layer_norm_backward_row(kF64, {0, 6}, 1, true, true, 7);  // ATen writes zeros
  empty.generated = false;
  empty.why = "an empty dim";
  run_row(empty, seed++);
}

// nll_loss_forward (self [N, C], target [N] -> loss, total_weight) and nll_loss_backward
// (grad_output, self, target, total_weight -> grad_input), reduction mean (1) or sum (2).
Row nll_row(bool backward, std::int8_t dt, std::int64_t n, std::int64_t c, std::int64_t reduction) {
  Row r;
  r.op = backward ? "aten::nll_loss_backward" : "aten::nll_loss_forward";
  r.name = r.op + dt_text(dt) + std::to_string(n) + "," + std::to_string(c) + "] reduction " +
           std::to_string(reduction);
  r.classes = c;
  const std::uint16_t base = backward ? 1 : 0;  // self's schema position
  if (backward) r.ins.push_back(Tensor{0, dt, {}, {}});
  r.ins.push_back(Tensor{base, dt, {n, c}, {}});
  r.ins.push_back(Tensor{static_cast<std::uint32_t>(base + 1), dtype::kInt64, {n}, {}});
  if (backward) r.ins.push_back(Tensor{6, dt, {}, {}});
  r.outs = backward ? std::vector<Tensor>{Tensor{0, dt, {n, c}, {}}}
                    : std::vector<Tensor>{Tensor{0, dt, {}, {}}, Tensor{1, dt, {}, {}}};
  r.scalars = {scalar_record(K::None, static_cast<std::uint16_t>(base + 2), 0),
               scalar_int(static_cast<std::uint16_t>(base + 3), reduction),
               scalar_int(static_cast<std::uint16_t>(base + 4), kIgnore)};
  return r;
}

TEST(AtenReductions, NllLossForwardAndBackward) {
  std::uint64_t seed = 300;
  for (std::int8_t dt : {kF32, kF64})
    for (bool backward : {false, true})
      for (std::int64_t reduction : {1, 2})
        for (std::int64_t n : {1, 3, 17, 1000})
          for (std::int64_t c : {3, 17}) run_row(nll_row(backward, dt, n, c, reduction), seed++);
  Row none = nll_row(false, kF32, 5, 3, 0);  // reduction none: per-row losses, not generated
  none.outs = {Tensor{0, kF32, {5}, {}}, Tensor{1, kF32, {}, {}}};
  none.generated = false;
  none.why = "its reduction is not mean or sum";
  run_row(none, seed++);
}

// native_batch_norm in training (input [N, C, plane...], [weight 1, bias 2], [running_mean 3,
// running_var 4] -> Y, save_mean, save_invstd) and native_batch_norm_backward with train set
// (grad_out 0, input 1, [weight 2], save_mean 5, save_invstd 6 -> the results `mask` asks for).
Row batch_norm_row(bool backward, std::int8_t dt, Sizes sizes, bool affine, bool running = true,
                   unsigned mask = 7) {
  Row r;
  r.op = backward ? "aten::native_batch_norm_backward" : "aten::native_batch_norm";
  r.name = r.op + dt_text(dt);
  for (std::int64_t s : sizes) r.name += std::to_string(s) + ",";
  r.name += std::string("]") + (affine ? " affine" : "") + (running ? " running" : "") + " mask " +
            std::to_string(mask);
  const Sizes ch{sizes[1]};
  const auto none = [&](std::initializer_list<std::uint16_t> args) {
    for (std::uint16_t a : args) r.scalars.push_back(scalar_record(K::None, a, 0));
  };
  if (!backward) {
    r.ins = {Tensor{0, dt, sizes, {}}};
    if (affine) r.ins.insert(r.ins.end(), {Tensor{1, dt, ch, {}}, Tensor{2, dt, ch, {}}});
    if (!affine) none({1, 2});
    if (running) r.ins.insert(r.ins.end(), {Tensor{3, dt, ch, {}}, Tensor{4, dt, ch, {}}});
    if (!running) none({3, 4});
    r.outs = {Tensor{0, dt, sizes, {}}, Tensor{1, dt, ch, {}}, Tensor{2, dt, ch, {}}};
    r.scalars.push_back(scalar_record(K::Bool, 5, 1));
    r.scalars.push_back(scalar_double(6, 0.1));
    r.scalars.push_back(scalar_double(7, 1e-5));
    return r;
  }
  r.ins = {Tensor{0, dt, sizes, {}}, Tensor{1, dt, sizes, {}}};
  if (affine) r.ins.push_back(Tensor{2, dt, ch, {}});
  if (!affine) none({2});
  none({3, 4});
  r.ins.insert(r.ins.end(), {Tensor{5, dt, ch, {}}, Tensor{6, dt, ch, {}}});
  r.scalars.push_back(scalar_record(K::Bool, 7, 1));
  r.scalars.push_back(scalar_double(8, 1e-5));
  output_mask(r, 9, mask, dt, sizes, ch);
  return r;
}

TEST(AtenReductions, BatchNormForwardAndBackward) {
  std::uint64_t seed = 500;
  // planes shorter than a 32-byte vector, of whole vectors, with tails, odd and even (float64's
  // last element of an odd plane is fused), one image and several, and one of 131072 elements
  // that runs in parts of whole channels on two threads or more
  const std::vector<Sizes> shapes{{1, 1, 2},    {3, 5, 3},     {2, 3, 2, 4}, {3, 4, 7},
                                  {2, 2, 17},   {1, 3, 1, 49}, {4, 2, 5, 5}, {2, 3, 1000},
                                  {3, 1, 8, 8}, {4, 8, 64, 64}};
  for (std::int8_t dt : {kF32, kF64})
    for (bool backward : {false, true})
      for (const Sizes& sz : shapes)
        for (bool affine : {false, true}) run_row(batch_norm_row(backward, dt, sz, affine), seed++);
  for (std::int8_t dt : {kF32, kF64}) {
    run_row(batch_norm_row(false, dt, {3, 4, 9}, true, false), seed++);  // no running statistics
    for (unsigned mask : {1u, 2u, 4u, 6u})                               // some results only
      run_row(batch_norm_row(true, dt, {3, 4, 9}, true, true, mask), seed++);
  }
  Row flat = batch_norm_row(false, kF32, {16, 5}, true);  // (N, C): per-thread buffers
  flat.generated = false;
  flat.why = "per-thread buffers";
  run_row(flat, seed++);
  Row flat_bwd = batch_norm_row(true, kF64, {16, 5, 1, 1}, true);
  flat_bwd.generated = false;
  flat_bwd.why = "per-thread buffers";
  run_row(flat_bwd, seed++);
  Row eval = batch_norm_row(false, kF32, {2, 3, 8}, true);  // evaluation mode
  eval.scalars[eval.scalars.size() - 3] = scalar_record(K::Bool, 5, 0);
  eval.outs[1].sizes = eval.outs[2].sizes = {0};  // ATen's statistics are empty then
  eval.generated = false;
  eval.why = "not in training mode";
  run_row(eval, seed++);
  Row strided = batch_norm_row(false, kF64, {2, 3, 4}, false);  // channels last
  strided.ins[0].strides = {12, 1, 3};
  strided.generated = false;
  strided.why = "not dense in row-major order";
  run_row(strided, seed++);
  Row one_channel = batch_norm_row(true, kF32, {4, 1, 9, 9}, true);  // suggests channels-last
  one_channel.ins[1].strides = {81, 1, 9, 1};
  one_channel.generated = false;
  one_channel.why = "strides other than row-major on a dim of size 1";
  run_row(one_channel, seed++);
  // seeded random shapes: N 1..6, C 1..9, a plane of 2..300 elements as one or two dims
  std::mt19937_64 rng(0xb47c);
  std::uniform_int_distribution<std::int64_t> images(1, 6), channels(1, 9), plane(2, 300);
  for (int i = 0; i < 24; ++i) {
    const std::int64_t n = images(rng), c = channels(rng), hw = plane(rng);
    const Sizes sz = i % 3 == 0 ? Sizes{n, c, hw} : Sizes{n, c, hw, i % 3 + 1};
    run_row(batch_norm_row(i % 2 == 1, i % 4 < 2 ? kF32 : kF64, sz, i % 5 != 0), seed++);
  }
}

// max.dim / min.dim (self -> values, indices) and argmax / argmin (self -> indices) over `dim`
// of `sizes` (argmax/argmin: no dim, the whole tensor, when dim is std::nullopt).
Row arg_row(const std::string& op, std::int8_t dt, Sizes sizes, std::optional<std::int64_t> dim,
            bool keepdim = false) {
  Row r;
  r.op = op;
  r.name = op + dt_text(dt);
  for (std::int64_t s : sizes) r.name += std::to_string(s) + ",";
  r.name +=
      "] dim " + (dim ? std::to_string(*dim) : std::string("none")) + (keepdim ? " keepdim" : "");
  r.ins = {Tensor{0, dt, sizes, {}}};
  Sizes out;
  if (dim) {
    const std::int64_t d = *dim < 0 ? *dim + static_cast<std::int64_t>(sizes.size()) : *dim;
    for (std::size_t k = 0; k < sizes.size(); ++k)
      if (static_cast<std::int64_t>(k) != d)
        out.push_back(sizes[k]);
      else if (keepdim)
        out.push_back(1);
  }
  const bool arg = op == "aten::argmax" || op == "aten::argmin";
  if (!arg) r.outs.push_back(Tensor{0, dt, out, {}});
  r.outs.push_back(Tensor{arg ? 0u : 1u, dtype::kInt64, out, {}});
  r.scalars = {dim ? scalar_int(1, *dim) : scalar_record(K::None, 1, 0),
               scalar_record(K::Bool, 2, keepdim ? 1 : 0)};
  return r;
}

TEST(AtenReductions, MaxMinArgmaxArgmin) {
  std::uint64_t seed = 600;
  const std::vector<std::string> ops{"aten::max.dim", "aten::min.dim", "aten::argmax",
                                     "aten::argmin"};
  for (std::int8_t dt : {kF32, kF64})
    for (const std::string& op : ops) {
      for (std::int64_t cols : last_cols()) run_row(arg_row(op, dt, {5, cols}, 1), seed++);
      run_row(arg_row(op, dt, {7, 1000}, 0, true), seed++);  // a leading dim, keepdim
      run_row(arg_row(op, dt, {3, 17, 4}, -2), seed++);      // a middle dim
      run_row(arg_row(op, dt, {2, 70000}, -1), seed++);      // split over rows
      if (op.starts_with("aten::arg")) run_row(arg_row(op, dt, {9, 13}, std::nullopt), seed++);
    }
  Row transposed = arg_row("aten::max.dim", kF32, {4, 6}, 1);
  transposed.ins[0].strides = {1, 4};
  transposed.generated = false;
  transposed.why = "not dense in row-major order";
  run_row(transposed, seed++);
}

// amax or amin over `dims` ({}: every dim) of `sizes`: a NaN's bits and a zero's sign are ATen's.
Row extreme_row(const std::string& op, std::int8_t dt, Sizes sizes, Sizes dims,
                bool keepdim = false) {
  Sizes all(sizes.size());
  std::iota(all.begin(), all.end(), 0);
  Row r = sum_row(op, dt, std::move(sizes), dims.empty() ? all : dims, keepdim);
  r.scalars.pop_back();  // amax has no dtype
  if (dims.empty())
    r.scalars = {scalar_record(K::ListBegin, 1, 0, 0), scalar_record(K::Bool, 2, keepdim ? 1 : 0)};
  r.exact_nans = true;
  return r;
}

TEST(AtenReductions, AmaxAmin) {
  std::uint64_t seed = 700;
  for (std::int8_t dt : {kF32, kF64})
    for (const std::string op : {"aten::amax", "aten::amin"}) {
      for (std::int64_t cols : {2, 3, 17, 31, 32, 33, 1000})  // rows
        run_row(extreme_row(op, dt, {5, cols}, {1}), seed++);
      for (std::int64_t cols : {3, 16, 32, 40, 100})  // columns: whole 4W groups and the rest
        run_row(extreme_row(op, dt, {7, cols}, {0}, true), seed++);
      run_row(extreme_row(op, dt, {3, 4, 50}, {1, 2}), seed++);  // two inner dims
      run_row(extreme_row(op, dt, {6, 5, 33}, {0, 1}), seed++);  // two outer dims
      run_row(extreme_row(op, dt, {2, 70000}, {1}), seed++);     // split over rows
      run_row(extreme_row(op, dt, {32768}, {}), seed++);         // one result, at the limit
      Row split = extreme_row(op, dt, {40000}, {});
      split.generated = false;
      split.why = "more than 32768 elements";
      run_row(split, seed++);
      Row around = extreme_row(op, dt, {3, 4, 5}, {0, 2});
      around.generated = false;
      around.why = "neither all innermost nor all outermost";
      run_row(around, seed++);
      Row single = extreme_row(op, dt, {4, 1}, {1});
      single.generated = false;
      single.why = "no dim of size above 1 is reduced";
      run_row(single, seed++);
    }
}

// var.correction, std.correction, var_mean.correction or std_mean.correction over `dims`
// (none: dim=None); correction none, an int or a double.
Row var_row(const std::string& op, std::int8_t dt, Sizes sizes, std::optional<Sizes> dims,
            std::optional<double> correction, bool keepdim = false, bool int_correction = false) {
  Row r;
  r.op = op;
  r.name = op + dt_text(dt);
  for (std::int64_t s : sizes) r.name += std::to_string(s) + ",";
  r.name += "] dims";
  for (std::int64_t d : dims.value_or(Sizes{})) r.name += " " + std::to_string(d);
  r.name += " correction " + (correction ? std::to_string(*correction) : std::string("none"));
  r.center = 1000.0;  // a large mean and a small spread: another order changes the last bits
  r.ins = {Tensor{0, dt, sizes, {}}};
  Sizes out;
  for (std::size_t d = 0; d < sizes.size(); ++d) {
    const auto nd = static_cast<std::int64_t>(sizes.size());
    const bool reduced = !dims || std::ranges::any_of(*dims, [&](std::int64_t x) {
      return (x < 0 ? x + nd : x) == static_cast<std::int64_t>(d);
    });
    if (!reduced)
      out.push_back(sizes[d]);
    else if (keepdim)
      out.push_back(1);
  }
  r.outs = {Tensor{0, dt, out, {}}};
  if (op.find("_mean") != std::string::npos) r.outs.push_back(Tensor{1, dt, out, {}});
  if (dims) {
    r.scalars.push_back(
        scalar_record(K::ListBegin, 1, 0, static_cast<std::uint32_t>(dims->size())));
    for (std::int64_t d : *dims) r.scalars.push_back(scalar_int(1, d));
  } else {
    r.scalars.push_back(scalar_record(K::None, 1, 0));
  }
  r.scalars.push_back(!correction      ? scalar_record(K::None, 2, 0)
                      : int_correction ? scalar_int(2, static_cast<std::int64_t>(*correction))
                                       : scalar_double(2, *correction));
  r.scalars.push_back(scalar_record(K::Bool, 3, keepdim ? 1 : 0));
  return r;
}

TEST(AtenReductions, VarStdVarMeanStdMean) {
  std::uint64_t seed = 700;
  const std::vector<std::string> ops{"aten::var.correction", "aten::std.correction",
                                     "aten::var_mean.correction", "aten::std_mean.correction"};
  for (std::int8_t dt : {kF32, kF64})
    for (const std::string& op : ops) {
      for (std::int64_t cols : last_cols())
        run_row(var_row(op, dt, {5, cols}, Sizes{1}, std::nullopt), seed++);
      run_row(var_row(op, dt, {7, 1000}, Sizes{0}, 0.0, true, true), seed++);  // leading, keepdim
      run_row(var_row(op, dt, {3, 17, 4}, Sizes{-2}, 2.0, false, true), seed++);  // middle
      run_row(var_row(op, dt, {3, 5, 7, 2}, Sizes{1, 2}, 0.5), seed++);           // a block of dims
      run_row(var_row(op, dt, {2, 70000}, Sizes{-1}, 1.0), seed++);               // split over rows
      run_row(var_row(op, dt, {4, 1000, 20}, Sizes{1}, 1.0), seed++);  // split, 20 results a row
      // n <= correction: ATen's call at launch (it warns); a NaN correction: m2 / 0
      run_row(var_row(op, dt, {300, 4}, Sizes{0}, 400.0), seed++);
      run_row(var_row(op, dt, {5, 17}, Sizes{1}, std::nan("")), seed++);
      // One result (var and std: ATen's two passes about torch.mean's value): every dim, a
      // dim list that leaves only dims of size 1, keepdim, corrections 0, 1, 2, 0.5 and NaN, one
      // to 32768 elements; past that ATen's threads split it: its call.
      run_row(var_row(op, dt, {9, 13}, std::nullopt, 1.0, false, true), seed++);
      run_row(var_row(op, dt, {1, 5000}, Sizes{1}, 0.0, true, true), seed++);
      run_row(var_row(op, dt, {3, 1, 7}, Sizes{0, 2}, 2.0, false, true), seed++);
      run_row(var_row(op, dt, {6, 7}, std::nullopt, 0.5), seed++);
      run_row(var_row(op, dt, {17}, Sizes{0}, std::nan("")), seed++);
      run_row(var_row(op, dt, {1}, std::nullopt, 0.0), seed++);
      run_row(var_row(op, dt, {2}, Sizes{0}, 2.0), seed++);  // n <= correction: ATen's call
      for (std::int64_t n : {7, 8, 31, 1003, 32768})
        run_row(var_row(op, dt, {n}, std::nullopt, std::nullopt), seed++);
      Row big = var_row(op, dt, {40000}, Sizes{0}, std::nullopt);
      big.generated = false;
      big.why = "more than 32768 elements";
      run_row(big, seed++);
    }
  Row blocks = var_row("aten::var.correction", kF32, {4, 6, 5}, Sizes{0, 2}, std::nullopt);
  blocks.generated = false;
  blocks.why = "not one block";
  run_row(blocks, seed++);
  Row transposed = var_row("aten::std.correction", kF64, {4, 6}, Sizes{1}, std::nullopt);
  transposed.ins[0].strides = {1, 4};
  transposed.generated = false;
  transposed.why = "not dense in row-major order";
  run_row(transposed, seed++);
}

// Every family at shapes drawn at random (seeded): rows 1..40, a last dim of 2..3000.
TEST(AtenReductions, RandomShapes) {
  const std::string& no_math = vessel::provide_aten_vector_math();
  std::mt19937_64 rng(0x5eed);
  std::uniform_int_distribution<std::int64_t> rows(1, 40), cols(2, 3000);
  std::uniform_int_distribution<int> family(0, 5);
  std::uint64_t seed = 400;
  for (int i = 0; i < 60; ++i) {
    const std::int8_t dt = i % 2 ? kF64 : kF32;
    const std::int64_t r = rows(rng), c = cols(rng);
    switch (family(rng)) {
      case 0: run_row(sum_row("aten::sum.dim_IntList", dt, {r, c}, {1}, false), seed++); break;
      case 1: {
        Row m = sum_row("aten::mean.dim", dt, {c, r}, {0}, false);
        // misc/ATEN_ORDER.md 2.6: ATen's threads split such a float32 outer sum by columns, and
        // a last range of 4 to 7 columns takes its scalar path
        if (dt == kF32 && r * c >= 32768 && r > 32 && r % 32 >= 4 && r % 32 < 8) {
          m.generated = false;
          m.why = "whose last 4 to 7 columns";
        }
        run_row(m, seed++);
        break;
      }
      case 2:
        if (no_math.empty()) run_row(softmax_row("aten::_log_softmax", dt, {r, c}, 1), seed++);
        break;
      case 3:
        if (no_math.empty())
          run_row(softmax_row("aten::_softmax_backward_data", dt, {r, c}, -1), seed++);
        break;
      case 4: run_row(layer_norm_row(dt, r, c, i % 4 < 2), seed++); break;
      default: run_row(nll_row(i % 3 == 0, dt, c, r + 1, 1 + i % 2), seed++); break;
    }
  }
}

}  // namespace
}  // namespace crucible::mimic
