"""Bit-exact numpy emulation of ATen CPU var / std / var_mean / std_mean (the
`.correction` overloads) for dense contiguous float32 / float64 tensors,
torch 2.13.0+cpu on x86-64 (AVX2 kernel; W = 8 float / 4 double for the sum).

misc/ATEN_ORDER.md section 9 gives the derivation.  Two code paths:

  * ALL path  (`std_var_all_cpu`, ReduceOps.cpp): var / std whose *output has one
    element* (dim=None, or every reduced-over size product == numel, e.g. a 1-D
    tensor, or shape (1, n) with dim=1).  Two passes:
        mean = float(T-dtype mean())         # cascade sum in T, / T(numel)
        s    = sum_{chunks} ( sum_seq (double(x)-mean)^2 )   # plain mul + add, no FMA
        var  = s / max(0, numel - correction); std = sqrt(var) (double), cast to T.
  * WELFORD path (`std_var_stub` -> binary_kernel_reduce(WelfordOps<T, double,...>)):
    every other var / std, and ALL var_mean / std_mean (including full reductions).
    Per output element, serial Welford in double over the reduced elements in
    memory order; the update is NOT fma-contracted (vmulsd + vaddsd in the binary):
        n += 1; delta = x - mean; mean = mean + delta / double(n)
        m2 = m2 + delta * (x - mean)
    Only when the output has ONE element and numel > 32768 and threads > 1 is the
    input split into per-thread chunks whose Welford states are merged with
    WelfordOps::combine, which IS fma-contracted in the AVX2 kernel:
        mean = fma(delta, nb/n, a.mean);  m2 = fma((delta*delta)*a.nf, nb/n, a.m2 + b.m2)
    (Under ATEN_CPU_CAPABILITY=default the combine is unfused: set COMBINE_FMA = False.)

Everything is vectorised over independent outputs with numpy; the sequential
dimension is a Python loop.  fma on float64 is emulated exactly
(Dekker TwoProduct + TwoSum + round-to-odd, Boldo & Melquiond 2008).
"""
import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sum_emul import full_sum  # noqa: E402

GRAIN_SIZE = 32768
REDUCE_FMA = False    # WelfordOps::reduce: no FMA (measured on float64; objdump shows vmulsd+vaddsd for f32 and f64)
COMBINE_FMA = True    # WelfordOps::combine: two vfmadd (AVX2 kernel); False for ATEN_CPU_CAPABILITY=default

# ---------------------------------------------------------------------------
# exact float64 fma, vectorised
# ---------------------------------------------------------------------------
_SPLIT = 134217729.0  # 2**27 + 1


def _two_sum(a, b):
    s = a + b
    bb = s - a
    err = (a - (s - bb)) + (b - bb)
    return s, err


def _two_prod(a, b):
    p = a * b
    t = _SPLIT * a
    ah = t - (t - a)
    al = a - ah
    t = _SPLIT * b
    bh = t - (t - b)
    bl = b - bh
    err = ((ah * bh - p) + ah * bl + al * bh) + al * bl
    return p, err


def _fma_slow(x, y, z):
    from fractions import Fraction
    x, y, z = float(x), float(y), float(z)
    if not (math.isfinite(x) and math.isfinite(y) and math.isfinite(z)):
        return x * y + z
    r = Fraction(x) * Fraction(y) + Fraction(z)
    try:
        return float(r)          # Fraction -> float is correctly rounded (RN-even)
    except OverflowError:
        return math.copysign(math.inf, r)


