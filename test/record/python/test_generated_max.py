"""Note [Generated max and argmax] (PointwiseProgram.h): max.dim, min.dim, argmax and argmin over
a dense float tensor run as generated code on the cpu backend with eager's results: the index is
the smallest among equal extremes (-0 and +0 are equal), a NaN's when there is one, and the value
is the element at that index, its sign and NaN included. Inputs hold ties, signed zeros and NaN;
reductions over the last, first and a middle dim, keepdim, and argmax over the whole tensor."""
import platform

import pytest
import torch

import crucible_native as crucible
from crucible_native._native import build_info

pytestmark = [pytest.mark.skipif(build_info.get("exec") is False,
                                 reason="built with -DCRUCIBLE_LLVM=OFF: no exec stage"),
              pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"),
                                 reason="the CPU backend generates reductions on x86-64 only")]

NAN = float("nan")


def reductions(x, y):
    a, b = x.max(1)
    c, d = x.min(0)
    e, f = y.min(1, keepdim=True)
    return a, b, c, d, e, f, x.argmax(-1), x.argmin(0), x.argmax(), y.argmax(1, keepdim=True), y.argmin(-1)


def same(a, b):
    """Equal values, NaN where eager has NaN, and the same sign bits (so -0 is not +0)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.dtype == torch.int64:
        return torch.equal(a, b)
    return bool(((a == b) | (a.isnan() & b.isnan())).all()) and torch.equal(torch.signbit(a), torch.signbit(b))


def inputs(dtype, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(-3, 4, (9, 40), generator=g).to(dtype)  # many ties
    x[1, 7] = NAN
    x[2, 0] = NAN
    x[2, 9] = NAN
    x[3] = 0.0
    x[3, 5::3] = -0.0  # the max and min are zeros of both signs
    x[4] = -0.0
    x[4, 11] = 0.0
    x[5] = float("inf")
    x[6, ::2] = -float("inf")
    y = torch.randn(3, 700, 5, dtype=torch.float64, generator=g).to(dtype)
    y[1, 100:200] = 2.5  # ties along the reduced dim
    y[2, 13, 4] = NAN
    return x, y


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_generated_max_and_argmax_give_eager_results(dtype):
    step = crucible.compile(reductions, backend="cpu", guard=())
    for seed in range(4):
        x, y = inputs(dtype, seed)
        got, want = step(x, y), reductions(x, y)
        for k, (a, b) in enumerate(zip(got, want)):
            assert same(a, b), (seed, k, a, b)
    p = step.plans()[0]
    assert p["exec_calls"] == 8 and p["exec_generated_calls"] == 8, p["exec_summary"]


def test_an_accuracy_inside_a_training_step_keeps_eager_bits():
    # (out.argmax(1) == y).float().mean() beside the loss, as training loops log it
    torch.manual_seed(0)
    models = [torch.nn.Sequential(torch.nn.Linear(20, 32), torch.nn.ReLU(), torch.nn.Linear(32, 5))
              for _ in range(2)]
    models[1].load_state_dict(models[0].state_dict())
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in models]

    def step_of(m, opt):
        def step(x, y):
            opt.zero_grad()
            out = m(x)
            loss = torch.nn.functional.cross_entropy(out, y)
            loss.backward()
            opt.step()
            return loss.detach(), (out.argmax(1) == y).float().mean(), out.max(1)[0].sum()
        return step
    step, eager = crucible.compile(step_of(models[0], opts[0]), backend="cpu"), step_of(models[1], opts[1])
    g = torch.Generator().manual_seed(1)
    for i in range(6):
        x, y = torch.randn(16, 20, generator=g), torch.randint(0, 5, (16,), generator=g)
        for a, b in zip(step(x, y), eager(x, y)):
            assert torch.equal(a, b), (i, a, b)
    for a, b in zip(models[0].parameters(), models[1].parameters()):
        assert torch.equal(a, b)
    names = step.plans()[0]["op_names"]
    assert any("argmax" in n for n in names) and any("max.dim" in n for n in names), names


def test_inputs_the_backend_does_not_generate_run_as_library_calls_with_eager_results():
    def f(x, i):
        return x.t().max(1), x.t().argmin(0), i.max(1), i.argmax(0)
    x = torch.randn(6, 50)
    i = torch.randint(0, 9, (6, 50))
    step = crucible.compile(f, backend="cpu", guard=())
    for _ in range(4):
        got, want = step(x, i), f(x, i)
        for a, b in zip(torch.utils._pytree.tree_leaves(got), torch.utils._pytree.tree_leaves(want)):
            assert same(a, b)
    # a transposed input and an integer one: ATen's calls
    assert step.plans()[0]["exec_generated_calls"] == 0, step.plans()[0]["exec_summary"]
