"""crucible.compile: capture a training step, build an ExecutionPlan, replay it from C++."""
from __future__ import annotations

import math
import threading
import time
import weakref

from . import recorder as _recording
from . import _sizes
from ._args import _nonnegative_int
from ._compile_stats import COUNTERS as _COUNTERS, live_steps as _live_steps, retire_stats as _retire_stats
from ._errors import CrucibleError, CrucibleTypeError, CrucibleValueError, CrucibleWarning
from ._native import ext as _ext
from .optimizer_sources import ScalarSources as _ScalarSources
from ._python_guard import PythonGuard as _PythonGuard
from .purity import Watch as _Watch
from ._sync import Hooks as _Hooks, SyncPoint as _SyncPoint, OwnPlans as _OwnPlans, MAX_IDLE_REPLANS as _MAX_IDLE_REPLANS, \
    VARIANT_CAPTURES as _VARIANT_CAPTURES

_MISSING = object()
_PLAIN = (bool, int, float, str, type(None), tuple)

_ONE_TENSOR = ("t",)
_MAX_SIGNATURES = 64   # call signatures (plans) per compiled step; more run eagerly (a new size evicts one)

# Note [New sizes]: a plan's form holds the sizes of its recorded calls. A new size of a step
# whose sizes vary (a sequence length, a short last batch) is bound without a recorded call when
# two sizes of a whole-step plan are known and its sizes keep the step's Python on their path
# (Note [Bound sizes], Replay.cpp; _bind_sizes): that costs about a tenth of a millisecond, and
# is tried first. Else it costs captured calls and a build — one capture when the call repeats
# another size's plan (Note [Size families], Replay.cpp; _build_like), else two — which only
# calls at that size can win back. The first _FREE_SIZES sizes of a family (the
# signatures that differ only in tensor sizes and strides) compile at once; after that a new size
# runs eagerly until the time its calls could have saved covers what compiling a size costs
# (ski rental: never more than twice the better choice in hindsight), both measured on the
# family's own calls: the eager calls' and the plan runs' seconds, and the least a size's
# captures and build took beyond an eager call each (the first size also compiled the kernels;
# sizes derived from one recorded call counted apart, and expected once another size has a
# plan).
# While those are not known yet (the first sizes still recording, or seen once and never
# again) a new size waits _BLIND_WAIT calls at most. A size whose plan would not be faster than
# eager is never captured. stats()["size_waits"] counts the calls that waited.
_FREE_SIZES = 2
_BLIND_WAIT = 8
_LIKE_TRIES = 4   # Note [Size families]: plans of other sizes a new size's first call is compared with


class _NotStrided(Exception):
    """A tensor argument that is not strided (sparse, mkldnn): no plan holds it."""

    def __init__(self, layout):
        super().__init__(str(layout))
        self.layout = layout


class _Family:
    """The signatures of a step that differ only in tensor sizes and strides (Note [New sizes])."""
    __slots__ = ("free", "signatures", "started", "eager_s", "plan_s", "onboard_s", "derived_s", "bind", "bind_why")

    def __init__(self, free):
        self.free = free       # sizes compiled at once
        self.signatures = 0    # signatures of the family seen
        self.started = 0       # of them, captured once (compiled, being compiled, refused or abandoned)
        self.eager_s = None    # running means (seconds): an eager call, a plan run
        self.plan_s = None
        self.onboard_s = None  # the least compiling a size took beyond the eager calls it replaced
        self.derived_s = None  # the same for a size derived from one recorded call (Note [Size families])
        # Note [Bound sizes]: (template entry, derived entry, SizeGuard) that new sizes are bound
        # from without a recorded call; else why not (for stats and plans())
        self.bind, self.bind_why = None, None

    @staticmethod
    def _mean(old, new):
        return new if old is None else 0.75 * old + 0.25 * new

    def note_eager(self, s):
        self.eager_s = self._mean(self.eager_s, s)

    def note_plan(self, s):
        self.plan_s = self._mean(self.plan_s, s)

    def note_onboard(self, s, derived=False):
        # The least a size took: the first one also compiled the kernels the others reuse. A
        # derived size (one recorded call) apart from one recorded twice.
        s = max(s, 0.0)
        if derived:
            self.derived_s = s if self.derived_s is None else min(self.derived_s, s)
        else:
            self.onboard_s = s if self.onboard_s is None else min(self.onboard_s, s)

    def wait(self, evicting=False, derive=False) -> float:
        """How many calls a new size of the family runs eagerly before it is captured. A size
        that takes an evicted size's place always waits its rental, new_sizes="compile" or not:
        a loop over more sizes than the step holds would otherwise capture every call. derive:
        another size has a plan, so this one will likely cost one recorded call."""
        if self.started < self.free and not evicting:
            return 0
        cost = self.derived_s if derive and self.derived_s is not None else self.onboard_s
        if cost is None or self.plan_s is None:
            return _BLIND_WAIT   # the first sizes have not said yet what compiling costs and saves
        if self.eager_s is None:
            return 1   # one eager call, timed, before judging
        saving = self.eager_s - self.plan_s
        return math.inf if saving <= 0 else max(1, math.ceil(cost / saving))


def _family_key(key):
    """The signature key with each tensor's sizes and strides reduced to its rank."""
    import torch
    return tuple((len(k[0]),) + k[2:] if isinstance(k, tuple) and len(k) == 5 and isinstance(k[0], torch.Size)
                 else k for k in key)
_MAX_ATTEMPTS = 3      # captures that cannot be used (impure, or two that disagree) before a signature runs eagerly
_MODES = ("auto", "replay", "sync")
# What runs a whole-step plan's ops (Note [Exec replay], vessel/torch/ReplayPlan.h): the plan
# itself ("replay": its ATen ops in order), or the exec stage's plan of the same call, built
# through Forge, on the null backend (every kernel an ATen call on memory the plan placed) or on
# Mimic's CPU backend (generated kernels where they give ATen's bits, ATen calls elsewhere).
_BACKENDS = ("replay", "null", "cpu")
_DEFAULT_BACKEND = "cpu"
# What the CPU backend may generate (Note [Fast numerics], src/mimic/cpu/CpuBackend.cpp).
_NUMERICS = ("bitwise", "fast")
_NEW_SIZES = ("auto", "compile", "record")   # Note [New sizes]


def _rules_dir() -> str:
    """Forge's rules: CRUCIBLE_RULES_DIR, the installed package's copy, or the source tree's."""
    import os
    env = os.environ.get("CRUCIBLE_RULES_DIR")
    if env:
        return env
    here = os.path.dirname(os.path.abspath(__file__))
    for d in (os.path.join(here, "rules"), os.path.join(here, "..", "..", "..", "rules")):
        if os.path.isfile(os.path.join(d, "base.toml")):
            return os.path.normpath(d)
    raise CrucibleError("crucible.compile(backend=...): Forge's rules (base.toml) are neither in the package "
                        "nor in the source tree; set CRUCIBLE_RULES_DIR to the repository's rules/ directory")


class _Unsupported(Exception):
    pass


def _flatten_out(obj, flat):
    """Output structure of the step: tensors, None, and tuples/lists/dicts of them."""
    import torch
    if obj is None:
        return ("n",)
    if isinstance(obj, torch.Tensor):
        flat.append(obj)
        return _ONE_TENSOR
    if isinstance(obj, (tuple, list)):
        return ("l" if isinstance(obj, list) else "u", tuple(_flatten_out(o, flat) for o in obj))
    if isinstance(obj, dict):
        keys = tuple(obj)
        return ("d", keys, tuple(_flatten_out(obj[k], flat) for k in keys))
    raise _Unsupported(
        f"the step returns a {type(obj).__name__}; a compiled step returns tensors (or tuples, lists "
        f"and dicts of them). Return the tensor and call .item() outside the step")


def _unflatten_out(spec, it):
    kind = spec[0]
    if kind == "n":
        return None
    if kind == "t":
        return next(it)
    if kind in ("l", "u"):
        items = [_unflatten_out(s, it) for s in spec[1]]
        return items if kind == "l" else tuple(items)
    return {k: _unflatten_out(s, it) for k, s in zip(spec[1], spec[2])}


_closures = threading.local()


def _closure_stack() -> list:
    """This thread's compiled calls in progress, innermost last: each a list of the
    (function, tensors) that after_step registered during it."""
    st = getattr(_closures, "stack", None)
    if st is None:
        st = _closures.stack = []
    return st


def after_step(fn, *tensors) -> None:
    """Runs fn(*tensors) once the values of `tensors` are final: inside a compiled step, when
    the call returns (after its plan has run, or after the eager call); elsewhere, at once.

        def train_step(x, y):
            ...
            crucible.after_step(lambda l: losses.append(l.item()), loss)
            return loss

    Reading a value with .item() inside a compiled step makes it impure (a replay would not
    give Python the value), and the step runs eagerly; after_step keeps the step pure: the
    tensors become outputs of the plan, and fn runs in Python after each run. fn must not
    close over the step's own local variables (each call would see those of the recorded
    call): pass what it needs as tensors, or bind it through a global or an enclosing
    scope. If the step raises, its after_step functions do not run."""
    import torch
    if not callable(fn):
        raise CrucibleTypeError(f"after_step: fn must be callable, got {type(fn).__name__}")
    for i, t in enumerate(tensors):
        if not isinstance(t, torch.Tensor):
            raise CrucibleTypeError(f"after_step: argument {i + 1} must be a tensor, got {type(t).__name__}; "
                                    f"pass other values through fn's scope")
    stack = _closure_stack()
    if not stack:
        fn(*tensors)
        return
    stack[-1].append((fn, tensors))