def fma64(a, b, c):
    """Correctly rounded a*b+c in float64, elementwise (numpy arrays / scalars)."""
    a, b, c = np.broadcast_arrays(np.asarray(a, np.float64), np.asarray(b, np.float64),
                                  np.asarray(c, np.float64))
    with np.errstate(all='ignore'):
        uh, ul = _two_prod(a, b)
        th, tl = _two_sum(c, uh)
        v, e = _two_sum(tl, ul)
        # round-to-odd of tl+ul: if inexact and last mantissa bit even, step toward e
        odd = (v.view(np.int64) & 1) == 1
        fix = (e != 0) & ~odd
        if fix.any():
            v = np.where(fix, np.nextafter(v, np.where(e > 0, np.inf, -np.inf)), v)
        r = th + v
        # exact special cases where the error-free transforms break down
        aa, ab, ac = np.abs(a), np.abs(b), np.abs(c)
        bad = ~(np.isfinite(a) & np.isfinite(b) & np.isfinite(c) & np.isfinite(r))
        bad |= (aa > 2.0 ** 995) | (ab > 2.0 ** 995) | (ac > 2.0 ** 1000)
        bad |= ((np.abs(uh) < 2.0 ** -960) & (uh != 0)) | ((aa < 2.0 ** -960) & (a != 0)) \
            | ((ab < 2.0 ** -960) & (b != 0)) | ((ac < 2.0 ** -960) & (c != 0))
        # c + a*b where the product is exactly zero: RN(c + 0) (sign rules)
        zero_p = (a == 0) | (b == 0)
        r = np.where(zero_p, c + a * b, r)
    if bad.any():
        r = np.array(r, copy=True)
        idx = np.nonzero(bad & ~zero_p)
        for i in zip(*idx):
            r[i] = _fma_slow(a[i], b[i], c[i])
    return r

# ---------------------------------------------------------------------------
# torch.mean(x) of the whole tensor: ATen's cascade sum in x's dtype (sum_emul.py, section 2),
# then a true division by T(numel)
# ---------------------------------------------------------------------------
def aten_full_mean(x, num_threads=1):
    dt = x.dtype.type
    return dt(full_sum(x, 32, num_threads) / dt(x.size))


