"""The long run of the training-loop fuzzer: `count` loops drawn from the grammar of
utils/python/crucible_loopgen.py, each run eagerly and through crucible.compile(step) from the
same seed and compared bit for bit. Prints the count per outcome, the share of loops that ran
compiled (a plan ran at least once), and each failing loop: its description, first difference,
and the simplest loop the minimizer reduced it to; failures are grouped by that reduced cause.

Loops run in a worker process; a worker that dies (an abort, a segfault) costs one loop,
recorded as a crash, and a new worker continues with the next seed.

    CRUCIBLE_BUILD_DIR=build-release .venv/bin/python bench/python/loop_fuzz.py [--count 300] [--seed 0]
        [--no-minimize] [--verify-every N] [--json out.json]
"""
import argparse
import collections
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path[:0] = [os.path.join(ROOT, "vessel", "torch"), os.path.join(ROOT, "utils", "python")]

OUTCOMES = ("compiled", "refused", "eager-unexplained", "mismatch", "crash")


def worker(first, count, minimize, compile_kw):
    """Runs loops first .. first+count-1, one JSON line per loop (a 'start' line before each)."""
    import crucible_loopgen as lg
    for seed in range(first, first + count):
        print(json.dumps({"start": seed}), flush=True)
        s = lg.spec(seed)
        t0 = time.perf_counter()
        r = lg.check(s, compile_kw=compile_kw)
        rec = {"seed": seed, "outcome": r.outcome, "plan_runs": r.stats.get("plan_runs", 0),
               "sync_native": r.stats.get("sync_native", 0),
               "calls": r.stats.get("calls", 0), "sizes_derived": r.stats.get("sizes_derived", 0),
               "sizes_bound": r.stats.get("sizes_bound", 0), "why": r.why[:1], "s": time.perf_counter() - t0}
        if r.failed:
            rec["report"] = r.report()
            rec["kind"] = r.kind
            rec["cause"] = f"(not minimized) -> {r.kind}"
            if minimize:
                def still_fails(t):
                    q = lg.check(t, compile_kw=compile_kw)
                    return q.outcome == r.outcome and q.kind == r.kind
                m = lg.minimize(s, still_fails)
                rec["cause"] = f"{lg.cause(m)} -> {r.kind}"
                rec["minimal"] = lg.check(m, compile_kw=compile_kw).report(max_diffs=2)
        elif r.outcome == "refused":
            rec["cause"] = r.refusal_kind()
        print(json.dumps(rec), flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--count", type=int, default=300)
    ap.add_argument("--seed", type=int, default=0, help="first seed")
    ap.add_argument("--no-minimize", action="store_true", help="do not reduce failing loops")
    ap.add_argument("--verify-every", type=int, default=0, help="crucible.compile(verify_every=N)")
    ap.add_argument("--json", help="write every loop's record here")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    compile_kw = {"verify_every": a.verify_every} if a.verify_every else {}
    if a.worker:
        return worker(a.seed, a.count, not a.no_minimize, compile_kw)

    import torch
    t0 = time.perf_counter()
    records, seed, end = [], a.seed, a.seed + a.count
    while seed < end:
        cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--seed", str(seed),
               "--count", str(end - seed)] + (["--no-minimize"] if a.no_minimize else []) + (
               ["--verify-every", str(a.verify_every)] if a.verify_every else [])
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        current = None
        for line in p.stdout:
            rec = json.loads(line)
            if "start" in rec:
                current = rec["start"]
                continue
            records.append(rec)
            current = None
            seed = rec["seed"] + 1
            print(f"\r{len(records)}/{a.count} loops", end="", file=sys.stderr, flush=True)
        err = p.stderr.read()
        rc = p.wait()
        if current is not None:   # the worker died inside this loop
            import crucible_loopgen as lg
            records.append({"seed": current, "outcome": "crash", "plan_runs": 0, "calls": 0, "why": [],
                            "report": f"CRASH: the process died (exit status {rc}) in\n"
                                      f"{lg.spec(current).describe()}\n{err[-2000:]}",
                            "cause": f"process died ({rc})"})
            seed = current + 1
        elif rc != 0:
            sys.exit(f"loop_fuzz: the worker failed (exit status {rc}) between loops:\n{err[-3000:]}")
    wall = time.perf_counter() - t0
    print(file=sys.stderr)

    n = len(records)
    counts = collections.Counter(r["outcome"] for r in records)
    ran = sum(1 for r in records if r["plan_runs"] > 0 or r.get("sync_native", 0) > 0)
    ok_ran = sum(1 for r in records if r["outcome"] == "compiled")
    whole = sum(1 for r in records if r["outcome"] == "compiled" and r["plan_runs"] > 0)
    print(f"loop_fuzz: {n} loops, seeds {a.seed}..{end - 1}, torch {torch.__version__}, "
          f"crucible.compile({', '.join(f'{k}={v}' for k, v in compile_kw.items())}), {wall:.1f} s "
          f"({1000 * sum(r['s'] for r in records if 's' in r) / max(n, 1):.0f} ms per loop checked)")
    for o in OUTCOMES:
        print(f"  {o:18s} {counts[o]:5d}  {100 * counts[o] / max(n, 1):5.1f} %"
              + ("   FAIL" if o in ("mismatch", "crash") and counts[o] else ""))
    print(f"  a plan ran in {ran} loops ({100 * ran / max(n, 1):.1f} %); compiled and correct: "
          f"{ok_ran} ({100 * ok_ran / max(n, 1):.1f} %): whole-step {whole}, sync-point {ok_ran - whole}")
    derived = sum(1 for r in records if r.get("sizes_derived", 0))
    bound = [r for r in records if r.get("sizes_bound", 0)]
    print(f"  new sizes: derived from one recorded call in {derived} loops, bound without one in {len(bound)} "
          f"({sum(r['sizes_bound'] for r in bound)} sizes; {sum(1 for r in bound if r['outcome'] == 'compiled')} of "
          f"those loops correct)")
    refused = collections.Counter(r.get("cause", "") for r in records if r["outcome"] == "refused")
    if refused:
        print("refused, by the refusal's first words:")
        for c, k in refused.most_common():
            print(f"  {k:4d}  {c}")
    failing = [r for r in records if r["outcome"] in ("mismatch", "crash")]
    if failing:
        by_cause = collections.defaultdict(list)
        for r in failing:
            by_cause[r.get("cause", "?")].append(r)
        print("failing loops by cause (the minimizer's simplest failing loop):")
        for c, rs in sorted(by_cause.items(), key=lambda kv: -len(kv[1])):
            print(f"  {len(rs):4d}  {c}   seeds {' '.join(str(r['seed']) for r in rs)}")
        print()
        for c, rs in sorted(by_cause.items(), key=lambda kv: -len(kv[1])):
            print(f"=== cause: {c} ({len(rs)} loops)")
            if rs[0].get("minimal"):
                print("simplest failing loop:\n" + rs[0]["minimal"])
            for r in rs:
                print(r["report"])
                print()
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"torch": torch.__version__, "first_seed": a.seed, "count": a.count,
                       "compile_kw": compile_kw, "wall_s": wall, "records": records}, f, indent=1)
    return 1 if failing else 0


if __name__ == "__main__":
    sys.exit(main())
