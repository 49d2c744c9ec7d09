"""crucible.compile(step, backend="null" | "cpu"): a whole-step plan's ops run through the exec
stage (the captured call planned through Forge: trace -> IR001 -> IR002 -> ExecutionPlan, run by
the null backend's ATen calls or by Mimic's generated kernels beside them), and the step still
gives eager's bits: losses, parameters, gradients and optimizer state, call after call, with a
new batch each call and dropout drawing from the default generator."""
import json
import os
import re
import subprocess
import sys
import warnings

import pytest
import torch
import torch.nn.functional as F

import crucible_native as crucible
from crucible_native._native import build_info
import models

pytestmark = pytest.mark.skipif(build_info.get("exec") is False,
                                reason="built with -DCRUCIBLE_LLVM=OFF: no exec stage")

HERE = os.path.dirname(os.path.abspath(__file__))


def batch(s, i):
    """Call i's batch for setup `s`: new values, the recorded shapes."""
    g = torch.Generator().manual_seed(1000 + i)
    x = (torch.randn(s.x.shape, generator=g) if s.x.is_floating_point()
         else torch.randint(0, 50, s.x.shape, generator=g))
    return x, torch.randint(0, 10, s.y.shape, generator=g)


def step_of(s):
    def step(x, y):
        s.opt.zero_grad()
        loss = s.loss(s.model(x), y)
        loss.backward()
        s.opt.step()
        return loss
    return step


def state_of(s):
    out = {}
    for k, p in s.model.named_parameters():
        out[k] = p
        out[k + ".grad"] = p.grad
    for k, b in s.model.named_buffers():
        out[k] = b
    for i, st in enumerate(s.opt.state.values()):
        for k, v in st.items():
            if isinstance(v, torch.Tensor):
                out[f"opt.state[{i}].{k}"] = v
    return out


def assert_same_state(got, want):
    a, b = state_of(got), state_of(want)
    assert a.keys() == b.keys()
    differ = [k for k in a if (a[k] is None) != (b[k] is None) or (a[k] is not None and not torch.equal(a[k], b[k]))]
    assert not differ, f"differ from eager: {differ[:5]}"


def run_against_eager(name, backend, calls=8, before_call=None):
    s, ref = models.make(name), models.make(name)
    step = crucible.compile(step_of(s), backend=backend)
    eager = step_of(ref)
    for i in range(calls):
        if before_call is not None:
            before_call(i, s, ref)
        x, y = batch(s, i)
        assert_same_call(step, eager, x, y, i, f"call {i}")
    assert_same_state(s, ref)
    return step


def assert_same_call(step, eager, x, y, seed, what):
    """One call of the compiled step and of its eager twin, the global generator seeded alike
    before each (dropout): the losses bit for bit."""
    torch.manual_seed(seed)
    got = step(x, y)
    torch.manual_seed(seed)
    want = eager(x.clone(), y.clone())
    assert torch.equal(got, want), f"{what}: loss {got.item()} vs eager {want.item()}"


@pytest.mark.parametrize("backend", ["null", "cpu"])
@pytest.mark.parametrize("name", models.large_skipped_under_asan(models.VESSEL_MODELS + ["transformer2"]))
def test_a_compiled_step_runs_through_the_exec_stage_with_eager_bits(name, backend):
    with warnings.catch_warnings():
        warnings.simplefilter("error", crucible.CrucibleWarning)  # no fallback to the replay's ops
        step = run_against_eager(name, backend)
    assert step.stats()["plan_runs"] >= 5
    (plan,) = step.plans()
    assert plan["exec"] == backend, plan["exec_note"]
    assert plan["exec_note"] == ""
    assert plan["exec_kernels"] > 0 and plan["exec_calls"] > 0
    # Note [Adopted results]: a result ATen allocates itself (convolution_backward, ops without
    # an out= kernel) becomes its slot's memory; none is copied into place.
    copied = re.search(r"results copied (\d+)", plan["exec_summary"])
    assert copied and int(copied.group(1)) == 0, plan["exec_summary"]
    if backend == "cpu":
        # Mimic's generated code runs the pointwise calls (activations, residual adds, the
        # optimizer's updates); GEMMs, convolutions, norms and reductions stay ATen calls.
        assert 0 < plan["exec_generated_calls"] < plan["exec_calls"], plan["exec_summary"]
    else:
        assert plan["exec_generated_calls"] == 0


