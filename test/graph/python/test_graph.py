"""Iterations, dataflow graph, Merkle hashes and memory plans of real PyTorch training steps."""
import os
import re
import subprocess
import sys
import warnings

import pytest
import torch
import torch.nn as nn

import crucible_native as crucible
import models


def sanitized(names):
    """The graph stage is torch-free C++: under ASan and TSan it is checked on the small models
    (resnet18 adds nodes, not paths); verify runs resnet18 too."""
    return models.large_skipped_under(("asan-ubsan", "tsan"), names, "resnet18's graph under a "
                                      "sanitizer: the small models take its paths; verify runs it")


def record(s, steps=4):
    return models.record(s, steps)


@pytest.mark.parametrize("name", sanitized(models.MODELS))
def test_iteration_matches_the_recorded_steps(name):
    s = models.make(name)
    counts = record(s)
    it = crucible.iteration()
    assert it["total_ops"] == counts[-1], (it["summary"], counts)
    assert it["steady_iterations"] >= 2
    assert it["first_differs"]  # step 1 creates gradients and optimizer state
    assert all(it["ops"][p] > 0 for p in ("forward", "backward", "optimizer"))
    assert it["plan_ok"] and it["plan_error"] is None
    assert it["plan_placement"] == "greedy by size"
    assert it["incomplete"] is False and it["ops_after_drop"] == 0  # back-pressure: nothing dropped
    assert it["plan_ratio"] == pytest.approx(it["arena_bytes"] / it["lower_bound_bytes"])
    assert it["arena_bytes"] >= it["lower_bound_bytes"] > 0
    assert it["edges"] > it["total_ops"] // 2


def test_not_periodic_is_reported_not_guessed():
    x = torch.randn(4)
    crucible.enable()
    for k in range(1, 12):  # a different shape every step
        torch.cat([x] * k).sum()
    crucible.disable()
    with pytest.raises(crucible.CrucibleError, match="not periodic"):
        crucible.iteration()


