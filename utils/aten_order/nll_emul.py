"""Bit-exact numpy emulation of ATen CPU nll_loss_forward / nll_loss_backward
(float32/float64, 2-D input (N, C) or 1-D input (C,), int64 target, no class
weight, ignore_index default -100), torch 2.13 (LossNLL.cpp, nll_loss_out_frame /
nll_loss_backward_out_frame: generic TU, scalar code, no threads in the reduction).

Forward, reduction = mean (1) or sum (2):
    level_power = max(4, CeilLog2(N) // 8);  step = 1 << level_power;  mask = step - 1
    L[0..7] = 0                      # loss partial sums, dtype T (float for float32: NO double)
    num_ignored = 0
    for b in 0..N-1:
        t = target[b]
        if t == ignore_index: num_ignored += 1; continue      # NOTE: skips the carry below too
        L[0] = L[0] - x[b, t]                                  # '-=' : one rounding
        for j in 0..6:                                         # carry, looked at AFTER the add
            if b & (mask << (j*level_power)) != 0: break
            L[j+1] = L[j+1] + L[j]; L[j] = 0
    total_weight = T(N - num_ignored)                          # int64 -> T
    out = (((((((0 + L[0]) + L[1]) + L[2]) + L[3]) + L[4]) + L[5]) + L[6]) + L[7]   # std::accumulate
    if mean: out = out / total_weight                          # true IEEE division in T
    returns (out, total_weight)
  (b is the batch index, so b = 0 carries x[0] all the way up to L[7]; the carries
   after b = 16, 32, ... move x[1..16], x[17..32], ... (16 elements each) up one level.)
    reduction = none: out[b] = -x[b, t] (0 where ignored).

Backward (grad_input zero-filled first):
    mean: g = -(grad_output / total_weight);  sum: g = -grad_output;   (in T)
    grad_input[b, target[b]] = g for every non-ignored b (same value everywhere).
    none: grad_input[b, t] = -grad_output[b]   (-w * go with w = 1: exact)
"""
import numpy as np


def ceil_log2(x):
    return 1 if x <= 2 else int(x - 1).bit_length()


def nll_loss_forward(x, target, reduction=1, ignore_index=-100):
    x = np.asarray(x)
    dt = x.dtype
    if x.ndim == 1:
        x = x.reshape(1, -1)
        target = np.asarray(target).reshape(1)
    target = np.asarray(target, np.int64)
    N = x.shape[0]
    if reduction == 0:
        out = np.where(target == ignore_index, dt.type(0),
                       -x[np.arange(N), np.where(target == ignore_index, 0, target)])
        return out.astype(dt), dt.type(0)
    if N == 0:
        return (dt.type(np.nan) if reduction == 1 else dt.type(0)), dt.type(0)
    levels = 8
    level_power = max(4, ceil_log2(N) // levels)
    mask = (1 << level_power) - 1
    L = [dt.type(0)] * levels
    ignored = 0
    for b in range(N):
        t = int(target[b])
        if t == ignore_index:
            ignored += 1
            continue
        L[0] = dt.type(L[0] - x[b, t])
        for j in range(levels - 1):
            if b & (mask << (j * level_power)):
                break
            L[j + 1] = dt.type(L[j + 1] + L[j])
            L[j] = dt.type(0)
    tw = dt.type(N - ignored)
    out = dt.type(0)
    for v in L:
        out = dt.type(out + v)
    if reduction == 1:
        with np.errstate(divide='ignore', invalid='ignore'):
            out = dt.type(out / tw)
    return out, tw


def nll_loss_backward(grad_output, x, target, reduction, total_weight, ignore_index=-100):
    x = np.asarray(x)
    dt = x.dtype
    gi = np.zeros_like(x)
    x2 = gi.reshape(1, -1) if x.ndim == 1 else gi
    target = np.asarray(target, np.int64).reshape(-1)
    go = np.asarray(grad_output, dt)
    if reduction == 0 and x.ndim == 2:
        for b in range(x2.shape[0]):
            if target[b] != ignore_index:
                x2[b, target[b]] = -go.reshape(-1)[b]
        return gi
    g0 = dt.type(go.reshape(-1)[0])
    with np.errstate(divide='ignore', invalid='ignore'):
        g = -(dt.type(g0 / dt.type(total_weight)) if reduction == 1 else g0)
    for b in range(x2.shape[0]):
        if target[b] != ignore_index:
            x2[b, target[b]] = g
    return gi
