"""Training step time: eager vs crucible.compile vs torch.compile (Inductor, CPU, default mode),
side by side in one process, plus each one's time to its first compiled step in a fresh process.

Per model (mlp, cnn, transformer+AdamW, resnet18 of test/record/python/models.py; efficientnet
if asked for) one twin per variant is built with the same seed:
  eager                 Setup.step as written (zero_grad, forward, loss, backward, opt.step)
  crucible              crucible.compile(step): whole-step replay (the step is pure), through the
                        exec stage on its default backend (Mimic's generated CPU kernels beside
                        ATen calls)
  crucible(sync)        crucible.compile(step, mode="sync"): the step's Python runs every call,
                        backward() and the optimizer step run natively from the plan
  torch.compile(step)   torch.compile of the whole step: Dynamo breaks the graph at
                        loss.backward() and compiles the optimizer step on its own; that is what
                        a user who compiles the step gets (its graphs and breaks are reported)
  torch.compile(model)  the model compiled, loss, backward and optimizer eager
Correctness: each twin takes the same N steps, the global generator reseeded alike before each,
and its losses and final parameters are compared with the eager twin's. crucible must be
bit-identical (torch.equal); Inductor is not expected to be, and its largest absolute difference
is reported (with dropout, the transformer's, Inductor draws its own random numbers: its
difference there is no numerics figure).
Steady state: rounds of one block of steps per variant, the order rotated each round; the figure
is each variant's median per-step time over the rounds, and the ratios are of those medians, all
from the same run.
First compiled step: a fresh process per variant and model (import, build, then calls timed):
crucible until stats()['plan_runs'] first becomes 1 (the warm-up call, two recorded calls that
build the plan, then the first plan run), torch.compile its first call (which compiles), and also
through the last call that compiled again (the optimizer's state appears after the first step,
so its graph recompiles on the second). Inductor runs twice with TORCHINDUCTOR_CACHE_DIR at a
fresh directory: the first is cold, the second warm (FX graph and AOTAutograd caches populated);
crucible.compile likewise with CRUCIBLE_CACHE_DIR at a fresh directory (Mimic's kernel cache).
Writes bench/baselines/compile_bench.{json,txt} unless --quick.

    .venv/bin/python bench/python/compile_bench.py [--rounds 7] [--models mlp,transformer] [--threads N] [--quick]
"""
import time

_T0 = time.perf_counter()  # before torch's import: a cold child reports its import time

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import shutil  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path[:0] = [os.path.join(ROOT, "vessel", "torch"), os.path.join(ROOT, "test", "record", "python"),
                os.path.dirname(os.path.abspath(__file__))]
if "CRUCIBLE_BUILD_DIR" not in os.environ and os.path.isdir(os.path.join(ROOT, "build-release")):
    os.environ["CRUCIBLE_BUILD_DIR"] = os.path.join(ROOT, "build-release")

import torch  # noqa: E402

import benchutil  # noqa: E402
import models  # noqa: E402

_T_TORCH = time.perf_counter()

VARIANTS = ["eager", "crucible", "crucible_sync", "inductor", "inductor_model"]
LABEL = {"eager": "eager", "crucible": "crucible", "crucible_sync": "crucible(sync)", "inductor": "torch.compile(step)",
         "inductor_model": "torch.compile(model)"}


def _ran(st):
    """Calls that ran compiled: whole-step plan runs, or sync-point calls with native stretches."""
    return st["plan_runs"] + st["sync_native"]
ITERS = {"mlp": 400, "cnn": 150, "transformer": 60, "resnet18": 6, "efficientnet": 10}
CORRECTNESS_STEPS = 8   # crucible's plan runs from the 4th call on: 5 plan runs compared
COLD_CALLS = 6          # calls timed in a cold child (Inductor recompiles on the 2nd)
CHILD_TIMEOUT_S = 1800


def _crucible():
    import crucible_native
    return crucible_native


def _dynamo_counters():
    from torch._dynamo.utils import counters
    return counters


def _first_line(e):
    s = f"{type(e).__name__}: {e}".strip().splitlines()
    return s[0][:300] if s else type(e).__name__


