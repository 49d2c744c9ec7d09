"""Exact fused multiply-add emulation: fma(a, b, c) = round(a*b + c) with one rounding."""
import numpy as np
from fractions import Fraction


def fma32(a, b, c):
    a = np.asarray(a, np.float32).astype(np.float64)
    b = np.asarray(b, np.float32).astype(np.float64)
    c = np.asarray(c, np.float32).astype(np.float64)
    p = a * b                      # exact: 24+24 bit mantissas fit in 53
    s = p + c
    # TwoSum error term (exact)
    bb = s - p
    err = (p - (s - bb)) + (c - bb)
    # round-to-odd: if inexact and s has an even last bit, step toward err
    bits = s.view(np.int64)
    inexact = (err != 0) & ((bits & 1) == 0) & np.isfinite(s)
    s_odd = np.where(inexact, np.nextafter(s, np.where(err > 0, np.inf, -np.inf)), s)
    return s_odd.astype(np.float32)  # 53 >= 24 + 2, so this single rounding is correct


def fma64(a, b, c):
    a, b, c = np.broadcast_arrays(np.asarray(a, np.float64), np.asarray(b, np.float64), np.asarray(c, np.float64))
    out = np.empty(a.shape, np.float64)
    fa, fb, fc, fo = a.reshape(-1), b.reshape(-1), c.reshape(-1), out.reshape(-1)
    for i in range(fa.size):
        x, y, z = float(fa[i]), float(fb[i]), float(fc[i])
        if not (np.isfinite(x) and np.isfinite(y) and np.isfinite(z)):
            fo[i] = x * y + z
        else:
            fo[i] = float(Fraction(x) * Fraction(y) + Fraction(z))
    return out


def fma(a, b, c):
    dt = np.result_type(a, b, c)
    return fma32(a, b, c) if dt == np.float32 else fma64(a, b, c)
