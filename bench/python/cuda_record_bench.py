"""Vessel recording overhead on CUDA steps, against eager and a Python TorchDispatchMode
recorder, measured in the same run (on a GPU machine: utils/bin/device-check's machine).

Steps: the Vessel benchmarks' MLP (Linear 64->128, ReLU, Linear 128->10, batch 32, SGD
momentum 0.9) and resnet18 (batch 32, 64x64), both on cuda:0. Each block of steps ends with
torch.cuda.synchronize(), so a figure is the step's wall time with its GPU work done. The
recorded blocks record every op (forward on the calling thread, backward on autograd's CUDA
device thread, optimizer) and clear the trace between blocks. Paired rounds (eager, recorded,
dispatch mode in rotating order), medians over rounds. Prints the ratios and writes
bench/baselines/cuda_record_bench.{json,txt}.

    python bench/python/cuda_record_bench.py [--quick]
"""
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "vessel", "torch"))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "utils", "python"))
import crucible_native as crucible  # noqa: E402

import benchutil  # noqa: E402
import crucible_zoo  # noqa: E402


def make_mlp():
    m, opt, x, y = benchutil.make_mlp()
    m.cuda()
    return m, opt, x.cuda(), y.cuda()


def make_resnet():
    torch.manual_seed(0)
    m = crucible_zoo.resnet18(num_classes=10).cuda()
    opt = torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9)
    return m, opt, torch.randn(32, 3, 64, 64, device="cuda"), torch.randint(0, 10, (32,), device="cuda")


def measure(name, make, steps, rounds):
    m, opt, x, y = make()
    for _ in range(5):   # state, cuDNN/cuBLAS handles, caching allocator
        benchutil.step(m, opt, x, y)
    torch.cuda.synchronize()

    def eager():
        t0 = time.perf_counter()
        for _ in range(steps):
            benchutil.step(m, opt, x, y)
        torch.cuda.synchronize()
        return (time.perf_counter() - t0) / steps

    def recorded():
        crucible.enable()
        t0 = time.perf_counter()
        for _ in range(steps):
            benchutil.step(m, opt, x, y)
        torch.cuda.synchronize()
        crucible.disable()
        t = (time.perf_counter() - t0) / steps
        crucible.clear()
        return t

    def mode():
        r = benchutil.py_recorder()
        t0 = time.perf_counter()
        with r:
            for _ in range(steps):
                benchutil.step(m, opt, x, y)
        torch.cuda.synchronize()
        return (time.perf_counter() - t0) / steps

    # ops per step, and which threads recorded them
    crucible.clear()
    crucible.enable()
    benchutil.step(m, opt, x, y)
    torch.cuda.synchronize()
    crucible.disable()
    crucible.flush()
    st = crucible.stats()
    ops = st["total"]
    backward_threads = sum(1 for t in st["threads"] if t["backward"] > 0)
    assert st["dropped"] == 0, st["dropped"]
    crucible.clear()

    fns = [eager, recorded, mode]
    times = {f.__name__: [] for f in fns}
    for i in range(rounds):
        order = fns[i % 3:] + fns[:i % 3]
        for f in order:
            times[f.__name__].append(f())
    med = {k: statistics.median(v) for k, v in times.items()}
    row = {"step": name, "ops_per_step": ops, "backward_recording_threads": backward_threads,
           "eager_ms": med["eager"] * 1e3, "recorded_ms": med["recorded"] * 1e3,
           "dispatch_mode_ms": med["mode"] * 1e3,
           "recorded_vs_eager": med["recorded"] / med["eager"],
           "dispatch_mode_vs_eager": med["mode"] / med["eager"],
           "recorded_us_per_op": (med["recorded"] - med["eager"]) / ops * 1e6,
           "dispatch_mode_us_per_op": (med["mode"] - med["eager"]) / ops * 1e6}
    return row


def main():
    if not torch.cuda.is_available():
        sys.exit("cuda_record_bench: torch sees no CUDA device (run it on a GPU machine)")
    quick = "--quick" in sys.argv
    steps, rounds = (10, 3) if quick else (30, 9)
    rows = [measure("mlp", make_mlp, steps, rounds), measure("resnet18", make_resnet, steps // 2, rounds)]
    lines = [f"{'step':9} {'ops':>5} {'eager ms':>9} {'recorded':>9} {'x eager':>8} {'us/op':>6} "
             f"{'dispatch mode':>13} {'x eager':>8} {'us/op':>6}"]
    for r in rows:
        lines.append(f"{r['step']:9} {r['ops_per_step']:5d} {r['eager_ms']:9.3f} {r['recorded_ms']:9.3f} "
                     f"{r['recorded_vs_eager']:7.3f}x {r['recorded_us_per_op']:6.2f} {r['dispatch_mode_ms']:13.3f} "
                     f"{r['dispatch_mode_vs_eager']:7.3f}x {r['dispatch_mode_us_per_op']:6.2f}")
    text = "\n".join(lines)
    print(text)
    gpu = torch.cuda.get_device_properties(0)
    benchutil.save_baseline(
        "cuda_record_bench", rows, text,
        notes=[f"GPU: {gpu.name}; torch CUDA {torch.version.cuda}; {steps} steps a block, {rounds} rounds, medians",
               "ratios: a step's wall time recorded (or under a TorchDispatchMode) over eager, measured in the same run"],
        gpu=gpu.name, cuda=torch.version.cuda, quick=quick)


if __name__ == "__main__":
    main()
