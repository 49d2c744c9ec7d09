"""Purity of a captured call: what a step does besides ATen ops, which a whole-step replay
would skip (Note [Whole-step purity] in misc/CRUCIBLE.md).

A plan replays the ATen ops of a step from one C++ call; the step's Python does not run. That
is only right when the Python did nothing else. While a call is captured, `Watch` looks for
everything else it did:
  - Python state reachable from the step that changed: closure cells, the globals its code
    names (and the code of the functions those reach), attributes of modules, optimizers and
    any other object reached from them, the hooks of modules, parameters and optimizers and
    what their closures hold. A fingerprint of each reachable value is taken before and
    after the call (the value itself for numbers and strings; identity for tensors, whose
    contents change only through ATen ops, which the plan replays; length and members for
    containers) and the first difference is named: `sched.last_epoch changed 1 -> 2`.
  - writes to sys.stdout / sys.stderr, and records made through `logging`;
  - Python's `random` and NumPy's global generator state;
  - tensor values read by Python without an ATen op (tolist(), numpy(), __array__,
    data_ptr(), __dlpack__, untyped_storage() called from outside torch): reads through
    .item(), bool(), float() and printing are ATen ops (aten::_local_scalar_dense) and the
    plan lists them itself;
  - torch.manual_seed() and the other functions that reset torch's generators, called by the
    step's code or by torch's own on its behalf (torch.random.fork_rng,
    torch.utils.checkpoint), through the torch, torch.random and torch.cuda modules.
Recognized LR schedulers (torch.optim.lr_scheduler.LRScheduler instances other than
ReduceLROnPlateau) stepped with no arguments after their optimizer's last step() inside the
step are the exception: a plan runs their step() in Python after each run, so their changes
and the learning rates they set are not refusals.
"""
from __future__ import annotations

import logging
import sys
import threading

from ._fingerprint import _ABSENT, _MAX_NODES, Fingerprint, _short, call_roots, step_roots


# -- monitors of the captured call ------------------------------------------------------------
class _Tee:
    """Stands in for sys.stdout / sys.stderr during a captured call: passes everything through
    and keeps the first text written."""

    def __init__(self, inner, name, watch):
        self._inner, self._name, self._watch = inner, name, watch

    def write(self, s):
        if s and threading.get_ident() == self._watch.thread:
            self._watch.note_output(self._name, s)
        return self._inner.write(s)

    def __getattr__(self, k):
        return getattr(self._inner, k)


_READ_METHODS = ("tolist", "numpy", "__array__", "data_ptr", "__dlpack__", "untyped_storage")
# Functions that reset torch's generators, by module: a replay would keep drawing from where
# its last run left the generator (random ops run in the plan; the reset is Python).
_SEED_FUNCTIONS = (("torch", ("manual_seed", "seed", "set_rng_state")),
                   ("torch.random", ("manual_seed", "seed", "set_rng_state")),
                   ("torch.cuda", ("manual_seed", "manual_seed_all", "seed", "seed_all", "set_rng_state",
                                   "set_rng_state_all")))


