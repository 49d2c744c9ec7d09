// net_test.cpp — multi-node nets against PyTorch's nn.Modules under every CompileOptions mix and
// ISA; builder and run() errors name what is wrong; the arena plan keeps its promised bounds.
#include "crucible/runtime/Net.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <functional>
#include <iostream>
#include <limits>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "case_util.h"
#include "crucible/ptload/StateDict.h"
#include "crucible/runtime/Weights.h"

namespace crucible::runtime::test {
namespace {

constexpr float kPoison = std::numeric_limits<float>::quiet_NaN();

const Result<ptload::StateDict>& net_file() {
  static const Result<ptload::StateDict> sd = ptload::StateDict::open(cases_path("net_cases.pt"));
  return sd;
}

// Looks a weight up through Weights (so its shape is checked); a failure is a test failure.
struct Params {
  Weights& w;
  std::string prefix;
  std::span<const float> operator()(const std::string& name,
                                    std::initializer_list<std::int64_t> shape) const {
    auto r = w.get(prefix + name, shape);
    if (!r.ok()) {
      ADD_FAILURE() << r.status();
      return {};
    }
    return *r;
  }
};

Conv2dSpec conv(std::int64_t cin, std::int64_t cout, std::int64_t k, std::int64_t stride = 1,
                std::int64_t pad = 0) {
  Conv2dSpec s;
  s.in_channels = cin;
  s.out_channels = cout;
  s.kernel_h = s.kernel_w = k;
  s.stride_h = s.stride_w = stride;
  s.pad_h = s.pad_w = pad;
  return s;
}

Pool2dSpec pool(std::int64_t k, std::int64_t stride, bool ceil = false) {
  Pool2dSpec s;
  s.kernel_h = s.kernel_w = k;
  s.stride_h = s.stride_w = stride;
  s.ceil_mode = ceil;
  return s;
}

Value bn(Net& net, const Params& p, const std::string& m, std::int64_t c, Value x) {
  return net.batchnorm2d(x, p(m + ".running_mean", {c}), p(m + ".running_var", {c}),
                         p(m + ".weight", {c}), p(m + ".bias", {c}));
}

using Builder = std::function<std::vector<Value>(Net&, const Params&, const std::vector<Value>&)>;

// The same graphs as the nn.Modules in make_layer_cases.py.
const std::map<std::string, Builder>& builders() {
  static const std::map<std::string, Builder> b = {
      {"conv_bn_relu_pool",
       [](Net& net, const Params& p, const std::vector<Value>& in) -> std::vector<Value> {
         Value x =
             net.conv2d(in[0], conv(3, 8, 3, 1, 1), p("0.weight", {8, 3, 3, 3}), p("0.bias", {8}));
         x = net.activation(bn(net, p, "1", 8, x), Activation::Relu);
         x = net.maxpool2d(x, pool(2, 2));
         x = net.conv2d(x, conv(8, 6, 3, 2), p("4.weight", {6, 8, 3, 3}));
         x = net.activation(bn(net, p, "5", 6, x), Activation::Gelu);
         x = net.flatten(net.adaptive_avgpool2d(x, 1, 1), 1, -1);
         x = net.linear(x, 6, 5, p("9.weight", {5, 6}), p("9.bias", {5}));
         return {net.softmax(x, -1)};
       }},
      {"residual",
       [](Net& net, const Params& p, const std::vector<Value>& in) -> std::vector<Value> {
         Value y = net.conv2d(in[0], conv(4, 4, 3, 1, 1), p("conv1.weight", {4, 4, 3, 3}));
         y = net.activation(bn(net, p, "bn1", 4, y), Activation::Relu);
         y = net.conv2d(y, conv(4, 4, 3, 1, 1), p("conv2.weight", {4, 4, 3, 3}));
         y = bn(net, p, "bn2", 4, y);
         return {net.activation(net.add(y, in[0]), Activation::Relu)};
       }},
      {"shared_conv",
       [](Net& net, const Params& p, const std::vector<Value>& in) -> std::vector<Value> {
         Value y = net.conv2d(in[0], conv(3, 4, 3, 1, 1), p("conv.weight", {4, 3, 3, 3}),
                              p("conv.bias", {4}));
         Value z = net.activation(bn(net, p, "bn", 4, y), Activation::Relu);
         return {net.add(z, y)};
       }},
      {"mlp",
       [](Net& net, const Params& p, const std::vector<Value>& in) -> std::vector<Value> {
         Value x = net.linear(in[0], 20, 32, p("0.weight", {32, 20}), p("0.bias", {32}));
         x = net.layernorm(x, {32}, p("1.weight", {32}), p("1.bias", {32}));
         x = net.activation(x, Activation::Gelu);
         x = net.linear(x, 32, 16, p("3.weight", {16, 32}), p("3.bias", {16}));
         x = net.activation(x, Activation::GeluTanh);
         x = net.linear(x, 16, 7, p("5.weight", {7, 16}), p("5.bias", {7}));
         return {net.softmax(x, -1)};
       }},
      {"squeeze",
       [](Net& net, const Params& p, const std::vector<Value>& in) -> std::vector<Value> {
         Value y = net.conv2d(in[0], conv(6, 6, 3, 1, 1), p("conv.weight", {6, 6, 3, 3}),
                              p("conv.bias", {6}));
         y = net.activation(y, Activation::Relu);
         Value s = net.adaptive_avgpool2d(y, 1, 1);
         s = net.conv2d(s, conv(6, 6, 1), p("fc.weight", {6, 6, 1, 1}), p("fc.bias", {6}));
         s = net.activation(s, Activation::Sigmoid);
         Value z = net.mul(y, s);
         Pad2dSpec pad;
         pad.left = pad.right = pad.top = pad.bottom = 1;
         pad.mode = PadMode::Replicate;
         return {net.avgpool2d(net.pad2d(z, pad), pool(3, 2, true))};
       }},
      {"views",
       [](Net& net, const Params& p, const std::vector<Value>& in) -> std::vector<Value> {
         Value a = net.flatten(in[0], 1);
         Value b =
             net.conv2d(in[0], conv(3, 2, 1), p("conv.weight", {2, 3, 1, 1}), p("conv.bias", {2}));
         b = net.reshape(b, {2, -1});
         const Value parts[] = {a, in[1], b};
         Value cat = net.concat(parts, 1);
         Value y = net.linear(cat, 112, 4, p("fc.weight", {4, 112}), p("fc.bias", {4}));
         return {cat, net.activation(y, Activation::Sigmoid)};
       }},
      {"shared_output",
       [](Net& net, const Params& p, const std::vector<Value>& in) -> std::vector<Value> {
         Value y = net.conv2d(in[0], conv(2, 3, 3, 1, 1), p("conv.weight", {3, 2, 3, 3}),
                              p("conv.bias", {3}));
         return {y, net.activation(y, Activation::Relu), net.activation(y, Activation::Sigmoid)};
       }},
      {"aliasing",
       [](Net& net, const Params& p, const std::vector<Value>& in) -> std::vector<Value> {
         Conv2dSpec dw = conv(4, 4, 3, 1, 1);
         dw.groups = 4;
         Value d = net.conv2d(in[0], dw, p("dw.weight", {4, 1, 3, 3}), p("dw.bias", {4}));
         d = net.activation(bn(net, p, "bn1", 4, d), Activation::Relu);
         Conv2dSpec gc = conv(4, 6, 1);
         gc.groups = 2;
         Value g = bn(net, p, "bn2", 6, net.conv2d(d, gc, p("gc.weight", {6, 2, 1, 1})));
         Value f = net.flatten(g, 1);
         Value r = net.activation(f, Activation::Relu);
         const Value parts[] = {f, r, f};
         Value cat = net.concat(parts, 1);
         Value s = net.add(cat, cat);
         Value y = net.conv2d(net.reshape(s, {2, 18, 6, 6}), conv(18, 3, 1),
                              p("head.weight", {3, 18, 1, 1}), p("head.bias", {3}));
         return {g, net.activation(y, Activation::Sigmoid),
                 net.activation(net.flatten(in[0], 1), Activation::Relu)};
       }},
  };
  return b;
}

struct NetCase {
  std::vector<Tensor> inputs, outputs;
};

NetCase net_case(const ptload::StateDict& sd, const std::string& name) {
  NetCase c;
  const ptload::PickleValue* n = sd.root().get(name);
  if (n == nullptr) {
    ADD_FAILURE() << "net_cases.pt has no net " << name;
    return c;
  }
  for (const auto& t : n->get("inputs")->items()) c.inputs.push_back(to_tensor(t.as_tensor()));
  for (const auto& t : n->get("outputs")->items()) c.outputs.push_back(to_tensor(t.as_tensor()));
  return c;
}

// Builds `name` from the file's weights and compiles it with `options`.
Result<CompiledNet> build(const std::string& name, Weights& w, const NetCase& c,
                          const CompileOptions& options) {
  Net net;
  std::vector<Value> in;
  for (std::size_t i = 0; i < c.inputs.size(); ++i) {
    in.push_back(net.input("in" + std::to_string(i), c.inputs[i].shape));
  }
  const std::vector<Value> outs = builders().at(name)(net, Params{w, name + ".state."}, in);
  for (std::size_t i = 0; i < outs.size(); ++i) net.output("out" + std::to_string(i), outs[i]);
  if (!net.status().ok()) return net.status();
  return net.compile(options);
}

struct Variant {
  const char* name;
  CompileOptions options;
};
const Variant kVariants[] = {
    {"plain", {false, false, false}}, {"fold", {true, false, false}},
    {"fuse", {false, true, false}},   {"in_place", {false, false, true}},
    {"all", {true, true, true}},
};

struct NetParam {
  std::string net;
  Variant variant;
};

void PrintTo(const NetParam& p, std::ostream* os) { *os << p.net << " " << p.variant.name; }

class NetTest : public ::testing::TestWithParam<NetParam> {};

TEST_P(NetTest, MatchesTorch) {
  const NetParam& p = GetParam();
  const auto& sd = net_file();
  ASSERT_TRUE(sd.ok()) << sd.status();
  const NetCase c = net_case(*sd, p.net);
  ASSERT_FALSE(c.outputs.empty());
  Weights w(*sd);
  auto plan = build(p.net, w, c, p.variant.options);
  ASSERT_TRUE(plan.ok()) << plan.status();
  expect_arena_properties(*plan, p.net);
  // Every parameter of the module was used (BatchNorm's step counter is no weight).
  for (const std::string& u : w.unused()) {
    if (u.rfind(p.net + ".state.", 0) == 0 && !u.ends_with("num_batches_tracked")) {
      ADD_FAILURE() << "weight not used by the C++ net: " << u;
    }
  }
  ASSERT_EQ(plan->input_count(), c.inputs.size());
  ASSERT_EQ(plan->output_count(), c.outputs.size());
  for (std::size_t i = 0; i < c.inputs.size(); ++i) {
    EXPECT_EQ(plan->input_name(i), "in" + std::to_string(i));
    EXPECT_EQ(plan->input_shape(i), c.inputs[i].shape);
  }
  for (std::size_t i = 0; i < c.outputs.size(); ++i) {
    EXPECT_EQ(plan->output_name(i), "out" + std::to_string(i));
    ASSERT_EQ(plan->output_shape(i), c.outputs[i].shape) << "output " << i;
  }
  IsaGuard guard;
  for (Isa isa : {Isa::Portable, Isa::Avx2Fma}) {
    if (!isa_available(isa)) continue;
    SCOPED_TRACE(std::string(isa_name(isa)));
    ASSERT_TRUE(set_isa(isa).ok());
    std::vector<const float*> ins;
    for (const auto& t : c.inputs) ins.push_back(t.data.data());
    for (int round = 0; round < 2; ++round) {  // the second run reuses a dirty arena
      std::vector<std::vector<float>> got;
      std::vector<float*> outs;
      for (const auto& t : c.outputs) got.emplace_back(t.data.size(), kPoison);
      for (auto& g : got) outs.push_back(g.data());
      const Status s = plan->run(ins, outs);
      ASSERT_TRUE(s.ok()) << s;
      for (std::size_t i = 0; i < got.size(); ++i) {
        const auto& exp = c.outputs[i].data;
        const Comparison cmp =
            compare(got[i], exp, [&exp](std::size_t j) { return 1e-4 + 1e-4 * std::fabs(exp[j]); });
        EXPECT_TRUE(cmp.ok()) << p.net << " (" << p.variant.name << ") output " << i << " round "
                              << round << ": " << cmp.describe() << "\n"
                              << plan->describe();
      }
    }
  }
}

std::vector<NetParam> net_params() {
  std::vector<NetParam> out;
  for (const auto& [name, _] : builders()) {
    for (const Variant& v : kVariants) out.push_back({name, v});
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(Nets, NetTest, ::testing::ValuesIn(net_params()),
                         [](const ::testing::TestParamInfo<NetParam>& info) {
                           return info.param.net + "_" + info.param.variant.name;
                         });

std::size_t lines(const std::string& s) {
  return static_cast<std::size_t>(std::count(s.begin(), s.end(), '\n')) +
         (!s.empty() && s.back() != '\n');
}

// compile() with everything on folds both batchnorms into their convolutions and fuses the relu
// and gelu into them: fewer steps than the plain plan (describe() has one line per step).
TEST(NetCompile, FoldingAndFusionRemoveSteps) {
  const auto& sd = net_file();
  ASSERT_TRUE(sd.ok()) << sd.status();
  const NetCase c = net_case(*sd, "conv_bn_relu_pool");
  Weights w(*sd);
  auto plain = build("conv_bn_relu_pool", w, c, {false, false, false});
  auto all = build("conv_bn_relu_pool", w, c, {true, true, true});
  ASSERT_TRUE(plain.ok()) << plain.status();
  ASSERT_TRUE(all.ok()) << all.status();
  expect_arena_properties(*plain, "plain");
  expect_arena_properties(*all, "all");
  EXPECT_LE(lines(all->describe()) + 4, lines(plain->describe())) << "plain:\n"
                                                                  << plain->describe() << "all:\n"
                                                                  << all->describe();
}

// Net.h: "One run at a time per CompiledNet: a concurrent call gets an error, not a race." Two
// threads share one plan; every call either is refused or produces torch's output.
TEST(NetCompile, ConcurrentRunsAreRefusedNotRaced) {
  const auto& sd = net_file();
  ASSERT_TRUE(sd.ok()) << sd.status();
  const NetCase c = net_case(*sd, "conv_bn_relu_pool");
  Weights w(*sd);
  auto plan = build("conv_bn_relu_pool", w, c, CompileOptions{});
  ASSERT_TRUE(plan.ok()) << plan.status();
  expect_arena_properties(*plan, "conv_bn_relu_pool");
  std::atomic<int> ok{0}, refused{0}, wrong{0};
  auto worker = [&] {
    const float* ins[] = {c.inputs[0].data.data()};
    std::vector<float> out(c.outputs[0].data.size());
    float* outs[] = {out.data()};
    const auto& exp = c.outputs[0].data;
    for (int i = 0; i < 40; ++i) {
      std::fill(out.begin(), out.end(), kPoison);
      if (!plan->run(ins, outs).ok()) {
        ++refused;
        continue;
      }
      const Comparison cmp =
          compare(out, exp, [&exp](std::size_t j) { return 1e-4 + 1e-4 * std::fabs(exp[j]); });
      ++(cmp.ok() ? ok : wrong);
    }
  };
  std::thread a(worker), b(worker);
  a.join();
  b.join();
  EXPECT_EQ(wrong.load(), 0) << "a run that returned OK produced a wrong output";
  EXPECT_GT(ok.load(), 0);
  std::cout << "[  runs    ] " << ok << " ok, " << refused << " refused\n";
}

// ---------------------------------------------------------------- errors
// `node` is the builder call; `kind` an acceptable other name of the node's kind in the message.
void expect_builder_error(const Net& net, const std::string& node, const std::string& kind = "") {
  const Status s = net.status();
  ASSERT_FALSE(s.ok()) << "expected an error naming " << node;
  EXPECT_TRUE(contains_ci(s.message(), node) || (!kind.empty() && contains_ci(s.message(), kind)))
      << "the error should name the " << node << " node: " << s;
  auto plan = net.compile();
  ASSERT_FALSE(plan.ok());
  EXPECT_TRUE(contains_ci(plan.status().message(), std::string(s.message())))
      << "compile() returns the first builder error: " << plan.status() << " vs " << s;
}

std::vector<float> zeros(std::size_t n) { return std::vector<float>(n, 0.0f); }

TEST(NetErrors, RunWithWrongInputOrOutputCount) {
  Net net;
  Value x = net.input("x", {2, 3});
  net.output("y", net.activation(x, Activation::Relu));
  auto plan = net.compile();
  ASSERT_TRUE(plan.ok()) << plan.status();
  expect_arena_properties(*plan, "relu");
  std::vector<float> in = zeros(6), out = zeros(6), extra = zeros(6);
  const float* one_in[] = {in.data()};
  const float* two_in[] = {in.data(), extra.data()};
  float* one_out[] = {out.data()};
  float* two_out[] = {out.data(), extra.data()};
  EXPECT_FALSE(plan->run({}, one_out).ok());
  EXPECT_FALSE(plan->run(two_in, one_out).ok());
  EXPECT_FALSE(plan->run(one_in, {}).ok());
  const Status s = plan->run(one_in, two_out);
  EXPECT_FALSE(s.ok());
  EXPECT_TRUE(contains_ci(s.message(), "output")) << s;
  EXPECT_TRUE(plan->run(one_in, one_out).ok());
}

TEST(NetErrors, ConvChannelMismatch) {
  Net net;
  Value x = net.input("x", {1, 3, 8, 8});
  const auto w = zeros(4 * 4 * 3 * 3);
  Value y = net.conv2d(x, conv(4, 4, 3), w);
  EXPECT_FALSE(y.valid() && net.status().ok());
  net.output("y", y);
  expect_builder_error(net, "conv2d");
}

TEST(NetErrors, ConvWeightSizeAndEmptyOutput) {
  {
    Net net;
    Value x = net.input("x", {1, 3, 8, 8});
    net.conv2d(x, conv(3, 4, 3), zeros(4 * 3 * 3 * 3 - 1));
    expect_builder_error(net, "conv2d");
  }
  {
    Net net;
    Value x = net.input("x", {1, 3, 2, 2});
    net.conv2d(x, conv(3, 4, 3), zeros(4 * 3 * 3 * 3));
    expect_builder_error(net, "conv2d");
  }
  {
    Net net;
    Value x = net.input("x", {3, 8, 8});  // no batch dimension
    net.conv2d(x, conv(3, 4, 3), zeros(4 * 3 * 3 * 3));
    expect_builder_error(net, "conv2d");
  }
}

TEST(NetErrors, LinearInFeaturesMismatch) {
  Net net;
  Value x = net.input("x", {2, 10});
  net.linear(x, 12, 3, zeros(36));
  expect_builder_error(net, "linear");
}

TEST(NetErrors, ConcatShapeMismatch) {
  {
    Net net;
    const Value xs[] = {net.input("a", {2, 3}), net.input("b", {3, 3})};
    net.concat(xs, 1);
    expect_builder_error(net, "concat");
  }
  {
    Net net;
    const Value xs[] = {net.input("a", {2, 3}), net.input("b", {2, 3, 1})};
    net.concat(xs, 0);
    expect_builder_error(net, "concat");
  }
  {
    Net net;
    const Value xs[] = {net.input("a", {2, 3}), net.input("b", {2, 3})};
    net.concat(xs, 2);
    expect_builder_error(net, "concat");
  }
  {
    Net net;
    net.input("a", {2, 3});
    net.concat({}, 0);
    expect_builder_error(net, "concat");
  }
}

TEST(NetErrors, ReshapeNumelMismatch) {
  for (std::vector<std::int64_t> shape :
       {std::vector<std::int64_t>{5, -1}, std::vector<std::int64_t>{7, 3},
        std::vector<std::int64_t>{-1, -1, 6}}) {
    Net net;
    Value x = net.input("x", {2, 3, 4});
    net.reshape(x, shape);
    SCOPED_TRACE(shape_str(shape));
    expect_builder_error(net, "reshape");
  }
}

TEST(NetErrors, BroadcastMismatch) {
  for (bool add : {true, false}) {
    Net net;
    Value a = net.input("a", {2, 3});
    Value b = net.input("b", {4});
    add ? net.add(a, b) : net.mul(a, b);
    expect_builder_error(net, add ? "add" : "mul", "binary");
  }
}

TEST(NetErrors, NormsSoftmaxFlattenPoolPad) {
  {
    Net net;
    net.layernorm(net.input("x", {2, 5}), {4});
    expect_builder_error(net, "layernorm");
  }
  {
    Net net;
    const auto g = zeros(4);
    net.layernorm(net.input("x", {2, 5}), {5}, g);
    expect_builder_error(net, "layernorm");
  }
  {
    Net net;
    const auto m = zeros(3), v = std::vector<float>(3, 1.0f);
    net.batchnorm2d(net.input("x", {1, 4, 2, 2}), m, v);
    expect_builder_error(net, "batchnorm");
  }
  for (std::int64_t dim : {2, -3}) {
    Net net;
    net.softmax(net.input("x", {2, 5}), dim);
    expect_builder_error(net, "softmax");
  }
  {
    Net net;
    net.flatten(net.input("x", {2, 3, 4}), 2, 1);
    expect_builder_error(net, "flatten");
  }
  {
    Net net;
    Pool2dSpec s = pool(2, 2);
    s.pad_h = 2;
    net.maxpool2d(net.input("x", {1, 1, 8, 8}), s);
    expect_builder_error(net, "maxpool");
  }
  {
    Net net;
    net.avgpool2d(net.input("x", {1, 1, 1, 1}), pool(3, 1));
    expect_builder_error(net, "avgpool");
  }
  {
    Net net;
    Pad2dSpec s;
    s.mode = PadMode::Reflect;
    s.left = 5;
    net.pad2d(net.input("x", {1, 1, 4, 5}), s);
    expect_builder_error(net, "pad");
  }
  {
    Net net;
    net.adaptive_avgpool2d(net.input("x", {1, 1, 4, 5}), 0, 2);
    expect_builder_error(net, "adaptive");
  }
}

TEST(NetErrors, FirstErrorWinsAndInvalidValues) {
  Net net;
  Value x = net.input("x", {1, 3, 8, 8});
  Value y = net.conv2d(x, conv(4, 4, 3), zeros(4 * 4 * 3 * 3));
  const Status first = net.status();
  ASSERT_FALSE(first.ok());
  EXPECT_TRUE(contains_ci(first.message(), "conv2d")) << first;
  Value z = net.linear(net.flatten(y), 99, 2, zeros(198));
  net.activation(z, Activation::Relu);
  net.linear(net.input("v", {2, 3}), 5, 2, zeros(10));
  EXPECT_EQ(net.status(), first);
  auto plan = net.compile();
  ASSERT_FALSE(plan.ok());
  EXPECT_TRUE(contains_ci(plan.status().message(), std::string(first.message()))) << plan.status();

  Net other;
  other.activation(Value{}, Activation::Relu);
  EXPECT_FALSE(other.status().ok());
  EXPECT_TRUE(other.shape(Value{}).empty());

  Net neg;
  neg.input("x", {2, -1});
  EXPECT_FALSE(neg.status().ok());
}

TEST(NetShapes, BuilderReportsShapes) {
  Net net;
  Value x = net.input("x", {2, 3, 10, 12});
  EXPECT_EQ(net.shape(x), (std::vector<std::int64_t>{2, 3, 10, 12}));
  Value y = net.conv2d(x, conv(3, 5, 3, 2, 1), zeros(5 * 3 * 9));
  EXPECT_EQ(net.shape(y), (std::vector<std::int64_t>{2, 5, 5, 6}));
  Value f = net.flatten(y, 2);
  EXPECT_EQ(net.shape(f), (std::vector<std::int64_t>{2, 5, 30}));
  Value r = net.reshape(f, {-1, 10});
  EXPECT_EQ(net.shape(r), (std::vector<std::int64_t>{30, 10}));
  Value l = net.linear(f, 30, 4, zeros(120));
  EXPECT_EQ(net.shape(l), (std::vector<std::int64_t>{2, 5, 4}));
  EXPECT_TRUE(net.status().ok()) << net.status();
  net.output("r", r);
  net.output("l", l);
  auto plan = net.compile();
  ASSERT_TRUE(plan.ok()) << plan.status();
  expect_arena_properties(*plan, "shapes");
  EXPECT_EQ(plan->output_shape(1), (std::vector<std::int64_t>{2, 5, 4}));
  EXPECT_GT(plan->weight_bytes(), 0u);
}

}  // namespace
}  // namespace crucible::runtime::test
