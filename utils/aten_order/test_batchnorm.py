"""native_batch_norm (training) and native_batch_norm_backward (training) against
batchnorm_emul.py, float32 and float64, contiguous inputs.  argv[1] = thread
count (the 2-D / image_size == 1 kernels depend on it).  Prints cases and
mismatches per op/output/dtype, then the number of cases each rejected
alternative gets wrong (each must be > 0: the test can tell them apart).
Exit status 1 on any mismatch of the model (or if a control never fails)."""
import sys; sys.path.insert(0, __import__('os').path.dirname(__import__('os').path.abspath(__file__)))
import numpy as np, torch
import batchnorm_emul as E

torch.set_num_threads(int(sys.argv[1]) if len(sys.argv) > 1 else 1)
T = torch.get_num_threads()
rng = np.random.default_rng(31)


def gen(shape, dt, style):
    if style == 'spread':     # magnitudes e^-8 .. e^8: order of the sums matters
        return (rng.standard_normal(shape) * np.exp(rng.uniform(-8, 8, shape))).astype(dt)
    # offset data: cancellation in x - mean, so the variance's rounding shows
    return (3 + rng.standard_normal(shape) * np.exp(rng.uniform(-2, 2, shape))).astype(dt)


def eq(a, b):
    return np.asarray(a).tobytes() == np.asarray(b).tobytes()


shapes = [(N, C) + ((HW,) if HW > 1 else ()) for N in (1, 2, 5, 17) for C in (1, 3, 8, 16, 17, 64)
          for HW in (1, 3, 7, 16, 49, 64, 100)]
shapes += [(2, 3, 4, 5), (5, 17, 7, 7), (3, 8, 1, 1), (17, 17, 1, 1), (40, 9), (40, 33), (100, 24),
           (2, 2100), (3, 2049), (2, 2048), (3, 500), (4, 20), (1000, 17), (333, 8)]   # (M <= T rows: paths B / C)

res = {}
ctl = {}


def rec(k, ok):
    r = res.setdefault(k, [0, 0])
    r[0] += 0 if ok else 1
    r[1] += 1


def ctl_rec(k, ok):
    ctl[k] = ctl.get(k, 0) + (0 if ok else 1)


