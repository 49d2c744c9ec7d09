"""Training loops from a small grammar, and the differential runner that checks crucible.compile
on them: each loop runs eagerly and through crucible.compile(step) from the same seed, and
everything a user can observe must be bit-identical.

A loop is a LoopSpec: a model, one or two optimizers, an LR scheduler stepped inside the step
or by the loop, and step-body features (clipping, gradient accumulation, logging loss.item(),
a Python counter, a branch on a tensor value that flips at one call, train()/eval() between
calls, a smaller last batch of every epoch, an exception part-way through one call, a counting
forward hook, Python/NumPy random augmentation, a tensor made with torch.tensor in the step).
spec(seed) draws one; plain(seed, **fields) is the plainest loop with the named fields set,
for reproducers; minimize(spec) reduces a failing loop to the simplest one that fails the same
way. The step is generated as Python source (LoopSpec.source()), so a loop's description is
the code it runs.

    import crucible_loopgen as lg
    r = lg.check(lg.spec(17))      # -> Result: outcome, first difference, compile stats
    print(r.report())

Outcomes: "compiled" (plans ran, everything matches), "refused" (matches, no plan ran, and
compile said why: a refusal or a CrucibleWarning), "eager-unexplained" (matches, no plan ran,
nothing said why), "mismatch" (something differs: a silent wrong result), "crash" (the compiled
run raised where eager did not, or raised something else). The last two are failures.
"""
from __future__ import annotations

import dataclasses
import math
import random
import re
import textwrap
import traceback
import warnings

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

MODELS = ("mlp", "cnn_bn", "gru", "lstm", "transformer", "tied")
OPTIMIZERS = ("sgd", "adam", "adamw", "rmsprop", "adagrad", "adadelta")
SCHEDULERS = ("none", "step", "onecycle", "lambda", "cosine", "plateau")
TOKEN_MODELS = ("transformer", "tied")


def _one_hot(out, y):
    return F.one_hot(y, out.shape[-1]).to(out.dtype)


# The losses a loop over class targets may use (not the token models'): cross-entropy, and the
# others on one-hot targets.
LOSSES = {
    "cross_entropy": F.cross_entropy,
    "nll": lambda out, y: F.nll_loss(F.log_softmax(out, -1), y),
    "mse": lambda out, y: F.mse_loss(out, _one_hot(out, y)),
    "smooth_l1": lambda out, y: F.smooth_l1_loss(out, _one_hot(out, y)),
    "huber": lambda out, y: F.huber_loss(out, _one_hot(out, y), delta=0.5),
    "bce": lambda out, y: F.binary_cross_entropy(torch.sigmoid(out), _one_hot(out, y)),
    "bce_logits": lambda out, y: F.binary_cross_entropy_with_logits(out, _one_hot(out, y)),
}
BATCH = 8
VOCAB = 16


class Preempted(Exception):
    """What a step raises when the loop has set side.interrupt (a preemption notice)."""


# --- models (tiny: a loop of a dozen calls runs in milliseconds) ------------------------------

class MLP(nn.Module):
    def __init__(self, act, dropout):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(8, 16), nn.Linear(16, 4)
        self.act = {"relu": nn.ReLU(), "tanh": nn.Tanh(), "gelu": nn.GELU()}[act]
        self.drop = nn.Dropout(dropout) if dropout else nn.Identity()

    def forward(self, x):
        return self.fc2(self.drop(self.act(self.fc1(x))))


class CNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(2, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.fc = nn.Linear(4 * 3 * 3, 4)

    def forward(self, x):
        return self.fc(torch.flatten(F.avg_pool2d(F.relu(self.bn(self.conv(x))), 2), 1))


class RNN(nn.Module):
    def __init__(self, cell):
        super().__init__()
        self.rnn = (nn.GRU if cell == "gru" else nn.LSTM)(4, 8, batch_first=True)
        self.fc = nn.Linear(8, 4)

    def forward(self, x):
        return self.fc(self.rnn(x)[0][:, -1])


class Transformer(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, 8)
        self.enc = nn.TransformerEncoderLayer(8, nhead=2, dim_feedforward=16, dropout=0.1, batch_first=True)
        self.head = nn.Linear(8, VOCAB)

    def forward(self, tokens):
        return self.head(self.enc(self.emb(tokens)))


class TiedLM(nn.Module):
    """Embedding and output layer share one weight."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, 8)
        self.mix = nn.Linear(8, 8)
        self.head = nn.Linear(8, VOCAB)
        self.head.weight = self.emb.weight

    def forward(self, tokens):
        return self.head(torch.tanh(self.mix(self.emb(tokens))))


def _build_model(s):
    if s.model == "mlp":
        return MLP(s.act, s.dropout)
    if s.model == "cnn_bn":
        return CNN()
    if s.model in ("gru", "lstm"):
        return RNN(s.model)
    if s.model == "transformer":
        return Transformer()
    return TiedLM()


def _hook_module(model):
    """The module the counting forward hook goes on: the first child."""
    return next(model.children())


# --- the grammar --------------------------------------------------------------------------

BASE_LR = {"sgd": 0.05, "adam": 1e-2, "adamw": 1e-2, "rmsprop": 1e-2, "adagrad": 0.05, "adadelta": 1.0}
_OPT_CLASS = {"sgd": "SGD", "adam": "Adam", "adamw": "AdamW", "rmsprop": "RMSprop", "adagrad": "Adagrad",
              "adadelta": "Adadelta"}


def _opt_kwargs(rng, name):
    kw = {"lr": BASE_LR[name]}
    if name == "sgd":
        kw["momentum"] = rng.choice([0.0, 0.9])
        if kw["momentum"] and rng.random() < 0.5:
            kw["nesterov"] = True
        kw["weight_decay"] = rng.choice([0.0, 1e-4])
    elif name in ("adam", "adamw"):
        kw["weight_decay"] = rng.choice([0.0, 1e-4]) if name == "adam" else rng.choice([0.01, 0.1])
        kw["amsgrad"] = rng.random() < 0.3
    elif name == "rmsprop":
        kw["momentum"] = rng.choice([0.0, 0.9])
        kw["centered"] = rng.random() < 0.3
        kw["weight_decay"] = rng.choice([0.0, 1e-4])
    elif name == "adagrad":
        kw["lr_decay"] = rng.choice([0.0, 0.01])
        kw["weight_decay"] = rng.choice([0.0, 1e-4])
    else:
        kw["weight_decay"] = rng.choice([0.0, 1e-4])
    if rng.random() < 0.4:
        kw["foreach"] = True      # the default on CPU is the single-tensor update
    return tuple(sorted(kw.items()))


@dataclasses.dataclass(frozen=True)
class LoopSpec:
    """One training loop. Fields that are 0/None/"none"/False mean the feature is off."""
    seed: int
    calls: int = 10
    model: str = "mlp"
    act: str = "relu"              # mlp only
    dropout: float = 0.0           # mlp only
    opt: str = "sgd"
    opt_kw: tuple = (("lr", 0.05),)
    opt2: str = ""                 # a second optimizer, for the model's first child
    opt2_kw: tuple = ()
    sched: str = "none"
    sched_kw: tuple = ()
    sched_inside: bool = False     # stepped inside the step (else by the loop, after each call)
    zero_grad_to_none: bool = True
    clip: str = ""                 # "norm" | "value"
    clip_foreach: bool = False
    accum: int = 0                 # micro-batches per call, a Python loop in the step
    accum_calls: int = 0           # optimizer step every k calls (a Python counter decides)
    log: bool = False              # side.log.append(loss.item())
    counter: str = ""              # "nonlocal" | "global" | "attr"
    branch: str = ""               # "buffer": a tensor call counter; "data": an outlier batch
    branch_at: int = 0             # the call (0-based) at which the branch flips
    eval_at: int = -1              # model.eval() before this call ...
    train_at: int = -1             # ... model.train() before this one
    small_every: int = 0           # every k-th batch is smaller (the last of an epoch)
    small: int = 5
    exc: str = ""                  # "nan" (NaN batch, checked), "index" (bad token), "flag" (preempted)
    exc_at: int = -1
    hook: bool = False             # a forward hook on the first child counts calls
    aug: str = ""                  # "random" | "numpy": a flip decided by Python's / NumPy's RNG
    const: bool = False            # the loss scaled by a tensor made in the step (torch.tensor)
    method: bool = False           # the step is a method of a Trainer (else a closure)
    lengths: tuple = ()            # per call, the sequence length (token and recurrent models; else 6 or 5)
    loss: str = "cross_entropy"    # not a token model: one of LOSSES (targets one-hot where not classes)

    # -- what it is ------------------------------------------------------------------------
    def _opt_text(self, name, kw):
        return f"{_OPT_CLASS[name]}({', '.join(f'{k}={v}' for k, v in kw)})"

    def header(self) -> str:
        """One line per part: model, optimizers, scheduler, loop-side events."""
        m = self.model + (f"({self.act}{f', dropout {self.dropout}' if self.dropout else ''})"
                          if self.model == "mlp" else "")
        opts = self._opt_text(self.opt, self.opt_kw)
        if self.opt2:
            opts += f" + {self._opt_text(self.opt2, self.opt2_kw)} on the first child"
        sch = "no scheduler" if self.sched == "none" else (
            f"{self.sched}({', '.join(f'{k}={v}' for k, v in self.sched_kw)}) stepped "
            + ("inside the step" if self.sched_inside else "by the loop after each call"))
        ev = []
        if self.small_every:
            ev.append(f"every {self.small_every}th batch has {self.small} samples (else {BATCH})")
        if self.eval_at >= 0:
            ev.append(f"eval() before call {self.eval_at}" + (f", train() before call {self.train_at}"
                                                              if self.train_at >= 0 else ""))
        if self.branch:
            ev.append(f"branch flips at call {self.branch_at}")
        if self.exc == "nan":
            ev.append(f"batch {self.exc_at} holds a NaN")
        elif self.exc == "index":
            ev.append(f"batch {self.exc_at} holds an out-of-range token")
        elif self.exc == "flag":
            ev.append(f"the loop sets side.interrupt before call {self.exc_at}")
        if self.hook:
            ev.append("a forward hook on the first child counts calls into side.hooks")
        if self.lengths:
            ev.append(f"sequence lengths {', '.join(map(str, self.lengths))}")
        if self.loss != "cross_entropy":
            ev.append(f"loss {self.loss}")
        return (f"loop seed={self.seed}: {self.calls} calls; {m}; {opts}; {sch}"
                + (f"; {'; '.join(ev)}" if ev else ""))

    def describe(self) -> str:
        """The header, the generated step source, and how to rebuild it."""
        changed = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                   if f.name != "seed" and getattr(self, f.name) != f.default}
        args = ", ".join(f"{k}={v!r}" for k, v in changed.items())
        return (f"{self.header()}\n{textwrap.indent(self.source(), '    ')}"
                f"    # rebuild: crucible_loopgen.LoopSpec(seed={self.seed}{', ' + args if args else ''})\n")

    # -- the step as source ----------------------------------------------------------------
    def source(self) -> str:
        P = "self." if self.method else ""
        body = []

        def put(line, depth=0):
            body.append("    " * depth + line)

        opts = [f"{P}opt"] + ([f"{P}opt2"] if self.opt2 else [])
        zero = "zero_grad()" if self.zero_grad_to_none else "zero_grad(set_to_none=False)"
        if not self.accum_calls:
            for o in opts:
                put(f"{o}.{zero}")
        if self.aug:
            draw = "random.random()" if self.aug == "random" else "np.random.rand()"
            put(f"if {draw} < 0.5:")
            put("x, y = x.flip(0), y.flip(0)", 1)
        if self.branch == "data":
            put("if bool((x.abs() > 3.5).any()):   # an outlier in the batch")
            put("x = x.clamp(-3.5, 3.5)", 1)
        if self.branch == "buffer":
            put(f"{P}model.calls += 1")
            put(f"penalize = int({P}model.calls) > {self.branch_at}")

        def forward(xv, yv, d):
            put(f"loss = {P}loss_fn({P}model({xv}), {yv})", d)
            if self.const:
                put("loss = loss * torch.tensor(0.5)", d)
            if self.branch == "buffer":
                put("if penalize:", d)
                put(f"loss = loss + 1e-3 * sum(p.pow(2).sum() for p in {P}params)", d + 1)
            if self.exc == "nan":
                put("if torch.isnan(loss):", d)
                put('raise FloatingPointError("the loss is NaN")', d + 1)

        if self.accum:
            put("total = 0.0")
            put(f"for xb, yb in zip(x.chunk({self.accum}), y.chunk({self.accum})):")
            forward("xb", "yb", 1)
            put(f"(loss / {self.accum}).backward()", 1)
            put(f"total = total + loss.detach() / {self.accum}", 1)
            put("loss = total")
        else:
            forward("x", "y", 0)
            put("loss.backward()")
        if self.exc == "flag":
            put(f"if {P}side.interrupt:")
            put(f"{P}side.interrupt = False", 1)
            put('raise Preempted("preempted after backward")', 1)
        if self.clip == "norm":
            put(f"torch.nn.utils.clip_grad_norm_({P}params, 1.0{', foreach=True' if self.clip_foreach else ''})")
        elif self.clip == "value":
            put(f"torch.nn.utils.clip_grad_value_({P}params, 0.05{', foreach=True' if self.clip_foreach else ''})")
        d = 0
        if self.accum_calls:
            put(f"{P}side.micro += 1")
            put(f"if {P}side.micro % {self.accum_calls} == 0:")
            d = 1
        for o in opts:
            put(f"{o}.step()", d)
        if self.sched != "none" and self.sched_inside:
            put(f"{P}sched.step({'loss.item()' if self.sched == 'plateau' else ''})", d)
        if self.accum_calls:
            for o in opts:
                put(f"{o}.{zero}", d)
        if self.log:
            put(f"{P}side.log.append(loss.item())")
        if self.counter == "nonlocal" and not self.method:
            put("count += 1")
        elif self.counter == "global" and not self.method:
            put("COUNT += 1")
        elif self.counter:
            put(f"{P}side.count += 1")
        put("return loss")
        names = "model, opt, opt2, sched, side, loss_fn, params"
        if self.method:
            return ("class Trainer:\n"
                    f"    def __init__(self, {names}):\n"
                    + "".join(f"        self.{n} = {n}\n" for n in names.split(", "))
                    + "    def step(self, x, y):\n" + textwrap.indent("\n".join(body), "        ") + "\n")
        decl = ("nonlocal count\n" if self.counter == "nonlocal" else
                "global COUNT\n" if self.counter == "global" else "")
        return (f"def make({names}):\n"
                "    count = 0\n"
                "    def step(x, y):\n" + textwrap.indent(decl + "\n".join(body), "        ") + "\n"
                "    return step, lambda: count\n")

    # -- fresh state -----------------------------------------------------------------------
    def build(self) -> "Instance":
        """Seeds torch, Python and NumPy from the seed, then builds model, optimizers,
        scheduler, data and side-effect containers: two builds are identical."""
        seed_all(self.seed)
        return Instance(self)


def seed_all(seed):
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed % 2**32)


class Side:
    """The step's Python-visible side effects."""

    def __init__(self):
        self.log, self.count, self.hooks, self.micro, self.interrupt = [], 0, 0, 0, False


def _make_sched(s, opt):
    S = torch.optim.lr_scheduler
    kw = dict(s.sched_kw)
    if s.sched == "step":
        return S.StepLR(opt, **kw)
    if s.sched == "onecycle":
        return S.OneCycleLR(opt, **kw)
    if s.sched == "lambda":
        warm = kw["warmup"]
        return S.LambdaLR(opt, lambda i: min(1.0, (i + 1) / warm))
    if s.sched == "cosine":
        return S.CosineAnnealingLR(opt, **kw)
    if s.sched == "plateau":
        return S.ReduceLROnPlateau(opt, **kw)
    return None


class Instance:
    """A loop's live state: model, opt, opt2, sched, data, side, and step (the function a
    user would compile)."""

    def __init__(self, s: LoopSpec):
        self.spec = s
        self.model = _build_model(s)
        if s.branch == "buffer":
            self.model.register_buffer("calls", torch.zeros((), dtype=torch.long))
        params = list(self.model.parameters())
        first = {id(p) for p in _hook_module(self.model).parameters()}
        own = [p for p in params if id(p) not in first] if s.opt2 else params
        self.opt = getattr(torch.optim, _OPT_CLASS[s.opt])(own, **dict(s.opt_kw))
        self.opt2 = (getattr(torch.optim, _OPT_CLASS[s.opt2])([p for p in params if id(p) in first],
                                                              **dict(s.opt2_kw)) if s.opt2 else None)
        self.sched = _make_sched(s, self.opt)
        self.side = Side()
        if s.hook:
            side = self.side

            def count_hook(module, inputs, output):
                side.hooks += 1
            _hook_module(self.model).register_forward_hook(count_hook)
        if s.model in TOKEN_MODELS:
            def loss_fn(out, y):
                return F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))
        else:
            loss_fn = LOSSES[s.loss]
        self.data = self._data()
        ns = {"torch": torch, "F": F, "random": random, "np": np, "Preempted": Preempted, "COUNT": 0}
        exec(compile(s.source(), f"<loop {s.seed}>", "exec"), ns)
        args = (self.model, self.opt, self.opt2, self.sched, self.side, loss_fn, params)
        if s.method:
            self.trainer = ns["Trainer"](*args)
            self.step = self.trainer.step
            self.counter = lambda: self.side.count
        else:
            self.step, nonlocal_count = ns["make"](*args)
            self.counter = {"nonlocal": nonlocal_count, "global": lambda: ns["COUNT"]}.get(
                s.counter, lambda: self.side.count)

    def _data(self):
        s = self.spec
        g = torch.Generator().manual_seed(s.seed * 7919 + 1)
        data = []
        for i in range(s.calls):
            b = s.small if s.small_every and (i + 1) % s.small_every == 0 else BATCH
            n = s.lengths[i % len(s.lengths)] if s.lengths else None
            if s.model in TOKEN_MODELS:
                x = torch.randint(0, VOCAB, (b, n or 6), generator=g)
                y = torch.randint(0, VOCAB, (b, n or 6), generator=g)
                if s.exc == "index" and i == s.exc_at:
                    x[0, 0] = VOCAB
            else:
                shape = {"mlp": (b, 8), "cnn_bn": (b, 2, 6, 6)}.get(s.model, (b, n or 5, 4))
                x = torch.randn(shape, generator=g)
                y = torch.randint(0, 4, (b,), generator=g)
                if s.branch == "data":
                    x = x.clamp(-3, 3)
                    if i == s.branch_at:
                        x.view(-1)[0] = 6.0
                if s.exc == "nan" and i == s.exc_at:
                    x.view(-1)[1] = float("nan")
            data.append((x, y))
        return data

    def modules_and_optimizers(self):
        return self.model, [o for o in (self.opt, self.opt2) if o is not None]