@pytest.mark.parametrize("name", ["mlp", "transformer"])
def test_a_learning_rate_change_plans_the_exec_stage_again_and_stays_eager_exact(name):
    """A new learning rate becomes a patch point of the plan after the exec plan was built: the
    call that learned it is planned through the exec stage again, with the new patch point, and
    later calls (the rate changing again) still give eager's bits."""
    def change(i, s, ref):
        if i >= 6:
            for o in (s.opt, ref.opt):
                o.param_groups[0]["lr"] = 0.02 / (i - 4)

    with warnings.catch_warnings():
        warnings.simplefilter("error", crucible.CrucibleWarning)
        step = run_against_eager(name, "cpu", calls=11, before_call=change)
    (plan,) = step.plans()
    assert step.stats()["hyper_learned"] >= 1
    assert plan["patches"] > 0
    assert plan["exec"] == "cpu" and plan["exec_note"] == "", plan["exec_note"]
    assert step.stats()["plan_runs"] >= 6


def test_a_sync_point_plan_says_why_it_does_not_run_through_the_exec_stage():
    s, ref = models.make("mlp"), models.make("mlp")
    seen = []

    def step(x, y):
        s.opt.zero_grad()
        loss = s.loss(s.model(x), y)
        seen.append(1)  # a Python side effect: the step runs at sync points
        loss.backward()
        s.opt.step()
        return loss

    compiled = crucible.compile(step, backend="cpu", mode="sync")
    eager = step_of(ref)
    with pytest.warns(crucible.CrucibleWarning, match="sync-point"):
        for i in range(6):
            x, y = batch(s, i)
            assert torch.equal(compiled(x, y), eager(x, y))
    assert len(seen) == 6
    assert_same_state(s, ref)
    (plan,) = compiled.plans()
    assert plan["sync"] and plan["exec"] == ""
    assert "sync-point" in plan["exec_note"]


def test_backend_must_be_known():
    with pytest.raises(crucible.CrucibleValueError, match="backend must be one of replay, null, cpu"):
        crucible.compile(lambda: None, backend="gpu")
    with pytest.raises(crucible.CrucibleTypeError, match="backend must be a string"):
        crucible.compile(lambda: None, backend=1)


def test_numerics_must_be_known_and_fast_needs_the_cpu_backend():
    with pytest.raises(crucible.CrucibleValueError, match="numerics must be one of bitwise, fast"):
        crucible.compile(lambda: None, numerics="approximate")
    with pytest.raises(crucible.CrucibleTypeError, match="numerics must be a string"):
        crucible.compile(lambda: None, numerics=True)
    for backend in ("null", "replay"):
        with pytest.raises(crucible.CrucibleValueError, match="generates nothing: use backend='cpu'"):
            crucible.compile(lambda: None, backend=backend, numerics="fast")


def test_steps_compiled_differently_over_one_model_keep_their_own_backend_and_numerics():
    """Plans are shared between compiled steps over the same tensors only when they run alike: a
    fast step must not turn a bit-exact one's plan fast, nor a cpu step a replay one's (it did:
    the second step's exec stage replaced the first's on their shared plan)."""
    s = models.make("transformer")
    exact = crucible.compile(step_of(s))
    fast = crucible.compile(step_of(s), numerics="fast")
    replay = crucible.compile(step_of(s), backend="replay")
    for c in (exact, fast, replay, exact):
        for i in range(4):
            c(*batch(s, i))
    assert [(c.plans()[0]["exec"], c.plans()[0]["exec_numerics"]) for c in (exact, fast)] == [
        ("cpu", "bitwise"), ("cpu", "fast")]
    assert replay.plans()[0]["exec"] == ""


def wide_adamw():
    """A 1024 x 1024 linear layer under AdamW, one step taken: its update's loops (1 M elements)
    run split on ATen's threads (Note [Split loops])."""
    torch.manual_seed(0)
    m = torch.nn.Linear(1024, 1024)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
    x = torch.randn(8, 1024)

    def step():
        opt.zero_grad()
        m(x).square().mean().backward()
        opt.step()
    return models.Setup("wide", m, opt, x, None, None), step


