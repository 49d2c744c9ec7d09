import sys, numpy as np, torch
sys.path.insert(0, __import__('os').path.dirname(__import__('os').path.abspath(__file__)))
from sum_emul import inner_sum, outer_sum, full_sum
torch.set_num_threads(int(sys.argv[1]) if len(sys.argv) > 1 else 1)
nt = torch.get_num_threads()
rng = np.random.default_rng(2)
res = {'div': 0, 'mulrecip': 0}; tot = 0
for dt in (np.float32, np.float64):
    for N in [1,3,8,15,16,17,31,32,33,64,100,1000,4097]:
        for C in [1,3,8,16,64,100]:
            x = (rng.standard_normal((N, C)) * 3 + 1).astype(dt); t = torch.from_numpy(x)
            for name, got, s, n in [('inner', t.mean(1).numpy(), inner_sum(x), C),
                                    ('outer', t.mean(0).numpy(), outer_sum(x, num_threads=nt), N),
                                    ('full', np.asarray(t.mean().numpy()), np.asarray(full_sum(x, num_threads=nt), dt), N * C)]:
                tot += 1
                d = s / dt(n); m = s * (dt(1) / dt(n))
                res['div'] += np.array_equal(got, d)
                res['mulrecip'] += np.array_equal(got, m)
print('threads', nt, 'cases', tot, 'matches:', res)
# multi-dim sums: [A,B,C] over dim 1 and over (0,2)
bad = 0
for dt in (np.float32, np.float64):
    for (A, B, C) in [(3, 17, 33), (5, 100, 8), (2, 33, 100)]:
        x = (rng.standard_normal((A, B, C)) * np.exp(rng.uniform(-6, 6, (A, B, C)))).astype(dt); t = torch.from_numpy(x)
        # dim 1: per a, an outer reduction of the [B, C] plane
        e1 = np.stack([outer_sum(x[a]) for a in range(A)])
        bad += not np.array_equal(t.sum(1).numpy(), e1)
        # dims (0,2): loop planes [C, A] per b: vectorized/scalar inner sums of each (a, :, b)... see notes
        e2 = np.zeros(B, dt)
        for b in range(B):
            acc = dt(0)
            for a in range(A):
                acc = dt(acc + inner_sum(x[a, b][None, :])[0])
            e2[b] = acc
        bad += not np.array_equal(t.sum((0, 2)).numpy(), e2)
print('multi-dim sum mismatches', bad, 'of', 12)
sys.exit(0 if res['div'] == tot and bad == 0 else 1)
