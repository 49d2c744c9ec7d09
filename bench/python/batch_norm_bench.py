"""Batch norm alone: a BatchNorm2d training step (forward and backward) through crucible.compile
with the CPU backend's generated batch norm (Note [Generated batch norm]) against the same plan's
ATen calls (backend "null") and against eager, at resnet18's shapes, in one process.

Each variant is its own BatchNorm2d of the same parameters, input and output gradient, warmed
up (two recorded calls, the plan build), then rounds alternate a block of steps of each; the
figure is the median per-step time over rounds, each ratio the other's time over the generated
one's (above 1: generated is faster). The compiled steps are compared with eager bit for bit
(output, input gradient, weight and bias gradients, running statistics) at the end.
Writes bench/baselines/batch_norm_bench.{json,txt}.

    .venv/bin/python bench/python/batch_norm_bench.py [--rounds 7]
"""
import argparse
import os
import statistics
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path[:0] = [os.path.join(ROOT, "vessel", "torch"), os.path.dirname(os.path.abspath(__file__))]

import torch  # noqa: E402

import benchutil  # noqa: E402
import crucible_native as crucible  # noqa: E402

# resnet18's batch norms at batch 8 and a 64x64 image, and its first at batch 32 and 224x224
SHAPES = [(8, 64, 32, 32), (8, 128, 16, 16), (8, 256, 8, 8), (8, 512, 4, 4), (32, 64, 112, 112)]
VARIANTS = ("eager", "null", "cpu")


def make(shape, variant):
    torch.manual_seed(0)
    bn = torch.nn.BatchNorm2d(shape[1])
    with torch.no_grad():
        bn.weight.normal_()
        bn.bias.normal_()
    x = torch.randn(shape)
    go = torch.randn(shape)

    def step(x):
        bn.weight.grad = bn.bias.grad = None
        xx = x.detach().requires_grad_()
        y = bn(xx)
        y.backward(go)
        return y.detach(), xx.grad

    return bn, x, (step if variant == "eager" else crucible.compile(step, backend=variant))


def bench(shape, rounds):
    twins = {v: make(shape, v) for v in VARIANTS}
    for _ in range(4):
        for bn, x, step in twins.values():
            step(x)
    iters = max(2, int(2e6 // (shape[0] * shape[1] * shape[2] * shape[3])))
    times = {v: [] for v in VARIANTS}
    for _ in range(rounds):
        for v, (bn, x, step) in twins.items():
            times[v].append(benchutil.per_step(lambda: step(x), iters))
    med = {v: statistics.median(t) for v, t in times.items()}
    outs = {v: step(x) for v, (bn, x, step) in twins.items()}
    ref = twins["eager"][0]

    def same(v):
        bn = twins[v][0]
        return (all(torch.equal(a, b) for a, b in zip(outs[v], outs["eager"])) and
                all(torch.equal(a, b) for a, b in zip(bn.state_dict().values(), ref.state_dict().values())) and
                torch.equal(bn.weight.grad, ref.weight.grad) and torch.equal(bn.bias.grad, ref.bias.grad))
    plan = twins["cpu"][2].plans()[0]
    return {"shape": "x".join(map(str, shape)), **{f"{v}_us": t * 1e6 for v, t in med.items()},
            "cpu_vs_null": med["null"] / med["cpu"], "cpu_vs_eager": med["eager"] / med["cpu"],
            "null_vs_eager": med["eager"] / med["null"],
            "generated_calls": plan["exec_generated_calls"], "calls": plan["exec_calls"],
            "identical": same("cpu") and same("null")}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--no-save", action="store_true")
    a = ap.parse_args()
    os.environ["CRUCIBLE_CACHE_DIR"] = tempfile.mkdtemp(prefix="crucible-bench-cache-")
    rows = [bench(s, a.rounds) for s in SHAPES]
    lines = [f"{'shape':<16} {'eager us':>9} {'null us':>9} {'cpu us':>9} {'cpu/null':>8} {'cpu/eager':>9} "
             f"{'null/eager':>10} {'generated':>9} {'identical':>9}"]
    for r in rows:
        lines.append(f"{r['shape']:<16} {r['eager_us']:>9.1f} {r['null_us']:>9.1f} {r['cpu_us']:>9.1f} "
                     f"{r['cpu_vs_null']:>7.2f}x {r['cpu_vs_eager']:>8.2f}x {r['null_vs_eager']:>9.2f}x "
                     f"{r['generated_calls']:>5}/{r['calls']:<3} {str(r['identical']):>9}")
    text = "\n".join(lines)
    print(text)
    if not a.no_save:
        benchutil.save_baseline(
            "batch_norm_bench", rows, text,
            [f"BatchNorm2d training step (forward + backward) alone, median per-step time over {a.rounds} "
             "alternating rounds; cpu = crucible.compile with the generated batch norm, null = the same plan's "
             "ATen calls; cpu/null, cpu/eager, null/eager = the second's time / the first's (above 1: faster);",
             "generated = generated calls / calls of the cpu plan (the rest: num_batches_tracked's add_); "
             "identical = outputs, gradients and running statistics equal eager's bits"],
            rounds=a.rounds)


if __name__ == "__main__":
    main()
