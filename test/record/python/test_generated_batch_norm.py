"""Note [Generated batch norm] (PointwiseProgram.h): native_batch_norm in training and its backward
over a dense (N, C, *) float tensor with more than one element per plane run as generated code
on the cpu backend, in the order of ATen's contiguous kernels (misc/ATEN_ORDER.md section 7), so
Y, the saved statistics, the running statistics and every gradient have eager's bits. Planes
straddle the order's branches: shorter than a 32-byte vector, whole vectors, tails, odd and
even (float64's last element of an odd plane is fused), large enough to run in parts of whole
channels. Inputs ATen normalizes in other kernels (one element per plane, a permuted input,
evaluation mode) run as library calls, with eager's bits too."""
import platform

import pytest
import torch

import crucible_native as crucible
from crucible_native._native import build_info

pytestmark = [pytest.mark.skipif(build_info.get("exec") is False,
                                 reason="built with -DCRUCIBLE_LLVM=OFF: no exec stage"),
              pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"),
                                 reason="the CPU backend generates batch norm on x86-64 only (ATen's order)")]

# (N, C, plane...): planes of 2, 3, 7, 8, 17, 49 and 1000 elements, one image, and one of
# 4 * 8 * 4096 = 131072 elements (split over channels on two threads or more)
SHAPES = [(4, 3, 2), (2, 5, 3), (3, 2, 7), (2, 3, 2, 4), (5, 4, 17), (1, 3, 7, 7), (2, 2, 1000),
          (4, 8, 64, 64)]


def twins(shapes, dtype, affine=True, momentum=0.1, track=True, seed=0):
    g = torch.Generator().manual_seed(seed)
    made = []
    for _ in range(2):
        mods = []
        for s in shapes:
            cls = torch.nn.BatchNorm1d if len(s) <= 3 else torch.nn.BatchNorm2d
            mods.append(cls(s[1], affine=affine, momentum=momentum, track_running_stats=track, dtype=dtype))
        made.append(torch.nn.ModuleList(mods))
    with torch.no_grad():
        for a, b in zip(made[0].parameters(), made[1].parameters()):
            a.copy_(torch.randn(a.shape, dtype=dtype, generator=g))
            b.copy_(a)
    return made


def inputs(shapes, dtype, seed=1):
    g = torch.Generator().manual_seed(seed)
    # values of one channel spread over magnitudes, so that the order of the sums shows in the bits
    xs = [(torch.randn(s, dtype=torch.float64, generator=g) * 3 + 1).to(dtype) for s in shapes]
    gos = [torch.randn(s, dtype=torch.float64, generator=g).to(dtype) for s in shapes]
    return xs, gos


def train_step(mods, gos, transpose=False):
    def step(*xs):
        for m in mods.parameters():
            m.grad = None
        leaves = [x.detach().requires_grad_() for x in xs]
        ys = [m(x.transpose(1, 2) if transpose else x) for m, x in zip(mods, leaves)]
        torch.autograd.backward(ys, gos)
        return tuple(y.detach() for y in ys) + tuple(x.grad for x in leaves)
    return step


def assert_twins_equal(mods, ref):
    for (k, a), b in zip(mods.state_dict().items(), ref.state_dict().values()):
        assert torch.equal(a, b), (k, (a.double() - b.double()).abs().max())
    for (k, a), b in zip(mods.named_parameters(), ref.parameters()):
        assert torch.equal(a.grad, b.grad), (k, (a.grad - b.grad).abs().max())


def run_both(mods, ref, xs, gos, calls=4, backend="cpu", transpose=False):
    step = crucible.compile(train_step(mods, gos, transpose), backend=backend)
    eager = train_step(ref, gos, transpose)
    for i in range(calls):
        got, want = step(*xs), eager(*xs)
        for k, (a, b) in enumerate(zip(got, want)):
            assert torch.equal(a, b), (i, k, (a - b).abs().max())
        assert_twins_equal(mods, ref)
    return step


def batch_norm_calls(p):
    return sum(1 for c in p["op_names"] if c.startswith("aten::native_batch_norm"))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("affine", [True, False])
