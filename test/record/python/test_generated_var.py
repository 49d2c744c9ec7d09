"""Note [Generated var and std] (PointwiseProgram.h): var, std, var_mean and std_mean over a dense
float tensor run as generated code on the cpu backend with eager's bits: ATen's Welford loop in
double per result, or (one result of var or std) ATen's two passes about torch.mean's value.
Inputs with a large mean and a small spread (where another order or an fma changes the last
bits), rows of 1 to 5000 elements, the last, first, a middle and a block of dims, keepdim,
corrections 0, 1, 2 and 0.5, NaN and inf; one result of up to 32768 elements on one and two
threads; the forms ATen splits over its threads (one result over more than 32768 elements) and
inputs the backend does not take run as ATen's calls, with eager's results."""
import platform
import warnings

import pytest
import torch

import crucible_native as crucible
from crucible_native._native import build_info

pytestmark = [pytest.mark.skipif(build_info.get("exec") is False,
                                 reason="built with -DCRUCIBLE_LLVM=OFF: no exec stage"),
              pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"),
                                 reason="the CPU backend generates reductions on x86-64 only")]


def same(a, b):
    """Equal bits, any NaN matching any NaN."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return bool(((a == b) | (a.isnan() & b.isnan())).all()) and torch.equal(torch.signbit(a), torch.signbit(b))


def spreads(x, y, z):
    return (x.var(1), x.std(0), torch.var_mean(x, 1, correction=0), torch.std_mean(y, dim=(1, 2)),
            y.var(dim=1, keepdim=True), torch.var(y, dim=-1, correction=2), x.std(1, correction=0.5),
            torch.var_mean(z, dim=[0, 1]), z.std(-1), torch.std_mean(y, dim=None, correction=0),
            z.var(0, keepdim=True), z.var(1))


def inputs(dtype, seed, n):
    g = torch.Generator().manual_seed(seed)
    x = (1000 + torch.randn(9, n, generator=g, dtype=torch.float64) * 1e-3).to(dtype)
    x[2, n // 2] = float("nan")
    x[3, 0] = float("inf")
    x[4] = 7.0  # no spread: var 0
    y = (torch.randn(3, 17, 40, generator=g, dtype=torch.float64) * 3 + 50).to(dtype)
    # split over rows (z.std(-1): rows of 33; z.var(1): 70 rows of 40 x 33 results)
    z = torch.randn(70, 40, 33, generator=g, dtype=torch.float64).to(dtype)
    return x, y, z


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("n", [1, 3, 17, 1000, 5000])
def test_generated_var_and_std_give_eager_bits(dtype, n):
    step = crucible.compile(spreads, backend="cpu", guard=())
    for seed in range(4):
        x, y, z = inputs(dtype, seed, n)
        got, want = step(x, y, z), spreads(x, y, z)
        for k, (a, b) in enumerate(zip(torch.utils._pytree.tree_leaves(got),
                                       torch.utils._pytree.tree_leaves(want))):
            assert same(a, b), (seed, k, a, b)
    p = step.plans()[0]
    # n == 1: x.std(0) is one result, ATen's two-pass path, generated too
    assert p["exec_calls"] == 12 and p["exec_generated_calls"] == 12, p["exec_summary"]


def one_result(x, c):
    return (x.var(), x.std(dim=None, correction=c), torch.var(x, dim=list(range(x.dim())), keepdim=True),
            x.std(correction=0) * 2)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("shape", [(1,), (2,), (7,), (3, 5), (1, 1000), (4, 1, 33), (31, 1057), (32768,)])
def test_one_result_of_var_and_std_gives_eager_bits(shape, dtype, threads):
    # ATen's all-reduce path: torch.mean's value, then the squares about it added in order in
    # double; a large mean and a small spread, where another order or an fma changes the bits.
    # Up to 32768 elements the order is the same on any thread count.
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        step = crucible.compile(one_result, backend="cpu", guard=())
        n = 1
        for s in shape:
            n *= s
        for seed in range(9):   # calls 1 to 3 record the plan; it runs from the 4th
            g = torch.Generator().manual_seed(seed)
            x = (1000 + torch.randn(shape, generator=g, dtype=torch.float64) * 1e-3).to(dtype)
            if seed == 7 and n > 2:
                x.view(-1)[n // 2] = float("nan")
            if seed == 8 and n > 2:
                x.view(-1)[1] = float("inf")
            c = 0 if n == 1 else 1   # a count at or below the correction: ATen's call (it warns)
            got, want = step(x, c), one_result(x, c)
            for k, (a, b) in enumerate(zip(got, want)):
                assert same(a, b), (seed, k, a, b)
        p = step.plans()[0]
        assert step.stats()["plan_runs"] == 6, step.stats()
        assert p["exec_generated_calls"] == 4 + 1, p["exec_summary"]   # the mul too
        assert "aten::var.correction" in p["exec_generated_ops"], p["exec_generated_ops"]
    finally:
        torch.set_num_threads(old)


def test_each_correction_passed_to_the_step_gives_eager_bits():
    # A number passed to the step is guarded by value: each correction has a plan of its own,
    # all served by one compiled kernel per op (the correction is a launch parameter).
    def f(x, c):
        return torch.var(x, 1, correction=c), torch.std_mean(x, 0, correction=c)
    x = 1 + torch.rand(6, 300, dtype=torch.float64) * 1e-4
    step = crucible.compile(f, backend="cpu", guard=())
    for c in (0, 0, 0, 0, 2, 2, 2, 2, 0.25, 0.25, 0.25, 0.25, True, True, True, True):
        for a, b in zip(torch.utils._pytree.tree_leaves(step(x, c)),
                        torch.utils._pytree.tree_leaves(f(x, c))):
            assert same(a, b), c
    plans = step.plans()
    assert len(plans) == 4 and all(p["exec_generated_calls"] == 2 for p in plans), plans
    assert step.stats()["plan_runs"] >= 4


def eager_warnings(fn, *args):
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        fn(*args)
    return [(m.category, str(m.message)) for m in w]


@pytest.mark.parametrize("backend", ["cpu", "replay"])
def test_a_correction_at_or_above_the_count_runs_atens_call_and_warns(capfd, backend):
    # ATen warns that the degrees of freedom are <= 0; the generated kernel would not, so such
    # a launch runs ATen's call. Inside a plan run the warning is a Python warning, worded as
    # eager's binding words it (Note [Warnings of a plan run]), not a line on stderr.
    def f(x):
        return x.var(1, correction=5), x.std(0, correction=2)
    x = torch.randn(4, 3, dtype=torch.float64)
    want = eager_warnings(f, x)
    assert len(want) == 1 and "var(): degrees of freedom is <= 0" in want[0][1], want
    step = crucible.compile(f, backend=backend, guard=())
    for i in range(5):
        capfd.readouterr()
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            got = step(x)
        said = [(m.category, str(m.message)) for m in w if not issubclass(m.category, crucible.CrucibleWarning)]
        assert said == want, (i, said)
        assert "degrees of freedom" not in capfd.readouterr().err, i
        for a, b in zip(got, f(x)):
            assert same(a, b)
    assert step.stats()["plan_runs"] == 2
    if backend == "cpu":  # both are generated kernels; the var's launches (3 elements, correction 5) run ATen's call
        assert step.plans()[0]["exec_generated_ops"] == ["aten::var.correction", "aten::std.correction"]


@pytest.mark.parametrize("backend", ["cpu", "replay"])
def test_a_warning_made_an_error_raises_it_after_the_plan_run(backend):
    def f(x):
        return x.var(1, correction=5) * 2
    x = torch.randn(4, 3, dtype=torch.float64)
    step = crucible.compile(f, backend=backend, guard=())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(4):
            step(x)
    runs = step.stats()["plan_runs"]
    assert runs >= 1
    for fn in (f, step):  # eager's binding raises the warning itself; so does the plan's run
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            with pytest.raises(UserWarning, match="degrees of freedom is <= 0"):
                fn(x)
    assert step.stats()["plan_runs"] == runs   # the call raised: not counted as a run
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert same(step(x), f(x))   # the plan stays, and runs


def test_forms_aten_computes_otherwise_run_as_library_calls_with_eager_results():
    def f(x, big):
        # one result of var, std and var_mean over 40000 elements (ATen splits each over its
        # threads), dims that are not one block, a transposed input
        return big.var(), big.std(dim=None), torch.var_mean(big), x.var(dim=(0, 2)), x.transpose(1, 2).std(1)
    g = torch.Generator().manual_seed(3)
    x = torch.randn(4, 5, 6, generator=g) + 100
    big = torch.randn(40000, generator=g, dtype=torch.float64)
    step = crucible.compile(f, backend="cpu", guard=())
    for _ in range(4):
        for a, b in zip(torch.utils._pytree.tree_leaves(step(x, big)),
                        torch.utils._pytree.tree_leaves(f(x, big))):
            assert same(a, b)
    p = step.plans()[0]
    assert p["exec_generated_calls"] == 0, p["exec_summary"]


def test_a_normalization_by_var_trains_as_eager():
    class Norm(torch.nn.Module):  # a hand-written layer norm, as in papers' reference code
        def forward(self, x):
            mean = x.mean(-1, keepdim=True)
            var = x.var(-1, keepdim=True, unbiased=False)
            return (x - mean) / torch.sqrt(var + 1e-5)

    torch.manual_seed(0)
    models = [torch.nn.Sequential(torch.nn.Linear(24, 48), Norm(), torch.nn.ReLU(), torch.nn.Linear(48, 4))
              for _ in range(2)]
    models[1].load_state_dict(models[0].state_dict())
    opts = [torch.optim.SGD(m.parameters(), lr=0.05) for m in models]

    def step_of(m, opt):
        def step(x, y):
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(m(x), y)
            loss.backward()
            opt.step()
            return loss.detach()
        return step
    step, eager = crucible.compile(step_of(models[0], opts[0]), backend="cpu"), step_of(models[1], opts[1])
    g = torch.Generator().manual_seed(1)
    for i in range(6):
        x, y = torch.randn(16, 24, generator=g), torch.randn(16, 4, generator=g)
        assert torch.equal(step(x, y), eager(x, y)), i
    for a, b in zip(models[0].parameters(), models[1].parameters()):
        assert torch.equal(a, b)
    p = step.plans()[0]
    assert "aten::var.correction" in p["exec_generated_ops"], p["exec_generated_ops"]
