// Net.cpp — network builder, compile-time folding/fusion, arena planning and the allocation-free
// executor (see Net.h for the rules).
#include "crucible/runtime/Net.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <optional>
#include <string>
#include <utility>

#include "crucible/core/Contract.h"
#include "crucible/core/ShapeText.h"
#include "crucible/graph/ArenaPlacement.h"

namespace crucible::runtime {
// The layer graph's own types: members of Net::Impl and CompiledNet::Impl, so not in an unnamed
// namespace (GCC's -Wsubobject-linkage where this file is compiled inside a unity batch).
namespace net_types {

enum class Kind : std::uint8_t {
  Input, Conv, Linear, Act, Affine, LayerNorm, Softmax, MaxPool, AvgPool, AdaptiveAvg, Pad,
  Binary, View, Concat,
};

}  // namespace net_types
using namespace net_types;

namespace {

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::Input: return "input";
    case Kind::Conv: return "conv2d";
    case Kind::Linear: return "linear";
    case Kind::Act: return "activation";
    case Kind::Affine: return "batchnorm";
    case Kind::LayerNorm: return "layernorm";
    case Kind::Softmax: return "softmax";
    case Kind::MaxPool: return "maxpool2d";
    case Kind::AvgPool: return "avgpool2d";
    case Kind::AdaptiveAvg: return "adaptive_avgpool2d";
    case Kind::Pad: return "pad2d";
    case Kind::Binary: return "binary";
    case Kind::View: return "view";
    case Kind::Concat: return "concat";
  }
  return "?";
}

std::int64_t numel(const std::vector<std::int64_t>& s) {
  return std::accumulate(s.begin(), s.end(), std::int64_t{1}, std::multiplies<>());
}

constexpr std::size_t kAlign = 64;
std::size_t align_up(std::size_t v) { return (v + kAlign - 1) / kAlign * kAlign; }

}  // namespace

namespace net_types {

struct Node {
  Kind kind = Kind::Input;
  std::vector<std::uint32_t> in;
  std::vector<std::int64_t> shape;
  // Layer parameters (only the ones of `kind` are used).
  Conv2dSpec conv;
  std::optional<PackedConv2d> pconv;  // packed once by the builder; copies share the weights
  std::optional<PackedLinear> plin;
  std::vector<float> w, b;  // layernorm gamma/beta
  std::int64_t in_features = 0, out_features = 0;
  Activation act = Activation::None;
  ChannelAffine affine;
  float eps = 0.0f;
  std::int64_t outer = 0, mid = 0, inner = 0;  // softmax / layernorm rows+cols / concat
  Pool2dSpec pool;
  Pad2dSpec pad;
  BinaryOp bop = BinaryOp::Add;
  std::vector<std::int64_t> sizes;  // concat sizes along dim
};

// Where a value's floats are when the plan runs.
struct Loc {
  enum : std::uint8_t { Arena, Input } where = Arena;
  std::size_t index = 0;  // byte offset in the arena, or input number
};

struct Step {
  Kind kind;
  std::uint32_t node;
  std::vector<Loc> in;
  Loc out;
  Loc workspace;  // conv only
  std::vector<std::vector<std::int64_t>> in_shapes;
  std::vector<std::int64_t> out_shape;
  std::optional<PackedConv2d> conv;
  std::optional<PackedLinear> linear;
  bool in_place = false;
};

}  // namespace net_types

namespace {
// Planes and the last two dims of an input to a 2-D layer; rank >= 3 ([c, h, w] or [n, c, h, w]).
bool planes(const std::vector<std::int64_t>& s, std::int64_t& nc, std::int64_t& h, std::int64_t& w) {
  if (s.size() < 3) return false;
  h = s[s.size() - 2];
  w = s.back();
  nc = numel(s) / (h * w);
  return true;
}
}  // namespace

struct Net::Impl {
  std::vector<Node> nodes;
  std::vector<std::uint32_t> inputs;
  std::vector<std::string> input_names;
  std::vector<std::pair<std::string, std::uint32_t>> outputs;
  Status error;

