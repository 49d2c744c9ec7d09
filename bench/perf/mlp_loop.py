"""The MLP training step of bench/python/vessel_overhead.py in a timed loop, for
bench/vessel_perf.sh: warm-up, then `seconds` of steps, eager or recorded. A recorded loop
flushes and clears the trace every 500 steps, so the trace stays small (a trace that grows for
seconds makes the drain, not the recording, the cost). Prints steps and microseconds per step.
Usage: mlp_loop.py eager|recorded SECONDS"""
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "vessel", "torch"))
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import crucible_native as crucible  # noqa: E402

mode, seconds = sys.argv[1], float(sys.argv[2])
if mode not in ("eager", "recorded"):
    sys.exit(f"mlp_loop.py: mode must be eager or recorded, not {mode!r}")
torch.set_num_threads(1)
torch.manual_seed(0)
m = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
opt = torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9)
x, y = torch.randn(32, 64), torch.randint(0, 10, (32,))


def step():
    opt.zero_grad()
    F.cross_entropy(m(x), y).backward()
    opt.step()


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
n = 0
t0 = time.perf_counter()
while time.perf_counter() - t0 < seconds:
    for _ in range(100):
        step()
    n += 100
    if mode == "recorded" and n % 500 == 0:
        crucible.flush()
        crucible.clear()
dt = time.perf_counter() - t0
if mode == "recorded":
    crucible.disable()
print(f"steps {n} us_per_step {dt / n * 1e6:.2f}")