@pytest.mark.parametrize("name", ["transformer", "wide"])
def test_an_adamw_update_is_generated_bit_exact_but_for_sqrt(name):
    """numerics="bitwise": AdamW's single-tensor update (decay, lerp_, addcmul_, the step through
    addcdiv_) runs generated code around ATen's sqrt, and gives eager's bits."""
    if name == "wide":
        (s, first), (ref, ref_first) = wide_adamw(), wide_adamw()
    else:
        s, ref = models.make(name), models.make(name)
        first, ref_first = s.step, ref.step
    torch.manual_seed(0)  # the same dropout
    first()  # gradients and optimizer state
    torch.manual_seed(0)
    ref_first()
    step = crucible.compile(lambda: s.opt.step(), guard=(s.opt, s.model))
    for _ in range(5):
        step()
        ref.opt.step()
    assert_same_state(s, ref)
    (plan,) = step.plans()
    assert plan["exec"] == "cpu" and plan["exec_numerics"] == "bitwise"
    params = len(list(s.model.parameters()))
    # per parameter: mul_, lerp_, mul_, addcmul_ and div, add_, addcdiv_
    assert plan["exec_generated_calls"] >= 7 * params, plan["exec_summary"]


def test_an_update_over_many_parameters_compiles_a_few_programs_not_one_per_parameter():
    """The optimizer's update is one generated program per form of parameter (dtype, in place
    or not), whatever its shape: the programs are shape-free and the kernel cache serves every
    parameter from the first one's code, so compile time does not grow with the parameters."""
    torch.manual_seed(0)
    layers = torch.nn.Sequential(*[torch.nn.Linear(5 + i, 6 + i) for i in range(12)]).double()
    opt = torch.optim.AdamW(layers.parameters(), lr=1e-3)
    x = torch.randn(3, 5, dtype=torch.float64)

    def step():
        opt.zero_grad()
        h = x
        for i, m in enumerate(layers):
            h = m(h if h.shape[-1] == m.in_features else h[..., :m.in_features])
        h.square().sum().backward()
        opt.step()
    compiled = crucible.compile(step)
    for _ in range(4):
        compiled()
    (plan,) = compiled.plans()
    assert plan["exec"] == "cpu", plan["exec_note"]
    m = re.search(r"compiled (\d+), from disk (\d+), from memory (\d+)", plan["exec_summary"])
    built, looked_up = int(m[1]) + int(m[2]), int(m[1]) + int(m[2]) + int(m[3])
    params = len(list(layers.parameters()))
    assert looked_up >= 2 * params, plan["exec_summary"]  # at least two generated runs per parameter
    assert built <= 6, plan["exec_summary"]


def mid_adamw():
    """12 linear layers of 96 to 140 outputs under AdamW, one step taken: 24 parameters of 24
    shapes, 106 K values in all (each parameter's loop alone too small to split over threads)."""
    torch.manual_seed(0)
    m = torch.nn.Sequential(*[torch.nn.Linear(80, 96 + 4 * i) for i in range(12)])
    for p in m.parameters():
        p.grad = torch.randn_like(p) * 1e-2
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3, weight_decay=0.1)
    opt.step()
    return m, opt


@pytest.mark.parametrize("numerics", ["bitwise", "fast"])
@pytest.mark.parametrize("n_threads", [1, 2])
def test_an_optimizer_group_launches_its_runs_as_tables(numerics, n_threads, threads):
    """Note [Launch tables]: the update's runs of one program over every parameter (the steps'
    increments; the moments, or with numerics="fast" the moments and update in one run) launch
    as one table each, split over ATen's threads by the table's elements, with eager's bits
    (bitwise) and the bits of the same runs launched one by one (CRUCIBLE_LAUNCH_TABLES=0)."""
    torch.set_num_threads(n_threads)
    (m, opt), (ref, ref_opt) = mid_adamw(), mid_adamw()
    (m_alone, opt_alone) = mid_adamw()
    step = crucible.compile(lambda: opt.step(), numerics=numerics, guard=(opt, m))
    os.environ["CRUCIBLE_LAUNCH_TABLES"] = "0"
    try:
        alone = crucible.compile(lambda: opt_alone.step(), numerics=numerics, guard=(opt_alone, m_alone))
        for _ in range(6):
            alone()
    finally:
        del os.environ["CRUCIBLE_LAUNCH_TABLES"]
    for _ in range(6):
        step()
        ref_opt.step()
    (plan,) = step.plans()
    assert plan["exec"] == "cpu" and plan["exec_numerics"] == numerics
    params = len(list(m.parameters()))
    assert f"{2 * params} runs in 2 launch tables" in plan["exec_summary"], plan["exec_summary"]
    assert "launch tables" not in alone.plans()[0]["exec_summary"]
    for p, q in zip(m.parameters(), m_alone.parameters()):
        assert torch.equal(p, q)
    for a, b in zip(opt.state.values(), opt_alone.state.values()):
        assert all(torch.equal(a[k], b[k]) for k in a)
    if numerics == "bitwise":
        for p, q in zip(m.parameters(), ref.parameters()):
            assert torch.equal(p, q)
        for a, b in zip(opt.state.values(), ref_opt.state.values()):
            assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("name,more", [("transformer", True), ("mlp", False)])