  std::string label(std::size_t id, Kind k) const {
    return "node #" + std::to_string(id) + " (" + kind_name(k) + ")";
  }
  // Records the first error, prefixed with the node it concerns.
  Value fail(Kind k, const Status& s, const char* name = nullptr) {
    if (error.ok()) {
      const std::string where = name ? "node #" + std::to_string(nodes.size()) + " (" + name + ")"
                                     : label(nodes.size(), k);
      error = Status(s.code(), where + ": " + message_of(s));
    }
    return {};
  }
  Value fail(Kind k, const std::string& what, const std::string& fix) {
    return fail(k, invalid_input(what, fix));
  }
  // Checks that v is a value of this net; records an error otherwise (also when an earlier
  // call already failed and returned the invalid Value).
  bool ok(Value v, Kind k) {
    if (v.valid() && v.id < nodes.size()) return true;
    if (error.ok()) fail(k, "an input is not a value of this net", "pass values this Net returned");
    return false;
  }
  Value push(Node n) {
    nodes.push_back(std::move(n));
    return Value{static_cast<std::uint32_t>(nodes.size() - 1)};
  }
  const std::vector<std::int64_t>& shape(Value v) const { return nodes[v.id].shape; }
  Value binary(Value a, Value b, BinaryOp op) {
    if (!ok(a, Kind::Binary) || !ok(b, Kind::Binary)) return {};
    auto s = broadcast_shape(shape(a), shape(b));
    if (!s.ok()) return fail(Kind::Binary, s.status(), op == BinaryOp::Add ? "add" : "mul");
    Node n;
    n.kind = Kind::Binary;
    n.in = {a.id, b.id};
    n.shape = std::move(*s);
    n.bop = op;
    return push(std::move(n));
  }
  Value pool(Kind k, Value x, const Pool2dSpec& spec) {
    if (!ok(x, k)) return {};
    std::int64_t nc, h, w;
    if (!planes(shape(x), nc, h, w)) {
      return fail(k, "input shape " + shape_text(shape(x)) + " has fewer than 3 dims",
                  "feed [n, c, h, w] or [c, h, w]");
    }
    auto hw = pool2d_output_hw(k == Kind::MaxPool ? PoolKind::Max : PoolKind::Avg, spec, h, w);
    if (!hw.ok()) return fail(k, hw.status());
    Node n;
    n.kind = k;
    n.in = {x.id};
    n.shape = shape(x);
    n.shape[n.shape.size() - 2] = hw->first;
    n.shape.back() = hw->second;
    n.pool = spec;
    return push(std::move(n));
  }
};

Net::Net() : impl_(std::make_unique<Impl>()) {}
Net::~Net() = default;
Net::Net(Net&&) noexcept = default;
Net& Net::operator=(Net&&) noexcept = default;

Status Net::status() const { return impl_->error; }

std::vector<std::int64_t> Net::shape(Value v) const {
  if (!v.valid() || v.id >= impl_->nodes.size()) return {};
  return impl_->nodes[v.id].shape;
}

Value Net::input(std::string name, std::vector<std::int64_t> shape) {
  Impl& I = *impl_;
  if (shape.empty() || std::any_of(shape.begin(), shape.end(), [](std::int64_t d) { return d < 1; })) {
    return I.fail(Kind::Input, "input '" + name + "' has shape " + shape_text(shape),
                  "give every dimension a size >= 1");
  }
  Node n;
  n.kind = Kind::Input;
  n.shape = std::move(shape);
  Value v = I.push(std::move(n));
  I.inputs.push_back(v.id);
  I.input_names.push_back(std::move(name));
  return v;
}

void Net::output(std::string name, Value v) {
  Impl& I = *impl_;
  if (!I.ok(v, Kind::Input)) return;
  I.outputs.emplace_back(std::move(name), v.id);
}

Value Net::conv2d(Value x, const Conv2dSpec& spec, std::span<const float> weight,
                  std::span<const float> bias) {
  Impl& I = *impl_;
  if (!I.ok(x, Kind::Conv)) return {};
  const auto& s = I.shape(x);
  if (s.size() != 4 || s[1] != spec.in_channels) {
    return I.fail(Kind::Conv, "input shape " + shape_text(s) + " is not [n, " +
                                  std::to_string(spec.in_channels) + ", h, w]",
                  "feed a 4-D tensor with in_channels channels");
  }
  auto hw = conv2d_output_hw(spec, s[2], s[3]);
  if (!hw.ok()) return I.fail(Kind::Conv, hw.status());
  // Validates the weight and bias sizes now, so the error names this node.
  auto packed = PackedConv2d::make(spec, weight, bias);
  if (!packed.ok()) return I.fail(Kind::Conv, packed.status());
  Node n;
  n.kind = Kind::Conv;
  n.in = {x.id};
  n.shape = {s[0], spec.out_channels, hw->first, hw->second};
  n.conv = spec;
  n.pconv = std::move(*packed);
  return I.push(std::move(n));
}

Value Net::linear(Value x, std::int64_t in_features, std::int64_t out_features,
                  std::span<const float> weight, std::span<const float> bias) {
  Impl& I = *impl_;
  if (!I.ok(x, Kind::Linear)) return {};
  const auto& s = I.shape(x);
  if (s.back() != in_features) {
    return I.fail(Kind::Linear, "input shape " + shape_text(s) + " does not end in in_features=" +
                                    std::to_string(in_features),
                  "flatten or reshape the input to [..., in_features]");
  }
  auto packed = PackedLinear::make(in_features, out_features, weight, bias);
  if (!packed.ok()) return I.fail(Kind::Linear, packed.status());
  Node n;
  n.kind = Kind::Linear;
  n.in = {x.id};
  n.shape = s;
  n.shape.back() = out_features;
  n.in_features = in_features;
  n.out_features = out_features;
  n.plin = std::move(*packed);
  return I.push(std::move(n));
}

