"""AdamW's update alone: crucible.compile(opt.step) against the ATen AdamW step it replaces
(torch.optim.AdamW's default on CPU: the single-tensor loop), and against torch's own faster
variants (foreach=True, fused=True), in one process.

Parameter sets: the 2-layer transformer of the tests (15 tensors, 15 K values: per-call cost
dominates), a deeper MLP of mid-size layers (24 x Linear 160, 618 K values: each parameter's loop
alone too small to split over threads) and a wider MLP (4 x Linear 1024, 4.2 M values: memory
traffic dominates). Gradients
are set once (random); every variant is its own copy of the same parameters and state, warmed
up, then rounds alternate a block of steps of each; the figure is the median per-step time over
rounds, each ratio the default eager step's time over the variant's (above 1: faster). The
bit-exact compiled step (numerics="bitwise") is compared with the default eager one bit for bit
at the end; numerics="fast" (IEEE sqrt) by its largest relative difference. Each compiled
variant also runs with its runs launched one by one (CRUCIBLE_LAUNCH_TABLES=0, Note [Launch
tables]): the "tables" columns are that time over the default's.
Writes bench/baselines/adamw_bench.{json,txt}.

    .venv/bin/python bench/python/adamw_bench.py [--rounds 7]
"""
import argparse
import os
import statistics
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path[:0] = [os.path.join(ROOT, "vessel", "torch"), os.path.join(ROOT, "test", "record", "python"),
                os.path.dirname(os.path.abspath(__file__))]

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402

import benchutil  # noqa: E402
import crucible_native as crucible  # noqa: E402
import models  # noqa: E402

ITERS = {"transformer": 300, "mlp_mid": 100, "mlp_wide": 20}
VARIANTS = ("eager", "eager_foreach", "eager_fused", "bitwise", "fast", "bitwise_alone", "fast_alone")


def parameters(name):
    torch.manual_seed(0)
    if name == "transformer":
        m = models.make("transformer").model
    elif name == "mlp_mid":
        m = nn.Sequential(*[nn.Linear(160, 160) for _ in range(24)])
    else:
        m = nn.Sequential(*[nn.Linear(1024, 1024) for _ in range(4)])
    for p in m.parameters():
        p.grad = torch.randn_like(p) * 1e-2
    return m


def make(name, variant):
    m = parameters(name)
    kw = {"foreach": True} if variant == "eager_foreach" else {"fused": True} if variant == "eager_fused" else {}
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3, **kw)
    opt.step()  # the state
    if variant.startswith(("bitwise", "fast")):
        step = crucible.compile(lambda: opt.step(), numerics=variant.split("_")[0], guard=(opt, m))
    else:
        step = opt.step
    return m, step


def bench(name, rounds):
    twins = {v: make(name, v) for v in VARIANTS}
    for _ in range(6):  # the compiled ones: warm-up, two recorded calls, the first plan runs
        for v in VARIANTS:
            if v.endswith("_alone"):  # read as the plan's CPU backend is made
                os.environ["CRUCIBLE_LAUNCH_TABLES"] = "0"
            twins[v][1]()
            os.environ.pop("CRUCIBLE_LAUNCH_TABLES", None)
    info = {v: twins[v][1].plans()[0] for v in ("bitwise", "fast")}
    for v in info:
        assert info[v]["exec"] == "cpu" and info[v]["exec_numerics"] == v, info[v]
        assert "launch tables" in info[v]["exec_summary"], info[v]["exec_summary"]
        assert "launch tables" not in twins[v + "_alone"][1].plans()[0]["exec_summary"]
    iters = ITERS[name]
    times = {v: [] for v in VARIANTS}
    for _ in range(rounds):
        for v in VARIANTS:
            times[v].append(benchutil.per_step(twins[v][1], iters))
    med = {v: statistics.median(t) for v, t in times.items()}
    ref = list(twins["eager"][0].parameters())
    identical = all(torch.equal(a, b) for a, b in zip(ref, twins["bitwise"][0].parameters()))
    identical = identical and all(torch.equal(a, b) for a, b in zip(ref, twins["bitwise_alone"][0].parameters()))
    fast_rel = max(((a - b).abs().max() / b.abs().max()).item() for a, b in zip(twins["fast"][0].parameters(), ref))
    values = sum(p.numel() for p in ref)
    return {"params": name, "tensors": len(ref), "values": values,
            **{f"{v}_us": t * 1e6 for v, t in med.items()},
            **{f"{v}_vs_eager": med["eager"] / med[v] for v in VARIANTS if v != "eager"},
            "bitwise_vs_fused": med["eager_fused"] / med["bitwise"], "fast_vs_fused": med["eager_fused"] / med["fast"],
            "bitwise_tables": med["bitwise_alone"] / med["bitwise"], "fast_tables": med["fast_alone"] / med["fast"],
            "bitwise_generated_calls": info["bitwise"]["exec_generated_calls"],
            "fast_generated_calls": info["fast"]["exec_generated_calls"], "calls": info["bitwise"]["exec_calls"],
            "bitwise_identical": identical, "fast_max_rel_diff": fast_rel}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--no-save", action="store_true")
    a = ap.parse_args()
    os.environ["CRUCIBLE_CACHE_DIR"] = tempfile.mkdtemp(prefix="crucible-bench-cache-")
    rows = [bench(n, a.rounds) for n in ITERS]
    lines = [f"{'params':<12} {'values':>8} {'eager us':>9} {'foreach':>8} {'fused':>8} {'bitwise':>8} {'fast':>8} "
             f"{'bitwise/fused':>13} {'fast/fused':>10} {'tables b/f':>11} {'generated':>13} {'identical':>9} "
             f"{'fast diff':>9}"]
    for r in rows:
        lines.append(f"{r['params']:<12} {r['values']:>8} {r['eager_us']:>9.1f} {r['eager_foreach_vs_eager']:>7.2f}x "
                     f"{r['eager_fused_vs_eager']:>7.2f}x {r['bitwise_vs_eager']:>7.2f}x {r['fast_vs_eager']:>7.2f}x "
                     f"{r['bitwise_vs_fused']:>12.2f}x {r['fast_vs_fused']:>9.2f}x "
                     f"{r['bitwise_tables']:>5.2f}/{r['fast_tables']:>4.2f}x "
                     f"{r['bitwise_generated_calls']:>4}/{r['fast_generated_calls']:>3}/{r['calls']:>3} "
                     f"{str(r['bitwise_identical']):>9} {r['fast_max_rel_diff']:>9.2g}")
    text = "\n".join(lines)
    print(text)
    if not a.no_save:
        benchutil.save_baseline(
            "adamw_bench", rows, text,
            [f"AdamW(lr=1e-3) step alone, median per-step time over {a.rounds} alternating rounds; foreach/fused/"
             "bitwise/fast = the default eager step's time / that variant's (above 1: faster);",
             "bitwise/fused, fast/fused = torch's fused=True step's time / crucible's; generated = generated calls "
             "bitwise/fast/all calls of the plan; fast diff = largest |fast - eager| / max|eager| per tensor;",
             "tables b/f = the same compiled step's time with its runs launched one by one "
             "(CRUCIBLE_LAUNCH_TABLES=0) / with launch tables, bitwise/fast (above 1: tables faster)"],
            rounds=a.rounds)


if __name__ == "__main__":
    main()
