"""Note [Generated sums] (PointwiseProgram.h): sum and mean over a dense float tensor whose reduced
dims are all innermost or all outermost run as generated code on the cpu backend, in ATen's
cascade order (misc/ATEN_ORDER.md section 2), so every result has eager's bits. Shapes straddle
the order's branches: rows shorter and longer than a 32-byte vector, columns below and above
four vectors' worth, 16-row cascade steps with leftovers, 3-d tensors whose reduced dims
coalesce."""
import platform

import pytest
import torch

import crucible_native as crucible
from crucible_native._native import build_info
import models
from test_compile_backend import assert_same_call, assert_same_state, step_of

pytestmark = [pytest.mark.skipif(build_info.get("exec") is False,
                                 reason="built with -DCRUCIBLE_LLVM=OFF: no exec stage"),
              pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"),
                                 reason="the CPU backend generates sums on x86-64 only (ATen's order)")]


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
    # full sum of more than 32768 elements (ATen splits it over its threads), nor a float32
    # column sum whose last 4 to 7 columns ATen's split can leave to its scalar path
    split_tail = dtype == torch.float32 and rows * cols >= 32768 and cols > 32 and 4 <= cols % 32 < 8
    expect = 2 * (rows > 1 and not split_tail) + 2 * (cols > 1) + (rows * cols <= 32768)
    assert p["exec_calls"] == 5 and p["exec_generated_calls"] == expect, p["exec_summary"]


@pytest.mark.parametrize("threads", [1, 8, 16])
def test_column_sums_keep_eager_bits_at_any_thread_count(threads):
    # ATen splits a column sum of 32768 elements or more over its threads; a float32 tail of 4
    # to 7 columns left to the last thread takes its scalar path, another order (eager's own
    # bits differ between 1 and 8 threads for [1000, 36]). Such sums stay ATen calls; the others
    # are generated and match eager at every thread count.
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        g = torch.Generator().manual_seed(threads)
        for (rows, cols), generated in [((1000, 36), 0), ((1000, 100), 0), ((2000, 37), 0), ((1000, 64), 2),
                                        ((1000, 40), 2), ((100, 36), 2)]:
            x = values((rows, cols), torch.float32, g)

            def f(x):
                return x.sum(0), x.mean(0)
            step, got = run(f, x)
            for a, b in zip(got, f(x)):
                assert torch.equal(a, b), ((rows, cols), threads)
            assert step.plans()[0]["exec_generated_calls"] == generated, ((rows, cols), step.plans()[0]["exec_summary"])
    finally:
        torch.set_num_threads(before)


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


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("affine", [True, False])
def test_generated_layer_norm_gives_eager_bits(dtype, affine):
    # Note [Generated layer norm]: ATen's RowwiseMoments order. Widths straddle its branches:
    # rows shorter than a vector (a scalar Welford only), tails, one 16-vector chunk, several
    # (the binary-counter stack carries), and rows of small variance.
    g = torch.Generator().manual_seed(11)
    widths = [1, 3, 8, 15, 17, 33, 100, 129, 257, 1000, 2049, 4097]
    xs = [(torch.randn(5, n, dtype=torch.float64, generator=g) * 2 + 3).to(dtype) for n in widths]
    xs.append((1000 + 1e-3 * torch.randn(7, 40, dtype=torch.float64, generator=g)).to(dtype))
    lns = []
    for x in xs:
        ln = torch.nn.LayerNorm(x.shape[-1], elementwise_affine=affine, eps=1e-5, dtype=dtype)
        if affine:
            with torch.no_grad():
                ln.weight.copy_(torch.randn(x.shape[-1], dtype=dtype, generator=g))
                ln.bias.copy_(torch.randn(x.shape[-1], dtype=dtype, generator=g))
        lns.append(ln)

    def f(*xs):
        with torch.no_grad():
            return tuple(ln(x) for ln, x in zip(lns, xs))
    step = crucible.compile(f, backend="cpu", guard=tuple(lns))
    for _ in range(4):
        got = step(*xs)
    want = f(*xs)
    for n, a, b in zip(widths + ["small variance"], got, want):
        assert torch.equal(a, b), (n, (a - b).abs().max())
    p = step.plans()[0]
    names = [n for n in p["op_names"] if "native_layer_norm" in n]
    assert len(names) == len(xs), p["op_names"]
    assert p["exec_generated_calls"] == len(xs), p["exec_summary"]


def test_a_transformer_step_with_generated_layer_norms_and_sums_keeps_eager_bits():
    s, ref = models.make("transformer"), models.make("transformer")
    step, eager = crucible.compile(step_of(s), backend="cpu"), step_of(ref)
    for i in range(5):
        assert_same_call(step, eager, s.x, s.y, i, f"call {i}")
    assert_same_state(s, ref)