def make_variant(name, variant):
    """(setup, the callable one training step goes through, the crucible step or None, seconds
    the wrapping took: crucible.compile() or torch.compile() itself, before any call)."""
    s = models.make(name)
    t0 = time.perf_counter()
    fn, cstep = s.step, None
    if variant == "crucible":
        fn = cstep = _crucible().compile(s.step)
    elif variant == "crucible_sync":
        fn = cstep = _crucible().compile(s.step, mode="sync")
    elif variant == "inductor":
        fn = torch.compile(s.step)
    elif variant == "inductor_model":
        s.model = torch.compile(s.model)  # Setup.step calls self.model: forward compiled, the rest eager
    elif variant != "eager":
        raise ValueError(variant)
    return s, fn, cstep, time.perf_counter() - t0


def dynamo_summary():
    """Graphs compiled and graph breaks since the counters were last cleared."""
    c = _dynamo_counters()
    breaks = c["graph_break"]
    return {"unique_graphs": int(c["stats"]["unique_graphs"]), "graph_breaks": int(sum(breaks.values())),
            "graph_break_reasons": [_break_reason(r) for r in list(breaks)[:4]]}


def _break_reason(r):
    """A graph break's title and the first sentence of its explanation."""
    lines = [x.strip() for x in r.splitlines() if x.strip()]
    expl = next((x[len("Explanation:"):].strip() for x in lines if x.startswith("Explanation:")), "")
    return (lines[0] + (f" ({expl.split('. ')[0].rstrip('.')})" if expl else ""))[:200] if lines else "?"


per_step = benchutil.per_step


def bench(name, rounds, iters, variants):
    """Correctness and steady-state step time of every variant of model `name`."""
    live, info = {}, {v: {} for v in variants}
    losses = {}
    # Correctness: variant after variant (so each one's compiles are counted on their own), the
    # generator reseeded before step k alike for all, so dropout draws the same in each twin.
    for v in variants:
        try:
            s, fn, cstep, _ = make_variant(name, v)
            if v.startswith("inductor"):
                _dynamo_counters().clear()
            ls, first = [], None
            for k in range(CORRECTNESS_STEPS):
                torch.manual_seed(1000 + k)
                t0 = time.perf_counter()
                loss = fn()
                dt = time.perf_counter() - t0
                first = dt if first is None else first
                ls.append(loss.detach().clone())
            info[v]["first_call_in_process_s"] = first
            if v.startswith("inductor"):
                info[v] |= dynamo_summary()
            if cstep is not None:
                st = cstep.stats()
                info[v] |= {"plan_runs": _ran(st), "plans_built": st["plans_built"],
                            "refusals": st["refusals"], "last_refusal": cstep.last_refusal}
                if _ran(st) == 0:
                    raise RuntimeError(f"no plan ran in {CORRECTNESS_STEPS} calls: {cstep.last_refusal}")
            losses[v] = ls
            live[v] = (s, fn)
        except Exception as e:  # report the failure for this model and variant, go on
            info[v]["error"] = _first_line(e)
    if "eager" in live:
        es, _ = live["eager"]
        eparams = [p.detach() for p in es.model.parameters()]
        for v in live:
            if v == "eager":
                continue
            s, _ = live[v]
            params = [p.detach() for p in s.model.parameters()]
            info[v]["losses_bit_identical"] = all(torch.equal(a, b) for a, b in zip(losses[v], losses["eager"]))
            info[v]["params_bit_identical"] = all(torch.equal(a, b) for a, b in zip(params, eparams))
            info[v]["max_abs_loss_diff"] = max(float((a.double() - b.double()).abs().max())
                                               for a, b in zip(losses[v], losses["eager"]))
            info[v]["max_abs_param_diff"] = max(float((a.double() - b.double()).abs().max())
                                                for a, b in zip(params, eparams))
    # Steady state: two more calls each, then rounds of one block per variant, order rotated.
    order = [v for v in variants if v in live]
    for v in order:
        for _ in range(2):
            live[v][1]()
    times = {v: [] for v in order}
    for r in range(rounds):
        k = r % len(order) if order else 0
        for v in order[k:] + order[:k]:
            try:
                times[v].append(per_step(live[v][1], iters))
            except Exception as e:
                info[v]["error"] = _first_line(e)
        order = [v for v in order if "error" not in info[v]]
    for v in order:
        if times[v]:
            info[v]["step_ms"] = statistics.median(times[v]) * 1e3
            info[v]["step_ms_rounds"] = [t * 1e3 for t in times[v]]
    return {"model": name, "batch": models.DEFAULT_BATCH[name], "iters": iters, "rounds": rounds,
            "variants": info, "ratios": ratios(info)}


