// Report.cpp — the hardware table, `crucible plan` (groups, edges, memory fit, roofline) and
// `crucible venn` (each node's kernel family on the target, ranked by estimated time share).
#include "crucible/forge/Report.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>

#include "crucible/core/ScalarType.h"
#include "crucible/forge/Digest.h"
#include "crucible/record/Trace.h"

namespace crucible::forge {
namespace {

using K = CKernel;

// Note [Hardware table]: ceilings and estimates, not measurements (measured = false everywhere).
//   cpu-avx2  this project's machine class, one core: AMD EPYC (Zen 4) at 2.6 GHz, 2 FMA pipes x
//             8 f32 lanes x 2 FLOP = 32 FLOP/cycle = 83.2 GFLOP/s; DRAM 20 GB/s for one core
//             (a memcpy of 256 MiB moved 21.5 GB/s read + write on the build machine); budget
//             16 GiB of its 23.5 GiB RAM. Families: what src/runtime implements.
//   h200      NVIDIA H200 SXM datasheet: 141 GB HBM3e at 4.8 TB/s, 989 TFLOPS dense BF16/FP16
//             tensor core, 67 TFLOPS FP32; budget 90% of capacity (CUDA context, allocator
//             slack). Families: every kind has CUDA kernels (PyTorch's own at worst).
const std::vector<Hardware>& hardware_table() {
  static const std::vector<Hardware> t = {
      {"cpu-avx2",
       "x86-64 AVX2+FMA, 1 core (AMD EPYC Zen 4 @ 2.6 GHz): 83.2 GFLOP/s f32, ~20 GB/s DRAM "
       "(estimates), 16 GiB budget",
       83.2e9,
       0,
       20e9,
       std::int64_t{16} << 30,
       false,
       {K::Gemm, K::Conv, K::PointwiseUnary, K::PointwiseBinary, K::Norm, K::Softmax, K::View,
        K::DataMovement, K::Pooling},
       "estimate"},
      {"h200",
       "NVIDIA H200 SXM (datasheet): 141 GB HBM3e, 4.8 TB/s, 989 TFLOPS dense BF16, 67 TFLOPS "
       "FP32; budget 90% of 141 GB",
       989e12,
       67e12,
       4.8e12,
       static_cast<std::int64_t>(141e9 * 0.9),
       false,
       {K::Gemm, K::Conv, K::PointwiseUnary, K::PointwiseBinary, K::Reduce, K::Norm, K::Softmax,
        K::Embedding, K::View, K::DataMovement, K::Rng, K::OptimizerUpdate, K::Collective, K::Loss,
        K::Pooling, K::Factory}},
  };
  return t;
}

std::string fmt(const char* f, double x) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, x);
  return buf;
}
std::string human_bytes(double b) {
  if (b >= 1e9) return fmt("%.2f GB", b / 1e9);
  if (b >= 1e6) return fmt("%.2f MB", b / 1e6);
  if (b >= 1e3) return fmt("%.1f kB", b / 1e3);
  return fmt("%.0f B", b);
}
std::string human_flops(double f) {
  if (f >= 1e12) return fmt("%.2f TFLOP", f / 1e12);
  if (f >= 1e9) return fmt("%.2f GFLOP", f / 1e9);
  if (f >= 1e6) return fmt("%.2f MFLOP", f / 1e6);
  if (f >= 1e3) return fmt("%.1f kFLOP", f / 1e3);
  return fmt("%.0f FLOP", f);
}
std::string human_time(double s) {
  if (s >= 1) return fmt("%.3f s", s);
  if (s >= 1e-3) return fmt("%.3f ms", s * 1e3);
  return fmt("%.3f us", s * 1e6);
}
std::string pad(std::string s, std::size_t w) {
  if (s.size() < w) s.append(w - s.size(), ' ');
  return s;
}

std::string_view ceiling_label(const Hardware& hw) {
  return hw.measured ? std::string_view("measured") : hw.source;
}

double peak_for(const Hardware& hw, const NumericalRecipe* r) {
  const bool low_precision =
      r != nullptr && (r->io_dtype == dtype::kBFloat16 || r->io_dtype == dtype::kFloat16);
  if (low_precision || hw.peak_flops_f32 <= 0) return hw.peak_flops;
  return hw.peak_flops_f32;
}

