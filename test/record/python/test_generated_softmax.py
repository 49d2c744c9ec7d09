"""Note [Generated softmax] (PointwiseProgram.h): softmax, log_softmax and _safe_softmax over the
last dim of a dense float tensor run as generated code on the cpu backend, in the order of ATen's
last-dim kernel (misc/ATEN_ORDER.md section 4) with ATen's own vector exp and log (Note [Vector
math], CpuJit.h), so every result has eager's bits. Widths straddle the order's branches: rows
shorter than a vector (lanes in order), whole vectors, tails into the first lanes; rows with
infinities, NaNs and signed zeros check the max's NaN propagation and its choice among equals."""
import os
import platform
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F

import crucible_native as crucible
from crucible_native._native import build_info
import models
from test_compile_backend import assert_same_call, assert_same_state, step_of

pytestmark = [pytest.mark.skipif(build_info.get("exec") is False,
                                 reason="built with -DCRUCIBLE_LLVM=OFF: no exec stage"),
              pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"),
                                 reason="the CPU backend generates softmax on x86-64 only (ATen's order)"),
              pytest.mark.skipif(torch.backends.cpu.get_cpu_capability() not in ("AVX512", "AVX2"),
                                 reason="ATen's softmax uses libm's exp below AVX2: not generated")]

WIDTHS = [1, 3, 7, 8, 9, 15, 16, 17, 31, 33, 100, 1000, 4097]


def bits(t):
    return t.view(torch.int64 if t.dtype == torch.float64 else torch.int32)


