"""Bit-exact numpy emulation of ATen CPU cascade_sum (SumKernel.cpp) for
float32/float64 contiguous tensors, torch 2.13 on x86 (sum_stub is registered
with REGISTER_DISPATCH, so on AVX512 hosts the AVX2 kernel runs: W = 32 bytes).

All arithmetic is done with numpy arrays of the tensor dtype: elementwise
`a += b` on float32/float64 arrays is a single IEEE add per element (no FMA,
no extra precision), which is exactly what the kernel does lane by lane.
A leading "batch" axis is used to run many independent reductions at once
(rows of an inner reduction, columns of an outer one); it never mixes data.
"""
import numpy as np


def ceil_log2(x):
    # c10 utils::CeilLog2: x <= 2 -> 1, else floor(log2(x-1)) + 1
    return 1 if x <= 2 else int(x - 1).bit_length()


def multi_row_sum(load, size, like):
    """load(i) -> array shaped like `like` (the nrows accumulators, any
    extra lane/batch axes).  Returns the 4-level cascade result."""
    num_levels = 4
    level_power = max(4, ceil_log2(size) // num_levels)
    level_step = 1 << level_power
    level_mask = level_step - 1
    acc = [np.zeros_like(like) for _ in range(num_levels)]
    i = 0
    while i + level_step <= size:
        for _ in range(level_step):
            acc[0] += load(i)
            i += 1
        for j in range(1, num_levels):
            acc[j] += acc[j - 1]
            acc[j - 1][...] = 0
            if i & (level_mask << (j * level_power)):
                break
    while i < size:
        acc[0] += load(i)
        i += 1
    for j in range(1, num_levels):
        acc[0] += acc[j]
    return acc[0]


def row_sum(load, size, like):
    """ILP-4 row sum; load(i) -> one element (shape `like`)."""
    ilp = 4
    size_ilp = size // ilp
    like4 = np.zeros((ilp,) + like.shape, like.dtype)
    partial = multi_row_sum(
        lambda i: np.stack([load(i * ilp + k) for k in range(ilp)]), size_ilp, like4)
    for i in range(size_ilp * ilp, size):
        partial[0] += load(i)
    for k in range(1, ilp):
        partial[0] += partial[k]
    return partial[0]


def vec_width(dtype, vector_bytes=32):
    return vector_bytes // np.dtype(dtype).itemsize


def inner_sum(x, vector_bytes=32):
    """x: [B, n] contiguous, reduce last dim -> [B] (also full reduction with B=1)."""
    x = np.ascontiguousarray(x)
    B, n = x.shape
    dt = x.dtype
    W = vec_width(dt, vector_bytes)
    if n >= W:  # vectorized_inner_sum
        vec_size = n // W
        like = np.zeros((B, W), dt)
        vacc = row_sum(lambda i: x[:, i * W:(i + 1) * W], vec_size, like)
        final = np.zeros(B, dt)
        for k in range(vec_size * W, n):       # scalar tail first ...
            final += x[:, k]
        for lane in range(W):                  # ... then lanes 0..W-1
            final += vacc[:, lane]
    else:  # scalar_inner_sum
        final = row_sum(lambda i: x[:, i], n, np.zeros(B, dt))
    out = np.zeros(B, dt)
    out += final  # CastStoreAccumulate onto zero-filled output
    return out


def outer_sum(x, vector_bytes=32, num_threads=1):
    """x: [n, C] contiguous, reduce dim 0 -> [C]."""
    x = np.ascontiguousarray(x)
    n, C = x.shape
    dt = x.dtype
    W = vec_width(dt, vector_bytes)
    if C == 1:
        # [n,1] coalesces to a 1-D full reduction (two-pass if threaded)
        return np.array([full_sum(x, vector_bytes, num_threads)], dt)
    out = np.zeros(C, dt)
    if C >= W:   # vectorized_outer_sum: blocks of 4W cols, then W cols, then scalars
        nb = (C // (4 * W)) * 4 * W
    else:        # scalar_outer_sum: blocks of 4 cols, then scalars
        nb = (C // 4) * 4
    if nb:
        out[:nb] += multi_row_sum(lambda i: x[i, :nb], n, np.zeros(nb, dt))
    if nb < C:
        out[nb:] += row_sum(lambda i: x[i, nb:], n, np.zeros(C - nb, dt))
    return out


def full_sum(x, vector_bytes=32, num_threads=1, grain=32768):
    x = np.ascontiguousarray(x).reshape(-1)
    numel = x.size
    if num_threads == 1 or numel < grain:
        return inner_sum(x.reshape(1, -1), vector_bytes)[0]
    # two_pass_reduction: at::parallel_for(0, numel, GRAIN_SIZE) over OpenMP
    nt = min(num_threads, -(-numel // grain))
    chunk = -(-numel // nt)
    buf = np.zeros(num_threads, x.dtype)  # identity-filled, one slot per thread
    for t in range(nt):
        b = t * chunk
        if b < numel:
            buf[t] += inner_sum(x[b:min(numel, b + chunk)].reshape(1, -1), vector_bytes)[0]
    # final reduce of the [max_threads] buffer: same kernel on a 1-D input
    return inner_sum(buf.reshape(1, -1), vector_bytes)[0]