struct Roof {
  double time = 0;
  bool compute_bound = false;
};
Roof roofline(const Hardware& hw, const NumericalRecipe* r, std::int64_t flops,
              std::int64_t bytes) {
  const double tm = hw.bandwidth > 0 ? static_cast<double>(bytes) / hw.bandwidth : 0;
  const double peak = peak_for(hw, r);
  const double tc = peak > 0 ? static_cast<double>(flops) / peak : 0;
  return {std::max(tm, tc), tc > tm};
}

std::string recipe_label(const NumericalRecipe* r) {
  if (r == nullptr) return "-";
  const std::string_view n = recipe_name(r);
  return n.empty() ? recipe_text(*r) : std::string(n);
}

// Note [Memory fit]: storages, not values, hold bytes (a view and an in-place result share
// their base's). A storage is a weight when some external value in it is a parameter or buffer,
// state when one is optimizer state or a gradient. The activation arena holds every other
// storage that a kernel writes to memory: each lives from the first group that writes it to the
// last group that reads it (to the end of the step when live-out), sized by its largest non-view
// value and aligned to 256 bytes; blocks are placed first-fit by (start, larger first, storage)
// and the arena is the highest end. This is a plan for the step, not a measurement.
struct MemoryFit {
  std::int64_t weights = 0, state = 0, arena = 0, materialized = 0;
  std::size_t blocks = 0;
};
MemoryFit memory_fit(const Ir001& ir, const Ir002& plan) {
  MemoryFit m;
  constexpr std::int64_t kAlign = 256;
  // storage key: the storage id, or (1 << 63 | value id) for a value without one.
  auto key_of = [&](std::uint32_t v) {
    const std::uint64_t s = ir.values[v].storage;
    return s != 0 ? s : (std::uint64_t{1} << 63) | v;
  };
  std::map<std::uint64_t, int> persistent;  // 1 = weights, 2 = state
  for (std::uint32_t v = 0; v < ir.values.size(); ++v) {
    const Value& val = ir.values[v];
    if (val.producer != kNoNode) continue;
    const auto e = static_cast<record::ExternalKind>(val.external);
    if (e == record::ExternalKind::Parameter || e == record::ExternalKind::Buffer) {
      persistent[key_of(v)] = 1;
    } else if (e == record::ExternalKind::OptimizerState || e == record::ExternalKind::Gradient) {
      persistent.emplace(key_of(v), 2);
    }
  }
  std::map<std::uint64_t, std::int64_t> persistent_bytes;
  for (std::uint32_t v = 0; v < ir.values.size(); ++v) {
    auto it = persistent.find(key_of(v));
    if (it == persistent.end() || ir.values[v].is_view) continue;
    auto& b = persistent_bytes[it->first];
    b = std::max(b, ir.values[v].nbytes);
  }
  for (const auto& [k, b] : persistent_bytes) (persistent[k] == 1 ? m.weights : m.state) += b;

  struct Block {
    std::uint64_t key;
    std::int64_t bytes = 0;
    std::uint32_t start = UINT32_MAX, end = 0;
    std::int64_t offset = 0;
  };
  std::map<std::uint64_t, Block> blocks;
  const auto last_group =
      plan.groups.empty() ? 0u : static_cast<std::uint32_t>(plan.groups.size() - 1);
  for (const KernelNode& k : plan.kernels) {
    for (std::uint32_t v : k.outputs) {
      const std::uint64_t key = key_of(v);
      if (persistent.contains(key)) continue;
      Block& b = blocks[key];
      b.key = key;
      if (!ir.values[v].is_view) b.bytes = std::max(b.bytes, ir.values[v].nbytes);
      b.start = std::min(b.start, k.group);
      b.end = std::max(b.end, ir.values[v].live_out ? last_group : k.group);
      m.materialized += ir.values[v].is_view ? 0 : ir.values[v].nbytes;
    }
  }
  for (const Edge& e : plan.edges) {
    if (e.state != EdgeState::Materialized) continue;
    auto it = blocks.find(key_of(e.value));
    if (it != blocks.end()) it->second.end = std::max(it->second.end, e.to_group);
  }
  std::vector<Block*> order;
  for (auto& [k, b] : blocks) {
    b.bytes = (b.bytes + kAlign - 1) / kAlign * kAlign;
    if (b.bytes > 0) order.push_back(&b);
  }
  std::sort(order.begin(), order.end(), [](const Block* a, const Block* b) {
    if (a->start != b->start) return a->start < b->start;
    if (a->bytes != b->bytes) return a->bytes > b->bytes;
    return a->key < b->key;
  });
  std::vector<const Block*> placed;
  for (Block* b : order) {
    // Live blocks that overlap b in time, by offset; take the first gap that fits.
    std::vector<const Block*> live;
    for (const Block* p : placed)
      if (p->start <= b->end && b->start <= p->end) live.push_back(p);
    std::sort(live.begin(), live.end(),
              [](const Block* x, const Block* y) { return x->offset < y->offset; });
    std::int64_t off = 0;
    for (const Block* p : live) {
      if (p->offset >= off + b->bytes) break;
      off = std::max(off, p->offset + p->bytes);
    }
    b->offset = off;
    m.arena = std::max(m.arena, off + b->bytes);
    placed.push_back(b);
  }
  m.blocks = placed.size();
  return m;
}