def rows_of(n, dtype, g):
    x = torch.randn(6, n, dtype=torch.float64, generator=g) * 4
    x[1] *= 30  # exp underflows for most of the row
    x[2] = torch.round(x[2])  # ties for the max
    if n > 1:
        x[3, n // 2] = float("-inf")
        x[4, n - 1] = float("inf")
    return x.to(dtype)


def softmaxes(*xs):
    return tuple(f(x) for x in xs for f in (lambda x: torch.softmax(x, -1), lambda x: torch.log_softmax(x, -1),
                                             lambda x: torch._safe_softmax(x, -1)))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_generated_softmax_gives_eager_bits(dtype):
    g = torch.Generator().manual_seed(21)
    xs = [rows_of(n, dtype, g) for n in WIDTHS]
    step = crucible.compile(softmaxes, backend="cpu", guard=())
    for _ in range(4):
        got = step(*xs)
    want = softmaxes(*xs)
    for i, (a, b) in enumerate(zip(got, want)):
        assert a.shape == b.shape and torch.equal(bits(a), bits(b)), (WIDTHS[i // 3], ["softmax", "log", "safe"][i % 3])
    p = step.plans()[0]
    assert p["exec_calls"] == 3 * len(xs) and p["exec_generated_calls"] == 3 * len(xs), p["exec_summary"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_special_rows_keep_eager_bits(dtype):
    # -inf everywhere (softmax NaN, _safe_softmax +0), a NaN among numbers, +0 and -0 as the max
    # (ATen's maximum keeps the later of equals), one element, +inf twice.
    inf, nan = float("inf"), float("nan")
    for n in (1, 5, 16, 21, 40):
        x = torch.randn(8, n, dtype=dtype, generator=torch.Generator().manual_seed(n))
        x[0] = -inf
        x[1, n // 3] = nan
        x[2] = 0.0
        x[2, ::2] = -0.0
        x[3] = -0.0
        x[3, n - 1] = 0.0
        x[4, 0] = inf
        x[4, n - 1] = inf
        x[5, :] = -1e30 if dtype == torch.float32 else -1e300
        x[6, ::3] = -inf
        step = crucible.compile(softmaxes, backend="cpu", guard=())
        for _ in range(3):
            got = step(x)
        for a, b in zip(got, softmaxes(x)):
            assert torch.equal(bits(a), bits(b)), (n, a, b)
        assert step.plans()[0]["exec_generated_calls"] == 3, step.plans()[0]["exec_summary"]


@pytest.mark.parametrize("threads", [1, 4])
def test_generated_softmax_bits_do_not_depend_on_the_thread_count(threads):
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        g = torch.Generator().manual_seed(threads)
        x = rows_of(257, torch.float32, g).repeat(200, 1)
        step = crucible.compile(softmaxes, backend="cpu", guard=())
        for _ in range(3):
            got = step(x)
        for a, b in zip(got, softmaxes(x)):
            assert torch.equal(bits(a), bits(b))
        assert step.plans()[0]["exec_generated_calls"] == 3
    finally:
        torch.set_num_threads(before)


def test_softmax_the_backend_does_not_generate_runs_as_a_library_call_with_eager_bits():
    # Over a dim other than the last, over a transposed (not dense) input: ATen calls.
    g = torch.Generator().manual_seed(5)
    x = torch.randn(6, 7, 40, generator=g)

    def f(x):
        return torch.softmax(x, 1), torch.log_softmax(x.transpose(1, 2), -1), torch.softmax(x, -1)
    step = crucible.compile(f, backend="cpu", guard=())
    for _ in range(4):
        got = step(x)
    for a, b in zip(got, f(x)):
        assert torch.equal(bits(a), bits(b))
    p = step.plans()[0]
    assert p["exec_generated_calls"] == 1, p["exec_summary"]


def backwards(g, y, ly):
    return (torch.ops.aten._softmax_backward_data(g, y, -1, g.dtype),
            torch.ops.aten._log_softmax_backward_data(g, ly, -1, g.dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_generated_softmax_backward_gives_eager_bits_as_the_thread_count_changes(dtype):
    # float32 _softmax_backward_data fuses its tail step only when ATen's loop over rows runs
    # inline (one row, or one thread at the time of the call): the launch asks each time. The
    # step is compiled at 2 threads and then called at 1, 2 and 3.
    gen = torch.Generator().manual_seed(31)
    args = []
    for n in WIDTHS:
        for rows in (1, 5):
            x = torch.randn(rows, n, dtype=dtype, generator=gen) * 3
            g = torch.randn(rows, n, dtype=dtype, generator=gen)
            args += [g, torch.softmax(x, -1), torch.log_softmax(x, -1)]

    def f(*a):
        return tuple(r for i in range(0, len(a), 3) for r in backwards(*a[i:i + 3]))
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        step = crucible.compile(f, backend="cpu", guard=())
        for threads in (2, 2, 2, 1, 3, 1):
            torch.set_num_threads(threads)
            got, want = step(*args), f(*args)
            for i, (a, b) in enumerate(zip(got, want)):
                assert torch.equal(bits(a), bits(b)), (threads, WIDTHS[i // 4], (1, 5)[i // 2 % 2], i % 2)
    finally:
        torch.set_num_threads(before)
    p = step.plans()[0]
    assert p["exec_generated_calls"] == p["exec_calls"] == 4 * len(WIDTHS), p["exec_summary"]


@pytest.mark.parametrize("threads", [2, 1])
def test_rows_split_over_threads_keep_eager_bits(threads):
    # Note [Split rows]: 65536 elements or more run in parts of whole rows; each operand advances
    # by its own elements per row (the backwards' three, layer norm's per-row mean and rstd).
    # The step's plan is reused for the next parameter; its parts follow the thread count at
    # each launch (CpuBackend::split_threads).
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        g = torch.Generator().manual_seed(41)
        w, b = torch.randn(257, generator=g), torch.randn(257, generator=g)

        def f(x, gr, w, b):
            y, ly = torch.softmax(x, -1), torch.log_softmax(x, -1)
            return (*backwards(gr, y, ly), *torch.ops.aten.native_layer_norm(x, [257], w, b, 1e-5),
                    *torch.ops.aten.native_layer_norm(x, [257], None, None, 1e-5), x.sum(-1))
        step = crucible.compile(f, backend="cpu", guard=())
        for call in range(8):  # new values each call: every row of every result is written anew
            x, gr = torch.randn(300, 257, generator=g) * 3, torch.randn(300, 257, generator=g)
            for i, (a, e) in enumerate(zip(step(x, gr, w, b), f(x, gr, w, b))):
                assert torch.equal(bits(a), bits(e)), (call, i)
        p = step.plans()[0]
        assert p["exec_generated_calls"] == p["exec_calls"] == 7, p["exec_summary"]
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("capability,generated", [("avx2", True), ("default", False)])
def test_atens_other_cpu_capabilities(capability, generated):
    # ATEN_CPU_CAPABILITY=avx2: ATen's softmax runs at 32-byte vectors (a 3-step float32 tree),
    # and so does the generated one, with the AVX2 SLEEF functions. default: ATen uses libm's
    # exp, which is not SLEEF's: softmax stays a library call, with eager's bits either way.
    script = textwrap.dedent("""
        import torch, crucible_native as crucible
        def bits(t):
            return t.view(torch.int64 if t.dtype == torch.float64 else torch.int32)
        def f(x, g):
            y, ly = torch.softmax(x, -1), torch.log_softmax(x, -1)
            return (y, ly, torch.ops.aten._softmax_backward_data(g, y, -1, x.dtype),
                    torch.ops.aten._log_softmax_backward_data(g, ly, -1, x.dtype))
        n = 0
        for dt in (torch.float32, torch.float64):
            for w in (3, 8, 17, 100):
                x, g = torch.randn(5, w, dtype=dt) * 3, torch.randn(5, w, dtype=dt)
                step = crucible.compile(f, backend="cpu", guard=())
                for _ in range(3):
                    got = step(x, g)
                assert all(torch.equal(bits(a), bits(b)) for a, b in zip(got, f(x, g))), (dt, w)
                n += step.plans()[0]["exec_generated_calls"]
        print(torch.backends.cpu.get_cpu_capability(), "generated", n)
    """)
    env = dict(os.environ, ATEN_CPU_CAPABILITY=capability, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    r = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    cap, _, n = r.stdout.split()[-3:]
    assert cap == capability.upper(), r.stdout
    assert int(n) == (32 if generated else 0), r.stdout


def test_cross_entropy_generates_its_log_softmax():
    # cross_entropy is _log_softmax and nll_loss_forward, both generated
    g = torch.Generator().manual_seed(9)
    x, y = torch.randn(37, 10, generator=g), torch.randint(0, 10, (37,), generator=g)

    def f(x, y):
        return F.cross_entropy(x, y)
    step = crucible.compile(f, backend="cpu", guard=())
    for _ in range(4):
        got = step(x, y)
    assert torch.equal(bits(got), bits(f(x, y)))
    p = step.plans()[0]
    assert any(n.startswith("aten::_log_softmax") for n in p["op_names"]), p["op_names"]
    assert p["exec_generated_calls"] == 2, p["exec_summary"]


def test_training_steps_with_generated_softmax_keep_eager_bits():
    # the mlp's loss (log_softmax forward and backward), the transformer's attention
    # (_safe_softmax)
    for name in ("mlp", "transformer"):
        s, ref = models.make(name), models.make(name)
        step, eager = crucible.compile(step_of(s), backend="cpu"), step_of(ref)
        for i in range(4):
            assert_same_call(step, eager, s.x, s.y, i, f"{name} call {i}")
        assert_same_state(s, ref)
        ops = " ".join(step.plans()[0]["op_names"])
        want = ["_log_softmax ", "_log_softmax_backward_data"] + (
            ["_safe_softmax", "_softmax_backward_data"] if name == "transformer" else [])
        assert all(w in ops for w in want), ops
