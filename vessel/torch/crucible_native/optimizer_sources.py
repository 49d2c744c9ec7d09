"""Optimizer scalar sources: the Python floats recognized optimizers compute each step and pass
to ops (learning rate, bias corrections), replicated so that a plan can take them as patch
points instead of freezing them."""
import math

class ScalarSources:
    """Python's replica of the scalar arithmetic of recognized optimizers (single-tensor SGD,
    Adam and AdamW of PyTorch 1.13 and 2.x): the Python floats they compute from the group's
    hyperparameters and the step counter (state["step"]) and pass to ops. Each value is named
    by the op and argument it feeds:
      SGD        param.add_(d_p, alpha=-lr)                       aten::add_.Tensor / alpha
      Adam(W)    param.addcdiv_(exp_avg, denom, value=-step_size)  aten::addcdiv_ / value
                 exp_avg_sq.sqrt() / sqrt(1 - beta2**step)         aten::div.Tensor / other
      AdamW      param.mul_(1 - lr * weight_decay)                 aten::mul_.Tensor / other
    A plan matches them bit for bit against recorded calls: a scalar that differs between two
    calls and equals a source's values becomes a patch point, and each run gets the sources'
    values for the coming step. Groups with foreach, fused, capturable or differentiable
    updates compute differently and are not replicated (their changing scalars stay
    unexplained, and the step runs eagerly)."""

    def __init__(self, objs):
        import torch
        self._opts = [o for o in objs if type(o) in (torch.optim.SGD, torch.optim.Adam, torch.optim.AdamW)]
        self._sgd = torch.optim.SGD
        self._adamw = torch.optim.AdamW

    def __bool__(self):
        return bool(self._opts)

    def values(self, upcoming: bool) -> list:
        """(op, argument, value, anchor) per source; the anchor is the data pointer of the
        tensor the value belongs to (the parameter; exp_avg_sq for the bias correction)."""
        out = []
        for opt in self._opts:
            sgd, adamw = type(opt) is self._sgd, type(opt) is self._adamw
            for g in opt.param_groups:
                if g.get("foreach") or g.get("fused") or g.get("capturable") or g.get("differentiable"):
                    continue
                lr = g["lr"]
                if sgd:
                    out.extend(("aten::add_.Tensor", "alpha", -lr, p.data_ptr()) for p in g["params"])
                    continue
                beta1, beta2 = g["betas"]
                decay = 1 - lr * g["weight_decay"]
                for p in g["params"]:
                    st = opt.state.get(p)
                    if not st or "step" not in st:
                        continue
                    step = float(st["step"]) + (1.0 if upcoming else 0.0)
                    bias_correction1 = 1 - beta1 ** step
                    bias_correction2 = 1 - beta2 ** step
                    step_size = lr / bias_correction1
                    sq = st.get("max_exp_avg_sq", st.get("exp_avg_sq"))
                    sq = sq.data_ptr() if sq is not None else 0
                    out.append(("aten::addcdiv_", "value", -step_size, p.data_ptr()))
                    out.append(("aten::div.Tensor", "other", math.sqrt(bias_correction2), sq))  # 1.13
                    out.append(("aten::div.Tensor", "other", bias_correction2 ** 0.5, sq))     # 2.x
                    if adamw:
                        out.append(("aten::mul_.Tensor", "other", decay, p.data_ptr()))
        return out