Value Net::activation(Value x, Activation act) {
  Impl& I = *impl_;
  if (!I.ok(x, Kind::Act)) return {};
  Node n;
  n.kind = Kind::Act;
  n.in = {x.id};
  n.shape = I.shape(x);
  n.act = act;
  return I.push(std::move(n));
}

Value Net::batchnorm2d(Value x, std::span<const float> mean, std::span<const float> var,
                       std::span<const float> gamma, std::span<const float> beta, double eps) {
  Impl& I = *impl_;
  if (!I.ok(x, Kind::Affine)) return {};
  const auto& s = I.shape(x);
  if (s.size() < 2 || s[1] != static_cast<std::int64_t>(mean.size())) {
    return I.fail(Kind::Affine, "input shape " + shape_text(s) + " does not have " +
                                    std::to_string(mean.size()) + " channels at dimension 1",
                  "feed [n, c, ...] with c = the batchnorm's num_features");
  }
  auto affine = batchnorm_affine(mean, var, gamma, beta, eps);
  if (!affine.ok()) return I.fail(Kind::Affine, affine.status());
  Node n;
  n.kind = Kind::Affine;
  n.in = {x.id};
  n.shape = s;
  n.affine = std::move(*affine);
  return I.push(std::move(n));
}

Value Net::layernorm(Value x, std::vector<std::int64_t> normalized_shape,
                     std::span<const float> gamma, std::span<const float> beta, double eps) {
  Impl& I = *impl_;
  if (!I.ok(x, Kind::LayerNorm)) return {};
  const auto& s = I.shape(x);
  const std::size_t k = normalized_shape.size();
  if (k == 0 || k > s.size() || !std::equal(normalized_shape.begin(), normalized_shape.end(), s.end() - static_cast<std::ptrdiff_t>(k))) {
    return I.fail(Kind::LayerNorm, "normalized_shape " + shape_text(normalized_shape) +
                                       " is not the trailing dims of the input " + shape_text(s),
                  "pass the LayerNorm's normalized_shape");
  }
  const std::int64_t cols = numel(normalized_shape);
  if ((!gamma.empty() && static_cast<std::int64_t>(gamma.size()) != cols) ||
      (!beta.empty() && static_cast<std::int64_t>(beta.size()) != cols)) {
    return I.fail(Kind::LayerNorm, "weight/bias have " + std::to_string(gamma.size()) + "/" +
                                       std::to_string(beta.size()) + " elements, expected " +
                                       std::to_string(cols),
                  "pass the LayerNorm's weight and bias, or none");
  }
  Node n;
  n.kind = Kind::LayerNorm;
  n.in = {x.id};
  n.shape = s;
  n.mid = cols;
  n.outer = numel(s) / cols;
  n.w.assign(gamma.begin(), gamma.end());
  n.b.assign(beta.begin(), beta.end());
  n.eps = static_cast<float>(eps);
  return I.push(std::move(n));
}

Value Net::softmax(Value x, std::int64_t dim) {
  Impl& I = *impl_;
  if (!I.ok(x, Kind::Softmax)) return {};
  const auto& s = I.shape(x);
  const auto rank = static_cast<std::int64_t>(s.size());
  const std::int64_t d = dim < 0 ? dim + rank : dim;
  if (d < 0 || d >= rank) {
    return I.fail(Kind::Softmax, "dim " + std::to_string(dim) + " is out of range for shape " +
                                     shape_text(s),
                  "pass a dim in [-rank, rank)");
  }
  Node n;
  n.kind = Kind::Softmax;
  n.in = {x.id};
  n.shape = s;
  n.outer = std::accumulate(s.begin(), s.begin() + d, std::int64_t{1}, std::multiplies<>());
  n.mid = s[static_cast<std::size_t>(d)];
  n.inner = std::accumulate(s.begin() + d + 1, s.end(), std::int64_t{1}, std::multiplies<>());
  return I.push(std::move(n));
}


Value Net::maxpool2d(Value x, const Pool2dSpec& spec) { return impl_->pool(Kind::MaxPool, x, spec); }
Value Net::avgpool2d(Value x, const Pool2dSpec& spec) { return impl_->pool(Kind::AvgPool, x, spec); }

Value Net::adaptive_avgpool2d(Value x, std::int64_t out_h, std::int64_t out_w) {
  Impl& I = *impl_;
  if (!I.ok(x, Kind::AdaptiveAvg)) return {};
  std::int64_t nc, h, w;
  if (!planes(I.shape(x), nc, h, w) || out_h < 1 || out_w < 1) {
    return I.fail(Kind::AdaptiveAvg, "input shape " + shape_text(I.shape(x)) + ", output " +
                                         std::to_string(out_h) + "x" + std::to_string(out_w),
                  "feed [n, c, h, w] or [c, h, w] and ask for an output of at least 1x1");
  }
  Node n;
  n.kind = Kind::AdaptiveAvg;
  n.in = {x.id};
  n.shape = I.shape(x);
  n.shape[n.shape.size() - 2] = out_h;
  n.shape.back() = out_w;
  return I.push(std::move(n));
}

