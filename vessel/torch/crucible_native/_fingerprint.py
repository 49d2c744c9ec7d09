"""Fingerprints of Python state: everything reachable from some roots (a step's closure, the
globals its code names, its bound self, its arguments), flattened in a deterministic walk, so
that two walks of unchanged state are equal entry by entry and the first entry that differs
names the change (`f global 'n' of __main__ changed 9 -> 10`). Used by purity.Watch around a
captured call and by _python_guard.PythonGuard before each plan run.

Numbers and strings are compared by value; tensors by identity (their contents change only
through ATen ops, which a plan replays); containers by type, length and members; functions by
their code, closure cells, defaults and the globals their bytecode loads or stores; other
objects by their __dict__ and __slots__. Modules, classes, builtins and library functions are
opaque (identity only).
"""
from __future__ import annotations

import math
import types
from collections import OrderedDict as _OrderedDict
from functools import partial as _partial

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
_ABSENT = object()  # a missing attribute or key
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

    def __init__(self, roots, skip_ids=frozenset(), skip_codes=frozenset(), param_hooks=True):
        t = _types()
        self._param_hooks = param_hooks   # False: a step with no backward(), where no parameter hook runs
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
        alive, param_hooks = self.alive, self._param_hooks
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
                if param_hooks and oid not in skip and o.requires_grad and o.is_leaf:   # a parameter's hooks run Python
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
