"""Training step time: crucible.compile (recorded, then replayed as an ExecutionPlan from one
C++ call) vs eager PyTorch, side by side in one process on the four test models.

For each model two twins are built with the same seed: one steps eagerly, one through
crucible.compile. After warm-up (the compiled twin has built its plan), rounds alternate an
eager block and a compiled block; the figure is the median per-step time over rounds. Also
reported: the plan's kernel calls, the time to build it from two recorded calls, how much
longer a recorded (capturing) call takes than an eager one, and the plan's static arena
against the peak bytes one eager step allocates on the calling thread (both 64-aligned). Writes
bench/baselines/replay_bench.{json,txt}.

    .venv/bin/python bench/python/replay_bench.py [--rounds 7] [--models mlp,transformer]
"""
import argparse
import os
import statistics
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path[:0] = [os.path.join(ROOT, "vessel", "torch"), os.path.join(ROOT, "test", "record", "python"),
                os.path.dirname(os.path.abspath(__file__))]

import torch  # noqa: E402

import benchutil  # noqa: E402
import crucible_native as crucible  # noqa: E402
import models  # noqa: E402

ITERS = {"mlp": 400, "cnn": 150, "transformer": 60, "resnet18": 6}
TARGET = {"mlp": 3.0, "transformer": 1.5, "resnet18": 1.0}


per_step = benchutil.per_step


def bench(name, rounds):
    eager = models.make(name)
    twin = models.make(name)
    step = crucible.compile(twin.step)
    # warm-up call, then the two recorded calls (timed), then the plan exists
    t_eager_first = per_step(eager.step, 1)
    step()
    t_capture = [per_step(step, 1) for _ in range(2)]
    for _ in range(2):  # the eager twin takes as many steps as the compiled one
        eager.step()
    assert step.stats()["plans_built"] == 1, step.last_refusal
    iters = ITERS[name]
    for _ in range(3):
        eager.step()
        step()
    te, tc = [], []
    for _ in range(rounds):
        te.append(per_step(eager.step, iters))
        tc.append(per_step(step, iters))
    info = step.plans()[0]
    crucible._ext.alloc_measure_start()  # what one eager step allocates on this thread at peak
    eager.step()
    eager_peak, _ = crucible._ext.alloc_measure_stop()
    step()
    e, c = statistics.median(te), statistics.median(tc)
    # The twins ran the same number of steps: still bit-identical after all of them. Not
    # for the transformer: its dropout draws from the one global generator both twins share.
    same = (all(torch.equal(a, b) for a, b in zip(eager.model.parameters(), twin.model.parameters()))
            if name != "transformer" else None)
    return {
        "model": name, "batch": models.DEFAULT_BATCH[name], "eager_us": e * 1e6, "compiled_us": c * 1e6,
        "speedup": e / c, "target": TARGET.get(name), "plan_ops": info["ops"], "patches": info["patches"],
        "plan_build_ms": info["build_ms"], "capture_call_us": statistics.mean(t_capture) * 1e6,
        "first_eager_call_us": t_eager_first * 1e6, "params_bit_identical": same,
        "plan_runs": step.stats()["plan_runs"], "arena_bytes": info["arena_bytes"],
        "arena_lower_bound": info["arena_lower_bound"], "eager_peak_bytes": eager_peak,
        "arena_vs_eager_peak": info["arena_bytes"] / eager_peak if eager_peak else None,
        "arena_runs": info["arena_runs"], "arena_mismatches": info["arena_mismatches"],
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--models", default="mlp,cnn,transformer,resnet18")
    ap.add_argument("--no-save", action="store_true")
    a = ap.parse_args()
    rows = [bench(m, a.rounds) for m in a.models.split(",")]
    lines = [f"{'model':<12} {'eager us':>10} {'compiled us':>12} {'speedup':>8} {'target':>7} "
             f"{'kernels':>8} {'build ms':>9} {'capture us':>11} {'identical':>9} {'arena KiB':>10} "
             f"{'eager peak KiB':>15} {'ratio':>6}"]
    for r in rows:
        tgt = f">={r['target']}x" if r["target"] else "-"
        lines.append(f"{r['model']:<12} {r['eager_us']:>10.1f} {r['compiled_us']:>12.1f} {r['speedup']:>7.2f}x "
                     f"{tgt:>7} {r['plan_ops']:>8} {r['plan_build_ms']:>9.3f} {r['capture_call_us']:>11.0f} "
                     f"{'n/a' if r['params_bit_identical'] is None else str(r['params_bit_identical']):>9} "
                     f"{r['arena_bytes'] / 1024:>10.1f} {r['eager_peak_bytes'] / 1024:>15.1f} "
                     f"{r['arena_vs_eager_peak']:>6.2f}")
    text = "\n".join(lines)
    print(text)
    if not a.no_save:
        benchutil.save_baseline("replay_bench", rows, text, [f"median per-step time over {a.rounds} alternating rounds; speedup = eager / compiled;",
                                     "ratio = plan arena / eager step's peak allocated bytes (calling thread)"], rounds=a.rounds)


if __name__ == "__main__":
    main()