def test_generated_batch_norm_gives_eager_bits(dtype, affine):
    mods, ref = twins(SHAPES, dtype, affine)
    xs, gos = inputs(SHAPES, dtype)
    step = run_both(mods, ref, xs, gos)
    p = step.plans()[0]
    assert batch_norm_calls(p) == 2 * len(SHAPES), p["op_names"]
    # each forward and backward generated; the rest are num_batches_tracked's add_
    assert p["exec_generated_calls"] == 2 * len(SHAPES), p["exec_summary"]


@pytest.mark.parametrize("momentum,track", [(None, True), (0.1, False)])
def test_a_cumulative_average_and_no_running_statistics_keep_eager_bits(momentum, track):
    # momentum=None: each call's factor is 1/num_batches_tracked, read on the host (a sync-point
    # plan, which runs its ATen ops); no running statistics: generated
    shapes = [(3, 4, 5, 5), (2, 6, 9)]
    mods, ref = twins(shapes, torch.float32, momentum=momentum, track=track)
    xs, gos = inputs(shapes, torch.float32)
    step = run_both(mods, ref, xs, gos, calls=6)
    if track:
        assert step.plans()[0]["sync"], step.plans()[0]["exec_note"]
    else:
        assert step.plans()[0]["exec_generated_calls"] == 2 * len(shapes), step.plans()[0]["exec_summary"]


def test_each_momentum_and_eps_reach_the_one_compiled_kernel():
    # a Python number given to the step is part of its signature: each pair has its plan, and
    # every plan launches the same compiled kernel, which reads eps and momentum at each launch
    x = inputs([(4, 3, 6, 6)], torch.float64)[0][0]
    stats = [[torch.zeros(3, dtype=torch.float64), torch.ones(3, dtype=torch.float64)] for _ in range(2)]

    def f(rm, rv):
        def step(x, momentum, eps):
            return torch.nn.functional.batch_norm(x, rm, rv, training=True, momentum=momentum, eps=eps)
        return step
    step, eager = crucible.compile(f(*stats[0]), backend="cpu"), f(*stats[1])
    pairs = [(0.1, 1e-5), (0.7, 0.5), (0.9, 2.0)]
    for i, (m, e) in enumerate(pairs):
        for k in range(4):
            assert torch.equal(step(x * (k + 1), m, e), eager(x * (k + 1), m, e)), (m, e, k)
            assert torch.equal(stats[0][0], stats[1][0]) and torch.equal(stats[0][1], stats[1][1]), (m, e, k)
    plans = step.plans()
    assert len(plans) == len(pairs) and all(p["exec_generated_calls"] == 1 for p in plans), plans
    assert all("compiled 0, from disk 0, from memory 1" in p["exec_summary"] for p in plans[1:]), plans


@pytest.mark.parametrize("backend", ["null", "cpu"])
def test_a_permuted_input_runs_as_a_library_call_with_eager_bits(backend):
    # BatchNorm1d over x.transpose(1, 2): neither contiguous nor channels-last. ATen's
    # native_batch_norm.out gives other statistics there (Note [Wrong out= kernels]), so the
    # provider calls the functional operator.
    shapes = [(2, 4, 3), (3, 17, 5)]
    mods, ref = twins([(s[0], s[2], s[1]) for s in shapes], torch.float32)
    xs, gos = inputs(shapes, torch.float32)
    gos = [g.transpose(1, 2).contiguous() for g in gos]
    step = run_both(mods, ref, xs, gos, backend=backend, transpose=True)
    p = step.plans()[0]
    if backend == "cpu":  # generated: only the copy_ of each input gradient into x's layout
        assert p["exec_generated_calls"] == 2, (p["op_names"], p["exec_summary"])


@pytest.mark.parametrize("backend", ["null", "cpu"])
def test_a_channels_last_input_runs_as_a_library_call_with_eager_bits(backend):
    # ATen's channels-last kernels (another order); its out= overload is right there
    shapes = [(2, 5, 4, 6), (3, 8, 7, 7)]
    mods, ref = twins(shapes, torch.float32)
    xs, gos = inputs(shapes, torch.float32)
    xs = [x.contiguous(memory_format=torch.channels_last) for x in xs]
    gos = [g.contiguous(memory_format=torch.channels_last) for g in gos]
    step = run_both(mods, ref, xs, gos, backend=backend)
    assert step.plans()[0]["exec_generated_calls"] == 0, step.plans()[0]["exec_summary"]


