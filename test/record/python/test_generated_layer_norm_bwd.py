"""Note [Generated layer norm backward] (PointwiseProgram.h): native_layer_norm_backward over dense
float tensors runs as generated code on the cpu backend, in the order of ATen's kernel
(misc/ATEN_ORDER.md section 11), so grad_input, grad_weight and grad_bias have eager's bits, zeros'
signs included. grad_weight and grad_bias are sums over rows that ATen gathers per thread: the
generated kernel splits the rows as ATen does for the thread count at each call, so the bits
follow torch.set_num_threads between calls as eager's do. Rows straddle the order's branches:
shorter than a 32-byte vector, whole vectors, tails, one row, rows split in parts of 65536
elements or more."""
import platform
import re

import pytest
import torch

import crucible_native as crucible
from crucible_native._native import build_info

pytestmark = [pytest.mark.skipif(build_info.get("exec") is False,
                                 reason="built with -DCRUCIBLE_LLVM=OFF: no exec stage"),
              pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"),
                                 reason="the CPU backend generates layer norm on x86-64 only (ATen's order)")]

# (input shape, normalized dims): rows of 1, 3, 7, 8, 17, 64, 100 and 1000 elements, one row,
# two normalized dims, and 96 * 768 = 73728 elements (parts on two threads)
SHAPES = [((5, 1), 1), ((4, 3), 1), ((1, 7), 1), ((3, 2, 8), 1), ((6, 17), 1), ((2, 5, 64), 1),
          ((9, 100), 1), ((3, 1000), 1), ((2, 3, 4, 5), 2), ((96, 768), 1)]


def same_bits(a, b):
    ints = {torch.float32: torch.int32, torch.float64: torch.int64}[a.dtype]
    return a.shape == b.shape and torch.equal(a.view(ints), b.view(ints))


def twins(shapes, dtype, affine, bias=True, seed=0):
    g = torch.Generator().manual_seed(seed)
    made = []
    for _ in range(2):
        made.append(torch.nn.ModuleList(
            torch.nn.LayerNorm(s[-nd:], elementwise_affine=affine, bias=bias, dtype=dtype)
            for s, nd in shapes))
    with torch.no_grad():
        for a, b in zip(made[0].parameters(), made[1].parameters()):
            a.copy_(torch.randn(a.shape, dtype=torch.float64, generator=g).to(dtype) * 0.5 + 1)
            b.copy_(a)
    return made


def inputs(shapes, dtype, seed=1):
    g = torch.Generator().manual_seed(seed)
    # rows spread over magnitudes and a mean away from 0, so that the orders show in the bits;
    # every third grad_out column zero, so that signed zeros occur
    xs = [(torch.randn(s, dtype=torch.float64, generator=g) * 3 + 2).to(dtype) for s, _ in shapes]
    gos = []
    for s, _ in shapes:
        go = torch.randn(s, dtype=torch.float64, generator=g).to(dtype)
        go[..., ::3] = 0.0
        gos.append(go)
    return xs, gos


def train_step(mods, gos):
    def step(*xs):
        for m in mods.parameters():
            m.grad = None
        leaves = [x.detach().requires_grad_() for x in xs]
        ys = [m(x) for m, x in zip(mods, leaves)]
        torch.autograd.backward(ys, gos)
        return tuple(y.detach() for y in ys) + tuple(x.grad for x in leaves)
    return step


def check(step, eager, mods, ref, xs, calls):
    for i in range(calls):
        got, want = step(*xs), eager(*xs)
        for k, (a, b) in enumerate(zip(got, want)):
            assert same_bits(a, b), (i, k, (a - b).abs().max())
        for (k, a), b in zip(mods.named_parameters(), ref.parameters()):
            assert same_bits(a.grad, b.grad), (i, k, (a.grad - b.grad).abs().max())


def backward_calls(p):
    return sum(1 for c in p["op_names"] if c.startswith("aten::native_layer_norm_backward"))


@pytest.mark.parametrize("n_threads", [1, 2, 3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("affine,bias", [(True, True), (True, False), (False, False)])
def test_generated_layer_norm_backward_gives_eager_bits(threads, n_threads, dtype, affine, bias):
    torch.set_num_threads(n_threads)
    mods, ref = twins(SHAPES, dtype, affine, bias)
    xs, gos = inputs(SHAPES, dtype)
    step = crucible.compile(train_step(mods, gos), backend="cpu")
    check(step, train_step(ref, gos), mods, ref, xs, calls=4)
    p = step.plans()[0]
    assert backward_calls(p) == len(SHAPES), p["op_names"]
    # each backward generated, and each forward but those with a weight and no bias (Note
    # [Generated layer norm] takes both or neither)
    forwards = 0 if affine and not bias else len(SHAPES)
    assert p["exec_generated_calls"] == len(SHAPES) + forwards, p["exec_summary"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_grad_weight_follows_the_thread_count_of_each_call(threads, dtype):
    # one plan, built at two threads, then run at one, three and two: ATen splits the rows for
    # the count at the call, and the generated kernel does the same
    torch.set_num_threads(2)
    shapes = [((7, 33), 1), ((96, 768), 1)]
    mods, ref = twins(shapes, dtype, True)
    xs, gos = inputs(shapes, dtype, seed=5)
    step = crucible.compile(train_step(mods, gos), backend="cpu")
    eager = train_step(ref, gos)
    check(step, eager, mods, ref, xs, calls=3)
    for n in (1, 3, 2):
        torch.set_num_threads(n)
        check(step, eager, mods, ref, xs, calls=1)
    assert len(step.plans()) == 1
    assert step.plans()[0]["exec_generated_calls"] == 2 * len(shapes), step.plans()[0]["exec_summary"]
    # the part buffers beside the arena, reported: grad_weight's and grad_bias's, each one row per
    # part, for the most parts a call needed (3 threads: 7 rows in parts of 3, 96 in parts of 32)
    m = re.search(r"scratch (\d+) bytes", step.plans()[0]["exec_summary"])
    assert m, step.plans()[0]["exec_summary"]
    assert int(m.group(1)) == 2 * 3 * (33 + 768) * xs[0].element_size()


def test_a_grad_out_not_dense_runs_as_a_library_call_with_eager_bits(threads):
    # a transposed grad_out reaches the backward as it is: ATen makes it contiguous, the backend
    # refuses it and runs ATen's call
    mods, ref = twins([((6, 10), 1)], torch.float32, True)
    x = torch.randn(6, 10)
    go = torch.randn(10, 6).t()
    step = crucible.compile(train_step(mods, [go]), backend="cpu")
    check(step, train_step(ref, [go]), mods, ref, [x], calls=3)
    p = step.plans()[0]
    assert p["exec_generated_calls"] == 1, p["exec_summary"]  # the forward
