"""Bit-exact numpy emulation of ATen CPU aten::native_layer_norm_backward (float32 / float64,
normalized shape = the last dim(s), contiguous), torch 2.13.0+cpu on x86-64 AVX2 (this host:
AMD EPYC, no AVX-512).  misc/ATEN_ORDER.md section 11 gives the derivation.

Sources: aten/src/ATen/native/layer_norm.cpp (layer_norm_backward_cpu) and
aten/src/ATen/native/cpu/layer_norm_kernel.cpp (LayerNormBackwardKernelImpl ->
LayerNormBackwardKernelImplInternal<T, T> -> layer_norm_backward_frame<T, T, T>), the 2.13 headers
cpu/vec/functional_base.h (reduce_all, map2_reduce_all, map3_reduce_all, map2, map3,
vec_reduce_all, VecReduceAllSIMD<float> AVX2), Parallel-inl.h / ParallelOpenMP.h (parallel_for),
and the disassembly of the 2.13 libtorch_cpu.so (AVX2 copy of
LayerNormBackwardKernelImplInternal<float,float>::{lambda(long,long)#1}::operator() @0x6a78440 and
<double,double> @0x6a77460; second pass: invoke_parallel<...{lambda#2}> @0x6a713a0 / 0x6a71550 and
the inline copy inside LayerNormBackwardKernelImpl @0x6a864f0) for where GCC fused mul+add into FMA.

Usage:
  .venv/bin/python utils/aten_order/layernorm_bwd_emul.py           # default self-check (~1.5 min)
  .venv/bin/python utils/aten_order/layernorm_bwd_emul.py quick     # smaller (~25 s)
  ... mutants   # also run deliberately wrong variants (each must fail somewhere)
  ... autograd  # also compare F.layer_norm(...).backward() grads (autograd path) on a subset
  ... threads   # also torch's own 1- vs 2-thread differences on the same data, and 3 / 4 threads
Prints the counts; exit status 1 on any mismatch of the faithful emulator.
"""
import os
import sys
import time
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fma import fma32  # noqa: E402  (float32 fma by round-to-odd in float64)
from softmax_emul import vec_reduce_all_seq, vec_reduce_all_tree  # noqa: E402

VEC_BYTES = 32   # AVX2 Vectorized<T>: 8 floats / 4 doubles (REGISTER_DISPATCH -> AVX2 kernel)


# ----------------------------------------------------------------------------------------------
# exact fma (one rounding), vectorised
def _two_sum(a, b):
    s = a + b
    bb = s - a
    return s, (a - (s - bb)) + (b - bb)


def _two_prod(a, b):
    p = a * b
    C = 134217729.0                     # 2^27 + 1 (Veltkamp split)
    t = C * a; ah = t - (t - a); al = a - ah
    t = C * b; bh = t - (t - b); bl = b - bh
    e = ((ah * bh - p) + ah * bl + al * bh) + al * bl
    return p, e


def fma64(a, b, c):
    """float64 fma: Boldo-Melquiond emulation with round-to-odd (exact for operands and results
    away from overflow/underflow, which holds for every case tested here; checked against
    Fraction in the self-check)."""
    a, b, c = np.broadcast_arrays(np.asarray(a, np.float64), np.asarray(b, np.float64),
                                  np.asarray(c, np.float64))
    with np.errstate(invalid='ignore', over='ignore'):
        uh, ul = _two_prod(a, b)
        th, tl = _two_sum(c, uh)
        v, ve = _two_sum(tl, ul)
        odd_fix = (ve != 0) & ((v.view(np.int64) & 1) == 0)
        v = np.where(odd_fix, np.nextafter(v, np.where(ve > 0, np.inf, -np.inf)), v)
        z = th + v
        plain = a * b + c                   # right when a*b == 0 (sign of zero rules), or non-finite
        z = np.where((uh == 0) | ~np.isfinite(uh) | ~np.isfinite(c), plain, z)
        z = np.where((c == 0) & (uh != 0) & np.isfinite(uh), uh, z)
    return z


