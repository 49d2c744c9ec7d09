// layer_test.cpp — every layer case PyTorch computed, through the raw kernels and a one-node Net,
// under each instruction set; the two instruction sets agree; shape checks return errors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <iostream>
#include <limits>
#include <string>
#include <vector>

#include "case_util.h"
#include "crucible/runtime/Conv2d.h"
#include "crucible/runtime/Cpu.h"
#include "crucible/runtime/Layers.h"
#include "crucible/runtime/Linear.h"
#include "crucible/runtime/Net.h"

namespace crucible::runtime::test {
namespace {

// Output and workspace buffers start as NaN: an element a kernel forgets to write, or scratch it
// reads before writing, shows up as a mismatch instead of passing on a lucky zero.
constexpr float kPoison = std::numeric_limits<float>::quiet_NaN();
// float32 unit roundoff.
constexpr double kEps = 0x1p-24;

enum class Path : std::uint8_t { Raw, RawInPlace, Net, NetPlain };

const char* path_name(Path p) {
  switch (p) {
    case Path::Raw:
      return "raw";
    case Path::RawInPlace:
      return "raw_in_place";
    case Path::Net:
      return "net";
    case Path::NetPlain:
      return "net_plain";
  }
  return "?";
}

Status harness_error(const std::string& what) { return absl::InternalError(what); }

Conv2dSpec conv_spec(const LayerCase& c) {
  Conv2dSpec s;
  s.in_channels = c.i("in_channels");
  s.out_channels = c.i("out_channels");
  s.kernel_h = c.i("kernel_h");
  s.kernel_w = c.i("kernel_w");
  s.stride_h = c.i("stride_h");
  s.stride_w = c.i("stride_w");
  s.pad_h = c.i("pad_h");
  s.pad_w = c.i("pad_w");
  s.dilation_h = c.i("dilation_h");
  s.dilation_w = c.i("dilation_w");
  s.groups = c.i("groups");
  return s;
}

Pool2dSpec pool_spec(const LayerCase& c) {
  Pool2dSpec s;
  s.kernel_h = c.i("kernel_h");
  s.kernel_w = c.i("kernel_w");
  s.stride_h = c.i("stride_h");
  s.stride_w = c.i("stride_w");
  s.pad_h = c.i("pad_h");
  s.pad_w = c.i("pad_w");
  s.dilation_h = c.i("dilation_h");
  s.dilation_w = c.i("dilation_w");
  s.ceil_mode = c.b("ceil_mode");
  s.count_include_pad = c.b("count_include_pad");
  return s;
}

Pad2dSpec pad_spec(const LayerCase& c) {
  Pad2dSpec s;
  s.left = c.i("left");
  s.right = c.i("right");
  s.top = c.i("top");
  s.bottom = c.i("bottom");
  const std::string mode = c.s("mode");
  s.mode = mode == "reflect"     ? PadMode::Reflect
           : mode == "replicate" ? PadMode::Replicate
                                 : PadMode::Constant;
  s.value = static_cast<float>(c.f("value"));
  return s;
}

std::int64_t norm_dim(std::int64_t dim, std::size_t rank) {
  return dim < 0 ? dim + static_cast<std::int64_t>(rank) : dim;
}

std::int64_t prod(const std::vector<std::int64_t>& s, std::size_t from, std::size_t to) {
  std::int64_t n = 1;
  for (std::size_t i = from; i < to; ++i) n *= s[i];
  return n;
}

bool is_view(const std::string& op) { return op == "flatten" || op == "reshape"; }
bool has_in_place(const std::string& op) {
  return op == "activation" || op == "batchnorm2d" || op == "layernorm" || op == "softmax" ||
         op == "add" || op == "mul";
}

// ---------------------------------------------------------------- raw kernels
Result<Tensor> raw_conv2d(const LayerCase& c) {
  const Conv2dSpec spec = conv_spec(c);
  const Tensor& x = c.inputs[0];
  auto packed = PackedConv2d::make(spec, c.w("weight"), c.w("bias"), parse_activation(c.s("act")));
  if (!packed.ok()) return packed.status();
  const std::int64_t n = x.shape[0], h = x.shape[2], w = x.shape[3];
  auto hw = conv2d_output_hw(spec, h, w);
  if (!hw.ok()) return hw.status();
  Tensor y{{n, spec.out_channels, hw->first, hw->second}, {}};
  y.data.assign(numel(y.shape), kPoison);
  std::vector<float> ws(packed->workspace_floats(h, w), kPoison);
  packed->run(x.data.data(), n, h, w, y.data.data(), ws.data());
  // Again on the now dirty workspace: run() may not rely on what an earlier run left there.
  std::vector<float> again(y.data.size(), kPoison);
  packed->run(x.data.data(), n, h, w, again.data(), ws.data());
  if (std::memcmp(again.data(), y.data.data(), again.size() * sizeof(float)) != 0) {
    return harness_error("a second run() on the reused workspace gave a different output");
  }
  return y;
}

Result<Tensor> raw_linear(const LayerCase& c) {
  const std::int64_t in = c.i("in_features"), out = c.i("out_features");
  auto packed =
      PackedLinear::make(in, out, c.w("weight"), c.w("bias"), parse_activation(c.s("act")));
  if (!packed.ok()) return packed.status();
  const Tensor& x = c.inputs[0];
  const std::int64_t rows = numel(x.shape) / in;
  Tensor y{x.shape, {}};
  y.shape.back() = out;
  y.data.assign(rows * out, kPoison);
  packed->run(x.data.data(), rows, y.data.data());
  return y;
}

// For in-place runs, y starts as a copy of x and the kernel is called with x == y.
Result<Tensor> raw_kernel(const LayerCase& c, bool in_place) {
  const std::string& op = c.op;
  if (op == "conv2d") return raw_conv2d(c);
  if (op == "linear") return raw_linear(c);
  const Tensor& x = c.inputs[0];
  const std::int64_t n = numel(x.shape);
  Tensor y{x.shape, std::vector<float>(n, kPoison)};
  if (in_place) y.data = x.data;
  const float* src = in_place ? y.data.data() : x.data.data();
  if (op == "activation") {
    activation(parse_activation(c.s("act")), src, y.data.data(), n);
    return y;
  }
  if (op == "batchnorm2d") {
    const bool affine = c.b("affine");
    auto a =
        batchnorm_affine(c.w("mean"), c.w("var"), affine ? c.w("gamma") : std::span<const float>(),
                         affine ? c.w("beta") : std::span<const float>(), c.f("eps"));
    if (!a.ok()) return a.status();
    channel_affine(*a, src, y.data.data(), x.shape[0], prod(x.shape, 2, x.shape.size()));
    return y;
  }
  if (op == "layernorm") {
    const std::int64_t cols = numel(c.ints("normalized_shape"));
    const bool affine = c.b("affine");
    layernorm(src, y.data.data(), n / cols, cols, affine ? c.w("gamma").data() : nullptr,
              affine ? c.w("beta").data() : nullptr, static_cast<float>(c.f("eps")));
    return y;
  }
  if (op == "softmax") {
    const auto d = static_cast<std::size_t>(norm_dim(c.i("dim"), x.shape.size()));
    softmax(src, y.data.data(), prod(x.shape, 0, d), x.shape[d],
            prod(x.shape, d + 1, x.shape.size()));
    return y;
  }
  const std::size_t r = x.shape.size();
  if (op == "maxpool2d" || op == "avgpool2d") {
    const Pool2dSpec spec = pool_spec(c);
    const PoolKind kind = op == "maxpool2d" ? PoolKind::Max : PoolKind::Avg;
    auto hw = pool2d_output_hw(kind, spec, x.shape[r - 2], x.shape[r - 1]);
    if (!hw.ok()) return hw.status();
    y.shape[r - 2] = hw->first;
    y.shape[r - 1] = hw->second;
    y.data.assign(numel(y.shape), kPoison);
    (kind == PoolKind::Max ? maxpool2d : avgpool2d)(spec, x.data.data(), prod(x.shape, 0, r - 2),
                                                    x.shape[r - 2], x.shape[r - 1], y.data.data());
    return y;
  }
  if (op == "adaptive_avgpool2d") {
    y.shape[r - 2] = c.i("out_h");
    y.shape[r - 1] = c.i("out_w");
    y.data.assign(numel(y.shape), kPoison);
    adaptive_avgpool2d(x.data.data(), prod(x.shape, 0, r - 2), x.shape[r - 2], x.shape[r - 1],
                       y.shape[r - 2], y.shape[r - 1], y.data.data());
    return y;
  }
  if (op == "pad2d") {
    const Pad2dSpec spec = pad_spec(c);
    auto hw = pad2d_output_hw(spec, x.shape[r - 2], x.shape[r - 1]);
    if (!hw.ok()) return hw.status();
    y.shape[r - 2] = hw->first;
    y.shape[r - 1] = hw->second;
    y.data.assign(numel(y.shape), kPoison);
    pad2d(spec, x.data.data(), prod(x.shape, 0, r - 2), x.shape[r - 2], x.shape[r - 1],
          y.data.data());
    return y;
  }
  if (op == "add" || op == "mul") {
    const Tensor& a = c.inputs[0];
    const Tensor& b = c.inputs[1];
    auto shape = broadcast_shape(a.shape, b.shape);
    if (!shape.ok()) return shape.status();
    Tensor out{*shape, std::vector<float>(numel(*shape), kPoison)};
    const float* pa = a.data.data();
    const float* pb = b.data.data();
    if (in_place) {
      if (a.shape == *shape) {
        out.data = a.data;
        pa = out.data.data();
      } else {
        out.data = b.data;
        pb = out.data.data();
      }
    }
    binary(op == "add" ? BinaryOp::Add : BinaryOp::Mul, pa, a.shape, pb, b.shape, out.data.data());
    return out;
  }
  if (op == "concat") {
    const auto d = static_cast<std::size_t>(norm_dim(c.i("dim"), x.shape.size()));
    std::vector<const float*> xs;
    std::vector<std::int64_t> sizes;
    Tensor out{x.shape, {}};
    out.shape[d] = 0;
    for (const auto& t : c.inputs) {
      xs.push_back(t.data.data());
      sizes.push_back(t.shape[d]);
      out.shape[d] += t.shape[d];
    }
    out.data.assign(numel(out.shape), kPoison);
    concat(xs, sizes, prod(x.shape, 0, d), prod(x.shape, d + 1, x.shape.size()), out.data.data());
    return out;
  }
  return harness_error("no raw kernel for op " + op);
}

// ---------------------------------------------------------------- one-node nets
Value build_node(Net& net, const LayerCase& c, const std::vector<Value>& in) {
  const std::string& op = c.op;
  if (op == "conv2d" || op == "linear") {
    Value v = op == "conv2d" ? net.conv2d(in[0], conv_spec(c), c.w("weight"), c.w("bias"))
                             : net.linear(in[0], c.i("in_features"), c.i("out_features"),
                                          c.w("weight"), c.w("bias"));
    const Activation act = parse_activation(c.s("act"));
    return act == Activation::None ? v : net.activation(v, act);
  }
  if (op == "activation") return net.activation(in[0], parse_activation(c.s("act")));
  if (op == "batchnorm2d") {
    const bool affine = c.b("affine");
    return net.batchnorm2d(in[0], c.w("mean"), c.w("var"),
                           affine ? c.w("gamma") : std::span<const float>(),
                           affine ? c.w("beta") : std::span<const float>(), c.f("eps"));
  }
  if (op == "layernorm") {
    const bool affine = c.b("affine");
    return net.layernorm(in[0], c.ints("normalized_shape"),
                         affine ? c.w("gamma") : std::span<const float>(),
                         affine ? c.w("beta") : std::span<const float>(), c.f("eps"));
  }
  if (op == "softmax") return net.softmax(in[0], c.i("dim"));
  if (op == "maxpool2d") return net.maxpool2d(in[0], pool_spec(c));
  if (op == "avgpool2d") return net.avgpool2d(in[0], pool_spec(c));
  if (op == "adaptive_avgpool2d") return net.adaptive_avgpool2d(in[0], c.i("out_h"), c.i("out_w"));
  if (op == "pad2d") return net.pad2d(in[0], pad_spec(c));
  if (op == "add") return net.add(in[0], in[1]);
  if (op == "mul") return net.mul(in[0], in[1]);
  if (op == "flatten") return net.flatten(in[0], c.i("start_dim"), c.i("end_dim"));
  if (op == "reshape") return net.reshape(in[0], c.ints("shape"));
  if (op == "concat") return net.concat(in, c.i("dim"));
  ADD_FAILURE() << "no Net builder for op " << op;
  return {};
}

Result<Tensor> run_net(const LayerCase& c, const CompileOptions& options) {
  Net net;
  std::vector<Value> in;
  for (std::size_t i = 0; i < c.inputs.size(); ++i) {
    in.push_back(net.input("x" + std::to_string(i), c.inputs[i].shape));
  }
  const Value v = build_node(net, c, in);
  if (v.valid() && net.shape(v) != c.expected.shape) {
    return harness_error("Net::shape() says " + shape_str(net.shape(v)) + ", torch " +
                         shape_str(c.expected.shape));
  }
  net.output("y", v);
  auto plan = net.compile(options);
  if (!plan.ok()) return plan.status();
  expect_arena_properties(*plan, c.name);
  if (plan->input_count() != c.inputs.size() || plan->output_count() != 1) {
    return harness_error("wrong input/output count in the compiled net");
  }
  if (plan->output_shape(0) != c.expected.shape) {
    return harness_error("output_shape() " + shape_str(plan->output_shape(0)) + ", torch " +
                         shape_str(c.expected.shape));
  }
  std::vector<Tensor> copies = c.inputs;  // run() must leave its inputs alone
  std::vector<const float*> ins;
  for (const auto& t : copies) ins.push_back(t.data.data());
  Tensor y{c.expected.shape, std::vector<float>(numel(c.expected.shape), kPoison)};
  std::vector<float> again(y.data.size(), kPoison);
  float* outs[] = {y.data.data()};
  if (Status s = plan->run(ins, outs); !s.ok()) return s;
  outs[0] = again.data();
  if (Status s = plan->run(ins, outs); !s.ok()) return s;
  for (std::size_t i = 0; i < copies.size(); ++i) {
    if (std::memcmp(copies[i].data.data(), c.inputs[i].data.data(),
                    copies[i].data.size() * sizeof(float)) != 0) {
      return harness_error("run() wrote into input " + std::to_string(i));
    }
  }
  if (std::memcmp(again.data(), y.data.data(), again.size() * sizeof(float)) != 0) {
    return harness_error("a second run() gave a different output");
  }
  return y;
}

Result<Tensor> run_case(const LayerCase& c, Path path) {
  switch (path) {
    case Path::Raw:
      return raw_kernel(c, false);
    case Path::RawInPlace:
      return raw_kernel(c, true);
    case Path::Net:
      return run_net(c, CompileOptions{});
    case Path::NetPlain:
      return run_net(c, CompileOptions{false, false, false});
  }
  return harness_error("unknown path");
}

bool applicable(const LayerCase& c, Path path) {
  if (path == Path::Raw) return !is_view(c.op);
  if (path == Path::RawInPlace) {
    if (!has_in_place(c.op)) return false;
    if (c.op == "add" || c.op == "mul") {
      return c.inputs[0].shape == c.expected.shape || c.inputs[1].shape == c.expected.shape;
    }
    return true;
  }
  return true;
}

// Per-op tolerance. conv2d/linear sum K products: float32 rounding of such a sum is bounded by
// K * eps * sum|terms| (`scale` holds sum|terms| per output), for torch and for us, and the
// fused activation's slope is at most 1.13 (GELU): hence 2.4 * K * eps * scale.
std::function<double(std::size_t)> tolerance(const LayerCase& c) {
  const auto& exp = c.expected.data;
  auto rel = [&exp](double atol, double rtol) {
    return [&exp, atol, rtol](std::size_t i) { return atol + rtol * std::fabs(exp[i]); };
  };
  const std::string& op = c.op;
  if (op == "conv2d" || op == "linear") {
    const double k =
        op == "conv2d"
            ? static_cast<double>(
                  c.i("in_channels") / c.i("groups") * c.i("kernel_h") * c.i("kernel_w") + 1)
            : static_cast<double>(c.i("in_features") + 1);
    const auto* scale = &c.scale->data;
    return [&exp, scale, k](std::size_t i) {
      return 1e-5 + 1e-5 * std::fabs(exp[i]) + 2.4 * k * kEps * (*scale)[i];
    };
  }
  if (op == "maxpool2d" || op == "pad2d" || op == "concat" || is_view(op)) return rel(0, 0);
  if (op == "add" || op == "mul") return rel(0, 1e-7);
  if (op == "batchnorm2d" || op == "layernorm") return rel(2e-5, 2e-5);
  if (op == "softmax") return rel(1e-6, 1e-5);
  if (op == "avgpool2d" || op == "adaptive_avgpool2d") return rel(1e-6, 1e-5);
  return rel(1e-5, 1e-5);  // activations
}

// ---------------------------------------------------------------- the parameterized test
struct Param {
  Isa isa;
  std::string op;
  Path path;
};

std::vector<Param> all_params() {
  const char* ops[] = {"conv2d",      "linear",    "activation",
                       "batchnorm2d", "layernorm", "softmax",
                       "maxpool2d",   "avgpool2d", "adaptive_avgpool2d",
                       "pad2d",       "add",       "mul",
                       "flatten",     "reshape",   "concat"};
  std::vector<Param> out;
  for (Isa isa : {Isa::Portable, Isa::Avx2Fma}) {
    for (const char* op : ops) {
      for (Path p : {Path::Raw, Path::RawInPlace, Path::Net, Path::NetPlain}) {
        if (p == Path::Raw && is_view(op)) continue;
        if (p == Path::RawInPlace && !has_in_place(op)) continue;
        out.push_back({isa, op, p});
      }
    }
  }
  return out;
}

// Readable names in CTest's listing (instead of the bytes of the struct).
void PrintTo(const Param& p, std::ostream* os) {
  *os << isa_name(p.isa) << " " << p.op << " " << path_name(p.path);
}

class LayerTest : public ::testing::TestWithParam<Param> {};

TEST_P(LayerTest, MatchesTorch) {
  const Param& p = GetParam();
  if (!isa_available(p.isa)) GTEST_SKIP() << "this CPU lacks " << isa_name(p.isa);
  IsaGuard guard;
  ASSERT_TRUE(set_isa(p.isa).ok());
  ASSERT_EQ(current_isa(), p.isa);
  const auto& cases = layer_cases();
  ASSERT_TRUE(cases.ok()) << cases.status();
  std::size_t n = 0;
  std::string failures, worst_name;
  Comparison worst;
  for (const LayerCase& c : *cases) {
    if (c.op != p.op || !applicable(c, p.path)) continue;
    ++n;
    Result<Tensor> got = run_case(c, p.path);
    if (!got.ok()) {
      failures += "  " + c.name + ": " + std::string(got.status().ToString()) + "\n";
      continue;
    }
    if (got->shape != c.expected.shape) {
      failures += "  " + c.name + ": shape " + shape_str(got->shape) + ", torch " +
                  shape_str(c.expected.shape) + "\n";
      continue;
    }
    const Comparison cmp = compare(got->data, c.expected.data, tolerance(c));
    if (worst_name.empty() || cmp.worst_ratio > worst.worst_ratio) {
      worst = cmp;
      worst_name = c.name;
    }
    if (!cmp.ok()) failures += "  " + c.name + ": " + cmp.describe() + "\n";
  }
  std::cout << "[  worst   ] " << n << " cases; " << worst_name << ": " << worst.describe() << "\n";
  EXPECT_GT(n, 0u) << "no " << p.op << " cases in layer_cases.pt";
  EXPECT_TRUE(failures.empty()) << p.op << " (" << path_name(p.path) << ", " << isa_name(p.isa)
                                << ") differs from torch:\n"
                                << failures << "worst case: " << worst_name << ": "
                                << worst.describe();
}

INSTANTIATE_TEST_SUITE_P(Cases, LayerTest, ::testing::ValuesIn(all_params()),
                         [](const ::testing::TestParamInfo<Param>& info) {
                           return std::string(info.param.isa == Isa::Portable ? "portable"
                                                                              : "avx2") +
                                  "_" + info.param.op + "_" + path_name(info.param.path);
                         });

// ---------------------------------------------------------------- instruction sets
TEST(Isa, NamesAndPortableAlwaysAvailable) {
  IsaGuard guard;
  EXPECT_EQ(isa_name(Isa::Portable), "portable");
  EXPECT_EQ(isa_name(Isa::Avx2Fma), "avx2");
  EXPECT_TRUE(isa_available(Isa::Portable));
  EXPECT_TRUE(isa_available(best_isa()));
  ASSERT_TRUE(set_isa(Isa::Portable).ok());
  EXPECT_EQ(current_isa(), Isa::Portable);
  ASSERT_TRUE(set_isa(best_isa()).ok());
  EXPECT_EQ(current_isa(), best_isa());
  if (isa_available(Isa::Avx2Fma)) {
    EXPECT_EQ(best_isa(), Isa::Avx2Fma);
  }
}

TEST(Isa, UnavailableIsaIsAnError) {
  if (isa_available(Isa::Avx2Fma)) GTEST_SKIP() << "this CPU has AVX2+FMA: nothing to refuse";
  IsaGuard guard;
  const Isa before = current_isa();
  const Status s = set_isa(Isa::Avx2Fma);
  EXPECT_FALSE(s.ok());
  EXPECT_TRUE(contains_ci(s.message(), "avx2")) << s;
  EXPECT_EQ(current_isa(), before) << "a refused set_isa changes nothing";
}

TEST(Isa, ActivationNamesAreDistinct) {
  std::vector<std::string> names;
  for (Activation a : {Activation::None, Activation::Relu, Activation::Gelu, Activation::GeluTanh,
                       Activation::Sigmoid, Activation::Tanh}) {
    names.emplace_back(activation_name(a));
    EXPECT_FALSE(names.back().empty());
  }
  std::sort(names.begin(), names.end());
  EXPECT_EQ(std::unique(names.begin(), names.end()), names.end());
}

// Every case with a kernel, once per ISA: the results agree with each other within the same
// per-op tolerance (taken around the portable result).
TEST(Isa, PortableAndAvx2Agree) {
  if (!isa_available(Isa::Avx2Fma)) GTEST_SKIP() << "this CPU lacks AVX2+FMA";
  IsaGuard guard;
  const auto& cases = layer_cases();
  ASSERT_TRUE(cases.ok()) << cases.status();
  std::string failures;
  std::size_t n = 0;
  for (const LayerCase& c : *cases) {
    if (!applicable(c, Path::Raw)) continue;
    ASSERT_TRUE(set_isa(Isa::Portable).ok());
    Result<Tensor> a = run_case(c, Path::Raw);
    ASSERT_TRUE(set_isa(Isa::Avx2Fma).ok());
    Result<Tensor> b = run_case(c, Path::Raw);
    if (!a.ok() || !b.ok()) continue;  // reported by LayerTest
    ++n;
    LayerCase around = c;
    around.expected = *a;
    const Comparison cmp = compare(b->data, a->data, tolerance(around));
    if (!cmp.ok()) failures += "  " + c.name + ": avx2 vs portable: " + cmp.describe() + "\n";
  }
  EXPECT_GT(n, 0u);
  EXPECT_TRUE(failures.empty()) << failures;
}

// ---------------------------------------------------------------- shape checks
TEST(Validation, Conv2dSpecAndWeights) {
  Conv2dSpec s;
  s.in_channels = 6;
  s.out_channels = 4;
  s.kernel_h = s.kernel_w = 3;
  s.groups = 4;  // 6 % 4 != 0
  Status bad = validate(s);
  EXPECT_FALSE(bad.ok());
  EXPECT_TRUE(contains_ci(bad.message(), "groups")) << bad;
  s.groups = 2;
  EXPECT_TRUE(validate(s).ok());
  for (auto field : {&Conv2dSpec::stride_h, &Conv2dSpec::dilation_w, &Conv2dSpec::kernel_h}) {
    Conv2dSpec z = s;
    z.*field = 0;
    EXPECT_FALSE(validate(z).ok());
  }
  Conv2dSpec neg = s;
  neg.pad_w = -1;
  EXPECT_FALSE(validate(neg).ok());
  // 3x3 kernel on a 2x2 input without padding: an empty output.
  EXPECT_FALSE(conv2d_output_hw(s, 2, 2).ok());
  auto hw = conv2d_output_hw(s, 5, 7);
  ASSERT_TRUE(hw.ok()) << hw.status();
  EXPECT_EQ(*hw, std::make_pair(std::int64_t{3}, std::int64_t{5}));
  // Weight of the wrong size: [4, 3, 3, 3] is 108 floats, 100 given; bias of the wrong size.
  std::vector<float> w(100, 0.0f), w_ok(108, 0.0f), b(3, 0.0f);
  EXPECT_FALSE(PackedConv2d::make(s, w, {}).ok());
  EXPECT_FALSE(PackedConv2d::make(s, w_ok, b).ok());
  EXPECT_TRUE(PackedConv2d::make(s, w_ok, {}).ok());
}

TEST(Validation, LinearWeights) {
  std::vector<float> w(12, 0.0f), b(5, 0.0f);
  EXPECT_TRUE(PackedLinear::make(4, 3, w, {}).ok());
  EXPECT_FALSE(PackedLinear::make(4, 4, w, {}).ok());
  EXPECT_FALSE(PackedLinear::make(4, 3, w, b).ok());
  EXPECT_FALSE(PackedLinear::make(-1, 3, w, {}).ok());
}

TEST(Validation, PoolPadBroadcastAndBatchnorm) {
  Pool2dSpec p;
  p.kernel_h = p.kernel_w = 2;
  p.stride_h = p.stride_w = 2;
  p.pad_h = 2;  // torch: padding at most half the kernel
  EXPECT_FALSE(pool2d_output_hw(PoolKind::Max, p, 8, 8).ok());
  EXPECT_FALSE(pool2d_output_hw(PoolKind::Avg, p, 8, 8).ok());
  p.pad_h = 1;
  auto hw = pool2d_output_hw(PoolKind::Max, p, 8, 8);
  ASSERT_TRUE(hw.ok()) << hw.status();
  EXPECT_EQ(*hw, std::make_pair(std::int64_t{5}, std::int64_t{4}));
  p.stride_w = 0;
  EXPECT_FALSE(pool2d_output_hw(PoolKind::Avg, p, 8, 8).ok());

  Pad2dSpec r;
  r.mode = PadMode::Reflect;
  r.left = 5;  // reflect padding must be smaller than the dimension
  EXPECT_FALSE(pad2d_output_hw(r, 4, 5).ok());
  r.left = 4;
  EXPECT_TRUE(pad2d_output_hw(r, 4, 5).ok());
  Pad2dSpec crop;
  crop.left = -3;
  crop.right = -3;  // a 5-wide plane cropped by 6: a negative width
  EXPECT_FALSE(pad2d_output_hw(crop, 4, 5).ok());

  const std::int64_t a[] = {2, 3}, b[] = {4}, c[] = {3, 1, 1}, d[] = {1};
  EXPECT_FALSE(broadcast_shape(a, b).ok());
  auto s = broadcast_shape(c, a);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(*s, (std::vector<std::int64_t>{3, 2, 3}));
  s = broadcast_shape(d, c);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(*s, (std::vector<std::int64_t>{3, 1, 1}));

  std::vector<float> m3(3, 0.0f), v3(3, 1.0f), v2(2, 1.0f);
  EXPECT_TRUE(batchnorm_affine(m3, v3, {}, {}, 1e-5).ok());
  EXPECT_FALSE(batchnorm_affine(m3, v2, {}, {}, 1e-5).ok());
  EXPECT_FALSE(batchnorm_affine(m3, v3, v2, {}, 1e-5).ok());
}

}  // namespace
}  // namespace crucible::runtime::test