def _closures_differ(before, now):
    """Why the after_step functions of two calls cannot be taken for one another, or None.
    A plan calls the ones of its last recorded call: each must be the same function, or one
    made from the same code whose closure holds the same cells (no local of the call) and
    whose defaults are the same objects."""
    if len(before) != len(now):
        return f"the step made {len(before)} after_step calls in one call and {len(now)} in another"
    for i, (a, b) in enumerate(zip(before, now)):
        if a is b:
            continue
        name = getattr(b, "__qualname__", type(b).__name__)
        code_a, code_b = getattr(a, "__code__", None), getattr(b, "__code__", None)
        if code_a is None or code_a is not code_b:
            return f"after_step call {i + 1} passed another function ({name}) than in the recorded call"
        cells_a, cells_b = a.__closure__ or (), b.__closure__ or ()
        for var, ca, cb in zip(code_b.co_freevars, cells_a, cells_b):
            if ca is not cb:
                return (f"the after_step function {name} closes over '{var}', a local variable of the step: "
                        f"a plan run would give it the value of the recorded call. Pass it as a tensor "
                        f"argument of after_step")
        da, db = a.__defaults__ or (), b.__defaults__ or ()
        if len(da) != len(db) or any(x is not y for x, y in zip(da, db)):
            return (f"the after_step function {name} has default arguments bound to values of each call; "
                    f"pass them as tensor arguments of after_step")
    return None


def _describe_key(key) -> str:
    """A call signature (CompiledStep._signature's key) in words: its tensor shapes and dtypes."""
    parts = []
    for k in key[1:-1]:
        if isinstance(k, tuple) and len(k) == 5 and hasattr(k[0], "__len__"):
            parts.append(f"{str(k[2]).replace('torch.', '')}{list(k[0])}")
        elif isinstance(k, tuple) and len(k) == 2 and isinstance(k[0], type) and k[0] not in (tuple, list, dict):
            parts.append(repr(k[1]))
    return "(" + ", ".join(parts) + ")"


def _guards_nothing():
    """A function that uses no module or optimizer (_discover_state of a guard entry alone)."""


def _discover_state(fn, extra):
    """Modules and optimizers the step uses: bound self, closure cells, globals it names, and
    one level of attributes of those (a trainer object holding model and optimizer)."""
    import torch
    found, seen = [], set()

    def add(o, depth):
        if o is None or id(o) in seen:
            return
        seen.add(id(o))
        if isinstance(o, (torch.nn.Module, torch.optim.Optimizer)):
            found.append(o)
        elif depth > 0 and hasattr(o, "__dict__") and not isinstance(o, type) and not callable(o):
            for v in list(vars(o).values()):
                add(v, depth - 1)
        elif depth > 0 and isinstance(o, (list, tuple)):
            for v in o:
                add(v, depth - 1)

    for o in extra:
        add(o, 1)
    f = getattr(fn, "__func__", fn)
    add(getattr(fn, "__self__", None), 1)
    for cell in getattr(f, "__closure__", None) or ():
        try:
            add(cell.cell_contents, 1)
        except ValueError:  # empty cell
            pass
    for v in (getattr(f, "__defaults__", None) or ()) + tuple((getattr(f, "__kwdefaults__", None) or {}).values()):
        add(v, 1)
    code, g = getattr(f, "__code__", None), getattr(f, "__globals__", {})
    for name in (code.co_names if code is not None else ()):
        add(g.get(name), 1)
    return found


class _StateGuard:
    """Identity of every parameter, buffer and optimizer state tensor, and the value of every
    training flag and optimizer hyperparameter, as of one moment. ok() is the per-call check
    (in C++: _ext.StateGuard walks the dicts without hashing their keys): a replaced
    parameter, a loaded optimizer state, train()/eval() or a new learning rate fail it.
    Hyperparameters in `lifted` (taken over by the plan as patch points) are not checked."""

    IDENT, EQUAL, IGNORE = 0, 1, 2

    def __init__(self, objs, lifted=None):
        import torch
        lifted = lifted or {}   # id(param group) -> hyperparameter names that are patch points now
        keys, dicts, lists, hyper = [], [], [], []
        I, E, X = self.IDENT, self.EQUAL, self.IGNORE

        def snap(d, mode_of):
            dicts.append((d, [(k, v, mode_of(k, v)) for k, v in d.items()]))

        for o in objs:
            if isinstance(o, torch.nn.Module):
                for m in o.modules():
                    snap(m._parameters, lambda k, v: I)
                    snap(m._buffers, lambda k, v: I)
                    for k, v in vars(m).items():   # a hook added later runs Python a plan would skip
                        if k.endswith("hooks") and isinstance(v, dict):
                            snap(v, lambda k, v: I)
                    keys.append((m.__dict__, "training", m.training, E))
                    # plain settings a forward reads (dropout p, batchnorm momentum and eps)
                    for k, v in vars(m).items():
                        if not k.startswith("_") and k != "training" and isinstance(v, _PLAIN):
                            keys.append((m.__dict__, k, v, E))
            else:
                for k, v in vars(o).items():
                    if k.endswith("hooks") and isinstance(v, dict):
                        snap(v, lambda k, v: I)
                keys.append((o.__dict__, "state", o.state, I))
                keys.append((o.__dict__, "param_groups", o.param_groups, I))
                lists.append((o.param_groups, list(o.param_groups)))
                for g in o.param_groups:
                    skip = lifted.get(id(g), ())
                    lists.append((g["params"], list(g["params"])))
                    snap(g, lambda k, v, skip=skip: I if k == "params" else (X if k in skip else E))
                    hyper.extend((g, k, v) for k, v in g.items() if k != "params" and k not in skip)
                snap(o.state, lambda k, v: I)
                for st in o.state.values():
                    snap(st, lambda k, v: I if isinstance(v, torch.Tensor) else E)
        import torch.nn.modules.module as mm
        import torch.optim.optimizer as oo
        for src, names in ((mm, ("_global_forward_hooks", "_global_forward_pre_hooks", "_global_backward_hooks",
                                 "_global_backward_pre_hooks", "_global_forward_hooks_always_called",
                                 "_global_forward_hooks_with_kwargs")),
                           (oo, ("_global_optimizer_pre_hooks", "_global_optimizer_post_hooks"))):
            for name in names:
                d = getattr(src, name, None)
                if isinstance(d, dict):
                    snap(d, lambda k, v: I)
        self._hyper = hyper
        self._parts = (keys, dicts, lists)
        self._native = _ext.StateGuard(keys, dicts, lists)
        self.ok = self._native.ok

    def without(self, lifted):
        """This guard, as of the same moment, with the hyperparameters in `lifted` (id(param
        group) -> names) no longer checked."""
        if not lifted:
            return self
        keys, dicts, lists = self._parts
        X = self.IGNORE
        dicts = [(d, [(k, v, X if k in lifted.get(id(d), ()) else m) for k, v, m in entries])
                 for d, entries in dicts]
        g = object.__new__(_StateGuard)
        g._hyper = [(d, k, v) for d, k, v in self._hyper if k not in lifted.get(id(d), ())]
        g._parts = (keys, dicts, lists)
        g._native = _ext.StateGuard(keys, dicts, lists)
        g.ok = g._native.ok
        return g