def spec(seed: int) -> LoopSpec:
    """The loop that seed draws from the grammar."""
    rng = random.Random(seed)
    f = {"seed": seed, "calls": rng.randint(8, 12), "model": rng.choice(MODELS)}
    n = f["calls"]
    if f["model"] == "mlp":
        f["act"] = rng.choice(["relu", "tanh", "gelu"])
        f["dropout"] = rng.choice([0.0, 0.0, 0.2])
    f["opt"] = rng.choice(OPTIMIZERS)
    f["opt_kw"] = _opt_kwargs(rng, f["opt"])
    if rng.random() < 0.2:
        f["opt2"] = rng.choice(OPTIMIZERS)
        f["opt2_kw"] = _opt_kwargs(rng, f["opt2"])
    f["sched"] = rng.choice(SCHEDULERS + ("none",))
    lr = dict(f["opt_kw"])["lr"]
    if f["sched"] == "step":
        f["sched_kw"] = (("gamma", 0.5), ("step_size", rng.choice([2, 3, 4])))
    elif f["sched"] == "onecycle":
        kw = dict(f["opt_kw"])
        cyc = f["opt"] in ("adam", "adamw") or kw.get("momentum", 0) > 0
        f["sched_kw"] = (("cycle_momentum", cyc), ("max_lr", lr * 4), ("total_steps", n + 2))
    elif f["sched"] == "lambda":
        f["sched_kw"] = (("warmup", rng.choice([3, 5])),)
    elif f["sched"] == "cosine":
        f["sched_kw"] = (("T_max", n), ("eta_min", lr / 100))
    elif f["sched"] == "plateau":
        f["sched_kw"] = (("factor", 0.5), ("patience", 0))
    f["sched_inside"] = f["sched"] != "none" and rng.random() < 0.5
    f["zero_grad_to_none"] = rng.random() < 0.7
    if rng.random() < 0.3:
        f["clip"] = rng.choice(["norm", "value"])
        f["clip_foreach"] = rng.random() < 0.5
    if rng.random() < 0.15:
        f["accum"] = rng.choice([2, 4])
    elif rng.random() < 0.1:
        f["accum_calls"] = 2
    f["log"] = rng.random() < 0.25
    if rng.random() < 0.25:
        f["counter"] = rng.choice(["nonlocal", "global", "attr"])
    if rng.random() < 0.2:
        f["branch"] = "buffer" if f["model"] in TOKEN_MODELS else rng.choice(["buffer", "data"])
        f["branch_at"] = rng.randint(4, n - 2)
    if rng.random() < 0.2:
        f["eval_at"] = rng.randint(3, n - 2)
        if rng.random() < 0.7:
            f["train_at"] = rng.randint(f["eval_at"] + 1, n - 1)
    if rng.random() < 0.3:
        f["small_every"] = rng.choice([3, 4, 5])
        f["small"] = rng.choice([4, 5, 6])
    if rng.random() < 0.15:
        kinds = ["flag", "index"] if f["model"] in TOKEN_MODELS else ["flag", "nan"]
        f["exc"] = rng.choice(kinds)
        f["exc_at"] = rng.randint(4, n - 2)
    f["hook"] = rng.random() < 0.2
    if rng.random() < 0.1:
        f["aug"] = rng.choice(["random", "numpy"])
    f["method"] = rng.random() < 0.3
    # New choices are drawn after the existing ones, so that every seed keeps its loop (and
    # lists of known-failing seeds stay valid).
    f["const"] = rng.random() < 0.1
    if f["model"] not in ("mlp", "cnn_bn") and rng.random() < 0.35:   # lengths that vary (Note [Bound sizes])
        f["lengths"] = tuple(rng.randint(3, 9) for _ in range(n))
    if f["model"] not in TOKEN_MODELS and rng.random() < 0.3:
        f["loss"] = rng.choice(sorted(LOSSES))
    return LoopSpec(**f)


