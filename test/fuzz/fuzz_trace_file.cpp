// fuzz_trace_file.cpp — libFuzzer harness for the .crtrace reader (untrusted bytes) and for
// what a loaded trace goes through next: crucible.iteration(trace) and export_graph(path, trace)
// run the graph stage on whatever the reader accepted, and `crucible plan` also builds Forge's
// IR001 from it (the rest of its front end works on IR001, not on the file).
// Any crash, sanitizer report or contract violation is a bug; errors are the expected outcome.
#include <cstddef>
#include <cstdint>

#include "crucible/graph/Analysis.h"
#include "crucible/forge/Ir001.h"
#include "crucible/graph/Dot.h"
#include "crucible/record/TraceFile.h"

namespace {
// Graph, Merkle DAG, memory plan (with and without a budget that nothing fits) and DOT of the
// given ops; a plan that is made must pass check_plan.
void analyse(const crucible::record::Trace& t, const std::vector<std::size_t>& ops) {
  using namespace crucible::graph;
  for (std::uint64_t budget : {std::uint64_t{0}, std::uint64_t{1}}) {
    PlanOptions opt;
    opt.budget = budget;
    auto it = build_iteration(t, ops, opt);
    if (it->plan() && !check_plan(*it->plan()).ok()) __builtin_trap();
    (void)it->dag().root();
    if (budget == 0) (void)to_dot(t, it->graph());
  }
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  auto r = crucible::record::decode_trace(
      std::span<const std::byte>(reinterpret_cast<const std::byte*>(data), size));
  if (!r.ok()) return 0;
  // Whatever the reader accepts must be safe to walk through every accessor.
  for (std::size_t op = 0; op < r->num_ops(); ++op) {
    for (const auto& m : r->inputs(op)) (void)r->strides(r->tensor_index(&m));
    for (const auto& m : r->outputs(op)) (void)r->sizes(r->tensor_index(&m));
    (void)r->scalars_of(op);
    (void)r->schema_name(r->ops[op].schema_hash);
    (void)r->module_path(r->ops[op].module_id);
  }
  // And must re-encode to the same bytes it came from.
  auto again = crucible::record::encode_trace(*r);
  auto back = crucible::record::decode_trace(again);
  if (!back.ok() || !(*back == *r)) __builtin_trap();
  if (r->num_ops() == 0) return 0;
  // The analyses: the detected iteration, as `crucible plan` does, and every op of the first
  // op's thread, periodic or not.
  auto latest = crucible::graph::analyze_latest_iteration(*r, -1);
  if (latest.ok()) {
    (void)crucible::graph::to_dot(*r, (*latest)->graph());
    crucible::forge::ExprPool pool;
    auto ir = crucible::forge::build_ir001(*r, (*latest)->ops(), pool);
    if (ir.ok() && !crucible::forge::verify(*ir).ok()) __builtin_trap();  // what it builds is well formed
  }
  analyse(*r, crucible::graph::ops_of_thread(*r, r->ops[0].thread));
  return 0;
}