class _Entry:
    __slots__ = ("plan", "forms", "srcs", "spec", "seen", "refused", "guard", "lifted", "patched", "attempts",
                 "scheds", "causes", "cap_guard", "cap_srcs", "py", "cap_py", "closures", "cap_closures",
                 "form_closures", "replans_idle", "mode", "mode_why", "sync_misses", "hypers",
                 "cap_hyper", "variants", "var_forms", "capture_left", "searches", "guards", "var_guards",
                 "exec_ranges", "cap_range", "family", "started", "waited", "onboard", "used", "derived", "evicting",
                 "sync_lifted", "bound", "bind_tried", "cap_sizes", "form_sizes", "size_log", "bind_from",
                 "bind_guard")

    def __init__(self):
        self.plan, self.forms, self.srcs, self.spec, self.seen, self.refused, self.guard = None, [], [], None, 0, None, None
        self.scheds = None     # [(scheduler, times)] the step steps after its optimizers: run after each plan run
        self.causes = []       # every reason the signature was refused (explain())
        # Of the last captured call: the state guard as the call began (the hyperparameters its
        # ops were recorded with, even when the step changes them itself) and the scalar
        # sources' values for that call.
        self.cap_guard, self.cap_srcs = None, []
        self.py, self.cap_py = None, None   # PythonGuard: of the plan, and as the last captured call began
        # after_step functions: the plan's (called after each run), the last capture's, each form's
        self.closures, self.cap_closures, self.form_closures = [], [], []
        self.replans_idle = 0   # plans dropped by _update since this signature's last plan run
        self.lifted = {}       # id(param group) -> hyperparameters the plan takes from sources
        self.patched = False   # the plan has patch points: each run needs the sources' values
        self.attempts = 0      # plan builds that failed: two recorded calls disagreed
        # "replay" (whole-step), "sync" (sync-point: the Python runs), or None (not decided yet)
        self.mode, self.mode_why = None, None
        self.sync_misses = 0   # sync-point calls in a row that left the plan
        self.hypers = []       # per recorded form: the optimizers' hyperparameters as its call began
        self.cap_hyper = None  # the last captured call's
        # Sync-point plans of the other paths the step takes (a branch on a tensor value): the
        # recorded calls not yet paired, the calls still to record to find a new path, and how
        # many such searches ran.
        self.variants, self.var_forms, self.capture_left, self.searches = [], [], 0, 0
        self.family = None     # its _Family (Note [New sizes])
        self.started = False   # captured once (a signature that records again does not wait)
        self.waited = 0        # calls it ran eagerly waiting to be captured
        self.onboard = 0.0     # seconds its captures and builds took beyond an eager call each
        self.used = 0          # the step's call count at its last call (Note [Size families]: eviction)
        self.derived = False   # its plan was built from one recorded call beside another size's
        self.evicting = False  # it took an evicted size's place: it waits its rental (_Family.wait)
        self.sync_lifted = {}  # a sync-point plan's unguarded hyperparameters (its recorded calls differed)
        self.guards = []       # per recorded form: the state guard as its call began
        # backend "null"/"cpu": per recorded form, its call's ops in the trace and its tensor
        # arguments' storage ids (the exec stage plans the call from the trace)
        self.exec_ranges, self.cap_range = {}, None
        self.var_guards = []   # per plan of another path: its guard (e.guard is the first path's)
        # Note [Symbolic sizes] (_sizes.py): the last capture's size log and argument shapes,
        # the same per recorded form, and the plan's (of the form it was built from)
        self.cap_sizes, self.form_sizes, self.size_log = None, {}, None
        self.bound = False       # its plan was bound to its sizes without a recorded call (Note [Bound sizes])
        self.bind_tried = False  # binding was tried for it
        # (sib, d, ran): the sizes whose exec plans its bound plan's exec plan is made from, at
        # its first call after a run (Note [Bound exec plans]); None when done or not wanted
        self.bind_from = None
        self.bind_guard = None   # the SizeGuard it was bound under (plans() describes it)