def plain(seed: int = 0, **fields) -> LoopSpec:
    """The plainest loop (MLP, SGD, no scheduler, no features) with `fields` set."""
    return LoopSpec(seed=seed, **fields)


# --- running ------------------------------------------------------------------------------

def _clone(v):
    return v.detach().clone() if isinstance(v, torch.Tensor) else v


def _flatten(prefix, obj, out):
    """Tensors and plain values of a nested state_dict under dotted names; callables skipped."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            _flatten(f"{prefix}.{k}", v, out)
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            _flatten(f"{prefix}.{i}", v, out)
    elif isinstance(obj, torch.Tensor):
        out[prefix] = obj.detach().clone()
    elif obj is None or isinstance(obj, (bool, int, float, str)):
        out[prefix] = obj
    elif not callable(obj):
        out[prefix] = repr(obj)


class Trace:
    """What one run of a loop showed: per call (loss, exception, learning rates, parameters)
    and at the end (state, side effects, RNG states); for a compiled run, its stats and
    CrucibleWarnings."""

    def __init__(self):
        self.calls = []        # per call: {"loss", "exc", "lr", "params"}
        self.final = {}
        self.stats = None
        self.warnings = []
        self.refusal = None
        self.error = None      # an exception outside the step (compile() itself)


def _crucible_compile(fn, **kw):
    import crucible_native as crucible
    return crucible.compile(fn, **kw)


def run(s: LoopSpec, compiled: bool, compile_kw=None, compile_fn=None) -> Trace:
    """Builds loop s afresh and runs its calls, eagerly or through compile_fn(step, **compile_kw)
    (crucible.compile by default; the compiled object needs stats() and last_refusal)."""
    t = Trace()
    inst = s.build()
    step = inst.step
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if compiled:
            try:
                step = (compile_fn or _crucible_compile)(inst.step, **(compile_kw or {}))
            except Exception as e:   # noqa: BLE001  (a crash of compile() itself)
                t.error = f"crucible.compile raised {type(e).__name__}: {e}"
                return t
        model, opts = inst.modules_and_optimizers()
        for i, (x, y) in enumerate(inst.data):
            if i == s.eval_at:
                model.eval()
            if i == s.train_at:
                model.train()
            if s.exc == "flag" and i == s.exc_at:
                inst.side.interrupt = True
            rec = {"loss": None, "exc": None}
            try:
                out = step(x, y)
                rec["loss"] = _clone(out)
            except Exception as e:   # noqa: BLE001  (compared with eager's, call by call)
                rec["exc"] = (type(e).__name__, str(e).split("\n")[0][:200])
                out = None
                if compiled and type(e) not in (Preempted, FloatingPointError):
                    rec["tb"] = traceback.format_exc(limit=6)
            if inst.sched is not None and not s.sched_inside and out is not None:
                if s.sched == "plateau":
                    inst.sched.step(out.item())
                else:
                    inst.sched.step()
            rec["lr"] = [[g["lr"] for g in o.param_groups] for o in opts]
            rec["params"] = {k: p.detach().clone() for k, p in model.named_parameters()}
            t.calls.append(rec)
    t.warnings = [str(w.message) for w in caught if w.category.__name__ == "CrucibleWarning"]
    if compiled:
        t.stats = step.stats()
        t.refusal = step.last_refusal
    f = t.final
    for k, p in model.named_parameters():
        f[f"param {k}"] = p.detach().clone()
        f[f"grad {k}"] = None if p.grad is None else p.grad.clone()
    for k, b in model.named_buffers():
        f[f"buffer {k}"] = b.clone()
    f["training"] = [m.training for m in model.modules()]
    for j, o in enumerate(opts):
        _flatten(f"opt{j + 1}", o.state_dict(), f)
    if inst.sched is not None:
        _flatten("sched", inst.sched.state_dict(), f)
    f["side.log"] = list(inst.side.log)
    f["counter"] = inst.counter()
    f["side.hooks"] = inst.side.hooks
    f["side.micro"] = inst.side.micro
    f["side.interrupt"] = inst.side.interrupt
    f["torch RNG"] = torch.get_rng_state()
    f["python RNG"] = random.getstate()
    f["numpy RNG"] = repr(np.random.get_state()[1][:4].tolist() + [np.random.get_state()[2]])
    return t


def same(a, b) -> bool:
    """Bit-identical: torch.equal, with NaN equal to NaN at the same places; plain values
    by ==, NaN equal to NaN."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            return False
        if a.shape != b.shape or a.dtype != b.dtype:
            return False
        if torch.equal(a, b):
            return True
        if a.is_floating_point():
            na, nb = a.isnan(), b.isnan()
            return torch.equal(na, nb) and torch.equal(a[~na], b[~nb])
        return False
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


