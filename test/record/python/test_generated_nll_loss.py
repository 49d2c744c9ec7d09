"""Note [Generated nll_loss] (PointwiseProgram.h): nll_loss_forward and nll_loss_backward over an
(N, C) float input and an int64 target, no class weight, reduction mean or sum, run as generated
code on the cpu backend in the order of ATen's nll_loss_out_frame (misc/ATEN_ORDER.md section 8:
an 8-level cascade of partial losses in the dtype, ignored rows skipped with their carry, a mean
divided by the kept row count), so every result has eager's bits; a target out of range runs the
call as ATen's, which raises ATen's error."""
import platform

import pytest
import torch
import torch.nn.functional as F

import crucible_native as crucible
from crucible_native._native import build_info

pytestmark = [pytest.mark.skipif(build_info.get("exec") is False,
                                 reason="built with -DCRUCIBLE_LLVM=OFF: no exec stage"),
              pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"),
                                 reason="the CPU backend generates reductions on x86-64 only (ATen's order)")]


def bits(t):
    return t.view(torch.int64 if t.dtype == torch.float64 else torch.int32)


def nll(x, t, go, reduction, ignore):
    out, tw = torch.ops.aten.nll_loss_forward(x, t, None, reduction, ignore)
    gi = torch.ops.aten.nll_loss_backward(go, x, t, None, reduction, ignore, tw)
    return out, tw, gi


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("reduction", [1, 2])
def test_generated_nll_loss_gives_eager_bits(dtype, reduction):
    # batch sizes below and past one 16-row step, up to carries into level 3 (5000 rows);
    # magnitudes over e^-8..e^8 so that the order shows in the bits
    g = torch.Generator().manual_seed(reduction)
    args = []
    for n in (1, 2, 3, 16, 17, 33, 100, 1000, 5000):
        for c, ignore in ((1, -100), (3, -100), (10, 2)):
            x = torch.randn(n, c, dtype=torch.float64, generator=g)
            x = (x * torch.exp(torch.empty(n, c, dtype=torch.float64).uniform_(-8, 8, generator=g))).to(dtype)
            t = torch.randint(0, c, (n,), generator=g)
            t[torch.rand(n, generator=g) < 0.2] = ignore  # some rows ignored
            args.append((x, t, torch.randn((), dtype=dtype, generator=g), ignore))

    def f(*a):
        return tuple(r for i in range(0, len(a), 3) for r in nll(a[i], a[i + 1], a[i + 2], reduction, a_ignore[i // 3]))
    a_ignore = [a[3] for a in args]
    flat = [v for a in args for v in a[:3]]
    step = crucible.compile(f, backend="cpu", guard=())
    for _ in range(4):
        got = step(*flat)
    want = f(*flat)
    for i, (a, b) in enumerate(zip(got, want)):
        assert a.shape == b.shape and torch.equal(bits(a), bits(b)), (args[i // 3][0].shape, ["out", "tw", "gi"][i % 3])
    p = step.plans()[0]
    assert p["exec_calls"] == p["exec_generated_calls"] == 2 * len(args), p["exec_summary"]


def test_a_target_out_of_range_raises_atens_error():
    # the generated kernel writes nothing and the call runs as ATen's, which raises
    g = torch.Generator().manual_seed(3)
    x = torch.randn(5, 3, generator=g)

    def f(x, t):
        return F.nll_loss(x, t)
    step = crucible.compile(f, backend="cpu", guard=())
    good = torch.tensor([0, 1, 2, 1, 0])
    for _ in range(4):
        step(x, good)
    assert step.plans()[0]["exec_generated_calls"] == 1, step.plans()[0]["exec_summary"]
    bad = torch.tensor([0, 1, 7, 1, 0])
    with pytest.raises(IndexError, match="out of bounds"):
        f(x, bad)
    with pytest.raises(IndexError, match="out of bounds"):
        step(x, bad)
    with pytest.raises(IndexError, match="out of bounds"):
        step(x, torch.tensor([0, 1, -3, 1, 0]))
    other = torch.tensor([2, 2, 0, 1, -100])  # the plan runs on, ignore_index among them
    assert torch.equal(bits(step(x, other)), bits(f(x, other)))
