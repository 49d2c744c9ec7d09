"""What crucible.compile's purity checks cost, against the eager step they guard.

Two costs, on each test model's training step (models.make):
  - Watch, per captured call: the fingerprint of everything the step reaches, taken before
    and after the call and compared, plus the output/logging/RNG monitors (purity.Watch
    start/stop/finish around a call that does nothing). Paid on the recorded calls only.
  - PythonGuard, per plan run: the walk of what the step's code reaches, compared with the
    capture's before each run. Paid on every compiled call.
Each is printed as microseconds and as a share of the model's eager step (median of rounds),
which is what the user would pay without Crucible. Writes bench/baselines/purity_bench.{json,txt}.

    .venv/bin/python bench/python/purity_bench.py [--rounds 7]
"""
import argparse
import json
import os
import statistics
import sys
import time
import warnings

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path[:0] = [os.path.join(ROOT, "vessel", "torch"), os.path.join(ROOT, "test", "record", "python"),
                os.path.dirname(os.path.abspath(__file__))]

import torch  # noqa: E402

import benchutil  # noqa: E402
import crucible_native as crucible  # noqa: E402
import models  # noqa: E402
from crucible_native.purity import Watch  # noqa: E402

ITERS = {"mlp": 200, "cnn": 60, "transformer": 40, "resnet18": 4}


def timed(fn, iters):
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - t0) / iters


def watch_once(step_fn):
    w = Watch(step_fn, ())
    w.start()
    w.stop()
    problems = w.finish()
    if problems:
        raise RuntimeError(f"the benchmark step is not pure: {problems}")


def bench(name, rounds):
    s = models.make(name)
    step = crucible.compile(s.step)
    with warnings.catch_warnings():
        warnings.simplefilter("error", crucible.CrucibleWarning)
        for _ in range(4):
            step()
    entry = next(e for e in step._entries.values() if e.plan is not None)
    n = ITERS[name]
    eager, watch, guard = [], [], []
    for _ in range(rounds):
        eager.append(timed(s.step, n))
        watch.append(timed(lambda: watch_once(s.step), max(n, 20)))
        guard.append(timed(entry.py.changed, max(n, 200)))
    e, w, g = (statistics.median(x) for x in (eager, watch, guard))
    return {"model": name, "eager_step_us": e * 1e6, "watch_us": w * 1e6, "watch_share_of_eager": w / e,
            "python_guard_us": g * 1e6, "python_guard_share_of_eager": g / e,
            "walked_values": len(entry.py.fp.fp)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--models", default="mlp,cnn,transformer,resnet18")
    args = ap.parse_args()
    torch.set_num_threads(1)
    rows = [bench(m, args.rounds) for m in args.models.split(",")]
    lines = [f"purity checks against the eager step ({benchutil.machine()}, torch {torch.__version__}, 1 thread)",
             f"{'model':<12} {'eager step':>12} {'Watch/capture':>14} {'share':>7} {'guard/run':>10} {'share':>7}"]
    for r in rows:
        lines.append(f"{r['model']:<12} {r['eager_step_us']:>10.0f}us {r['watch_us']:>12.0f}us "
                     f"{r['watch_share_of_eager'] * 100:>6.1f}% {r['python_guard_us']:>8.1f}us "
                     f"{r['python_guard_share_of_eager'] * 100:>6.2f}%")
    print("\n".join(lines))
    out = os.path.join(ROOT, "bench", "baselines", "purity_bench")
    with open(out + ".json", "w") as f:
        json.dump({"machine": benchutil.machine(), "torch": torch.__version__, "rows": rows}, f, indent=1)
    with open(out + ".txt", "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