Value Net::pad2d(Value x, const Pad2dSpec& spec) {
  Impl& I = *impl_;
  if (!I.ok(x, Kind::Pad)) return {};
  const auto& s = I.shape(x);
  if (s.size() < 2) {
    return I.fail(Kind::Pad, "input shape " + shape_text(s) + " has fewer than 2 dims",
                  "pad2d pads the last two dimensions");
  }
  auto hw = pad2d_output_hw(spec, s[s.size() - 2], s.back());
  if (!hw.ok()) return I.fail(Kind::Pad, hw.status());
  Node n;
  n.kind = Kind::Pad;
  n.in = {x.id};
  n.shape = s;
  n.shape[s.size() - 2] = hw->first;
  n.shape.back() = hw->second;
  n.pad = spec;
  return I.push(std::move(n));
}

Value Net::add(Value a, Value b) { return impl_->binary(a, b, BinaryOp::Add); }
Value Net::mul(Value a, Value b) { return impl_->binary(a, b, BinaryOp::Mul); }

Value Net::flatten(Value x, std::int64_t start_dim, std::int64_t end_dim) {
  Impl& I = *impl_;
  if (!I.ok(x, Kind::View)) return {};
  const auto& s = I.shape(x);
  const auto rank = static_cast<std::int64_t>(s.size());
  const std::int64_t a = start_dim < 0 ? start_dim + rank : start_dim;
  const std::int64_t b = end_dim < 0 ? end_dim + rank : end_dim;
  if (a < 0 || b >= rank || a > b) {
    return I.fail(Kind::View, "flatten(" + std::to_string(start_dim) + ", " + std::to_string(end_dim) +
                                  ") is out of range for shape " + shape_text(s),
                  "pass start_dim <= end_dim within [-rank, rank)");
  }
  std::vector<std::int64_t> shape(s.begin(), s.begin() + a);
  shape.push_back(std::accumulate(s.begin() + a, s.begin() + b + 1, std::int64_t{1}, std::multiplies<>()));
  shape.insert(shape.end(), s.begin() + b + 1, s.end());
  return reshape(x, std::move(shape));
}

Value Net::reshape(Value x, std::vector<std::int64_t> shape) {
  Impl& I = *impl_;
  if (!I.ok(x, Kind::View)) return {};
  const std::int64_t total = numel(I.shape(x));
  std::int64_t known = 1;
  int infer = -1;
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1 && infer < 0) {
      infer = static_cast<int>(i);
    } else if (shape[i] < 1) {
      return I.fail(Kind::View, "reshape to " + shape_text(shape) + ": sizes must be >= 1 with at most one -1",
                    "fix the target shape");
    } else {
      known *= shape[i];
    }
  }
  if (infer >= 0) {
    if (total % known != 0) {
      return I.fail(Kind::View, "reshape of " + shape_text(I.shape(x)) + " to " + shape_text(shape) +
                                    ": " + std::to_string(total) + " elements do not divide by " + std::to_string(known),
                    "fix the target shape");
    }
    shape[static_cast<std::size_t>(infer)] = total / known;
  }
  if (shape.empty() || numel(shape) != total) {
    return I.fail(Kind::View, "reshape of " + shape_text(I.shape(x)) + " (" + std::to_string(total) +
                                  " elements) to " + shape_text(shape),
                  "the target shape must hold the same number of elements");
  }
  Node n;
  n.kind = Kind::View;
  n.in = {x.id};
  n.shape = std::move(shape);
  return I.push(std::move(n));
}

Value Net::concat(std::span<const Value> xs, std::int64_t dim) {
  Impl& I = *impl_;
  if (xs.empty()) return I.fail(Kind::Concat, "no inputs", "pass at least one value");
  for (Value v : xs) {
    if (!I.ok(v, Kind::Concat)) return {};
  }
  const auto& s0 = I.shape(xs[0]);
  const auto rank = static_cast<std::int64_t>(s0.size());
  const std::int64_t d = dim < 0 ? dim + rank : dim;
  if (d < 0 || d >= rank) {
    return I.fail(Kind::Concat, "dim " + std::to_string(dim) + " is out of range for rank " + std::to_string(rank),
                  "pass a dim in [-rank, rank)");
  }
  Node n;
  n.kind = Kind::Concat;
  n.shape = s0;
  n.shape[static_cast<std::size_t>(d)] = 0;
  for (std::size_t i = 0; i < xs.size(); ++i) {
    const auto& s = I.shape(xs[i]);
    bool same = s.size() == s0.size();
    for (std::size_t j = 0; same && j < s.size(); ++j) same = j == static_cast<std::size_t>(d) || s[j] == s0[j];
    if (!same) {
      return I.fail(Kind::Concat, "input " + std::to_string(i) + " has shape " + shape_text(s) +
                                      ", input 0 has " + shape_text(s0) + "; they may differ only at dim " + std::to_string(d),
                    "make the other dimensions match");
    }
    n.in.push_back(xs[i].id);
    n.sizes.push_back(s[static_cast<std::size_t>(d)]);
    n.shape[static_cast<std::size_t>(d)] += s[static_cast<std::size_t>(d)];
  }
  n.outer = std::accumulate(s0.begin(), s0.begin() + d, std::int64_t{1}, std::multiplies<>());
  n.inner = std::accumulate(s0.begin() + d + 1, s0.end(), std::int64_t{1}, std::multiplies<>());
  return I.push(std::move(n));
}

