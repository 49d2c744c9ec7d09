"""A step trained with nn.L1Loss runs as generated code on the cpu backend with eager's bits:
l1_loss is sub, abs and a full mean or sum in the forward (Tensor.mean(): ATen's sum over the
element count, Note [Generated sums]) and sgn (Note [Pointwise programs]: +1, -1 or +0) times
the gradient in the backward. A full mean of more than 32768 float32 elements, which ATen
reduces over its threads, stays ATen's call, with its bits all the same."""
import pytest
import torch
import torch.nn.functional as F

import crucible_native as crucible
from crucible_native._native import build_info
from test_generated_mse_loss import same_bits, twins

pytestmark = pytest.mark.skipif(build_info.get("exec") is False,
                                reason="built with -DCRUCIBLE_LLVM=OFF: no exec stage")


def step_of(model, opt, reduction):
    def step(x, y):
        opt.zero_grad()
        out = model(x)
        loss = F.l1_loss(out, y, reduction=reduction)
        # a second full mean, of a product, and a grad_output other than 1
        ((loss + (out * 0.5).mean()) * 0.37).backward()
        opt.step()
        return loss.detach()
    return step


def generated(step, op):
    return sum(o == op for p in step.plans() for o in p["exec_generated_ops"])


@pytest.mark.parametrize("n_threads", [1, 2])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("batch,outputs", [(6, 4), (7, 1), (2300, 37)])  # 85100: ATen's threads
def test_l1_loss_generated_keeps_eager_bits(threads, n_threads, dtype, reduction, batch, outputs):
    torch.set_num_threads(n_threads)
    (m0, o0), (m1, o1) = twins(8, outputs, dtype)
    step, eager = crucible.compile(step_of(m0, o0, reduction), backend="cpu"), step_of(m1, o1, reduction)
    g = torch.Generator().manual_seed(3)
    # some outputs equal to their targets: sgn's 0 (the model's first output, made exact below)
    for i in range(5):
        x = torch.randn(batch, 8, generator=g, dtype=dtype) * 3
        y = torch.randn(batch, outputs, generator=g, dtype=dtype)
        if i == 4:
            with torch.no_grad():
                y = m1(x).detach().clone()
                y[1::2] += 1.0
        a, b = step(x, y), eager(x, y)
        assert same_bits(a, b), (i, (a - b).abs().max())
        for p, q in zip(m0.parameters(), m1.parameters()):
            assert same_bits(p, q), (i, (p - q).abs().max())
    assert generated(step, "aten::sgn") == 1, step.plans()[0]["exec_summary"]
    small = batch * outputs <= 32768
    means = generated(step, "aten::mean")
    assert means == ((2 if reduction == "mean" else 1) if small else 0), step.plans()[0]["exec_summary"]
