"""PythonGuard: the Python state a plan run depends on besides what compile._StateGuard checks,
compared before every run (Note [Whole-step purity] in misc/CRUCIBLE.md)."""
from __future__ import annotations

import types
from functools import partial as _partial

from ._fingerprint import (_ABSENT, _ATOMIC_TYPES, Fingerprint, _code_names, _slots, _used_freevars, call_roots,
                           step_roots)


class PythonGuard:
    """The Python state a plan run depends on besides what _StateGuard checks (parameters,
    buffers, optimizer state and hyperparameters, training flags, plain module settings):
    values the step's code reaches through its closure, the globals it names and its bound
    self, and module attributes that are containers (a config dict a forward reads). Taken as
    a captured call begins; changed() walks the same roots again before a plan run and names
    the first difference: a caller that flips a global flag or edits a config between calls
    gets a call recorded again instead of a replay of the old path. Modules, optimizers and
    schedulers are compared by identity here: their state is _StateGuard's, and recognized
    schedulers change every call by design. Taken when a captured call has ended and found
    pure, so the state is the one the call began with."""

    def __init__(self, fn, extra, guarded, skip_ids, closures=(), call_args=(), param_hooks=True):
        """closures: the step's after_step functions. What they reach is theirs to change
        after each call (a log they append to): their code's globals are not walked, nor is
        a function passed to after_step that the step names; the step's own code still
        guards everything it reads itself. param_hooks=False: the step never runs backward()
        (an optimizer's own step, Note [Optimizer plans]), so its parameters' hooks, which
        only backward() runs, are not guarded."""
        self._param_hooks = param_hooks
        self._fn, self._extra = fn, extra
        self._call_args = call_roots(call_args)
        self._skip = frozenset(skip_ids) | frozenset(id(o) for o in guarded) | frozenset(id(f) for f in closures)
        self._skip_codes = frozenset(c for c in (getattr(f, "__code__", None) for f in closures) if c is not None)
        self._attrs = _module_containers(guarded)
        self._params = _parameters(guarded) if param_hooks else []   # walked for their hooks (a new one runs Python)
        self.fp = Fingerprint(self._roots(), self._skip, self._skip_codes, param_hooks)
        self._native = self._native_guard(self.fp)

    def _roots(self):
        return step_roots(self._fn, self._extra, hooks=False) + self._call_args + [
            (label, d.get(k)) for label, d, k in self._attrs] + self._params

    def changed(self):
        """None while the state is as it was; else a sentence naming what changed. The check
        runs in C++ (the fingerprint compiled into StateGuard checks: each walked dict and
        __dict__ entry, list item, closure cell, global and parameter hook); only when it
        fails is the state walked again in Python, to name the change, or to find it equal
        by value (a float replaced by an equal one) and compile the checks anew."""
        native = self._native
        if native is not None and native.ok():
            return None
        now = Fingerprint(self._roots(), self._skip, self._skip_codes, self._param_hooks)
        a = self.fp
        if a.fp == now.fp and a.label == now.label and a.parent == now.parent:
            if native is not None:
                self.fp, self._native = now, self._native_guard(now)
            return None
        return a.first_difference(now) or "the step's Python state changed"

    def _native_guard(self, fp):
        """fp as C++ StateGuard checks, or None when it walked something those cannot express
        (a set, a generator or iterator, a NumPy array or generator, an object with __slots__):
        then changed() walks in Python every time. Identity is checked for objects, equality
        for numbers and strings; a container's length through its snapshot."""
        from ._native import ext
        I, E = 0, 1

        def mode(v):
            return E if type(v) in _ATOMIC_TYPES else I
        keys, dicts, lists, attrs, cells = [], [], [], [], []
        module = fp._module
        for o in fp.objects:
            t = type(o)
            if isinstance(o, dict):
                dicts.append((o, [(k, v, mode(v)) for k, v in o.items()]))
            elif isinstance(o, list):
                lists.append((o, list(o)))
            elif isinstance(o, (tuple, frozenset)) or t is types.MethodType or t is _partial:
                continue   # immutable: its parent checks its identity, its children are walked
            elif t is types.FunctionType:
                code = o.__code__
                used = _used_freevars(code, self._skip_codes)
                for name, cell in zip(code.co_freevars, o.__closure__ or ()):
                    if used is not None and name not in used:
                        continue
                    try:
                        v = cell.cell_contents
                        cells.append((cell, v, mode(v)))
                    except ValueError:
                        cells.append((cell, None, I))
                g = o.__globals__
                for name in _code_names(code, self._skip_codes):
                    v = g.get(name, _ABSENT)
                    if v is not _ABSENT and not isinstance(v, (types.ModuleType, type)):
                        keys.append((g, name, v, mode(v)))
                for name in ("__code__", "__defaults__", "__kwdefaults__"):
                    attrs.append((o, name, getattr(o, name), I))
            else:
                d = getattr(o, "__dict__", None)
                if not isinstance(d, dict) or _slots(t) or (not isinstance(o, module) and hasattr(o, "__next__")):
                    return None
                dicts.append((d, [(k, v, mode(v)) for k, v in d.items()]))
        for p in fp.leaf_tensors:
            attrs.append((p, "_backward_hooks", p._backward_hooks, I))
            if hasattr(p, "_post_accumulate_grad_hooks"):
                attrs.append((p, "_post_accumulate_grad_hooks", p._post_accumulate_grad_hooks, I))
        for _, d, k in self._attrs:
            if k in d:
                keys.append((d, k, d[k], mode(d[k])))
        return ext.StateGuard(keys, dicts, lists, attrs, cells)


def _parameters(objs):
    import torch
    out, seen = [], set()
    for o in objs:
        named = (o.named_parameters() if isinstance(o, torch.nn.Module) else
                 ((f"param_groups[{i}]['params'][{j}]", p) for i, g in enumerate(o.param_groups)
                  for j, p in enumerate(g["params"])))
        for name, p in named:
            if id(p) not in seen:
                seen.add(id(p))
                out.append((f"{type(o).__name__} parameter {name}", p))
    return out


def _module_containers(objs):
    """(label, module __dict__, key) for every attribute of the modules in objs that is not
    a plain setting, tensor, module or private: containers a forward may read."""
    import torch
    out = []
    plain = (bool, int, float, str, type(None), tuple, torch.Tensor, torch.nn.Module)
    for o in objs:
        if isinstance(o, torch.nn.Module):
            for name, m in o.named_modules():
                d = m.__dict__
                for k, v in d.items():
                    if not k.startswith("_") and not isinstance(v, plain):
                        out.append((f"{type(o).__name__}{'.' + name if name else ''}.{k}", d, k))
    return out
