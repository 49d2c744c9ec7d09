"""Graph pipeline figures on real training steps, against what eager PyTorch does.

For MLP, small CNN, resnet18 and a small transformer + AdamW (batch sizes as in the tests):
  * build time of one iteration (structure key and copy of its ops out of the trace, graph +
    Merkle DAG + memory plan, measured by the pipeline's build stage with reuse off: wall and
    build-thread CPU time, median of --rounds recordings) and per op, with its parts (key and
    copy, graph, DAG, plan);
  * the same work (key, copy, graph, DAG, plan) repeated back to back on one thread: the
    build's own cost on a busy core, without the pipeline thread's wake-up on an idle core;
    and the same again with the caches emptied before each round (64 MiB written elsewhere):
    what the build costs when none of its code or data is cached, as the pipeline's build
    thread finds them after its core was idle; each also by part;
  * with reuse on, the time to republish the last analysis for a new run of the same step (its
    structure key matched), median of --rounds recordings; for a step whose scalars change
    every step (AdamW) only the wiring key matches, and the time is that of the rewire (copy,
    graph and plan rebased, Merkle DAG built), against the full build above;
  * static arena bytes vs the lower bound (largest total of simultaneously live bytes);
  * static arena bytes vs eager PyTorch's peak of allocated CPU bytes in the same step, measured
    by wrapping the CPU allocator (the profiler's memory events undercount: they missed 40% of
    resnet18's peak).
Writes bench/baselines/pipeline.json.
"""
import json
import os
import statistics
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "vessel", "torch"))
sys.path.insert(0, os.path.join(HERE, "..", "..", "test", "record", "python"))
import crucible_native as crucible  # noqa: E402
import models  # noqa: E402

import benchutil  # noqa: E402

torch.set_num_threads(1)


def eager_peak_bytes(s):
    """Peak bytes one eager step allocates on this thread: every CPU allocation and free goes
    through Crucible's wrapper allocator while it measures (64-aligned sizes, as the plan's).
    This counts what the kernels allocate for themselves too (conv's im2col buffers), which the
    plan, covering recorded tensors only, does not hold."""
    crucible._ext.alloc_measure_start()
    s.step()
    peak, _ = crucible._ext.alloc_measure_stop()
    return peak