def test_fast_numerics_train_200_steps_within_a_stated_tolerance_of_eager(name, more):
    """numerics="fast" (misc/MIMIC.md, Fast numerics): more generated code where bit-exact code
    cannot be (AdamW's sqrt; the MLP's SGD is generated whole either way), each op within its
    bound of ATen's; 200 training steps keep every loss within a relative 1e-5 of eager's
    (measured: 2e-7 for the transformer)."""
    s, ref = models.make(name), models.make(name)
    fast = crucible.compile(step_of(s), numerics="fast")
    bitwise = crucible.compile(step_of(models.make(name)))
    eager = step_of(ref)
    worst = 0.0
    for i in range(200):
        x, y = batch(s, i)
        torch.manual_seed(i)
        got = fast(x, y).item()
        torch.manual_seed(i)
        want = eager(x.clone(), y.clone()).item()
        worst = max(worst, abs(got - want) / abs(want))
        if i < 4:
            bitwise(x.clone(), y.clone())
    assert worst <= 1e-5, f"a loss {worst:.3g} away from eager's (relative)"
    (plan,) = fast.plans()
    (exact,) = bitwise.plans()
    assert plan["exec"] == "cpu" and plan["exec_numerics"] == "fast"
    gained = plan["exec_generated_calls"] - exact["exec_generated_calls"]
    assert gained > 0 if more else gained == 0, (plan["exec_summary"], exact["exec_summary"])


@pytest.mark.parametrize("backend", ["replay", "null", "cpu"])
def test_a_plan_run_keeps_no_reference_to_the_steps_arguments(backend):
    """A batch passed to a compiled step is freed when the caller drops it: the plan's run holds
    its storage only while it runs."""
    s = models.make("mlp")
    step = crucible.compile(step_of(s), backend=backend)
    for i in range(4):
        step(*batch(s, i))
    x, y = batch(s, 9)
    refs = [t.untyped_storage()._weak_ref() for t in (x, y)]
    runs = step.stats()["plan_runs"]
    step(x, y)
    assert step.stats()["plan_runs"] == runs + 1
    del x, y
    assert all(torch.UntypedStorage._expired(r) for r in refs)


SECOND_PROCESS = r"""
import json, sys, warnings
sys.path.insert(0, sys.argv[1])
import torch
import crucible_native as crucible
import models
from test_compile_backend import batch, step_of
s = models.make("transformer")
step = crucible.compile(step_of(s), backend="cpu")
with warnings.catch_warnings():
    warnings.simplefilter("error", crucible.CrucibleWarning)
    for i in range(4):
        step(*batch(s, i))
print(json.dumps(step.plans()[0]))
"""


def test_a_second_process_loads_every_kernel_from_the_disk_cache(tmp_path):
    """Mimic's kernel cache across processes: the same step compiled in a new process compiles
    nothing; every generated kernel comes from CRUCIBLE_CACHE_DIR."""
    env = dict(os.environ, CRUCIBLE_CACHE_DIR=str(tmp_path / "cache"))
    env["PYTHONPATH"] = os.pathsep.join([HERE] + [p for p in sys.path if p])
    plans = []
    for _ in range(2):
        out = subprocess.run([sys.executable, "-c", SECOND_PROCESS, HERE], env=env, capture_output=True,
                             text=True, timeout=600)
        assert out.returncode == 0, out.stderr[-3000:]
        plans.append(json.loads(out.stdout.strip().splitlines()[-1]))
    counts = []
    for p in plans:
        assert p["exec"] == "cpu", p["exec_note"]
        m = re.search(r"compiled (\d+), from disk (\d+), from memory (\d+)", p["exec_summary"])
        assert m, p["exec_summary"]
        counts.append(tuple(int(g) for g in m.groups()))
    (c1, d1, _), (c2, d2, _) = counts
    assert c1 > 0 and d1 == 0, plans[0]["exec_summary"]
    assert c2 == 0 and d2 == c1, plans[1]["exec_summary"]


