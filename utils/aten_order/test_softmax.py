import sys; sys.path.insert(0, __import__('os').path.dirname(__import__('os').path.abspath(__file__)))
import numpy as np, torch
from sleef_oracle import sleef_exp, sleef_log
from softmax_emul import softmax_lastdim, log_softmax_lastdim, reduce_sum_all, default_vector_bytes
torch.set_num_threads(int(sys.argv[1]) if len(sys.argv) > 1 else 1)
rng = np.random.default_rng(4)
Ns = [1,3,8,15,16,17,31,32,33,64,100,1000,4097]
Cs = [1,3,8,16,64,100]
bad_sm = []; bad_lsm = []; bad_lsm_direct = []; log_stats = {'L==torch.log(S)': 0, 'L==np.log(S)': 0, 'rows': 0}; tot = 0
for dt in (np.float32, np.float64):
    shapes = [(N, C) for N in Ns for C in Cs] + [(3, n) for n in Ns]   # long rows too
    for (N, C) in shapes:
        if True:
            x = (rng.standard_normal((N, C)) * 4).astype(dt); t = torch.from_numpy(x)
            tot += 1
            got = torch.softmax(t, -1).numpy()
            exp = softmax_lastdim(x, sleef_exp)
            if not np.array_equal(got, exp): bad_sm.append((dt.__name__, N, C, int((got != exp).sum())))
            got = torch.log_softmax(t, -1).numpy()
            # recover L = log(sum) actually used: output at argmax is (max-max)-L = -L
            am = x.argmax(1)
            L = -got[np.arange(N), am]
            e = sleef_exp(x - x.max(1)[:, None]); S = reduce_sum_all(e, default_vector_bytes() // x.itemsize)
            log_stats['rows'] += N
            log_stats['L==torch.log(S)'] += int((torch.log(torch.from_numpy(S)).numpy() == L).sum())
            log_stats['L==np.log(S)'] += int((np.log(S) == L).sum())
            exp = log_softmax_lastdim(x, sleef_exp, sleef_log)
            if not np.array_equal(got, exp): bad_lsm_direct.append((dt.__name__, N, C, int((got != exp).sum())))
            exp = log_softmax_lastdim(x, sleef_exp, lambda s: L)
            if not np.array_equal(got, exp): bad_lsm.append((dt.__name__, N, C, int((got != exp).sum())))
print(torch.backends.cpu.get_cpu_capability(), 'threads', torch.get_num_threads(), 'cases', tot)
print('softmax mismatching cases', len(bad_sm), bad_sm[:20])
print('log_softmax mismatching cases (given recovered L)', len(bad_lsm), bad_lsm[:20])
print('log_softmax mismatching cases (SLEEF log via ctypes)', len(bad_lsm_direct), bad_lsm_direct[:20])
print(log_stats)
sys.exit(1 if bad_sm or bad_lsm or bad_lsm_direct else 0)
