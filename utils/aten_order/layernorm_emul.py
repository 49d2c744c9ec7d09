"""Emulation of ATen CPU native_layer_norm forward (float32/float64, last-dim
normalisation), torch 2.13 x86.  LayerNormKernel is registered with
REGISTER_DISPATCH, so on an AVX512 host the AVX2 kernel runs (W = 8 floats /
4 doubles).  Rows are batched along axis 0 (independent)."""
import numpy as np
from fma import fma

K_CHUNK = 16


def ceil_log2(x):
    return 1 if x <= 2 else int(x - 1).bit_length()


def add_moments_vec(m0_add, m1_add, m2_add, m0, m1, m2, dt):
    n = m0 + m0_add
    c = dt.type(0) if n == 0 else dt.type(dt.type(m0_add) / dt.type(n))
    delta = m1_add - m1
    m2_tmp = m2 + m2_add
    c_delta = c * delta
    m0_delta = delta * dt.type(m0)
    m1 = m1 + c_delta
    m2 = fma(m0_delta, c_delta, m2_tmp)
    return n, m1, m2


def rowwise_moments(X, W, tail_fma=False, addm_fma=True):
    """X: [M, N] -> (mean[M], var[M]) exactly as RowwiseMomentsImpl."""
    M, N = X.shape
    dt = X.dtype
    n = N // W
    m = -(-n // K_CHUNK)
    depth = ceil_log2(m)
    c_vecs = [dt.type(dt.type(1) / dt.type(i + 1)) for i in range(K_CHUNK)]
    zero = np.zeros((M, W), dt)
    D = max(depth, 1)
    m0_stk = [0] * D
    m1_stk = [zero.copy() for _ in range(D)]
    m2_stk = [zero.copy() for _ in range(D)]
    for i in range(m):
        base = i * K_CHUNK * W
        m0 = min(K_CHUNK, n - i * K_CHUNK)
        m1v = zero.copy(); m2v = zero.copy()
        for j in range(m0):
            x = X[:, base + j * W: base + (j + 1) * W]
            delta = x - m1v
            m1v = fma(np.full_like(x, c_vecs[j]), delta, m1v)
            tmp2 = x - m1v
            m2v = fma(delta, tmp2, m2v)
        m0_stk[0], m1_stk[0], m2_stk[0] = add_moments_vec(m0, m1v, m2v, m0_stk[0], m1_stk[0], m2_stk[0], dt)
        mask = i + 1
        j = 1
        while j < depth and (mask & 1) == 0:
            m0_stk[j], m1_stk[j], m2_stk[j] = add_moments_vec(
                m0_stk[j - 1], m1_stk[j - 1], m2_stk[j - 1], m0_stk[j], m1_stk[j], m2_stk[j], dt)
            m0_stk[j - 1] = 0; m1_stk[j - 1] = zero.copy(); m2_stk[j - 1] = zero.copy()
            mask >>= 1
            j += 1
    for i in range(1, depth):
        m0_stk[0], m1_stk[0], m2_stk[0] = add_moments_vec(
            m0_stk[i], m1_stk[i], m2_stk[i], m0_stk[0], m1_stk[0], m2_stk[0], dt)
    m1_arr, m2_arr = m1_stk[0], m2_stk[0]
    # scalar Welford over the tail elements
    m0 = 0
    m1 = np.zeros(M, dt); m2 = np.zeros(M, dt)
    for i in range(n * W, N):
        x = X[:, i]
        delta = x - m1
        m0 += 1
        m1 = m1 + delta / dt.type(m0)
        m2 = fma(delta, x - m1, m2) if tail_fma else m2 + delta * (x - m1)
    # fold in the W lanes, lane 0 first (scalar AddMoments)
    m0_add = n
    for lane in range(W):
        nn = m0 + m0_add
        c = dt.type(0) if nn == 0 else dt.type(dt.type(m0_add) / dt.type(nn))
        delta = m1_arr[:, lane] - m1
        f1, f2 = (addm_fma, addm_fma) if isinstance(addm_fma, bool) else addm_fma
        # m1 += c * delta;  m2 += m2_add + delta * delta * c * m0;
        m1 = fma(np.full_like(delta, c), delta, m1) if f1 else m1 + c * delta
        if f2:   # GCC contracts the inner  m2_add + (dd_c * m0)
            m2 = m2 + fma(delta * delta * c, np.full_like(delta, dt.type(m0)), m2_arr[:, lane])
        else:
            m2 = m2 + (m2_arr[:, lane] + delta * delta * c * dt.type(m0))
        m0 = nn
    return m1, m2 / dt.type(N)


def layer_norm(X, gamma, beta, eps, W=None, out_fma=True, **kw):
    dt = X.dtype
    W = W or (32 // dt.itemsize)
    mean, var = rowwise_moments(X, W, **kw)
    rstd = dt.type(1) / np.sqrt(var + dt.type(eps))
    bias = -mean
    t = (X + bias[:, None]) * rstd[:, None]
    if gamma is not None and beta is not None:
        Y = fma(t, np.broadcast_to(gamma, t.shape), np.broadcast_to(beta, t.shape)) if out_fma else t * gamma + beta
    else:
        g = gamma if gamma is not None else dt.type(1)
        b = beta if beta is not None else dt.type(0)
        Y = t * g + b
    return Y.astype(dt), mean, rstd
