"""Note [Generated amax and amin] (PointwiseProgram.h): amax and amin over a dense float tensor run
as generated code on the cpu backend with eager's bits, which for a max are the zero a +0/-0 tie
returns and the NaN that comes out (misc/ATEN_ORDER.md section 10). Compared byte for byte with
eager on data built to tie: only zeros of mixed signs, one zero of the odd sign at a vector lane
or accumulator boundary, zeros under the extremes, NaNs of several bit patterns (a scalar path
gives the default qNaN, a vector one all ones); rows of 2 to 5000 elements, columns of 3 to 129,
a full reduction up to 32768 elements, keepdim, several leading or trailing dims. The forms
ATen computes in another order (one result of more than 32768 elements, split over its
threads; reduced dims neither all innermost nor all outermost) and inputs the backend does not
take run as ATen's calls, with eager's bits too."""
import platform
import zlib

import pytest
import torch

import crucible_native as crucible
from crucible_native._native import build_info

pytestmark = [pytest.mark.skipif(build_info.get("exec") is False,
                                 reason="built with -DCRUCIBLE_LLVM=OFF: no exec stage"),
              pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"),
                                 reason="the CPU backend generates reductions on x86-64 only")]

NANS = {torch.float32: [0x7FC00000, -0x00400000, 0x7FC12345, 0x7F800001, -1],   # as int32
        torch.float64: [0x7FF8000000000000, -0x0008000000000000, 0x7FF8000000012345, 0x7FF0000000000001, -1]}
INT = {torch.float32: torch.int32, torch.float64: torch.int64}


def bits(t):
    return t.contiguous().view(INT[t.dtype])


def tie_data(shape, dtype, g, kind):
    """Values made to tie at the extremes (see the module's doc)."""
    n = 1
    for s in shape:
        n *= s
    if kind == "zeros":     # only +0 and -0, a random share of each
        share = float(torch.rand(1, generator=g))
        x = torch.where(torch.rand(n, generator=g) < share, 0.0, -0.0)
    elif kind == "odd_zero":  # one zero of the other sign among zeros
        x = torch.full((n,), -0.0 if int(torch.randint(2, (1,), generator=g)) else 0.0, dtype=torch.float64)
        x[int(torch.randint(n, (1,), generator=g))] *= -1
    elif kind == "under":   # zeros below positive and above negative values: ties of ±0 at 0
        x = torch.where(torch.rand(n, generator=g) < 0.5, 0.0, -0.0)
        x = torch.where(torch.rand(n, generator=g) < 0.3, -torch.rand(n, generator=g, dtype=torch.float64) - 1, x)
    else:                   # normal data
        x = torch.randn(n, generator=g, dtype=torch.float64)
    x = x.to(dtype).reshape(shape).contiguous()
    if kind == "nan" or (kind == "zeros" and int(torch.randint(3, (1,), generator=g)) == 0):
        flat = x.view(-1).view(INT[dtype])
        for _ in range(int(torch.randint(1, 4, (1,), generator=g))):
            pick = NANS[dtype][int(torch.randint(len(NANS[dtype]), (1,), generator=g))]
            flat[int(torch.randint(n, (1,), generator=g))] = pick
    return x


# (shape, dim, keepdim): rows, columns, full, several dims
GENERATED = [((5, 2), 1, False), ((4, 31), -1, False), ((4, 32), 1, True), ((3, 33), 1, False),
             ((2, 100), 1, False), ((2, 5000), -1, False), ((3, 7, 17), -1, False), ((6, 16), 1, False),
             ((2, 3), 0, False), ((17, 31), 0, False), ((5, 32), 0, True), ((9, 40), 0, False),
             ((3, 129), 0, False), ((2, 3, 40), (0, 1), False), ((4, 5, 6), (1, 2), False),
             ((1000,), 0, False), ((32768,), (), False), ((7, 9), (), True), ((6, 33), None, False)]


def reduce_all(x, dim, keepdim):
    if dim is None:
        return torch.amax(x), torch.amin(x)
    return torch.amax(x, dim, keepdim), torch.amin(x, dim=dim, keepdim=keepdim)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("shape,dim,keepdim", GENERATED)
def test_generated_amax_and_amin_give_eager_bits(dtype, shape, dim, keepdim):
    def f(x):
        return reduce_all(x, dim, keepdim)
    step = crucible.compile(f, backend="cpu", guard=())
    g = torch.Generator().manual_seed(zlib.crc32(repr((dtype, shape, dim, keepdim)).encode()))
    for call, kind in enumerate(["zeros", "odd_zero", "under", "nan", "zeros", "odd_zero", "nan", "under"]):
        x = tie_data(shape, dtype, g, kind)
        got, want = step(x), f(x)
        for k, (a, b) in enumerate(zip(got, want)):
            assert a.shape == b.shape and torch.equal(bits(a), bits(b)), (call, kind, k, x, a, b)
    assert step.stats()["plan_runs"] >= 5
    p = step.plans()[0]
    assert p["exec_generated_ops"] == ["aten::amax", "aten::amin"], p["exec_summary"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_forms_aten_computes_otherwise_run_as_library_calls_with_eager_bits(dtype):
    def f(big, x):
        # one result over 40000 elements (ATen's per-thread parts), reduced dims around a kept
        # one, a transposed input, a dim of size 1 only
        return (torch.amax(big), torch.amin(x, dim=(0, 2)), torch.amax(x.transpose(1, 2), 1),
                torch.amin(x[:, :1], 1))
    step = crucible.compile(f, backend="cpu", guard=())
    g = torch.Generator().manual_seed(7)
    for call in range(5):
        big = tie_data((40000,), dtype, g, "zeros")
        x = tie_data((3, 5, 6), dtype, g, ["under", "nan", "zeros", "odd_zero", "normal"][call])
        for a, b in zip(step(big, x), f(big, x)):
            assert a.shape == b.shape and torch.equal(bits(a), bits(b)), call
    p = step.plans()[0]
    assert step.stats()["plan_runs"] >= 2
    assert "aten::amax" not in p["exec_generated_ops"] and "aten::amin" not in p["exec_generated_ops"], p