for dt in (np.dtype(np.float32), np.dtype(np.float64)):
    for ci, shp in enumerate(shapes):
        N, C = shp[:2]
        HW = int(np.prod(shp[2:])) if len(shp) > 2 else 1
        big = N * C * HW > 20000
        style = 'spread' if ci % 2 else 'offset'
        x = gen(shp, dt, style)
        affine = ci % 3 != 0
        w = gen(C, dt, 'spread') if affine else None
        b = gen(C, dt, 'spread') if affine else None
        rm, rv = gen(C, dt, 'spread'), np.abs(gen(C, dt, 'spread'))
        mom, eps = (0.1, 1e-5) if ci % 5 else (0.3, 0.0)
        trm, trv = torch.from_numpy(rm.copy()), torch.from_numpy(rv.copy())
        tw = None if w is None else torch.from_numpy(w)
        tb = None if b is None else torch.from_numpy(b)
        tx = torch.from_numpy(x)
        y, sm, si = torch.ops.aten.native_batch_norm(tx, tw, tb, trm, trv, True, mom, eps)
        ey, esm, esi, erm, erv = E.batch_norm_train(x, w, b, rm, rv, mom, eps, T)
        for name, a, e in (('y', y, ey), ('save_mean', sm, esm), ('save_invstd', si, esi),
                           ('running_mean', trm, erm), ('running_var', trv, erv)):
            rec(('fwd', name, dt.name), eq(a.numpy(), e))
        # --- forward controls
        if dt == np.float32:
            n = N * HW
            _, vs = (E.collect_stats_channels_last(x.reshape(N, C), T) if HW == 1 else E.collect_stats_contiguous(x.reshape(N, C, HW)))
            var = (vs / dt.type(n)).astype(dt)
            with np.errstate(all='ignore'):
                inv_f = np.where((var != 0) | (eps != 0), dt.type(1) / np.sqrt(var + dt.type(eps)), dt.type(0)).astype(dt)
                ctl_rec('fwd f32 invstd computed in float', eq(si.numpy(), inv_f))
                m32 = dt.type(mom)
                ub = (vs / dt.type(n - 1)).astype(dt)
                ctl_rec('fwd f32 running_var all in float', eq(trv.numpy(), (m32 * ub + (dt.type(1) - m32) * rv).astype(dt)))
                ctl_rec('fwd f32 running_mean in double', eq(trm.numpy(), (mom * esm.astype(np.float64) + (1 - mom) * rm.astype(np.float64)).astype(dt)))
        if not big:
            alpha, beta = E.linear_terms(esm, esi, w, b)
            x3 = x.reshape(N, C, HW)
            ctl_rec('fwd y = x*alpha + beta unfused', eq(y.numpy(), (x3 * alpha[None, :, None] + beta[None, :, None]).reshape(shp)))
            beta2 = ((np.zeros(C, dt) if b is None else b) - esm * alpha).astype(dt)
            ctl_rec('fwd beta = b - mean*alpha unfused', eq(y.numpy(), E.fma(x3, np.broadcast_to(alpha[None, :, None], x3.shape), np.broadcast_to(beta2[None, :, None], x3.shape)).reshape(shp)))
            if HW > 1:
                if dt == np.float64:
                    for vf in (False, True):
                        m2, v2 = E.collect_stats_contiguous(x3, var_fuse=vf)
                        ctl_rec('fwd f64 contiguous var fused=%s (not VF=2 pattern)' % vf, eq(si.numpy(), E.update_stats(m2, v2, N * HW, None, None, mom, eps)[1]))
                else:
                    s32 = np.zeros(C, dt)
                    for n in range(N):
                        for i in range(HW):
                            s32 = s32 + x3[n, :, i]
                    ctl_rec('fwd f32 contiguous mean summed in float', eq(sm.numpy(), (s32 / dt.type(N * HW)).astype(dt)))
            else:
                x2 = x.reshape(N, C)
                if N > T:
                    m2, v2 = E.collect_stats_channels_last(x2, T, var_fused=False)
                    ctl_rec('fwd 2-D buffer path var unfused', eq(si.numpy(), E.update_stats(m2, v2, N, None, None, mom, eps)[1]))
                    m2, v2 = E.collect_stats_channels_last(x2, 1)
                    if T > 1:
                        ctl_rec('fwd 2-D stats as if 1 thread (T > 1 only)', eq(sm.numpy(), m2) and eq(si.numpy(), E.update_stats(m2, v2, N, None, None, mom, eps)[1]))
                elif N > 1:
                    other = 'C' if (T == 1 or C <= 16 or C > 2048) else 'B'
                    m2, v2 = E.collect_stats_channels_last(x2, T, small_path=other)
                    ctl_rec('fwd 2-D M <= T other small path', eq(sm.numpy(), m2) and eq(si.numpy(), E.update_stats(m2, v2, N, None, None, mom, eps)[1]))
        # --- backward
        go = gen(shp, dt, 'spread')
        tgo = torch.from_numpy(go)
        gi, gw, gb = torch.ops.aten.native_batch_norm_backward(tgo, tx, tw, trm, trv, sm, si, True, eps, [True, True, True])
        egi, egw, egb = E.batch_norm_backward_train(go, x, w, sm.numpy(), si.numpy(), T)
        for name, a, e in (('grad_input', gi, egi), ('grad_weight', gw, egw), ('grad_bias', gb, egb)):
            rec(('bwd', name, dt.name), eq(a.numpy(), e))
        if not big:
            if HW > 1:
                for df in (False, True, 'body'):
                    a2 = E.batch_norm_backward_train(go, x, w, sm.numpy(), si.numpy(), T, dotp_fused=df)
                    ctl_rec('bwd contiguous dotp fused=%s (not tail-only)' % df, eq(gw.numpy(), a2[1]) and eq(gi.numpy(), a2[0]))
                a2 = E.batch_norm_backward_train(go, x, w, sm.numpy(), si.numpy(), T, gi_fused=False)
                ctl_rec('bwd contiguous grad_input unfused', eq(gi.numpy(), a2[0]))
            else:
                for gf in (False, True):
                    a2 = E.batch_norm_backward_train(go, x, w, sm.numpy(), si.numpy(), T, gi_fused=gf)
                    ctl_rec('bwd 2-D grad_input fused=%s (not full-vectors-only)' % gf, eq(gi.numpy(), a2[0]))
                a2 = E.batch_norm_backward_train(go, x, w, sm.numpy(), si.numpy(), T, dotp_fused=False)
                ctl_rec('bwd 2-D dotp unfused', eq(gw.numpy(), a2[1]))
                if T > 1 and N > 1:
                    a2 = E.batch_norm_backward_train(go, x, w, sm.numpy(), si.numpy(), 1)
                    ctl_rec('bwd 2-D as if 1 thread (T > 1 only)', eq(gw.numpy(), a2[1]) and eq(gb.numpy(), a2[2]) and eq(gi.numpy(), a2[0]))

print('threads', T, 'capability', torch.backends.cpu.get_cpu_capability())
bad = 0
for k, (m, n) in sorted(res.items(), key=str):
    print(k, 'cases', n, 'mismatches', m)
    bad += m
print('controls (rejected alternatives): cases they get wrong (each must be > 0)')
for k, v in ctl.items():
    print('   ', k, v)
sys.exit(1 if bad or not all(ctl.values()) else 0)