def ratios(info):
    """Speedups from the medians of this run: a/b = b's time over a's (> 1: a is faster)."""
    ms = {v: d.get("step_ms") for v, d in info.items()}
    out = {}
    for a, b in [("crucible", "eager"), ("crucible_sync", "eager"), ("inductor", "eager"), ("inductor_model", "eager"),
                 ("crucible", "inductor"), ("crucible", "inductor_model"), ("crucible_sync", "inductor"),
                 ("crucible_sync", "inductor_model")]:
        if ms.get(a) and ms.get(b):
            out[f"{a}_vs_{b}"] = ms[b] / ms[a]
    return out


# --- time to the first compiled step, in a fresh process ------------------------------------

def cold_child(variant, name, threads=0):
    """Runs in a fresh process: builds model `name`, times its first COLD_CALLS calls through
    `variant`, prints one JSON line."""
    if threads:
        torch.set_num_threads(threads)
    out = {"variant": variant, "model": name, "import_torch_s": _T_TORCH - _T0, "threads": torch.get_num_threads()}
    try:
        t0 = time.perf_counter()
        if variant.startswith("crucible"):
            _crucible()
        out["import_backend_s"] = time.perf_counter() - t0
        if variant.startswith("inductor"):
            import torch._inductor.config as ic
            from torch._inductor.runtime.cache_dir_utils import cache_dir
            out["fx_graph_cache"] = bool(ic.fx_graph_cache)
            out["autograd_cache"] = bool(torch._functorch.config.enable_autograd_cache)
            out["cache_dir"] = cache_dir()
            _dynamo_counters().clear()
        t0 = time.perf_counter()
        s, fn, cstep, out["wrap_s"] = make_variant(name, variant)
        out["build_s"] = time.perf_counter() - t0 - out["wrap_s"]
        calls, compiled, graphs = [], None, []
        for i in range(COLD_CALLS):
            t0 = time.perf_counter()
            fn()
            calls.append(time.perf_counter() - t0)
            if cstep is not None and compiled is None and _ran(cstep.stats()) >= 1:
                compiled = i + 1
            if variant.startswith("inductor"):
                graphs.append(int(_dynamo_counters()["stats"]["unique_graphs"]))
        out["call_s"] = calls
        if variant.startswith("crucible"):
            if compiled is None:
                raise RuntimeError(f"no plan ran in {COLD_CALLS} calls: {cstep.last_refusal}")
            out["first_compiled_call"] = compiled
        elif variant.startswith("inductor"):
            if not graphs or graphs[0] == 0:
                raise RuntimeError("the first call compiled no graph")
            out["first_compiled_call"] = 1
            # the last call that compiled a new graph: compiles stop after it
            out["last_compiling_call"] = max(i + 1 for i in range(len(graphs))
                                             if graphs[i] > (graphs[i - 1] if i else 0))
            out["graphs_after_call"] = graphs
            c = _dynamo_counters()
            out["cache_counters"] = {k: dict(c[k]) for k in ("inductor", "aot_autograd") if c[k]}
        else:
            out["first_compiled_call"] = 1   # eager: nothing to compile; its first call for reference
        out["to_first_compiled_s"] = sum(calls[:out["first_compiled_call"]])
        out["to_last_compile_s"] = sum(calls[:out.get("last_compiling_call", out["first_compiled_call"])])
        out["later_call_s"] = statistics.median(calls[-2:])
    except Exception as e:
        out["error"] = _first_line(e)
    print(json.dumps(out))


def run_cold(variant, name, cache_dir=None):
    threads = torch.get_num_threads()
    env = dict(os.environ)
    if cache_dir is not None:
        env["TORCHINDUCTOR_CACHE_DIR"] = cache_dir
        env["CRUCIBLE_CACHE_DIR"] = cache_dir
    t0 = time.perf_counter()
    try:
        r = benchutil.run_json_child([sys.executable, os.path.abspath(__file__), "--cold-child", variant, name,
                                      str(threads)],
                                     f"the cold child ({variant}, {name})", env=env, timeout=CHILD_TIMEOUT_S)
    except Exception as e:
        r = {"variant": variant, "model": name, "error": _first_line(e)}
    r["process_wall_s"] = time.perf_counter() - t0
    return r