// ---------------------------------------------------------------------------------------------
// CompiledNet

struct CompiledNet::Impl {
  std::vector<Step> steps;
  std::vector<std::string> input_names, output_names;
  std::vector<std::vector<std::int64_t>> input_shapes, output_shapes;
  std::vector<Loc> output_locs;
  std::vector<Node> nodes;
  std::size_t arena_bytes = 0, unshared_bytes = 0, live_peak = 0, weight_bytes = 0;
  float* arena = nullptr;
  std::atomic<bool> busy{false};

  ~Impl() { std::free(arena); }
};

CompiledNet::CompiledNet() = default;
CompiledNet::~CompiledNet() = default;
CompiledNet::CompiledNet(CompiledNet&&) noexcept = default;
CompiledNet& CompiledNet::operator=(CompiledNet&&) noexcept = default;

std::size_t CompiledNet::input_count() const { return impl_->input_names.size(); }
std::size_t CompiledNet::output_count() const { return impl_->output_names.size(); }
const std::string& CompiledNet::input_name(std::size_t i) const { return impl_->input_names.at(i); }
const std::string& CompiledNet::output_name(std::size_t i) const { return impl_->output_names.at(i); }
std::vector<std::int64_t> CompiledNet::input_shape(std::size_t i) const { return impl_->input_shapes.at(i); }
std::vector<std::int64_t> CompiledNet::output_shape(std::size_t i) const { return impl_->output_shapes.at(i); }
std::size_t CompiledNet::arena_bytes() const { return impl_->arena_bytes; }
std::size_t CompiledNet::unshared_bytes() const { return impl_->unshared_bytes; }
std::size_t CompiledNet::live_peak_bytes() const { return impl_->live_peak; }
std::size_t CompiledNet::weight_bytes() const { return impl_->weight_bytes; }

std::string CompiledNet::describe() const {
  std::string out;
  for (std::size_t i = 0; i < impl_->steps.size(); ++i) {
    const Step& s = impl_->steps[i];
    out += std::to_string(i) + ": " + kind_name(s.kind);
    if (s.conv && s.conv->activation() != Activation::None) out += "+" + std::string(activation_name(s.conv->activation()));
    if (s.linear && s.linear->activation() != Activation::None) out += "+" + std::string(activation_name(s.linear->activation()));
    out += " ";
    for (const auto& sh : s.in_shapes) out += shape_text(sh);
    out += " -> " + shape_text(s.out_shape);
    out += s.out.where == Loc::Arena ? " @" + std::to_string(s.out.index) : " @input";
    if (s.in_place) out += " (in place)";
    out += "\n";
  }
  out += "arena " + std::to_string(impl_->arena_bytes) + " B (live peak " + std::to_string(impl_->live_peak) +
         " B, unshared " + std::to_string(impl_->unshared_bytes) + " B), weights " +
         std::to_string(impl_->weight_bytes) + " B\n";
  return out;
}