def fma(a, b, c):
    dt = np.result_type(a, b, c)
    return fma32(a, b, c) if dt == np.float32 else fma64(a, b, c)


# ----------------------------------------------------------------------------------------------
# horizontal reductions (functional_base.h)
def vec_reduce_all_full(acc):
    """vec_reduce_all(+, acc) on a full vector.  float: VecReduceAllSIMD<float> (AVX2):
    v += permute2f128(v) (lane i^4), v += shuffle 0x4E (i^2), v += shuffle 0xB1 (i^1), lane 0.
    double: no specialisation -> sequential over the 4 lanes."""
    if acc.dtype == np.float32:
        return vec_reduce_all_tree(acc)
    return vec_reduce_all_seq(acc, acc.shape[-1])


def row_sum(p, W, tail_fn, body_fma=None, tree=None):
    """map*_reduce_all(+) over rows of p[M, N] as compiled in the 2.13 AVX2 kernel.
    p: the mapped (rounded) products/values per element.
    tail_fn(acc_tail, sl) -> new acc lanes for the last N % W elements (slice sl of columns);
      the masked-tail step acc = Vec::set(acc, acc + map(...), r) is where GCC fused.
    N < W: sequential sum of p over the N lanes (vec_reduce_all(op, v, N))."""
    M, N = p.shape
    if N < W:
        return vec_reduce_all_seq(p, N)
    acc = p[:, :W].copy()
    nfull = N - N % W
    d = W
    while d < nfull:
        acc = body_fma(acc, slice(d, d + W)) if body_fma else acc + p[:, d:d + W]
        d += W
    r = N - d
    if r > 0:
        acc[:, :r] = tail_fn(acc[:, :r], slice(d, N))
    return (tree or vec_reduce_all_full)(acc)


