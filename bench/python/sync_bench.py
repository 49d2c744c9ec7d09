"""Training step time in crucible.compile's two modes against eager PyTorch, side by side in one
process on the test models: whole-step replay (mode="replay": the plan runs from one C++ call,
no Python) and sync-point execution (mode="sync": the step's Python runs, its forward ops are
matched and run eagerly, backward() and the optimizer step run natively from the plan).

Three twins per model from the same seed; after warm-up, rounds alternate an eager, a
sync-point and a whole-step block; the figure is the median per-step time over rounds.
Writes bench/baselines/sync_bench.{json,txt}.

    .venv/bin/python bench/python/sync_bench.py [--rounds 7] [--models mlp,transformer]
"""
import argparse
import os
import statistics
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path[:0] = [os.path.join(ROOT, "vessel", "torch"), os.path.join(ROOT, "test", "record", "python"),
                os.path.dirname(os.path.abspath(__file__))]


import benchutil  # noqa: E402
import crucible_native as crucible  # noqa: E402
import models  # noqa: E402

ITERS = {"mlp": 300, "cnn": 100, "transformer": 40, "resnet18": 4, "efficientnet": 3}
TARGET = {"mlp": 1.1, "transformer": 1.2}   # sync-point over eager (issue 31)


per_step = benchutil.per_step


def bench(name, rounds):
    eager, tw_sync, tw_whole = models.make(name), models.make(name), models.make(name)
    sync = crucible.compile(tw_sync.step, mode="sync")
    whole = crucible.compile(tw_whole.step, mode="replay")
    for _ in range(6):
        eager.step()
        sync()
        whole()
    assert sync.stats()["sync_native"] >= 1, (sync.stats(), sync.last_refusal, sync.last_sync_mismatch)
    iters = ITERS[name]
    te, ts, tw = [], [], []
    for _ in range(rounds):
        te.append(per_step(eager.step, iters))
        ts.append(per_step(sync, iters))
        tw.append(per_step(whole, iters))
    e, s, w = statistics.median(te), statistics.median(ts), statistics.median(tw)
    st = sync.stats()
    return {"model": name, "eager_us": e * 1e6, "sync_us": s * 1e6, "whole_us": w * 1e6,
            "sync_speedup": e / s, "whole_speedup": e / w, "target": TARGET.get(name),
            "sync_calls": st["sync_calls"], "sync_native": st["sync_native"],
            "sync_mismatches": st["sync_mismatches"], "segments": sync.plans()[0]["segments"],
            "whole_plan_runs": whole.stats()["plan_runs"]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--models", default="mlp,cnn,transformer,resnet18,efficientnet")
    ap.add_argument("--no-save", action="store_true")
    a = ap.parse_args()
    rows = [bench(m, a.rounds) for m in a.models.split(",")]
    lines = [f"{'model':<12} {'eager us':>10} {'sync us':>10} {'sync/eager':>11} {'target':>7} "
             f"{'whole us':>10} {'whole/eager':>12} {'native calls':>13}"]
    for r in rows:
        tgt = f">={r['target']}x" if r["target"] else "-"
        lines.append(f"{r['model']:<12} {r['eager_us']:>10.1f} {r['sync_us']:>10.1f} {r['sync_speedup']:>10.2f}x "
                     f"{tgt:>7} {r['whole_us']:>10.1f} {r['whole_speedup']:>11.2f}x "
                     f"{r['sync_native']:>6}/{r['sync_calls']:<6}")
    text = "\n".join(lines)
    print(text)
    if not a.no_save:
        benchutil.save_baseline("sync_bench", rows, text, [f"median per-step time over {a.rounds} alternating rounds; x = eager / mode"], rounds=a.rounds)


if __name__ == "__main__":
    main()
