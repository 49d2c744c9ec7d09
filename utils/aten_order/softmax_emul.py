"""Emulation of ATen AVX512 softmax / log_softmax over the last dim (float32/64),
torch 2.13.  exp/log values come from oracles (SLEEF u10 via torch), everything
else (order of max/sum/subtract/multiply) is emulated exactly."""
import numpy as np


def default_vector_bytes():
    """softmax kernels use ALSO_REGISTER_AVX512_DISPATCH: 64-byte vectors when
    ATen's capability is AVX512, 32-byte vectors for AVX2 (and DEFAULT)."""
    import torch
    return 64 if torch.backends.cpu.get_cpu_capability() == 'AVX512' else 32


def vec_reduce_all_tree(v):
    """VecReduceAllSIMD<float> (AVX512: 16 lanes, AVX2: 8 lanes): butterfly tree,
    lane0 = ((v0+v8)+(v4+v12)) + ... i.e. partner i^(W/2), then i^(W/4), ..., i^1."""
    v = v.copy()
    W = v.shape[-1]
    sh = W // 2
    while sh >= 1:
        v = v + v[..., np.arange(W) ^ sh]
        sh //= 2
    return v[..., 0]


def vec_reduce_all_seq(v, size):
    """generic vec_reduce_all: lane0 = ((l0 + l1) + l2) + ... + l_{size-1}."""
    acc = v[..., 0].copy()
    for i in range(1, size):
        acc = acc + v[..., i]
    return acc


def reduce_sum_all(e, W):
    """vec::reduce_all / map_reduce_all with '+' on already-mapped values e [B, n]."""
    B, n = e.shape
    dt = e.dtype
    if n < W:
        return vec_reduce_all_seq(e, n)
    acc = e[:, 0:W].copy()
    d = W
    while d < n - (n % W):
        acc = acc + e[:, d:d + W]
        d += W
    r = n - d
    if r > 0:
        acc[:, :r] = acc[:, :r] + e[:, d:n]   # Vec::set(acc, acc+tail, r)
    return final_reduce(acc)


def final_reduce(acc):
    """vec_reduce_all(+, acc) on a full vector: float32 has a shuffle-tree
    specialisation (AVX512: lane i^8, i^4, i^2, i^1; AVX2: i^4, i^2, i^1);
    double has none -> sequential lane0 + lane1 + ... + lane(W-1)."""
    if acc.dtype == np.float32:
        return vec_reduce_all_tree(acc)
    return vec_reduce_all_seq(acc, acc.shape[-1])


def log_softmax_lastdim(x, exp_fn, log_fn, W=None):
    dt = x.dtype
    W = W or (default_vector_bytes() // dt.itemsize)
    m = x.max(axis=1)                   # max is order independent (no NaN)
    e = exp_fn(x - m[:, None])          # (x - Vec(max)).exp()
    s = reduce_sum_all(e, W)
    L = log_fn(s)
    return (x - m[:, None]) - L[:, None]


def softmax_lastdim(x, exp_fn, W=None):
    dt = x.dtype
    W = W or (default_vector_bytes() // dt.itemsize)
    m = x.max(axis=1)
    e = exp_fn(x - m[:, None])
    s = reduce_sum_all(e, W)
    r = (dt.type(1) / s).astype(dt)     # scalar 1 / sum
    return e * r[:, None]


def map2_reduce_sum_prod(g, o, W, fused):
    """vec::map2_reduce_all(x*y, x+y): first full vector is a plain product,
    later ones are accumulated.  fused=False: acc + g*o everywhere;
    fused=True: fma(g, o, acc) everywhere; fused='tail': only the masked tail
    step (Vec::set(acc, acc + g*o, r)) is an FMA (what GCC emitted for float32
    in torch 2.13's AVX512 kernel)."""
    body_fused = fused is True
    tail_fused = bool(fused)
    from fma import fma
    B, n = g.shape
    if n < W:
        return vec_reduce_all_seq(g * o, n)
    acc = g[:, :W] * o[:, :W]
    d = W
    while d < n - (n % W):
        acc = fma(g[:, d:d + W], o[:, d:d + W], acc) if body_fused else acc + g[:, d:d + W] * o[:, d:d + W]
        d += W
    r = n - d
    if r > 0:
        acc[:, :r] = fma(g[:, d:], o[:, d:], acc[:, :r]) if tail_fused else acc[:, :r] + g[:, d:] * o[:, d:]
    return final_reduce(acc)


def softmax_backward_lastdim(g, o, fused, W=None):
    W = W or (default_vector_bytes() // g.dtype.itemsize)
    s = map2_reduce_sum_prod(g, o, W, fused)
    return (g - s[:, None]) * o


def log_softmax_backward_lastdim(g, o, exp_fn, fused, W=None):
    from fma import fma
    W = W or (default_vector_bytes() // g.dtype.itemsize)
    s = reduce_sum_all(g, W)
    e = exp_fn(o)
    if fused:
        return fma(-e, np.broadcast_to(s[:, None], e.shape), g)
    return g - e * s[:, None]
