"""The MLP training step of bench/python/vessel_overhead.py in a timed loop, for
bench/vessel_perf.sh: warm-up, then `seconds` of steps, eager or recorded. A recorded loop
flushes and clears the trace every 500 steps, outside the timed steps, so the trace stays small
(a trace that grows for seconds makes the drain, not the recording, the cost). Prints steps and
microseconds per step.
Usage: mlp_loop.py eager|recorded SECONDS"""
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "vessel", "torch"))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "python"))
import torch  # noqa: E402

import crucible_native as crucible  # noqa: E402

import benchutil  # noqa: E402

mode, seconds = sys.argv[1], float(sys.argv[2])
if mode not in ("eager", "recorded"):
    sys.exit(f"mlp_loop.py: mode must be eager or recorded, not {mode!r}")
torch.set_num_threads(1)
m, opt, x, y = benchutil.make_mlp()


def step():
    benchutil.step(m, opt, x, y)


for _ in range(20):
    step()
# One recorded step in both modes, so both processes load and set up the same libraries.
crucible.enable()
step()
crucible.disable()
crucible.flush()
crucible.clear()
if mode == "recorded":
    crucible.enable()
# Only the steps are timed: the flush and clear that keep the trace small wait for the drain
# and the pipeline, which a training loop does not do.
n, stepping, t_end = 0, 0.0, time.perf_counter() + seconds
while time.perf_counter() < t_end:
    t0 = time.perf_counter()
    for _ in range(100):
        step()
    stepping += time.perf_counter() - t0
    n += 100
    if mode == "recorded" and n % 500 == 0:
        crucible.flush()
        crucible.clear()
dt = stepping
if mode == "recorded":
    crucible.disable()
print(f"steps {n} us_per_step {dt / n * 1e6:.2f}")