def test_ops_after_a_loop_that_are_no_loop_are_reported():
    """A training loop, then ops that repeat nothing: crucible.iteration() still returns the
    loop's iteration (the last one found) but says, in a CrucibleWarning and pipeline_stale, that
    what was recorded after it is no loop; after another loop it is current again."""
    s = models.make("mlp")
    record(s, 4)
    it = crucible.iteration()
    assert not it["pipeline_stale"]
    x = torch.randn(4)
    crucible.enable()
    for k in range(1, 12):  # a different shape every step
        torch.cat([x] * k).sum()
    crucible.disable()
    with pytest.warns(crucible.CrucibleWarning, match="no loop .*not periodic"):
        stale = crucible.iteration()
    assert stale["pipeline_stale"] and stale["root_hash"] == it["root_hash"]
    assert "not periodic" in stale["pipeline_last_detection"]
    record(s, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning now
        again = crucible.iteration()
    assert not again["pipeline_stale"] and again["root_hash"] == it["root_hash"]


def test_an_op_every_third_step_is_a_variant_not_a_new_loop():
    # The reference: one plain step of a warmed-up copy (gradients and optimizer state exist).
    warm = models.make("mlp")
    warm.step()
    crucible.enable()
    warm.step()
    crucible.disable()
    plain_step_ops = len(crucible.trace())
    crucible.clear()
    s = models.make("mlp")  # fresh: its first step differs (creates gradients and state)
    crucible.enable()
    for step in range(9):
        s.step()
        if step % 3 == 2:
            s.model[0].weight.detach().norm()  # "logging" every third step
    crucible.disable()
    it = crucible.iteration()
    assert it["variant_every"] == 3, it["summary"]
    assert it["total_ops"] == plain_step_ops


ROOT_SCRIPT = """
import torch, crucible_native as crucible, models
s = models.make(NAME)
crucible.track_modules(s.model)
crucible.mark_inputs(s.x, s.y)
crucible.enable()
for _ in range(3):
    s.step()
crucible.disable()
it = crucible.iteration()
print(it["root_hash"], it["arena_bytes"])
"""


@pytest.mark.parametrize("name", sanitized(["mlp", "resnet18"]))
def test_root_hash_is_the_same_in_two_processes(name):
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [os.path.dirname(os.path.dirname(crucible.__file__)), os.path.join(here, "..", "..", "record", "python")]))
    outs = []
    for _ in range(2):
        r = subprocess.run([sys.executable, "-c", ROOT_SCRIPT.replace("NAME", repr(name))],
                           env=env, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        outs.append(r.stdout.split())
    assert outs[0] == outs[1]
    s = models.make(name)
    record(s, 3)
    assert crucible.iteration()["root_hash"] == outs[0][0], "and the same as in this process"


@pytest.mark.parametrize("name", sanitized(models.MODELS))
def test_a_reused_build_equals_a_fresh_analysis(name):
    """More runs of one step: the pipeline republishes its last analysis when the structure
    key matches (SGD steps), and when only the wiring key does (AdamW's bias corrections are
    scalars that change every step) it rebases the last graph and plan and builds the Merkle
    DAG alone; either way what it publishes equals a fresh analysis of the same recording."""
    s = models.make(name)
    record(s, 3)
    first = crucible.iteration()
    crucible.enable()
    for _ in range(3):
        s.step()
    crucible.disable()
    again = crucible.iteration()
    fresh = crucible._ext.iteration(crucible._ext.snapshot(), -1, 0, 64)
    for k in ("root_hash", "arena_bytes", "lower_bound_bytes", "persistent_bytes", "edges", "externals",
              "regions", "ops", "total_ops"):
        assert again[k] == fresh[k], k
    assert again["steady_iterations"] > first["steady_iterations"]
    assert again["pipeline_builds"] == first["pipeline_builds"]
    # One thread's iteration is one run of consecutive ops: keyed from the drain's wiring log,
    # never from the trace's own pass (Note [Wiring log]).
    assert again["keys_from_log"] > first["keys_from_log"]
    assert again["keys_from_trace"] == first["keys_from_trace"]
    if name == "transformer":
        assert again["pipeline_rewired"] > first["pipeline_rewired"]
        assert again["pipeline_reused"] == first["pipeline_reused"]
        assert again["root_hash"] != first["root_hash"]
    else:
        assert again["pipeline_reused"] > first["pipeline_reused"]
        assert again["root_hash"] == first["root_hash"]


@pytest.mark.parametrize("name", ["mlp", "cnn"])
def test_training_and_evaluation_phases_reuse_their_own_builds(name):
    """A loop that alternates training and evaluation: each phase's step is built once, and
    every later phase of the same kind republishes its analysis (the pipeline keeps the last
    few structures, not only the last one). Each phase follows a clear(), as after a long
    phase the detector's window holds that phase alone. The model is warmed up first (gradients
    and optimizer state exist), so that every training phase starts in the same state: the
    first phase of a fresh model starts with a step that creates them, which moves the
    detector's iteration boundaries."""
    s = models.make(name)
    for _ in range(2):
        s.step()

    def train():
        crucible.clear()
        s.model.train()
        record(s, 3)
        return crucible.iteration()

    def evaluate():
        crucible.clear()
        s.model.eval()
        crucible.enable()
        with torch.no_grad():
            for _ in range(3):
                s.model(s.x)
        crucible.disable()
        return crucible.iteration()

    t1, e1 = train(), evaluate()
    assert e1["pipeline_builds"] == t1["pipeline_builds"] + 1
    assert e1["ops"]["backward"] == 0 and t1["ops"]["backward"] > 0
    assert e1["pipeline_cached"] >= 2
    t2, e2 = train(), evaluate()
    assert e2["pipeline_builds"] == e1["pipeline_builds"], "no build after the first of each kind"
    assert e2["pipeline_reused"] == e1["pipeline_reused"] + 2
    assert (t2["root_hash"], t2["arena_bytes"]) == (t1["root_hash"], t1["arena_bytes"])
    assert (e2["root_hash"], e2["arena_bytes"]) == (e1["root_hash"], e1["arena_bytes"])
    # What was republished is what a fresh analysis of the same recording gives.
    fresh = crucible._ext.iteration(crucible._ext.snapshot(), -1, 0, 64)
    for k in ("root_hash", "arena_bytes", "lower_bound_bytes", "edges", "externals", "total_ops"):
        assert e2[k] == fresh[k], k


@pytest.mark.parametrize("name", ["mlp", "transformer"])
def test_time_build_repeats_the_published_build(name):
    """The benchmark's back-to-back build timing builds the published iteration again: the same
    root hash, once per round."""
    s = models.make(name)
    record(s, 3)
    it = crucible.iteration()
    timed = crucible._ext.time_build(3)
    assert len(timed["us"]) == 3
    assert timed["root_hash"] == it["root_hash"]
    with pytest.raises(ValueError, match="at least 1"):
        crucible._ext.time_build(0)
    # With the caches emptied before each round: the same build.
    cold = crucible._ext.time_build(2, evict_mib=8)
    assert len(cold["us"]) == 2 and cold["root_hash"] == it["root_hash"]
    with pytest.raises(ValueError, match="evict_mib"):
        crucible._ext.time_build(1, evict_mib=-1)


def test_shape_or_dtype_change_changes_the_root_hash():
    def root(batch, dtype=torch.float32):
        crucible.clear()
        torch.manual_seed(0)
        m = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2)).to(dtype)
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        x, y = torch.randn(batch, 8, dtype=dtype), torch.randint(0, 2, (batch,))
        crucible.enable()
        for _ in range(3):
            opt.zero_grad()
            nn.functional.cross_entropy(m(x), y).backward()
            opt.step()
        crucible.disable()
        return crucible.iteration()["root_hash"]

    base = root(4)
    assert root(4) == base
    assert root(5) != base
    assert root(4, torch.float64) != base


