"""`crucible plan` and `crucible venn` on recorded traces of the test models (test/forge's
make_traces.py records them; CTest orders this after it), against independent references:
the models' own parameter and buffer bytes from PyTorch, and the plans' own invariants."""
import json
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "record", "python"))

CLI = os.environ.get("CRUCIBLE_CLI", "")
TRACES = os.environ.get("CRUCIBLE_FORGE_TRACES", "")
MODELS = ["mlp", "cnn", "resnet18", "transformer"]

pytestmark = pytest.mark.skipif(
    not CLI or not TRACES or not os.path.exists(os.path.join(TRACES, "index.json")),
    reason="needs CRUCIBLE_CLI and recorded traces (CRUCIBLE_FORGE_TRACES/index.json)")


def run(*args):
    return subprocess.run([CLI, *args], capture_output=True, text=True, timeout=300)


def trace(model):
    import models
    return os.path.join(TRACES, f"{model}_b{models.DEFAULT_BATCH[model]}.crtrace")


def plan_json(*args):
    r = run("plan", "--json", *args)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


@pytest.mark.parametrize("model", MODELS)
def test_weights_in_the_memory_fit_are_the_models_parameters_and_buffers(model):
    import models
    s = models.make(model)
    params = sum(p.numel() * p.element_size() for p in s.model.parameters())
    buffers = sum(b.numel() * b.element_size() for b in s.model.buffers())
    d = plan_json(trace(model))
    assert d["memory"]["weights"] == params + buffers
    assert d["memory"]["total"] == (d["memory"]["weights"] + d["memory"]["state"] +
                                    d["memory"]["activation_arena"])
    assert d["memory"]["fits"] is True


@pytest.mark.parametrize("model", MODELS)
def test_every_node_in_one_group_and_every_edge_classified(model):
    d = plan_json(trace(model))
    ids = [n["id"] for g in d["groups"] for n in g["nodes"]]
    assert sorted(ids) == list(range(len(ids)))
    assert d["phases"][-1]["nodes_after"] >= 0
    assert [p["name"] for p in d["phases"]] == ["canonicalize", "dce", "cse", "fuse_horizontal", "fuse", "lower"]
    e = d["edges"]
    assert e["fused"] + e["materialized"] > 0
    assert d["roofline"]["label"] == "estimate"  # cpu-avx2: derived from width and clock
    assert d["roofline"]["compute_bound_groups"] + d["roofline"]["memory_bound_groups"] == len(d["groups"])


def test_digest_is_the_same_in_two_processes_and_depends_on_the_hardware():
    a = plan_json(trace("transformer"))
    b = plan_json(trace("transformer"))
    h = plan_json("--hardware", "h200", trace("transformer"))
    assert a["plan_digest"] == b["plan_digest"] and len(a["plan_digest"]) == 64
    assert h["plan_digest"] != a["plan_digest"]
    assert h["hardware"]["name"] == "h200"
    assert h["roofline"]["label"] == "datasheet ceiling"


def test_zero_budget_runs_everything_op_by_op_instead_of_failing():
    d = plan_json("--budget-us", "0", trace("cnn"))
    fuse = [p for p in d["phases"] if p["name"] == "fuse"][0]
    assert fuse["over_budget"] is True
    assert fuse["opaque_fallback"] == len(d["groups"])
    assert all(len(g["nodes"]) == 1 for g in d["groups"])


@pytest.mark.parametrize("model", MODELS)
def test_venn_counts_every_op_once(model):
    p = plan_json(trace(model))
    r = run("venn", "--json", trace(model))
    assert r.returncode == 0, r.stderr
    v = json.loads(r.stdout)
    n = sum(len(g["nodes"]) for g in p["groups"])
    assert v["native"] + v["fallback"] == n
    assert sum(k["native"] + k["fallback"] for k in v["kinds"]) == n
    shares = [k["share"] for k in v["kinds"]]
    assert shares == sorted(shares, reverse=True)
    assert abs(sum(shares) - 1.0) < 1e-6


def test_text_output_names_the_parts_a_user_reads():
    r = run("plan", "--hardware", "h200", trace("resnet18"))
    assert r.returncode == 0, r.stderr
    for word in ("memory:", "roofline:", "datasheet ceiling", "phases:", "fused"):  # h200
        assert word in r.stdout


