"""Crucible demo: record a real PyTorch training loop at the dispatcher, export it, read it back,
then compile a training step and replay it from C++ through the exec stage (Mimic's generated
CPU kernels beside ATen calls), bit-identical to eager.

Run through utils/bin/demo (which installs and builds everything first), or directly:
    PYTHONPATH=vessel/torch .venv/bin/python vessel/torch/examples/demo.py
"""
import collections
import os
import sys
import tempfile
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(_HERE, ".."), os.path.join(_HERE, "..", "..", "..", "utils", "python")]
import crucible_native as crucible  # noqa: E402
import crucible_zoo  # noqa: E402  (torchvision's resnet18, defined without torchvision)


def banner(text):
    print(f"\n=== {text}")


def train(model, opt, x, y, steps):
    for _ in range(steps):
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()


def main():
    torch.manual_seed(0)
    torch.set_num_threads(1)
    print(f"Crucible demo — torch {torch.__version__}, native build {crucible.build_dir()}, "
          f"dispatch key {crucible._ext.dispatch_key()}")

    banner("1. Record three training steps of resnet18 (SGD + momentum)")
    model = crucible_zoo.resnet18(num_classes=10)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x, y = torch.randn(4, 3, 64, 64), torch.randint(0, 10, (4,))
    crucible.track_modules(model)
    crucible.mark_inputs(x, y)
    per_iter, before = [], 0
    with crucible.recording():
        for _ in range(3):
            train(model, opt, x, y, 1)
            crucible.flush()
            total = crucible.stats()["total"]
            per_iter.append(total - before)
            before = total
    st = crucible.stats()
    print(f"ops recorded per phase: {st['ops']}  (dropped: {st['dropped']}, ring bytes: {st['bytes']})")
    print(f"ops per iteration: {per_iter}  (the first creates momentum buffers; the rest are identical)")
    print(f"seen but not recorded: {st['skipped']}  (kernel internals, decomposed composites, profiler markers)")
    trace = crucible.trace()
    ops = trace.ops()
    counts = collections.Counter(o["name"] for o in ops[-per_iter[-1]:])
    print("most frequent ops of one iteration:", ", ".join(f"{n} x{c}" for n, c in counts.most_common(6)))
    conv = next(o for o in ops if o["module"] == "layer1.0.conv1")
    print(f"an op with its module path: {conv['name']} in '{conv['module']}' ({conv['phase']}), "
          f"inputs {[tuple(t['shape']) for t in conv['inputs']]} -> {[tuple(t['shape']) for t in conv['outputs']]}")
    produced, unexplained = set(), 0
    for o in ops:
        for t in o["inputs"]:
            if t["has_storage"] and not t["wrapped_number"] and t["storage_id"] not in produced \
                    and t["storage_id"] not in trace.externals:
                unexplained += 1
        produced.update(t["storage_id"] for t in o["outputs"])
    print(f"inputs neither produced by a recorded op nor classified (parameter/input/...): {unexplained}")

    banner("2. What the background pipeline built from it (detect -> build -> publish)")
    it = crucible.iteration()
    print(f"iterations: {it['summary']}")
    print(f"steady iteration: {it['total_ops']} ops {it['ops']}, {it['edges']} dataflow edges, "
          f"{it['externals']} external inputs, Merkle root {it['root_hash']}")
    print(f"static memory plan: arena {it['arena_bytes'] / 2**20:.2f} MiB, lower bound "
          f"{it['lower_bound_bytes'] / 2**20:.2f} MiB (ratio {it['plan_ratio']:.3f}), persistent state "
          f"{it['persistent_bytes'] / 2**20:.2f} MiB; built in {it['pipeline_build_us'] / 1000:.1f} ms")
    blocks = {r["name"]: r["hash"][:12] for r in it["regions"] if r["kind"] == "module" and r["name"] in
              ("layer1.0", "layer1.1", "layer2.0", "layer2.1")}
    print(f"module regions (identical blocks hash alike): {blocks}")
    tight = crucible.iteration(trace, budget=8 << 20)
    print(f"with an 8 MiB device budget: {tight['plan_error'][:160]}...")
    with tempfile.TemporaryDirectory() as d:
        n = crucible.export_graph(os.path.join(d, "resnet18.dot"))
        print(f"export_graph: {n} nodes written as Graphviz DOT (render with: dot -Tsvg FILE)")

    banner("3. Export, load back, compare")
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "resnet18.crtrace")
        crucible.export(path)
        back = crucible.load_trace(path)
        print(f"{path}: {os.path.getsize(path) / 1e6:.2f} MB, {len(back)} ops, "
              f"identical to the live trace: {back == trace}")

    banner("4. Cost of recording: MLP step (64->128->10, batch 32, SGD momentum), one thread")
    crucible.clear()
    mlp = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
    mopt = torch.optim.SGD(mlp.parameters(), lr=0.01, momentum=0.9)
    mx, my = torch.randn(32, 64), torch.randint(0, 10, (32,))
    train(mlp, mopt, mx, my, 20)

    def timed(n=300):
        t0 = time.perf_counter()
        train(mlp, mopt, mx, my, n)
        return (time.perf_counter() - t0) / n * 1e6

    eager, rec = [], []
    for _ in range(5):
        eager.append(timed())
        with crucible.recording():
            rec.append(timed())
        crucible.clear()
    e, r = sorted(eager)[2], sorted(rec)[2]
    print(f"eager {e:.1f} us/step, recording {r:.1f} us/step: +{(r - e) / e * 100:.1f}% "
          f"(bench/python/vessel_overhead.py compares with a TorchDispatchMode recorder)")

    banner("5. crucible.compile: the same kind of loop recorded, compiled, replayed from C++")

    def make_loop(seed):
        torch.manual_seed(seed)
        m = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Dropout(0.1), nn.Linear(128, 10))
        o = torch.optim.AdamW(m.parameters(), lr=1e-3)
        sched = torch.optim.lr_scheduler.LambdaLR(o, lambda i: min(1.0, (i + 1) / 50))  # warm-up

        def train_step(x, y):
            o.zero_grad()
            loss = F.cross_entropy(m(x), y)
            loss.backward()
            o.step()
            return loss
        return m, o, sched, train_step

    g = torch.Generator().manual_seed(1)
    data = [(torch.randn(32, 64, generator=g), torch.randint(0, 10, (32,), generator=g)) for _ in range(8)]
    n_steps = 200
    results = {}
    for mode in ("eager", "compiled"):
        m, o, sched, f = make_loop(0)
        step = crucible.compile(f) if mode == "compiled" else f
        torch.manual_seed(42)  # dropout draws the same numbers in both runs
        t0 = time.perf_counter()
        losses = []
        for i in range(n_steps):
            losses.append(step(*data[i % len(data)]))
            sched.step()  # a new learning rate every step for the first 50
        dt = (time.perf_counter() - t0) / n_steps * 1e6
        results[mode] = (losses, [p.detach().clone() for p in m.parameters()], dt, step)
    el, ep, et, _ = results["eager"]
    cl, cp, ct, step = results["compiled"]
    st, info = step.stats(), step.plans()[0]
    same = all(torch.equal(a, b) for a, b in zip(el, cl)) and all(torch.equal(a, b) for a, b in zip(ep, cp))
    print(f"MLP + dropout + AdamW + LR warm-up, {n_steps} steps: {st['plan_runs']} ran the plan "
          f"({info['ops']} kernel calls: forward, backward and AdamW in one C++ call; "
          f"{info['patches']} scalars patched each step: AdamW's step size, bias correction and decay), "
          f"{st['eager_calls']} eager (warm-up, 2 recorded, 1 that learned the changing learning rate)")
    if info["exec"]:
        print(f"run through the exec stage on the {info['exec']} backend: {info['exec_kernels']} kernels, "
              f"{info['exec_generated_calls']} of {info['exec_calls']} calls in code Mimic generated with LLVM, "
              f"the rest ATen calls on memory the plan placed")
    else:
        print(f"the plan ran its own ATen ops: {info['exec_note']}")
    print(f"static arena for ATen's own allocations: {info['arena_served']} a run, "
          f"{info['arena_in_exec']} of them in the free bytes of the exec plan's arena, the rest in "
          f"{info['arena_bytes'] / 1024:.1f} KiB of its own ({info['arena']}, "
          f"{info['arena_runs']} runs served without an allocator call)")
    print(f"eager {et:.1f} us/step, compiled {ct:.1f} us/step (mean over all {n_steps}, warm-up included): "
          f"{et / ct:.2f}x")
    print(f"every loss and every parameter bit-identical to eager: {same}; final loss {float(cl[-1]):.6f}")


if __name__ == "__main__":
    main()
