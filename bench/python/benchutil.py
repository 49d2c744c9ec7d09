"""Shared by the Python benchmarks: how they describe the machine in their saved results, and
the MLP training step the Vessel benchmarks measure (vessel_overhead.py, callgrind/, perf/)."""
import os
import platform


def machine():
    """'<cpu model>, <n> cores, <os> <release>' for bench/baselines/*.json."""
    model = "?"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"{model}, {os.cpu_count()} cores, {platform.system()} {platform.release()}"


def make_mlp():
    """The MLP training step every Vessel benchmark measures: Linear 64->128, ReLU, Linear
    128->10, batch 32, cross-entropy, SGD with momentum 0.9, seeded. Returns (m, opt, x, y)."""
    import torch
    import torch.nn as nn
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
    opt = torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9)
    x, y = torch.randn(32, 64), torch.randint(0, 10, (32,))
    return m, opt, x, y


def step(m, opt, x, y):
    """One training step: zero_grad, forward, cross-entropy, backward, optimizer step."""
    import torch.nn.functional as F
    opt.zero_grad()
    F.cross_entropy(m(x), y).backward()
    opt.step()
