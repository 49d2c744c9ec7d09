"""Bit-exact numpy emulation of ATen CPU native_batch_norm (training mode) and
native_batch_norm_backward (training mode) for float32/float64 contiguous
(N, C, *) inputs, torch 2.13.0+cpu on x86 (AVX512 host).  Verified bit for bit
by test_batchnorm.py (1, 2 and 4 threads; also ATEN_CPU_CAPABILITY=avx2).

Sources: Normalization.cpp (batch_norm_cpu -> batch_norm_cpu_update_stats_template
-> batch_norm_cpu_transform_input_template; batch_norm_backward_cpu_template),
native/cpu/batch_norm_kernel.cpp (batch_norm_cpu_{,collect_stats_,backward_}stub),
read from the search index (not the 2.13 commit) and, where the binary disagreed,
from the AVX2 machine code of libtorch_cpu.so (objdump; the symbols are kept).
All three stubs use REGISTER_DISPATCH, so on an AVX512 host the AVX2 kernel runs:
W = 8 float / 4 double lanes.  acc_type<float, /*is_cuda=*/false> is DOUBLE, so
several float32 reductions accumulate in double.

Kernel selection (input contiguous):
  image_size = numel / (N*C) > 1  -> "contiguous" kernels (per channel, parallel
                                     over channels: thread-count INVARIANT)
  image_size == 1 (2-D (N,C) or (N,C,1,1)) -> "channels_last" kernels (rows split
                                     over OpenMP threads into per-thread buffers:
                                     the result DEPENDS on get_num_threads()).

FMA contraction (GCC -ffp-contract=fast in the AVX2 TU; found empirically and
in the machine code; test_batchnorm.py checks that each alternative fails):
  * forward output y = fma(x, alpha, beta), beta = fma(-mean, alpha, b)   (all paths)
  * contiguous float64 variance: element pairs plain (GCC vectorised by 2), the
    odd last element of each HW plane fused; 2-D path C float64 the same over rows
  * 2-D stats: buffer-path variance fused; path B variance fused
  * contiguous backward dotp (vec::map2_reduce_all): only the masked tail step fused
  * contiguous backward grad_input: (go - gm) - (x-mean)*k fused (all elements)
  * 2-D backward: dotp accumulation fused (body and tail); grad_input fused only
    for channels in full 8/4-lane vectors, the masked channel tail is NOT fused
  * Normalization.cpp (running stats, invstd) is a generic TU: no FMA.
"""
import numpy as np
from fma import fma32

try:  # glibc fma is correctly rounded; much faster than the Fraction-based fma64
    import ctypes
    _libm = ctypes.CDLL('libm.so.6')
    _libm.fma.restype = ctypes.c_double
    _libm.fma.argtypes = [ctypes.c_double] * 3
    _vfma = np.vectorize(lambda a, b, c: _libm.fma(a, b, c), otypes=[np.float64])

    def fma64(a, b, c):
        return _vfma(np.asarray(a, np.float64), np.asarray(b, np.float64), np.asarray(c, np.float64))
except OSError:  # pragma: no cover
    from fma import fma64


def fma(a, b, c):
    dt = np.result_type(a, b, c)
    return fma32(a, b, c) if dt == np.float32 else fma64(a, b, c)


def lanes(dt):
    return 32 // np.dtype(dt).itemsize        # AVX2 kernel even on AVX512 hosts