@pytest.mark.parametrize("backend", ["null", "cpu"])
def test_one_channel_in_channels_last_memory_keeps_eager_bits(backend):
    # (N, 1, H, W)@(HW, 1, W, 1) is dense but suggests channels-last, where ATen's backward
    # picks its kernel by the suggested format: the forward is generated, the backward refused
    shapes = [(4, 1, 9, 9), (2, 1, 5, 7)]
    mods, ref = twins(shapes, torch.float32)
    xs, gos = inputs(shapes, torch.float32)
    xs = [torch.empty_strided(x.shape, (x.shape[2] * x.shape[3], 1, x.shape[3], 1)).copy_(x) for x in xs]
    assert xs[0].stride() == (81, 1, 9, 1)
    step = run_both(mods, ref, xs, gos, backend=backend)
    p = step.plans()[0]
    if backend == "cpu":  # the forwards, and nothing else
        assert p["exec_generated_calls"] == len(shapes), (p["op_names"], p["exec_summary"])


def test_inputs_other_kernels_normalize_run_as_library_calls_with_eager_bits():
    # (N, C) and (N, C, 1, 1): ATen gathers their statistics in per-thread buffers
    shapes = [(16, 5), (8, 3, 1, 1)]
    mods, ref = twins(shapes, torch.float64)
    xs, gos = inputs(shapes, torch.float64)
    step = run_both(mods, ref, xs, gos)
    assert step.plans()[0]["exec_generated_calls"] == 0, step.plans()[0]["exec_summary"]


def test_evaluation_mode_runs_as_a_library_call_with_eager_bits():
    shapes = [(2, 3, 8, 8)]
    mods, ref = twins(shapes, torch.float32)
    for m in (mods, ref):
        m.eval()
        with torch.no_grad():
            for b in m[0].running_var, m[0].running_mean:
                b.uniform_(0.5, 2.0, generator=torch.Generator().manual_seed(3))
    xs, _ = inputs(shapes, torch.float32)

    def f(m):
        def step(x):
            with torch.no_grad():
                return m[0](x)
        return step
    step = crucible.compile(f(mods), backend="cpu")
    for _ in range(4):
        assert torch.equal(step(xs[0]), f(ref)(xs[0]))
    assert step.plans()[0]["exec_generated_calls"] == 0, step.plans()[0]["exec_summary"]


@pytest.mark.parametrize("backend", ["null", "cpu"])
@pytest.mark.parametrize("permuted", [False, True])
def test_native_batch_norm_legit_through_the_provider_keeps_eager_bits(backend, permuted):
    # _native_batch_norm_legit writes its running statistics and returns new tensors: the
    # provider calls it as recorded and copies its results into place; its no_stats overload is
    # functional, and on a permuted input its out= overload is not called (Note [Wrong out=
    # kernels])
    stats = [[torch.zeros(5), torch.ones(5)] for _ in range(2)]

    def f(rm, rv):
        def step(x):
            y, mean, rstd = torch.ops.aten._native_batch_norm_legit(x, None, None, rm, rv, True, 0.5, 1e-5)
            z, zmean, zrstd = torch.ops.aten._native_batch_norm_legit.no_stats(x + 1, None, None, True, 0.5, 1e-5)
            return y * 2, mean, rstd, z * 2, zmean, zrstd
        return step
    step, eager = crucible.compile(f(*stats[0]), backend=backend, guard=()), f(*stats[1])
    g = torch.Generator().manual_seed(4)
    x = torch.randn(4, 6, 5, generator=g).transpose(1, 2) if permuted else torch.randn(4, 5, 6, generator=g)
    for i in range(4):
        for a, b in zip(step(x * (i + 1)), eager(x * (i + 1))):
            assert torch.equal(a, b), i
        assert torch.equal(stats[0][0], stats[1][0]) and torch.equal(stats[0][1], stats[1][1]), i
    assert step.stats()["plan_runs"] > 0 and step.plans()[0]["exec"] == backend
