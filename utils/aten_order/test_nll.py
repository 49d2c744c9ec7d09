"""nll_loss_forward / nll_loss_backward (no weight, ignore_index -100) against
nll_emul.py.  argv[1] = thread count (the reduction is serial; checked anyway).
Controls (each must fail somewhere, so the test can tell the exact order apart):
a plain sequential sum ((0 - x0) - x1) - ...; the same 8-level cascade carrying
on b+1 instead of b; mean computed as sum * (1/total_weight)."""
import sys; sys.path.insert(0, __import__('os').path.dirname(__import__('os').path.abspath(__file__)))
import numpy as np, torch
from nll_emul import nll_loss_forward, nll_loss_backward
torch.set_num_threads(int(sys.argv[1]) if len(sys.argv) > 1 else 1)
rng = np.random.default_rng(21)
Ns = [1, 2, 3, 15, 16, 17, 18, 31, 32, 33, 47, 100, 255, 256, 257, 1000, 4095, 4096, 4097, 5000]
Cs = [1, 3, 10]


def eq(a, b):
    return np.asarray(a).tobytes() == np.asarray(b).tobytes()


res = {}
control = {}


def rec(k, ok):
    r = res.setdefault(k, [0, 0])
    r[0] += 0 if ok else 1
    r[1] += 1


for dt in (np.dtype(np.float32), np.dtype(np.float64)):
    for N in Ns:
        for C in Cs:
            for ign in (False, True):
                if ign and N < 3:
                    continue
                x = (rng.standard_normal((N, C)) * np.exp(rng.uniform(-8, 8, (N, C)))).astype(dt)
                t = rng.integers(0, C, N).astype(np.int64)
                if ign:
                    t[rng.random(N) < 0.2] = -100
                tx, tt = torch.from_numpy(x), torch.from_numpy(t)
                for red in (1, 2):
                    out, tw = torch.ops.aten.nll_loss_forward(tx, tt, None, red, -100)
                    eo, etw = nll_loss_forward(x, t, red)
                    rec(('fwd', dt.name, 'mean' if red == 1 else 'sum'), eq(out.numpy(), eo) and eq(tw.numpy(), etw))
                    # control: plain sequential sum
                    s = dt.type(0)
                    for b in range(N):
                        if t[b] != -100:
                            s = dt.type(s - x[b, t[b]])
                    if red == 1:
                        with np.errstate(all='ignore'):
                            s = dt.type(s / etw)
                    control[dt.name] = control.get(dt.name, 0) + (not eq(out.numpy(), s))
                    # control 2: the same cascade but carrying on (b+1) (i.e. without the b = 0 quirk)
                    L = [dt.type(0)] * 8
                    for b in range(N):
                        if t[b] == -100:
                            continue
                        L[0] = dt.type(L[0] - x[b, t[b]])
                        for j in range(7):
                            if (b + 1) & (15 << (4 * j)):
                                break
                            L[j + 1] = dt.type(L[j + 1] + L[j]); L[j] = dt.type(0)
                    s2 = dt.type(0)
                    for v in L:
                        s2 = dt.type(s2 + v)
                    if red == 1:
                        with np.errstate(all='ignore'):
                            s2 = dt.type(s2 / etw)
                    control['b+1 ' + dt.name] = control.get('b+1 ' + dt.name, 0) + (not eq(out.numpy(), s2))
                    if red == 1:   # control 3: mean as sum * (1/total_weight)
                        o2, _ = nll_loss_forward(x, t, 2)
                        with np.errstate(all='ignore'):
                            o3 = dt.type(o2 * dt.type(dt.type(1) / etw))
                        control['recip ' + dt.name] = control.get('recip ' + dt.name, 0) + (not eq(out.numpy(), o3))
                    go = torch.tensor(rng.standard_normal() * np.exp(rng.uniform(-4, 4)), dtype=tx.dtype)
                    gi = torch.ops.aten.nll_loss_backward(go, tx, tt, None, red, -100, tw)
                    egi = nll_loss_backward(go.numpy(), x, t, red, tw.numpy())
                    rec(('bwd', dt.name, 'mean' if red == 1 else 'sum'), eq(gi.numpy(), egi))
                # reduction none
                out, tw = torch.ops.aten.nll_loss_forward(tx, tt, None, 0, -100)
                rec(('fwd', dt.name, 'none'), eq(out.numpy(), nll_loss_forward(x, t, 0)[0]))
    # 1-D input, 0-D target
    for C in (1, 5):
        x = (rng.standard_normal(C) * 10).astype(dt)
        t = np.array(C - 1, np.int64)
        for red in (1, 2):
            out, tw = torch.ops.aten.nll_loss_forward(torch.from_numpy(x), torch.from_numpy(t), None, red, -100)
            eo, etw = nll_loss_forward(x, t, red)
            rec(('fwd1d', dt.name, red), eq(out.numpy(), eo) and eq(tw.numpy(), etw))

print('threads', torch.get_num_threads())
bad = 0
for k, (m, n) in sorted(res.items(), key=str):
    print(k, 'cases', n, 'mismatches', m)
    bad += m
print('controls (plain sequential sum; cascade carrying on b+1; mean by reciprocal) mismatching cases:', control, '(each must be > 0)')
sys.exit(1 if bad or not all(control.values()) else 0)