def omp_ranges(n, T, grain=1):
    """at::parallel_for(0, n, grain) with T = get_num_threads() (Parallel-inl.h)."""
    if not (n > grain and n > 1 and T > 1):
        return [(0, n)], True                   # inline call, thread id 0
    nt = min(T, -(-n // grain))
    chunk = -(-n // nt)
    return [(min(n, t * chunk), min(n, (t + 1) * chunk)) for t in range(nt)], False


# ----------------------------------------------------------------------------------
# vec helpers (functional_base.h, AVX2)
from softmax_emul import vec_reduce_all_seq, vec_reduce_all_tree  # noqa: E402 (AVX2: W = 8 lanes)


def _final(acc):
    return vec_reduce_all_tree(acc) if acc.dtype == np.float32 else vec_reduce_all_seq(acc, acc.shape[-1])


def reduce_all_sum(e):
    """vec::reduce_all(+, data, n) on rows e [B, n]."""
    B, n = e.shape
    W = lanes(e.dtype)
    if n < W:
        return vec_reduce_all_seq(e, n)
    acc = e[:, :W].copy()
    d = W
    while d < n - n % W:
        acc = acc + e[:, d:d + W]
        d += W
    if n - d > 0:
        acc[:, :n - d] = acc[:, :n - d] + e[:, d:]
    return _final(acc)


def map2_reduce_all_dotp(x, dy, mean, fused):
    """vec::map2_reduce_all([mean](x, dy){ return (x - mean) * dy; }, +, x, dy, n)
    on rows [B, n]; mean [B].  Order of 4.1 in ATEN_ORDER.md (W = 8/4, float:
    3-step tree, double: lanes 0..3 in order).  fused: which accumulation steps
    acc + (x-mean)*dy are one FMA: 'tail' (the model: only the masked tail step
    Vec::set(acc, acc + q*dy, r)), 'body', True (both), False (none)."""
    B, n = x.shape
    W = lanes(x.dtype)
    q = x - mean[:, None]
    if n < W:
        return vec_reduce_all_seq(q * dy, n)
    acc = q[:, :W] * dy[:, :W]
    d = W
    while d < n - n % W:
        acc = fma(q[:, d:d + W], dy[:, d:d + W], acc) if fused in (True, 'body') else acc + q[:, d:d + W] * dy[:, d:d + W]
        d += W
    r = n - d
    if r > 0:
        acc[:, :r] = fma(q[:, d:], dy[:, d:], acc[:, :r]) if fused in (True, 'tail') else acc[:, :r] + q[:, d:] * dy[:, d:]
    return _final(acc)


# ----------------------------------------------------------------------------------
# forward statistics
def collect_stats_contiguous(x3, var_fuse='model'):
    """batch_norm_cpu_collect_stats_contiguous_impl, x3 = [N, C, HW] with HW > 1.
    Per channel, sequentially over n then i, in accscalar_t = double:
        sum += x;  mean = T(sum / double(N*HW))
        var_sum += (x - mean) * (x - mean)      # float32: product rounded in FLOAT, then added in double
                                                 # float64: see var_fuse
        var_sum_out = T(var_sum)
    var_fuse (float64 only): 'model' = GCC vectorised the i-loop by 2: the products
    of element pairs are plain (unfused), the last element of an odd-length HW
    plane is fma(d, d, acc); False = never fused; True = always fused."""
    N, C, HW = x3.shape
    dt = x3.dtype
    s = np.zeros(C, np.float64)
    for n in range(N):
        for i in range(HW):
            s = s + x3[n, :, i].astype(np.float64)
    mean = (s / np.float64(N * HW)).astype(dt)
    v = np.zeros(C, np.float64)
    for n in range(N):
        for i in range(HW):
            d = x3[n, :, i] - mean                      # in T
            if dt == np.float64:
                f = var_fuse is True or (var_fuse == 'model' and i >= HW - HW % 2)
                v = fma64(d, d, v) if f else v + d * d
            else:
                v = v + (d * d).astype(np.float64)      # float product, double add
    return mean, v.astype(dt)


def collect_stats_channels_last(x2, T, var_fused=True, small_path=None):
    """batch_norm_cpu_collect_stats_channels_last_impl (2.13 binary), x2 = [M, C]
    rows (image_size == 1), T = get_num_threads().  Three paths (the branch
    conditions were read from the AVX2 machine code of this function):

    (A) M > T: two-pass buffer path
        buf[T, C] = 0 (dtype T); parallel_for(0, M, 1): thread t owns rows
        [t*chunk, (t+1)*chunk), chunk = ceil(M/T) (inline, thread 0, if T == 1)
          buf[t] = x[r] + buf[t]                                   (vec::map2, lanes over C)
        mean[c] = T( (((0 + buf[0][c]) + buf[1][c]) + ...) / double(M) )   all T buffer rows,
                  accumulated in accscalar_t = double, double division, one rounding to T
        buf = 0;  buf[t] = fma(x[r]-mean, x[r]-mean, buf[t])          (vec::map3; fused = var_fused)
        var_sum[c] = T( 0 + buf[0][c] + buf[1][c] + ... )              (double)
    (B) M <= T and (T == 1 or C <= 16 or C > 2048): vectorised over channel blocks of 16,
        accumulating in T (float for float32):
        s = 0; s = x[r] + s (r = 0..M-1);  mean = s / T(M)            (vdivps / vdivpd)
        v = 0; v = fma(x[r]-mean, x[r]-mean, v);  var_sum = v
    (C) M <= T, T > 1 and 17 <= C <= 2048: per channel (stored source's else branch),
        accscalar_t = double:
        s = 0; s += double(x[r]);  mean = T(s / double(M))
        float32: v += double(T((x[r]-mean)*(x[r]-mean)))           (product rounded in float)
        float64: GCC vectorised the row loop by 2: rows r < M - M%2 add a plain product
                 v = v + d*d, the odd last row is fused v = fma(d, d, v)
        var_sum = T(v)
    small_path forces 'B' or 'C' (for the rejected-alternative checks)."""
    M, C = x2.shape
    dt = x2.dtype
    if M > T:
        ranges, _ = omp_ranges(M, T)
        buf = np.zeros((T, C), dt)
        for t, (b, e) in enumerate(ranges):
            for r in range(b, e):
                buf[t] = x2[r] + buf[t]
        s = np.zeros(C, np.float64)
        for t in range(T):
            s = s + buf[t].astype(np.float64)
        mean = (s / np.float64(M)).astype(dt)
        buf = np.zeros((T, C), dt)
        for t, (b, e) in enumerate(ranges):
            for r in range(b, e):
                d = x2[r] - mean
                buf[t] = fma(d, d, buf[t]) if var_fused else buf[t] + d * d
        v = np.zeros(C, np.float64)
        for t in range(T):
            v = v + buf[t].astype(np.float64)
        return mean, v.astype(dt)
    path = small_path or ('B' if (T == 1 or C <= 16 or C > 2048) else 'C')
    if path == 'B':
        s = np.zeros(C, dt)
        for r in range(M):
            s = x2[r] + s
        mean = (s / dt.type(M)).astype(dt)
        v = np.zeros(C, dt)
        for r in range(M):
            d = x2[r] - mean
            v = fma(d, d, v)
        return mean, v
    s = np.zeros(C, np.float64)
    for r in range(M):
        s = s + x2[r].astype(np.float64)
    mean = (s / np.float64(M)).astype(dt)
    v = np.zeros(C, np.float64)
    for r in range(M):
        d = x2[r] - mean
        if dt == np.float64:
            v = fma64(d, d, v) if r >= M - M % 2 else v + d * d
        else:
            v = v + (d * d).astype(np.float64)
    return mean, v.astype(dt)


def update_stats(mean, var_sum, n, rm, rv, momentum, eps):
    """batch_norm_cpu_update_stats_template (Normalization.cpp, generic TU: no FMA).
    T = tensor dtype, acc = double (acc_type<T, false> is double for float too):
        var        = T(var_sum / T(n))                              # division in T
        save_invstd = T( 1.0 / sqrt(double(var) + eps) )            # InvStd<double>; 0 if var == 0 and eps == 0
        m = T(momentum)
        running_mean = T( m*mean + T(1 - m)*running_mean )          # all in T, products rounded in T
        unbiased   = T(var_sum / T(n - 1))                           # division in T
        running_var = T( double(m)*double(unbiased) + double(T(T(1 - m)*running_var)) )
                      # float32: product and sum in double, then ONE rounding to float
    returns save_mean (= mean), save_invstd, new running_mean, new running_var."""
    dt = mean.dtype
    var = (var_sum / dt.type(n)).astype(dt)
    vd = var.astype(np.float64)
    with np.errstate(divide='ignore', invalid='ignore'):
        inv = np.where((vd != 0) | (eps != 0), 1.0 / np.sqrt(vd + eps), 0.0).astype(dt)
        m = dt.type(momentum)
        one_m = dt.type(dt.type(1) - m)
        new_rm = None if rm is None else (m * mean + one_m * rm).astype(dt)
        new_rv = None
        if rv is not None:
            ub = (var_sum / dt.type(n - 1)).astype(dt)
            new_rv = (np.float64(m) * ub.astype(np.float64) + (one_m * rv).astype(np.float64)).astype(dt)
    return mean, inv, new_rm, new_rv


def linear_terms(mean, invstd, w, b):
    """batch_norm_cpu_collect_linear_and_constant_terms (AVX2 TU), per channel in T:
        alpha = invstd * w          (w = 1 if undefined)
        beta  = fma(-mean, alpha, b)  i.e. b - mean*alpha with ONE rounding (b = 0 if undefined)"""
    dt = mean.dtype
    w = np.ones_like(mean) if w is None else w
    b = np.zeros_like(mean) if b is None else b
    alpha = (invstd * w).astype(dt)
    beta = fma(-mean, alpha, b).astype(dt)
    return alpha, beta


def batch_norm_train(x, w, b, rm, rv, momentum, eps, T):
    """native_batch_norm(x, w, b, rm, rv, training=True, momentum, eps) on a
    contiguous [N, C, *] tensor with T = torch.get_num_threads().
    Returns (y, save_mean, save_invstd, new_running_mean, new_running_var).
    y = fma(x, alpha[c], beta[c]) elementwise (vectorised; tails identical)."""
    x = np.ascontiguousarray(x)
    N, C = x.shape[:2]
    HW = x.size // (N * C)
    if HW == 1:
        x2 = x.reshape(N, C)
        mean, vs = collect_stats_channels_last(x2, T)
    else:
        mean, vs = collect_stats_contiguous(x.reshape(N, C, HW))
    mean, inv, nrm, nrv = update_stats(mean, vs, N * HW, rm, rv, momentum, eps)
    alpha, beta = linear_terms(mean, inv, w, b)
    x3 = x.reshape(N, C, HW)
    y = fma(x3, np.broadcast_to(alpha[None, :, None], x3.shape), np.broadcast_to(beta[None, :, None], x3.shape))
    return y.astype(x.dtype).reshape(x.shape), mean, inv, nrm, nrv


# ----------------------------------------------------------------------------------
# backward
def batch_norm_backward_train(go, x, w, save_mean, save_invstd, T, dotp_fused=None, gi_fused=None):
    """native_batch_norm_backward(go, x, w, rm, rv, save_mean, save_invstd, train=True,
    eps, [True]*3) on contiguous [N, C, *]; T = get_num_threads().  Returns
    (grad_input, grad_weight, grad_bias).  Order: _backward_contiguous (HW > 1) /
    _backward_channels_last (HW == 1).  dotp_fused / gi_fused = None selects the
    verified model; other values are the rejected alternatives."""
    x = np.ascontiguousarray(x)
    go = np.ascontiguousarray(go)
    N, C = x.shape[:2]
    HW = x.size // (N * C)
    if HW == 1:
        gi, gw, gb = _backward_channels_last(go.reshape(N, C), x.reshape(N, C), w, save_mean, save_invstd, T,
                                             True if dotp_fused is None else dotp_fused,
                                             'model' if gi_fused is None else gi_fused)
    else:
        gi, gw, gb = _backward_contiguous(go.reshape(N, C, HW), x.reshape(N, C, HW), w, save_mean, save_invstd,
                                          'tail' if dotp_fused is None else dotp_fused,
                                          True if gi_fused is None else gi_fused)
    return gi.reshape(x.shape), gw, gb


def _backward_contiguous(go, x, w, mean, invstd, dotp_fused='tail', gi_fused=True):
    """batch_norm_cpu_backward_contiguous_impl (HW > 1), per channel c (thread invariant):
        sum = 0, dotp = 0                                   (accscalar_t = double)
        for n in 0..N-1:
            sum  += double( vec::reduce_all(+, go[n,c,:]) )               # W-lane order, tree for float
            dotp += double( vec::map2_reduce_all((x-mean)*go, +, x[n,c,:], go[n,c,:]) )
                    # (4.1 order of ATEN_ORDER.md with W = 8/4): first vector a plain product,
                    # full-vector steps acc = acc + T((x-mean)*go) (NOT fused), the masked
                    # tail step acc[0:r] = fma(x-mean, go, acc[0:r]) (FUSED) -- dotp_fused='tail';
                    # HW < W: sequential sum of the plain products
        k         = T(T(T(T(dotp) * invstd) * invstd) / T(N*HW))     # all in T
        grad_mean = T(sum / double(N*HW))                            # division in double
        gi = T( T( fma(-(x-mean), k, go - grad_mean) ) * invstd ) * w     (gi_fused)
             i.e. ((go - grad_mean) - (x-mean)*k) with one rounding, then * invstd, then * w
        grad_weight = T(dotp * double(invstd)),  grad_bias = T(sum)"""
    N, C, HW = go.shape
    dt = go.dtype
    n = N * HW
    w = np.ones(C, dt) if w is None else w
    s = np.zeros(C, np.float64)
    dp = np.zeros(C, np.float64)
    for b in range(N):
        s = s + reduce_all_sum(go[b]).astype(np.float64)
        dp = dp + map2_reduce_all_dotp(x[b], go[b], mean, dotp_fused).astype(np.float64)
    k = ((dp.astype(dt) * invstd * invstd) / dt.type(n)).astype(dt)
    gm = (s / np.float64(n)).astype(dt)
    xm = x - mean[None, :, None]
    a = go - gm[None, :, None]
    kk = np.broadcast_to(k[None, :, None], x.shape)
    if gi_fused:
        t = fma(-xm, kk, a)
    else:
        t = a - xm * kk
    gi = (t * invstd[None, :, None]) * w[None, :, None]
    return gi.astype(dt), (dp * invstd.astype(np.float64)).astype(dt), s.astype(dt)


def _backward_channels_last(go, x, w, mean, invstd, T, dotp_fused=True, gi_fused='model'):
    """batch_norm_cpu_backward_channels_last_impl (image_size == 1), rows [M, C]:
        buf_sum[T, C] = buf_dotp[T, C] = 0 (dtype T); parallel_for(0, M, 1) (thread t: rows chunk t)
            buf_sum[t]  = buf_sum[t] + go[r]
            buf_dotp[t] = fma(x[r] - mean, go[r], buf_dotp[t])          (dotp_fused)
        sum[c]  = T( 0 + buf_sum[0][c] + ... + buf_sum[T-1][c] )     # in accscalar_t = double
        dotp[c] = T( same for buf_dotp )
        k = T(T(T(dotp*invstd)*invstd) / T(M));  grad_mean = T(sum / T(M))     # all in T
        q = fma(-(x-mean), k, go - grad_mean)          channels c <  C - C%W (full vectors)
        q = (go - grad_mean) - T((x-mean)*k)           channels c >= C - C%W (masked tail: NOT fused)
        gi = T(T(q * invstd) * w)
        grad_weight = T(dotp * invstd)   (T);   grad_bias = sum
    gi_fused: 'model' (as above), True (all fused), False (none)"""
    M, C = go.shape
    dt = go.dtype
    w = np.ones(C, dt) if w is None else w
    ranges, _ = omp_ranges(M, T)
    bs = np.zeros((T, C), dt)
    bd = np.zeros((T, C), dt)
    for t, (b, e) in enumerate(ranges):
        for r in range(b, e):
            bs[t] = bs[t] + go[r]
            q = x[r] - mean
            bd[t] = fma(q, go[r], bd[t]) if dotp_fused else bd[t] + q * go[r]
    s = np.zeros(C, np.float64)
    dp = np.zeros(C, np.float64)
    for t in range(T):
        s = s + bs[t].astype(np.float64)
        dp = dp + bd[t].astype(np.float64)
    s = s.astype(dt)
    dp = dp.astype(dt)
    k = ((dp * invstd * invstd) / dt.type(M)).astype(dt)
    gm = (s / dt.type(M)).astype(dt)
    xm = x - mean[None, :]
    a = go - gm[None, :]
    kk = np.broadcast_to(k[None, :], x.shape)
    t = a - xm * kk
    if gi_fused:
        nb = C - C % lanes(dt) if gi_fused == 'model' else C    # masked tail vector: NOT fused
        t[:, :nb] = fma(-xm[:, :nb], kk[:, :nb], a[:, :nb])
    gi = (t * invstd[None, :]) * w[None, :]
    return gi.astype(dt), (dp * invstd).astype(dt), s
