"""Sync-point execution on the Python side (Note [Sync-point execution] in vessel/torch/Sync.cpp;
misc/CRUCIBLE.md, "Replay (crucible.compile)").

`Hooks` marks and offers the stretches of a call: while a call is recorded, `Hooks("capture",
...)` marks where backward() and each guarded optimizer's step() ran (crucible::capture_mark);
while a sync-point call runs, `Hooks("sync", ...)` offers each of them to the plan instead: the
plan runs its recorded stretch natively when everything before it matched and nothing Python
would run inside it; otherwise the engine or the optimizer's own Python runs, and its ops are
matched like the others. The hooks are installed for one call on the calling thread's behalf:
torch.autograd's _engine_run_backward (module-wide, passed through for every other thread and
call) and the step attribute of each guarded optimizer instance.

`SyncPoint` is CompiledStep's side of it: a sync-point call against the plans of every path the
step takes, the search for the plan of a new path, and each plan's guard."""
from __future__ import annotations

import threading
import time

from ._compile_stats import live_steps as _live_steps
from ._native import ext as _ext

MAX_IDLE_REPLANS = 3   # plans of one signature dropped with no plan run between them before it runs eagerly
MAX_SYNC_MISSES = 3    # sync-point calls in a row that left their plan before it is recorded again
MAX_VARIANTS = 3       # plans of other paths a sync-point signature keeps besides its first
VARIANT_CAPTURES = 4   # calls recorded, after a call that left every plan, to find the path it took
MAX_VARIANT_SEARCHES = 4
# Note [Optimizer plans]: an optimizer's step runs as a stretch of the sync-point plan
# STRETCHES_FIRST times before its own plan records (a step whose plan churns, or a short loop,
# pays no eager recordings for it); its own plan is dropped after OWN_PLAN_TRIES calls in a
# row without running, or when its fastest of its first TIMED runs is slower than the fastest
# stretch (a small optimizer: a CompiledStep call costs about 30 us more than a stretch).
STRETCHES_FIRST = 3
OWN_PLAN_TRIES = 6
TIMED = 3
_MISSING = object()

_tls = threading.local()
_install_lock = threading.Lock()
_installed = 0          # calls with the backward hook installed, over all threads
_orig_engine_run = None

_BACKWARD, _OPTIMIZER_STEP = 0, 1


def _active():
    return getattr(_tls, "hooks", None)


def _engine_run_backward(t_outputs, *args, **kwargs):
    h = _active()
    if h is None:
        return _orig_engine_run(t_outputs, *args, **kwargs)
    return h.backward(t_outputs, args, kwargs)


def _optimizer_types():
    import torch
    return (torch.optim.SGD, torch.optim.Adam, torch.optim.AdamW, torch.optim.Adadelta, torch.optim.RMSprop,
            torch.optim.Adagrad)