class Watch:
    """Everything a captured call does besides ATen ops (see the module docstring). Use:
        w = Watch(fn, extra); w.start(); ... the call ...; w.stop(); w.finish(); w.schedulers
    start() and stop() must pair (stop in a finally). Not reentrant: one captured call per
    process at a time, which CompiledStep's capture guarantees (the capture is per thread, and
    the Tensor methods it wraps are process-wide)."""

    _active = None   # the running Watch: the wrapped Tensor methods report to it

    def __init__(self, fn, extra, call_args=()):
        self.fn, self.extra = fn, extra
        self.call_args = call_roots(call_args)
        self.problems = []
        self.schedulers = []     # (scheduler, times stepped): after the optimizer's last step()
        self.thread = threading.get_ident()
        self._output = {}

    # -- during the call --------------------------------------------------------------------
    def note_output(self, stream, text):
        if stream not in self._output:
            self._output[stream] = text.strip() or repr(text)

    def note_seed(self, name, args, kwargs):
        # torch's own code counts too when it moves the CPU generator: torch.random.fork_rng
        # restores it as it exits, torch.utils.checkpoint resets it to draw a recomputed
        # dropout's mask again; a replay would do neither (its draws, and so its gradients,
        # would differ). A reset to the state the generator already has (a checkpointed block
        # that draws nothing, dynamo saving and restoring its state) changes nothing.
        where = _user_call_site()
        if not where and name in ("torch.set_rng_state", "torch.random.set_rng_state"):
            import torch
            state = args[0] if args else kwargs.get("new_state")
            now = torch.random.default_generator.get_state()
            a, b = (_bytes(state), _bytes(now)) if state is not None else (b"", b"")
            if a is None or b is None or a != b:  # unreadable without an op: counted
                where = _torch_call_site()
        if where:
            self.problems.append(f"{name}() reset torch's random generator at {where}: "
                                 f"a replay would keep drawing where its last run left off")

    def note_read(self, method):
        where = _user_call_site()
        if where:
            self.problems.append(f"Tensor.{method}() read a tensor's values into Python at {where}")

    def start(self):
        import torch
        from torch.optim import lr_scheduler as ls
        if Watch._active is not None:
            raise RuntimeError("crucible.compile: captures of two compiled steps overlap (another thread "
                               "is capturing); this call runs eagerly")
        roots = step_roots(self.fn, self.extra) + self.call_args
        probe = Fingerprint(roots)
        base = getattr(ls, "LRScheduler", None) or ls._LRScheduler
        plateau = getattr(ls, "ReduceLROnPlateau", None)
        scheds = [o for o in probe.objects if isinstance(o, base)]
        inner = set()     # schedulers stepped by another one (SequentialLR, ChainedScheduler)
        for s in scheds:
            inner.update(id(x) for x in getattr(s, "_schedulers", ()) or ())
        self._sched_state = []
        skip = set()
        for s in scheds:
            if id(s) in inner:
                continue
            if plateau is not None and isinstance(s, plateau):
                continue    # stepped with a metric: an ordinary object, its changes refused
            skip.add(id(s))
            opt = getattr(s, "optimizer", None)
            skip.update(_scheduler_owned(s, opt))
            self._sched_state.append(_SchedulerTrack(s, opt))
        self._skip = frozenset(skip)
        self.skip_ids = self._skip | frozenset(id(s) for s in scheds)   # every scheduler and what it owns
        self.before = Fingerprint(roots, self._skip) if skip else probe
        if self.before.overflow:
            self.problems.append(f"the step reaches more than {_MAX_NODES} Python values; their "
                                 f"purity cannot be checked")
        self._random = _random_state()
        self._numpy = _numpy_state()
        for t in self._sched_state:
            t.begin()
        self._old_out, self._old_err = sys.stdout, sys.stderr
        sys.stdout, sys.stderr = _Tee(sys.stdout, "stdout", self), _Tee(sys.stderr, "stderr", self)
        self._old_factory = logging.getLogRecordFactory()
        old, watch = self._old_factory, self

        def factory(*args, **kwargs):
            rec = old(*args, **kwargs)
            if threading.get_ident() == watch.thread:
                watch.note_output("logging", f"{rec.name}: {rec.getMessage()}")
            return rec
        logging.setLogRecordFactory(factory)
        T = torch.Tensor
        self._saved_methods = {m: T.__dict__.get(m, _ABSENT) for m in _READ_METHODS}
        for m in _READ_METHODS:
            orig = getattr(T, m)
            setattr(T, m, _reporting(orig, m))
        self._saved_functions = []
        for modname, names in _SEED_FUNCTIONS:
            mod = sys.modules.get(modname)
            for n in names if mod is not None else ():
                orig = getattr(mod, n, None)
                if callable(orig):
                    self._saved_functions.append((mod, n, orig))
                    setattr(mod, n, _seeding(orig, f"{modname}.{n}"))
        Watch._active = self

    def stop(self):
        """Restores everything start() replaced and collects the findings. Safe to call after a
        call that raised."""
        import torch
        if Watch._active is not self:
            return
        Watch._active = None
        T = torch.Tensor
        for m, v in self._saved_methods.items():
            if v is _ABSENT:
                delattr(T, m)
            else:
                setattr(T, m, v)
        for mod, n, orig in self._saved_functions:
            setattr(mod, n, orig)
        logging.setLogRecordFactory(self._old_factory)
        if isinstance(sys.stdout, _Tee) and sys.stdout._watch is self:
            sys.stdout = self._old_out
        if isinstance(sys.stderr, _Tee) and sys.stderr._watch is self:
            sys.stderr = self._old_err
        for t in self._sched_state:
            t.end()

    def finish(self):
        """After stop(): compares the state before and after the call. Returns the problems (an
        empty list: the call did nothing a replay would skip) and fills self.schedulers."""
        for stream, text in self._output.items():
            what = "a record through logging" if stream == "logging" else f"to {stream}"
            self.problems.append(f"the step wrote {what}: {_short(text)}")
        if _random_state() != self._random:
            self.problems.append("the step drew from Python's random module (its state changed)")
        if _numpy_changed(self._numpy, _numpy_state()):
            self.problems.append("the step drew from NumPy's global random generator (its state changed)")
        after = Fingerprint(step_roots(self.fn, self.extra) + self.call_args, self._skip)
        diff = self.before.first_difference(after)
        if diff is not None:
            self.problems.append(diff)
        for t in self._sched_state:
            why = t.problem()
            if why:
                self.problems.append(why)
            elif t.calls:
                self.schedulers.append((t.sched, t.calls))
        return self.problems




def _user_call_site():
    """'file:line' of the code that called a wrapped function (three frames up: this, the
    Watch's note_*, the wrapper), or '' when that code is torch's or Crucible's own."""
    f = sys._getframe(3)
    mod = f.f_globals.get("__name__", "") or ""
    if mod.split(".", 1)[0] in ("torch", "crucible_native"):
        return ""
    return f"{f.f_code.co_filename}:{f.f_lineno}"


