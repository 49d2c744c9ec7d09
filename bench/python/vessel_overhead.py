"""Vessel recording overhead vs eager, side by side with a Python TorchDispatchMode recorder.

MLP step (Linear 64->128, ReLU, Linear 128->10, batch 32, cross-entropy, SGD momentum 0.9) and
a resnet18 step (batch 8, 64x64). For each: eager step time, recorded step time, added time
per op, and the same for a TorchDispatchMode recorder that keeps (op name, output shapes).
For the MLP also paired short rounds (see paired()): the steadiest of these figures on a shared
VM; and, in a child process, the same paired rounds with the key on but kernels that record
nothing (key_floor()): the overhead the key itself costs, before any recording.
Also the recording thread's CPU time per step, eager vs recorded (less sensitive than wall time
to other work on a shared machine; it leaves out the drain and pipeline threads). Prints the
ratios (medians of the interleaved rounds, and the fastest round of each, which interference on
a shared machine cannot make faster) and writes bench/baselines/vessel_overhead.json.

    .venv/bin/python bench/python/vessel_overhead.py [--quick]
"""
import itertools
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "vessel", "torch"))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "utils", "python"))
import crucible_native as crucible  # noqa: E402

import benchutil  # noqa: E402
import crucible_zoo  # noqa: E402  (torchvision's resnet18 without torchvision)

torch.set_num_threads(1)


make_mlp = benchutil.make_mlp


def make_resnet():
    torch.manual_seed(0)
    m = crucible_zoo.resnet18(num_classes=10)
    opt = torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9)
    x, y = torch.randn(8, 3, 64, 64), torch.randint(0, 10, (8,))
    return m, opt, x, y


step = benchutil.step


def time_block(fn, n, cpu=None):
    """Wall seconds per call; with a list `cpu`, also appends this thread's CPU seconds per call
    (on a shared 2-core machine wall time also counts time the thread waited for a core)."""
    t0, c0 = time.perf_counter(), time.thread_time()
    for _ in range(n):
        fn()
    if cpu is not None:
        cpu.append((time.thread_time() - c0) / n)
    return (time.perf_counter() - t0) / n


def paired(m, opt, x, y, ops_per_step, steps, rounds):
    """Short rounds, each timing eager, recorded and TorchDispatchMode one after another (the
    six orders in turn), and the median over rounds of each round's own differences. On a shared
    VM the step time drifts by tens of percent within a minute, and interference comes in
    bursts: a round's three parts see the same drift, and the median votes out rounds a burst
    hit, so this moves by about a point between runs where the medians of long rounds moved by
    ten."""
    def eager():
        return time_block(lambda: step(m, opt, x, y), steps)

    def recorded():
        crucible.enable()
        try:
            return time_block(lambda: step(m, opt, x, y), steps)
        finally:
            crucible.disable()

    def dispatch_mode():
        with benchutil.py_recorder():
            return time_block(lambda: step(m, opt, x, y), steps)

    fns = (eager, recorded, dispatch_mode)
    orders = list(itertools.permutations(range(3)))  # each mode before and after each other alike
    crucible.clear()
    es, dc, dp, pct = [], [], [], []
    for i in range(rounds):
        t = [0.0, 0.0, 0.0]
        for j in orders[i % len(orders)]:
            t[j] = fns[j]()
        if i % 25 == 24:
            crucible.clear()  # the recorded trace stays small
        es.append(t[0])
        dc.append(t[1] - t[0])
        dp.append(t[2] - t[0])
        pct.append((t[1] - t[0]) / t[0] * 100)
    crucible.clear()
    pct.sort()
    c, p = statistics.median(dc), statistics.median(dp)
    return {
        "paired_rounds": rounds,
        "paired_steps_per_round": steps,
        "paired_eager_step_us": statistics.median(es) * 1e6,
        "paired_crucible_added_pct": statistics.median(pct),
        "paired_crucible_added_pct_quartiles": benchutil.quartiles(pct),
        "paired_crucible_added_us_per_op": c / ops_per_step * 1e6,
        "paired_dispatch_mode_added_us_per_op": p / ops_per_step * 1e6,
        "paired_added_per_op_ratio_dispatch_mode_over_crucible": p / c if c > 0 and p > 0 else None,
    }


