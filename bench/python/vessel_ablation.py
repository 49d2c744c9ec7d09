"""Where the Vessel's added time goes on the MLP training step, by switching parts of it off.

Run by bench/vessel_ablation.sh, which builds build-ablation/ with the recording kernels'
switches (Note [Ablation build], vessel/torch/Capture.h). Each rung is measured in a process of
its own as vessel_overhead.py measures the key floor: paired short rounds, eager then the rung
and the rung then eager in turn, and the median over rounds of each round's added percent. The
rungs, each with the work of the ones below it:

  key_floor    the key on the thread, kernels that only exclude it and redispatch (Note [Key floor])
  kernel_only  + the typed kernel's own prologue (thread state, capture check, op site)
  enter_only   + entering the op (its frame, phase and op flags)
  entry_only   + the op's 64-byte entry committed to the ring (no tensor, no scalar captured)
  no_ring      + every tensor and scalar captured into the op's builder, instead of the entry
               alone; nothing committed to the rings
  full         + the builder's cells and scalars committed: the recording as users run it

The step is the same at every rung, and the pipeline runs in every recorded rung as it does
for a user (drain, detect, build, publish): a rung that commits less also gives it less to do.
Each rung's process checks that it ran as named (the build has the switches; at the rungs that
commit nothing no op was recorded, so every op of the step went through a typed kernel, where
the switches are). The rungs run in --passes passes in a rotating order (the VM's speed drifts
over minutes); each rung's figure is the median of its passes. Prints each rung's added percent
of the eager step and what it adds to the rung below it, in percent and in ns per op, and writes
bench/baselines/vessel_ablation.json.
  vessel_ablation.py [--passes N] [--rounds N]      (CRUCIBLE_BUILD_DIR: the ablation build)
"""
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
RUNGS = ["key_floor", "kernel_only", "enter_only", "entry_only", "no_ring", "full"]
# At these rungs nothing reaches the rings: the stats must count no op.
COMMIT_NOTHING = {"key_floor", "kernel_only", "enter_only", "no_ring"}
STEPS = 20  # per round, as vessel_overhead.py's paired rounds


def child(rung, rounds):
    """One rung in this process (a fresh one: the key's kernels are installed once per process)."""
    if rung != "key_floor":
        os.environ["CRUCIBLE_VESSEL_ABLATE"] = rung  # read by install(), on the first enable()
    sys.path.insert(0, HERE)
    import vessel_overhead as vo  # noqa: E402  (after the environment is set)
    crucible = vo.crucible
    if rung == "key_floor":
        print(json.dumps(vo.key_floor(STEPS, rounds) | {"rung": rung}))
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
    if crucible._ext.ablation() != rung:
        raise RuntimeError(f"the kernels run at rung {crucible._ext.ablation()!r}, not {rung!r}: "
                           "is CRUCIBLE_BUILD_DIR an ablation build (bench/vessel_ablation.sh)?")
    crucible.clear()
    es, pct = [], []
    for i in range(rounds):
        if i % 2 == 0:
            e, r = eager(), rung_step()
        else:
            r, e = rung_step(), eager()
        es.append(e)
        pct.append((r - e) / e * 100)
    crucible.flush()
    total = crucible.stats()["total"]
    if rung in COMMIT_NOTHING and total != 0:
        raise RuntimeError(f"rung {rung} recorded {total} ops: some op of the step reached the boxed "
                           "fallback, which the switches do not touch, so the rung is not what it says")
    if rung not in COMMIT_NOTHING and total == 0:
        raise RuntimeError(f"rung {rung} recorded no op")
    pct.sort()
    print(json.dumps({"rung": rung, "rounds": rounds, "added_pct": statistics.median(pct),
                      "added_pct_quartiles": [pct[len(pct) // 4], pct[3 * len(pct) // 4]],
                      "eager_step_us": statistics.median(es) * 1e6,
                      "ops_recorded_per_step": total / (rounds * STEPS) if total else 0}))


def run_child(rung, rounds):
    r = subprocess.run([sys.executable, __file__, "--child", rung, str(rounds)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        sys.stderr.write(r.stderr)
        raise RuntimeError(f"rung {rung} failed (exit {r.returncode}); its output is above")
    return json.loads(r.stdout.strip().splitlines()[-1])


def main():
    if "--child" in sys.argv:
        at = sys.argv.index("--child")
        child(sys.argv[at + 1], int(sys.argv[at + 2]))
        return
    passes = int(sys.argv[sys.argv.index("--passes") + 1]) if "--passes" in sys.argv else 3
    rounds = int(sys.argv[sys.argv.index("--rounds") + 1]) if "--rounds" in sys.argv else 300
    runs = {r: [] for r in RUNGS}
    for p in range(passes):
        order = RUNGS[p % len(RUNGS):] + RUNGS[:p % len(RUNGS)]  # each rung early and late alike
        for rung in order:
            res = run_child(rung, rounds)
            runs[rung].append(res)
            print(f"  pass {p + 1}: {rung:11s} {res.get('added_pct', res.get('key_floor_added_pct')):+6.2f} %",
                  flush=True)
    ops = statistics.median(r["ops_recorded_per_step"] for r in runs["full"])
    eager_us = statistics.median(r["eager_step_us"] for r in runs["full"])
    results, below = {}, 0.0
    print(f"MLP step: eager {eager_us:.1f} us, {ops:.0f} ops; median of {passes} passes of {rounds} "
          "paired rounds each")
    print(f"  {'rung':11s} {'added %':>8s} {'over the rung below':>20s} {'ns per op':>10s}")
    for rung in RUNGS:
        key = "key_floor_added_pct" if rung == "key_floor" else "added_pct"
        pcts = [r[key] for r in runs[rung]]
        pct = statistics.median(pcts)
        step_pct = pct - below
        ns_per_op = step_pct / 100 * eager_us * 1e3 / ops
        results[rung] = {"added_pct": pct, "added_pct_passes": pcts, "over_rung_below_pct": step_pct,
                         "over_rung_below_ns_per_op": ns_per_op}
        print(f"  {rung:11s} {pct:+8.2f} {step_pct:+20.2f} {ns_per_op:+10.1f}")
        below = pct
    out = {"benchmark": "vessel_ablation", "machine": __import__("benchutil").machine(),
           "torch": __import__("torch").__version__, "passes": passes, "rounds": rounds,
           "steps_per_round": STEPS, "eager_step_us": eager_us, "ops_per_step": ops, "rungs": results}
    path = os.path.join(HERE, "..", "baselines", "vessel_ablation.json")
    with open(path, "w") as f:
        json.dump(out, f, indent=2)
    print(f"wrote {os.path.normpath(path)}")


if __name__ == "__main__":
    sys.path.insert(0, HERE)
    main()
