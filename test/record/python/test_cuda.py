"""The Vessel on CUDA: recording follows a step onto autograd's device threads, and
crucible.compile refuses a CUDA step openly. Skipped where torch sees no GPU (utils/bin/
device-check runs it on a GPU machine)."""
import warnings

import pytest
import torch
import torch.nn as nn

import crucible_native as crucible
import models
from test_replay import train_step

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")


def cuda_setup(name):
    s = models.make(name)
    s.model.cuda()
    s.x, s.y = s.x.cuda(), s.y.cuda()
    # the optimizer was made over the same Parameter objects, now holding CUDA data
    return s


@pytest.mark.parametrize("name", ["mlp", "cnn", "transformer"])
def test_cuda_steps_record_forward_backward_and_optimizer_with_their_device(name):
    s = cuda_setup(name)
    s.step()   # state created
    torch.cuda.synchronize()
    counts = models.record(s, 2)
    torch.cuda.synchronize()
    crucible.flush()
    trace = crucible.trace()
    ops = trace.ops()
    assert counts[0] > 0 and len(ops) >= sum(counts)
    phases = {o["phase"] for o in ops}
    assert {"forward", "backward", "optimizer"} <= phases, phases
    devices = {t["device"] for o in ops for t in o["outputs"] if t["has_storage"]}
    assert "cuda" in devices, devices
    st = crucible.stats()
    # autograd ran the CUDA backward on its device thread: that thread recorded it
    recording_threads = [t for t in st["threads"] if t["forward"] + t["backward"] + t["optimizer"] > 0]
    assert sum(t["backward"] for t in recording_threads) == st["ops"]["backward"] > 0
    assert st["dropped"] == 0


def test_compile_refuses_a_cuda_step_and_gives_eager_results():
    res = []
    for compiled in (False, True):
        torch.manual_seed(0)
        m = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)).cuda()
        opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)

        f = train_step(m, opt)
        step = crucible.compile(f) if compiled else f
        g = torch.Generator().manual_seed(1)
        losses = []
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", crucible.CrucibleWarning)
            for _ in range(6):
                x, y = torch.randn(8, 16, generator=g).cuda(), torch.randint(0, 4, (8,), generator=g).cuda()
                losses.append(step(x, y).detach().cpu())
        res.append(losses)
        if compiled:
            assert step.stats()["plan_runs"] == 0 and step.stats()["refusals"] == 1
            assert "replays CPU steps only" in step.last_refusal
    for a, b in zip(*res):
        assert torch.equal(a, b)


def test_each_cuda_op_records_the_stream_it_ran_on():
    x = torch.randn(64, 64, device="cuda")
    side = torch.cuda.Stream()
    torch.cuda.synchronize()
    with crucible.recording():
        (x @ x).relu_()
        with torch.cuda.stream(side):
            (x + 1).sum()
        torch.cuda.synchronize()
    crucible.flush()
    ops = crucible.trace().ops()
    default_id = torch.cuda.default_stream().stream_id
    by_name = {}
    for o in ops:
        by_name.setdefault(o["name"], set()).add(o["stream"])
    assert by_name["aten::mm"] == {default_id}, by_name
    assert by_name["aten::sum"] == {side.stream_id}, by_name
    assert side.stream_id != default_id


def test_compile_refuses_a_cpu_step_that_trains_a_cuda_weight_it_holds():
    # The step's arguments are CPU tensors and it names no module: the CUDA work (and autograd's
    # CUDA backward on its device thread) is seen only in the capture, which refuses it.
    res = []
    for compiled in (False, True):
        torch.manual_seed(0)
        w = torch.randn(16, 4, device="cuda", requires_grad=True)

        def f(x):
            loss = (x.cuda() @ w).square().mean()
            loss.backward()
            with torch.no_grad():
                w.sub_(w.grad, alpha=0.1)
                w.grad = None
            return loss

        step = crucible.compile(f) if compiled else f
        g = torch.Generator().manual_seed(1)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", crucible.CrucibleWarning)
            losses = [step(torch.randn(8, 16, generator=g)).detach().cpu() for _ in range(6)]
        res.append((losses, w.detach().cpu()))
        if compiled:
            st = step.stats()
            assert st["plan_runs"] == 0 and st["refusals"] == 1, step.last_refusal
            assert "replays CPU" in step.last_refusal and "cuda" in step.last_refusal
    for a, b in zip(res[0][0], res[1][0]):
        assert torch.equal(a, b)
    assert torch.equal(res[0][1], res[1][1])
