"""The MLP training step of bench/python/vessel_overhead.py, run under callgrind by
vessel_callgrind.sh: warm-up steps, then `steps` steps counted (client requests around them),
eager or recorded. Usage: mlp_step.py CLIENT_SO eager|recorded STEPS"""
import ctypes
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "vessel", "torch"))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "python"))
import torch  # noqa: E402

import crucible_native as crucible  # noqa: E402

import benchutil  # noqa: E402

client = ctypes.CDLL(sys.argv[1])
mode, steps = sys.argv[2], int(sys.argv[3])
if mode not in ("eager", "recorded"):
    sys.exit(f"mlp_step.py: mode must be eager or recorded, not {mode!r}")
torch.set_num_threads(1)
m, opt, x, y = benchutil.make_mlp()


def step():
    benchutil.step(m, opt, x, y)


for _ in range(5):
    step()
# One recorded step in both modes, so both processes load and set up the same libraries.
crucible.enable()
step()
crucible.disable()
crucible.flush()
ops_per_step = crucible.stats()["total"]
crucible.clear()
if mode == "recorded":
    crucible.enable()
for _ in range(3):
    step()
client.crucible_callgrind_start()
for _ in range(steps):
    step()
client.crucible_callgrind_stop()
if mode == "recorded":
    crucible.disable()
    crucible.flush()
print(f"ops_per_step {ops_per_step}")