class Hooks:
    """mode "capture": record marks; "sync": run marked stretches natively where the plan can.
    step_ok() (sync): per plan of the step, whether the state still is what that plan was
    recorded from (its guard); scalars(): the sources' values for the coming step."""

    def __init__(self, mode, optimizers, step_ok=None, scalars=None, own_plans=None):
        self.mode = mode
        self.optimizers = optimizers
        self.step_ok, self.scalars = step_ok, scalars
        self.own_plans = own_plans   # sync: the optimizers' own plans (Note [Optimizer plans]), or None
        self.eager_steps = []   # sync: why an optimizer step ran eagerly
        self._saved = []

    def __enter__(self):
        global _installed, _orig_engine_run
        import torch.autograd
        with _install_lock:
            if _installed == 0:
                _orig_engine_run = torch.autograd._engine_run_backward
                torch.autograd._engine_run_backward = _engine_run_backward
            _installed += 1
        self._outer = _active()   # an optimizer's own plan records inside a sync-point call
        _tls.hooks = self
        known = _optimizer_types()
        for tag, opt in enumerate(self.optimizers):
            if type(opt) not in known:
                continue
            had = "step" in opt.__dict__
            orig = opt.__dict__["step"] if had else None
            self._saved.append((opt, had, orig))
            opt.step = self._step_wrapper(opt, tag, opt.step)
        return self

    def __exit__(self, *exc):
        global _installed
        import torch.autograd
        for opt, had, orig in reversed(self._saved):
            if had:
                opt.step = orig
            else:
                opt.__dict__.pop("step", None)
        self._saved = []
        _tls.hooks, self._outer = self._outer, None
        with _install_lock:
            _installed -= 1
            if _installed == 0:
                torch.autograd._engine_run_backward = _orig_engine_run
        return False

    # -- backward() ------------------------------------------------------------------------
    def backward(self, t_outputs, args, kwargs):
        import torch
        grads = args[0] if args else kwargs.get("grad_tensors")
        retain = bool(args[1]) if len(args) > 1 else bool(kwargs.get("retain_graph"))
        create = bool(args[2]) if len(args) > 2 else bool(kwargs.get("create_graph"))
        inputs = args[3] if len(args) > 3 else kwargs.get("inputs")
        plain = (kwargs.get("accumulate_grad", True) and not create and not inputs
                 and all(isinstance(t, torch.Tensor) for t in t_outputs)
                 and grads is not None and all(isinstance(g, torch.Tensor) for g in grads))
        if plain and self.mode == "capture":
            torch.ops.crucible.capture_mark(_BACKWARD, 0, retain, list(t_outputs), list(grads))
            result = _orig_engine_run(t_outputs, *args, **kwargs)
            _ext.capture_mark_end()
            return result
        if plain and self.mode == "sync" and torch.ops.crucible.sync_backward(list(t_outputs), list(grads), retain):
            return ()
        return _orig_engine_run(t_outputs, *args, **kwargs)

    # -- optimizer.step() --------------------------------------------------------------------
    def _step_wrapper(self, opt, tag, orig):
        import torch
        import torch.optim.optimizer as oo

        def step(*a, **kw):
            if _active() is not self or a or kw:   # a closure: the optimizer's own Python
                return orig(*a, **kw)
            if self.mode == "capture":
                torch.ops.crucible.capture_mark(_OPTIMIZER_STEP, tag, False, [], [])
                result = orig()
                _ext.capture_mark_end()
                return result
            why = None
            if opt._optimizer_step_pre_hooks or opt._optimizer_step_post_hooks or \
                    oo._global_optimizer_pre_hooks or oo._global_optimizer_post_hooks:
                why = "the optimizer has step hooks"
            else:
                # Not where step() is the user's own function on the instance (its ops are the
                # stretch's; the class's step() would skip them): only the class's, or it
                # wrapped by an LR scheduler.
                own = self.own_plans.of(opt) if self.own_plans is not None and _class_step(opt, orig) else None
                ok = self.step_ok()
                t0 = time.perf_counter()
                done = _ext.sync_optimizer(tag, self._scalars, ok, own is not None and own.ready())
                if done == 2:   # the call is suspended: the optimizer's own plan runs the step
                    native = False
                    try:
                        native = own.run()
                    finally:
                        _ext.sync_resume(native)
                elif done == 1 and own is not None:
                    own.stretch_ran(time.perf_counter() - t0)
                if done:
                    if getattr(orig, "_wrapped_by_lr_sched", False):
                        opt._opt_called = True   # what the scheduler's wrapper of step() records
                    return None
            if why is not None:   # else the plan said why (sync_end's eager_stretches)
                self.eager_steps.append(why)
            return orig()
        step.__wrapped__ = orig
        if getattr(orig, "_wrapped_by_lr_sched", False):   # what a scheduler's first step() checks
            step._wrapped_by_lr_sched = True
        return step

    def _scalars(self):
        was = _ext.sync_set_paused(True)   # the sources read step counters: not the step's ops
        try:
            return self.scalars()
        finally:
            _ext.sync_set_paused(was)


def _class_step(opt, step) -> bool:
    """Whether `step` (what opt.step was as the call began) runs the class's step(): the
    bound method, or an LR scheduler's wrapper of it (which also sets opt._opt_called)."""
    cls = type(opt).step
    if getattr(step, "__func__", None) is cls:
        return True
    return bool(getattr(step, "_wrapped_by_lr_sched", False)) and getattr(step, "__wrapped__", None) is cls


