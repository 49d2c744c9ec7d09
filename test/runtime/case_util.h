// case_util.h — reads what make_layer_cases.py wrote and compares float buffers with PyTorch's.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include "crucible/core/Status.h"
#include "crucible/ptload/PickleValue.h"
#include "crucible/ptload/StateDict.h"
#include "crucible/runtime/Cpu.h"
#include "crucible/runtime/Net.h"

namespace crucible::runtime::test {

// CRUCIBLE_RUNTIME_CASES is the generator's output directory (a compile definition).
inline std::string cases_path(const std::string& file) {
  return std::string(CRUCIBLE_RUNTIME_CASES) + "/" + file;
}

struct Tensor {
  std::vector<std::int64_t> shape;
  std::vector<float> data;
};

inline Tensor to_tensor(const ptload::TensorView& t) {
  return {std::vector<std::int64_t>(t.sizes().begin(), t.sizes().end()), t.materialize_f32()};
}

inline std::int64_t numel(const std::vector<std::int64_t>& shape) {
  std::int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

inline std::string shape_str(const std::vector<std::int64_t>& s) {
  std::string out = "[";
  for (std::size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

inline bool contains_ci(const std::string& hay, const std::string& needle) {
  auto lower = [](std::string s) {
    for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return s;
  };
  return lower(hay).find(lower(needle)) != std::string::npos;
}
// Status messages are Abseil's own string_view here (not std::).
inline bool contains_ci(absl::string_view hay, const std::string& needle) {
  return contains_ci(std::string(hay.data(), hay.size()), needle);
}

inline Activation parse_activation(const std::string& s) {
  if (s == "relu") return Activation::Relu;
  if (s == "gelu") return Activation::Gelu;
  if (s == "gelu_tanh") return Activation::GeluTanh;
  if (s == "sigmoid") return Activation::Sigmoid;
  if (s == "tanh") return Activation::Tanh;
  EXPECT_EQ(s, "none") << "unknown activation in the cases file";
  return Activation::None;
}

// One layer call from layer_cases.pt.
struct LayerCase {
  std::string name, op;
  ptload::PickleValue params;
  std::vector<Tensor> inputs;
  std::map<std::string, Tensor> weights;
  Tensor expected;
  std::optional<Tensor> scale;  // conv2d/linear: the op on |x|, |w|, |b|

  const ptload::PickleValue& param(std::string_view key) const {
    const ptload::PickleValue* v = params.get(key);
    if (v == nullptr) {
      ADD_FAILURE() << name << ": no parameter '" << key << "'";
      static const ptload::PickleValue none;
      return none;
    }
    return *v;
  }
  std::int64_t i(std::string_view key) const { return param(key).as_int(); }
  double f(std::string_view key) const { return param(key).as_float(); }
  bool b(std::string_view key) const { return param(key).as_bool(); }
  std::string s(std::string_view key) const { return param(key).as_string(); }
  std::vector<std::int64_t> ints(std::string_view key) const {
    std::vector<std::int64_t> out;
    for (const auto& v : param(key).items()) out.push_back(v.as_int());
    return out;
  }
  std::span<const float> w(const std::string& key) const {
    auto it = weights.find(key);
    return it == weights.end() ? std::span<const float>() : std::span<const float>(it->second.data);
  }
  bool has(const std::string& key) const { return weights.count(key) != 0; }
};

inline Result<std::vector<LayerCase>> load_layer_cases() {
  auto sd = ptload::StateDict::open(cases_path("layer_cases.pt"));
  if (!sd.ok()) return sd.status();
  const ptload::PickleValue* list = sd->root().get("cases");
  if (list == nullptr) return invalid_input("layer_cases.pt has no 'cases'", "rerun the generator");
  std::vector<LayerCase> out;
  for (const auto& c : list->items()) {
    LayerCase lc;
    lc.name = c.get("name")->as_string();
    lc.op = c.get("op")->as_string();
    lc.params = *c.get("params");
    for (const auto& t : c.get("inputs")->items()) lc.inputs.push_back(to_tensor(t.as_tensor()));
    for (const auto& [k, v] : c.get("weights")->entries()) {
      lc.weights[k.as_string()] = to_tensor(v.as_tensor());
    }
    lc.expected = to_tensor(c.get("expected")->as_tensor());
    if (const auto* s = c.get("scale")) lc.scale = to_tensor(s->as_tensor());
    out.push_back(std::move(lc));
  }
  return out;
}

// Loaded once per process (every test binary reads the same file).
inline const Result<std::vector<LayerCase>>& layer_cases() {
  static const Result<std::vector<LayerCase>> cases = load_layer_cases();
  return cases;
}

// Elementwise |got - exp| <= tol(i); the worst element is the one with the largest ratio.
struct Comparison {
  std::size_t count = 0, bad = 0, worst = 0;
  double worst_ratio = 0.0, worst_err = 0.0, worst_tol = 0.0;
  float worst_got = 0.0f, worst_exp = 0.0f;
  bool ok() const { return bad == 0; }
  std::string describe() const {
    std::ostringstream o;
    o << bad << "/" << count << " elements off; worst [" << worst << "] got " << worst_got
      << " expected " << worst_exp << " |err| " << worst_err << " tol " << worst_tol;
    return o.str();
  }
};

inline Comparison compare(std::span<const float> got, std::span<const float> exp,
                          const std::function<double(std::size_t)>& tol) {
  Comparison c;
  c.count = exp.size();
  for (std::size_t i = 0; i < exp.size() && i < got.size(); ++i) {
    const double e = exp[i], g = got[i], t = tol(i);
    double err = std::fabs(g - e);
    if (std::isnan(g) != std::isnan(e) || std::isinf(g) != std::isinf(e)) {
      err = std::numeric_limits<double>::infinity();
    } else if (std::isnan(e) || (std::isinf(e) && g == e)) {
      err = 0.0;
    }
    const double ratio = t > 0 ? err / t : (err > 0 ? std::numeric_limits<double>::infinity() : 0);
    if (ratio > 1.0) ++c.bad;
    if (ratio > c.worst_ratio || (c.worst_ratio == 0.0 && i == 0)) {
      c.worst_ratio = ratio;
      c.worst = i;
      c.worst_err = err;
      c.worst_tol = t;
      c.worst_got = got[i];
      c.worst_exp = exp[i];
    }
  }
  if (got.size() != exp.size()) c.bad += 1;
  return c;
}

// Every compiled net satisfies what Net.h promises of its arena plan.
inline void expect_arena_properties(const CompiledNet& plan, const std::string& what) {
  EXPECT_LE(plan.live_peak_bytes(), plan.arena_bytes()) << what << "\n" << plan.describe();
  EXPECT_LE(plan.arena_bytes(), plan.unshared_bytes()) << what << "\n" << plan.describe();
}

// Restores the ISA that was active before a test switched it.
struct IsaGuard {
  Isa saved = current_isa();
  ~IsaGuard() { (void)set_isa(saved); }
};

}  // namespace crucible::runtime::test
