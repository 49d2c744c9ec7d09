"""Graph pipeline figures on real training steps, against what eager PyTorch does.

For MLP, small CNN, resnet18 and a small transformer + AdamW (batch sizes as in the tests):
  * build time of one iteration (graph + Merkle DAG + memory plan, measured by the pipeline's
    build stage) and per op;
  * static arena bytes vs the lower bound (largest total of simultaneously live bytes);
  * static arena bytes vs eager PyTorch's peak of allocated CPU bytes in the same step
    (torch.profiler memory events), i.e. what the caching allocator would otherwise hold.
Writes bench/baselines/pipeline.json.
"""
import json
import os
import platform
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "vessel", "torch"))
sys.path.insert(0, os.path.join(HERE, "..", "..", "test", "record", "python"))
import crucible_native as crucible  # noqa: E402
import models  # noqa: E402

torch.set_num_threads(1)


def eager_peak_bytes(s):
    """Peak of (allocated - freed) CPU bytes over one eager step, from the profiler: each op's
    own (self) allocations at its start, and the frees it reports as [memory] events."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        s.step()
    events = sorted(prof.events(), key=lambda e: e.time_range.start)
    live = peak = 0
    for e in events:
        live += e.cpu_memory_usage if e.name == "[memory]" else e.self_cpu_memory_usage
        peak = max(peak, live)
    return peak


def main():
    results = {}
    for name in models.MODELS:
        s = models.make(name)
        for _ in range(2):
            s.step()
        peak = eager_peak_bytes(s)
        crucible.clear()
        models.record(s, 3)
        it = crucible.iteration()
        r = {
            "ops": it["total_ops"],
            "build_us": it["pipeline_build_us"],
            "build_us_per_op": it["pipeline_build_us"] / it["total_ops"],
            "arena_bytes": it["arena_bytes"],
            "lower_bound_bytes": it["lower_bound_bytes"],
            "arena_over_lower_bound": it["plan_ratio"],
            "eager_peak_bytes": peak,
            "arena_over_eager_peak": it["arena_bytes"] / peak if peak else None,
        }
        results[name] = r
        print(f"{name:12s} {r['ops']:5d} ops  build {r['build_us']:8.1f} us ({r['build_us_per_op']:.2f} us/op)  "
              f"arena {r['arena_bytes'] / 2**20:7.2f} MiB  lower bound {r['lower_bound_bytes'] / 2**20:7.2f} MiB "
              f"(ratio {r['arena_over_lower_bound']:.3f})  eager peak {peak / 2**20:7.2f} MiB "
              f"(arena / eager {r['arena_over_eager_peak']:.2f}x)")
    out = {"benchmark": "pipeline", "torch": torch.__version__,
           "machine": f"{os.cpu_count()} cores, {platform.machine()}, {platform.platform()}",
           "results": results}
    path = os.path.join(HERE, "..", "baselines", "pipeline.json")
    with open(path, "w") as f:
        json.dump(out, f, indent=2)
    print(f"wrote {os.path.normpath(path)}")


if __name__ == "__main__":
    main()