class CompiledStep(_SyncPoint):
    """A training step compiled by crucible.compile. Call it like the function it wraps.

    Per call signature (the tensor arguments' shapes, strides, dtypes, devices and
    requires_grad; the other arguments' values): the first `warmup` calls run eagerly (the
    first step creates gradients and optimizer state), the next two are recorded, and when
    they agree an ExecutionPlan is built. Later calls run the plan in one C++ call: forward,
    backward and optimizer, no Python and no autograd per op. Parameters, buffers, gradients
    and optimizer state are the real tensors, updated in place; .grad fields are set as
    eager would set them. Each call checks the modules and optimizers the step uses (found
    from the function: bound self, closure, globals; or passed as guard=): a replaced
    parameter, a loaded optimizer state, train()/eval() or a changed hyperparameter makes
    the step record again. Intermediates live in one static arena per plan, planned from the
    plan's first run (arena=False: PyTorch's allocator throughout). A whole-step plan's ops run
    through the exec stage (the call planned through Forge) on backend="cpu" (the default:
    Mimic's generated kernels where they give ATen's bits, ATen calls elsewhere) or "null"
    (ATen calls only); backend="replay" runs the captured ATen ops in order. plans() says
    which ran and why a plan could not take the exec stage (then it runs its own ops; a
    CrucibleWarning says so when backend= was passed). numerics="bitwise" (the default) generates
    only kernels that give ATen's bits; numerics="fast" also generates kernels within a stated
    bound of them (IEEE sqrt, within 1 ulp of ATen's; a + c*b rounded once or twice where ATen
    rounds the other way: misc/MIMIC.md), so a step differs from eager in its last bits and
    runs more generated code (an Adam/AdamW update whole). verify_every=N re-records every N-th plan call eagerly and compares;
    a divergence returns the eager result and retires the plan. A step whose two recordings
    differ (a changing scalar of unknown source, a different op path) runs eagerly, and a
    CrucibleWarning says which op and argument. A plan holds the exact sizes it was recorded at:
    a new size that repeats another size's plan op for op (integers that differ explained by the
    sizes; whole-step or sync-point alike) is compiled from one recorded call
    (stats()["sizes_derived"]), else from two; once two sizes of a whole-step plan are known, a
    later size whose sizes keep the step's Python on the recorded path is bound without a
    recorded call (stats()["sizes_bound"]; last_bind_miss says why one was not).
    When sizes vary (a sequence length), new_sizes="auto" (the default) compiles the first two
    sizes of a signature at once and each later one that cannot be bound only once its calls,
    run eagerly meanwhile, could have saved what compiling a size costs (measured;
    stats()["size_waits"]); new_sizes="compile" compiles every new size at once (a long loop
    over few sizes); new_sizes="record" never binds (every new size recorded, at once)."""

    def __init__(self, fn, verify_every: int = 0, warmup: int = 1, guard=(), arena: bool = True,
                 mode: str = "auto", backend: str = None, numerics: str = "bitwise", new_sizes: str = "auto"):
        if not callable(fn):
            raise CrucibleTypeError(f"crucible.compile needs a callable, got {type(fn).__name__}")
        if not isinstance(mode, str):
            raise CrucibleTypeError(f"crucible.compile: mode must be a string, got {type(mode).__name__}")
        if mode not in _MODES:
            raise CrucibleValueError(f"crucible.compile: mode must be one of {', '.join(_MODES)}, got {mode!r}")
        self._mode = mode
        backend_asked = backend is not None
        if backend is None:
            backend = _DEFAULT_BACKEND
        if not isinstance(backend, str):
            raise CrucibleTypeError(f"crucible.compile: backend must be a string, got {type(backend).__name__}")
        if backend not in _BACKENDS:
            raise CrucibleValueError(f"crucible.compile: backend must be one of {', '.join(_BACKENDS)}, got {backend!r}")
        if not isinstance(numerics, str):
            raise CrucibleTypeError(f"crucible.compile: numerics must be a string, got {type(numerics).__name__}")
        if numerics not in _NUMERICS:
            raise CrucibleValueError(f"crucible.compile: numerics must be one of {', '.join(_NUMERICS)}, "
                                     f"got {numerics!r}")
        if numerics == "fast" and backend != "cpu":
            raise CrucibleValueError(f"crucible.compile: numerics='fast' changes what Mimic's CPU backend generates; "
                                     f"backend={backend!r} generates nothing: use backend='cpu' (the default) "
                                     f"or numerics='bitwise'")
        if not isinstance(new_sizes, str):
            raise CrucibleTypeError(f"crucible.compile: new_sizes must be a string, got {type(new_sizes).__name__}")
        if new_sizes not in _NEW_SIZES:
            raise CrucibleValueError(f"crucible.compile: new_sizes must be one of {', '.join(_NEW_SIZES)}, "
                                     f"got {new_sizes!r}")
        self._free_sizes = _FREE_SIZES if new_sizes == "auto" else math.inf
        self._record_sizes = new_sizes == "record"   # Note [Bound sizes]: never bind a size without recording
        self._numerics = numerics
        self._backend = backend
        self._backend_asked = backend_asked   # a fallback to the plan's own ops warns only when asked for
        self._rules = None
        if backend != "replay":
            try:
                self._rules = _rules_dir()
            except CrucibleError:
                if backend_asked:
                    raise
        verify_every = _nonnegative_int("compile", "verify_every", verify_every)
        warmup = _nonnegative_int("compile", "warmup", warmup)
        if not isinstance(arena, bool):
            raise CrucibleTypeError(f"crucible.compile: arena must be True or False, got {type(arena).__name__}")
        import torch
        if isinstance(guard, (torch.nn.Module, torch.optim.Optimizer)):
            guard = (guard,)
        try:
            guard = tuple(guard)
        except TypeError:
            raise CrucibleTypeError(f"crucible.compile: guard must be a module, an optimizer, or a sequence of "
                                f"them (or of objects holding them), got {type(guard).__name__}") from None
        for g in guard:  # each must hold something to guard, or it would be ignored without a word
            if not _discover_state(_guards_nothing, (g,)):
                raise CrucibleTypeError(f"crucible.compile: guard entry of type {type(g).__name__} is no module or "
                                    f"optimizer and holds none as an attribute: pass the modules and "
                                    f"optimizers the step uses")
        try:
            _ext.install(_recording.unboxed_kernels())
        except CrucibleError:
            raise
        except RuntimeError as e:
            raise CrucibleError(str(e)) from None
        self._fn, self._verify_every, self._warmup = fn, verify_every, warmup
        self._arena = arena
        self._guard_extra = guard
        self._guard_objs = _discover_state(fn, self._guard_extra)
        self._sources = _ScalarSources(self._guard_objs)
        self._param_list = self._params()
        self._nothing_guarded_warned = False
        self._entries = {}
        self._families = {}       # Note [New sizes]: _family_key -> _Family
        self._run = torch.ops.crucible.run
        self._bind = torch.ops.crucible.plan_bind_sizes
        self._finish = torch.ops.crucible.capture_finish
        self._note_grads = torch.ops.crucible.note_grads
        self._sync_start = torch.ops.crucible.sync_start
        self._tensor = torch.Tensor
        self._strided = torch.strided
        self._C = torch._C
        self._stats = {k: 0 for k in _COUNTERS}
        self._has_sources = bool(self._sources)
        _live_steps.add(self)
        self._retire = weakref.finalize(self, _retire_stats, self._stats)
        # An optimizer's own plan (Note [Optimizer plans]): its refusals are not the user's, and
        # it runs no backward(), so no parameter hook runs inside it.
        self._quiet = False
        self._param_hooks = True
        self._own_plans = _OwnPlans(self)   # Note [Optimizer plans]
        self._overflow_warned = False
        self._recording_warned = False
        self._unhashable_warned = False
        self._layout_warned = False
        self._warm = False        # the warm-up call has run (gradients and optimizer state exist)
        self._argkeys = set()     # argument signatures seen (guard_misses counts new ones)
        self.last_refusal = None    # why the last refused signature runs eagerly
        self.last_divergence = None
        self.last_guard_failure = None   # what Python state changed, when it was that
        self.last_replan = None          # why the last plan was dropped and recorded again
        self.last_size_miss = None       # why the last new size needed a second recorded call
        self.last_bind_miss = None       # why the last new size could not be bound without recording (Note [Bound sizes])
        self.last_sync_mismatch = None   # why the last sync-point call left its plan
        self.last_sync_eager = None      # why a backward() or step() of a sync-point call last ran eagerly
        self._replan_warned = False
        self.__wrapped__ = fn

    # -- bookkeeping -------------------------------------------------------------------
    def _count(self, k, n=1):
        self._stats[k] += n

    def stats(self) -> dict:
        """calls, plan_runs, eager_calls, captures, plans_built; guard_misses (a call signature
        without a plan yet); guard_failures (the modules' or optimizers' state changed), each
        ending in a plan_update (the plan kept: hyper_learned, a hyperparameter taken over as
        patch points; rebinds, new persistent tensors bound) or a replan (the plan dropped,
        the step records again); verifications, divergences, refusals; size_waits (calls of a new
        size run eagerly before it was captured), sizes_derived (plans of a new size built from
        one captured call beside another size's plan, Note [Size families]), sizes_bound (plans of a
        new size bound from two recorded sizes without a recorded call, Note [Bound sizes]), sizes_evicted (sizes
        whose plans made room for a new size of their family); sync_calls, sync_native (of those,
        calls that ran a stretch natively), sync_mismatches, optimizer_plan_runs (optimizer steps
        of sync-point calls run as the optimizer's own plan, Note [Optimizer plans] in
        vessel/torch/Sync.cpp); plus plans (live plans)
        and guarded (the modules and optimizers found)."""
        d = dict(self._stats)
        d["plans"] = sum(1 for e in self._entries.values() if e.plan is not None)
        d["guarded"] = [type(o).__name__ for o in self._guard_objs]
        return d

    def explain(self) -> list:
        """Per call signature that runs eagerly or has not compiled yet: {"signature", "state",
        "causes", "mode", "mode_why"}, state being "refused" (every call of it runs eagerly;
        causes lists every reason found), "compiled", or "pending" (still warming up or
        recording; causes lists what made earlier captures unusable, if anything); mode
        "replay" (whole-step) or "sync" (sync-point, mode_why: what ruled whole-step out)."""
        out = []
        for key, e in self._entries.items():
            state = "refused" if e.refused is not None else ("compiled" if e.plan is not None else "pending")
            out.append({"signature": _describe_key(key), "state": state, "causes": list(e.causes),
                        "schedulers": [type(s).__name__ for s, _ in (e.scheds or ())],
                        "mode": e.mode, "mode_why": e.mode_why})
        return out

    def plans(self) -> list:
        """plan_info() of every live plan: kernel calls, slots, externals, hash, build time (a
        sync-point signature's plan of each path it takes, its first path first); plus sizes
        (its tensor arguments' sizes, the dimensions that differ between its family's compiled
        sizes named: "[4, S0=12], [4, S0=12]"), derived (built from one recorded call beside
        another size's plan: Note [Size families]), bound (bound to its sizes without a recorded
        call: Note [Bound sizes]) and size_guards (a bound plan's guards on the sizes, over the
        varying argument dimensions S0, S1, ...: "S0 > 10", "(S0) // 2 == 1/2*S0"). plan_info's
        shapes gives each kernel call's results' sizes, over S0, S1, ... in a family with two
        sizes ("[4*S0, 50]"; "114688?": a size no fit of them explains, its value here)."""
        out = []
        for key, e in self._entries.items():
            if e.plan is None:
                continue
            sizes = self._sizes_text(key, e.family)
            for p in [e.plan] + e.variants:
                info = _ext.plan_info(p)
                info["sizes"], info["derived"], info["bound"] = sizes, e.derived, e.bound
                info["size_guards"] = e.bind_guard.describe() if e.bound and e.bind_guard is not None else []
                out.append(info)
        return out

    def _sizes_text(self, key, fam) -> str:
        """The tensor arguments' sizes of a signature, each dimension that differs between the
        compiled sizes of its family named (Note [Size families]): "[4, S0=12], [4, S0=12]". One
        name for dimensions equal in every size (a batch's inputs and targets)."""
        import torch
        keys = [k for k, o in self._entries.items() if o.family is fam and o.plan is not None]
        tensor_at = [i for i, k in enumerate(key) if isinstance(k, tuple) and len(k) == 5 and isinstance(k[0], torch.Size)]
        names = {}
        parts = []
        for i in tensor_at:
            dims = []
            for d, v in enumerate(key[i][0]):
                seen = tuple(k[i][0][d] for k in keys)
                if len(set(seen)) > 1:
                    dims.append(f"{names.setdefault(seen, f'S{len(names)}')}={v}")
                else:
                    dims.append(str(v))
            parts.append("[" + ", ".join(dims) + "]")
        return ", ".join(parts)

    def reset(self) -> None:
        """Forgets every plan and refusal; the next calls record again."""
        for e in self._entries.values():
            self._drop(e)
        self._entries.clear()
        self._families.clear()
        self._own_plans.clear()

    def _drop(self, e):
        for f in e.forms:
            _ext.form_release(f)
        e.forms, e.srcs, e.form_closures, e.closures = [], [], [], []
        if e.plan is not None:
            _ext.plan_release(e.plan)
        e.plan, e.seen, e.guard, e.lifted, e.patched, e.scheds = None, 0, None, {}, False, None
        e.derived, e.sync_lifted = False, {}
        e.bound, e.size_log, e.form_sizes, e.bind_from, e.bind_guard = False, None, {}, None, None
        e.hypers, e.sync_misses = [], 0
        fam = e.family
        if fam is not None and fam.bind is not None and fam.bind[0] is e:
            fam.bind, fam.bind_why = None, "the plan sizes are bound from was dropped"
        for p in e.variants:
            _ext.plan_release(p)
        for f, *_ in e.var_forms:
            _ext.form_release(f)
        e.variants, e.var_forms, e.capture_left, e.searches = [], [], 0, 0
        e.guards, e.var_guards = [], []
        self._forget_captures(e)

    def _refuse(self, e, why, causes=None):
        import warnings
        self._drop(e)
        e.refused = why
        e.causes = list(causes or [why])
        self.last_refusal = why
        self._count("refusals")
        if not self._quiet:
            warnings.warn(f"crucible.compile: {why}", CrucibleWarning, stacklevel=3)

    # -- a call ------------------------------------------------------------------------
    def _signature(self, args, kwargs):
        """The call's guard key and its tensors, in order (tensors inside tuples, lists and
        dicts included: they are patch points too, never part of the key)."""
        T = self._tensor
        key, tensors = [len(args)], []
        for a in args:
            if isinstance(a, T):
                tensors.append(a)
                if a.layout is not self._strided or a.is_nested:
                    raise _NotStrided("nested" if a.is_nested else a.layout)
                key.append((a.shape, a.stride(), a.dtype, a.device, a.requires_grad))
            else:
                self._nested_key(a, key, tensors)
        for k in sorted(kwargs):
            key.append(k)
            self._nested_key(kwargs[k], key, tensors)
        # Which parameters have a .grad as the call begins: backward stores a new gradient
        # into an empty .grad and accumulates into an existing one (other ops), so a loop that
        # clears gradients every few steps gets a plan for each case.
        # Thread and process modes that change which ops run or what they make: grad mode,
        # inference mode, autocast, the default dtype (a factory op without a dtype uses it).
        C = self._C
        key.append((C.is_grad_enabled(), C.is_inference_mode_enabled(), C._is_any_autocast_enabled(),
                    C.get_default_dtype()))
        key.append(_ext.grads_none_mask(self._param_list))
        return tuple(key), tensors

    def _unhashable_leaf(self, a) -> str:
        """The type name of the first non-tensor leaf of `a` (walked as _nested_key walks it)
        that cannot be hashed."""
        if isinstance(a, self._tensor):
            return ""
        if isinstance(a, (tuple, list)):
            return next((n for n in map(self._unhashable_leaf, a) if n), "")
        if isinstance(a, dict):
            return next((n for n in map(self._unhashable_leaf, a.values()) if n), "")
        try:
            hash(a)
        except TypeError:
            return type(a).__name__
        return ""

    def _nested_key(self, a, key, tensors):
        if isinstance(a, self._tensor):
            tensors.append(a)
            if a.layout is not self._strided or a.is_nested:
                raise _NotStrided("nested" if a.is_nested else a.layout)
            key.append((a.shape, a.stride(), a.dtype, a.device, a.requires_grad))
        elif isinstance(a, (tuple, list)):
            key.append((type(a), len(a)))
            for x in a:
                self._nested_key(x, key, tensors)
        elif isinstance(a, dict):
            key.append((dict, tuple(a)))
            for x in a.values():
                self._nested_key(x, key, tensors)
        else:
            key.append((type(a), a))   # by value: a different value is another plan

    def __call__(self, *args, **kwargs):
        stack = _closure_stack()
        stack.append([])
        try:
            result = self._call(args, kwargs)
        finally:
            closures = stack.pop()
        for fn, tensors in closures:   # after_step: the call's values are final now
            fn(*tensors)
        return result

    def _call(self, args, kwargs):
        st = self._stats
        st["calls"] += 1
        if _ext.is_enabled():
            # A plan runs outside the recording (its ops would be missing from the trace):
            # while this thread records, the step runs eagerly, every op recorded.
            if not self._recording_warned:
                import warnings
                self._recording_warned = True
                warnings.warn("crucible.compile: the step runs eagerly while this thread records "
                              "(crucible.enable() / recording()), so that its ops are recorded; plans run "
                              "again once recording is off", CrucibleWarning, stacklevel=2)
            self._count("eager_calls")
            return self._fn(*args, **kwargs)
        try:
            key, tensors = self._signature(args, kwargs)
            e = self._entries.get(key)
        except _NotStrided as err:  # a sparse or mkldnn tensor: plans hold strided tensors only
            if not self._layout_warned:
                import warnings
                self._layout_warned = True
                self.last_refusal = (f"a tensor argument has layout {err.layout}; a compiled step handles "
                                     f"strided (dense) tensors only")
                warnings.warn(f"crucible.compile: {self.last_refusal}, so every such call runs eagerly",
                              CrucibleWarning, stacklevel=2)
            self._count("eager_calls")
            return self._fn(*args, **kwargs)
        except TypeError:  # an unhashable non-tensor argument: nothing to guard on
            if not self._unhashable_warned:
                import warnings
                self._unhashable_warned = True
                bad = self._unhashable_leaf(list(args) + list(kwargs.values()))
                self.last_refusal = (f"a non-tensor argument of type {bad} cannot be hashed, so a call "
                                     f"cannot be matched to a plan")
                warnings.warn(f"crucible.compile: {self.last_refusal}; every such call runs eagerly. Pass "
                              f"tensors, or hashable values (numbers, strings, tuples, frozen dataclasses)",
                              CrucibleWarning, stacklevel=2)
            self._count("eager_calls")
            return self._fn(*args, **kwargs)
        if e is None:
            if key[:-1] not in self._argkeys:
                if self._argkeys:
                    self._count("guard_misses")
                self._argkeys.add(key[:-1])
            fkey = _family_key(key)
            evicting = len(self._entries) >= _MAX_SIGNATURES
            if evicting and not self._evict_size(fkey):
                if not self._overflow_warned:
                    import warnings
                    self._overflow_warned = True
                    warnings.warn(
                        f"crucible.compile: {len(self._entries)} different call signatures so far "
                        f"(shapes, dtypes, or the values of non-tensor arguments such as a step "
                        f"counter); calls with new ones run eagerly. Pass changing numbers as "
                        f"tensors, or keep them out of the step's arguments.", CrucibleWarning, stacklevel=2)
                self._count("eager_calls")
                return self._fn(*args, **kwargs)
            e = self._entries[key] = _Entry()
            e.evicting = evicting
            if self._warm:   # the first call made the step's state: later signatures record at once
                e.seen = self._warmup
            e.family = self._families.get(fkey)
            if e.family is None:
                e.family = self._families[fkey] = _Family(self._free_sizes)
            e.family.signatures += 1
        e.used = st["calls"]
        if e.plan is None and not e.bind_tried and e.refused is None and not e.forms:
            # (a size that has recorded a call is compared with it: that call is evidence the
            # binding would not see)
            if e.family.bind is not None:
                e.bind_tried = True
                self._bind_sizes(e, tensors)
            elif e.family.bind_why is not None:
                self.last_bind_miss = e.family.bind_why
        if e.plan is not None and e.mode == "sync":
            if e.capture_left > 0:
                return self._capture_variant(e, args, kwargs, tensors)
            return self._sync_call(e, args, kwargs, tensors)
        if e.plan is not None:
            if not e.guard.ok():
                st["guard_failures"] += 1
                return self._update(e, args, kwargs, tensors)
            changed = e.py.changed()
            if changed is not None:
                st["guard_failures"] += 1
                self.last_guard_failure = changed
                return self._update(e, args, kwargs, tensors)
            else:
                if self._verify_every and (st["plan_runs"] + st["verifications"] + 1) % self._verify_every == 0:
                    return self._verify(e, args, kwargs, tensors)
                vals = self._sources.values(True, anchors=False) if e.patched else []
                if e.bind_from is not None and e.bind_from[2]:
                    sib, d, _ = e.bind_from
                    e.bind_from = None
                    self._bind_exec(e.plan, sib, d)
                    if self._arena:   # planned from this run on (_bind_sizes)
                        _ext.plan_set_arena(e.plan, True)
                t0 = time.perf_counter()   # Note [New sizes]
                try:
                    outs = self._run(e.plan, tensors, vals)
                except RuntimeError as err:
                    if not _ext.take_guard_failure():
                        if e.bound:   # a bound plan that fails (its sizes not as bound, an error eager
                            self._drop(e)   # raises too): the size is recorded at its next call
                            e.bind_tried = e.started = True
                            e.seen = self._warmup + 1
                            e.mode = None
                        raise
                    st["guard_failures"] += 1   # checked before anything ran (or nothing seen outside it)
                    msg = str(err).split("\nException raised from")[0]
                    if e.bound and "without a recorded call expected" in msg:   # Note [Bound sizes]: a
                        self.last_bind_miss = msg   # result of other sizes, found before any effect
                    return self._update(e, args, kwargs, tensors)
                st["plan_runs"] += 1
                if e.bind_from is not None:
                    e.bind_from = (e.bind_from[0], e.bind_from[1], True)   # its sizes checked by a run
                e.family.note_plan(time.perf_counter() - t0)
                e.replans_idle = 0
                if e.scheds:
                    for sched, times in e.scheds:   # as the step did, after its optimizers' step()
                        for _ in range(times):
                            sched.step()
                if e.spec is _ONE_TENSOR:
                    return outs[0]
                if e.spec[0] != "C":
                    return _unflatten_out(e.spec, iter(outs))
                it = iter(outs)
                result = _unflatten_out(e.spec[1], it)
                pending = _closure_stack()[-1]
                for fn, n in zip(e.closures, e.spec[2]):
                    pending.append((fn, tuple(next(it) for _ in range(n))))
                return result
        if e.refused is not None:
            self._count("eager_calls")
            return self._fn(*args, **kwargs)
        e.seen += 1
        fam = e.family
        if e.seen <= self._warmup:
            self._count("eager_calls")
            result = self._fn(*args, **kwargs)
            self._warm = True
            return result
        if not e.started and e.waited < fam.wait(e.evicting, self._template_of(e)):  # Note [New sizes]: timed
            e.waited += 1
            st["size_waits"] += 1
            self._count("eager_calls")
            t0 = time.perf_counter()
            result = self._fn(*args, **kwargs)
            fam.note_eager(time.perf_counter() - t0)
            return result
        if not e.started:
            e.started = True
            fam.started += 1
        t0 = time.perf_counter()
        try:
            return self._capture_call(e, args, kwargs, tensors)
        finally:
            e.onboard += time.perf_counter() - t0 - (fam.eager_s or 0.0)
            if e.plan is not None:
                fam.note_onboard(e.onboard, e.derived)
                e.onboard = 0.0

    def _evict_size(self, fkey) -> bool:
        """Note [Size families]: the step holds _MAX_SIGNATURES signatures; a new size of a
        family takes the place of the family's least recently called size (its plan released; a
        call at that size later is a new size again). False when the family has no other size."""
        fam = self._families.get(fkey)
        if fam is None:
            return False
        # the least recently called size; a refused one last (evicted, it would be captured again)
        old = min((k for k, o in self._entries.items() if o.family is fam),
                  key=lambda k: (self._entries[k].refused is not None, self._entries[k].used), default=None)
        if old is None:
            return False
        self._drop(self._entries.pop(old))
        self._count("sizes_evicted")
        return True

    def _capture_call(self, e, args, kwargs, tensors):
        """A call of a signature without a plan captured; the plan built from it and the last."""
        result, form, spec = self._capture(e, args, kwargs, tensors)
        if form is None:
            return result
        if e.mode != "sync":   # a sync-point call runs its Python: return values and closures are its own
            why = ("the step returned a different structure (or made other after_step calls) in two calls"
                   if e.forms and spec != e.spec else
                   _closures_differ(e.form_closures[-1], e.cap_closures) if e.forms else None)
            if why:
                _ext.form_release(form)
                self._refuse(e, why)
                return result
        e.spec = spec
        if e.cap_range is not None:
            e.exec_ranges[form] = e.cap_range
        e.form_sizes[form] = e.cap_sizes
        e.forms.append(form)
        e.srcs.append(e.cap_srcs)
        e.form_closures.append(e.cap_closures)
        e.hypers.append(e.cap_hyper)
        e.guards.append(e.cap_guard)
        if len(e.forms) == 1 and e.mode in (None, "sync") and self._build_like(e):
            return result
        if len(e.forms) >= 2:
            self._build(e)
        return result

    def _other_sizes(self, e):
        """The other sizes of e's family that have a plan, the newest first (Note [Size families])."""
        return (o for o in reversed(self._entries.values()) if o is not e and o.family is e.family
                and o.plan is not None)

    def _template_of(self, e) -> bool:
        """Whether another size of e's family has a plan."""
        return next(self._other_sizes(e), None) is not None

    def _build_like(self, e):
        """Note [Size families]: a signature's first captured call, when another size of it has
        a plan of the same mode (whole-step, or sync-point: the call's Python did more than ATen
        ops), becomes a plan at once (no second capture) if it repeats that plan at its own sizes;
        otherwise the signature records a second call as any other."""
        if e.scheds is None:
            return False
        mode = "sync" if e.mode == "sync" else "replay"
        form, plan = e.forms[0], None
        scheds = [(id(s), n) for s, n in e.scheds]
        # the newest plans first (the path the step takes now); a few at most, each a comparison
        likes = [o for o in self._other_sizes(e) if o.mode == mode and o.scheds is not None
                 and [(id(s), n) for s, n in o.scheds] == scheds][:_LIKE_TRIES]
        why, t = None, None
        for t in likes:
            if mode == "replay":
                # what the template's runs return and hand to after_step must be what this call did
                # (a sync-point call runs its Python: its results are its own)
                if e.spec != t.spec:
                    why = why or "the step returned a different structure at this size"
                    continue
                differ = _closures_differ(t.closures, e.cap_closures)
                if differ:
                    why = why or differ
                    continue
            for tp in [t.plan] + (t.variants if mode == "sync" else []):
                lifted_from = t if tp == t.plan else None   # a variant's unguarded set is not kept
                try:
                    if mode == "sync":
                        plan = _ext.plan_build_sync_like(tp, form, e.srcs[0])
                    else:
                        plan = _ext.plan_build_like(tp, form, e.srcs[0], self._backend if self._backend == "replay"
                                                    else f"{self._backend}/{self._numerics}")
                    break
                except RuntimeError as err:
                    why = why or str(err)
            if plan is not None:
                break
        t_log, sib, partner = (t.size_log, t, None) if plan is not None else (None, None, None)
        if plan is None and mode == "replay":
            plan, partner, why = self._build_pair(e, form, why)
            t, sib = None, partner
            t_log = partner.form_sizes.get(partner.forms[-1]) if partner is not None else None
        if plan is None:
            if why:
                self.last_size_miss = why
            return False
        if mode == "replay" and _ext.plan_info(plan)["value_reads"]:   # as the plan's own: never the case
            _ext.plan_release(plan)
            return False
        e.plan = plan
        _ext.form_release(form)
        e.size_log, e.form_sizes = e.form_sizes.get(form), {}
        e.forms, e.srcs, e.hypers, e.guards = [], [], [], []
        e.closures, e.form_closures = e.cap_closures, []
        e.mode = mode
        e.patched = _ext.plan_info(e.plan)["patches"] > 0
        if mode == "sync":
            # unguarded, as in the plan's: the hyperparameters its first path takes from the
            # sources; derived from another path, everything guarded (a change then runs the
            # optimizer step eagerly, never with a value the plan bakes in)
            e.sync_lifted = {g: set(ks) for g, ks in lifted_from.sync_lifted.items()} if lifted_from else {}
            e.guard = e.cap_guard.without(e.sync_lifted)
            e.sync_misses = 0
        else:
            e.lifted = {g: set(ks) for g, ks in t.lifted.items()} if t is not None else {}
            if not self._arena:
                _ext.plan_set_arena(e.plan, False)
            if self._backend != "replay":
                self._attach_exec(e, form)
            e.guard, e.py = e.cap_guard.without(e.lifted), e.cap_py
        e.attempts = 0
        e.derived = True
        self._count("plans_built")
        self._count("sizes_derived")
        if partner is not None and partner.plan is None and len(partner.forms) == 1:
            # the size e was paired with is derived from e's plan now, while its recorded call is
            # still in the trace (its exec stage is planned from it): two sizes with exec plans,
            # which a bound size's exec plan is made from (Note [Bound exec plans])
            try:
                self._build_like(partner)
            except Exception as err:   # noqa: BLE001  (the partner stays a size with one recorded call)
                self.last_size_miss = f"the size paired with this one could not be derived from its plan: {err!r}"
        self._forget_captures(e)
        if mode == "replay" and not self._record_sizes:
            self._note_bindable(t_log, e, sib)
        return True

    def _build_pair(self, e, form, why):
        """Note [Size families]: no other size has a plan yet, but one has recorded a call: e's
        plan is built from that call and e's (which must repeat it at e's sizes). Returns
        (plan, the size that recorded that call, why not)."""
        scheds = [(id(s), n) for s, n in e.scheds]
        for o in reversed(self._entries.values()):
            if (o is e or o.family is not e.family or o.plan is not None or o.refused is not None or not o.forms
                    or o.mode not in (None, "replay") or o.scheds is None
                    or [(id(s), n) for s, n in o.scheds] != scheds):
                continue
            if o.spec != e.spec:
                why = why or "the step returned a different structure at this size"
                continue
            differ = _closures_differ(o.form_closures[-1], e.cap_closures)
            if differ:
                why = why or differ
                continue
            try:
                plan = _ext.plan_build_pair(o.forms[-1], form, o.srcs[-1], e.srcs[0],
                                            self._backend if self._backend == "replay"
                                            else f"{self._backend}/{self._numerics}")
            except RuntimeError as err:
                why = why or str(err)
                continue
            return plan, o, why
        return None, None, why

    def _note_bindable(self, t_log, d, sib):
        """Note [Bound sizes]: d's plan repeats a call recorded at other sizes (t_log: that
        call's size log; sib: the size that recorded it); when the step's Python did the same
        with sizes in both recorded calls, later sizes are bound from the two without a recorded
        call."""
        fam = d.family
        if t_log is None or d.size_log is None:
            if fam.bind is None:
                fam.bind_why = "a recorded call's size reads are not known"
            return
        guard, why = _sizes.SizeGuard.make(t_log[0], t_log[1], d.size_log[0], d.size_log[1])
        if guard is not None:
            fam.bind, fam.bind_why = (d, guard, sib), None
        elif fam.bind is None:   # a pair that cannot bind leaves one that can
            fam.bind_why = why

    def _bind_exec(self, plan, sib, d):
        """Note [Bound exec plans]: the bound plan runs through the exec stage made from the
        exec plans of sib's and d's sizes; else its ATen ops (plans()' exec_note says why)."""
        from ._native import load_exec
        if sib is None or sib.plan is None or sib.mode != "replay" or d.plan is None or d.mode != "replay":
            why = "no exec plans of the two recorded sizes (one was dropped)"
        else:
            try:
                why = load_exec().bind_exec(plan, sib.plan, d.plan)
            except (ImportError, OSError, RuntimeError) as err:
                why = f"the exec stage is not available: {err}"
        if why:
            _ext.plan_set_exec_note(plan, f"sizes bound without a recorded call (Note [Bound sizes]); the plan "
                                          f"runs its ATen ops: {why}")

    def _bind_sizes(self, e, tensors):
        """Note [Bound sizes]: e's plan bound from its family's two plans, when its sizes keep
        the step's Python on their path and every integer of the plans has a value here."""
        fam = e.family
        d, guard, sib = fam.bind
        if d.plan is None or d.mode != "replay":
            fam.bind, fam.bind_why = None, "the plan sizes are bound from was dropped"
            return
        # d's guards become this size's: the call checks them next, before the plan runs (a
        # state that moved since d was recorded records this size again then)
        why = guard.check([tuple(x.shape) for x in tensors])
        if why is None:
            try:
                plan = self._bind(d.plan, list(tensors), [n for shape in guard.sibling_shapes for n in shape])
            except RuntimeError as err:
                why = str(err).split("\nException raised from")[0]
        if why is not None:
            self.last_bind_miss = why
            return
        # Note [Bound exec plans]: at the size's second call, after one run of its ATen ops has
        # checked every result's sizes (and a size called once pays nothing for it)
        e.bind_from = (sib, d, False) if self._backend != "replay" else None
        e.plan, e.mode, e.spec, e.scheds = plan, "replay", d.spec, d.scheds
        e.closures = d.closures
        e.lifted = {g: set(ks) for g, ks in d.lifted.items()}
        e.guard, e.py = d.guard, d.py
        e.patched = d.patched   # d's patch points
        e.size_log = None   # its plan's form was bound, not recorded: no size log of its own
        e.bind_guard = guard
        e.started = e.derived = e.bound = True
        if not self._arena or e.bind_from is not None:
            # the first run is the check (its ATen ops), the later ones the exec stage's: its
            # arena is planned from the first of those (turned on again after _bind_exec)
            _ext.plan_set_arena(plan, False)
        self._count("plans_built")
        self._count("sizes_bound")

    def _build(self, e):
        """A plan from two of the signature's recorded calls: whole-step when both were pure and
        agree op for op (mode "replay" or "auto"), else sync-point (mode "sync" or "auto"). A
        sync-point step that took different paths in its recorded calls records more until two
        took one path; the others become plans of their paths later (_capture_variant)."""
        ib = len(e.forms) - 1
        ia = ib - 1
        if len(e.forms) > 2:   # sync-point, several paths so far: a call that took the newest one's path
            ia = next((i for i in range(ib) if _ext.forms_same_path(e.forms[i], e.forms[ib])), None)
            if ia is None:
                if len(e.forms) < _VARIANT_CAPTURES:
                    return
                self._refuse(e, f"the step took a different path in each of {len(e.forms)} recorded calls")
                return
        a, b = e.forms[ia], e.forms[ib]
        plan, why, causes = None, None, None
        if e.mode != "sync":
            try:
                # Plans are shared only between steps that run them alike (Note [Exec replay]).
                plan = _ext.plan_build(a, b, e.srcs[ia], e.srcs[ib],
                                       self._backend if self._backend == "replay" else f"{self._backend}/{self._numerics}")
            except RuntimeError as err:
                why = str(err)
            reads = _ext.plan_info(plan)["value_reads"] if plan is not None else []
            if reads:
                _ext.plan_release(plan)
                plan = None
                why = (f"the step reads tensor values into Python ({', '.join(reads[:3])}"
                       f"{', ...' if len(reads) > 3 else ''}: .item(), bool(), float(), printing a tensor); a "
                       f"replay would not give Python those values, and a branch on them would not be taken "
                       f"again. Read values after the call (return the tensor), or outside the step")
                causes = [f"a tensor value read into Python by {r}" for r in reads]
                if self._mode == "replay":
                    self._refuse(e, why, causes)
                    return
        if plan is None and self._mode != "replay":
            try:
                plan = _ext.plan_build_sync(a, b, e.srcs[ia], e.srcs[ib])
            except RuntimeError as err:
                why = str(err)
                if not _ext.forms_same_path(a, b) and len(e.forms) < _VARIANT_CAPTURES:
                    # two paths (a branch): keep both, record until two calls took one path
                    if e.mode != "sync":
                        e.mode, e.mode_why = "sync", why
                        e.causes = [why]
                    return
            else:
                if e.mode != "sync":
                    e.mode, e.mode_why = "sync", why
                    e.causes = causes or [why]
        if plan is None:
            e.attempts += 1
            if e.attempts >= _MAX_ATTEMPTS:
                self._refuse(e, why, causes)
            else:   # maybe a one-off (state that changed between the two calls): try the next pair
                e.form_sizes.pop(e.forms[0], None)
                _ext.form_release(e.forms.pop(0))
                e.srcs.pop(0)
                e.form_closures.pop(0)
                e.hypers.pop(0)
                e.guards.pop(0)
            return
        e.plan = plan
        e.size_log = e.form_sizes.get(b)
        e.form_sizes = {}
        lifted = self._lifted_between(e.hypers[ia], e.hypers[ib])
        guard = e.guards[ib].without(lifted)
        for i, f in enumerate(e.forms):
            if i in (ia, ib):
                _ext.form_release(f)
            else:   # another path: paired later with a call that takes it too
                e.var_forms.append((f, e.srcs[i], e.hypers[i], e.guards[i]))
        e.forms, e.srcs, e.hypers, e.guards = [], [], [], []
        e.closures, e.form_closures = e.cap_closures, []
        if e.mode is None:
            e.mode = "replay"
        if e.mode == "replay" and not self._arena:
            _ext.plan_set_arena(e.plan, False)
        if self._backend != "replay":
            self._attach_exec(e, b)
        self._forget_captures(e)
        e.patched = _ext.plan_info(e.plan)["patches"] > 0
        if not self._guard_objs and not self._nothing_guarded_warned:
            import warnings
            self._nothing_guarded_warned = True
            warnings.warn(
                "crucible.compile found no torch.nn.Module or optimizer in the step (its bound "
                "self, closure, the globals it names, one attribute deep): a replaced parameter, "
                "a loaded optimizer state, train()/eval() or a new learning rate will not be "
                "noticed. Pass them: crucible.compile(step, guard=(model, optimizer)).",
                CrucibleWarning, stacklevel=3)
        if e.mode == "sync":
            e.guard, e.sync_lifted = guard, lifted
            e.sync_misses = 0
        else:
            e.guard, e.py = e.cap_guard, e.cap_py
        e.attempts = 0
        self._count("plans_built")

    def _attach_exec(self, e, form, rng=None, own_form=False):
        """backend "null"/"cpu": the plan's ops run through the exec stage, planned from the
        recorded call `form` is of (Note [Exec replay]); where that cannot be, the plan runs its
        ATen ops, plans()' exec_note says why, and a CrucibleWarning too when the backend was
        asked for."""
        import warnings
        from ._native import load_exec
        if rng is None:
            rng = e.exec_ranges.get(form)
        begin, end, sids = rng if rng is not None else (0, 0, [])
        try:
            if self._rules is None:
                self._rules = _rules_dir()
            why = load_exec().attach_exec(e.plan, _recording.trace(), begin, end, sids, self._rules,
                                          "cpu-avx2", self._backend, form if own_form else -1,
                                          self._numerics)
        except (CrucibleError, ImportError, OSError) as err:   # no rules, no LLVM module
            why = f"the exec stage is not available: {err}"
            _ext.plan_set_exec_note(e.plan, why)
        if why and self._backend_asked:
            warnings.warn(f"crucible.compile(backend={self._backend!r}): this plan runs its ATen ops in order, "
                          f"not through the exec stage: {why}", CrucibleWarning, stacklevel=4)

    def _forget_captures(self, e):
        """The recorded calls an exec backend put into the trace leave it again when the trace
        held nothing else (the thread was not recording before them): a compiled step does not
        fill the trace of a program that never records. A trace that held other ops keeps them."""
        firsts = [rng[0] for rng in e.exec_ranges.values()]
        e.exec_ranges = {}
        if firsts and min(firsts) == 0 and not _recording.is_enabled():
            _ext.clear()

    def _params(self):
        import torch
        ps = []
        for o in self._guard_objs:
            if isinstance(o, torch.nn.Module):
                ps.extend(o.parameters())
            else:
                for g in o.param_groups:
                    ps.extend(g["params"])
        return ps

    def _optimizers(self):
        import torch
        return [o for o in self._guard_objs if isinstance(o, torch.optim.Optimizer)]

    def _rediscover(self):
        """Modules and optimizers again (a global assigned after compile(), a new optimizer)."""
        objs = _discover_state(self._fn, self._guard_extra)
        if [id(o) for o in objs] != [id(o) for o in self._guard_objs]:
            self._guard_objs = objs
            self._sources = _ScalarSources(objs)
            self._has_sources = bool(self._sources)
            self._param_list = self._params()
            self._own_plans.keep(self._optimizers())

    def _capture(self, e, args, kwargs, tensors, lifted=None, for_exec=False):
        """Runs the step eagerly while capturing its ops. Returns (result, form or None, spec),
        and leaves e.cap_guard and e.cap_srcs for the call (lifted: the hyperparameters the
        guard leaves to the sources; e.lifted when None)."""
        if not e.forms:
            self._rediscover()
        # backward() and the optimizers' step() are marked in the capture (Sync.cpp). The hooks
        # go on before the purity watch starts and come off after it finishes: they are part of
        # the state it sees before and after the call, not a change.
        with _Hooks("capture", self._optimizers()):
            return self._capture_watched(e, args, kwargs, tensors, lifted, for_exec)

    def _capture_watched(self, e, args, kwargs, tensors, lifted, for_exec=False):
        self._count("captures")
        self._count("eager_calls")
        params = self._params()
        off_cpu = next((t for t in list(tensors) + params if t.device.type != "cpu"), None)
        if off_cpu is not None:
            # The capture is the calling thread's, and autograd runs the backward of a CUDA (or
            # other accelerator) step on its own device threads: a plan would miss those ops.
            self._refuse(e, f"the step uses a tensor on {off_cpu.device} ({tuple(off_cpu.shape)}, "
                            f"{off_cpu.dtype}); crucible.compile replays CPU steps only, since its capture "
                            f"does not follow autograd onto the device threads that run a "
                            f"{off_cpu.device.type.upper()} backward. The step runs eagerly (recording "
                            f"with crucible.enable() works on any device)")
            return self._fn(*args, **kwargs), None, None
        self._note_grads(params)
        hyper = self._sources.hyperparameters() if self._has_sources else None
        e.cap_hyper = hyper
        if self._mode == "sync":
            e.mode, e.mode_why = "sync", "mode=\"sync\""
        # A sync-point plan's guard is this one less the hyperparameters its two recorded calls
        # disagreed on (_build); a whole-step plan's, this one as it is.
        e.cap_guard = _StateGuard(self._guard_objs, e.lifted if lifted is None else lifted)
        watch = _Watch(self._fn, self._guard_extra, (args, kwargs))
        try:
            watch.start()   # before the capture: its walk of the step's state runs no ATen op
        except RuntimeError as err:   # another thread is capturing: this call is not captured
            self.last_refusal = str(err)
            return self._fn(*args, **kwargs), None, None
        # backend "null"/"cpu": the call is recorded into the trace as well, where the exec stage
        # plans it from (its ops are those the trace gained during the call)
        to_trace = (self._backend != "replay" and self._mode != "sync" and e.mode != "sync"
                    and (e.plan is None or for_exec) and not _recording.is_enabled())
        if to_trace:
            _recording.flush()
            first = _ext.stats()["total"]
        try:
            _ext.capture_start(not to_trace and not _recording.is_enabled())
        except RuntimeError as err:   # e.g. under torch.autocast: nothing can be recorded
            watch.stop()
            self._refuse(e, str(err))
            return self._fn(*args, **kwargs), None, None
        sizes = _sizes.start()   # Note [Symbolic sizes]
        try:
            result = self._fn(*args, **kwargs)
        except BaseException:
            _sizes.stop(sizes)
            _ext.capture_discard()
            watch.stop()
            raise
        _sizes.stop(sizes)
        e.cap_sizes = (sizes, [tuple(t.shape) for t in tensors])
        _ext.capture_stop()
        watch.stop()
        e.cap_range = None
        if to_trace:
            _recording.flush()
            e.cap_range = (first, _ext.stats()["total"], [_recording.storage_id(t) for t in tensors])
        e.cap_srcs = self._sources.values(False, hyper) if self._has_sources else []
        problems = watch.finish()
        if problems and self._mode != "replay" and e.mode != "replay":
            # The Python does more than ATen ops: a sync-point plan runs it on every call.
            if e.mode != "sync":
                self._count("impure_captures")
                e.mode, e.mode_why = "sync", problems[0]
                e.causes = problems
            problems = []
        if problems:
            # Maybe a one-off (the optimizer creating a new parameter's state, a lazily built
            # cache): the capture is dropped, and after _MAX_ATTEMPTS such calls the signature
            # runs eagerly.
            _ext.capture_discard()
            self._count("impure_captures")
            e.attempts += 1
            e.causes = problems
            if e.attempts >= _MAX_ATTEMPTS:
                self._refuse(e, f"the step does what a replay of its ATen ops would skip: {problems[0]}"
                                + (f" (and {len(problems) - 1} more: step.explain())" if len(problems) > 1 else ""),
                             problems)
            return result, None, None
        scheds = list(watch.schedulers)
        if e.mode == "sync":
            scheds = []   # its Python steps them
        if e.scheds is not None and [(id(s), n) for s, n in e.scheds] != [(id(s), n) for s, n in scheds]:
            _ext.capture_discard()
            self._refuse(e, "the step stepped its LR schedulers differently in two calls")
            return result, None, None
        e.scheds = scheds
        flat = []
        try:
            spec = _flatten_out(result, flat)
        except _Unsupported as err:
            _ext.capture_discard()
            self._refuse(e, str(err))
            return result, None, None
        closures = _closure_stack()[-1]   # after_step calls of this call: their tensors are outputs too
        e.cap_closures = [fn for fn, _ in closures]
        e.cap_py = None if e.mode == "sync" else _PythonGuard(self._fn, self._guard_extra, self._guard_objs,
                                                              watch.skip_ids, e.cap_closures, (args, kwargs),
                                                              param_hooks=self._param_hooks)
        if closures:
            for _, ts in closures:
                flat.extend(ts)
            spec = ("C", spec, tuple(len(ts) for _, ts in closures))
        try:
            form = self._finish(tensors, flat)
        except RuntimeError as err:
            self._refuse(e, str(err).split("\nException raised from")[0])
            return result, None, None
        return result, form, spec

    def _update(self, e, args, kwargs, tensors):
        """The guard saw the step's state change. This call runs eagerly and is recorded, and
        the plan is checked against it: scalars that moved because a hyperparameter changed
        (a scheduler's learning rate) and are fed by a source become patch points, and that
        hyperparameter is no longer guarded, so later changes cost nothing; persistent tensors
        that are new objects of the same kind (a loaded optimizer state, a replaced parameter)
        are bound instead. Anything else drops the plan, and the step records again. A bound
        size's plan (Note [Bound sizes]) is dropped and the call recorded as a new size's."""
        if e.bound:
            self._drop(e)
            e.bind_tried = e.started = True
            e.seen = self._warmup + 1   # past its warm-up: its next call records too, if this one is not enough
            e.mode = None               # whole-step or sync-point, as the recorded calls say
            return self._capture_call(e, args, kwargs, tensors)
        changed = [(d, k) for d, k, v in e.guard._hyper if d.get(k, _MISSING) != v]
        lifted = {g: set(ks) for g, ks in e.lifted.items()}
        for d, k in changed:   # if the plan takes them over, that group's value comes from the sources
            lifted.setdefault(id(d), set()).add(k)
        result, form, spec = self._capture(e, args, kwargs, tensors, lifted, for_exec=True)
        if form is None:
            return result
        srcs = e.cap_srcs
        why = _closures_differ(e.closures, e.cap_closures) if spec == e.spec else None
        rebound = 0
        if why:
            pass
        elif spec == e.spec:
            why, _, rebound = _ext.plan_update(e.plan, form, srcs)   # (why, patches added, tensors rebound)
        else:
            why = "the step returned a different structure"
        if not why and e.cap_range is not None and _ext.plan_info(e.plan)["exec"] == "":
            # new patch points dropped the exec stage's plan: planned again from this call
            self._attach_exec(e, form, rng=e.cap_range, own_form=True)
        if e.cap_range is not None:
            e.exec_ranges = {form: e.cap_range}
            self._forget_captures(e)
        _ext.form_release(form)
        if why:
            import warnings
            self._count("replans")
            self.last_replan = why
            e.replans_idle += 1
            idle = e.replans_idle
            self._drop(e)
            if idle >= _MAX_IDLE_REPLANS:
                self._refuse(e, f"its plan was dropped {idle} times without running in between (the step's "
                                f"state changes faster than a plan can be recorded); the last time: {why}")
            elif not self._replan_warned and not self._quiet:
                self._replan_warned = True
                warnings.warn(f"crucible.compile: the plan no longer matches the step and is recorded again "
                              f"(this call and the next two run eagerly): {why}", CrucibleWarning, stacklevel=3)
            return result
        e.lifted = lifted
        e.closures = e.cap_closures
        e.patched = _ext.plan_info(e.plan)["patches"] > 0
        e.guard, e.py = e.cap_guard, e.cap_py
        e.attempts = 0
        self._count("plan_updates")
        if changed:
            self._count("hyper_learned")
        if rebound:
            self._count("rebinds")
        return result

    def _verify(self, e, args, kwargs, tensors):
        import warnings
        self._count("verifications")
        result, form, spec = self._capture(e, args, kwargs, tensors)
        if form is None:
            return result
        srcs = e.cap_srcs
        why = (_closures_differ(e.closures, e.cap_closures) or _ext.plan_check(e.plan, form, srcs)
               if spec == e.spec else "the step returned a different structure (or made other after_step calls)")
        _ext.form_release(form)
        if why:
            self._count("divergences")
            self.last_divergence = why
            self._drop(e)
            warnings.warn(f"crucible.compile: verification found the step diverged from its plan: {why} "
                          f"The plan is retired; this call's result is eager.", CrucibleWarning, stacklevel=2)
        return result


def compile(fn=None, *, verify_every: int = 0, warmup: int = 1, guard=(), arena: bool = True, mode: str = "auto",
            backend: str = None, numerics: str = "bitwise", new_sizes: str = "auto"):
    """step = crucible.compile(train_step): see CompiledStep. Also usable as a decorator,
    with or without arguments."""
    kw = dict(verify_every=verify_every, warmup=warmup, guard=guard, arena=arena, mode=mode, backend=backend,
              numerics=numerics, new_sizes=new_sizes)
    if fn is None:
        return lambda f: CompiledStep(f, **kw)
    return CompiledStep(fn, **kw)
