"""Note [Pointwise programs] (PointwiseProgram.h): mse_loss_backward runs as generated code on the
cpu backend, (norm * (self - target)) * grad_output with ATen's norm (2/numel for a mean, 2 for
a sum or none), and (Note [Sum prologues]) mse_loss's mean or sum of up to 32768 elements as a
sum that squares each difference as it reads it (reduction none: that square, pointwise), so a step trained with nn.MSELoss keeps
eager's bits: every reduction, float32 and float64, a loop split over threads, and sizes bound
without a recorded call (the norm follows the batch)."""
import pytest
import torch
import torch.nn.functional as F

import crucible_native as crucible
from crucible_native._native import build_info

pytestmark = pytest.mark.skipif(build_info.get("exec") is False,
                                reason="built with -DCRUCIBLE_LLVM=OFF: no exec stage")


def same_bits(a, b):
    ints = {torch.float32: torch.int32, torch.float64: torch.int64}[a.dtype]
    return a.shape == b.shape and torch.equal(a.view(ints), b.view(ints))


def twins(features, outputs, dtype):
    torch.manual_seed(0)
    made = [torch.nn.Sequential(torch.nn.Linear(features, 16), torch.nn.ReLU(),
                                torch.nn.Linear(16, outputs)).to(dtype) for _ in range(2)]
    made[1].load_state_dict(made[0].state_dict())
    return [(m, torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9)) for m in made]


def step_of(model, opt, reduction):
    def step(x, y):
        opt.zero_grad()
        out = F.mse_loss(model(x), y, reduction=reduction)
        # a grad_output other than 1 (and a norm other than 2 for a mean): the order of the
        # products shows in the bits
        ((out if reduction != "none" else out.mean()) * 0.37).backward()
        opt.step()
        return out.detach()
    return step


def run(step, eager, models, batches):
    for i, (x, y) in enumerate(batches):
        a, b = step(x, y), eager(x, y)
        assert same_bits(a, b), (i, (a - b).abs().max())
        for p, q in zip(models[0].parameters(), models[1].parameters()):
            assert same_bits(p, q), (i, (p - q).abs().max())


def generated_mse(step, op="aten::mse_loss_backward"):
    return sum(o == op for p in step.plans() for o in p["exec_generated_ops"])


@pytest.mark.parametrize("n_threads", [1, 2])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("batch,outputs", [(6, 4), (7, 1), (2300, 37)])   # 2300 x 37: split loops
def test_mse_loss_backward_generated_keeps_eager_bits(threads, n_threads, dtype, reduction, batch, outputs):
    torch.set_num_threads(n_threads)
    (m0, o0), (m1, o1) = twins(8, outputs, dtype)
    step = crucible.compile(step_of(m0, o0, reduction), backend="cpu")
    g = torch.Generator().manual_seed(1)
    batches = [(torch.randn(batch, 8, generator=g, dtype=dtype) * 3,
                torch.randn(batch, outputs, generator=g, dtype=dtype)) for _ in range(5)]
    run(step, step_of(m1, o1, reduction), (m0, m1), batches)
    assert generated_mse(step) == 1, step.plans()[0]["exec_summary"]
    # the forward: a sum of squares, up to 32768 elements (more: ATen's threads split it); with
    # reduction none the pointwise (self - target)^2, any size
    forward = reduction == "none" or batch * outputs <= 32768
    assert generated_mse(step, "aten::mse_loss") == (1 if forward else 0), step.plans()[0]["exec_summary"]


def test_the_norm_follows_the_batch_of_each_size():
    # batches 6 and 9 are a family's two recorded sizes, each plan lowered at its own sizes (norm
    # 2/24 and 2/36); 13 and 20 are bound from them (Note [Bound sizes]): with mse_loss in the
    # step their exec stage is not made (the loss's storage is larger than its tensor, which
    # the binding's slot rule does not follow), so they run ATen's ops, eager's bits either way
    (m0, o0), (m1, o1) = twins(8, 4, torch.float32)
    step = crucible.compile(step_of(m0, o0, "mean"), backend="cpu")
    g = torch.Generator().manual_seed(2)
    batches = [(torch.randn(n, 8, generator=g), torch.randn(n, 4, generator=g))
               for n in (6, 6, 9, 9, 6, 9, 13, 13, 13, 20, 20, 6)]
    run(step, step_of(m1, o1, "mean"), (m0, m1), batches)
    st = step.stats()
    assert st["sizes_bound"] >= 1, st
    recorded = [p for p in step.plans() if not p["bound"]]
    assert len(recorded) == 2
    assert all("aten::mse_loss_backward" in p["exec_generated_ops"] for p in recorded), \
        [p["exec_note"] for p in recorded]


def test_tensors_of_two_dtypes_run_as_atens_call():
    # ATen's mse_loss_backward takes a float64 target or grad beside float32 tensors (its result
    # float32); the generated program is of one dtype, so the backend leaves such a call to ATen
    torch.manual_seed(3)
    w = torch.randn(3, 2)
    x, y = torch.randn(5, 3), torch.randn(5, 2, dtype=torch.float64)

    def step(x, y, g):
        return torch.ops.aten.mse_loss_backward(g, x @ w, y, 1)
    compiled = crucible.compile(step, backend="cpu")
    for i in range(4):
        g = torch.full((), 1.0 + i, dtype=torch.float64)
        a, b = compiled(x, y, g), step(x, y, g)
        assert same_bits(a, b), (i, (a - b).abs().max())
    assert compiled.stats()["plan_runs"] >= 1
    assert generated_mse(compiled) == 0