def test_identical_transformer_layers_have_identical_region_hashes():
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(16, nhead=2, dim_feedforward=32, dropout=0.0, batch_first=True)
    model = nn.TransformerEncoder(layer, num_layers=2)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(2, 5, 16)
    crucible.track_modules(model)
    crucible.enable()
    for _ in range(3):
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        opt.step()
    crucible.disable()
    regions = {r["name"]: r["hash"] for r in crucible.iteration()["regions"] if r["kind"] == "module"}
    assert "layers.0" in regions and "layers.1" in regions, sorted(regions)
    assert regions["layers.0"] == regions["layers.1"]
    assert regions["layers.0.linear1"] == regions["layers.1.linear1"]
    assert regions["layers.0.linear1"] != regions["layers.0.linear2"]


def test_budget_refusal_names_what_is_live_at_the_peak():
    s = models.make("cnn")
    record(s, 3)
    it = crucible.iteration(budget=1024)
    assert it["plan_error"] and "does not fit" in it["plan_error"] and "at the peak" in it["plan_error"]
    assert crucible.iteration(budget=1 << 30)["plan_error"] is None


PIPELINE_BUDGET_SCRIPT = """
import sys, crucible_native as crucible, models
try:
    crucible.configure(plan_alignment=48)
except crucible.CrucibleError as e:
    print("ALIGN", e)
crucible.configure(memory_budget=int(sys.argv[1]), plan_alignment=256)
s = models.make("cnn")
crucible.enable()
for _ in range(3):
    s.step()
crucible.disable()
it = crucible.iteration()
print("PLAN", it["pipeline_plan_budget"], it["pipeline_plan_alignment"], it["plan_error"])
again = crucible.iteration(crucible.trace(), budget=int(sys.argv[1]), alignment=256)
at_64 = crucible.iteration(crucible.trace(), budget=int(sys.argv[1]), alignment=64)
print("ARENA", it.get("arena_bytes"), again.get("arena_bytes"), at_64.get("arena_bytes"),
      again["root_hash"] == it["root_hash"])
crucible.configure(memory_budget=int(sys.argv[1]))  # the same options again: accepted
try:
    crucible.configure(memory_budget=int(sys.argv[1]) + 1)
except crucible.CrucibleError as e:
    print("LATE", e)
"""


@pytest.mark.parametrize("budget", [1024, 1 << 40])
def test_the_pipeline_checks_every_plan_against_the_configured_budget(budget):
    """crucible.configure(memory_budget=, plan_alignment=) sets what the background pipeline
    plans with; a step that does not fit is published with the refusal, before anything
    runs from the plan. Only before the pipeline starts: later, the error says so."""
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [os.path.dirname(os.path.dirname(crucible.__file__)), os.path.join(here, "..", "..", "record", "python")]))
    r = subprocess.run([sys.executable, "-c", PIPELINE_BUDGET_SCRIPT, str(budget)],
                       env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    out = {line.split(" ", 1)[0]: line.split(" ", 1)[1] for line in r.stdout.splitlines()}
    assert "not a power of two" in out["ALIGN"]
    got_budget, got_alignment, error = out["PLAN"].split(" ", 2)
    assert (int(got_budget), int(got_alignment)) == (budget, 256)
    if budget == 1024:
        assert "does not fit" in error and "at the peak" in error, error
    else:
        assert error == "None"
        pipeline_arena, arena_256, arena_64, same_step = out["ARENA"].split()
        assert same_step == "True" and pipeline_arena == arena_256, "planned with alignment 256"
        assert arena_64 != arena_256, "the cnn's arena tells the two alignments apart"
    assert "already runs" in out["LATE"] and "budget=" in out["LATE"]


def test_export_graph_writes_dot(tmp_path):
    s = models.make("cnn")
    record(s, 3)
    path = tmp_path / "g.dot"
    n = crucible.export_graph(str(path))
    text = path.read_text()
    assert text.startswith("digraph crucible {") and text.rstrip().endswith("}")
    assert text.count("[label=") == n
    assert 'label="conv1"' in text and "->" in text
    # Coloured by phase: as many nodes of each phase's colour as the iteration has ops in it.
    it = crucible.iteration()
    colours = {"forward": "#cfe2ff", "backward": "#f8d7da", "optimizer": "#d1e7dd"}
    fills = re.findall(r'^\s*n\d+ \[label=.*fillcolor="(#[0-9a-f]{6})"\];$', text, re.M)
    assert len(fills) == n
    for phase, colour in colours.items():
        assert fills.count(colour) == it["ops"][phase] > 0, phase
    # Clustered by module: conv1's cluster holds the forward convolution, and the edges join
    # nodes that exist.
    cluster = text[text.index('label="conv1"'):]
    cluster = cluster[:cluster.index("\n  }")]
    assert "aten::convolution" in cluster and colours["forward"] in cluster
    nodes = set(re.findall(r"^\s*(n\d+) \[label=", text, re.M))
    for a, b in re.findall(r"^\s*(n\d+) -> (n\d+)", text, re.M):
        assert a in nodes and b in nodes