def _show(v):
    if isinstance(v, torch.Tensor):
        return f"tensor{tuple(v.shape)} {v.flatten()[:4].tolist()}" if v.numel() > 1 else f"tensor({v.item()})"
    r = repr(v)
    return r if len(r) < 160 else r[:160] + "..."


def _diff(what, a, b):
    msg = f"{what}: eager {_show(a)} vs compiled {_show(b)}"
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape \
            and a.is_floating_point() and b.is_floating_point():
        msg += f" (max |diff| {(a - b).abs().nan_to_num(nan=float('inf')).max().item():.3g})"
    return msg


def differences(e: Trace, c: Trace) -> list:
    """Every difference between an eager and a compiled trace, in call order, then the final
    state."""
    out = []
    for i, (a, b) in enumerate(zip(e.calls, c.calls)):
        for k in ("exc", "loss", "lr"):
            if not same(a[k], b[k]):
                out.append(_diff(f"call {i}: {'exception' if k == 'exc' else k}", a[k], b[k]))
        bad = [k for k in a["params"] if not same(a["params"][k], b["params"][k])]
        if bad:
            out.append(_diff(f"call {i}: param {bad[0]}" + (f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""),
                             a["params"][bad[0]], b["params"][bad[0]]))
    if len(e.calls) != len(c.calls):
        out.append(f"calls: eager {len(e.calls)} vs compiled {len(c.calls)}")
    for k in e.final.keys() | c.final.keys():
        if k not in e.final or k not in c.final:
            out.append(f"{k}: only in {'eager' if k in e.final else 'compiled'}")
    for k in e.final:
        if k in c.final and not same(e.final[k], c.final[k]):
            out.append(_diff(k, e.final[k], c.final[k]))
    return out


