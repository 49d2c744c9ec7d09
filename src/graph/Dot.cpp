// Dot.cpp — DOT text for a TraceGraph.
#include "crucible/graph/Dot.h"

#include <map>
#include <vector>

namespace crucible::graph {
namespace {
std::string escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '"' || c == '\\') o += '\\';
    o += c;
  }
  return o;
}
const char* colour(record::Phase p) {
  switch (p) {
    case record::Phase::Forward: return "#cfe2ff";
    case record::Phase::Backward: return "#f8d7da";
    case record::Phase::Optimizer: return "#d1e7dd";
  }
  return "#eeeeee";
}
}  // namespace

std::string to_dot(const record::Trace& t, const TraceGraph& g) {
  std::string out = "digraph crucible {\n  rankdir=TB;\n  node [shape=box, style=filled, fontname=\"monospace\", fontsize=10];\n";
  std::map<std::uint32_t, std::vector<std::size_t>> by_module;
  for (std::size_t n = 0; n < g.num_nodes(); ++n) by_module[g.module_id(n)].push_back(n);
  for (const auto& [mod, nodes] : by_module) {
    const bool cluster = mod != 0;
    if (cluster)
      out += "  subgraph cluster_" + std::to_string(mod) + " {\n    label=\"" + escape(t.module_path(mod)) +
             "\"; style=rounded; color=\"#888888\";\n";
    for (std::size_t n : nodes) {
      const std::size_t op = g.trace_op(n);
      std::string shape;
      for (const auto& m : t.outputs(op)) {
        shape += "[";
        auto sz = t.sizes(t.tensor_index(&m));
        for (std::size_t k = 0; k < sz.size(); ++k) shape += (k ? "," : "") + std::to_string(sz[k]);
        shape += "]";
      }
      out += std::string(cluster ? "    " : "  ") + "n" + std::to_string(n) + " [label=\"" +
             escape(t.schema_name(t.ops[op].schema_hash)) + "\\n" + shape + "\", fillcolor=\"" +
             colour(g.phase(n)) + "\"];\n";
    }
    if (cluster) out += "  }\n";
  }
  for (std::size_t n = 0; n < g.num_nodes(); ++n)
    for (const Edge& e : g.successors(n))
      out += "  n" + std::to_string(n) + " -> n" + std::to_string(e.node) +
             (e.kind == EdgeKind::Alias ? " [style=dashed]" : "") + ";\n";
  out += "}\n";
  return out;
}

}  // namespace crucible::graph
