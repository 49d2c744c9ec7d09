"""_softmax_backward_data / _log_softmax_backward_data over the last dim.
Model (see notes): log-softmax bwd: grad - exp(out)*sum is one FMA (fnmadd).
softmax bwd: sum = map2_reduce_all(g*o): float32 -> the masked tail step is an
FMA only when parallel_for runs the body inline (1 thread, or outer_size == 1);
float64 -> never fused."""
import sys; sys.path.insert(0, __import__('os').path.dirname(__import__('os').path.abspath(__file__)))
import numpy as np, torch
from sleef_oracle import sleef_exp
from softmax_emul import softmax_backward_lastdim, log_softmax_backward_lastdim
torch.set_num_threads(int(sys.argv[1]) if len(sys.argv) > 1 else 1)
nt = torch.get_num_threads()
rng = np.random.default_rng(5)
Ns = [1,3,8,15,16,17,31,32,33,64,100,1000,4097]
Cs = [1,3,8,16,64,100]
res = {}
for dt in (np.float32, np.float64):
    shapes = [(N, C) for N in Ns for C in Cs] + [(3, n) for n in Ns] + [(1, n) for n in (17, 33, 100, 4097)]
    for (N, C) in shapes:
        if dt == np.float64 and N * C > 20000: continue   # Fraction-based fma64 is slow
        x = torch.from_numpy((rng.standard_normal((N, C)) * 3).astype(dt))
        g = (rng.standard_normal((N, C))).astype(dt)
        o = torch.softmax(x, -1); lo = torch.log_softmax(x, -1)
        got = torch._softmax_backward_data(torch.from_numpy(g), o, -1, o.dtype).numpy()
        got_l = torch._log_softmax_backward_data(torch.from_numpy(g), lo, -1, o.dtype).numpy()
        inline = (nt == 1 or N == 1)
        fused = ('tail' if inline else False) if dt == np.float32 else False
        k = ('softmax_bwd', dt.__name__)
        e = softmax_backward_lastdim(g, o.numpy(), fused)
        r = res.setdefault(k, [0, 0]); r[0] += np.array_equal(got, e); r[1] += 1
        k = ('log_softmax_bwd', dt.__name__)
        e = log_softmax_backward_lastdim(g, lo.numpy(), sleef_exp, True)
        r = res.setdefault(k, [0, 0]); r[0] += np.array_equal(got_l, e); r[1] += 1
print(torch.backends.cpu.get_cpu_capability(), 'threads', nt)
for k, v in res.items(): print(k, 'exact cases %d/%d' % tuple(v))
sys.exit(0 if all(v[0] == v[1] for v in res.values()) else 1)