std::string group_ops(const Ir001& ir, const FusionGroup& g) {
  std::string s;
  for (std::uint32_t n : g.nodes) {
    if (!s.empty()) s += " + ";
    s += n < ir.nodes.size() ? ir.nodes[n].op : "?";
  }
  return s;
}

nlohmann::json hardware_json(const Hardware& hw) {
  return {{"name", hw.name},
          {"description", hw.description},
          {"peak_flops", hw.peak_flops},
          {"peak_flops_f32", hw.peak_flops_f32 > 0 ? hw.peak_flops_f32 : hw.peak_flops},
          {"bandwidth", hw.bandwidth},
          {"memory_bytes", hw.memory_bytes},
          {"label", ceiling_label(hw)}};
}

}  // namespace

const Hardware* hardware_by_name(std::string_view name) {
  for (const Hardware& h : hardware_table())
    if (h.name == name) return &h;
  return nullptr;
}

std::vector<std::string_view> hardware_names() {
  std::vector<std::string_view> out;
  for (const Hardware& h : hardware_table()) out.push_back(h.name);
  return out;
}

PlanReport plan_report(const FrontEndResult& fe, const RuleSet& rules, const Hardware& hw) {
  const Ir001& ir = fe.ir;
  const Ir002& plan = fe.plan;
  nlohmann::json j;
  j["hardware"] = hardware_json(hw);
  j["rules"] = {{"class", rules.hardware}, {"chain", rules.chain}, {"digest", rules.digest}};
  j["plan_digest"] = fe.plan_digest;

  std::string t;
  std::string chain;
  for (const std::string& c : rules.chain) chain += (chain.empty() ? "" : " <- ") + c;
  t += "plan for " + std::string(hw.name) + ": " + std::string(hw.description) + "\n";
  t += "rules " + chain + "  digest " + rules.digest.substr(0, 16) + "\n";
  t += "plan digest " + fe.plan_digest + "\n\n";

  // Groups.
  std::size_t fused_nodes = 0, multi = 0, opaque = 0, view_groups = 0, view_ops = 0;
  double total_time = 0;
  std::size_t compute_bound = 0;
  std::int64_t total_flops = 0, total_bytes = 0;
  nlohmann::json groups = nlohmann::json::array();
  t += pad("group", 7) + pad("kernel", 17) + pad("recipe", 25) + pad("rule", 28) + pad("time", 12) +
       pad("bound", 9) + "ops\n";
  for (std::size_t g = 0; g < plan.groups.size(); ++g) {
    const FusionGroup& grp = plan.groups[g];
    const KernelNode& k = plan.kernels[g];
    const Roof r = roofline(hw, grp.recipe, k.flops, k.bytes);
    total_time += r.time;
    total_flops += k.flops;
    total_bytes += k.bytes;
    compute_bound += r.compute_bound;
    if (grp.nodes.size() > 1) {
      ++multi;
      fused_nodes += grp.nodes.size();
    }
    bool moves = false;  // a group of views only is no kernel: nothing runs, no bytes move
    for (std::uint32_t n : grp.nodes) {
      moves |= ir.nodes[n].kind != CKernel::View;
      view_ops += ir.nodes[n].kind == CKernel::View;
    }
    view_groups += !moves;
    opaque += grp.kernel == KernelTemplate::Opaque;
    const std::string rule = grp.rule.empty() ? "(budget fallback)" : grp.rule;
    t += pad(std::to_string(grp.id), 7) + pad(std::string(kernel_template_name(grp.kernel)), 17) +
         pad(recipe_label(grp.recipe), 25) + pad(rule, 28) + pad(human_time(r.time), 12) +
         pad(r.compute_bound ? "compute" : "memory", 9) + group_ops(ir, grp) + "\n";
    nlohmann::json nodes = nlohmann::json::array();
    for (std::uint32_t n : grp.nodes)
      nodes.push_back(
          {{"id", n}, {"op", ir.nodes[n].op}, {"kind", ckernel_info(ir.nodes[n].kind).name}});
    groups.push_back({{"id", grp.id},
                      {"kernel", kernel_template_name(grp.kernel)},
                      {"recipe", recipe_label(grp.recipe)},
                      {"recipe_text", grp.recipe ? recipe_text(*grp.recipe) : std::string()},
                      {"rule", grp.rule},
                      {"numerics", numerics_name(grp.numerics)},
                      {"nodes", nodes},
                      {"flops", k.flops},
                      {"bytes", k.bytes},
                      {"time_s", r.time},
                      {"bound", r.compute_bound ? "compute" : "memory"}});
  }
  j["groups"] = groups;
  t += "\n" + std::to_string(plan.groups.size()) + " kernels for " +
       std::to_string(ir.nodes.size()) + " ops: " + std::to_string(multi) + " fused groups hold " +
       std::to_string(fused_nodes) + " ops, " + std::to_string(opaque) + " run op by op (opaque)\n";
  t += "without views: " + std::to_string(plan.groups.size() - view_groups) + " kernels for " +
       std::to_string(ir.nodes.size() - view_ops) + " ops\n";
  j["kernels"] = {{"groups", plan.groups.size()},
                  {"ops", ir.nodes.size()},
                  {"view_only_groups", view_groups},
                  {"view_ops", view_ops}};

  // Edges.
  std::size_t n_fused = 0, n_mat = 0;
  std::int64_t b_fused = 0, b_mat = 0;
  for (const Edge& e : plan.edges) {
    const Value& v = ir.values[e.value];
    const std::int64_t b = v.is_view ? 0 : v.nbytes;
    if (e.state == EdgeState::Fused) {
      ++n_fused;
      const auto& outs = plan.kernels[e.from_group].outputs;  // an escaping value is written
      if (std::find(outs.begin(), outs.end(), e.value) == outs.end()) b_fused += b;
    } else {
      ++n_mat;
      b_mat += b;
    }
  }
  j["edges"] = {{"fused", n_fused},
                {"fused_bytes", b_fused},
                {"materialized", n_mat},
                {"materialized_bytes", b_mat}};
  t += "edges: " + std::to_string(n_fused) + " fused (" +
       human_bytes(static_cast<double>(b_fused)) + " never written), " + std::to_string(n_mat) +
       " materialized (" + human_bytes(static_cast<double>(b_mat)) + " read from memory)\n";

  // Memory fit.
  const MemoryFit m = memory_fit(ir, plan);
  const std::int64_t total = m.weights + m.state + m.arena;
  const bool fits = total <= hw.memory_bytes;
  j["memory"] = {{"weights", m.weights},
                 {"state", m.state},
                 {"activation_arena", m.arena},
                 {"activation_blocks", m.blocks},
                 {"materialized_bytes", m.materialized},
                 {"total", total},
                 {"budget", hw.memory_bytes},
                 {"fits", fits}};
  t += "memory: weights " + human_bytes(static_cast<double>(m.weights)) + ", state " +
       human_bytes(static_cast<double>(m.state)) + ", activation arena " +
       human_bytes(static_cast<double>(m.arena)) + " (" + std::to_string(m.blocks) + " blocks, " +
       human_bytes(static_cast<double>(m.materialized)) + " materialized); total " +
       human_bytes(static_cast<double>(total)) + " of " +
       human_bytes(static_cast<double>(hw.memory_bytes)) + ": " + (fits ? "fits" : "DOES NOT FIT") +
       "\n";

  // Roofline.
  j["roofline"] = {{"time_s", total_time},
                   {"flops", total_flops},
                   {"bytes", total_bytes},
                   {"compute_bound_groups", compute_bound},
                   {"memory_bound_groups", plan.groups.size() - compute_bound},
                   {"label", ceiling_label(hw)}};
  t += "roofline: " + human_time(total_time) + " per step (" + std::string(ceiling_label(hw)) +
       ") for " + human_flops(static_cast<double>(total_flops)) + " and " +
       human_bytes(static_cast<double>(total_bytes)) + ": " + std::to_string(compute_bound) +
       " compute-bound, " + std::to_string(plan.groups.size() - compute_bound) +
       " memory-bound kernels\n";

  // Phases.
  nlohmann::json phases = nlohmann::json::array();
  std::string ph;
  for (const PhaseReport& p : fe.phases) {
    phases.push_back({{"name", p.name},
                      {"micros", p.micros},
                      {"budget_micros", p.budget_micros},
                      {"over_budget", p.over_budget},
                      {"nodes_before", p.nodes_before},
                      {"nodes_after", p.nodes_after},
                      {"opaque_fallback", p.opaque_fallback}});
    ph += " " + p.name + " " + fmt("%.0f us", p.micros);
    if (p.over_budget) ph += " (OVER BUDGET)";
    if (p.opaque_fallback) ph += " [" + std::to_string(p.opaque_fallback) + " ops left opaque]";
    ph += ";";
  }
  j["phases"] = phases;
  if (!ph.empty()) t += "phases:" + ph + "\n";
  return {t, j.dump(2) + "\n"};
}

