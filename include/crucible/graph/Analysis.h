// Analysis.h — from a recorded trace to the latest iteration's graph, DAG and memory plan.
//
// This is the build step the background pipeline runs (and what crucible.iteration() reports):
// pick the recording thread, detect iterations on its op signatures, take the last steady
// iteration, build its TraceGraph, MerkleDag and MemoryPlan.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <utility>

#include "crucible/core/Contract.h"
#include "crucible/graph/IterationDetector.h"
#include "crucible/graph/MemoryPlan.h"
#include "crucible/graph/MerkleDag.h"
#include "crucible/graph/TraceGraph.h"

namespace crucible::graph {

// What is built from an iteration's ops: shared, never copied, by every publication of the
// same analysis (Note [Reusing earlier builds] in Pipeline.cpp).
struct IterationAnalysis {
  std::vector<std::size_t> ops;         // trace op indices of the last steady iteration
  std::uint64_t ops_per_phase[record::kNumPhases] = {};
  // Ops of the iteration recorded right after dropped ones (record::op_flag::kAfterDrop: the
  // drop mode found a full ring). Not zero: the iteration is incomplete, and its graph, DAG and
  // plan describe only what was recorded. The first op's drop may have come at the end of the
  // iteration before: counted all the same.
  std::uint64_t ops_after_drop = 0;
  TraceGraph graph;
  MerkleDag dag;
  std::optional<MemoryPlan> plan;       // empty if planning failed: see plan_status
  Status plan_status;
  bool plan_rebased = false;  // rebuild_iteration rebased the last plan (not planned again)
};

struct Iteration {
  explicit Iteration(std::shared_ptr<const IterationAnalysis> a) : analysis(std::move(a)) {
    CRUCIBLE_PRE(analysis != nullptr, "an iteration has an analysis");
  }
  std::shared_ptr<const record::Trace> trace;  // set when the iteration owns a copy of its ops
  std::uint32_t thread = 0;
  IterationReport report;
  std::shared_ptr<const IterationAnalysis> analysis;  // never null

  const std::vector<std::size_t>& ops() const { return analysis->ops; }
  const std::uint64_t (&ops_per_phase() const)[record::kNumPhases] {
    return analysis->ops_per_phase;
  }
  const TraceGraph& graph() const { return analysis->graph; }
  const MerkleDag& dag() const { return analysis->dag; }
  const std::optional<MemoryPlan>& plan() const { return analysis->plan; }
  const Status& plan_status() const { return analysis->plan_status; }
  bool incomplete() const { return analysis->ops_after_drop != 0; }
};

// Builds graph, DAG and plan for the given ops (indices into t) of one iteration; `locals`, if
// given, are the ops' record::op_content (MerkleDag::build), and `numbering`, if given, their
// storage numbering with kinds (record::number_storages; the pipeline has it from the structure
// key's pass).
// `times`, if given, receives where the build's time went.
struct BuildTimes {
  std::uint64_t graph_ns = 0;  // ops counted per phase, TraceGraph::build
  std::uint64_t dag_ns = 0;    // MerkleDag::build
  std::uint64_t plan_ns = 0;   // plan_memory
};
std::shared_ptr<Iteration> build_iteration(const record::Trace& t, std::vector<std::size_t> ops,
                                           const PlanOptions& plan = {}, std::span<const ContentHash> locals = {},
                                           std::optional<record::StorageNumbering> numbering = std::nullopt,
                                           BuildTimes* times = nullptr);

// The analysis of other ops with the wiring key of those `last` was built from (Note [Wiring
// key], Trace.h): `last`'s graph and plan rebased onto their storages, and `last`'s Merkle DAG
// hashed again where their contents differ (MerkleDag::rebuild; `locals` as for
// build_iteration), since their scalars may. `numbering` is theirs, with kinds. nullptr when the
// rebase finds another wiring after all (TraceGraph::rebased): build_iteration then. `last`'s
// report is not copied. Whether an output may take over its input's block (Block::shares)
// depends on layouts, which the wiring leaves out: the last plan is rebased when the new ops
// make exactly its shares (shares_hold), and planned again with plan_opt otherwise (then
// plan_rebased is false). A rebased plan keeps the alignment and budget the last one was
// made with: pass the plan_opt it was made with.
std::shared_ptr<Iteration> rebuild_iteration(const Iteration& last, const record::Trace& t,
                                             std::vector<std::size_t> ops,
                                             std::span<const ContentHash> locals,
                                             record::StorageNumbering numbering,
                                             const PlanOptions& plan_opt = {});

// thread < 0: the thread that recorded the most ops. Errors: no ops, unknown thread, or a
// trace with no periodic iteration (the message carries the detector's reason).
Result<std::shared_ptr<const Iteration>> analyze_latest_iteration(const record::Trace& t, int thread,
                                                                  const PlanOptions& plan = {});

}  // namespace crucible::graph
