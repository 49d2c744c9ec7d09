// Analysis.cpp — detect, build, plan.
#include "crucible/graph/Analysis.h"

#include <algorithm>
#include <chrono>

#include "absl/container/flat_hash_map.h"

namespace crucible::graph {
namespace {
// Ops per phase, and the ops that follow dropped ones (IterationAnalysis::ops_after_drop).
void count_ops(IterationAnalysis& a, const record::Trace& t) {
  for (std::size_t op : a.ops) {
    ++a.ops_per_phase[static_cast<int>(t.ops[op].phase)];
    a.ops_after_drop += (t.ops[op].flags & record::op_flag::kAfterDrop) != 0;
  }
}
}  // namespace

std::shared_ptr<Iteration> build_iteration(const record::Trace& t, std::vector<std::size_t> ops,
                                           const PlanOptions& plan_opt, std::span<const ContentHash> locals,
                                           std::optional<record::StorageNumbering> numbering,
                                           BuildTimes* times) {
  using Clock = std::chrono::steady_clock;
  auto ns = [](Clock::time_point a, Clock::time_point b) {
    return static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(b - a).count());
  };
  const Clock::time_point t0 = Clock::now();  // four clock reads per build: not worth a branch
  auto a = std::make_shared<IterationAnalysis>();
  a->ops = std::move(ops);
  count_ops(*a, t);
  a->graph = numbering ? TraceGraph::build(t, a->ops, std::move(*numbering))
                       : TraceGraph::build(t, a->ops);
  const Clock::time_point t1 = Clock::now();
  a->dag = MerkleDag::build(t, a->graph, locals);
  const Clock::time_point t2 = Clock::now();
  auto plan = plan_memory(t, a->graph, plan_opt);
  if (times) *times = BuildTimes{ns(t0, t1), ns(t1, t2), ns(t2, Clock::now())};
  if (plan.ok())
    a->plan = std::move(*plan);
  else
    a->plan_status = plan.status();
  const std::uint32_t thread = a->ops.empty() ? 0 : t.ops[a->ops.front()].thread;
  auto it = std::make_shared<Iteration>(std::move(a));
  it->thread = thread;
  return it;
}

std::shared_ptr<Iteration> rebuild_iteration(const Iteration& last, const record::Trace& t,
                                             std::vector<std::size_t> ops,
                                             std::span<const ContentHash> locals,
                                             record::StorageNumbering numbering,
                                             const PlanOptions& plan_opt) {
  std::optional<TraceGraph> g = last.graph().rebased(t, ops, std::move(numbering));
  if (!g) return nullptr;
  auto a = std::make_shared<IterationAnalysis>();
  a->ops = std::move(ops);
  count_ops(*a, t);
  a->graph = std::move(*g);
  a->dag = MerkleDag::rebuild(last.dag(), t, a->graph, locals);
  // Shares depend on dtypes, sizes and strides, which the wiring key leaves out (Note
  // [Elementwise outputs in their input's block]): where the new ops' layouts make other shares
  // than the last plan's (some, or none where it had some, or some where it had none), the
  // plan is made again, not rebased. So is a plan refused over the budget (other shares may
  // make it fit).
  bool replan;
  if (!last.plan()) replan = plan_opt.share_elementwise && !last.plan_status().ok();
  else replan = plan_opt.share_elementwise ? !shares_hold(*last.plan(), t, a->graph) : last.plan()->shared_blocks != 0;
  if (replan) {
    auto plan = plan_memory(t, a->graph, plan_opt);
    if (plan.ok()) a->plan = std::move(*plan);
    else a->plan_status = plan.status();
  } else {
    if (last.plan()) a->plan = rebased_plan(*last.plan(), a->graph.numbering());
    a->plan_status = last.plan_status();
    a->plan_rebased = last.plan().has_value();
  }
  const std::uint32_t thread = a->ops.empty() ? 0 : t.ops[a->ops.front()].thread;
  auto it = std::make_shared<Iteration>(std::move(a));
  it->thread = thread;
  return it;
}

Result<std::shared_ptr<const Iteration>> analyze_latest_iteration(const record::Trace& t, int thread,
                                                                  const PlanOptions& plan_opt) {
  if (t.num_ops() == 0) return bad_state("the trace has no ops", "record some training steps first");
  std::uint32_t th = 0;
  if (thread < -1)
    return invalid_input("thread " + std::to_string(thread) + " is no recording thread's index",
                         "use one from 0, or -1 for the thread with the most ops");
  if (thread < 0) {
    // A map, not a vector indexed by thread: a loaded trace's thread fields are whatever the
    // file says (0xFFFFFFFF would wrap a vector's size to 0).
    absl::flat_hash_map<std::uint32_t, std::size_t> per_thread;
    for (const auto& e : t.ops) ++per_thread[e.thread];
    std::size_t most = 0;
    for (const auto& [thread, count] : per_thread)
      if (count > most || (count == most && thread < th)) {
        most = count;
        th = thread;
      }
  } else {
    th = static_cast<std::uint32_t>(thread);
  }
  const std::vector<std::size_t> ops = ops_of_thread(t, th);
  if (ops.empty())
    return invalid_input("thread " + std::to_string(th) + " recorded no ops", "pick a thread that recorded");
  std::vector<std::uint64_t> sig(ops.size());
  for (std::size_t i = 0; i < ops.size(); ++i) sig[i] = op_signature(t, ops[i]);
  IterationReport report = detect_iterations(sig);
  if (!report.periodic)
    return bad_state("no iteration found on thread " + std::to_string(th) + ": " + report.reason,
                     "record two or more identical training steps");
  const Segment& s = report.segments[static_cast<std::size_t>(report.last_steady())];
  auto it = build_iteration(t, std::vector<std::size_t>(ops.begin() + static_cast<long>(s.begin),
                                                        ops.begin() + static_cast<long>(s.end)),
                            plan_opt);
  it->thread = th;
  it->report = std::move(report);
  return std::shared_ptr<const Iteration>(std::move(it));
}

}  // namespace crucible::graph