Result<CompiledNet> Net::compile(const CompileOptions& opt) const {
  const Impl& I = *impl_;
  if (!I.error.ok()) return I.error;
  if (I.outputs.empty()) return invalid_input("net has no outputs", "call output(name, value) for each result");
  std::vector<Node> nodes = I.nodes;  // compile() is const: folding works on a copy
  const std::size_t nn = nodes.size();

  // Uses per value (outputs count as a use that no fusion may remove).
  std::vector<int> uses(nn, 0);
  std::vector<bool> is_output(nn, false);
  for (const Node& n : nodes) for (std::uint32_t v : n.in) ++uses[v];
  for (const auto& o : I.outputs) is_output[o.second] = true;
  // repl[v]: the value that stands for v after folding (identity unless v was fused away).
  std::vector<std::uint32_t> repl(nn);
  std::iota(repl.begin(), repl.end(), 0u);
  auto resolve = [&](std::uint32_t v) { while (repl[v] != v) v = repl[v]; return v; };
  std::vector<bool> dead(nn, false);

  for (std::uint32_t i = 0; i < nn; ++i) {
    Node& n = nodes[i];
    if (n.kind != Kind::Affine && n.kind != Kind::Act) continue;
    const std::uint32_t src = resolve(n.in[0]);
    Node& p = nodes[src];
    if (uses[src] != 1 || is_output[src] || p.act != Activation::None) continue;
    if (n.kind == Kind::Affine && opt.fold_batchnorm && p.kind == Kind::Conv) {
      // w'[oc] = w[oc] * scale[oc]; b'[oc] = b[oc] * scale[oc] + shift[oc].
      p.pconv = p.pconv->folded(n.affine.scale, n.affine.shift);
    } else if (n.kind == Kind::Act && opt.fuse_activations && n.act != Activation::None &&
               (p.kind == Kind::Conv || p.kind == Kind::Linear)) {
      p.act = n.act;
      if (p.pconv) p.pconv = p.pconv->with_activation(n.act);
      if (p.plin) p.plin = p.plin->with_activation(n.act);
    } else {
      continue;
    }
    repl[i] = src;
    dead[i] = true;
    uses[src] = uses[i];
    is_output[src] = is_output[i];
  }

  CompiledNet out;
  out.impl_ = std::make_unique<CompiledNet::Impl>();
  CompiledNet::Impl& C = *out.impl_;
  C.input_names = I.input_names;
  for (std::uint32_t v : I.inputs) C.input_shapes.push_back(nodes[v].shape);

  // Storage roots: a view or an in-place step stores into its input's block.
  std::vector<std::uint32_t> root(nn);
  std::iota(root.begin(), root.end(), 0u);
  std::vector<int> input_index(nn, -1);
  for (std::size_t k = 0; k < I.inputs.size(); ++k) input_index[I.inputs[k]] = static_cast<int>(k);
  // Last step (in node order) that reads each root; outputs live to the end.
  std::vector<std::size_t> def(nn, 0), last(nn, 0);
  std::vector<std::uint32_t> order;  // live nodes in order
  for (std::uint32_t i = 0; i < nn; ++i) {
    if (dead[i]) continue;
    Node& n = nodes[i];
    for (auto& v : n.in) v = resolve(v);
    order.push_back(i);
  }
  // Remaining uses per value (after fusion) to decide in-place at each step.
  std::vector<int> remaining(nn, 0);
  for (std::uint32_t i : order) for (std::uint32_t v : nodes[i].in) ++remaining[root[v]];
  std::vector<std::uint32_t> outs_resolved;
  for (const auto& o : I.outputs) {
    const std::uint32_t v = resolve(o.second);
    outs_resolved.push_back(v);
  }
  std::vector<bool> out_value(nn, false);
  for (std::uint32_t v : outs_resolved) out_value[v] = true;

  // Pass 1: roots (views, in place), definition and last-use positions per root.
  std::vector<bool> in_place(nn, false);
  for (std::size_t pos = 0; pos < order.size(); ++pos) {
    const std::uint32_t i = order[pos];
    Node& n = nodes[i];
    for (std::uint32_t v : n.in) last[root[v]] = std::max(last[root[v]], pos + 1);
    if (n.kind == Kind::View) {
      root[i] = root[n.in[0]];
    } else if (opt.in_place && (n.kind == Kind::Act || n.kind == Kind::Affine) &&
               input_index[root[n.in[0]]] < 0 && !out_value[n.in[0]]) {
      // In place when this is the input block's last reader (and nothing else aliases it later).
      const std::uint32_t r = root[n.in[0]];
      int later = 0;
      for (std::size_t q = pos + 1; q < order.size(); ++q) {
        for (std::uint32_t v : nodes[order[q]].in) later += root[v] == r ? 1 : 0;
      }
      if (later == 0) {
        root[i] = r;
        in_place[i] = true;
      }
    }
    if (root[i] == i) def[i] = pos + 1;
  }
  for (std::uint32_t v : outs_resolved) last[root[v]] = order.size() + 1;

  // Blocks: arena roots (not inputs), plus one workspace per conv.
  struct Block {
    std::size_t bytes, begin, end, offset = 0;  // live over [begin, end]
  };
  std::vector<Block> blocks;
  std::vector<std::size_t> block_of(nn, SIZE_MAX), ws_block(nn, SIZE_MAX);
  std::vector<std::optional<PackedConv2d>> convs(nn);
  std::vector<std::optional<PackedLinear>> linears(nn);
  for (std::size_t pos = 0; pos < order.size(); ++pos) {
    const std::uint32_t i = order[pos];
    Node& n = nodes[i];
    if (root[i] == i && n.kind != Kind::Input) {
      block_of[i] = blocks.size();
      blocks.push_back({align_up(static_cast<std::size_t>(numel(n.shape)) * sizeof(float)), pos + 1,
                        std::max(last[i], pos + 1)});
    }
    if (n.kind == Kind::Conv) {
      const auto& xs = nodes[n.in[0]].shape;
      ws_block[i] = blocks.size();
      blocks.push_back({align_up(n.pconv->workspace_floats(xs[2], xs[3]) * sizeof(float)), pos + 1, pos + 1});
      C.weight_bytes += n.pconv->bytes();
      convs[i] = n.pconv;
    } else if (n.kind == Kind::Linear) {
      C.weight_bytes += n.plin->bytes();
      linears[i] = n.plin;
    } else if (n.kind == Kind::Affine || n.kind == Kind::LayerNorm) {
      C.weight_bytes += (n.affine.scale.size() + n.affine.shift.size() + n.w.size() + n.b.size()) * sizeof(float);
    }
  }

  // Placement by the graph stage's planner (ArenaPlacement.h): biggest first, each at the
  // lowest offset free over its lifetime. An empty block (a workspace of no floats) is never
  // read or written: it stays at offset 0, unplaced.
  {
    std::vector<graph::Lifetime> lifetimes;
    std::vector<std::size_t> placed_block;
    for (std::size_t i = 0; i < blocks.size(); ++i) {
      C.unshared_bytes += blocks[i].bytes;
      if (blocks[i].bytes == 0) continue;
      lifetimes.push_back({blocks[i].bytes, static_cast<std::uint32_t>(blocks[i].begin),
                           static_cast<std::uint32_t>(blocks[i].end)});
      placed_block.push_back(i);
    }
    const graph::ArenaPlacement placed = graph::place_in_arena(lifetimes);
    for (std::size_t k = 0; k < placed_block.size(); ++k)
      blocks[placed_block[k]].offset = static_cast<std::size_t>(placed.offsets[k]);
    C.arena_bytes = static_cast<std::size_t>(placed.arena_bytes);
  }
  for (std::size_t pos = 1; pos <= order.size() + 1; ++pos) {
    std::size_t live = 0;
    for (const Block& b : blocks) live += (b.begin <= pos && pos <= b.end) ? b.bytes : 0;
    C.live_peak = std::max(C.live_peak, live);
  }

  auto loc = [&](std::uint32_t v) {
    const std::uint32_t r = root[v];
    if (input_index[r] >= 0) return Loc{Loc::Input, static_cast<std::size_t>(input_index[r])};
    return Loc{Loc::Arena, blocks[block_of[r]].offset};
  };
  for (std::uint32_t i : order) {
    Node& n = nodes[i];
    if (n.kind == Kind::Input || n.kind == Kind::View) continue;
    Step s{n.kind, i, {}, loc(i), {}, {}, n.shape, std::move(convs[i]), std::move(linears[i]), in_place[i]};
    for (std::uint32_t v : n.in) {
      s.in.push_back(loc(v));
      s.in_shapes.push_back(nodes[v].shape);
    }
    if (n.kind == Kind::Conv) s.workspace = Loc{Loc::Arena, blocks[ws_block[i]].offset};
    C.steps.push_back(std::move(s));
  }
  for (std::size_t k = 0; k < I.outputs.size(); ++k) {
    C.output_names.push_back(I.outputs[k].first);
    C.output_shapes.push_back(nodes[outs_resolved[k]].shape);
    C.output_locs.push_back(loc(outs_resolved[k]));
  }
  for (Node& n : nodes) {  // the steps hold the packed layers
    n.pconv.reset();
    n.plin.reset();
  }
  C.arena = static_cast<float*>(std::aligned_alloc(kAlign, std::max<std::size_t>(C.arena_bytes, kAlign)));
  if (C.arena == nullptr) {
    return exhausted("cannot allocate the " + std::to_string(C.arena_bytes) + "-byte activation arena",
                     "free memory or use a smaller batch");
  }
  C.nodes = std::move(nodes);  // the other layers' parameters
  return out;
}

