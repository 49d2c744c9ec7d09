#!/usr/bin/env bash
# bench/vessel_perf.sh — where the recording's added wall time goes, by sampling: the MLP
# training step of python/vessel_overhead.py in a loop (perf/mlp_loop.py), eager and then
# recorded, each under `perf record -e cpu-clock` (a software clock: works on VMs without
# hardware counters) after a warm-up that is not sampled. For the thread that runs the step it
# prints the microseconds per step each shared object and each function takes in both runs
# and their difference, largest first: the recording's own code (libcrucible_dispatch.so) and
# what the rest of the step loses to it. Sampling shares are converted to time with each
# run's own microseconds per step, so the two columns add up to the two step times. Each mode
# runs twice (eager, recorded, recorded, eager) and shows the mean. On a shared VM the step's
# speed drifts between runs, so the rest of the step's figures move from run to run by more
# than the recording's own code (libcrucible_dispatch.so), which holds still; read several
# runs before reading the indirect cost. Writes nothing under bench/.
#   bench/vessel_perf.sh [SECONDS]      (default 9 s sampled per run, after 3 s of warm-up)
# Needs perf (Debian's linux-perf) and a release build (CRUCIBLE_BUILD_DIR, default build-release).
set -euo pipefail
source "$(dirname "$0")/../utils/lib/common.sh"
cd "$CRUCIBLE_ROOT"
command -v perf >/dev/null || { echo "vessel_perf: perf is missing (apt-get install linux-perf)" >&2; exit 1; }
PY="$(crucible_python)"
secs="${1:-9}"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
# Eager, recorded, recorded, eager: the VM's speed drifts over a minute, and each mode's figures
# are the mean of its two runs, one on each side of the middle.
runs=(eager.1 recorded.1 recorded.2 eager.2)
for run in "${runs[@]}"; do
  perf record -q -D 3000 -F 3997 -e cpu-clock -o "$out/$run.data" -- \
    "$PY" bench/perf/mlp_loop.py "${run%.*}" "$((secs + 3))" >"$out/$run.log" 2>"$out/$run.err" ||
    { cat "$out/$run.err" >&2; exit 1; }
  # The stepping thread keeps the process name; the Vessel's threads are named crucible-*.
  perf report -i "$out/$run.data" --comm "$(basename "$PY" | cut -c1-15)" --sort dso,sym -n \
    --stdio 2>/dev/null | grep -v '^#' | grep -v '^$' >"$out/$run.syms" || true
done
"$PY" - "$out" <<'PY'
import re, sys
out = sys.argv[1]
us, rows = {"eager": 0.0, "recorded": 0.0}, {}
for mode in ("eager", "recorded"):
    for run in (1, 2):  # each run's shares in its own us per step; the mode's figure is the mean
        run_us = float(open(f"{out}/{mode}.{run}.log").read().split()[-1])
        us[mode] += run_us / 2
        samples = []
        for line in open(f"{out}/{mode}.{run}.syms"):
            m = re.match(r"\s*[\d.]+%\s+(\d+)\s+(\S+)\s+\[.\]\s+(.*)$", line)
            if m:
                samples.append((int(m.group(1)), m.group(2), m.group(3).strip()))
        total = sum(n for n, _, _ in samples)
        if total == 0:
            sys.exit(f"vessel_perf: no samples of the stepping thread in {mode} run {run}")
        for n, dso, sym in samples:
            d = rows.setdefault((dso, sym), {})
            d[mode] = d.get(mode, 0.0) + n / total * run_us / 2
print(f"MLP step, stepping thread: eager {us['eager']:.1f} us, recorded {us['recorded']:.1f} us "
      f"({(us['recorded'] / us['eager'] - 1) * 100:+.1f} %)")
by_dso = {}
for (dso, _), v in rows.items():
    d = by_dso.setdefault(dso, {"eager": 0.0, "recorded": 0.0})
    for k in v:
        d[k] += v[k]
def table(items, width):
    items = sorted(items, key=lambda kv: -(kv[1].get("recorded", 0) - kv[1].get("eager", 0)))
    print(f"{'eager':>8} {'recorded':>9} {'added':>8}  (us per step)")
    for name, v in items[:width]:
        e, r = v.get("eager", 0.0), v.get("recorded", 0.0)
        print(f"{e:8.2f} {r:9.2f} {r - e:+8.2f}  {name[:110]}")
print("by shared object:")
table(list(by_dso.items()), 12)
print("by function (largest additions):")
table([(f"{s}  [{d}]", v) for (d, s), v in rows.items()], 25)
PY
