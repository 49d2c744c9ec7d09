"""crucible.compile on a step whose sizes vary (Note [New sizes], compile.py): a plan holds the
sizes it was recorded at, so each new size costs captured calls and a build. new_sizes="auto"
compiles the first two sizes of a signature at once and a later one only once its calls, run
eagerly meanwhile, could have saved what compiling a size costs (ski rental, measured on the
step's own calls); new_sizes="compile" compiles every size at once. Either way every call gives
eager's bits."""
import importlib
import math

import pytest
import torch

import crucible_native as crucible
ccompile = importlib.import_module("crucible_native.compile")   # the module, not crucible.compile
import models
from test_compile_backend import assert_same_state, step_of


def mlp_batch(batch, i):
    g = torch.Generator().manual_seed(500 + i)
    return torch.randn(batch, 64, generator=g), torch.randint(0, 10, (batch,), generator=g)


def run_sizes(new_sizes, sizes):
    """The mlp step over batches of the given sizes, compiled and eager on twins; every loss
    compared bit for bit, the final state too. Returns the compiled step."""
    s, ref = models.make("mlp"), models.make("mlp")
    step = crucible.compile(step_of(s), new_sizes=new_sizes)
    eager = step_of(ref)
    for i, b in enumerate(sizes):
        x, y = mlp_batch(b, i)
        got, want = step(x, y), eager(x.clone(), y.clone())
        assert torch.equal(got, want), f"call {i} (batch {b}): loss {got.item()} vs eager {want.item()}"
    assert_same_state(s, ref)
    return step


def test_compile_compiles_every_new_size_at_once():
    sizes = [8] * 4 + [12] * 4 + [16] * 4 + [20] * 4
    st = run_sizes("compile", sizes).stats()
    assert st["plans_built"] == 4, st
    assert st["size_waits"] == 0, st


def test_auto_compiles_two_sizes_then_a_new_size_runs_eagerly_first():
    # Sizes 8 and 12 compile at once; the first calls at 16 run eagerly (at least one, to time
    # an eager call of the size, until the measured saving pays for compiling it).
    sizes = [8] * 4 + [12] * 4 + [16] * 3
    step = run_sizes("auto", sizes)
    st = step.stats()
    assert st["plans_built"] == 2, st
    assert st["size_waits"] >= 1, st
    # A size already compiled keeps its plan: back to 8, the plan runs.
    runs = st["plan_runs"]
    x, y = mlp_batch(8, 99)
    step(x, y)
    assert step.stats()["plan_runs"] == runs + 1


def test_the_wait_is_what_compiling_costs_over_what_a_plan_run_saves():
    f = ccompile._Family(2)
    assert f.wait() == 0, "a family's first sizes compile at once"
    f.started = 2
    assert f.wait() == ccompile._BLIND_WAIT, "until the first sizes say what compiling costs and saves"
    f.note_onboard(0.040)
    f.note_plan(0.001)
    assert f.wait() == 1, "one eager call, timed, before judging"
    f.note_eager(0.003)
    assert f.wait() == 20   # 40 ms to compile a size, 2 ms saved per call
    f.note_onboard(0.090)   # the least a size took counts: the first one also compiled kernels
    assert f.wait() == 20
    f.note_eager(0.0004)    # plans no faster than eager: new sizes stay eager
    f.note_eager(0.0004)
    f.note_eager(0.0004)
    f.note_eager(0.0004)
    f.note_eager(0.0004)
    f.note_eager(0.0004)
    f.note_eager(0.0004)
    assert f.eager_s < f.plan_s
    assert f.wait() == math.inf
    assert ccompile._Family(math.inf).wait() == 0, "new_sizes='compile'"


def test_families_are_signatures_that_differ_only_in_sizes():
    a = (1, (torch.Size([8, 64]), (64, 1), torch.float32, torch.device("cpu"), False), "k")
    b = (1, (torch.Size([12, 64]), (64, 1), torch.float32, torch.device("cpu"), False), "k")
    c = (1, (torch.Size([12, 64]), (64, 1), torch.float64, torch.device("cpu"), False), "k")
    d = (1, (torch.Size([12]), (1,), torch.float32, torch.device("cpu"), False), "k")
    assert ccompile._family_key(a) == ccompile._family_key(b)
    assert ccompile._family_key(a) != ccompile._family_key(c), "another dtype"
    assert ccompile._family_key(a) != ccompile._family_key(d), "another rank"


def test_new_sizes_is_checked():
    with pytest.raises(crucible.CrucibleValueError, match="new_sizes must be one of auto, compile"):
        crucible.compile(lambda: None, new_sizes="never")
    with pytest.raises(crucible.CrucibleTypeError, match="new_sizes must be a string"):
        crucible.compile(lambda: None, new_sizes=2)