Status CompiledNet::run(std::span<const float* const> inputs, std::span<float* const> outputs) {
  return run_timed(inputs, outputs, nullptr);
}

Result<std::vector<double>> CompiledNet::profile(std::span<const float* const> inputs,
                                                 std::span<float* const> outputs, int iterations) {
  if (!impl_) return bad_state("profile() on an empty CompiledNet", "use the result of Net::compile()");
  if (iterations < 1) return invalid_input("profile: iterations must be >= 1", "pass a positive count");
  const std::size_t n = impl_->steps.size();
  std::vector<double> all(n * static_cast<std::size_t>(iterations));
  for (int it = 0; it < iterations; ++it) {
    CRUCIBLE_RETURN_IF_ERROR(run_timed(inputs, outputs, all.data() + static_cast<std::size_t>(it) * n));
  }
  std::vector<double> median(n), one(static_cast<std::size_t>(iterations));
  for (std::size_t s = 0; s < n; ++s) {
    for (int it = 0; it < iterations; ++it) one[static_cast<std::size_t>(it)] = all[static_cast<std::size_t>(it) * n + s];
    std::nth_element(one.begin(), one.begin() + iterations / 2, one.end());
    median[s] = one[static_cast<std::size_t>(iterations / 2)];
  }
  return median;
}

