"""Note [Unwritten allocations] (Replay.cpp): ATen code that computes without dispatching an op
(max_pool1d on the CPU without grad allocates with at::empty, then fills it in its own loop)
leaves a recorded step an allocation no recorded op writes. A plan would return that memory
unwritten, so such a step is refused openly and runs eagerly; memory an op writes in place, as
out=, or through a view is written, and those steps compile."""
import warnings

import pytest
import torch
import torch.nn.functional as F

import crucible_native as crucible
from crucible_native.compile import CrucibleWarning


def run(f, *args, calls=4):
    step = crucible.compile(f, guard=())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(calls):
            got, want = step(*args), f(*args)
            assert torch.equal(got, want)
    return step, [str(w.message) for w in caught if issubclass(w.category, CrucibleWarning)]


@pytest.mark.parametrize("ceil_mode", [True, False])
def test_a_pool_computed_without_dispatching_runs_eagerly_and_says_why(ceil_mode):
    x = torch.randn(2, 3, 9)
    step, said = run(lambda x: F.max_pool1d(x, 3, stride=2, ceil_mode=ceil_mode) * 2, x)
    assert step.stats()["plan_runs"] == 0
    assert any("no recorded op wrote" in m and "aten::empty" in m for m in said), said


def test_the_same_pool_with_grad_dispatches_its_op_and_compiles():
    w = torch.randn(3, 1, requires_grad=True)

    def f(x):
        y = F.max_pool1d(x * w, 3, stride=2)
        y.sum().backward()
        return y.detach()
    x = torch.randn(2, 3, 9)
    step = crucible.compile(f, guard=())
    for _ in range(4):
        w.grad = None
        got = step(x)
        g = w.grad.clone()
        w.grad = None
        assert torch.equal(got, f(x)) and torch.equal(g, w.grad)
    assert step.stats()["plan_runs"] > 0


def test_memory_written_in_place_as_out_or_through_a_view_compiles():
    def f(x):
        a = torch.empty(3, 4).fill_(2.0)
        b = torch.add(x, 1, out=torch.empty_like(x))
        c = torch.empty(4, 3)
        c.t().copy_(x)
        return a + b + c.t()
    step, said = run(f, torch.randn(3, 4))
    assert step.stats()["plan_runs"] > 0, said
    assert not any("no recorded op wrote" in m for m in said), said


def test_allocations_written_through_pieces_or_only_sized_compile():
    # unbind's pieces are views of the allocation; an empty allocation holds nothing to write;
    # zeros_like reads only its argument's sizes
    def f(x):
        buf = torch.empty(2, 4)
        a, b = buf.unbind()
        a.copy_(x[0])
        b.copy_(x[1] * 2)
        acc = torch.cat([torch.empty(0), x.flatten()])
        return buf + torch.zeros_like(torch.empty(2, 4)), acc
    x = torch.randn(2, 4)
    step = crucible.compile(f, guard=())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(4):
            for a, b in zip(step(x), f(x)):
                assert torch.equal(a, b)
    said = [str(w.message) for w in caught if issubclass(w.category, CrucibleWarning)]
    assert step.stats()["plan_runs"] > 0, said
