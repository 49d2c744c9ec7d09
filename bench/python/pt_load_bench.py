"""Load throughput of a >= 100 MB torch.save state dict: torch.load vs crucible's ptload, one run.

The file is generated in a temp dir: a small transformer's float32 weights (embedding, per-layer
attention and MLP matrices) plus its small bias and norm vectors. The page cache is warmed
first; then the median of --runs loads each:

  * torch.load(path) with torch.set_num_threads(1), timed around the call: it copies every
    record into new tensor storages, so it reads every byte (PyTorch 1.13 does not verify the
    zip CRC-32s). Once per fresh interpreter (the first load of a process, as a user loading a
    checkpoint gets: every storage page is faulted in) -- the ratio's reference -- and repeated
    in this process after a warm-up, where malloc may reuse the previous load's pages, which
    makes those times bimodal; both are printed.
  * crucible: `crucible pt check --repeat N+1 FILE` (StateDict::open in a loop, timed
    in-process with steady_clock, the first open dropped): maps the file, parses zip and
    pickle, and verifies the CRC-32 of every record, so it too reads every byte; tensors are
    views of the map (no copy).

Prints a table with the times, MB/s (10^6 bytes) and the ratios (target: crucible >= 1.5x
faster), and writes bench/baselines/pt_load_bench.json and a .txt copy of the table.
The crucible binary comes from $CRUCIBLE_BUILD_DIR (default build-release) /bin/crucible.

Usage: .venv/bin/python bench/python/pt_load_bench.py [--runs N] [--layers L]
"""
import argparse
import collections
import datetime
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
TARGET_RATIO = 1.5


def crucible_binary():
    build = os.environ.get("CRUCIBLE_BUILD_DIR", os.path.join(ROOT, "build-release"))
    exe = os.path.join(build, "bin", "crucible")
    if not os.path.isfile(exe):
        sys.exit("pt_load_bench: no %s; build it: cmake --preset release && cmake --build "
                 "--preset release --target crucible (or set CRUCIBLE_BUILD_DIR)" % exe)
    info = os.path.join(build, "lib", "crucible_build.json")
    if os.path.isfile(info):
        with open(info) as f:
            b = json.load(f)
        if b.get("sanitizer") != "none" or b.get("build_type") not in ("Release", "RelWithDebInfo"):
            sys.exit("pt_load_bench: %s is a %s build with sanitizer %s; time a release build "
                     "(CRUCIBLE_BUILD_DIR=build-release)" % (build, b.get("build_type"),
                                                              b.get("sanitizer")))
    return exe


def state_dict(layers, d=1024, vocab=8192):
    """Transformer-ish float32 weights: large matrices and small vectors."""
    g = torch.Generator().manual_seed(0)
    sd = collections.OrderedDict()
    sd["embed.weight"] = torch.randn(vocab, d, generator=g)
    for i in range(layers):
        p = "layers.%d." % i
        for name, shape in (("attn.qkv.weight", (3 * d, d)), ("attn.qkv.bias", (3 * d,)),
                            ("attn.out.weight", (d, d)), ("attn.out.bias", (d,)),
                            ("norm1.weight", (d,)), ("norm1.bias", (d,)),
                            ("mlp.up.weight", (4 * d, d)), ("mlp.up.bias", (4 * d,)),
                            ("mlp.down.weight", (d, 4 * d)), ("mlp.down.bias", (d,)),
                            ("norm2.weight", (d,)), ("norm2.bias", (d,))):
            sd[p + name] = torch.randn(*shape, generator=g)
    sd["norm.weight"] = torch.ones(d)
    return sd


def warm_page_cache(path):
    with open(path, "rb") as f:
        while f.read(1 << 24):
            pass


FRESH = """
import sys, time, torch
torch.set_num_threads(1)
t0 = time.perf_counter()
sd = torch.load(sys.argv[1])
print(time.perf_counter() - t0)
"""


def time_torch_load_fresh(path, runs):
    """Each load is the first in a new interpreter (timed around torch.load only): its storages
    are fresh memory, so every page is faulted in, as when a user loads a checkpoint."""
    out = []
    for _ in range(runs):
        r = subprocess.run([sys.executable, "-c", FRESH, path], capture_output=True, text=True,
                           check=True)
        out.append(float(r.stdout.split()[-1]))
    return out


def time_torch_load_repeated(path, runs):
    """Loads repeated in this process: malloc may hand back pages the previous load faulted in
    (or not: the 32 MiB embedding sits at glibc's mmap threshold), so times are bimodal."""
    torch.set_num_threads(1)
    torch.load(path)  # warm-up
    out = []
    for _ in range(runs):
        t0 = time.perf_counter()
        sd = torch.load(path)
        out.append(time.perf_counter() - t0)
        del sd
    return out


