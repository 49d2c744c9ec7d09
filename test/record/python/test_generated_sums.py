"""Note [Generated sums] (PointwiseProgram.h): sum and mean over a dense float tensor whose reduced
dims are all innermost or all outermost run as generated code on the cpu backend, in ATen's
cascade order (misc/ATEN_ORDER.md section 2), so every result has eager's bits. Shapes straddle
the order's branches: rows shorter and longer than a 32-byte vector, columns below and above
four vectors' worth, 16-row cascade steps with leftovers, 3-d tensors whose reduced dims
coalesce."""
import pytest
import torch

import crucible_native as crucible
import models
from test_compile_backend import assert_same_call, assert_same_state, step_of


def values(shape, dtype, g):
    # magnitudes over e^-8..e^8, so that the order of the additions shows in the bits
    x = torch.randn(shape, dtype=torch.float64, generator=g)
    return (x * torch.exp(torch.empty(shape, dtype=torch.float64).uniform_(-8, 8, generator=g))).to(dtype)


def sums(x):
    return (x.sum(0), x.sum(-1), x.mean(0), x.mean(-1, keepdim=True), x.sum())


def run(f, x, calls=4):
    step = crucible.compile(f, backend="cpu", guard=())
    for _ in range(calls):
        got = step(x)
    return step, got


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("rows,cols", [(3, 5), (17, 3), (33, 8), (100, 64), (1000, 100), (64, 1), (2, 4097)])
def test_generated_sums_give_eager_bits(dtype, rows, cols):
    g = torch.Generator().manual_seed(rows * 1000 + cols)
    x = values((rows, cols), dtype, g)
    step, got = run(sums, x)
    for a, b in zip(got, sums(x)):
        assert a.shape == b.shape and a.stride() == b.stride()
        assert torch.equal(a, b), (a - b).abs().max()
    p = step.plans()[0]
    # generated: a sum over a dim of size 1 is none (ATen's kernel is not a sum there), nor a
    # full sum of more than 32768 elements (ATen splits it over its threads)
    expect = 2 * (rows > 1) + 2 * (cols > 1) + (rows * cols <= 32768)
    assert p["exec_calls"] == 5 and p["exec_generated_calls"] == expect, p["exec_summary"]


def test_reduced_dims_that_coalesce_and_keepdim():
    g = torch.Generator().manual_seed(5)
    x = values((6, 7, 40), torch.float32, g)

    def f(x):
        return x.sum((1, 2)), x.sum((0, 1), keepdim=True), x.mean(-1), x.sum(0)
    step, got = run(f, x)
    for a, b in zip(got, f(x)):
        assert a.shape == b.shape and torch.equal(a, b)
    assert step.plans()[0]["exec_generated_calls"] == 4, step.plans()[0]["exec_summary"]


def test_sums_the_backend_does_not_generate_run_as_library_calls_with_eager_bits():
    # A reduced dim between kept ones, a transposed (not dense) input, a full sum ATen splits
    # over its threads (more than 32768 elements), a dtype argument: each an ATen call.
    g = torch.Generator().manual_seed(6)
    x = values((6, 7, 40), torch.float32, g)
    big = values((300, 200), torch.float32, g)

    def f(x, big):
        return x.sum(1), x.transpose(0, 2).sum(0), big.sum(), x.sum(0, dtype=torch.float64)
    step = crucible.compile(f, backend="cpu", guard=())
    for _ in range(4):
        got = step(x, big)
    for a, b in zip(got, f(x, big)):
        assert torch.equal(a, b)
    p = step.plans()[0]
    assert p["exec_generated_calls"] == 0, p["exec_summary"]


def test_a_training_step_runs_its_bias_gradients_as_generated_sums():
    # Linear's bias gradient is the sum of the output gradient over the batch (an outer sum).
    s, ref = models.make("mlp", batch=37), models.make("mlp", batch=37)
    step, eager = crucible.compile(step_of(s), backend="cpu"), step_of(ref)
    for i in range(6):
        assert_same_call(step, eager, s.x, s.y, i, f"call {i}")
    assert_same_state(s, ref)
    p = step.plans()[0]
    sums = [k for k, n in enumerate(p["op_names"]) if "sum.dim_IntList" in n]
    assert len(sums) == 2, p["op_names"]
    assert p["exec_generated_calls"] >= 2, p["exec_summary"]