# ----------------------------------------------------------------------------------------------
def rows_of_threads(M, T):
    """at::parallel_for(0, M, grain 1, ...): inline (tid 0 gets all rows) unless M > 1 and T > 1;
    else OpenMP: nt = min(T, M) tasks, chunk = ceil(M / nt), tid t gets [t*chunk, min(M,(t+1)*chunk))."""
    if M <= 1 or T <= 1:
        return [(0, M)]
    nt = min(T, M)
    chunk = -(-M // nt)
    out = []
    for t in range(T):
        b = t * chunk
        out.append((b, min(M, b + chunk)) if b < M else (M, M))
    return out


def layer_norm_backward(dY, X, mean, rstd, gamma, mask, threads, variant=None):
    """Emulate aten::native_layer_norm_backward (CPU, last-dim normalisation).
    dY, X: [M, N] arrays of dtype T; mean, rstd: [M] (as saved by native_layer_norm);
    gamma: [N] or None; mask = (dX, dgamma, dbeta) booleans (dgamma needs gamma, dbeta needs beta);
    threads = at::get_num_threads() at the call.  Returns (dX or None, dgamma or None, dbeta or None).
    variant: a set of names of deliberately wrong changes (for the discrimination check)."""
    v = variant or set()
    dt = X.dtype
    T_ = dt.type
    M, N = X.shape
    W = (2 * VEC_BYTES if 'W512' in v else VEC_BYTES) // dt.itemsize
    mean = mean.reshape(M).astype(dt)
    rstd = rstd.reshape(M).astype(dt)
    gnull = gamma is None
    dX = dgamma = dbeta = None
    tree = (lambda acc: vec_reduce_all_seq(acc, acc.shape[-1])) if 'seqtree' in v else None

    if mask[0]:
        # ---- ds, db per row (layer_norm_backward_frame)
        if gnull:
            p_ds = dY * X                                        # map2_reduce_all(x*y, +, dY, X)
            tail_ds = ((lambda acc, sl: acc + dY[:, sl] * X[:, sl]) if 'tail_unfused' in v else
                       (lambda acc, sl: fma(X[:, sl], dY[:, sl], acc)))      # masked tail: FMA
            body_ds = (lambda acc, sl: fma(dY[:, sl], X[:, sl], acc)) if 'body_fused' in v else None
            ds = row_sum(p_ds, W, tail_ds, body_ds, tree)
            db = row_sum(dY, W, lambda acc, sl: acc + dY[:, sl], None, tree)    # reduce_all(+, dY)
        else:
            dyx = dY * X
            p_ds = dyx * gamma                                   # map3_reduce_all(x*y*z): (dy*x)*g
            tail_ds = ((lambda acc, sl: acc + dyx[:, sl] * gamma[sl]) if 'tail_unfused' in v else
                       (lambda acc, sl: fma(dyx[:, sl], np.broadcast_to(gamma[sl], acc.shape), acc)))
            body_ds = ((lambda acc, sl: fma(dyx[:, sl], np.broadcast_to(gamma[sl], acc.shape), acc))
                       if 'body_fused' in v else None)
            ds = row_sum(p_ds, W, tail_ds, body_ds, tree)
            p_db = dY * gamma                                    # map2_reduce_all(x*y, +, dY, gamma)
            tail_db = ((lambda acc, sl: acc + dY[:, sl] * gamma[sl])
                       if ('tail_unfused' in v or 'db_tail_unfused' in v) else
                       (lambda acc, sl: fma(dY[:, sl], np.broadcast_to(gamma[sl], acc.shape), acc)))
            body_db = ((lambda acc, sl: fma(dY[:, sl], np.broadcast_to(gamma[sl], acc.shape), acc))
                       if 'body_fused' in v else None)
            db = row_sum(p_db, W, tail_db, body_db, tree)
        # ---- per-row scalars (all in T; scale = T(1)/T(N))
        a = rstd
        scale = T_(1) / T_(N)
        if 'scalars_unfused' in v or 't1_unfused' in v:
            t1 = db * mean - ds
        else:
            t1 = fma(db, mean, -ds)                              # vfmsub231: db*mean - ds, 1 rounding
        b = ((t1 * a) * a) * a * scale
        q = (db * a) * scale
        if 'scalars_unfused' in v or 'c_unfused' in v:
            c = -b * mean - q
        else:
            c = fma(-b, mean, -q)                                # vfnmsub231: -(b*mean) - q, 1 rounding
        # ---- dX (map2 / map3; body and masked tail compiled alike)
        ady = a[:, None] * dY
        if not gnull:
            ady = ady * gamma                                    # (a*dy)*gamma
        bb = np.broadcast_to(b[:, None], X.shape)
        if 'dx_unfused' in v:
            dX = (ady + bb * X) + c[:, None]
        elif 'dx_other_fma' in v and gnull:
            dX = fma(np.broadcast_to(a[:, None], X.shape), dY, bb * X) + c[:, None]
        else:
            dX = fma(bb, X, ady) + c[:, None]                    # fma(b, x, a*dy[*g]) + c

    if mask[1] or mask[2]:
        # ---- first pass: per-thread buffers [T][N] zeroed, rows in order within each thread
        parts = rows_of_threads(M, 1 if 'nosplit' in v else threads)
        nbuf = threads
        gbuf = np.zeros((nbuf, N), dt)
        bbuf = np.zeros((nbuf, N), dt)
        if mask[1]:
            a_ = rstd[:, None]
            b_ = -rstd * mean                                    # b = -a * mean
            if 'dgamma_unfused' in v or 'dgamma_inner_unfused' in v:
                nrm = a_ * X + b_[:, None]
            else:
                nrm = fma(np.broadcast_to(a_, X.shape), X, np.broadcast_to(b_[:, None], X.shape))
        for tid, (r0, r1) in enumerate(parts):
            for i in range(r0, r1):
                if mask[1]:
                    if 'dgamma_unfused' in v or 'dgamma_outer_unfused' in v:
                        gbuf[tid] = gbuf[tid] + dY[i] * nrm[i]
                    else:
                        gbuf[tid] = fma(dY[i], nrm[i], gbuf[tid])   # dgamma + dy*(a*x + b), both fused
                if mask[2]:
                    bbuf[tid] = bbuf[tid] + dY[i]                # dbeta + dy
        # ---- second pass: scalar, acc = 0; acc += buf[t] for t = 0..threads-1
        if mask[1]:
            acc = np.zeros(N, dt)
            for t in range(nbuf):
                acc = acc + gbuf[t]
            dgamma = acc
        if mask[2]:
            acc = np.zeros(N, dt)
            for t in range(nbuf):
                acc = acc + bbuf[t]
            dbeta = acc
    return dX, dgamma, dbeta


# ----------------------------------------------------------------------------------------------
# self-check against torch
def _bits_equal(a, b):
    if a is None or b is None:
        return a is None and b is None
    a = np.ascontiguousarray(a); b = np.ascontiguousarray(b)
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    u = np.uint32 if a.dtype == np.float32 else np.uint64
    return np.array_equal(a.view(u), b.view(u))


def make_case(rng, dt, M, N, kind):
    """kind: (x_scale, x_offset, dy_scale, special)"""
    xs, xo, gs, special = kind
    X = (rng.standard_normal((M, N)) * xs + xo)
    dY = rng.standard_normal((M, N)) * gs
    if special == 'const_rows':
        X[::2] = xo                                      # constant rows: x - mean == 0 exactly
    elif special == 'int':
        X = np.round(X); dY = np.round(dY * 4) / 4       # many exact products, cancellations
    elif special == 'zeros_dy':
        dY[:, ::3] = 0.0
    gamma = (rng.standard_normal(N) * 0.5 + 1.0)
    beta = rng.standard_normal(N)
    return X.astype(dt), dY.astype(dt), gamma.astype(dt), beta.astype(dt)


def run_torch(torch, X, dY, gamma, beta, affine, mask, eps=1e-5):
    tX = torch.from_numpy(X)
    tg = torch.from_numpy(gamma) if affine in ('wb', 'w') else None
    tb = torch.from_numpy(beta) if affine in ('wb', 'b') else None
    N = X.shape[-1]
    _, mu, rs = torch.ops.aten.native_layer_norm(tX, [N], tg, tb, eps)
    gi, gw, gb = torch.ops.aten.native_layer_norm_backward(
        torch.from_numpy(dY), tX, [N], mu, rs, tg, tb, list(mask))
    f = lambda t: None if t is None else t.numpy().copy()
    return f(gi), f(gw), f(gb), mu.numpy().reshape(-1).copy(), rs.numpy().reshape(-1).copy()


def masks_for(affine):
    has_w = affine in ('wb', 'w'); has_b = affine in ('wb', 'b')
    out = []
    for m in [(True, True, True), (True, False, False), (False, True, True), (True, True, False),
              (True, False, True), (False, True, False), (False, False, True)]:
        if (m[1] and not has_w) or (m[2] and not has_b):
            continue
        if m not in out:
            out.append(m)
    return out


def check_fma64(rng, n=20000):
    from fractions import Fraction
    a = rng.standard_normal(n) * 10.0 ** rng.integers(-8, 8, n)
    b = rng.standard_normal(n) * 10.0 ** rng.integers(-8, 8, n)
    c = -(a * b) * (1 + rng.standard_normal(n) * 1e-9)          # heavy cancellation
    c[::3] = rng.standard_normal(len(c[::3])) * 10.0 ** rng.integers(-8, 8, len(c[::3]))
    z = fma64(a, b, c)
    bad = 0
    for i in range(n):
        ref = float(Fraction(float(a[i])) * Fraction(float(b[i])) + Fraction(float(c[i])))
        bad += (ref != z[i])
    return bad, n


def main():
    args = sys.argv[1:]
    quick = 'quick' in args
    import torch
    rng = np.random.default_rng(2013)
    t0 = time.time()
    bad64, n64 = check_fma64(rng, 4000 if quick else 20000)
    print('fma64 emulation vs Fraction: %d mismatches of %d' % (bad64, n64))

    if quick:
        Ns = [1, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 33, 64, 100, 129, 768, 1025, 4097]
        Ms = [1, 2, 3, 7, 64]
    else:
        Ns = [1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 15, 16, 17, 23, 31, 32, 33, 63, 64, 65, 100, 127,
              128, 129, 255, 256, 257, 500, 768, 1000, 1023, 1024, 1025, 2047, 2048, 2049,
              3072, 4096, 4097, 5000]
        Ms = [1, 2, 3, 4, 5, 8, 17, 64, 257]
    kinds = [(1.0, 0.0, 1.0, None), (1e-3, 1.0, 1e3, None), (1e3, -5e3, 1e-3, None),
             (2.0, 100.0, 1.0, None), (1.0, 3.0, 1.0, 'const_rows'), (3.0, 0.0, 2.0, 'int'),
             (1.0, 0.5, 1.0, 'zeros_dy')]
    affines = ['wb', 'w', 'b', 'none']
    # big shapes (rows x D): the transformer case, a few thousand rows
    big = [(1000, 768), (2048, 64), (3000, 17), (512, 1024), (128, 5000)] if not quick else \
          [(600, 257), (1500, 33)]

    variants = {}
    if 'mutants' in args:
        for name in ['tail_unfused', 'db_tail_unfused', 'body_fused', 't1_unfused', 'c_unfused',
                     'dx_unfused', 'dx_other_fma', 'dgamma_inner_unfused', 'dgamma_outer_unfused',
                     'seqtree', 'W512', 'nosplit']:
            variants[name] = [0, 0]
    counts = {}       # (dtype, threads) -> [cases, mismatches]
    mism = []
    cases = []
    for dt in (np.float32, np.float64):
        for N in Ns:
            for M in Ms:
                if M * N > 300000:
                    continue
                kind = kinds[rng.integers(len(kinds))]
                aff = affines[rng.integers(len(affines))]
                cases.append((dt, M, N, kind, aff))
        for (M, N) in big:
            for aff in ('wb', 'none'):
                cases.append((dt, M, N, kinds[rng.integers(len(kinds))], aff))
        # every affine x mask x kind at a few awkward sizes
        for N in ([17, 100] if quick else [7, 17, 100, 1027]):
            for kind in kinds:
                for aff in affines:
                    cases.append((dt, 5, N, kind, aff))

    for threads in (1, 2):
        torch.set_num_threads(threads)
        for (dt, M, N, kind, aff) in cases:
            X, dY, gamma, beta = make_case(rng, dt, M, N, kind)
            for mask in masks_for(aff):
                gi, gw, gb, mu, rs = run_torch(torch, X, dY, gamma, beta, aff, mask)
                g = gamma if aff in ('wb', 'w') else None
                e = layer_norm_backward(dY, X, mu, rs, g, mask, threads)
                ok = _bits_equal(gi, e[0]) and _bits_equal(gw, e[1]) and _bits_equal(gb, e[2])
                k = (np.dtype(dt).name, threads)
                c = counts.setdefault(k, [0, 0])
                c[0] += 1
                if not ok:
                    c[1] += 1
                    if len(mism) < 20:
                        mism.append((np.dtype(dt).name, threads, M, N, kind, aff, mask,
                                     [_bits_equal(gi, e[0]), _bits_equal(gw, e[1]),
                                      _bits_equal(gb, e[2])]))
                for name, vc in variants.items():
                    if vc[0] >= 150 and vc[1] > 0 and not quick:
                        continue
                    ev = layer_norm_backward(dY, X, mu, rs, g, mask, threads, variant={name})
                    okv = _bits_equal(gi, ev[0]) and _bits_equal(gw, ev[1]) and _bits_equal(gb, ev[2])
                    vc[0] += 1
                    vc[1] += (not okv)
    total = sum(c[0] for c in counts.values())
    bad = sum(c[1] for c in counts.values())
    for k in sorted(counts):
        print('dtype %-7s threads %d: %4d cases (dX/dgamma/dbeta as the mask asks), %d mismatches'
              % (k[0], k[1], counts[k][0], counts[k][1]))
    for m in mism:
        print('MISMATCH', m)

    if 'autograd' in args:
        import torch.nn.functional as F
        ag = [0, 0]
        for threads in (1, 2):
            torch.set_num_threads(threads)
            for (dt, M, N) in [(np.float32, 33, 100), (np.float64, 7, 1025), (np.float32, 300, 768),
                               (np.float32, 2, 3), (np.float64, 64, 31)]:
                X, dY, gamma, beta = make_case(rng, dt, M, N, kinds[0])
                X3 = X.reshape(1, M, N)                    # a 3-D input: M = 1 * M rows
                tX = torch.from_numpy(X3.copy()).requires_grad_(True)
                tw = torch.from_numpy(gamma.copy()).requires_grad_(True)
                tb = torch.from_numpy(beta.copy()).requires_grad_(True)
                y = F.layer_norm(tX, [N], tw, tb, 1e-5)
                y.backward(torch.from_numpy(dY.reshape(X3.shape).copy()))
                _, mu, rs = torch.ops.aten.native_layer_norm(torch.from_numpy(X), [N],
                                                              torch.from_numpy(gamma),
                                                              torch.from_numpy(beta), 1e-5)
                e = layer_norm_backward(dY, X, mu.numpy(), rs.numpy(), gamma, (True, True, True),
                                        threads)
                ok = (_bits_equal(tX.grad.numpy().reshape(M, N), e[0]) and
                      _bits_equal(tw.grad.numpy(), e[1]) and _bits_equal(tb.grad.numpy(), e[2]))
                ag[0] += 1; ag[1] += (not ok)
        print('autograd path (F.layer_norm(...).backward, threads 1 and 2): %d cases, %d mismatches'
              % tuple(ag))
        bad += ag[1]
    if 'threads' in args:
        # torch against itself: 1 thread vs 2 threads on the same data
        th = {'cases': 0, 'dX differs': 0, 'dgamma differs': 0, 'dbeta differs': 0,
              'emulator mismatches': 0}
        for dt in (np.float32, np.float64):
            for (M, N) in [(2, 100), (3, 17), (7, 1000), (64, 33), (257, 768), (1, 512), (2, 5)]:
                for kind in kinds[:4]:
                    X, dY, gamma, beta = make_case(rng, dt, M, N, kind)
                    res = {}
                    for threads in (1, 2):
                        torch.set_num_threads(threads)
                        res[threads] = run_torch(torch, X, dY, gamma, beta, 'wb', (True, True, True))
                        e = layer_norm_backward(dY, X, res[threads][3], res[threads][4], gamma,
                                                (True, True, True), threads)
                        th['emulator mismatches'] += not all(_bits_equal(res[threads][j], e[j])
                                                             for j in range(3))
                    th['cases'] += 1
                    for j, name in enumerate(['dX differs', 'dgamma differs', 'dbeta differs']):
                        th[name] += not _bits_equal(res[1][j], res[2][j])
        print('torch 1 thread vs 2 threads, same data:', th)
        bad += th['emulator mismatches']
        # 3 and 4 threads (oversubscribed on a 2-core host; only the row split matters)
        t34 = [0, 0]
        for threads in (3, 4):
            torch.set_num_threads(threads)
            for dt in (np.float32, np.float64):
                for (M, N) in [(2, 100), (3, 17), (5, 33), (7, 1000), (9, 8), (64, 33), (1, 40)]:
                    X, dY, gamma, beta = make_case(rng, dt, M, N, kinds[3])
                    r = run_torch(torch, X, dY, gamma, beta, 'wb', (True, True, True))
                    e = layer_norm_backward(dY, X, r[3], r[4], gamma, (True, True, True), threads)
                    t34[0] += 1
                    t34[1] += not all(_bits_equal(r[j], e[j]) for j in range(3))
        print('threads 3 and 4: %d cases, %d mismatches' % tuple(t34))
        bad += t34[1]
    for name, vc in variants.items():
        print('mutant %-16s: %4d cases run, %4d mismatches (must be > 0)' % (name, vc[0], vc[1]))
    print('total: %d cases, %d mismatches, %.1f s' % (total, bad, time.time() - t0))
    sys.exit(1 if (bad or bad64) else 0)


if __name__ == '__main__':
    main()