def _bytes(t):
    """A dense CPU tensor's bytes, read without an ATen op (one would be part of the captured
    call)."""
    import ctypes
    if t.device.type != "cpu" or not t.is_contiguous():
        return None
    return ctypes.string_at(t.data_ptr(), t.numel() * t.element_size())


def _torch_call_site():
    """The torch module and function whose code called a wrapped function (as
    _user_call_site), or '' when Crucible's own code did."""
    f = sys._getframe(3)
    mod = f.f_globals.get("__name__", "") or ""
    if mod.split(".", 1)[0] != "torch":
        return ""
    return f"{mod}.{f.f_code.co_name} (torch's own code)"


def _seeding(orig, name):
    def seed(*args, **kwargs):
        w = Watch._active
        if w is not None and threading.get_ident() == w.thread:
            w.note_seed(name, args, kwargs)
        return orig(*args, **kwargs)
    seed.__name__ = orig.__name__
    seed.__doc__ = orig.__doc__
    seed.__wrapped__ = orig
    return seed


def _reporting(orig, name):
    def read(self, *args, **kwargs):
        w = Watch._active
        if w is not None and threading.get_ident() == w.thread:
            w.note_read(name)
        return orig(self, *args, **kwargs)
    read.__name__ = name
    read.__doc__ = getattr(orig, "__doc__", None)
    return read


def _scheduler_owned(sched, opt):
    """ids of what a scheduler's step() changes besides the scheduler: its optimizer's
    param groups (learning rate, and momentum or betas for the cyclic schedulers)."""
    ids = set()
    if opt is not None:
        ids.add(id(opt.param_groups))
        ids.update(id(g) for g in opt.param_groups)
    for sub in getattr(sched, "_schedulers", ()) or ():   # SequentialLR, ChainedScheduler
        ids.add(id(sub))
        ids.update(_scheduler_owned(sub, getattr(sub, "optimizer", None)))
    return ids


class _SchedulerTrack:
    """One recognized scheduler during a captured call: its step() calls, whether each came
    after its optimizer's step() or before it, and whether anything else changed the
    scheduler or its optimizer's param groups."""

    def __init__(self, sched, opt):
        self.sched, self.opt = sched, opt
        self.calls = 0
        self.bad = None

    def _state(self):
        own = {k: v for k, v in vars(self.sched).items() if k != "step"}   # step: the wrapper below
        return Fingerprint([(_name(self.sched), own),
                            (f"{_name(self.sched)}.optimizer.param_groups", self.opt.param_groups if self.opt else ())])

    def begin(self):
        track, sched = self, self.sched
        self.opt_steps = 0
        self.opt_steps_seen = []   # how many optimizer steps had run at each scheduler step
        self._hook = None
        if self.opt is not None and hasattr(self.opt, "register_step_post_hook"):
            def post(opt, args, kwargs):
                track.opt_steps += 1
            self._hook = self.opt.register_step_post_hook(post)   # before the first state: not a change
        self.start_state = self._state()
        self.last_state = self.start_state
        self._had_own_step = "step" in sched.__dict__
        self._own_step = sched.__dict__.get("step")
        inner = self._own_step if self._had_own_step else type(sched).step.__get__(sched, type(sched))

        def step(*args, **kwargs):
            if args or kwargs:
                track.bad = (f"{_name(sched)}.step() was called with arguments inside the step; only a "
                             f"step() with none is replayed")
                return inner(*args, **kwargs)
            now = track._state()
            if track.bad is None:
                diff = track.last_state.first_difference(now)
                if diff:
                    track.bad = f"{_name(sched)} or its optimizer's param groups changed outside its step(): {diff}"
            track.opt_steps_seen.append(track.opt_steps)
            track.calls += 1
            r = inner()
            track.last_state = track._state()
            return r
        sched.step = step

    def end(self):
        if self._had_own_step:
            self.sched.step = self._own_step
        else:
            self.sched.__dict__.pop("step", None)
        self.end_state = self._state()
        if self._hook is not None:
            self._hook.remove()

    def problem(self):
        if self.bad:
            return self.bad
        if self.calls == 0:
            diff = self.start_state.first_difference(self.end_state)
            return f"{_name(self.sched)}'s state changed without its step(): {diff}" if diff else None
        diff = self.last_state.first_difference(self.end_state)
        if diff:
            return f"{_name(self.sched)} or its optimizer's param groups changed after its step(): {diff}"
        if any(n != self.opt_steps for n in self.opt_steps_seen) or self.opt_steps == 0:
            return (f"{_name(self.sched)}.step() ran before its optimizer's step() in the step; a plan "
                    f"runs recognized schedulers after the whole step, so only a scheduler stepped "
                    f"after the optimizer's last step() is replayed (the order PyTorch documents)")
        return None


def _name(sched):
    return type(sched).__name__


def _random_state():
    import random
    return random.getstate()


def _numpy_state():
    np = sys.modules.get("numpy")
    if np is None:
        return None
    st = np.random.get_state(legacy=False)
    return (st["state"]["pos"], st["state"]["key"].tobytes(), st["has_gauss"], st["gauss"])


def _numpy_changed(a, b):
    return a is not None and b is not None and a != b