def time_crucible(exe, path, runs):
    r = subprocess.run([exe, "pt", "check", "--repeat", str(runs + 1), path],
                       capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit("pt_load_bench: crucible pt check failed (%d):\n%s%s" % (r.returncode, r.stdout,
                                                                            r.stderr))
    m = re.search(r"^timing: .*seconds=([0-9.,]+)", r.stdout, re.M)
    if not m:
        sys.exit("pt_load_bench: no timing line in:\n" + r.stdout)
    return [float(s) for s in m.group(1).split(",")][1:]  # the first open is the warm-up


def cpu_model():
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        m = re.search(r"^Model name:\s*(.+)$", out, re.M)
        return m.group(1).strip() if m else platform.processor()
    except OSError:
        return platform.processor()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=7, help="timed loads per loader (>= 5)")
    ap.add_argument("--layers", type=int, default=2, help="transformer layers (48 MiB each)")
    args = ap.parse_args()
    if args.runs < 5:
        sys.exit("pt_load_bench: --runs must be >= 5 (the median of at least 5 loads)")
    exe = crucible_binary()
    with tempfile.TemporaryDirectory(prefix="pt_load_bench.") as tmp:
        path = os.path.join(tmp, "state_dict.pt")
        sd = state_dict(args.layers)
        torch.save(sd, path)
        n_tensors, n_elems = len(sd), sum(t.numel() for t in sd.values())
        del sd
        size = os.path.getsize(path)
        if size < 100 * 10**6:
            sys.exit("pt_load_bench: the file is only %d bytes; use more --layers" % size)
        warm_page_cache(path)
        fresh_s = time_torch_load_fresh(path, args.runs)
        repeated_s = time_torch_load_repeated(path, args.runs)
        cru_s = time_crucible(exe, path, args.runs)

    def row(name, secs):
        med = statistics.median(secs)
        return {"median_s": med, "min_s": min(secs), "mb_per_s": size / med / 1e6, "runs_s": secs,
                "name": name}

    res = {"torch_load_fresh": row("torch.load, first in a process", fresh_s),
           "torch_load_repeated": row("torch.load, repeated in a process", repeated_s),
           "crucible": row("crucible StateDict::open", cru_s)}
    cru = res["crucible"]["median_s"]
    ratio = res["torch_load_fresh"]["median_s"] / cru
    ratio_repeated = res["torch_load_repeated"]["median_s"] / cru
    ratio_best = res["torch_load_repeated"]["min_s"] / res["crucible"]["min_s"]
    lines = [
        "pt_load_bench: %d tensors, %d float32 elements, file %d bytes (%.1f MB), page cache warm,"
        % (n_tensors, n_elems, size, size / 1e6),
        "median of %d loads each; MB = 10^6 bytes" % args.runs,
        "",
        "%-34s %12s %12s %10s" % ("loader", "median ms", "min ms", "MB/s"),
    ]
    for r in res.values():
        lines.append("%-34s %12.2f %12.2f %10.0f" % (r["name"], r["median_s"] * 1e3,
                                                     r["min_s"] * 1e3, r["mb_per_s"]))
    lines += [
        "",
        "ratio: crucible is %.2fx as fast as torch.load first in a process (target >= %.1fx: %s)"
        % (ratio, TARGET_RATIO, "met" if ratio >= TARGET_RATIO else "NOT met"),
        "       %.2fx vs repeated torch.load medians, %.2fx min vs min (torch.load's best case:"
        % (ratio_repeated, ratio_best),
        "       malloc reuses pages the previous load already faulted in)",
        "torch.load runs with torch.set_num_threads(1); every timing is around the load call only.",
        "both read every byte: torch.load copies each record into a new storage (no CRC check in",
        "torch %s); crucible maps the file, verifies the CRC-32 of every record, copies nothing."
        % torch.__version__,
    ]
    text = "\n".join(lines)
    print(text)
    out = {
        "benchmark": "pt_load_bench",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": {"cpu": cpu_model(), "cores": os.cpu_count(), "platform": platform.platform()},
        "torch": torch.__version__,
        "crucible_binary": os.path.relpath(exe, ROOT),
        "file_bytes": size, "tensors": n_tensors, "elements": n_elems, "runs": args.runs,
        "results": res, "ratio_torch_over_crucible": ratio,
        "ratio_repeated_medians": ratio_repeated, "ratio_min_vs_min": ratio_best,
        "target_ratio": TARGET_RATIO,
        "notes": "torch.load with torch.set_num_threads(1), timed around the call: once per fresh "
                 "interpreter (the ratio) and repeated in one process (bimodal: malloc may reuse "
                 "faulted pages); crucible = `crucible pt check --repeat`, StateDict::open timed "
                 "in-process (steady_clock) with CRC-32 of every record verified, first open "
                 "untimed; page cache warm.",
    }
    base = os.path.join(ROOT, "bench", "baselines", "pt_load_bench")
    with open(base + ".json", "w") as f:
        json.dump(out, f, indent=2)
        f.write("\n")
    with open(base + ".txt", "w") as f:
        f.write(text + "\n")
    print("wrote %s.json and .txt" % os.path.relpath(base, ROOT))


if __name__ == "__main__":
    main()
