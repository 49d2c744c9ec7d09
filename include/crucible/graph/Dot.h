// Dot.h — Graphviz DOT rendering of a TraceGraph: nodes coloured by phase (forward blue,
// backward red, optimizer green), clustered by module path, alias edges dashed.
#pragma once

#include <string>

#include "crucible/graph/TraceGraph.h"

namespace crucible::graph {
std::string to_dot(const record::Trace& t, const TraceGraph& g);
}  // namespace crucible::graph
