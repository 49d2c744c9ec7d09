#!/usr/bin/env bash
# bench/vessel_callgrind.sh — what recording adds to each op of the MLP training step (the step of
# python/vessel_overhead.py), counted by callgrind on the thread that runs the step:
# instructions, and the misses of its simulated caches (I1 32 KiB, D1, last level; from this
# CPU). Wall time on a shared 2-core VM moves by tens of percent from minute to minute; these
# counts move by a few percent of the added figure between runs (the drain thread wakes on a
# timer, and under valgrind's slowdown it runs between the step's ops, sharing the one
# simulated cache), so they show what a change to the per-op path does. Each op's cost is
# mostly instruction-cache misses (the recording code runs between stretches of PyTorch code
# that evict it), so I1 misses per op is the figure to watch. Eager and recorded run in two
# processes, the same 20 steps each, in the same run; prints the stepping thread's counts, the
# difference per op, the ratio recorded/eager, and the other threads' instructions apart.
#   bench/vessel_callgrind.sh            (writes bench/baselines/vessel_callgrind.txt)
# Builds build-callgrind/ (valgrind 3.19 cannot decode AVX-512: -march=x86-64-v3, not the
# release preset's -march=native), only the Python extension and its libraries.
set -euo pipefail
source "$(dirname "$0")/../utils/lib/common.sh"
cd "$CRUCIBLE_ROOT"
command -v valgrind >/dev/null || { echo "vessel_callgrind: valgrind is missing (utils/bin/setup installs it)" >&2; exit 1; }
PY="$(crucible_python)"
B=build-callgrind
code="$(git describe --always --dirty 2>/dev/null || echo unknown)"  # before the baseline is rewritten
mkdir -p "$B"
flags="-O3 -march=x86-64-v3 -DNDEBUG -g"
cmake -S . -B "$B" -G Ninja -DCMAKE_CXX_COMPILER=g++ -DCMAKE_C_COMPILER=gcc -DCMAKE_BUILD_TYPE=Release \
  "-DCMAKE_CXX_FLAGS_RELEASE=$flags" "-DCMAKE_C_FLAGS_RELEASE=$flags" \
  -DCRUCIBLE_SANITIZER=none -DCRUCIBLE_CONTRACTS=observe -DCRUCIBLE_BUILD_TESTS=OFF -DCRUCIBLE_BUILD_BENCH=OFF \
  >"$B/configure.log" 2>&1 || { tail -20 "$B/configure.log"; exit 1; }
cmake --build "$B" -j "${CRUCIBLE_JOBS:-$(nproc)}" --target _crucible_ext >"$B/build.log" 2>&1 ||
  { tail -30 "$B/build.log"; exit 1; }
gcc -O2 -shared -fPIC bench/callgrind/client.c -o "$B/libcallgrind_client.so"
steps=20
out="$B/callgrind"
mkdir -p "$out"
for mode in eager recorded; do
  rm -f "$out/$mode".*
  CRUCIBLE_BUILD_DIR="$B" valgrind --tool=callgrind --cache-sim=yes --instr-atstart=no --separate-threads=yes \
    --callgrind-out-file="$out/$mode" "$PY" bench/callgrind/mlp_step.py "$B/libcallgrind_client.so" "$mode" "$steps" \
    >"$out/$mode.log" 2>&1 || { tail -20 "$out/$mode.log"; exit 1; }
done
ops="$(sed -n 's/^ops_per_step //p' "$out/recorded.log")"
cpu="$(lscpu | sed -n 's/^Model name:[[:space:]]*//p' | head -1)"
"$PY" - "$out" "$steps" "$ops" "$cpu" "$code" <<'PY' | tee bench/baselines/vessel_callgrind.txt
import glob, sys
def totals(path):
    events = None
    for line in open(path):
        if line.startswith("events:"):
            events = line.split()[1:]
        if line.startswith("totals:"):
            vals = [int(x) for x in line.split()[1:]]
            vals += [0] * (len(events) - len(vals))  # callgrind leaves trailing zeros off
            return dict(zip(events, vals))
    sys.exit(f"vessel_callgrind: no totals in {path}")
def per_thread(mode):
    # --separate-threads=yes: the client request's dump is <mode>.1-01 (thread 1, which steps);
    # the other threads' counts from the start request on are in the dump at exit, <mode>-NN.
    main = f"{sys.argv[1]}/{mode}.1-01"
    others = {}
    for f in sorted(glob.glob(f"{sys.argv[1]}/{mode}-*")):
        if f.endswith("-01"):
            continue
        for k, v in totals(f).items():
            others[k] = others.get(k, 0) + v
    return totals(main), others
(e, eo), (r, ro) = per_thread("eager"), per_thread("recorded")
steps, ops = int(sys.argv[2]), int(sys.argv[3])
print(f"MLP training step under callgrind ({steps} steps, {ops} recorded ops per step); {sys.argv[4]}; code {sys.argv[5]}")
print("the thread that runs the step:")
print(f"{'per step':10s} {'eager':>12s} {'recorded':>12s} {'added':>10s} {'added/op':>9s} {'recorded/eager':>15s}")
names = {"Ir": "instr", "I1mr": "I1 miss", "D1mr": "D1 rd miss", "D1mw": "D1 wr miss", "DLmr": "LL rd miss", "DLmw": "LL wr miss"}
for k, name in names.items():
    a, b = e.get(k, 0) / steps, r.get(k, 0) / steps
    ratio = f"{b / a:15.3f}" if a > 0 else f"{'-':>15s}"
    print(f"{name:10s} {a:12.0f} {b:12.0f} {b - a:10.0f} {(b - a) / ops:9.1f} {ratio}")
print(f"other threads (drain, pipeline), instructions per step: eager {eo.get('Ir', 0) / steps:.0f}, "
      f"recorded {ro.get('Ir', 0) / steps:.0f}")
if ro.get("Ir", 0) == 0:
    # valgrind runs one thread at a time; the drain, parked on a 1 ms timer, may not get a turn
    # inside the measured steps (the ring holds them all), and then it adds nothing here.
    print("  (0: the drain did not run inside the measured steps this time; in other runs it did,"
          " and then it shares the simulated caches)")
PY