def measure(make, steps, rounds, paired_rounds=0):
    m, opt, x, y = make()
    for _ in range(5):
        step(m, opt, x, y)
    crucible.clear()
    crucible.enable()
    step(m, opt, x, y)
    crucible.disable()
    ops_per_step = crucible.stats()["total"]
    crucible.clear()
    eager, rec, pyrec, eager_cpu, rec_cpu = [], [], [], [], []
    for _ in range(rounds):  # interleaved, so drift hits all three alike
        eager.append(time_block(lambda: step(m, opt, x, y), steps, eager_cpu))
        crucible.enable()
        rec.append(time_block(lambda: step(m, opt, x, y), steps, rec_cpu))
        crucible.disable()
        crucible.clear()
        r = benchutil.py_recorder()
        with r:
            pyrec.append(time_block(lambda: step(m, opt, x, y), steps))
    e, c, p = statistics.median(eager), statistics.median(rec), statistics.median(pyrec)
    ec, cc = statistics.median(eager_cpu), statistics.median(rec_cpu)
    # The fastest round of each: on a shared machine interference only ever adds time, so the
    # minimum is the steadier estimate of what recording itself adds.
    fe, fc, fp = min(eager), min(rec), min(pyrec)

    def added(e, c, p):
        """Crucible's added %, its added us/op, and how many times more TorchDispatchMode adds
        per op (None when an added time is within noise, not above eager: no ratio to print)."""
        return ((c - e) / e * 100, (c - e) / ops_per_step * 1e6,
                (p - e) / (c - e) if c > e and p > e else None)

    pct, per_op, ratio = added(e, c, p)
    fpct, fper_op, fratio = added(fe, fc, fp)
    more = paired(m, opt, x, y, ops_per_step, 20, paired_rounds) if paired_rounds else {}
    return more | {
        "steps_per_round": steps,
        "rounds": rounds,
        "fastest_eager_step_us": fe * 1e6,
        "fastest_crucible_step_us": fc * 1e6,
        "fastest_dispatch_mode_step_us": fp * 1e6,
        "fastest_crucible_added_pct": fpct,
        "fastest_crucible_added_us_per_op": fper_op,
        "fastest_added_per_op_ratio_dispatch_mode_over_crucible": fratio,
        # The recording thread's own CPU time (the drain and pipeline threads not included).
        "eager_step_cpu_us": ec * 1e6,
        "crucible_step_cpu_us": cc * 1e6,
        "crucible_added_cpu_pct": (cc - ec) / ec * 100,
        "ops_per_step": ops_per_step,
        "eager_step_us": e * 1e6,
        "crucible_step_us": c * 1e6,
        "dispatch_mode_step_us": p * 1e6,
        "crucible_added_pct": pct,
        "crucible_added_us_per_op": per_op,
        "dispatch_mode_added_us_per_op": (p - e) / ops_per_step * 1e6,
        "added_per_op_ratio_dispatch_mode_over_crucible": ratio,
    }

def key_floor(steps, rounds):
    """In this process (one that has not recorded): paired short rounds of the MLP step, eager
    and with the key on the thread but kernels that record nothing (Note [Key floor],
    vessel/torch/Dispatch.cpp): what the key alone adds, the part of the recorded step's overhead
    that recording less work per op cannot remove."""
    crucible._ext.install_key_floor()
    m, opt, x, y = make_mlp()
    for _ in range(5):
        step(m, opt, x, y)

    def eager():
        return time_block(lambda: step(m, opt, x, y), steps)

    def floor():
        crucible._ext.set_enabled(True)
        try:
            return time_block(lambda: step(m, opt, x, y), steps)
        finally:
            crucible._ext.set_enabled(False)

    floor()  # the first enable's one-time set-up (the allocator wrapper) outside the rounds
    pct, _ = benchutil.paired_rounds(eager, floor, rounds)
    if crucible.stats()["total"] != 0:
        raise RuntimeError("the key-floor kernels recorded ops")
    return {"key_floor_rounds": rounds, "key_floor_added_pct": statistics.median(pct),
            "key_floor_added_pct_quartiles": benchutil.quartiles(pct)}


