"""Training step time through the exec stage's plan (trace -> IR001 -> Forge -> IR002 ->
ExecutionPlan, the library calls through the ATen provider) on the null backend and on Mimic's
CPU backend, against eager PyTorch and against crucible.compile's replay (its own plan), in one
process on the test models.

A step is recorded (the last of four), planned from its own ops, and its plan is run over
buffers holding the step's inputs (parameters, buffers, optimizer state, batch); eager steps the
same model. crucible.compile runs a twin. Rounds alternate the four; the figure is the median
per-step time over rounds. The plan runs are bit-identical to eager (test_exec_plan.py); here
they only run. Writes bench/baselines/exec_plan_bench.{json,txt}.

    .venv/bin/python bench/python/exec_plan_bench.py [--rounds 7] [--models mlp,cnn]
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
from stepstate import state_tensors, storage_bytes  # noqa: E402

ITERS = {"mlp": 300, "cnn": 100, "transformer": 40, "resnet18": 4, "efficientnet": 6}
RULES = os.path.join(ROOT, "rules")


def held_tensors(s):
    return state_tensors(s) + [s.x, s.y]


def plans(name):
    """The model, and its last recorded step's plans on both backends with bound buffers."""
    s = models.make(name)
    crucible.track_modules(s.model)
    for _ in range(4):
        crucible.mark_inputs(s.x, s.y)
        crucible.flush()
        begin = crucible.stats()["total"]
        before = {crucible.storage_id(t): storage_bytes(t).clone() for t in held_tensors(s)}
        crucible.enable()
        loss = s.step()
        crucible.disable()
        crucible.flush()
        end = crucible.stats()["total"]
    held = [crucible.storage_id(t) for t in held_tensors(s)] + [crucible.storage_id(loss)]
    trace = crucible.trace()
    out = {}
    for backend in ("null", "cpu"):
        plan = crucible._native.load_exec().exec_plan(trace, RULES, escaping=held, backend=backend,
                                                      begin=begin, end=end)
        memory = [before[sid].clone() for sid, _ in plan.inputs]
        memory += [torch.zeros(max(n, 1), dtype=torch.uint8) for _, n in plan.outputs]
        ins = [m.data_ptr() for m in memory[:len(plan.inputs)]]
        outs = [m.data_ptr() for m in memory[len(plan.inputs):]]
        stats = plan.run(ins, outs)
        out[backend] = (plan, ins, outs, memory, stats)
    crucible.clear()
    return s, out


def bench(name, rounds):
    s, p = plans(name)
    twin = models.make(name)
    compiled = crucible.compile(twin.step)
    for _ in range(4):
        compiled()
    n = ITERS[name]

    def run_plan(backend):
        plan, ins, outs, _, _ = p[backend]
        return lambda: plan.run(ins, outs)
    variants = {"eager": s.step, "replay": compiled, "plan_null": run_plan("null"),
                "plan_cpu": run_plan("cpu")}
    times = {k: [] for k in variants}
    for r in range(rounds):
        order = list(variants) if r % 2 == 0 else list(reversed(variants))
        for k in order:
            times[k].append(benchutil.per_step(variants[k], n))
    med = {k: statistics.median(v) for k, v in times.items()}
    stats = p["cpu"][4]
    calls = p["null"][4]["calls"]
    row = {"model": name, "iters": n, "rounds": rounds,
           **{f"{k}_us": med[k] * 1e6 for k in med},
           **{f"{k}_vs_eager": med["eager"] / med[k] for k in med if k != "eager"},
           "plan_calls": calls, "generated_calls": stats["generated_calls"],
           "replay_mode": ",".join(f"{e['state']}/{e['mode']}" for e in compiled.explain())}
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--models", default="mlp,cnn,transformer,resnet18")
    a = ap.parse_args()
    rows = []
    lines = [f"{'model':12s} {'eager':>10s} {'replay':>16s} {'plan (null)':>18s} {'plan (cpu)':>18s}"
             f"  generated calls"]
    for name in a.models.split(","):
        r = bench(name, a.rounds)
        rows.append(r)
        lines.append(
            f"{name:12s} {r['eager_us']:8.0f}us {r['replay_us']:8.0f}us {r['replay_vs_eager']:5.2f}x "
            f"{r['plan_null_us']:8.0f}us {r['plan_null_vs_eager']:5.2f}x "
            f"{r['plan_cpu_us']:8.0f}us {r['plan_cpu_vs_eager']:5.2f}x  "
            f"{r['generated_calls']}/{r['plan_calls']}")
        print(lines[-1], flush=True)
    text = "\n".join(lines)
    print(text)
    benchutil.save_baseline(
        "exec_plan_bench", rows, text,
        notes=["step time, median over rounds; x = eager / that (higher is faster); replay = "
               "crucible.compile's own plan; plan = the exec stage's plan of a recorded step, "
               "ATen provider for library calls; generated calls = the CPU backend's"])


if __name__ == "__main__":
    main()
