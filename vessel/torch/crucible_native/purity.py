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
    step's code (through the torch, torch.random and torch.cuda modules).
Recognized LR schedulers (torch.optim.lr_scheduler.LRScheduler instances other than
ReduceLROnPlateau) stepped with no arguments after their optimizer's last step() inside the
step are the exception: a plan runs their step() in Python after each run, so their changes
and the learning rates they set are not refusals.
"""
from __future__ import annotations

import logging
import math
from collections import OrderedDict as _OrderedDict
from functools import partial as _partial
import sys
import threading
import types

_MAX_NODES = 200_000       # values walked per fingerprint; a step reaching more is refused
_MAX_ARRAY_BYTES = 1 << 20  # NumPy arrays up to this size are fingerprinted by content
_SHOWN = 60                # characters of a value or of printed text quoted in a message

_ATOMIC = (int, float, bool, complex, str, bytes, type(None))
_ATOMIC_TYPES = frozenset(_ATOMIC)
_LIBRARY_PREFIXES = ("torch", "numpy", "crucible_native", "typing", "functools", "collections",
                     "logging", "warnings", "contextlib", "abc", "copy", "threading", "weakref")


class _Key:
    """A dict key as a path element, formatted only when a message needs it; equal to another
    when the keys are the same object or equal atomic values (a tensor key of optimizer state
    is never compared by value)."""
    __slots__ = ("k",)

    def __init__(self, k):
        self.k = k

    def __eq__(self, other):
        if type(other) is not _Key:
            return False
        a, b = self.k, other.k
        return a is b or (type(a) in _ATOMIC_TYPES and type(a) is type(b) and a == b)

    def __str__(self):
        k = self.k
        if type(k) in _ATOMIC_TYPES:
            return f"[{_short(k)}]"
        shape = getattr(k, "shape", None)
        if shape is not None:
            return f"[<{type(k).__name__} {tuple(shape)}>]"
        return f"[<{type(k).__name__}>]"


def _short(v) -> str:
    try:
        s = repr(v)
    except Exception:   # a repr that raises must not hide the finding
        s = f"<{type(v).__name__}>"
    return s if len(s) <= _SHOWN else s[:_SHOWN - 3] + "..."


def _library_function(f) -> bool:
    mod = getattr(f, "__module__", None) or ""
    return mod.split(".", 1)[0] in _LIBRARY_PREFIXES


_names_of_code = {}


def _code_names(code, skip_codes=frozenset()):
    """Global names a code object and the code objects nested in it (lambdas, comprehensions,
    inner functions; not those in skip_codes) read or write, sorted."""
    key = (code, skip_codes)
    names = _names_of_code.get(key)
    if names is None:
        import dis
        out, todo = set(), [code]
        while todo:
            c = todo.pop()
            # co_names also holds attribute names (opt.step): only the global accesses count
            out.update(ins.argval for ins in dis.get_instructions(c) if ins.opname in _GLOBAL_OPS)
            todo.extend(x for x in c.co_consts if isinstance(x, types.CodeType) and x not in skip_codes)
        names = _names_of_code[key] = tuple(sorted(out))
    return names


_used_of_code = {}


def _used_freevars(code, skip_codes):
    """The free variables of `code` that its own instructions, or code nested in it that is
    not in skip_codes, read or write; None when nothing is skipped (all of them)."""
    if not skip_codes:
        return None
    key = (code, skip_codes)
    used = _used_of_code.get(key)
    if used is None:
        import dis
        used, todo = set(), [code]
        while todo:
            c = todo.pop()
            used.update(ins.argval for ins in dis.get_instructions(c) if ins.opname in _DEREF_OPS)
            for x in c.co_consts:
                if isinstance(x, types.CodeType) and x not in skip_codes:
                    used.update(x.co_freevars)
                    todo.append(x)
        used = _used_of_code[key] = frozenset(used)
    return used


_DEREF_OPS = frozenset(("LOAD_DEREF", "STORE_DEREF", "DELETE_DEREF", "LOAD_CLASSDEREF"))
_GLOBAL_OPS = frozenset(("LOAD_GLOBAL", "STORE_GLOBAL", "DELETE_GLOBAL", "LOAD_NAME", "STORE_NAME",
                         "DELETE_NAME"))


_PLAIN_OBJECT = {}  # type -> its instances are walked by __dict__ alone (Fingerprint._plain_object_type)
_LABELS = {}        # (kind, name, module) -> the label string, made once
_ID = object()     # first item of an identity entry: (_ID, id(obj))
_SEEN = object()   # first item of a shared-object entry: (_SEEN, index of its first entry)
_TYPES = None


def _types():
    """(torch.Tensor, torch.nn.Module, numpy.ndarray, numpy.random.Generator), looked up once
    (() for NumPy's when it is not installed)."""
    global _TYPES
    if _TYPES is None:
        import torch
        try:
            import numpy as np
            nd, gen = np.ndarray, np.random.Generator
        except ImportError:
            nd = gen = ()
        _TYPES = (torch.Tensor, torch.nn.Module, nd, gen)
    return _TYPES


def _equal(a, b) -> bool:
    if a is b:
        return True
    if type(a) is not type(b):
        return False
    if type(a) is float and math.isnan(a) and math.isnan(b):
        return True
    try:
        return bool(a == b)
    except Exception:
        return False


class Fingerprint:
    """The values reachable from some roots, flattened in a deterministic walk order: each
    entry is (fingerprint, parent index, label). Two fingerprints of the same unchanged state
    are equal entry by entry; the first entry that differs names the change."""

    def __init__(self, roots, skip_ids=frozenset(), skip_codes=frozenset()):
        t = _types()
        self._tensor, self._module, self._ndarray, self._np_gen = t
        self._skip = skip_ids       # objects compared by identity only (schedulers and what they own, ...)
        self._skip_codes = skip_codes   # nested code whose globals are not walked (after_step functions)
        self.fp, self.parent, self.label = [], [], []
        self.objects = []           # every object walked into (not opaque ones), in walk order
        self.alive = []             # what identity entries refer to, kept alive so ids stay unique
        self.leaf_tensors = []      # tensors that require grad and are leaves: their hooks are walked
        self.overflow = False
        self._seen = {}
        self._walk([(obj, -1, label) for label, obj in reversed(roots)])

    # -- the walk ----------------------------------------------------------------------
    def _walk(self, stack):
        """Iterative depth-first walk (deep object graphs must not hit the recursion limit).
        Children are walked last first; the order only has to be the same in two walks.
        An entry compared by identity is (_ID, id(obj)), compared in C without calling the
        object's __eq__ (a tensor's is elementwise)."""
        fp, par, lab, seen, skip, objects = self.fp, self.parent, self.label, self._seen, self._skip, self.objects
        alive = self.alive
        tensor, children, atomic = self._tensor, self._children, _ATOMIC_TYPES
        pop, push = stack.pop, stack.append
        while stack:
            o, parent, label = pop()
            par.append(parent)
            lab.append(label)
            t = type(o)
            if t in atomic:
                fp.append(o)
                continue
            oid = id(o)
            if oid in seen:                  # shared or cyclic: the path it was first seen by
                fp.append((_SEEN, seen[oid]))
                continue
            i = len(fp)
            if i >= _MAX_NODES:
                self.overflow = True
                fp.append(None)
                return
            if oid in skip or isinstance(o, tensor):   # tensors change through ATen ops only
                fp.append((_ID, oid))
                alive.append(o)
                if oid not in skip and o.requires_grad and o.is_leaf:   # a parameter's hooks run Python
                    self.leaf_tensors.append(o)
                    h = o._backward_hooks
                    if h:
                        push((h, i, "._backward_hooks"))
                    h = getattr(o, "_post_accumulate_grad_hooks", None)
                    if h:
                        push((h, i, "._post_accumulate_grad_hooks"))
                continue
            if isinstance(o, _ATOMIC):       # subclasses of int, str, ... (enums)
                fp.append(o)
                continue
            head = children(o, i, push)
            if head is None:                 # opaque: identity only
                fp.append((_ID, oid))
                alive.append(o)
                continue
            fp.append(head)
            seen[oid] = i
            objects.append(o)

    def _plain_object_type(self, t) -> bool:
        """Instances of t are walked by their __dict__ alone: none of the kinds _children
        treats apart, no __slots__, not an iterator."""
        special = (dict, list, tuple, set, frozenset, self._module, types.FunctionType, types.MethodType,
                   types.ModuleType, type, types.BuiltinFunctionType, types.CodeType, types.GeneratorType,
                   _partial) + tuple(x for x in (self._ndarray, self._np_gen) if x)
        return (not issubclass(t, special) and not issubclass(t, _ATOMIC) and t.__dictoffset__ != 0
                and not _slots(t) and not hasattr(t, "__next__")
                and not t.__module__.startswith("crucible_native"))

    def _children(self, o, i, push):
        """The fingerprint of o itself, with its children pushed as (child, i, label); None for
        an opaque value (compared by identity)."""
        t = type(o)
        plain = _PLAIN_OBJECT.get(t)
        if plain is None:
            plain = _PLAIN_OBJECT[t] = self._plain_object_type(t)
        if plain:                            # an instance of a user class: its attributes
            d = o.__dict__
            for k, v in d.items():
                push((v, i, "." + k))
            return (t, len(d))
        if t is dict or t is _OrderedDict or isinstance(o, dict):
            if not o:
                return (t, 0, ())
            keys = tuple(o)
            for k in keys:
                push((o[k], i, _Key(k)))
            ks = []
            for k in keys:
                if type(k) in _ATOMIC_TYPES:
                    ks.append(k)
                else:
                    ks.append((_ID, id(k)))
                    self.alive.append(k)
            return (t, len(keys), tuple(ks))
        if t is list or t is tuple or isinstance(o, (list, tuple)):
            for j, v in enumerate(o):
                push((v, i, j))
            return (t, len(o))
        if isinstance(o, self._module):
            d = o.__dict__
            for k, v in d.items():
                push((v, i, "." + k))
            return (t, len(d))
        if isinstance(o, (set, frozenset)):
            try:
                return (t, frozenset(o))
            except TypeError:
                return (t, len(o))
        if t is types.FunctionType:
            if _library_function(o):
                return None
            code = o.__code__
            used = _used_freevars(code, self._skip_codes)
            for name, cell in zip(code.co_freevars, o.__closure__ or ()):
                if used is not None and name not in used:   # only passed on to an after_step function
                    continue
                try:
                    v = cell.cell_contents
                except ValueError:        # an empty cell
                    v = _EMPTY
                lab = _LABELS.get(("c", name))
                if lab is None:
                    lab = _LABELS[("c", name)] = f" closure variable '{name}'"
                push((v, i, lab))
            g = o.__globals__
            for name in _code_names(code, self._skip_codes):
                if name in g:
                    v = g[name]
                    if not isinstance(v, (types.ModuleType, type)):
                        lab = _LABELS.get(("g", name, o.__module__))
                        if lab is None:
                            lab = _LABELS[("g", name, o.__module__)] = f" global '{name}' of {o.__module__}"
                        push((v, i, lab))
            defaults = o.__defaults__
            if defaults:
                names = code.co_varnames[code.co_argcount - len(defaults):code.co_argcount]
                for name, v in zip(names, defaults):
                    push((v, i, f" default of argument '{name}'"))
            if o.__kwdefaults__:
                for name, v in o.__kwdefaults__.items():
                    push((v, i, f" default of argument '{name}'"))
            return (t, code)
        if t is types.MethodType:
            push((o.__self__, i, ".__self__"))
            push((o.__func__, i, ".__func__"))
            return (t,)
        if isinstance(o, (types.ModuleType, type, types.BuiltinFunctionType, types.CodeType)):
            return None
        if t.__module__.startswith("crucible_native"):   # a compiled step: its plans are not the user's state
            return None
        if self._np_gen and isinstance(o, self._np_gen):
            push((o.bit_generator.state, i, ".bit_generator.state"))
            return (t,)
        if self._ndarray and isinstance(o, self._ndarray):
            if o.nbytes <= _MAX_ARRAY_BYTES:
                return (t, o.shape, str(o.dtype), o.tobytes())
            return None
        if t is types.GeneratorType:
            f = o.gi_frame
            if f is None:
                return (t, "finished")
            for k, v in f.f_locals.items():
                push((v, i, f" local '{k}'"))
            return (t, f.f_lasti)
        if t is _partial:
            push((o.func, i, ".func"))
            push((o.args, i, ".args"))
            push((o.keywords, i, ".keywords"))
            return (t,)
        d = getattr(o, "__dict__", None)
        slots = _slots(t)
        if isinstance(d, dict):
            for k, v in d.items():
                push((v, i, "." + k))
            for k in slots:
                if hasattr(o, k):
                    push((getattr(o, k), i, "." + k))
            return (t, len(d))
        if slots:
            for k in slots:
                if hasattr(o, k):
                    push((getattr(o, k), i, "." + k))
            return (t,)
        if hasattr(o, "__next__") and hasattr(o, "__reduce__"):   # a builtin iterator: its position
            try:
                r = o.__reduce__()
            except Exception:
                return None
            push((r, i, " (iterator state)"))
            return (t,)
        return None

    # -- comparing -----------------------------------------------------------------------
    def _show(self, entry) -> str:
        """An entry of fp in words: an identity entry by its object's type and address."""
        if isinstance(entry, tuple) and len(entry) == 2 and entry[0] is _ID:
            o = next((x for x in self.alive if id(x) == entry[1]), None)
            return f"{type(o).__name__} object at {entry[1]:#x}"
        if isinstance(entry, tuple) and entry and isinstance(entry[0], type):
            return f"a {entry[0].__name__}"
        return _short(entry)

    def path(self, i) -> str:
        parts = []
        while i >= 0:
            lab = self.label[i]
            parts.append(f"[{lab}]" if type(lab) is int else str(lab))
            i = self.parent[i]
        return "".join(reversed(parts))

    def first_difference(self, after: "Fingerprint"):
        """A sentence naming the first value that differs between self (before) and after, or None."""
        a, b = self.fp, after.fp
        for i in range(min(len(a), len(b))):
            x, y = a[i], b[i]
            if _equal(x, y):
                if self.label[i] == after.label[i] and self.parent[i] == after.parent[i]:
                    continue
            return self._describe(i, x, after, y)
        if len(a) != len(b):
            i = min(len(a), len(b))
            where = after.path(i) if len(b) > len(a) else self.path(i)
            return f"{where} {'appeared' if len(b) > len(a) else 'disappeared'}"
        return None

    def _describe(self, i, x, after, y):
        where = after.path(i) if after.label[i] != self.label[i] else self.path(i)
        if after.label[i] != self.label[i] or after.parent[i] != self.parent[i]:
            return f"{self.path(i)} was replaced or reordered (now {after.path(i)})"
        if isinstance(x, tuple) and isinstance(y, tuple) and len(x) >= 2 and len(y) >= 2 \
                and x[0] is y[0] and isinstance(x[1], int) and isinstance(y[1], int) and x[1] != y[1]:
            kind = getattr(x[0], "__name__", str(x[0]))
            verb = "grew" if y[1] > x[1] else "shrank"
            return f"{where} ({kind}) {verb} {x[1]} -> {y[1]} items"
        if isinstance(x, tuple) and isinstance(y, tuple) and x and y and x[0] is not y[0]:
            return f"{where} changed type {getattr(x[0], '__name__', x[0])} -> {getattr(y[0], '__name__', y[0])}"
        if isinstance(x, tuple) and isinstance(y, tuple) and x and y and x[0] is y[0] and isinstance(x[0], type):
            rest = lambda e: _short(e[1] if len(e) == 2 else e[1:])   # noqa: E731
            return f"{where} ({x[0].__name__}) changed {rest(x)} -> {rest(y)}"
        if isinstance(x, tuple) or isinstance(y, tuple):
            return (f"{where} was rebound to another object ({self._show(x)} -> {after._show(y)})")
        return f"{where} changed {_short(x)} -> {_short(y)}"


class _Empty:
    def __repr__(self):
        return "<empty>"


_EMPTY = _Empty()


def _slots(t):
    out = []
    for k in getattr(t, "__mro__", ()):
        s = k.__dict__.get("__slots__", ())
        if isinstance(s, str):
            s = (s,)
        out.extend(x for x in s if x not in ("__dict__", "__weakref__"))
    return out


# -- roots ------------------------------------------------------------------------------------
def call_roots(call_args):
    """(label, object) for a call's arguments that are not tensors nor plain values (a dict of
    settings, a logger object): the step may change them, or branch on what they hold. The
    call's key holds plain values and tensors' metadata; an object hashed by identity is the
    same key whatever it holds, so its contents are checked like the step's own state."""
    args, kwargs = call_args if call_args else ((), {})
    out = []
    for i, a in enumerate(args):
        if type(a) not in _ATOMIC_TYPES:
            out.append((f"argument {i}", a))
    for k, a in (kwargs or {}).items():
        if type(a) not in _ATOMIC_TYPES:
            out.append((f"argument '{k}'", a))
    return out


def step_roots(fn, extra, hooks=True):
    """(label, object) for everything the step reaches directly: its bound self, the
    closure cells and globals of its code (and of a functools.partial's function), the
    objects passed as guard=, and the global hooks of modules and optimizers."""
    import functools
    roots = []
    seen_fn = set()

    def add_function(f, name):
        while isinstance(f, functools.partial):
            roots.append((f"{name}.args", f.args))
            roots.append((f"{name}.keywords", f.keywords))
            f = f.func
        if isinstance(f, types.MethodType):
            roots.append(("self", f.__self__))
            f = f.__func__
        if id(f) in seen_fn:
            return
        seen_fn.add(id(f))
        if isinstance(f, types.FunctionType):
            roots.append((name, f))
        elif f is not None and not isinstance(f, (types.BuiltinFunctionType, type)):
            roots.append((name, f))   # a callable object: its attributes
            call = getattr(type(f), "__call__", None)
            if isinstance(call, types.FunctionType) and not _library_function(call):
                roots.append((f"{name}.__call__", call))

    add_function(fn, getattr(fn, "__name__", "step"))
    for i, o in enumerate(extra):
        roots.append((f"guard[{i}]", o))
    if not hooks:
        return roots
    import torch.nn.modules.module as mm
    import torch.optim.optimizer as oo
    for name in ("_global_forward_hooks", "_global_forward_pre_hooks", "_global_backward_hooks",
                 "_global_backward_pre_hooks", "_global_forward_hooks_always_called",
                 "_global_forward_hooks_with_kwargs"):
        d = getattr(mm, name, None)
        if d is not None:
            roots.append((f"torch.nn.modules.module.{name}", d))
    for name in ("_global_optimizer_pre_hooks", "_global_optimizer_post_hooks"):
        d = getattr(oo, name, None)
        if d is not None:
            roots.append((f"torch.optim.optimizer.{name}", d))
    return roots


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

    def __init__(self, fn, extra, guarded, skip_ids, closures=(), call_args=()):
        """closures: the step's after_step functions. What they reach is theirs to change
        after each call (a log they append to): their code's globals are not walked, nor is
        a function passed to after_step that the step names; the step's own code still
        guards everything it reads itself."""
        self._fn, self._extra = fn, extra
        self._call_args = call_roots(call_args)
        self._skip = frozenset(skip_ids) | frozenset(id(o) for o in guarded) | frozenset(id(f) for f in closures)
        self._skip_codes = frozenset(c for c in (getattr(f, "__code__", None) for f in closures) if c is not None)
        self._attrs = _module_containers(guarded)
        self._params = _parameters(guarded)   # walked for their hooks (a new one runs Python)
        self.fp = Fingerprint(self._roots(), self._skip, self._skip_codes)
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
        now = Fingerprint(self._roots(), self._skip, self._skip_codes)
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

    def note_seed(self, name):
        f = sys._getframe(2)
        mod = f.f_globals.get("__name__", "") or ""
        if mod.split(".", 1)[0] in ("torch", "crucible_native"):
            return
        self.problems.append(f"{name}() reset torch's random generator at {f.f_code.co_filename}:{f.f_lineno}: "
                             f"a replay would keep drawing where its last run left off")

    def note_read(self, method):
        f = sys._getframe(2)
        mod = f.f_globals.get("__name__", "") or ""
        if mod.split(".", 1)[0] in ("torch", "crucible_native"):
            return
        self.problems.append(f"Tensor.{method}() read a tensor's values into Python at "
                             f"{f.f_code.co_filename}:{f.f_lineno}")

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


_ABSENT = object()


def _seeding(orig, name):
    def seed(*args, **kwargs):
        w = Watch._active
        if w is not None and threading.get_ident() == w.thread:
            w.note_seed(name)
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