@dataclasses.dataclass
class Result:
    spec: LoopSpec
    outcome: str                  # compiled | refused | eager-unexplained | mismatch | crash
                                  # (compiled: a whole-step plan or a sync-point plan's native stretches ran)
    diffs: list
    stats: dict
    why: list                     # refusals and CrucibleWarnings of the compiled run
    crash: str = ""

    @property
    def failed(self) -> bool:
        return self.outcome in ("mismatch", "crash")

    @property
    def kind(self) -> str:
        """What differs first, without call numbers or names: "lr", "param", "side.hooks",
        "opt1.state.step", "exception", or for a crash the exception's type."""
        if self.crash:
            return "crash " + self.crash.split(" raised ")[-1].split(":")[0]
        if not self.diffs:
            return ""
        d = self.diffs[0]
        head = d.split(": ")[1] if d.startswith("call ") else d.split(": ")[0]
        return re.sub(r"\.\d+", "", head.split(" ")[0])

    def refusal_kind(self) -> str:
        """The first refusal or warning, without op numbers and values."""
        if not self.why:
            return ""
        w = self.why[0]
        m = re.search(r"op #\d+ (\S+) \((\w+)\) argument '(\w+)'.*a scalar that changes", w)
        if m:
            return f"a changing scalar with no known source: {m.group(1)} '{m.group(3)}' ({m.group(2)})"
        if "different ops in two calls" in w or re.search(r"ran \d+ ops in one call and \d+ in the next", w):
            return "the step ran different ops in two calls"
        if "would skip: " in w:   # a Python side effect: what changed, without its values
            what = re.split(r" changed | grew | \(its | \(it |; ", w.split("would skip: ", 1)[1])[0]
            return "a replay would skip: " + re.sub(r"\d+", "N", what)[:80]
        return re.sub(r"\d+", "N", w)[:100]

    def report(self, max_diffs: int = 6) -> str:
        st = self.stats or {}
        lines = [f"{self.outcome.upper()}: {self.spec.header()}",
                 f"  compile: plan_runs {st.get('plan_runs')}, calls {st.get('calls')}, plans_built "
                 f"{st.get('plans_built')}, refusals {st.get('refusals')}, guard_failures "
                 f"{st.get('guard_failures')}, replans {st.get('replans')}"]
        if self.crash:
            lines.append("  crash: " + self.crash.strip().replace("\n", "\n    "))
        if self.diffs:
            lines.append(f"  first difference: {self.diffs[0]}")
            lines.extend(f"  then: {d}" for d in self.diffs[1:max_diffs])
            if len(self.diffs) > max_diffs:
                lines.append(f"  ... {len(self.diffs) - max_diffs} more differences")
        lines.extend(f"  said: {w[:300]}" for w in self.why[:4])
        lines.append(textwrap.indent(self.spec.describe(), "  "))
        return "\n".join(lines)