PlanReport venn_report(const FrontEndResult& fe, const Hardware& hw) {
  const Ir001& ir = fe.ir;
  const Ir002& plan = fe.plan;
  std::vector<const FusionGroup*> group_of(ir.nodes.size(), nullptr);
  for (const FusionGroup& g : plan.groups)
    for (std::uint32_t n : g.nodes)
      if (n < group_of.size()) group_of[n] = &g;
  struct Row {
    std::size_t native = 0, fallback = 0;
    double time = 0;
    std::map<std::string, std::size_t> ops;  // op -> count
  };
  std::map<K, Row> rows;
  double total = 0;
  for (std::size_t n = 0; n < ir.nodes.size(); ++n) {
    const Node& node = ir.nodes[n];
    const FusionGroup* g = group_of[n];
    const bool family =
        std::find(hw.families.begin(), hw.families.end(), node.kind) != hw.families.end();
    const bool native = family && g != nullptr && g->kernel != KernelTemplate::Opaque;
    // Per node, unfused: time = max(bytes / bandwidth, flops / peak) (Note [Cost model]).
    const double time = roofline(hw, g ? g->recipe : nullptr, node.flops, node.bytes).time;
    Row& r = rows[node.kind];
    (native ? r.native : r.fallback) += 1;
    r.time += time;
    r.ops[node.op] += 1;
    total += time;
  }
  std::vector<std::pair<K, const Row*>> ranked;
  for (const auto& [k, r] : rows) ranked.emplace_back(k, &r);
  std::stable_sort(ranked.begin(), ranked.end(), [](const auto& a, const auto& b) {
    return a.second->time > b.second->time;  // ties keep kind order (the map's)
  });
  nlohmann::json j;
  j["hardware"] = hardware_json(hw);
  j["plan_digest"] = fe.plan_digest;
  j["total_time_s"] = total;
  nlohmann::json kinds = nlohmann::json::array();
  std::string t =
      "kernel families on " + std::string(hw.name) + ": " + std::string(hw.description) + "\n";
  t += "each op: native (the target has a kernel family for its kind) or fallback (no such family:\n"
       "a generic kernel or the op by op path runs it);\n";
  t += "ranked by estimated share of step time, unfused (" + std::string(ceiling_label(hw)) +
       ")\n\n";
  t += pad("kind", 18) + pad("share", 9) + pad("time", 12) + pad("native", 8) +
       pad("fallback", 10) + "ops\n";
  std::size_t total_native = 0, total_fallback = 0;
  for (const auto& [k, r] : ranked) {
    const double share = total > 0 ? r->time / total : 0;
    std::string ops;
    nlohmann::json jops = nlohmann::json::object();
    for (const auto& [op, c] : r->ops) {
      ops += (ops.empty() ? "" : ", ") + op + " x" + std::to_string(c);
      jops[op] = c;
    }
    t += pad(std::string(ckernel_info(k).name), 18) + pad(fmt("%.1f%%", 100 * share), 9) +
         pad(human_time(r->time), 12) + pad(std::to_string(r->native), 8) +
         pad(std::to_string(r->fallback), 10) + ops + "\n";
    kinds.push_back({{"kind", ckernel_info(k).name},
                     {"share", share},
                     {"time_s", r->time},
                     {"native", r->native},
                     {"fallback", r->fallback},
                     {"ops", jops}});
    total_native += r->native;
    total_fallback += r->fallback;
  }
  j["kinds"] = kinds;
  j["native"] = total_native;
  j["fallback"] = total_fallback;
  t += "\n" + std::to_string(total_native) + " ops native, " + std::to_string(total_fallback) +
       " fallback; estimated step " + human_time(total) + "\n";
  return {t, j.dump(2) + "\n"};
}

}  // namespace crucible::forge
