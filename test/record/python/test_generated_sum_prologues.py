"""Note [Sum prologues] (PointwiseProgram.h): a pointwise chain whose one stored result only the
sum right after it reads runs as that sum's prologue on the cpu backend: each element computed as
the sum reads it (one rounding per operation, as ATen's kernels compute the tensor it sums) and
added in ATen's cascade order, the chain's result never written. Every result keeps eager's bits
(rows and columns across the order's branches, Python numbers of either float dtype, alphas,
NaN and infinities); the arena no longer holds the chain's result; a chain whose result is also
returned, or an alpha other than 1, keeps its own run."""
import platform

import pytest
import torch

import crucible_native as crucible
from crucible_native._native import build_info

pytestmark = [pytest.mark.skipif(build_info.get("exec") is False,
                                 reason="built with -DCRUCIBLE_LLVM=OFF: no exec stage"),
              pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"),
                                 reason="the CPU backend generates sums on x86-64 only (ATen's order)")]


def values(shape, dtype, g, special=False):
    # magnitudes over e^-8..e^8, so that the order of the additions shows in the bits
    x = torch.randn(shape, dtype=torch.float64, generator=g)
    x = (x * torch.exp(torch.empty(shape, dtype=torch.float64).uniform_(-8, 8, generator=g))).to(dtype)
    if special:
        flat = x.view(-1)
        flat[::7] = 0.0
        flat[3::11] = -0.0
        flat[5::97] = float("nan")
        flat[6::89] = float("inf")
    return x


CHAINS = [
    lambda a, b: ((a - b).abs() * 0.5).sum(dim=-1),        # sub (alpha 1), abs, a Python float: rows
    lambda a, b: (a * b).relu().mean(),                     # every element
    lambda a, b: (torch.sign(a) * (b / 3)).sum(dim=0),      # columns
    lambda a, b: ((a + b) * (a - b)).mean(dim=-1),          # two values of the chain multiplied
    lambda a, b: torch.add(a, b, alpha=-1).relu().sum(dim=-1),  # an alpha of -1: a - b exactly
    lambda a, b: torch.sign(a - b).sum(dim=-1),             # sign: +0 for a NaN
]


def same(a, b):
    return (a.shape == b.shape and a.stride() == b.stride() and torch.equal(a.isnan(), b.isnan())
            and torch.equal(a.nan_to_num(7.0), b.nan_to_num(7.0)))


def compiled(f, *args, calls=5):
    step = crucible.compile(f, backend="cpu", guard=())
    for _ in range(calls):
        got = step(*args)
    return step, got


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("rows,cols", [(3, 5), (17, 3), (33, 8), (100, 64), (2, 4097), (181, 181)])
@pytest.mark.parametrize("special", [False, True])
@pytest.mark.parametrize("chain", range(len(CHAINS)))
def test_a_chain_summed_as_it_is_computed_gives_eager_bits(chain, dtype, rows, cols, special):
    g = torch.Generator().manual_seed(rows * 1000 + cols + special)
    a, b = values((rows, cols), dtype, g, special), values((rows, cols), dtype, g, special)
    f = CHAINS[chain]
    step, got = compiled(f, a, b)
    assert same(got, f(a, b)), (got - f(a, b)).abs().max()
    p = step.plans()[0]
    summary = p["exec_summary"]
    assert p["exec"] == "cpu" and p["exec_generated_calls"] == p["exec_calls"], summary
    # a full mean of more than 32768 elements stays ATen's (its threads split it): no prologue
    merged = not (chain == 1 and rows * cols > 32768)
    assert ("1 sum with a pointwise prologue" in summary) == merged, summary
    if merged and chain in (0, 1, 4, 5):
        # one kernel: no [rows, cols] value of the chain is placed in memory (64 bytes: the
        # arena's alignment, what a 0-d mean or a row of results takes)
        arena = int(summary.split("; arena ")[1].split()[0])
        assert arena <= 64 or arena < rows * cols * a.element_size(), summary


def test_chains_side_by_side_keep_eager_bits():
    g = torch.Generator().manual_seed(9)
    a, b = values((50, 70), torch.float32, g, True), values((50, 70), torch.float32, g, True)

    def all_of(a, b):
        return tuple(f(a, b) for f in CHAINS)
    step, got = compiled(all_of, a, b)
    for x, y in zip(got, all_of(a, b)):
        assert same(x, y)
    assert "sums with a pointwise prologue" in step.plans()[0]["exec_summary"], step.plans()[0]["exec_summary"]


def test_a_chain_whose_result_is_returned_or_has_an_alpha_keeps_its_own_run():
    g = torch.Generator().manual_seed(5)
    a, b = values((40, 30), torch.float32, g), values((40, 30), torch.float32, g)

    def returned(a, b):
        d = (a - b).abs()
        return d, d.sum(dim=1)

    def alpha(a, b):
        return torch.sub(a, b, alpha=0.5).abs().sum(dim=1)
    for f in (returned, alpha):
        step, got = compiled(f, a, b)
        want = f(a, b)
        got, want = (got, want) if isinstance(got, tuple) else ((got,), (want,))
        for x, y in zip(got, want):
            assert same(x, y)
        assert "with a pointwise prologue" not in step.plans()[0]["exec_summary"], step.plans()[0]["exec_summary"]


def random_chain(rng, rank, dtype):
    """A random pointwise chain over two tensors and Python numbers, then a sum or mean over the
    innermost dims, the outermost ones or all: (f, description)."""
    unary = [torch.abs, torch.neg, torch.relu, torch.sign, lambda v: v * 0.25, lambda v: v / 3,
             lambda v: 1.5 - v, lambda v: v + 2]
    binary = [torch.add, torch.sub, torch.mul, torch.div, lambda u, v: torch.add(u, v, alpha=-1)]
    steps = [(rng.randrange(len(unary)), None) if rng.random() < 0.5 else (None, rng.randrange(len(binary)))
             for _ in range(rng.randint(1, 5))]
    kind = rng.choice(["sum", "mean"])
    where = rng.choice(["inner", "outer", "all"])
    k = rng.randint(1, rank)
    dims = list(range(rank - k, rank)) if where == "inner" else list(range(k)) if where == "outer" else None

    def f(a, b):
        v = a
        for u, bi in steps:
            v = unary[u](v) if u is not None else binary[bi](v, b if rng_flip(bi) else a)
        red = torch.sum if kind == "sum" else torch.mean
        return red(v) if dims is None else red(v, dim=dims)

    flips = {i: bool(rng.getrandbits(1)) for i in range(len(binary))}

    def rng_flip(i):
        return flips[i]
    return f, f"{steps} {kind} {where} {dims} {dtype}"


def test_random_chains_into_sums_keep_eager_bits():
    import random
    rng = random.Random(2026)
    merged = 0
    for case in range(40):
        dtype = rng.choice([torch.float32, torch.float64])
        rank = rng.randint(1, 3)
        shape = [rng.choice([2, 3, 5, 8, 17, 33, 64]) for _ in range(rank)]
        f, what = random_chain(rng, rank, dtype)
        g = torch.Generator().manual_seed(case)
        a, b = values(shape, dtype, g, special=case % 3 == 0), values(shape, dtype, g)
        if case % 5 == 4 and rank >= 2:   # a transposed input: dense in another order
            a = a.transpose(0, -1).contiguous().transpose(0, -1)
        step, got = compiled(f, a, b)
        assert same(got, f(a, b)), (case, what, shape)
        summary = step.plans()[0]["exec_summary"]
        merged += "with a pointwise prologue" in summary
    # most chains lower whole (a chain Forge splits in two still gives its last part)
    assert merged >= 20, merged