def check(s: LoopSpec, compile_kw=None, compile_fn=None) -> Result:
    """Runs loop s eagerly and compiled, from the same seed, and classifies the outcome."""
    e = run(s, compiled=False)
    c = run(s, compiled=True, compile_kw=compile_kw, compile_fn=compile_fn)
    if c.error:
        return Result(s, "crash", [], {}, [], c.error)
    why = list(dict.fromkeys(([c.refusal] if c.refusal else [])
                             + [w.removeprefix("crucible.compile: ") for w in c.warnings]))
    crash = ""
    for i, (a, b) in enumerate(zip(e.calls, c.calls)):
        if b["exc"] is not None and (a["exc"] is None or a["exc"][0] != b["exc"][0]):
            crash = f"call {i}: compiled raised {b['exc'][0]}: {b['exc'][1]}" + (
                f"\n{b['tb']}" if b.get("tb") else "")
            break
    diffs = differences(e, c)
    if crash:
        outcome = "crash"
    elif diffs:
        outcome = "mismatch"
    elif c.stats["plan_runs"] > 0 or c.stats.get("sync_native", 0) > 0:
        outcome = "compiled"   # whole-step plan runs, or sync-point calls with native stretches
    elif c.stats["refusals"] or c.refusal or c.warnings:
        outcome = "refused"
    else:
        outcome = "eager-unexplained"
    return Result(s, outcome, diffs, c.stats, why, crash)


