"""Marks and native stretches of a compiled step's backward() and optimizer steps (Note
[Sync-point execution] in vessel/torch/Sync.cpp, "Sync-point mode" in misc/CRUCIBLE.md).

While a call is captured, `Hooks("capture", ...)` marks where backward() and each guarded
optimizer's step() ran (crucible::capture_mark). While a sync-point call runs, `Hooks("sync",
...)` offers each of them to the plan instead: the plan runs its recorded stretch natively when
everything before it matched and nothing Python would run inside it; otherwise the engine or
the optimizer's own Python runs, and its ops are matched like the others.

The hooks are installed for one call on the calling thread's behalf: torch.autograd's
_engine_run_backward (module-wide, passed through for every other thread and call) and the
step attribute of each guarded optimizer instance."""
from __future__ import annotations

import threading

from ._native import ext as _ext

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

    def __init__(self, mode, optimizers, step_ok=None, scalars=None):
        self.mode = mode
        self.optimizers = optimizers
        self.step_ok, self.scalars = step_ok, scalars
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
        _tls.hooks = None
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
            elif _ext.sync_optimizer(tag, self._scalars(), self.step_ok()):
                if getattr(orig, "_wrapped_by_lr_sched", False):
                    opt._opt_called = True   # what the scheduler's wrapper of step() records
                return None
            if why is not None:   # else the plan said why (sync_end's eager_stretches)
                self.eager_steps.append(why)
            return orig()
        step.__wrapped__ = orig
        return step

    def _scalars(self):
        was = _ext.sync_set_paused(True)   # the sources read step counters: not the step's ops
        try:
            return self.scalars()
        finally:
            _ext.sync_set_paused(was)
