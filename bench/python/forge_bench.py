"""Forge's front end (crucible plan) on resnet18 and the transformers, against PyTorch, one run.

For each model, at its test batch (test/record/python/models.py: resnet18 2, transformer 4,
transformer2 4 — two encoder layers with AdamW):
  * the plan's kernels against eager PyTorch's one kernel per op (ops per kernel, with and without
    views), and with --compare-cli another build's (main's) kernels on the same traces;
  * a training iteration is recorded (test/forge/make_traces.py) and `crucible plan --json` runs
    on it N times, each in its own process: the median time of each phase the CLI reports
    (canonicalize, dce, cse, fuse, lower) and of the whole front end (their sum per run), and the
    process's wall time (exec, load trace, iteration analysis, IR001 build, front end, report);
  * the reference, in the same run: PyTorch's eager training step of the same model at the same
    batch (zero_grad, forward, backward, optimizer step; torch's default thread count), median
    over N steps after a warm-up — the front end / step ratio says how many training steps one
    planning costs;
  * and, forward pass only, torch.jit.trace + torch.jit.freeze of the model in eval mode — what a
    PyTorch user runs to get a fused graph — with the ratio. Forge plans the whole step (forward,
    backward, optimizer), so this compares a larger job against a smaller one.
Prints the table and writes bench/baselines/forge_bench.{json,txt}.

  .venv/bin/python bench/python/forge_bench.py [--iters N] [--trace-dir DIR] [--hardware CLASS]
                                               [--compare-cli EXE]
CRUCIBLE_BUILD_DIR picks the build (default build-release); recording needs its Vessel.
--trace-dir reuses a directory make_traces.py wrote (e.g. build-release/test/forge/traces).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

from benchutil import machine
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
MODELS = ("resnet18", "transformer", "transformer2")
PHASES = ("canonicalize", "dce", "cse", "fuse_horizontal", "fuse", "lower")


def median(xs):
    return statistics.median(xs)


def kernel_counts(plan):
    """Kernels and ops of a `crucible plan --json` result, with and without views (a group of
    views only runs no kernel). Computed from the groups, so any CLI version's JSON works."""
    groups = plan["groups"]
    ops = sum(len(g["nodes"]) for g in groups)
    ops_nv = sum(1 for g in groups for n in g["nodes"] if n["kind"] != "VIEW")
    kernels_nv = sum(1 for g in groups if any(n["kind"] != "VIEW" for n in g["nodes"]))
    largest = max(sum(n["kind"] != "VIEW" for n in g["nodes"]) for g in groups)
    return {"ops": ops, "kernels": len(groups), "ops_without_views": ops_nv,
            "kernels_without_views": kernels_nv, "largest_group_ops": largest}


def bench_plan(exe, trace, hardware, iters):
    """Runs `crucible plan --json` iters times (after one warm-up that fills the page cache)."""
    cmd = [exe, "plan", "--hardware", hardware, "--json", trace]
    runs, walls = [], []
    for i in range(iters + 1):
        t0 = time.perf_counter()
        r = subprocess.run(cmd, capture_output=True, text=True)
        t1 = time.perf_counter()
        if r.returncode != 0:
            sys.exit(f"{' '.join(cmd)} failed (exit {r.returncode}):\n{r.stderr}")
        if i == 0:
            continue
        walls.append((t1 - t0) * 1e6)
        runs.append(json.loads(r.stdout))
    names = [p["name"] for p in runs[0]["phases"]]
    if tuple(names) != PHASES:
        sys.exit(f"crucible plan reports phases {names}, this benchmark expects {list(PHASES)}")
    over = sum(p["over_budget"] or p["opaque_fallback"] > 0 for r in runs for p in r["phases"])
    digests = {r["plan_digest"] for r in runs}
    phase_us = {n: median([r["phases"][k]["micros"] for r in runs]) for k, n in enumerate(names)}
    totals = [sum(p["micros"] for p in r["phases"]) for r in runs]
    first = runs[0]["phases"]
    return {
        "ir_nodes": first[0]["nodes_before"],
        "nodes_after_cse": first[2]["nodes_after"],
        **kernel_counts(runs[0]),
        "plan_digest": runs[0]["plan_digest"],
        "plan_digest_stable": len(digests) == 1,
        "phases_over_budget": over,
        "phase_median_us": phase_us,
        "front_end_median_us": median(totals),
        "front_end_min_us": min(totals),
        "cli_wall_median_us": median(walls),
    }