def control(s: LoopSpec) -> list:
    """Eager against eager: the loop is deterministic when this is empty (the fuzzer's own check)."""
    return differences(run(s, compiled=False), run(s, compiled=False))


# --- reducing a failure to its cause ------------------------------------------------------

# Each entry: the fields a feature spans, reset together to their defaults.
_FEATURES = (("opt2", "opt2_kw"), ("sched", "sched_kw", "sched_inside"), ("clip", "clip_foreach"),
             ("accum",), ("accum_calls",), ("log",), ("counter",), ("branch", "branch_at"),
             ("eval_at", "train_at"), ("train_at",), ("small_every", "small"), ("exc", "exc_at"),
             ("hook",), ("aug",), ("const",), ("method",), ("zero_grad_to_none",), ("dropout",), ("act",),
             ("lengths",))
_DEFAULT = {f.name: f.default for f in dataclasses.fields(LoopSpec)}


def _simpler(s: LoopSpec):
    """Specs one step simpler than s: a feature off, the model an MLP, the optimizer plain
    SGD, one optimizer argument dropped."""
    for group in _FEATURES:
        if any(getattr(s, k) != _DEFAULT[k] for k in group):
            yield dataclasses.replace(s, **{k: _DEFAULT[k] for k in group})
    if s.model != "mlp" and s.exc != "index":
        yield dataclasses.replace(s, model="mlp")
    if s.opt != "sgd" or s.opt_kw != _DEFAULT["opt_kw"]:
        if s.opt != "sgd":
            kw = tuple((k, v) for k, v in s.opt_kw if k in ("foreach",))
            yield dataclasses.replace(s, opt="sgd", opt_kw=(("lr", BASE_LR["sgd"]),) + kw)
        for i, (k, _) in enumerate(s.opt_kw):
            if k != "lr":
                yield dataclasses.replace(s, opt_kw=s.opt_kw[:i] + s.opt_kw[i + 1:])


def minimize(s: LoopSpec, still_fails=None, budget: int = 60) -> LoopSpec:
    """The simplest spec reached from s by greedy simplification that still fails (by default:
    check() gives the same outcome, and the same kind of first difference, as for s). At most
    `budget` checks."""
    if still_fails is None:
        first = check(s)

        def still_fails(t):
            r = check(t)
            return r.failed and r.outcome == first.outcome and r.kind == first.kind
    changed = True
    while changed and budget > 0:
        changed = False
        for t in _simpler(s):
            budget -= 1
            try:
                ok = still_fails(t)
            except Exception:   # noqa: BLE001  (an invalid combination: skip it)
                ok = False
            if ok:
                s, changed = t, True
                break
            if budget <= 0:
                break
    return s


def cause(s: LoopSpec) -> str:
    """A short name for what a (minimized) spec holds beyond the plainest loop."""
    parts = []
    for group in _FEATURES:
        k = group[0]
        v = getattr(s, k)
        if v != _DEFAULT[k]:
            if k == "sched":
                parts.append(f"sched={v}({'inside' if s.sched_inside else 'by the loop'})")
            elif k in ("eval_at", "train_at"):
                parts.append("train/eval switch")
            elif isinstance(v, bool):
                parts.append(k if v else f"{k}=False")
            else:
                parts.append(f"{k}={v}")
    if s.model != "mlp":
        parts.append(f"model={s.model}")
    if s.opt != "sgd" or s.opt_kw != _DEFAULT["opt_kw"]:
        parts.append(f"opt={s.opt}({', '.join(k for k, _ in s.opt_kw if k != 'lr')})")
    if s.opt2:
        parts[parts.index(f"opt2={s.opt2}")] = f"opt2={s.opt2}({', '.join(k for k, _ in s.opt2_kw if k != 'lr')})"
    return " + ".join(dict.fromkeys(parts)) or "plain loop"
