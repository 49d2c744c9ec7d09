"""StripNet inference (examples/strip_cnn): Crucible's torch-free runtime vs PyTorch, one run.

Same network, same weights, batch 1, one thread, on this machine:
  * PyTorch eager (torch.no_grad, eval mode, torch.set_num_threads(1));
  * TorchScript (torch.jit.trace + torch.jit.freeze) — what a user deploying with PyTorch does;
  * Crucible: the C++ program examples/strip_cnn (--bench), fully static, under each kernel ISA.
Each figure is the median per-forward wall time over N forwards after a warm-up, and the peak
resident set (VmHWM) of a process that loads the model and runs them — each in its own
subprocess, so that one does not count another's memory. Prints the ratios and writes
bench/baselines/strip_cnn_bench.{json,txt}.

  .venv/bin/python bench/python/strip_cnn_bench.py [--iters N] [--model-dir DIR]
CRUCIBLE_BUILD_DIR picks the build (default build-release).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

from benchutil import machine
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
EXAMPLE = os.path.join(ROOT, "examples", "strip_cnn")

TORCH_CHILD = r"""
import json, sys, time
import torch
sys.path.insert(0, sys.argv[1])
from train import StripNet, H, W, POSE
torch.set_num_threads(1)
mode, model_path, iters = sys.argv[2], sys.argv[3], int(sys.argv[4])
model = StripNet()
model.load_state_dict(torch.load(model_path))
model.eval()
image, pose = torch.randn(1, 1, H, W), torch.rand(1, POSE)
with torch.no_grad():
    if mode == "torchscript":
        model = torch.jit.freeze(torch.jit.trace(model, (image, pose)))
    times = []
    for i in range(iters + 20):
        t0 = time.perf_counter()
        model(image, pose)
        t1 = time.perf_counter()
        if i >= 20:
            times.append((t1 - t0) * 1e6)
times.sort()
# VmHWM: ru_maxrss would include the parent Python's memory (Linux keeps it across exec).
hwm = [int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM:")][0]
print(json.dumps({"median_us": times[len(times) // 2], "p10_us": times[len(times) // 10],
                  "p90_us": times[len(times) * 9 // 10], "peak_rss_kb": hwm}))
"""


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=2000)
    ap.add_argument("--model-dir", help="reuse a directory train.py wrote")
    args = ap.parse_args()
    build = os.environ.get("CRUCIBLE_BUILD_DIR", os.path.join(ROOT, "build-release"))
    exe = os.path.join(build, "bin", "strip_cnn")
    if not os.path.exists(exe):
        sys.exit(f"{exe} not found: build the release preset first (utils/bin/demo does)")
    import torch

    tmp = None
    model_dir = args.model_dir
    if model_dir is None:
        tmp = tempfile.TemporaryDirectory()
        model_dir = tmp.name
        subprocess.run([sys.executable, os.path.join(EXAMPLE, "train.py"), "--out", model_dir],
                       check=True)
    model_path = os.path.join(model_dir, "strip_cnn.pt")
    check = subprocess.run([exe, model_path, os.path.join(model_dir, "heldout.pt")],
                           capture_output=True, text=True)
    print(check.stdout.strip())
    if check.returncode != 0:
        sys.exit("strip_cnn does not match PyTorch on the held-out set; not benchmarking")

    rows = {}
    for mode in ("eager", "torchscript"):
        out = subprocess.run([sys.executable, "-c", TORCH_CHILD, EXAMPLE, mode, model_path,
                              str(args.iters)], check=True, capture_output=True, text=True)
        rows[f"pytorch_{mode}"] = json.loads(out.stdout)
    for isa in ("avx2", "portable"):
        env = dict(os.environ, CRUCIBLE_RUNTIME_ISA=isa)
        out = subprocess.run([exe, "--bench", str(args.iters), model_path], env=env, check=True,
                             capture_output=True, text=True)
        rows[f"crucible_{isa}"] = json.loads(out.stdout)

    base = rows["crucible_avx2"]
    lines = [f"StripNet (examples/strip_cnn), batch 1, 1 thread, {args.iters} forwards, medians",
             f"{'':22} {'us/forward':>11} {'p90':>8} {'peak RSS':>10} {'time vs crucible':>17}"]
    for name, r in rows.items():
        lines.append(f"{name:22} {r['median_us']:11.1f} {r['p90_us']:8.1f} "
                     f"{r['peak_rss_kb'] / 1024:8.1f}MB {r['median_us'] / base['median_us']:16.2f}x")
    speedup_eager = rows["pytorch_eager"]["median_us"] / base["median_us"]
    speedup_ts = rows["pytorch_torchscript"]["median_us"] / base["median_us"]
    lines.append(f"crucible (avx2) is {speedup_eager:.2f}x faster than PyTorch eager and "
                 f"{speedup_ts:.2f}x faster than TorchScript; peak RSS "
                 f"{base['peak_rss_kb'] / 1024:.2f} MB vs {rows['pytorch_eager']['peak_rss_kb'] / 1024:.0f} MB")
    text = "\n".join(lines)
    print(text)

    result = {
        "benchmark": "strip_cnn_bench",
        "machine": machine(),
        "date": time.strftime("%Y-%m-%d"),
        "torch": torch.__version__,
        "iters": args.iters,
        "check": check.stdout.strip(),
        "rows": rows,
        "speedup_vs_eager": speedup_eager,
        "speedup_vs_torchscript": speedup_ts,
        "targets": {"latency_us": 500, "peak_rss_mb": 4, "speedup_vs_eager": 3},
    }
    out_dir = os.path.join(ROOT, "bench", "baselines")
    with open(os.path.join(out_dir, "strip_cnn_bench.json"), "w") as f:
        json.dump(result, f, indent=2)
    with open(os.path.join(out_dir, "strip_cnn_bench.txt"), "w") as f:
        f.write(f"# {result['machine']}; torch {result['torch']}; {result['date']}\n{text}\n")


if __name__ == "__main__":
    main()
