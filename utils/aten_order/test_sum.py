import sys, numpy as np, torch
sys.path.insert(0, __import__('os').path.dirname(__import__('os').path.abspath(__file__)))
from sum_emul import inner_sum, outer_sum, full_sum
nt = int(sys.argv[1]) if len(sys.argv) > 1 else 1
torch.set_num_threads(nt)
rng = np.random.default_rng(0)
Ns = [1,3,8,15,16,17,31,32,33,64,100,1000,4097]
Cs = [1,3,8,16,64,100]
def gen(shape, dt):
    # mixed magnitudes so that summation order matters
    return (rng.standard_normal(shape) * np.exp(rng.uniform(-8, 8, shape))).astype(dt)
bad = []; tot = 0
for dt in (np.float32, np.float64):
    for N in Ns:
        for C in Cs:
            x = gen((N, C), dt); t = torch.from_numpy(x)
            a = t.sum(1).numpy(); e = inner_sum(x)
            tot += 1
            if not np.array_equal(a.view(np.uint8), e.view(np.uint8)): bad.append(('inner', dt.__name__, N, C, int((a != e).sum())))
            a = t.sum(0).numpy(); e = outer_sum(x, num_threads=torch.get_num_threads())
            tot += 1
            if not np.array_equal(a.view(np.uint8), e.view(np.uint8)): bad.append(('outer', dt.__name__, N, C, int((a != e).sum())))
            a = t.sum().numpy(); e = full_sum(x, num_threads=torch.get_num_threads())
            tot += 1
            if a.tobytes() != np.asarray(e, dt).tobytes(): bad.append(('full', dt.__name__, N, C))
    # larger full reductions (two-pass threshold 32768) and long rows
    for n in [32767, 32768, 40000, 100003, 1 << 20]:
        x = gen((n,), dt); t = torch.from_numpy(x)
        a = t.sum().numpy(); e = full_sum(x, num_threads=torch.get_num_threads()); tot += 1
        if a.tobytes() != np.asarray(e, dt).tobytes(): bad.append(('full1d', dt.__name__, n))
    for (N, C) in [(2, 50000), (40000, 3), (5000, 100), (70000, 1)]:
        x = gen((N, C), dt); t = torch.from_numpy(x)
        a = t.sum(1).numpy(); e = inner_sum(x); tot += 1
        if not np.array_equal(a.view(np.uint8), e.view(np.uint8)): bad.append(('inner', dt.__name__, N, C))
        a = t.sum(0).numpy(); e = outer_sum(x, num_threads=torch.get_num_threads()); tot += 1
        if not np.array_equal(a.view(np.uint8), e.view(np.uint8)): bad.append(('outer', dt.__name__, N, C))
print('threads', torch.get_num_threads(), 'cases', tot, 'mismatches', len(bad))
for b in bad[:40]: print(b)
sys.exit(1 if bad else 0)
