"""A training step's state as bytes: what test_exec_plan.py and bench/python/exec_plan_bench.py
bind an exec plan's inputs from and compare its results with."""
import torch


def storage_bytes(t):
    """The whole storage behind `t`, as a uint8 tensor sharing it."""
    s = t.untyped_storage()
    u = torch.empty(0, dtype=torch.uint8)
    u.set_(s, 0, (s.nbytes(),))
    return u


def state_tensors(s):
    """Every tensor a step of setup `s` reads or writes that Python holds: buffers (batch norm's
    running statistics), parameters and their gradients, the optimizer's state."""
    out = list(s.model.buffers())
    for p in s.model.parameters():
        out.append(p)
        if p.grad is not None:
            out.append(p.grad)
    for st in s.opt.state.values():
        out += [v for v in st.values() if isinstance(v, torch.Tensor)]
    return out
