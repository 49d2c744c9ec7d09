"""Where the Vessel's added time goes on the MLP training step, by switching parts of it off.

Run by bench/vessel_ablation.sh, which builds build-ablation/ with the recording kernels'
switches (Note [Ablation build], vessel/torch/Capture.h). Each rung is measured in a process of
its own: paired short rounds of 20 steps, eager then the rung and the rung then eager in turn,
and the median over rounds of each round's added percent (the trace cleared every 25 rounds, as
vessel_overhead.py's paired rounds do). The rungs, and the one each is compared with:

  key_floor    the key on the thread, kernels that only exclude it and redispatch, allocation
               tags on (Note [Key floor]); against eager
  kernel_only  + the typed kernel's own prologue (thread state, capture check, op site)
  enter_only   + entering the op (its frame, phase and op flags)
  entry_only   + the op's 64-byte entry committed, no tensor or scalar captured; over enter_only
  no_ring      + every tensor and scalar captured, nothing committed; over enter_only
  full         + the commit (entry, cells, scalars) and the drain and pipeline's work on it;
               over no_ring. The full recording in this build (its switches are tested per op)
  release      the full recording in the release build (CRUCIBLE_RELEASE_BUILD_DIR), the control
               for what the ablation build's switches cost

Also derived: the metadata, full over entry_only (capturing and committing the tensors and
scalars, beyond an entry alone). The pipeline runs in every recorded rung as for a user (drain,
detect, build, publish): a rung that commits less also gives it less to do.

Each rung's process checks that it ran as named: the build has the switches; no op of the step
is skipped as internal or decomposed (so every op is a top-level one); at the rungs that commit
nothing no op was recorded (so none reached the boxed fallback, which the switches leave as it
is: Optimizer.step's and zero_grad's profiler scopes do, 4 per step, at every rung). The rungs
run in --passes passes, each starting at another rung (the VM's speed drifts over minutes).
Each rung's figure is the median of its passes; each comparison is the median of the per-pass
differences, with a 95 % bootstrap interval over passes (the per-pass spread is a few points,
so a difference of one point is not resolved by ten passes). Writes
bench/baselines/vessel_ablation.json.
  vessel_ablation.py [--passes N] [--rounds N]      (CRUCIBLE_BUILD_DIR: the ablation build)
"""
import json
import os
import random
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import benchutil  # noqa: E402
# (rung, the rung it is compared with; None: eager)
RUNGS = [("key_floor", None), ("kernel_only", "key_floor"), ("enter_only", "kernel_only"),
         ("entry_only", "enter_only"), ("no_ring", "enter_only"), ("full", "no_ring"), ("release", None)]
DERIVED = [("metadata", "full", "entry_only"), ("release_vs_full", "release", "full")]
COMMIT_NOTHING = {"kernel_only", "enter_only", "no_ring"}  # the stats must count no op
STEPS = 20  # per round, as vessel_overhead.py's paired rounds
CHILD_TIMEOUT_S = 900


def child(rung, rounds):
    """One rung in this process (a fresh one: the key's kernels are installed once per process)."""
    if rung not in ("key_floor", "release"):
        os.environ["CRUCIBLE_VESSEL_ABLATE"] = rung  # read by install(), on the first enable()
    sys.path.insert(0, HERE)
    import vessel_overhead as vo  # noqa: E402  (after the environment is set)
    crucible = vo.crucible
    if crucible._ext.has_ablation_switches() != (rung != "release"):
        raise RuntimeError(f"rung {rung} needs {'the release' if rung == 'release' else 'an ablation'} build; "
                           f"CRUCIBLE_BUILD_DIR={crucible.build_dir()} is not one")
    if rung == "key_floor":
        print(json.dumps(vo.key_floor(STEPS, rounds)))
        return
    m, opt, x, y = vo.make_mlp()
    for _ in range(5):
        vo.step(m, opt, x, y)

    def eager():
        return vo.time_block(lambda: vo.step(m, opt, x, y), STEPS)

    def rung_step():
        crucible.enable()
        try:
            return vo.time_block(lambda: vo.step(m, opt, x, y), STEPS)
        finally:
            crucible.disable()

    rung_step()  # the first enable's set-up (install, the allocator wrapper) outside the rounds
    want = "full" if rung == "release" else rung
    if crucible._ext.ablation() != want:
        raise RuntimeError(f"the kernels run at rung {crucible._ext.ablation()!r}, not {want!r}")
    crucible.clear()
    skipped0 = crucible.stats()["skipped"]
    total = 0

    def keep_small(i):  # the trace stays small, as in vessel_overhead.paired()
        nonlocal total
        if i % 25 == 24:
            crucible.flush()
            total += crucible.stats()["total"]
            crucible.clear()

    pct, es = benchutil.paired_rounds(eager, rung_step, rounds, keep_small)
    crucible.flush()
    total += crucible.stats()["total"]
    skipped = {k: v - skipped0[k] for k, v in crucible.stats()["skipped"].items()}
    if skipped["internal"] or skipped["decomposed"]:
        raise RuntimeError(f"rung {rung}: ops skipped as internal or decomposed ({skipped}): the step has ops "
                           "the rungs are not defined for")
    if rung in COMMIT_NOTHING and total != 0:
        raise RuntimeError(f"rung {rung} recorded {total} ops: some op of the step reached the boxed "
                           "fallback, which the switches do not touch, so the rung is not what it says")
    if rung not in COMMIT_NOTHING and total == 0:
        raise RuntimeError(f"rung {rung} recorded no op")
    steps = rounds * STEPS + 1  # and the set-up step
    print(json.dumps({"added_pct": statistics.median(pct),
                      "added_pct_quartiles": benchutil.quartiles(pct),
                      "eager_step_us": statistics.median(es) * 1e6,
                      "ops_recorded_per_step": total / (rounds * STEPS),
                      "profiler_scopes_per_step": skipped["profiler"] / steps}))