Status CompiledNet::run_timed(std::span<const float* const> inputs, std::span<float* const> outputs,
                              double* step_us) {
  if (!impl_) return bad_state("run() on an empty CompiledNet", "use the result of Net::compile()");
  Impl& C = *impl_;
  if (inputs.size() != C.input_names.size() || outputs.size() != C.output_names.size()) {
    return invalid_input("run() got " + std::to_string(inputs.size()) + " inputs and " +
                             std::to_string(outputs.size()) + " outputs; the net has " +
                             std::to_string(C.input_names.size()) + " and " +
                             std::to_string(C.output_names.size()),
                         "pass one buffer per input() and per output(), in declaration order");
  }
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    if (inputs[i] == nullptr) {
      return invalid_input("input " + std::to_string(i) + " ('" + C.input_names[i] + "') is null",
                           "pass a buffer of " + std::to_string(numel(C.input_shapes[i])) + " floats");
    }
  }
  for (std::size_t i = 0; i < outputs.size(); ++i) {
    if (outputs[i] == nullptr) {
      return invalid_input("output " + std::to_string(i) + " ('" + C.output_names[i] + "') is null",
                           "pass a buffer of " + std::to_string(numel(C.output_shapes[i])) + " floats");
    }
  }
  bool expected = false;
  if (!C.busy.compare_exchange_strong(expected, true, std::memory_order_acquire)) {
    return bad_state("run() called while another run() of the same CompiledNet is in progress",
                     "compile one CompiledNet per thread (they share nothing)");
  }
  auto* arena = reinterpret_cast<std::byte*>(C.arena);
  auto ptr = [&](const Loc& l) -> float* {
    if (l.where == Loc::Input) return const_cast<float*>(inputs[l.index]);
    return reinterpret_cast<float*>(arena + l.index);
  };
  for (std::size_t si = 0; si < C.steps.size(); ++si) {
    const Step& s = C.steps[si];
    const auto t0 = step_us ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{};
    const Node& n = C.nodes[s.node];
    float* y = ptr(s.out);
    const float* x = s.in.empty() ? nullptr : ptr(s.in[0]);
    const auto& xs = s.in_shapes.empty() ? s.out_shape : s.in_shapes[0];
    switch (s.kind) {
      case Kind::Conv:
        s.conv->run(x, xs[0], xs[2], xs[3], y, ptr(s.workspace));
        break;
      case Kind::Linear:
        s.linear->run(x, numel(xs) / n.in_features, y);
        break;
      case Kind::Act:
        activation(n.act, x, y, numel(xs));
        break;
      case Kind::Affine:
        channel_affine(n.affine, x, y, xs[0], numel(xs) / (xs[0] * xs[1]));
        break;
      case Kind::LayerNorm:
        layernorm(x, y, n.outer, n.mid, n.w.empty() ? nullptr : n.w.data(),
                  n.b.empty() ? nullptr : n.b.data(), n.eps);
        break;
      case Kind::Softmax:
        softmax(x, y, n.outer, n.mid, n.inner);
        break;
      case Kind::MaxPool:
      case Kind::AvgPool: {
        const std::int64_t h = xs[xs.size() - 2], w = xs.back();
        (s.kind == Kind::MaxPool ? maxpool2d : avgpool2d)(n.pool, x, numel(xs) / (h * w), h, w, y);
        break;
      }
      case Kind::AdaptiveAvg: {
        const std::int64_t h = xs[xs.size() - 2], w = xs.back();
        adaptive_avgpool2d(x, numel(xs) / (h * w), h, w, s.out_shape[s.out_shape.size() - 2],
                           s.out_shape.back(), y);
        break;
      }
      case Kind::Pad: {
        const std::int64_t h = xs[xs.size() - 2], w = xs.back();
        pad2d(n.pad, x, numel(xs) / (h * w), h, w, y);
        break;
      }
      case Kind::Binary:
        binary(n.bop, x, s.in_shapes[0], ptr(s.in[1]), s.in_shapes[1], y);
        break;
      case Kind::Concat: {
        // Inputs are at most a handful; a fixed array keeps run() allocation-free.
        constexpr std::size_t kInline = 16;
        const float* xs_inline[kInline];
        std::vector<const float*> xs_heap;
        const float** xp = xs_inline;
        if (s.in.size() > kInline) {
          xs_heap.resize(s.in.size());
          xp = xs_heap.data();
        }
        for (std::size_t k = 0; k < s.in.size(); ++k) xp[k] = ptr(s.in[k]);
        concat(std::span<const float* const>(xp, s.in.size()), n.sizes, n.outer, n.inner, y);
        break;
      }
      case Kind::Input:
      case Kind::View:
        break;
    }
    if (step_us) {
      step_us[si] = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
    }
  }
  for (std::size_t k = 0; k < outputs.size(); ++k) {
    const float* src = ptr(C.output_locs[k]);
    std::memmove(outputs[k], src, static_cast<std::size_t>(numel(C.output_shapes[k])) * sizeof(float));
  }
  C.busy.store(false, std::memory_order_release);
  return ok_status();
}

}  // namespace crucible::runtime
