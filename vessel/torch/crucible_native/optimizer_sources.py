"""Optimizer scalar sources: the Python floats recognized optimizers compute each step and pass
to ops (learning rate, bias corrections), replicated so that a plan can take them as patch
points instead of freezing them."""
import math

class ScalarSources:
    """Python's replica of the scalar arithmetic of recognized optimizers (single-tensor SGD,
    Adam, AdamW, Adadelta, RMSprop and Adagrad of PyTorch 2.x; SGD, Adam and AdamW of 1.13):
    the Python floats they compute from the group's hyperparameters and the step counter
    (state["step"]) and pass to ops; and the foreach SGD, Adadelta and RMSprop, which pass the
    same -lr to aten::_foreach_add_.List's alpha (aten::_foreach_addcdiv_.Scalar's value for
    RMSprop without momentum). Each value is named by the op and argument it feeds:
      SGD        param.add_(d_p, alpha=-lr)                       aten::add_.Tensor / alpha
      Adadelta   param.add_(delta, alpha=-lr)                     aten::add_.Tensor / alpha
      RMSprop    param.add_(buf, alpha=-lr) (momentum), else
                 param.addcdiv_(grad, avg, value=-lr)             aten::addcdiv_ / value
      Adagrad    param.addcdiv_(grad, std, value=-clr),
                 clr = lr / (1 + (step - 1) * lr_decay)          aten::addcdiv_ / value
      Adam(W)    param.addcdiv_(exp_avg, denom, value=-step_size)  aten::addcdiv_ / value
                 exp_avg_sq.sqrt() / sqrt(1 - beta2**step)         aten::div.Tensor / other
      AdamW      param.mul_(1 - lr * weight_decay)                 aten::mul_.Tensor / other
    A plan matches them bit for bit against recorded calls: a scalar that differs between two
    calls and equals a source's values becomes a patch point, and each run gets the sources'
    values for the coming step. Groups with fused, capturable or differentiable updates, and
    foreach Adam, AdamW and Adagrad (lists of per-parameter scalars), are not replicated (their
    changing scalars stay unexplained, and the step runs eagerly)."""

    def __init__(self, objs):
        import torch
        self._kinds = {torch.optim.SGD: "sgd", torch.optim.Adam: "adam", torch.optim.AdamW: "adamw",
                       torch.optim.Adadelta: "adadelta", torch.optim.RMSprop: "rmsprop",
                       torch.optim.Adagrad: "adagrad"}
        self._opts = [o for o in objs if type(o) in self._kinds]

    def __bool__(self):
        return bool(self._opts)

    def optimizers(self) -> list:
        """The recognized optimizers, in the order hyperparameters() and values() walk them."""
        return list(self._opts)

    def hyperparameters(self) -> list:
        """The param groups' hyperparameters now, for values(): a step that changes them itself
        (a scheduler stepped inside it) used the ones it started with."""
        return [[{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups] for opt in self._opts]

    def values(self, upcoming: bool, hyper=None, anchors: bool = True) -> list:
        """(op, argument, value, anchor) per source; the anchor is the data pointer of the
        tensor the value belongs to (the parameter; exp_avg_sq for the bias correction).
        hyper: hyperparameters() taken earlier, used instead of the groups' current ones.
        anchors=False: the values alone, in the same order (what a plan run takes)."""
        out = []
        for oi, opt in enumerate(self._opts):
            kind = self._kinds[type(opt)]
            for gi, g in enumerate(opt.param_groups):
                if hyper is not None and oi < len(hyper) and gi < len(hyper[oi]):
                    g = dict(hyper[oi][gi], params=g["params"])
                terms = _terms(kind, g)
                if terms is None:
                    continue
                per_step, terms = terms
                state, memo, value = opt.state, {}, None
                for p in g["params"]:
                    st = None
                    if per_step:
                        st = state.get(p)
                        if not st or "step" not in st:
                            continue
                        value = float(st["step"]) + (1.0 if upcoming else 0.0)
                    vals = memo.get(value)
                    if vals is None:   # parameters at the same step share their values
                        vals = memo[value] = [f(value) for _, _, f, _ in terms]
                    if not anchors:
                        out.extend(vals)
                        continue
                    for (op, arg, _, anchor), v in zip(terms, vals):
                        if anchor is _SQ:
                            sq = st.get("max_exp_avg_sq", st.get("exp_avg_sq"))
                            out.append((op, arg, v, sq.data_ptr() if sq is not None else 0))
                        else:
                            out.append((op, arg, v, p.data_ptr()))
        return out


_PARAM, _SQ = "param", "exp_avg_sq"   # what a value's anchor is the data pointer of


def _terms(kind, g):
    """The sources of one param group: (per_step, [(op, argument, value(step), anchor)]) with
    per_step when the values depend on each parameter's step counter (a parameter without one
    has none yet); None for a group that is not replicated."""
    if g.get("fused") or g.get("capturable") or g.get("differentiable"):
        return None
    foreach = bool(g.get("foreach"))
    if foreach and kind not in ("sgd", "adadelta", "rmsprop"):
        return None   # Adam(W) and Adagrad pass lists of per-parameter scalars
    lr = g["lr"]
    if kind in ("sgd", "adadelta") or (kind == "rmsprop" and g.get("momentum", 0) > 0):
        return False, [("aten::_foreach_add_.List" if foreach else "aten::add_.Tensor", "alpha", lambda _: -lr, _PARAM)]
    if kind == "rmsprop":
        return False, [("aten::_foreach_addcdiv_.Scalar" if foreach else "aten::addcdiv_", "value", lambda _: -lr,
                        _PARAM)]
    if kind == "adagrad":
        lr_decay = g["lr_decay"]
        return True, [("aten::addcdiv_", "value", lambda step: -(lr / (1 + (step - 1) * lr_decay)), _PARAM)]
    beta1, beta2 = g["betas"]
    decay = 1 - lr * g["weight_decay"]
    terms = [("aten::addcdiv_", "value", lambda step: -(lr / (1 - beta1 ** step)), _PARAM),
             ("aten::div.Tensor", "other", lambda step: math.sqrt(1 - beta2 ** step), _SQ),   # 1.13
             ("aten::div.Tensor", "other", lambda step: (1 - beta2 ** step) ** 0.5, _SQ)]     # 2.x
    if kind == "adamw":
        terms.append(("aten::mul_.Tensor", "other", lambda _: decay, _PARAM))
    return True, terms