def run_child(rung, rounds, env):
    res = benchutil.run_json_child([sys.executable, __file__, "--child", rung, str(rounds)], f"rung {rung}",
                                   env=env, timeout=CHILD_TIMEOUT_S)
    if rung == "key_floor":  # vessel_overhead.key_floor's names
        res = {"added_pct": res["key_floor_added_pct"], "added_pct_quartiles": res["key_floor_added_pct_quartiles"]}
    return res


def interval(diffs, seed=0, n=2000):
    """95 % percentile-bootstrap interval of the median of diffs (resampling passes)."""
    rng = random.Random(seed)
    meds = sorted(statistics.median(rng.choices(diffs, k=len(diffs))) for _ in range(n))
    return [meds[int(0.025 * n)], meds[int(0.975 * n) - 1]]


def main():
    if "--child" in sys.argv:
        at = sys.argv.index("--child")
        child(sys.argv[at + 1], int(sys.argv[at + 2]))
        return
    passes = int(sys.argv[sys.argv.index("--passes") + 1]) if "--passes" in sys.argv else 3
    rounds = int(sys.argv[sys.argv.index("--rounds") + 1]) if "--rounds" in sys.argv else 300
    ablation_dir = os.environ.get("CRUCIBLE_BUILD_DIR")
    release_dir = os.environ.get("CRUCIBLE_RELEASE_BUILD_DIR")
    if not ablation_dir or not release_dir:
        sys.exit("vessel_ablation: set CRUCIBLE_BUILD_DIR (the ablation build) and CRUCIBLE_RELEASE_BUILD_DIR "
                 "(the release build); bench/vessel_ablation.sh does")
    envs = {name: dict(os.environ, CRUCIBLE_BUILD_DIR=release_dir if name == "release" else ablation_dir)
            for name, _ in RUNGS}
    names = [name for name, _ in RUNGS]
    runs = {name: [] for name in names}
    for p in range(passes):
        start = p % len(names)
        for name in names[start:] + names[:start]:
            res = run_child(name, rounds, envs[name])
            runs[name].append(res)
            print(f"  pass {p + 1}: {name:11s} {res['added_pct']:+6.2f} %", flush=True)
    full = runs["full"]
    ops = statistics.median(r["ops_recorded_per_step"] for r in full)
    eager_us = statistics.median(r["eager_step_us"] for r in full)
    ns_per_pct = eager_us * 1e3 / ops / 100  # one percent of the step, in ns per recorded op

    def compare(a, b):
        d = [x["added_pct"] - (y["added_pct"] if b else 0.0) for x, y in zip(runs[a], runs[b] if b else runs[a])]
        med, (lo, hi) = statistics.median(d), interval(d)
        return {"over": b or "eager", "pct": med, "pct_interval_95": [lo, hi], "ns_per_op": med * ns_per_pct,
                "ns_per_op_interval_95": [lo * ns_per_pct, hi * ns_per_pct], "per_pass_pct": d}

    print(f"MLP step: eager {eager_us:.1f} us, {ops:.1f} ops recorded per step; {passes} passes of {rounds} "
          "paired rounds each")
    print(f"  {'rung':11s} {'added %':>8s}  {'over':11s} {'median':>7s} {'95 % interval':>16s} {'ns/op':>7s}")
    results = {}
    for name, base in RUNGS:
        pcts = [r["added_pct"] for r in runs[name]]
        c = compare(name, base)
        results[name] = {"added_pct": statistics.median(pcts), "added_pct_passes": pcts,
                         "added_pct_quartiles_passes": [r["added_pct_quartiles"] for r in runs[name]],
                         "compared": c}
        for k in ("eager_step_us", "ops_recorded_per_step", "profiler_scopes_per_step"):
            if k in runs[name][0]:
                results[name][k + "_passes"] = [r[k] for r in runs[name]]
        print(f"  {name:11s} {results[name]['added_pct']:+8.2f}  {c['over']:11s} {c['pct']:+7.2f} "
              f"{c['pct_interval_95'][0]:+7.2f}..{c['pct_interval_95'][1]:+6.2f} {c['ns_per_op']:+7.1f}")
    derived = {}
    for name, a, b in DERIVED:
        c = compare(a, b)
        derived[name] = c
        print(f"  {name:15s} ({a} over {b}) {c['pct']:+7.2f} % ({c['pct_interval_95'][0]:+.2f}..{c['pct_interval_95'][1]:+.2f}), "
              f"{c['ns_per_op']:+.1f} ns/op")
    git = subprocess.run(["git", "-C", HERE, "describe", "--always", "--dirty"], capture_output=True, text=True)
    out = {"benchmark": "vessel_ablation", "machine": benchutil.machine(),
           "torch": __import__("torch").__version__, "code": git.stdout.strip() or "unknown",
           "date": time.strftime("%Y-%m-%d"), "ablation_build": ablation_dir, "release_build": release_dir,
           "passes": passes, "rounds": rounds, "steps_per_round": STEPS, "eager_step_us": eager_us,
           "ops_recorded_per_step": ops, "ns_per_op_per_pct": ns_per_pct, "rungs": results, "derived": derived}
    path = os.path.join(HERE, "..", "baselines", "vessel_ablation.json")
    with open(path, "w") as f:
        json.dump(out, f, indent=2)
    print(f"wrote {os.path.normpath(path)}")


if __name__ == "__main__":
    main()