def test_errors_are_clear_with_the_right_exit_code(tmp_path):
    r = run("plan", "--hardware", "tpu9", trace("mlp"))
    assert r.returncode == 2 and "unknown hardware class 'tpu9'" in r.stderr and "cpu-avx2" in r.stderr
    r = run("plan", str(tmp_path / "missing.crtrace"))
    assert r.returncode == 2 and "missing.crtrace" in r.stderr
    bad = tmp_path / "bad.crtrace"
    bad.write_bytes(b"CRTRACE\x00" + os.urandom(256))
    r = run("plan", str(bad))
    assert r.returncode == 1 and "bad.crtrace" in r.stderr
    r = run("plan")
    assert r.returncode == 2 and "TRACE" in r.stderr
    r = run("plan", "--setting", "oops", trace("mlp"))
    assert r.returncode == 2
    r = run("plan", "--infer", trace("mlp"))  # a training step planned as inference
    assert r.returncode == 1 and "training step" in r.stderr and "no_grad" in r.stderr
    r = run("plan", "--allow-differs", "no_such_rule", trace("mlp"))
    assert r.returncode == 1 and "no_such_rule" in r.stderr


def test_an_iteration_with_ops_after_a_drop_is_planned_with_a_warning(tmp_path):
    """An op recorded right after dropped ones (drop_when_full) carries the kAfterDrop flag
    (byte 43 of its 64-byte entry, misc/CRTRACE.md); the plan of an iteration holding such ops
    says it is incomplete and how many. The flag is set here in the file, on every op."""
    import re
    import struct
    data = bytearray(open(trace("mlp"), "rb").read())
    sections = struct.unpack_from("<I", data, 16)[0]
    table = [struct.unpack_from("<IIQQQ", data, 64 + 32 * i) for i in range(sections)]
    _, record, offset, count, _ = next(s for s in table if s[0] == 1)
    assert record == 64 and count > 0
    flags = [offset + 64 * i + 43 for i in range(count)]
    assert all(data[f] & 8 == 0 for f in flags), "the recorded trace has no drop"
    clean = run("plan", trace("mlp"))
    assert clean.returncode == 0 and "incomplete" not in clean.stderr, clean.stderr
    for f in flags:
        data[f] |= 8
    flagged = tmp_path / "flagged.crtrace"
    flagged.write_bytes(bytes(data))
    r = run("plan", str(flagged))
    assert r.returncode == 0, r.stderr
    m = re.search(r"warning: .* the planned iteration is incomplete: (\d+) of its ops", r.stderr)
    assert m, r.stderr
    groups = plan_json(str(flagged))["groups"]
    assert int(m.group(1)) == sum(len(g["nodes"]) for g in groups), "every op of the iteration is flagged"
    digest = [line for line in clean.stdout.splitlines() if line.startswith("plan digest")]
    assert digest and digest[0] in r.stdout.splitlines(), "the plan itself is of the same ops"


# The ops the CPU backend generates (misc/MIMIC.md, Coverage): what a generated kernel may hold.
COVERED = {f"aten::{b}{ip}.{o}" for b in ("add", "sub", "mul", "div") for ip in ("", "_")
           for o in ("Tensor", "Scalar")} | {f"aten::{u}{ip}" for u in ("neg", "abs", "relu")
                                              for ip in ("", "_")} | {
    "aten::subtract.Tensor", "aten::multiply.Tensor", "aten::divide.Tensor", "aten::negative",
    "aten::threshold_backward", "aten::clone", "aten::copy_", "aten::zero_", "aten::zeros_like",
    "aten::ones_like", "aten::sum.dim_IntList", "aten::sum", "aten::mean.dim", "aten::native_layer_norm",
    "aten::native_layer_norm_backward",
    "aten::nll_loss_forward", "aten::nll_loss_backward",
    "aten::mse_loss_backward"}  # softmax needs ATen's exp: not in the CLI


