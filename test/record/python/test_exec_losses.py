"""Training steps with the common losses through the exec stage keep eager's bits. The out=
overloads of mse_loss, huber_loss, smooth_l1_loss and soft_margin_loss with a reduction resize
their result's storage, which the plan's memory cannot do, and binary_cross_entropy's returns the
first element's loss where it can (Note [Wrong out= kernels], AtenProvider.cpp): the provider
runs their functional operators, so a step with such a loss runs instead of raising, and the
warnings of the attempt that raised are not given."""
import pytest
import torch
import torch.nn.functional as F

import crucible_native as crucible
from crucible_native._native import build_info

pytestmark = pytest.mark.skipif(build_info.get("exec") is False,
                                reason="built with -DCRUCIBLE_LLVM=OFF: no exec stage")

LOSSES = {
    "mse": F.mse_loss,
    "mse_sum": lambda a, b: F.mse_loss(a, b, reduction="sum"),
    "huber": F.huber_loss,
    "smooth_l1": F.smooth_l1_loss,
    "soft_margin": lambda a, b: F.soft_margin_loss(a, torch.sign(b)),
    "bce": lambda a, b: F.binary_cross_entropy(torch.sigmoid(a), torch.sigmoid(b)),
    "l1": F.l1_loss,
    # a reduction='none' call whose out= runs beside a mean whose out= raises: the fallback is
    # per call
    "mse_none_and_mean": lambda a, b: F.mse_loss(a, b, reduction="none").mean() + F.mse_loss(a * 2, b),
}


@pytest.mark.parametrize("backend", ["null", "cpu"])
@pytest.mark.parametrize("loss", sorted(LOSSES))
def test_a_training_step_with_a_common_loss_keeps_eager_bits(loss, backend, capfd):
    torch.manual_seed(0)
    models = [torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
              for _ in range(2)]
    models[1].load_state_dict(models[0].state_dict())
    opts = [torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9) for m in models]

    def step_of(m, opt):
        def step(x, y):
            opt.zero_grad()
            out = LOSSES[loss](m(x), y)
            out.backward()
            opt.step()
            return out.detach()
        return step
    step, eager = crucible.compile(step_of(models[0], opts[0]), backend=backend), step_of(models[1], opts[1])
    g = torch.Generator().manual_seed(1)
    for i in range(6):
        x, y = torch.randn(6, 8, generator=g), torch.randn(6, 4, generator=g)
        a, b = step(x, y), eager(x, y)
        assert torch.equal(a, b), (i, a, b)
    for a, b in zip(models[0].parameters(), models[1].parameters()):
        assert torch.equal(a, b)
    # the warnings of an out= attempt that fell back are not given ("An output with one or more
    # elements was resized"): eager gives none
    assert "was resized" not in capfd.readouterr().err
    p = step.plans()[0]
    assert p["exec"] == backend, p["exec_note"]
    if backend == "cpu" and loss in ("mse", "mse_sum", "mse_none_and_mean"):
        # Note [Sum prologues]: its mean or sum is generated, ATen's out= not called
        assert "aten::mse_loss" in p["exec_generated_ops"], p["exec_summary"]
        assert "out= raised" not in p["exec_summary"], p["exec_summary"]
    elif loss in ("mse", "mse_sum", "huber", "smooth_l1", "mse_none_and_mean"):  # its out= raised once
        assert "out= raised 1" in p["exec_summary"], p["exec_summary"]
