"""Oracles for SLEEF exp/log exactly as used inside ATen's AVX512 softmax kernels,
obtained through torch ops (no compiled helper needed).

sleef_exp(v): _log_softmax_backward_data on rows [v..., pad] with grad row
[0,...,0,-1]: sum = -1 exactly, grad_input = 0 - exp(out) * (-1) = exp(out)
exactly (with or without FMA contraction).  exp is Vectorized<T>::exp ->
Sleef_expf16_u10 / Sleef_expd8_u10 (AVX512 kernel, ALSO_REGISTER_AVX512_DISPATCH).
"""
import numpy as np, torch


def sleef_exp(v):
    v = np.asarray(v)
    dt = v.dtype
    flat = v.reshape(-1)
    out = torch.from_numpy(np.concatenate([flat, np.zeros(1, dt)]).reshape(1, -1))
    grad = torch.zeros_like(out); grad[0, -1] = -1
    gi = torch._log_softmax_backward_data(grad, out, -1, out.dtype)
    return gi[0, :-1].numpy().reshape(v.shape).copy()


# Direct calls into the SLEEF copy statically linked (and exported) in
# libtorch_cpu.so.  Sleef_*f16_u10avx512f take/return __m512 in zmm0; calling
# them through ctypes with a scalar float/double puts the argument in lane 0 of
# xmm0/zmm0 and reads lane 0 of the result, which is all we need (lanes are
# independent).  Verified equal to sleef_exp() above on 40k inputs.
import ctypes, os
_lib = None


def _fn(name, ct):
    global _lib
    if _lib is None:
        _lib = ctypes.CDLL(os.path.join(os.path.dirname(torch.__file__), 'lib', 'libtorch_cpu.so'))
    f = getattr(_lib, name)
    f.argtypes = [ct]
    f.restype = ct
    return f


def sleef_call(name32, name64, v):
    v = np.asarray(v)
    if v.dtype == np.float32:
        f = _fn(name32, ctypes.c_float)
    else:
        f = _fn(name64, ctypes.c_double)
    flat = v.reshape(-1)
    return np.array([f(float(a)) for a in flat], v.dtype).reshape(v.shape)


def sleef_log(v):
    return sleef_call('Sleef_logf16_u10avx512f', 'Sleef_logd8_u10avx512f', v)


def sleef_exp_direct(v):
    return sleef_call('Sleef_expf16_u10avx512f', 'Sleef_expd8_u10avx512f', v)