def main():
    rounds = int(sys.argv[sys.argv.index("--rounds") + 1]) if "--rounds" in sys.argv else 5
    results = {}
    recycled_seen = 0  # the pipeline's count of recycled copies after the models so far
    for name in models.MODELS:
        s = models.make(name)
        for _ in range(2):
            s.step()
        peak = eager_peak_bytes(s)
        builds, faults = [], []
        crucible._ext.pipeline_reuse(False)
        for _ in range(rounds):  # each round: a fresh recording whose iteration is built once
            crucible.clear()
            models.record(s, 3)
            it = crucible.iteration()
            builds.append((it["pipeline_build_us"], it["pipeline_copy_us"], it["pipeline_build_cpu_us"],
                           it["pipeline_graph_us"], it["pipeline_dag_us"], it["pipeline_plan_us"]))
            faults.append(it["pipeline_build_faults"])
        recycled = it["pipeline_recycled"] - recycled_seen
        build_us, copy_us, cpu_us, graph_us, dag_us, plan_us = (
            statistics.median(b[k] for b in builds) for k in range(6))
        # The same work repeated back to back on this thread, on the iteration just published:
        # what the build costs on a busy core. The build thread wakes on an idle one, which on
        # this VM makes the same code about twice as slow (see bench/README.md).
        hot = crucible._ext.time_build(50)
        cold = crucible._ext.time_build(15, evict_mib=64)
        hot_us, cold_us = statistics.median(hot["us"]), statistics.median(cold["us"])
        parts = ("key", "copy", "graph", "dag", "plan")
        hot_parts = {k: statistics.median(hot[k + "_us"]) for k in parts}
        cold_parts = {k: statistics.median(cold[k + "_us"]) for k in parts}
        # The same again with reuse on: the last build's analysis is republished when the
        # structure key matches (Note [Reusing earlier builds]).
        crucible._ext.pipeline_reuse(True)
        reuses, rewires = [], []
        reused_before, rewired_before = it["pipeline_reused"], it["pipeline_rewired"]
        for _ in range(rounds):
            crucible.clear()
            models.record(s, 3)
            it = crucible.iteration()
            if it["pipeline_reused"] > reused_before:
                reuses.append(it["pipeline_reuse_us"])
            elif it["pipeline_rewired"] > rewired_before:
                rewires.append(it["pipeline_rewire_us"])
            reused_before, rewired_before = it["pipeline_reused"], it["pipeline_rewired"]
        # Every round reused, or every round rewired; anything else (a round built afresh) has
        # no figure.
        reuse_us = statistics.median(reuses) if len(reuses) == rounds else None
        rewire_us = statistics.median(rewires) if len(rewires) == rounds else None
        r = {
            "ops": it["total_ops"],
            "build_us": build_us,
            "build_copy_us": copy_us,
            "build_cpu_us": cpu_us,
            "build_graph_us": graph_us,
            "build_dag_us": dag_us,
            "build_plan_us": plan_us,
            "build_us_per_op": build_us / it["total_ops"],
            # Minor page faults of the build thread per build (fresh memory's first touch), and
            # how many of the rounds copied into an earlier copy's memory (Note [Recycled copies]).
            "build_faults": faults,
            "builds_recycled": recycled,
            "build_hot_us": hot_us,
            "build_cold_us": cold_us,
            "build_hot_parts_us": hot_parts,
            "build_cold_parts_us": cold_parts,
            "reuse_us": reuse_us,
            "rewire_us": rewire_us,
            "rewire_over_build": rewire_us / build_us if rewire_us is not None else None,
            "arena_bytes": it["arena_bytes"],
            "lower_bound_bytes": it["lower_bound_bytes"],
            "arena_over_lower_bound": it["plan_ratio"],
            "eager_peak_bytes": peak,
            "arena_over_eager_peak": it["arena_bytes"] / peak if peak else None,
        }
        results[name] = r
        recycled_seen = it["pipeline_recycled"]  # the rewire rounds copy too
        print(f"{name:12s} {r['ops']:5d} ops  build {build_us:7.1f} us wall ({r['build_us_per_op']:.2f} us/op; "
              f"key + copy {copy_us:5.1f}, build thread CPU {cpu_us:6.1f} us; back to back {hot_us:6.1f} us, "
              f"caches emptied {cold_us:6.1f} us; page faults {statistics.median(faults):.0f} median, "
              f"{max(faults)} most; {recycled} of {rounds} copies recycled)  "
              + (f"reused {reuse_us:6.1f} us  " if reuse_us is not None else
                 f"rewired {rewire_us:6.1f} us ({r['rewire_over_build']:.2f}x the build; scalars change per step)  "
                 if rewire_us is not None else "rebuilt  ") +
              f"\n{'':18s}in the pipeline: key + copy {copy_us:5.1f}, graph {graph_us:5.1f}, DAG {dag_us:5.1f}, "
              f"plan {plan_us:5.1f} us;  back to back: "
              + ", ".join(f"{k} {hot_parts[k]:.1f}" for k in parts) + ";  caches emptied: "
              + ", ".join(f"{k} {cold_parts[k]:.1f}" for k in parts) + " us\n" + f"{'':18s}"
              f"arena {r['arena_bytes'] / 2**20:6.2f} MiB  lower bound {r['lower_bound_bytes'] / 2**20:6.2f} MiB "
              f"(ratio {r['arena_over_lower_bound']:.3f})  eager peak {peak / 2**20:6.2f} MiB "
              f"(arena / eager {r['arena_over_eager_peak']:.2f}x)")
    out = {"benchmark": "pipeline", "torch": torch.__version__,
           "machine": benchutil.machine(),
           "rounds": rounds, "note": "build figures: median over rounds; eager peak from the wrapper allocator",
           "results": results}
    path = os.path.join(HERE, "..", "baselines", "pipeline.json")
    with open(path, "w") as f:
        json.dump(out, f, indent=2)
    print(f"wrote {os.path.normpath(path)}")


if __name__ == "__main__":
    main()