# Every third loop of test_loop_fuzz.py's range (34 loops); every ninth (12) under ASan, where
# each costs 1.5-7 s.
LOOPS = range(0, 100, 9 if models.UNDER_ASAN else 3)


@pytest.mark.parametrize("seed", LOOPS)
def test_generated_loops_compiled_with_the_cpu_backend_match_eager(seed):
    """The training-loop fuzzer (utils/python/crucible_loopgen.py) with backend="cpu": models,
    optimizers, schedulers, side effects, exceptions and batch sizes as test_loop_fuzz.py
    generates them; every difference from eager fails, and so does an exception eager did not
    raise (or raised as another type)."""
    sys.path.insert(0, os.path.join(HERE, "..", "..", "..", "utils", "python"))
    import crucible_loopgen as lg
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", crucible.CrucibleWarning)
        r = lg.check(lg.spec(seed), compile_kw={"backend": "cpu"})
    if r.failed:
        pytest.fail(r.report(), pytrace=False)


def test_an_aten_error_in_a_plan_run_reaches_python_as_eager_raises_it():
    """An embedding index out of range in a plan run raises IndexError with ATen's message, as
    the eager step does, not an error of the plan's."""
    emb = torch.nn.Embedding(10, 4)
    opt = torch.optim.SGD(emb.parameters(), lr=0.1)

    def step(tok):
        opt.zero_grad()
        loss = emb(tok).sum()
        loss.backward()
        opt.step()
        return loss

    compiled = crucible.compile(step, backend="cpu")
    for _ in range(4):
        compiled(torch.tensor([1, 2, 3]))
    assert compiled.plans()[0]["exec"] == "cpu", compiled.plans()[0]["exec_note"]
    with pytest.raises(IndexError, match="index out of range"):
        compiled(torch.tensor([1, 2, 30]))


@pytest.mark.parametrize("backend", ["replay", "cpu"])
@pytest.mark.parametrize("scenario", ["untouched", "discarded"])
def test_a_gradient_the_step_leaves_alone_stays_and_one_it_discards_goes(backend, scenario):
    """A parameter the step reads without a gradient (under no_grad), holding a .grad of an
    earlier phase: a step that leaves that .grad alone keeps it, one that sets it to None drops
    it — in plan runs as in eager (the exec stage drops a discarded .grad before a run only when
    the run binds a new one)."""
    def make():
        torch.manual_seed(0)
        holder = torch.nn.Module()
        holder.m = torch.nn.Linear(4, 3)
        holder.side = torch.nn.Parameter(torch.randn(3))
        holder.side.grad = torch.full((3,), 7.0)
        return holder, torch.optim.SGD(holder.m.parameters(), lr=0.1)

    def step_of(holder, opt):
        def step(x, y):
            opt.zero_grad()
            if scenario == "discarded":
                holder.side.grad = None
            with torch.no_grad():
                bias = holder.side * 1.0
            loss = F.cross_entropy(holder.m(x) + bias, y)
            loss.backward()
            opt.step()
            return loss
        return step

    (he, oe), (hc, oc) = make(), make()
    eager, compiled = step_of(he, oe), crucible.compile(step_of(hc, oc), backend=backend, guard=(hc, oc))
    g = torch.Generator().manual_seed(1)
    for _ in range(7):
        x, y = torch.randn(5, 4, generator=g), torch.randint(0, 3, (5,), generator=g)
        assert torch.equal(eager(x, y), compiled(x, y))
    assert compiled.stats()["plan_runs"] >= 4
    if scenario == "untouched":
        assert torch.equal(hc.side.grad, he.side.grad)
    else:
        assert he.side.grad is None and hc.side.grad is None
    for a, b in zip(he.m.parameters(), hc.m.parameters()):
        assert torch.equal(a, b) and torch.equal(a.grad, b.grad)


