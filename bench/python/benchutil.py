"""Shared by the Python benchmarks: how they describe the machine in their saved results, how
they save them, and the MLP training step the Vessel benchmarks measure (vessel_overhead.py,
callgrind/, perf/)."""
import json
import os
import platform
import time


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


def per_step(fn, iters):
    """Seconds per call of fn over `iters` calls in a row."""
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - t0) / iters


def save_baseline(name, rows, text, notes=(), **meta):
    """bench/baselines/<name>.json (the machine, torch, its threads, the date, `meta` and the
    rows) and <name>.txt (a header line of the same, one line per note, then `text`)."""
    import torch
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    d = {"machine": machine(), "torch": torch.__version__, "threads": torch.get_num_threads(),
         "date": time.strftime("%Y-%m-%d"), **meta, "rows": rows}
    base = os.path.join(root, "bench", "baselines", name)
    with open(base + ".json", "w") as f:
        json.dump(d, f, indent=1)
    with open(base + ".txt", "w") as f:
        f.write(f"# {d['machine']}; torch {d['torch']}, {d['threads']} threads, {d['date']}\n")
        for n in notes:
            f.write(f"# {n}\n")
        f.write(text + "\n")


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


def quartiles(values):
    """[first, third] quartile of values (as the benchmarks report a median's spread)."""
    v = sorted(values)
    return [v[len(v) // 4], v[3 * len(v) // 4]]


def paired_rounds(eager, other, rounds, before_round=None):
    """Two-way paired rounds: eager then other, other then eager, in turn (each a callable that
    times a block of steps and returns seconds per step). Returns (each round's added percent
    of other over eager, each round's eager time). before_round(i), if given, runs first."""
    pct, eager_times = [], []
    for i in range(rounds):
        if before_round is not None:
            before_round(i)
        if i % 2 == 0:
            e, o = eager(), other()
        else:
            o, e = other(), eager()
        eager_times.append(e)
        pct.append((o - e) / e * 100)
    return pct, eager_times


def run_json_child(argv, what, env=None, timeout=None):
    """Runs a child process that prints a JSON object on its last line, and returns it; on
    failure shows the child's stderr and raises, naming `what`."""
    import json
    import subprocess
    try:
        r = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"{what} ran past {timeout} s: stopped") from None
    if r.returncode != 0:
        import sys
        sys.stderr.write(r.stderr)
        raise RuntimeError(f"{what} failed (exit {r.returncode}); its output is above")
    return json.loads(r.stdout.strip().splitlines()[-1])


def py_recorder():
    """The peer every Vessel overhead figure is compared with: a Python TorchDispatchMode that
    keeps (op name, output shapes) per op, as a Python-level recorder would."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    class PyRecorder(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            self.ops.append((func.__name__, [tuple(o.shape) for o in tree_flatten(out)[0]
                                             if isinstance(o, torch.Tensor)]))
            return out

    return PyRecorder()
