// aten_conformance_test — the conformance table (conformance_rows.h) against ATen itself: each
// row's plan runs on the null backend with the ATen provider (Note [ATen provider]), and that
// is the reference for
//  - the CPU backend (its generated kernels, library calls through the same provider): a
//    BITEXACT_STRICT kernel gives ATen's bits or is not generated;
//  - the plain-loop reference that conformance_test checks every backend against, so that
//    test's oracle is ATen's arithmetic too (where it means to be: not for sqrt or exp, nor for an
//    alpha other than 1 or -1, which the CPU backend leaves to ATen).
// Inputs carry NaN, ±Inf, ±0, subnormals and huge values; each row runs with its recorded
// scalars, then with every scalar and Python number patched. Bit for bit, any NaN matching any
// NaN.
#include <gtest/gtest.h>

#include <memory>
#include <random>

#include "AtenProvider.h"
#include "crucible/core/ContentHash.h"
#include "conformance_rows.h"
#include "crucible/exec/NullBackend.h"
#include "crucible/exec/Runner.h"
#include "crucible/exec/VerifyPlan.h"
#include "crucible/mimic/CpuBackend.h"

namespace crucible::mimic {
namespace {

using namespace test;

double element(const std::vector<char>& b, std::int8_t dt, std::int64_t i) {
  if (dt == kF64) {
    double x;
    std::memcpy(&x, b.data() + i * 8, 8);
    return x;
  }
  float x;
  std::memcpy(&x, b.data() + i * 4, 4);
  return x;
}

// `what`'s buffers against ATen's, binding by binding.
void expect_same(const RunBuffers& aten, const RunBuffers& got, const Dtypes& dts,
                 std::string_view what, const exec::ExecutionPlan& plan) {
  auto check = [&](const std::vector<char>& a, const std::vector<char>& g, std::int8_t dt,
                   const char* kind, std::size_t i) {
    const std::int64_t d = first_difference(a, g, dt);
    if (d < 0) return;
    ADD_FAILURE() << what << ": " << kind << " binding " << i << " element " << d << " is "
                  << std::hexfloat << element(g, dt, d) << ", ATen's is " << element(a, dt, d)
                  << std::defaultfloat << "\n" << exec::describe(plan);
  };
  for (std::size_t i = 0; i < got.inputs.size(); ++i)
    check(aten.inputs[i], got.inputs[i], dts.inputs[i], "input", i);
  for (std::size_t i = 0; i < got.outputs.size(); ++i)
    check(aten.outputs[i], got.outputs[i], dts.outputs[i], "output", i);
}

std::string ops_of(const ChainSpec& c) {
  std::string s = c.name + ":";
  for (const StepSpec& st : c.steps) s += " " + st.op;
  return s;
}

// Whether each step of the row is an ATen call: its output has the shape ATen gives it (its
// operands' broadcast; an in-place step's first operand). The table also holds chains whose
// unary steps broadcast a smaller operand to the chain's shape, which the CPU backend's
// semantics allow and no ATen program records.
bool aten_shaped(const ChainSpec& c) {
  auto shape_of = [&](int x) { return x >= 0 ? c.inputs[x].sizes : c.shape; };
  for (const StepSpec& st : c.steps) {
    if (host_read_step(st.op)) continue;
    std::vector<std::int64_t> b;
    for (int x : st.in) {
      if (x >= 0 && c.inputs[x].wrapped) continue;  // a Python number: 0-d
      const std::vector<std::int64_t> s = shape_of(x);
      if (s.size() > b.size()) b.insert(b.begin(), s.size() - b.size(), 1);
      for (std::size_t i = 0; i < s.size(); ++i) {
        std::int64_t& d = b[b.size() - s.size() + i];
        d = d == 1 ? s[i] : d;
      }
    }
    const bool in_place = st.op.find("_.") != std::string::npos || st.op.back() == '_';
    if (b != c.shape || (in_place && shape_of(st.in[0]) != c.shape)) return false;
  }
  return true;
}

// Whether no input of step `si` is broadcast: each has the chain's shape (a step's output
// always has it).
bool step_unbroadcast(const ChainSpec& c, std::size_t si) {
  for (int x : c.steps[si].in)
    if (x >= 0 && (c.inputs[x].wrapped || c.inputs[x].sizes != c.shape)) return false;
  return true;
}

// Whether the plain-loop reference is meant to give ATen's bits for this run: it computes sqrt as
// IEEE sqrt and exp as libm's, which ATen's vector kernels are not (1 ulp apart on some
// inputs), and rounds `a + alpha*b` as ATen does only for a step without
// a broadcast input (Note [ATen's alpha rounding]; the CPU backend leaves the others to ATen).
bool loops_are_aten(const ChainSpec& c, const std::vector<record::ScalarRecord>& scalars) {
  std::size_t i = 0;
  for (std::size_t si = 0; si < c.steps.size(); ++si) {
    const StepSpec& st = c.steps[si];
    if (st.op.find("sqrt") != std::string::npos || st.op.find("exp") != std::string::npos)
      return false;
    if ((st.op.starts_with("aten::addcmul") || st.op.starts_with("aten::lerp")) &&
        !step_unbroadcast(c, si))
      return false;
    const bool alpha_op = (st.op.starts_with("aten::add") && !st.op.starts_with("aten::addc")) ||
                          st.op.starts_with("aten::sub");
    for (std::size_t k = 0; k < st.scalars.size(); ++k, ++i) {
      const record::ScalarRecord& r = scalars[i];
      if (!alpha_op || r.arg_index != 2 || step_unbroadcast(c, si)) continue;
      const double v = r.kind == record::ScalarKind::Double
                           ? std::bit_cast<double>(r.bits)
                           : static_cast<double>(static_cast<std::int64_t>(r.bits));
      if (v != 1.0 && v != -1.0) return false;
    }
  }
  return true;
}

void run_row(const ChainSpec& c, std::uint64_t seed) {
  SCOPED_TRACE(ops_of(c));
  const BuiltPlan bp = build_chain_plan(c);
  ASSERT_TRUE(exec::verify_plan(bp.plan).ok()) << exec::verify_plan(bp.plan);
  const Dtypes dts = binding_dtypes(c, bp);
  vessel::AtenProvider aten_ref, aten_lib;
  auto reference = exec::Runner::make(bp.plan, exec::null_backend(), aten_ref.provider());
  ASSERT_TRUE(reference.ok()) << reference.status();
  auto cpu = CpuBackend::make(CpuBackendOptions::memory_only());
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  auto generated = exec::Runner::make(bp.plan, (*cpu)->backend(), aten_lib.provider());
  ASSERT_TRUE(generated.ok()) << generated.status();
  EXPECT_EQ((*cpu)->generated_kernels(), coverable_kernels(bp.plan));
  EXPECT_EQ(generated_call_count(**cpu), covered_calls(bp.plan));
  std::mt19937_64 rng(seed);
  for (int patch = 0; patch < 2; ++patch) {
    SCOPED_TRACE(patch ? "patched" : "recorded");
    const RunBuffers initial = initial_buffers(bp, dts, rng);
    const Patches p = patches_for(c, bp, patch != 0);
    RunBuffers aten = initial, gen = initial, loops = initial;
    const Status st = run(**reference, aten, p);
    ASSERT_TRUE(st.ok()) << st;
    const Status sg = run(**generated, gen, p);
    ASSERT_TRUE(sg.ok()) << sg;
    // any alpha, value or weight, no broadcast, contiguous: generated code ran
    if (c.name.starts_with("alpha_ranges") || c.name.starts_with("adamw_")) {
      EXPECT_EQ((*cpu)->library_launches(), 0u);
    }
    expect_same(aten, gen, dts, "the cpu backend", bp.plan);
    if (loops_are_aten(c, p.scalars)) {
      reference_run(c, bp, loops, p.scalars, p.numbers);
      expect_same(aten, loops, dts, "the plain-loop reference", bp.plan);
    }
  }
}

TEST(AtenConformance, FixedRows) {
  std::uint64_t seed = 1;
  for (const ChainSpec& c : fixed_rows()) {
    EXPECT_TRUE(aten_shaped(c)) << c.name;
    run_row(c, seed++);
  }
}

TEST(AtenConformance, EveryCoveredOp) {
  std::uint64_t seed = 50;
  for (const ChainSpec& c : one_op_rows()) run_row(c, seed++);
}

TEST(AtenConformance, RandomChains) {
  std::uint64_t seed = 100;
  int run = 0;
  for (const ChainSpec& c : random_rows(200, 0x5eed))
    if (aten_shaped(c)) run_row(c, seed++), ++run;
  EXPECT_GE(run, 60) << "random chains that are ATen programs";
}

// The spacing of dtype dt's values at |x| (1 ulp).
double ulp(double x, std::int8_t dt) {
  x = std::fabs(x);
  if (dt == kF64) return std::nextafter(x, INFINITY) - x;
  const float f = static_cast<float>(x);
  return static_cast<double>(std::nextafter(f, INFINITY)) - static_cast<double>(f);
}

// numerics="fast" (Note [Fast numerics], CpuBackend.cpp) against ATen, op by op, element by
// element: sqrt within 1 ulp of ATen's; a + c*b (add with an alpha, addcmul, lerp) within
// 1 ulp of the product c*b (as rounded) plus 1 ulp of ATen's result, the bound of rounding
// once where ATen rounds twice or the reverse. With a transposed operand the fast kernel's
// strided loop rounds twice where ATen rounds once: generated code that the bit-exact backend
// leaves to ATen. Non-finite results are ATen's exactly, except where the product overflows in
// one rounding and not in the other (-inf + 3.4e38 is -inf, -inf + inf is NaN).
TEST(AtenConformance, FastNumericsStayWithinTheirBoundOfAten) {
  const std::vector<std::int64_t> shape{317, 331};
  std::uint64_t seed = 300;
  for (std::int8_t dt : {kF32, kF64}) {
    for (bool transposed : {false, true}) {
      TensorSpec a{dt, shape, {}, 0, false, 0}, b = a, c = a;
      if (transposed) b.strides = {1, 317};
      const std::vector<ChainSpec> rows = {
          {"sqrt", shape, {a}, {step("aten::sqrt", {0}, {}, dt)}},
          {"add_alpha", shape, {a, b}, {step("aten::add.Tensor", {0, 1}, {scalar_double(2, 0.3)}, dt)}},
          {"addcmul", shape, {a, b, c}, {step("aten::addcmul", {0, 1, 2}, {scalar_double(3, 0.3)}, dt)}},
          {"lerp_small", shape, {a, b}, {step("aten::lerp.Scalar", {0, 1}, {scalar_double(2, 0.3)}, dt)}},
          {"lerp_large", shape, {a, b}, {step("aten::lerp.Scalar", {0, 1}, {scalar_double(2, 0.8)}, dt)}},
      };
      for (const ChainSpec& row : rows) {
        SCOPED_TRACE(row.name + (dt == kF64 ? " f64" : " f32") + (transposed ? " transposed" : ""));
        const BuiltPlan bp = build_chain_plan(row);
        const Dtypes dts = binding_dtypes(row, bp);
        vessel::AtenProvider aten_ref, aten_lib;
        auto reference = exec::Runner::make(bp.plan, exec::null_backend(), aten_ref.provider());
        ASSERT_TRUE(reference.ok()) << reference.status();
        CpuBackendOptions o = CpuBackendOptions::memory_only();
        o.fast = true;
        auto cpu = CpuBackend::make(o);
        ASSERT_TRUE(cpu.ok()) << cpu.status();
        auto fast = exec::Runner::make(bp.plan, (*cpu)->backend(), aten_lib.provider());
        ASSERT_TRUE(fast.ok()) << fast.status();
        ASSERT_EQ((*cpu)->generated_kernels(), 1u);
        ASSERT_NE((*cpu)->kernels()[0].recipe, nullptr);
        EXPECT_EQ((*cpu)->kernels()[0].recipe->determinism, forge::Determinism::Ordered);
        std::mt19937_64 rng(seed++);
        const RunBuffers initial = initial_buffers(bp, dts, rng);
        const Patches p = patches_for(row, bp, false);
        RunBuffers want = initial, got = initial;
        ASSERT_TRUE(run(**reference, want, p).ok());
        ASSERT_TRUE(run(**fast, got, p).ok());
        EXPECT_EQ((*cpu)->library_launches(), 0u);

        std::vector<View> in;
        for (std::size_t k = 0; k < row.inputs.size(); ++k) {
          const TensorSpec& t = row.inputs[k];
          char* base = const_cast<char*>(initial.inputs[bp.input_slot_of[k]].data());
          in.push_back(view_of(base, dt, t.sizes, t.strides.empty() ? contiguous_strides(t.sizes) : t.strides, shape));
        }
        const std::int64_t out = bp.step_output_binding[0];
        ASSERT_GE(out, 0);
        const View vw{want.outputs[out].data(), dt, contiguous_strides(shape)};
        const View vg{got.outputs[out].data(), dt, contiguous_strides(shape)};
        auto round = [&](double x) { return dt == kF64 ? x : static_cast<double>(static_cast<float>(x)); };
        const double w = row.name == "lerp_large" ? 0.8 : 0.3;
        std::int64_t bad = 0, differ = 0;
        for (std::int64_t i = 0; i < numel(shape); ++i) {
          const double r = read(vw, shape, i), g = read(vg, shape, i);
          if (std::isnan(r) && std::isnan(g)) continue;
          double bound = ulp(r, dt), m = 0;
          if (row.name != "sqrt") {
            const double x = read(in[0], shape, i), y = read(in[1], shape, i);
            if (row.name == "add_alpha") m = round(round(0.3) * y);
            if (row.name == "addcmul") m = round(round(round(0.3) * y) * read(in[2], shape, i));
            if (row.name.starts_with("lerp")) m = round((w < 0.5 ? round(w) : round(round(w) - 1)) * round(y - x));
            bound += ulp(m, dt);
          }
          if (!std::isfinite(r) || !std::isfinite(g)) {
            // A product that overflows rounded alone, not inside the fma: inf or NaN.
            if (r != g && std::isfinite(m) && bad++ < 3)
              ADD_FAILURE() << "element " << i << ": " << g << ", ATen's " << r;
            continue;
          }
          differ += r != g;
          if (std::fabs(r - g) > bound && bad++ < 3)
            ADD_FAILURE() << "element " << i << ": " << std::hexfloat << g << ", ATen's "
                          << r << ", bound " << bound << std::defaultfloat;
        }
        EXPECT_EQ(bad, 0);
        if (row.name == "sqrt" || (transposed && aten_alpha_rounding() == AlphaRounding::Once)) {
          EXPECT_GT(differ, 0) << "the fast kernel gave ATen's bits: the bound is not tested";
        }
      }
    }
  }
}

// The provider itself: an operator this torch lacks and an argument the records cannot give
// back are errors that name them; a functional operator with no out= overload is computed and
// copied into place.
TEST(AtenProvider, RefusesWhatItCannotRun) {
  vessel::AtenProvider p;
  exec::LibraryCall lc;
  lc.op = "aten::no_such_operator_anywhere";
  Status st = p.call(lc);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(std::string(st.message()).find("no operator aten::no_such_operator_anywhere"),
            std::string::npos)
      << st;

  float x[4] = {1, 2, 3, 4}, y[4] = {};
  const std::int64_t sizes[1] = {4}, strides[1] = {1};
  exec::TensorArg in{x, dtype::kFloat32, false, sizes, strides, 0, 0, 0};
  exec::TensorArg out{y, dtype::kFloat32, false, sizes, strides, 0, 0, 1};
  lc.op = "aten::add.Tensor";  // `other` (argument 1) has no tensor
  lc.inputs = std::span<const exec::TensorArg>(&in, 1);
  lc.outputs = std::span<const exec::TensorArg>(&out, 1);
  st = p.call(lc);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(std::string(st.message()).find("argument 'other'"), std::string::npos) << st;

  // gelu(approximate="tanh"): the string comes back from its hash.
  record::ScalarRecord s;
  s.kind = record::ScalarKind::String;
  s.arg_index = 1;
  s.bits = hash64("tanh");
  lc.op = "aten::gelu";
  lc.scalars = std::span<const record::ScalarRecord>(&s, 1);
  st = p.call(lc);
  ASSERT_TRUE(st.ok()) << st;
  for (int i = 0; i < 4; ++i) {
    const float v = x[i];
    const float want = 0.5f * v * (1.0f + std::tanh(0.7978845608f * (v + 0.044715f * v * v * v)));
    EXPECT_NEAR(y[i], want, 1e-5f) << i;
  }
  s.bits = hash64("a string nobody records");
  st = p.call(lc);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(std::string(st.message()).find("argument 'approximate'"), std::string::npos) << st;
}

// Lists, optional and boolean arguments come back from their records: sum over int[] dims with
// keepdim and no dtype, and cat of a Tensor[]; both through their out= overloads.
TEST(AtenProvider, ListsOptionalsAndTensorLists) {
  vessel::AtenProvider p;
  using record::ScalarKind;
  float x[6] = {1, 2, 3, 4, 5, 6}, s[2] = {};
  const std::int64_t xs[2] = {2, 3}, xst[2] = {3, 1}, ss[1] = {2}, sst[1] = {1};
  const exec::TensorArg in{x, dtype::kFloat32, false, xs, xst, 0, 0, 0};
  const exec::TensorArg out{s, dtype::kFloat32, false, ss, sst, 0, 0, 1};
  const record::ScalarRecord sum_args[] = {
      scalar_record(ScalarKind::ListBegin, 1, 0, 1), scalar_record(ScalarKind::Int, 1, 1),
      scalar_record(ScalarKind::Bool, 2, 0), scalar_record(ScalarKind::None, 3, 0)};
  exec::LibraryCall lc;
  lc.op = "aten::sum.dim_IntList";
  lc.inputs = std::span<const exec::TensorArg>(&in, 1);
  lc.outputs = std::span<const exec::TensorArg>(&out, 1);
  lc.scalars = sum_args;
  Status st = p.call(lc);
  ASSERT_TRUE(st.ok()) << st;
  EXPECT_EQ(s[0], 6.0f);
  EXPECT_EQ(s[1], 15.0f);

  float a[2] = {1, 2}, b[3] = {3, 4, 5}, y[6] = {};
  const std::int64_t as[1] = {2}, bs[1] = {3}, ys[1] = {5}, one[1] = {1};
  const exec::TensorArg ins[2] = {{a, dtype::kFloat32, false, as, one, 0, 0, 0},
                                  {b, dtype::kFloat32, false, bs, one, 0, 1, 1}};
  const exec::TensorArg cat_out{y, dtype::kFloat32, false, ys, one, 0, 0, 2};
  const record::ScalarRecord cat_args[] = {scalar_record(ScalarKind::TensorList, 0, 0, 2),
                                           scalar_record(ScalarKind::Int, 1, 0)};
  lc.op = "aten::cat";
  lc.inputs = ins;
  lc.outputs = std::span<const exec::TensorArg>(&cat_out, 1);
  lc.scalars = cat_args;
  st = p.call(lc);
  ASSERT_TRUE(st.ok()) << st;
  for (int i = 0; i < 5; ++i) EXPECT_EQ(y[i], static_cast<float>(i + 1)) << i;
  EXPECT_EQ(p.stats().out_variant, 2u);

  // An output placed with other sizes than ATen gives the result is an error, not a resize.
  const std::int64_t wrong[1] = {6};
  const exec::TensorArg bad_out{y, dtype::kFloat32, false, wrong, one, 0, 0, 2};
  lc.outputs = std::span<const exec::TensorArg>(&bad_out, 1);
  st = p.call(lc);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(std::string(st.message()).find("has sizes [5] in ATen, the plan placed [6]"),
            std::string::npos)
      << st;
}

// Note [Wrong out= kernels]: mse_loss.out with a reduction resizes its result to the input's
// shape, which placed memory cannot hold: the out= call raises, its result goes back to the
// placed geometry, the functional operator gives the loss, and later calls go to it directly.
TEST(AtenProvider, AnOutOverloadThatRaisesGivesWayToTheFunctionalOperator) {
  vessel::AtenProvider p;
  using record::ScalarKind;
  float a[6] = {1, 2, 3, 4, 5, 6}, b[6] = {0, 2, 5, 4, 1, 6}, loss = -1.0f;
  const std::int64_t sz[2] = {2, 3}, st2[2] = {3, 1};
  const exec::TensorArg ins[2] = {{a, dtype::kFloat32, false, sz, st2, 0, 0, 0},
                                  {b, dtype::kFloat32, false, sz, st2, 1, 0, 1}};
  const exec::TensorArg out{&loss, dtype::kFloat32, false, {}, {}, 0, 0, 2};
  const record::ScalarRecord mean = scalar_record(ScalarKind::Int, 2, 1);  // reduction mean
  exec::LibraryCall lc;
  lc.op = "aten::mse_loss";
  lc.inputs = ins;
  lc.outputs = std::span<const exec::TensorArg>(&out, 1);
  lc.scalars = std::span<const record::ScalarRecord>(&mean, 1);
  for (int call = 0; call < 3; ++call) {
    loss = -1.0f;
    const Status st = p.call(lc);
    ASSERT_TRUE(st.ok()) << st;
    EXPECT_EQ(loss, 3.5f) << call;  // (1 + 0 + 4 + 0 + 16 + 0) / 6
  }
  EXPECT_EQ(p.stats().out_failed, 1u);
  EXPECT_EQ(p.stats().out_variant, 0u);
  EXPECT_EQ(p.stats().functional, 3u);
}

}  // namespace
}  // namespace crucible::mimic