class OwnPlan:
    """One optimizer's step as its own whole-step plan (Note [Optimizer plans],
    vessel/torch/Sync.cpp): a CompiledStep of the optimizer's step(), made once the step has
    run as a stretch STRETCHES_FIRST times; it runs no backward() and does not warn of its own
    refusals or replans (it is the sync-point step's, not the user's)."""

    def __init__(self, owner, opt):
        self.opt = opt
        self._owner = owner          # a weakref.ref to the sync-point step (no cycle)
        self._stats = owner()._stats
        self.stretch_s = []  # times of the native stretches of the sync-point plan that ran the step
        self.own_s = []      # times of the first TIMED runs of the own plan
        self.misses = 0      # calls in a row in which the own plan did not run
        self.dropped = None  # why the own plan was dropped
        self.step = None     # the CompiledStep, once ready

    def ready(self) -> bool:
        if self.dropped is not None or len(self.stretch_s) < STRETCHES_FIRST:
            return False
        if self.step is None:
            import types
            owner = self._owner()
            self.step = type(owner)(types.MethodType(type(self.opt).step, self.opt), warmup=0, arena=owner._arena,
                                    verify_every=owner._verify_every, mode="replay",
                                    backend=owner._backend if owner._backend_asked else None,
                                    numerics=owner._numerics)
            self.step._quiet, self.step._param_hooks = True, False
            _live_steps.discard(self.step)   # its calls are the sync-point step's, not the user's
            self.step._retire.detach()
        return True

    def stretch_ran(self, seconds):
        if len(self.stretch_s) < STRETCHES_FIRST:
            self.stretch_s.append(seconds)

    def run(self) -> bool:
        """Steps the optimizer through its own CompiledStep; whether its plan ran. Dropped
        (the stretch again from then on) when it refused, missed OWN_PLAN_TRIES calls, or is
        slower than the stretch."""
        step = self.step
        runs = step._stats["plan_runs"]
        t0 = time.perf_counter()
        step()
        if step._stats["plan_runs"] > runs:
            self.misses = 0
            self._stats["optimizer_plan_runs"] += 1
            if len(self.own_s) < TIMED:
                self.own_s.append(time.perf_counter() - t0)
                if len(self.own_s) == TIMED and min(self.own_s) > min(self.stretch_s):
                    self.drop(f"its plan takes {min(self.own_s) * 1e6:.0f} us, the stretch "
                               f"{min(self.stretch_s) * 1e6:.0f} us")
            return True
        self.misses += 1
        if step._stats["refusals"]:
            self.drop(f"its own compile refused it: {step.last_refusal}")
        elif self.misses >= OWN_PLAN_TRIES:
            self.drop(f"its plan did not run in {self.misses} calls in a row")
        return False

    def drop(self, why):
        if self.step is not None:
            self.step.reset()   # its plans and recorded calls go now, not with the step
        self.step, self.dropped = None, why


class OwnPlans:
    """The own plans of a sync-point step's optimizers, made as each is first offered."""

    def __init__(self, owner):
        import weakref
        self._owner = weakref.ref(owner)   # the step holds this: no cycle through it
        self._by_id = {}   # id(optimizer) -> OwnPlan (which holds the optimizer: ids stay unique)

    def of(self, opt):
        own = self._by_id.get(id(opt))
        if own is None:
            own = self._by_id[id(opt)] = OwnPlan(self._owner, opt)
        return own

    def keep(self, optimizers):
        """Drops the own plans of optimizers the step no longer reaches (a new optimizer
        replaced one): they would keep it, its state and their plans alive."""
        live = {id(o) for o in optimizers}
        for k in [k for k in self._by_id if k not in live]:
            self._by_id.pop(k).drop("the step no longer uses this optimizer")

    def __iter__(self):
        return iter(self._by_id.values())

    def clear(self):
        for own in self._by_id.values():
            own.drop("reset")
        self._by_id.clear()