def test_values_computed_again_in_the_backward_give_eagers_bits():
    """Note [Rematerialization]: h = relu(...) * 0.5 is read by the backward (h * h's gradient)
    and computed again there from relu's output, which the backward keeps anyway; the dropout
    outputs of the transformer likewise. Results stay bit-identical to eager's."""
    res, plans, stats = [], None, None
    for compiled in (False, True):
        torch.manual_seed(0)
        m1, m2 = torch.nn.Linear(16, 64), torch.nn.Linear(64, 4)
        opt = torch.optim.SGD(list(m1.parameters()) + list(m2.parameters()), lr=0.1)

        def f(x):
            opt.zero_grad()
            h = torch.relu(m1(x)) * 0.5
            loss = m2(h * h).square().mean()
            loss.backward()
            opt.step()
            return loss

        step = crucible.compile(f, guard=(m1, m2, opt)) if compiled else f
        g = torch.Generator().manual_seed(1)
        losses = [step(torch.randn(32, 16, generator=g)) for _ in range(8)]
        res.append((losses, [p.detach().clone() for p in list(m1.parameters()) + list(m2.parameters())]))
        if compiled:
            plans, stats = step.plans(), step.stats()
    for a, b in zip(res[0][0], res[1][0]):
        assert torch.equal(a, b)
    for a, b in zip(res[0][1], res[1][1]):
        assert torch.equal(a, b)
    assert stats["plan_runs"] == 5, stats
    assert plans[0]["exec"] == "cpu" and plans[0]["exec_note"] == "", plans[0]["exec_note"]
    assert "1 computed again in the backward" in plans[0]["exec_summary"], plans[0]["exec_summary"]
    step = run_against_eager("transformer", "cpu", calls=8)
    assert re.search(r"\d+ computed again in the backward", step.plans()[0]["exec_summary"])


@pytest.mark.parametrize("backend", ["null", "cpu"])
def test_a_step_over_empty_tensors_runs_through_the_exec_stage(backend):
    # an empty tensor's storage may have no memory (a null data pointer): its binding is fine
    lin = torch.nn.Linear(3, 2)
    steps = [(lambda x: x.cos() * 2, torch.randn(0, 3)), (lambda x: x.sum(0), torch.randn(0, 3)),
             (lambda x: lin(x).relu(), torch.randn(0, 3)), (lambda x: torch.relu(x) + 1, torch.randn(4, 0))]
    for f, x in steps:
        step = crucible.compile(f, backend=backend, guard=(lin,))
        for _ in range(4):
            got, want = step(x), f(x)
            assert got.shape == want.shape and torch.equal(got, want)
        assert step.stats()["plan_runs"] > 0 and step.plans()[0]["exec"] == backend


@pytest.mark.parametrize("backend", ["null", "cpu"])
def test_an_argument_the_provider_cannot_give_back_keeps_the_plan_on_its_aten_ops(backend):
    # a string the trace knows only by its hash (scatter_reduce's reduce="amax", linalg's
    # api_name): the exec stage is refused when the plan is built, with the reason, and the plan
    # runs its own ATen ops, eager-exact; before, its first run raised
    idx = torch.tensor([[0, 1, 0], [1, 0, 1]])
    steps = [(lambda x: torch.zeros(2, 3).scatter_reduce(0, idx, x, reduce="amax") * 2, torch.randn(2, 3),
              "argument 'reduce'"),
             (lambda x: torch.linalg.cholesky(x @ x.t() + 3 * torch.eye(3)), torch.randn(3, 3), "argument 'api_name'")]
    for f, x, why in steps:
        step = crucible.compile(f, backend=backend, guard=())
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", crucible.CrucibleWarning)
            for _ in range(4):
                assert torch.equal(step(x), f(x))
        p = step.plans()[0]
        assert step.stats()["plan_runs"] > 0 and p["exec"] == "" and why in p["exec_note"], p["exec_note"]


def test_a_sparse_tensor_argument_runs_eagerly_and_says_why():
    # a plan holds strided tensors only; the call's signature read the strides of every tensor
    # argument, and a sparse one raised there (before: RuntimeError on the first call)
    a, b = torch.randn(4, 4).to_sparse_csr(), torch.randn(4, 3)

    def f(a, b):
        return torch.sparse.mm(a, b) * 2
    step = crucible.compile(f, guard=())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(4):
            assert torch.equal(step(a, b), f(a, b))
    assert step.stats()["plan_runs"] == 0 and step.stats()["eager_calls"] == 4
    assert any("layout torch.sparse_csr" in str(w.message) for w in caught), [str(w.message) for w in caught]


def test_a_nested_tensor_argument_runs_eagerly_and_says_why():
    nt = torch.nested.nested_tensor([torch.randn(2, 3), torch.randn(4, 3)])

    def f(t):
        return t * 2
    step = crucible.compile(f, guard=())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            for a, b in zip(step(nt).unbind(), f(nt).unbind()):
                assert torch.equal(a, b)
    assert step.stats()["plan_runs"] == 0
    assert any("layout nested" in str(w.message) for w in caught), [str(w.message) for w in caught]