def cold(name, variants):  # the children run with this process's thread count
    """First compiled step per variant in fresh processes; Inductor and crucible cold then warm
    (each with a cache directory of its own, empty at first)."""
    out = {}
    for v in variants:
        if v == "eager":
            out[v] = {"cold": run_cold(v, name)}
            continue
        d = tempfile.mkdtemp(prefix="compile_bench_cache_")
        try:
            out[v] = {"cold": run_cold(v, name, d), "warm": run_cold(v, name, d)}
        finally:
            shutil.rmtree(d, ignore_errors=True)
    return out


# --- report ---------------------------------------------------------------------------------

def _f(x, fmt):
    return "-" if x is None else format(x, fmt)


def report(rows, variants, quick):
    L = []
    for row in rows:
        name, info = row["model"], row["variants"]
        L.append(f"== {name} (batch {row['batch']}): median ms/step over {row['rounds']} rounds of "
                 f"{row['iters']} steps per variant")
        L.append("  " + "  ".join(f"{LABEL[v]} {_f(info[v].get('step_ms'), '.3f')}" for v in variants))
        rt = row["ratios"]
        parts = [("crucible vs eager", "crucible_vs_eager"), ("torch.compile(step) vs eager", "inductor_vs_eager"),
                 ("torch.compile(model) vs eager", "inductor_model_vs_eager"),
                 ("crucible vs torch.compile(step)", "crucible_vs_inductor"),
                 ("crucible vs torch.compile(model)", "crucible_vs_inductor_model"),
                 ("crucible(sync) vs eager", "crucible_sync_vs_eager"),
                 ("crucible(sync) vs torch.compile(step)", "crucible_sync_vs_inductor"),
                 ("crucible(sync) vs torch.compile(model)", "crucible_sync_vs_inductor_model")]
        L.append("  speedup (x, >1 = the first is faster): " +
                 ", ".join(f"{lab} {_f(rt.get(k), '.2f')}" for lab, k in parts if k in rt or
                           all(x in variants for x in k.split("_vs_"))))
        for v in variants:
            d = info[v]
            if "error" in d:
                L.append(f"  {LABEL[v]}: FAILED: {d['error']}")
                continue
            if v == "eager":
                continue
            if "losses_bit_identical" in d:
                same = d["losses_bit_identical"] and d["params_bit_identical"]
                tail = ""
                if v.startswith("crucible"):
                    tail = ("bit-identical" if same else "NOT BIT-IDENTICAL") + \
                           f" ({d.get('plan_runs')} compiled calls)"
                else:
                    tail = "bit-identical" if same else "not bit-identical (not expected)"
                    if name == "transformer":
                        tail += "; dropout: Inductor draws its own random numbers"
                L.append(f"  {LABEL[v]} after {CORRECTNESS_STEPS} steps vs eager: max |loss diff| "
                         f"{d['max_abs_loss_diff']:.3g}, max |param diff| {d['max_abs_param_diff']:.3g}; {tail}")
            if v.startswith("inductor"):
                g = d.get("unique_graphs")
                L.append(f"    graphs compiled {g}" + (" (it reused what another twin compiled in this process)"
                                                       if g == 0 else "") +
                         f", graph breaks {d.get('graph_breaks')}"
                         + (f": {'; '.join(d['graph_break_reasons'])}" if d.get("graph_break_reasons") else ""))
        c = row.get("cold")
        if c:
            L.append("  first compiled step in a fresh process (s): calls until compiled code ran [process wall]")
            for v in variants:
                if v not in c:
                    continue
                for kind in ("cold", "warm"):
                    r = c[v].get(kind)
                    if r is None:
                        continue
                    if "error" in r:
                        L.append(f"    {LABEL[v]:<21} {kind}: FAILED: {r['error']}")
                        continue
                    line = (f"    {LABEL[v]:<21} {kind}: {r['to_first_compiled_s']:.3f}")
                    if v.startswith("crucible"):
                        line += (f" (calls 1-{r['first_compiled_call']}: warm-up, 2 recorded + plan build, "
                                 f"1st compiled call)")
                    elif v == "eager":
                        line += " (1st call, nothing compiled)"
                    else:
                        line += " (call 1)"
                        if r["last_compiling_call"] > 1:
                            line += (f"; through the last recompile (call {r['last_compiling_call']}): "
                                     f"{r['to_last_compile_s']:.3f}")
                    if v.startswith("inductor"):
                        line += f"; {r['graphs_after_call'][-1]} graphs"
                    if v != "eager":
                        line += f"; {'crucible.compile' if v.startswith('crucible') else 'torch.compile'}() {r['wrap_s']:.3f}"
                    line += (f"; calls {COLD_CALLS - 1}-{COLD_CALLS} {r['later_call_s'] * 1e3:.1f} ms; "
                             f"import torch {r['import_torch_s']:.2f}"
                             f" [{r['process_wall_s']:.2f}]")
                    if kind == "warm":
                        cc = r.get("cache_counters", {})
                        hits = {k: v2 for d2 in cc.values() for k, v2 in d2.items() if "hit" in k or "miss" in k}
                        if hits:
                            line += " " + ", ".join(f"{k} {n}" for k, n in sorted(hits.items()))
                    L.append(line)
    return "\n".join(L)