class SyncPoint:
    """CompiledStep's sync-point calls (a mixin: the state is CompiledStep's and its _Entry's)."""

    def _sync_call(self, e, args, kwargs, tensors):
        """A call of a sync-point plan (Note [Sync-point execution], vessel/torch/Sync.cpp): the
        step's Python runs; its ops are matched against the plan, and its backward() and
        optimizer steps run natively where everything before them matched."""
        st = self._stats
        st["sync_calls"] += 1
        patched = e.patched   # any of the plans takes the sources' values (set as each is built)
        sources = self._sources
        guards = [e.guard] + e.var_guards
        hooks = Hooks("sync", self._optimizers(), step_ok=lambda: [g.ok() for g in guards],
                       scalars=lambda: sources.values(True, anchors=False) if patched else [],
                       own_plans=self._own_plans)
        self._sync_start([e.plan] + e.variants, tensors)
        try:
            with hooks:
                result = self._fn(*args, **kwargs)
        finally:
            r = _ext.sync_end()
        if r["native_segments"]:
            st["sync_native"] += 1
            e.replans_idle = 0
        if r["eager_stretches"]:
            self.last_sync_eager = r["eager_stretches"][0]
        if r["stale"]:
            hooks.eager_steps.append(r["eager_stretches"][-1])
        if r["matched"] and not hooks.eager_steps:
            e.sync_misses = 0
            return result
        if not r["matched"]:
            st["sync_mismatches"] += 1
            self.last_sync_mismatch = r["why"]
            if len(e.variants) < MAX_VARIANTS and e.searches < MAX_VARIANT_SEARCHES:
                # another path: record the next calls until two take it, and keep its plan
                e.searches += 1
                e.capture_left = VARIANT_CAPTURES
                return result
        else:
            self.last_sync_mismatch = hooks.eager_steps[0]
        e.sync_misses += 1
        if e.sync_misses >= MAX_SYNC_MISSES:   # the plan no longer fits the step: record it again
            self._count("replans")
            self.last_replan = self.last_sync_mismatch
            e.replans_idle += 1
            idle = e.replans_idle
            self._drop(e)
            e.seen = self._warmup
            if idle >= MAX_IDLE_REPLANS:
                self._refuse(e, f"its sync-point plan was dropped {idle} times with no call running natively in "
                                f"between (the step takes another path too often); the last time: "
                                f"{self.last_replan}")
        return result


    def _capture_variant(self, e, args, kwargs, tensors):
        """A recorded call of a sync-point signature whose last call left every plan it has: the
        path it takes, when no plan has it, is kept until a second call takes it too, and the
        two give that path's plan."""
        e.capture_left -= 1
        result, form, _ = self._capture(e, args, kwargs, tensors)
        if form is None:
            return result
        if any(_ext.plan_same_path(p, form) for p in [e.plan] + e.variants):
            _ext.form_release(form)
            return result
        for i, (other, srcs, hyper, _) in enumerate(e.var_forms):
            if not _ext.forms_same_path(other, form):
                continue
            try:
                plan = _ext.plan_build_sync(other, form, srcs, e.cap_srcs)
            except RuntimeError:
                continue
            e.variants.append(plan)
            e.patched = e.patched or _ext.plan_info(plan)["patches"] > 0
            e.var_guards.append(e.cap_guard.without(self._lifted_between(hyper, e.cap_hyper)))
            e.var_forms.pop(i)
            _ext.form_release(other)
            _ext.form_release(form)
            e.capture_left, e.sync_misses = 0, 0
            self._count("plans_built")
            return result
        e.var_forms.append((form, e.cap_srcs, e.cap_hyper, e.cap_guard))
        if len(e.var_forms) > VARIANT_CAPTURES:
            _ext.form_release(e.var_forms.pop(0)[0])
        return result


    def _lifted_between(self, h0, h1):
        """id(param group) -> the hyperparameters of recognized optimizers that differed between
        the two recorded calls of a sync-point plan (h0, h1: ScalarSources.hyperparameters() as
        each began). The plan was built from calls that disagreed on them, so it feeds every
        scalar they make from the sources or takes it from the call: they are not guarded."""
        lifted = {}
        if not h0 or not h1:
            return lifted
        for opt, gs0, gs1 in zip(self._sources.optimizers(), h0, h1):
            for g, a, b in zip(opt.param_groups, gs0, gs1):
                ks = set()
                for k in set(a) | set(b):
                    try:
                        same = bool(a.get(k, _MISSING) == b.get(k, _MISSING))
                    except (RuntimeError, TypeError, ValueError):
                        same = False
                    if not same:
                        ks.add(k)
                if ks:
                    lifted[id(g)] = ks
        return lifted