# ---------------------------------------------------------------------------
# ALL path: std_var_all_cpu
# ---------------------------------------------------------------------------
def var_all(x, correction=1.0, take_sqrt=False, num_threads=1):
    x = np.ascontiguousarray(x).reshape(-1)
    dt = x.dtype.type
    numel = x.size
    mean = float(aten_full_mean(x, num_threads))          # .item<double>()
    xs = x.astype(np.float64).tolist()

    def chunk_sum(b, e):
        s = 0.0
        for v in xs[b:e]:
            d = v - mean
            s += d * d                                       # two roundings, no FMA
        return 0.0 + s                                       # thread_sum(=ident 0.0) += local_sum

    if numel > GRAIN_SIZE and num_threads > 1:               # at::parallel_reduce
        nt = min(num_threads, -(-numel // GRAIN_SIZE))
        chunk = -(-numel // nt)
        res = [0.0] * num_threads
        for t in range(nt):
            b = t * chunk
            if b < numel:
                res[t] = chunk_sum(b, min(numel, b + chunk))
        total = 0.0
        for r in res:
            total = total + r
    else:
        total = chunk_sum(0, numel)
    denom = max(0.0, numel - float(correction))
    with np.errstate(all='ignore'):
        var = np.float64(total) / np.float64(denom)
        res = np.sqrt(var) if take_sqrt else var
    return dt(res)


# ---------------------------------------------------------------------------
# WELFORD path: WelfordOps<T, double, int64_t, tuple<T,T>> via binary_kernel_reduce
# ---------------------------------------------------------------------------
class Welford:
    """Batch of independent Welford states (arrays of shape [B])."""

    def __init__(self, B):
        self.mean = np.zeros(B)
        self.m2 = np.zeros(B)
        self.nf = np.zeros(B)
        self.n = 0

    def reduce_col(self, xcol):
        """ops.reduce(acc, data): one new element per state (xcol: [B] float64)."""
        self.n += 1
        new_nf = np.float64(self.n)
        delta = xcol - self.mean
        new_mean = self.mean + delta / new_nf
        new_delta = xcol - new_mean
        if REDUCE_FMA:
            self.m2 = fma64(delta, new_delta, self.m2)
        else:
            self.m2 = self.m2 + delta * new_delta          # acc.m2 + delta*new_delta: NOT contracted
        self.mean = new_mean
        self.nf = np.full_like(self.mean, new_nf)


def welford_rows(x2d):
    """Serial Welford over axis 1 of x2d ([B, n], any float dtype). Returns (mean, m2, nf)."""
    x = np.asarray(x2d).astype(np.float64)
    B, n = x.shape
    w = Welford(B)
    for i in range(n):
        w.reduce_col(x[:, i])
    return w.mean, w.m2, w.nf


def welford_combine(a, b):
    """WelfordOps::combine on scalar states (mean, m2, nf): both fused products."""
    am, am2, anf = a
    bm, bm2, bnf = b
    if anf == 0:
        return b
    if bnf == 0:
        return a
    delta = bm - am
    new_count = anf + bnf
    nb_over_n = bnf / new_count
    if COMBINE_FMA:
        mean = float(fma64(delta, nb_over_n, am))                       # a.mean + delta*nb_over_n
        m2 = float(fma64((delta * delta) * anf, nb_over_n, am2 + bm2))  # (a.m2+b.m2) + ((d*d)*a.nf)*nb_over_n
    else:
        mean = am + delta * nb_over_n
        m2 = (am2 + bm2) + ((delta * delta) * anf) * nb_over_n
    return (mean, m2, new_count)


def welford_project(mean, m2, nf, correction, take_sqrt, dt):
    mean = np.asarray(mean, np.float64)
    m2 = np.asarray(m2, np.float64)
    nf = np.asarray(nf, np.float64)
    c = np.float64(correction)
    divisor = np.where(nf > c, nf - c, 0.0)
    with np.errstate(all='ignore'):
        var = m2 / divisor
        r = np.sqrt(var) if take_sqrt else var
    return r.astype(dt), mean.astype(dt)


def _to_rows(x, dims):
    """Move reduced dims last (keeping their memory order) -> [outputs, reduced], plus out shape."""
    x = np.ascontiguousarray(x)
    nd = x.ndim
    dims = sorted(d % nd for d in dims)
    keep = [d for d in range(nd) if d not in dims]
    xt = np.transpose(x, keep + dims)
    out_shape = tuple(x.shape[d] for d in keep)
    red = int(np.prod([x.shape[d] for d in dims])) if dims else 1
    return xt.reshape(-1, red), out_shape


def welford_reduce(x, dims, correction, take_sqrt, num_threads=1):
    """binary_kernel_reduce(WelfordOps): returns (var_or_std, mean) arrays of the out shape (no keepdim)."""
    dt = x.dtype.type
    rows, out_shape = _to_rows(x, dims)
    B, n = rows.shape
    if B == 1 and n > GRAIN_SIZE and num_threads > 1:
        # output numel == 1: parallel_for(0, numel, GRAIN_SIZE) with one buffer per thread
        nt = min(num_threads, -(-n // GRAIN_SIZE))
        chunk = -(-n // nt)
        bufs = [(0.0, 0.0, 0.0)] * num_threads
        for t in range(nt):
            b = t * chunk
            if b < n:
                m, m2, nf = welford_rows(rows[:, b:min(n, b + chunk)])
                bufs[t] = (float(m[0]), float(m2[0]), float(nf[0]))
        total = (0.0, 0.0, 0.0)
        for st in bufs:
            total = welford_combine(total, st)
        mean, m2, nf = [np.array([v]) for v in total]
    else:
        mean, m2, nf = welford_rows(rows)
    v, m = welford_project(mean, m2, nf, correction, take_sqrt, dt)
    return v.reshape(out_shape), m.reshape(out_shape)


# ---------------------------------------------------------------------------
# public entry points (mirror torch.var / std / var_mean / std_mean)
# ---------------------------------------------------------------------------
def _norm_dims(x, dim):
    if dim is None:
        return list(range(x.ndim))
    if isinstance(dim, int):
        return [dim % max(x.ndim, 1)]
    dims = [d % max(x.ndim, 1) for d in dim]
    return dims if dims else list(range(x.ndim))   # dim=[] reduces everything


def _keep(arr, x, dims, keepdim):
    if not keepdim:
        return arr
    shape = [1 if d in dims else s for d, s in enumerate(x.shape)]
    return np.asarray(arr).reshape(shape)


def var_std(x, dim=None, correction=1, keepdim=False, take_sqrt=False, num_threads=1):
    x = np.ascontiguousarray(x)
    dims = _norm_dims(x, dim)
    out_numel = int(np.prod([s for d, s in enumerate(x.shape) if d not in dims]))
    if x.size == 0:
        raise NotImplementedError('empty input: torch fills NaN')
    if out_numel == 1:
        r = np.array(var_all(x, correction, take_sqrt, num_threads), x.dtype)
        r = r.reshape([s for d, s in enumerate(x.shape) if d not in dims])
    else:
        r, _ = welford_reduce(x, dims, correction, take_sqrt, num_threads)
    return _keep(r, x, dims, keepdim)


def var(x, dim=None, correction=1, keepdim=False, num_threads=1):
    return var_std(x, dim, correction, keepdim, False, num_threads)


def std(x, dim=None, correction=1, keepdim=False, num_threads=1):
    return var_std(x, dim, correction, keepdim, True, num_threads)


def var_std_mean(x, dim=None, correction=1, keepdim=False, take_sqrt=False, num_threads=1):
    x = np.ascontiguousarray(x)
    dims = _norm_dims(x, dim)
    v, m = welford_reduce(x, dims, correction, take_sqrt, num_threads)
    return _keep(v, x, dims, keepdim), _keep(m, x, dims, keepdim)


def var_mean(x, dim=None, correction=1, keepdim=False, num_threads=1):
    return var_std_mean(x, dim, correction, keepdim, False, num_threads)


def std_mean(x, dim=None, correction=1, keepdim=False, num_threads=1):
    return var_std_mean(x, dim, correction, keepdim, True, num_threads)


# ---------------------------------------------------------------------------
# self-test against torch:  python utils/aten_order/var_std_emul.py [threads] [seed] [part]
# ---------------------------------------------------------------------------
def _selftest(threads=1, seed=0, part='all'):
    import sys
    import torch
    torch.set_num_threads(threads)
    rng = np.random.default_rng(seed)

    def gen(shape, dt, kind):
        if kind == 0:    # large mean, small variance: exposes every ordering difference
            base = rng.uniform(-1e4, 1e4)
            x = base + rng.standard_normal(shape) * np.exp(rng.uniform(-10, 2))
        elif kind == 1:  # mixed magnitudes
            x = rng.standard_normal(shape) * np.exp(rng.uniform(-6, 6, shape))
        else:            # per-row different means (rows / columns of one tensor differ)
            x = rng.uniform(-1e3, 1e3, shape[:1] + (1,) * (len(shape) - 1)) \
                + rng.standard_normal(shape) * np.exp(rng.uniform(-8, 1))
        return np.ascontiguousarray(x.astype(dt))

    def same(a, b):
        a = np.asarray(a); b = np.asarray(b)
        return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()

    ops = {
        'var': (lambda t, **k: t.var(**k), lambda x, **k: var(x, num_threads=threads, **k)),
        'std': (lambda t, **k: t.std(**k), lambda x, **k: std(x, num_threads=threads, **k)),
        'var_mean': (lambda t, **k: torch.var_mean(t, **k), lambda x, **k: var_mean(x, num_threads=threads, **k)),
        'std_mean': (lambda t, **k: torch.std_mean(t, **k), lambda x, **k: std_mean(x, num_threads=threads, **k)),
    }
    cases = []
    if part in ('all', 'rows'):
        lens = [1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 33, 63, 64, 65, 100, 127, 255, 257, 511,
                1000, 1023, 1025, 2047, 2049, 3001, 4095, 4097, 4999, 5000]
        for n in lens:
            B = int(rng.integers(2, 6))
            cases.append(((B, n), -1))
        for n in [1, 3, 17, 129, 1001]:
            cases.append(((2, 3, n), 2))
        for shape in [(8, 4100), (7, 4999), (3, 11000), (2, 20000)]:   # > GRAIN_SIZE elements in all
            cases.append((shape, 1))
    if part in ('all', 'cols'):
        for (n, C) in [(1, 5), (2, 3), (5, 2), (17, 9), (100, 7), (1001, 3), (3000, 5), (40000, 2)]:
            cases.append(((n, C), 0))
        for shape, d in [((3, 257, 5), 1), ((2, 1000, 3), 1), ((4, 5, 6), (0, 2)), ((3, 40, 7), (0, 1)),
                         ((6, 7, 8), [1, 2])]:
            cases.append((shape, d))
    if part in ('all', 'full'):
        for n in [1, 2, 3, 9, 100, 1001, 5000, 32767, 32768, 32769, 40000, 65536, 65537, 70001]:
            cases.append(((n,), None))
        for shape in [(1, 4097), (4097, 1), (1, 40001), (64, 513), (3, 11, 1001)]:
            cases.append((shape, None))
        cases.append(((1, 40001), 1))
        cases.append(((40001, 1), 0))
        cases.append(((1, 5000), -1))
    if part == 'random':   # random shapes: row lengths 1..5000, 1-4 rows/planes, random reduced dim
        for _ in range(60):
            nd = int(rng.integers(1, 4))
            n = int(rng.integers(1, 5001))
            shape = [int(rng.integers(1, 5)) for _ in range(nd - 1)] + [n]
            perm = rng.permutation(nd)
            shape = tuple(shape[i] for i in perm)
            r = rng.random()
            dim = None if r < 0.15 else int(rng.integers(0, nd)) if r < 0.85 else \
                tuple(sorted(set(int(d) for d in rng.integers(0, nd, 2))))
            cases.append((shape, dim))
    corrs = [0, 1, 2, 0.5]
    tot = 0
    bad = []
    for ci, (shape, dim) in enumerate(cases):
        for dt in (np.float32, np.float64):
            kind = ci % 3 if len(shape) > 1 else ci % 2
            x = gen(shape, dt, kind)
            t = torch.from_numpy(x)
            corr = corrs[ci % len(corrs)] if ci % 2 else corrs[(ci // 2) % 2]
            keepdim = bool(ci % 2)
            for name, (tf, ef) in ops.items():
                kw = dict(dim=dim, correction=corr, keepdim=keepdim)
                if dim is None and keepdim:
                    kw['keepdim'] = True
                a = tf(t, **kw)
                e = ef(x, **kw)
                if isinstance(a, tuple):
                    ok = same(a[0].numpy(), e[0]) and same(a[1].numpy(), e[1])
                else:
                    ok = same(a.numpy(), e)
                tot += 1
                if not ok:
                    bad.append((name, dt.__name__, shape, dim, corr, keepdim))
    print('threads', threads, 'seed', seed, 'part', part, 'cases', tot, 'mismatches', len(bad))
    for b in bad[:30]:
        print('  MISMATCH', b)
    return 1 if bad else 0


if __name__ == '__main__':
    import sys
    th = int(sys.argv[1]) if len(sys.argv) > 1 else 1
    sd = int(sys.argv[2]) if len(sys.argv) > 2 else 0
    pt = sys.argv[3] if len(sys.argv) > 3 else 'all'
    sys.exit(_selftest(th, sd, pt))