def bench_process_start(exe, iters):
    """Wall time of `crucible --help`: the part of the CLI figure that is process start."""
    walls = []
    for _ in range(iters):
        t0 = time.perf_counter()
        subprocess.run([exe, "--help"], capture_output=True, check=True)
        walls.append((time.perf_counter() - t0) * 1e6)
    return median(walls)


def bench_eager_step(models, name, batch, iters, warmup=3):
    s = models.make(name, batch=batch)
    for _ in range(warmup):
        s.step()
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        s.step()
        times.append((time.perf_counter() - t0) * 1e6)
    return median(times)


def bench_trace_freeze(models, name, batch, reps):
    """torch.jit.trace + torch.jit.freeze of the forward pass in eval mode, median of reps."""
    import warnings

    import torch
    s = models.make(name, batch=batch)
    model = s.model.eval()
    times = []
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # TracerWarnings of the encoder layer's fast-path checks
        for _ in range(reps):
            t0 = time.perf_counter()
            frozen = torch.jit.freeze(torch.jit.trace(model, (s.x,)))
            times.append((time.perf_counter() - t0) * 1e6)
            del frozen
    return median(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=20,
                    help="crucible plan runs and eager steps per model (default 20)")
    ap.add_argument("--trace-reps", type=int, default=5,
                    help="torch.jit.trace + freeze repetitions per model (default 5)")
    ap.add_argument("--trace-dir", help="reuse a directory test/forge/make_traces.py wrote")
    ap.add_argument("--hardware", default="cpu-avx2", help="rules class to plan for")
    ap.add_argument("--compare-cli", help="another crucible binary (e.g. main's build): its plan's "
                    "kernel counts on the same traces, printed beside this build's")
    args = ap.parse_args()
    build = os.environ.get("CRUCIBLE_BUILD_DIR", os.path.join(ROOT, "build-release"))
    if not os.path.isabs(build):
        build = os.path.join(ROOT, build)
    exe = os.path.join(build, "bin", "crucible")
    if not os.path.exists(exe):
        sys.exit(f"{exe} not found: build the release preset first")
    sys.path.insert(0, os.path.join(ROOT, "test", "record", "python"))
    import models  # noqa: E402
    import torch

    tmp = None
    trace_dir = args.trace_dir
    if trace_dir is None:
        tmp = tempfile.TemporaryDirectory()
        trace_dir = tmp.name
        env = dict(os.environ, CRUCIBLE_BUILD_DIR=build)
        subprocess.run([sys.executable, os.path.join(ROOT, "test", "forge", "make_traces.py"),
                        trace_dir, "--models", *MODELS], env=env, check=True)
    load_before = os.getloadavg()
    start_us = bench_process_start(exe, args.iters)
    rows = {}
    for name in MODELS:
        batch = models.DEFAULT_BATCH[name]
        trace = os.path.join(trace_dir, f"{name}_b{batch}.crtrace")
        if not os.path.exists(trace):
            sys.exit(f"{trace} not found: record it with test/forge/make_traces.py")
        r = {"batch": batch}
        r.update(bench_plan(exe, trace, args.hardware, args.iters))
        if args.compare_cli:
            out = subprocess.run([args.compare_cli, "plan", "--json", "--hardware", args.hardware,
                                  trace], capture_output=True, text=True, check=True)
            r["compare"] = kernel_counts(json.loads(out.stdout))
        r["eager_step_median_us"] = bench_eager_step(models, name, batch, args.iters)
        r["trace_freeze_median_us"] = bench_trace_freeze(models, name, batch, args.trace_reps)
        r["front_end_over_eager_step"] = r["front_end_median_us"] / r["eager_step_median_us"]
        r["cli_wall_over_eager_step"] = r["cli_wall_median_us"] / r["eager_step_median_us"]
        r["trace_freeze_over_front_end"] = r["trace_freeze_median_us"] / r["front_end_median_us"]
        rows[name] = r

    threads = torch.get_num_threads()
    lines = [f"Forge front end (`crucible plan --json --hardware {args.hardware}`, default budget), "
             f"median of {args.iters} processes; PyTorch {torch.__version__} at the same batch, "
             f"{threads} threads",
             f"{'':12} {'batch':>5} {'ops':>5} {'kernels':>7} "
             + " ".join(f"{p:>12}" for p in PHASES) + f" {'front end':>10}  (us)"]
    for name, r in rows.items():
        lines.append(f"{name:12} {r['batch']:5d} {r['ir_nodes']:5d} {r['kernels']:7d} "
                     + " ".join(f"{r['phase_median_us'][p]:12.0f}" for p in PHASES)
                     + f" {r['front_end_median_us']:10.0f}")
    lines.append("")
    lines.append("Kernels: eager PyTorch runs one kernel per op; ops/kernel is the ratio to it "
                 "(without views: VIEW ops and view-only groups, which run nothing, left out)")
    cmp_head = f" {'compared CLI: kernels':>22} {'w/o views':>10} {'ops/kernel':>10}" if args.compare_cli else ""
    lines.append(f"{'':12} {'ops':>5} {'kernels':>7} {'ops w/o views':>13} {'kernels':>7} "
                 f"{'ops/kernel':>10} {'largest':>7}" + cmp_head)
    for name, r in rows.items():
        line = (f"{name:12} {r['ops']:5d} {r['kernels']:7d} {r['ops_without_views']:13d} "
                f"{r['kernels_without_views']:7d} "
                f"{r['ops_without_views'] / r['kernels_without_views']:10.2f} {r['largest_group_ops']:7d}")
        if "compare" in r:
            c = r["compare"]
            line += (f" {c['kernels']:22d} {c['kernels_without_views']:10d} "
                     f"{c['ops_without_views'] / c['kernels_without_views']:10.2f}")
        lines.append(line)
    lines.append("")
    lines.append(f"{'':12} {'front end':>10} {'CLI wall':>10} {'eager step':>11} {'FE/step':>8} "
                 f"{'trace+freeze (fwd)':>19} {'that/FE':>8}  (ms)")
    for name, r in rows.items():
        lines.append(f"{name:12} {r['front_end_median_us'] / 1e3:10.2f} "
                     f"{r['cli_wall_median_us'] / 1e3:10.2f} {r['eager_step_median_us'] / 1e3:11.2f} "
                     f"{r['front_end_over_eager_step']:7.3f}x {r['trace_freeze_median_us'] / 1e3:19.1f} "
                     f"{r['trace_freeze_over_front_end']:7.0f}x")
    lines.append("FE/step = front end / eager training step; that/FE = trace+freeze / front end")
    lines.append(f"CLI wall = one process: exec + load trace + iteration analysis + IR001 + front end "
                 f"+ JSON report (`crucible --help` alone: {start_us / 1e3:.2f} ms)")
    for name, r in rows.items():
        lines.append(f"{name}: planning the whole training step costs {r['front_end_over_eager_step']:.3g} "
                     f"eager steps; torch.jit.trace + freeze of the forward alone takes "
                     f"{r['trace_freeze_over_front_end']:.0f}x Forge's front end")
    bad = [n for n, r in rows.items() if r["phases_over_budget"] or not r["plan_digest_stable"]]
    if bad:
        lines.append(f"WARNING: {bad}: a phase went over budget or the plan digest changed between "
                     "runs; those figures describe a fallback plan")
    text = "\n".join(lines)
    print(text)

    result = {
        "benchmark": "forge_bench",
        "machine": machine(),
        "date": time.strftime("%Y-%m-%d"),
        "torch": torch.__version__,
        "torch_threads": threads,
        "loadavg_at_start": load_before,
        "hardware_class": args.hardware,
        "iters": args.iters,
        "trace_reps": args.trace_reps,
        "process_start_median_us": start_us,
        "rows": rows,
    }
    out_dir = os.path.join(ROOT, "bench", "baselines")
    with open(os.path.join(out_dir, "forge_bench.json"), "w") as f:
        json.dump(result, f, indent=2)
        f.write("\n")
    with open(os.path.join(out_dir, "forge_bench.txt"), "w") as f:
        f.write(f"# {result['machine']}; torch {result['torch']}; {result['date']}; "
                f"load average {load_before[0]:.2f} at start\n{text}\n")


if __name__ == "__main__":
    main()