def key_floor_in_child(steps, rounds):
    """key_floor() in a fresh process (the key's kernels are installed once per process)."""
    return benchutil.run_json_child([sys.executable, __file__, "--key-floor-child", str(steps), str(rounds)],
                                    "the key-floor child")


def main():
    if "--key-floor-child" in sys.argv:
        at = sys.argv.index("--key-floor-child")
        print(json.dumps(key_floor(int(sys.argv[at + 1]), int(sys.argv[at + 2]))))
        return
    quick = "--quick" in sys.argv
    results = {
        "mlp": measure(make_mlp, steps=50 if quick else 200, rounds=5 if quick else 45,
                       paired_rounds=30 if quick else 300),
        "resnet18": measure(make_resnet, steps=2 if quick else 5, rounds=3 if quick else 7),
    }
    results["mlp"] |= key_floor_in_child(20, 30 if quick else 300)
    for name, r in results.items():
        print(f"{name}: {r['ops_per_step']} ops/step; eager {r['eager_step_us']:.1f} us, "
              f"crucible {r['crucible_step_us']:.1f} us ({r['crucible_added_pct']:+.1f}%, "
              f"{r['crucible_added_us_per_op']:.3f} us/op; recording thread's CPU "
              f"{r['crucible_added_cpu_pct']:+.1f}%), TorchDispatchMode "
              f"{r['dispatch_mode_step_us']:.1f} us ({r['dispatch_mode_added_us_per_op']:.3f} us/op); "
              + (f"crucible adds {r['added_per_op_ratio_dispatch_mode_over_crucible']:.1f}x less per op"
                 if r['added_per_op_ratio_dispatch_mode_over_crucible'] is not None
                 else "an added time is within this run's noise: no ratio"))
        if "paired_rounds" in r:
            pr = r["paired_added_per_op_ratio_dispatch_mode_over_crucible"]
            q = r["paired_crucible_added_pct_quartiles"]
            print(f"  paired short rounds (median over {r['paired_rounds']} rounds of "
                  f"{r['paired_steps_per_round']} steps): crucible {r['paired_crucible_added_pct']:+.1f}% "
                  f"(quartiles {q[0]:+.1f}..{q[1]:+.1f}%), {r['paired_crucible_added_us_per_op']:.3f} us/op, "
                  f"TorchDispatchMode {r['paired_dispatch_mode_added_us_per_op']:.3f} us/op"
                  + (f", {pr:.1f}x less per op" if pr is not None else ""))
        if "key_floor_added_pct" in r:
            q = r["key_floor_added_pct_quartiles"]
            print(f"  the key alone (kernels that record nothing, paired rounds in another process): "
                  f"{r['key_floor_added_pct']:+.1f}% (quartiles {q[0]:+.1f}..{q[1]:+.1f}%); recording "
                  f"adds the rest")
        ratio = r["fastest_added_per_op_ratio_dispatch_mode_over_crucible"]
        print(f"  fastest round of each: crucible {r['fastest_crucible_added_pct']:+.1f}%, "
              f"{r['fastest_crucible_added_us_per_op']:.3f} us/op"
              + (f", {ratio:.1f}x less per op than TorchDispatchMode" if ratio is not None else ""))
    out = {
        "benchmark": "vessel_overhead",
        "machine": benchutil.machine(),
        "torch": torch.__version__,
        "threads": 1,
        "build": crucible.build_dir(),
        "results": results,
    }
    if not quick:
        path = os.path.join(os.path.dirname(__file__), "..", "baselines", "vessel_overhead.json")
        with open(path, "w") as f:
            json.dump(out, f, indent=2)
        print(f"wrote {os.path.normpath(path)}")


if __name__ == "__main__":
    main()