def test_plan_shows_each_kernel_generated_or_a_library_call_and_its_cache_state(tmp_path):
    env = dict(os.environ, CRUCIBLE_CACHE_DIR=str(tmp_path))

    def mimic():
        r = subprocess.run([CLI, "plan", "--json", trace("transformer")], capture_output=True,
                           text=True, timeout=300, env=env)
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout)["mimic"]

    first, second = mimic(), mimic()
    if os.environ.get("CRUCIBLE_CLI_MIMIC") == "0":   # built without LLVM: the section says so
        assert first == second == {"backend": "cpu", "error": first["error"]}, first
        assert "built without the Mimic CPU backend" in first["error"], first
        return
    assert first["backend"] == "cpu"
    ks = first["kernels"]
    assert first["generated"] == sum(k["generated"] for k in ks) > 0
    assert first["library"] == sum(not k["generated"] for k in ks) > 0
    assert len({k["kernel"] for k in ks}) == len(ks)
    for k in ks:
        ops = k["ops"].split(" ... ")[0].split()
        if k["generated"]:
            assert set(ops) <= COVERED, k
            # compiled, or found in memory: a program an earlier kernel of this step compiled;
            # a sum is pinned to ATen's blocked cascade, bit-exact (Note [Generated sums])
            # (a kernel's recipe is its first generated run's; a layer norm's is a sum's)
            sums = ops[0] in {"aten::sum.dim_IntList", "aten::sum", "aten::mean.dim", "aten::native_layer_norm",
                              "aten::native_layer_norm_backward", "aten::nll_loss_forward",
                              "aten::nll_loss_backward"}
            want = ("acc=f32 io=f32 red=blocked round=rne scale=none det=bitexact_strict block=16" if sums
                    else "f32_strict")
            assert k["recipe"] == want and k["cache"] in ("compiled", "memory"), k
        else:
            assert k["why"], k
    assert any(k.get("cache") == "compiled" for k in ks)
    # A second process compiles nothing: each program comes from the disk cache (or from memory,
    # for a kernel whose program an earlier one loaded), and it plans the same.
    caches = [k["cache"] for k in second["kernels"] if k["generated"]]
    assert len(caches) == first["generated"] and set(caches) <= {"disk", "memory"} and "disk" in caches
    assert [(k["kernel"], k["generated"]) for k in second["kernels"]] == \
        [(k["kernel"], k["generated"]) for k in ks]
    # Partly generated kernels (a GEMM and its pointwise epilogue) count their generated calls.
    assert first["generated_calls"] == sum(k["generated_calls"] for k in ks)
    assert first["calls"] == sum(k["calls"] for k in ks)
    assert all(k["generated_calls"] == k["calls"] for k in ks if k["generated"])
    assert all(k["generated_calls"] < k["calls"] for k in ks if not k["generated"])
    assert first["generated"] < sum(k["generated_calls"] > 0 for k in ks), "some kernels are partly generated"
    # Note [Launch tables]: AdamW's runs over the 15 parameters launch as two tables of 15 runs
    # (the steps' increments, the moments; each update waits for its sqrt, ATen's).
    assert (first["table_launches"], first["table_runs"]) == (2, 30)
    assert first["table_launches"] == sum(k["table_launches"] for k in ks)
    assert first["table_runs"] == sum(k["table_runs"] for k in ks)
    r = run("plan", trace("transformer"))
    assert (f"{first['generated']} kernels generated, {first['library']} not (or partly); "
            f"{first['generated_calls']} of {first['calls']} calls generated; "
            f"{first['table_runs']} runs in {first['table_launches']} launch tables") in r.stdout


def test_plan_for_a_gpu_class_has_no_cpu_backend_section():
    d = plan_json("--hardware", "h200", trace("mlp"))
    assert "mimic" not in d


def seq_trace(n):
    return os.path.join(TRACES, f"transformer_s{n}.crtrace")


def test_sizes_from_shows_each_shape_over_the_sequence_length():
    # The transformer recorded at lengths 12 and 9 (make_traces.py): one symbol S, each node's
    # results over it; the same texts from either recording's side.
    here = plan_json("--sizes-from", seq_trace(9), seq_trace(12))["symbolic"]
    there = plan_json("--sizes-from", seq_trace(12), seq_trace(9))["symbolic"]
    assert here["symbols"] == [{"name": "S", "here": 12, "there": 9, "value": here["symbols"][0]["value"], "dim": 1}]
    assert there["symbols"][0]["here"] == 9 and there["symbols"][0]["there"] == 12
    assert here["nodes"] == there["nodes"]
    shapes = {n["op"]: n["shapes"] for n in here["nodes"]}
    assert shapes["aten::embedding"] == ["[4, S, 32]"], shapes["aten::embedding"]
    assert any(n["op"].startswith("aten::_softmax") or n["op"].startswith("aten::_safe_softmax")
               for n in here["nodes"] if n["shapes"] == ["[4, 4, S, S]"]), here["nodes"]
    text = run("plan", "--sizes-from", seq_trace(9), seq_trace(12))
    assert text.returncode == 0, text.stderr
    assert "S = 12 here, 9 there" in text.stdout and "[4, S, 32]" in text.stdout


def test_sizes_from_names_the_batch_b_and_refuses_another_program(tmp_path):
    d = plan_json("--sizes-from", os.path.join(TRACES, "transformer_b8.crtrace"), trace("transformer"))
    assert [s["name"] for s in d["symbolic"]["symbols"]] == ["B"]
    assert ["[B, 12, 32]"] in [n["shapes"] for n in d["symbolic"]["nodes"]]
    r = run("plan", "--sizes-from", trace("mlp"), trace("transformer"))
    assert r.returncode == 1 and "--sizes-from" in r.stderr and "differ in structure" in r.stderr, r.stderr
    r = run("plan", "--sizes-from", trace("transformer"), trace("transformer"))
    assert r.returncode == 1 and "no dim of a batch input differs" in r.stderr, r.stderr
    r = run("plan", "--sizes-from")
    assert r.returncode == 2 and "--sizes-from needs" in r.stderr, r.stderr