def git_commit():
    try:
        head = subprocess.run(["git", "-C", ROOT, "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", ROOT, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True).stdout.strip()
        return head + ("-dirty" if dirty else "")
    except OSError:
        return None


def main():
    if "--cold-child" in sys.argv:
        at = sys.argv.index("--cold-child")
        cold_child(sys.argv[at + 1], sys.argv[at + 2], int(sys.argv[at + 3]))
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=None, help="alternating rounds (default 7; --quick 2)")
    ap.add_argument("--models", default="mlp,cnn,transformer,resnet18")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--no-cold", action="store_true", help="skip the fresh-process first-step timings")
    ap.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (default: torch's own)")
    ap.add_argument("--quick", action="store_true", help="smoke run: 2 rounds, few steps, nothing saved")
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    rounds = a.rounds if a.rounds is not None else (2 if a.quick else 7)
    variants = [v for v in a.variants.split(",") if v]
    bad = [v for v in variants if v not in VARIANTS]
    if bad or "eager" not in variants:
        ap.error(f"--variants: from {','.join(VARIANTS)}, eager included")
    # every twin steps through the same Setup.step code object: Dynamo's per-code recompile limit
    # (8) would otherwise send later models' compiled steps back to eager without a word
    torch._dynamo.config.recompile_limit = 64
    import torch._inductor.config as ic
    rows = []
    for m in a.models.split(","):
        iters = max(2, ITERS[m] // 20) if a.quick else ITERS[m]
        t0 = time.perf_counter()
        row = bench(m, rounds, iters, variants)
        if not a.no_cold:
            row["cold"] = cold(m, variants)
        row["bench_wall_s"] = time.perf_counter() - t0
        rows.append(row)
        print(report([row], variants, a.quick), flush=True)
    meta = {"benchmark": "compile_bench", "machine": benchutil.machine(), "torch": torch.__version__,
            "threads": torch.get_num_threads(), "date": time.strftime("%Y-%m-%d"), "commit": git_commit(),
            "rounds": rounds, "correctness_steps": CORRECTNESS_STEPS,
            "inductor_fx_graph_cache": bool(ic.fx_graph_cache),
            "aot_autograd_cache": bool(torch._functorch.config.enable_autograd_cache),
            "dynamo_recompile_limit": torch._dynamo.config.recompile_limit, "rows": rows}
    print(f"# {meta['machine']}; torch {meta['torch']}, {meta['threads']} threads, {meta['date']}, "
          f"commit {meta['commit']}; Inductor fx_graph_cache={meta['inductor_fx_graph_cache']}, "
          f"autograd cache={meta['aot_autograd_cache']}")
    if a.quick:
        print("# --quick: smoke run, nothing saved")
        return
    base = os.path.join(ROOT, "bench", "baselines", "compile_bench")
    with open(base + ".json", "w") as f:
        json.dump(meta, f, indent=1)
    with open(base + ".txt", "w") as f:
        f.write(f"# {meta['machine']}; torch {meta['torch']}, {meta['threads']} threads, {meta['date']}, "
                f"commit {meta['commit']}\n# Inductor: CPU, default mode, fx_graph_cache="
                f"{meta['inductor_fx_graph_cache']}, autograd cache={meta['aot_autograd_cache']}; speedups are "
                f"ratios of medians from the same run\n")
        f.write(report(rows, variants, False) + "\n")
    print(f"wrote {base}.{{json,txt}}")


if __name__ == "__main__":
    main()
