"""crucible_native — record every ATen op of a PyTorch program (Crucible's PyTorch Vessel).

    import crucible_native as crucible
    crucible.enable()                       # this thread records from now on
    for x, y in loader:
        opt.zero_grad(); loss_fn(model(x), y).backward(); opt.step()
    crucible.disable()
    crucible.export("run.crtrace")

The native part lives in a CMake build directory: CRUCIBLE_BUILD_DIR if set, else
<repo>/build-release. A build with a sanitizer cannot be loaded into a plain Python process;
this module refuses it with instructions instead of crashing.
"""
from __future__ import annotations

import contextlib
import itertools
import json
import operator
import os
import sys
import threading
import weakref
from typing import Iterable, Optional

__all__ = [
    "configure", "enable", "disable", "is_enabled", "recording", "track_modules", "track_optimizer",
    "mark_inputs", "mark_constants", "flush", "stats", "export", "load_trace", "trace",
    "clear", "storage_id", "iteration", "export_graph", "build_dir", "CrucibleError",
    "compile", "CompiledStep", "CrucibleWarning",
]


class CrucibleError(RuntimeError):
    """An error from Crucible, with what went wrong and what to do."""


class CrucibleWarning(UserWarning):
    """A compiled step runs eagerly (and why), a plan was retired, or the recording a result
    comes from dropped ops (drop_when_full)."""


_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_SANITIZER_RUNTIMES = {
    "asan-ubsan": ("libasan", "LD_PRELOAD=$(gcc -print-file-name=libasan.so):$(gcc -print-file-name=libubsan.so) "
                              "ASAN_OPTIONS=detect_leaks=0"),
    "tsan": ("libtsan", "LD_PRELOAD=$(gcc -print-file-name=libtsan.so)"),
    "ubsan-strict": ("libubsan", "LD_PRELOAD=$(gcc -print-file-name=libubsan.so)"),
}


def build_dir() -> str:
    """The build directory the native libraries are loaded from."""
    return os.environ.get("CRUCIBLE_BUILD_DIR") or os.path.join(_REPO, "build-release")


def _runtime_loaded(name: str) -> bool:
    try:
        with open("/proc/self/maps") as f:
            return any(name in line for line in f)
    except OSError:
        return False


def _load_ext():
    d = build_dir()
    lib = os.path.join(d, "lib")
    info_path = os.path.join(lib, "crucible_build.json")
    if not os.path.exists(info_path):
        raise ImportError(
            f"crucible_native: no Crucible build in {d} ({info_path} is missing). "
            "Build it with: cmake --preset release && cmake --build --preset release, "
            "or point CRUCIBLE_BUILD_DIR at a build directory.")
    with open(info_path) as f:
        info = json.load(f)
    san = info.get("sanitizer", "none")
    if san != "none":
        runtime, preload = _SANITIZER_RUNTIMES.get(san, (san, "LD_PRELOAD=<the sanitizer runtime>"))
        if not _runtime_loaded(runtime):
            raise ImportError(
                f"crucible_native: {d} is a '{san}' sanitizer build; its libraries only load after "
                f"the sanitizer runtime. Either rebuild without a sanitizer "
                f"(cmake --preset release && cmake --build --preset release, then unset "
                f"CRUCIBLE_BUILD_DIR or set it to build-release), or preload the runtime: "
                f"{preload} {sys.executable} ...")
    import torch  # noqa: F401  (loads libtorch first, with the symbols the extension needs)
    if lib not in sys.path:
        sys.path.insert(0, lib)
    try:
        import _crucible_ext
    except ImportError as e:
        raise ImportError(f"crucible_native: cannot load the extension from {lib}: {e}. "
                          "Rebuild with: cmake --build --preset release") from e
    return _crucible_ext


_ext = _load_ext()
_ext.set_error_type(CrucibleError)  # what a forked child cannot do raises it (Note [Forked children])
_lock = threading.Lock()

# External kinds, as in include/crucible/record/Trace.h (ExternalKind).
_KINDS = {"parameter": 1, "buffer": 2, "gradient": 3, "optimizer_state": 4, "input": 5, "constant": 6}


def _storage_cdata(t) -> int:
    if hasattr(t, "untyped_storage"):
        return t.untyped_storage()._cdata
    return t.storage()._cdata


def storage_id(tensor) -> int:
    """Crucible's id of a tensor's storage: the storage_id recorded tensor metadata carries."""
    if tensor.layout != __import__("torch").strided:
        return 0
    return _ext.storage_id(_storage_cdata(tensor))


def _classify(tensors: Iterable, kind: str) -> int:
    n = 0
    for t in tensors:
        if t is None:
            continue
        sid = storage_id(t)
        if sid == 0:   # no storage (sparse, ...): nothing to classify
            continue
        _ext.classify_external(sid, _KINDS[kind])
        n += 1
    return n


_unboxed_kernels = True


_ring_sizes = (1 << 16, 1 << 17, 1 << 16)  # ring_entries, meta_cells, scalar_slots: as configured
_plan_options = (0, 64)  # memory_budget, plan_alignment: as configured


def _nonnegative_int(fn: str, name: str, v) -> int:
    try:
        if isinstance(v, bool):
            raise TypeError
        n = operator.index(v)  # int, numpy integers, ...
    except TypeError:
        raise CrucibleError(f"crucible.{fn}: {name} must be an int, got {type(v).__name__}") from None
    if n < 0:
        raise CrucibleError(f"crucible.{fn}: {name} must not be negative, got {n}")
    return n


def _check_alignment(fn: str, name: str, n: int) -> None:
    if n == 0 or n & (n - 1) or n > 1 << 30:
        raise CrucibleError(f"crucible.{fn}: {name} {n} is not a power of two up to 2^30: use 16, 64, 256, ...")


def configure(ring_entries: Optional[int] = None, meta_cells: Optional[int] = None,
              scalar_slots: Optional[int] = None, unboxed_kernels: Optional[bool] = None,
              memory_budget: Optional[int] = None, plan_alignment: Optional[int] = None) -> None:
    """Settings that hold for the whole run; None leaves one as it is. Every value is checked
    before any is applied.

    ring_entries, meta_cells, scalar_slots: the per-thread ring sizes (powers of two; 2^16,
    2^17, 2^16 by default). Only before the recorder exists (the error says what makes it).
    unboxed_kernels: whether hot ops record through typed (unboxed) kernels — the same records,
    less overhead (on by default). Only before enable(), recording() or compile().
    memory_budget: device bytes for persistent state + arena that the background pipeline checks
    every iteration's memory plan against (0: no check, the default); a plan that does not fit
    is published with plan_error naming what is live at the peak. plan_alignment: the plan's
    block alignment in bytes (a power of two up to 2^30, 64 by default). Both only before the
    pipeline starts (the first enable(), recording(), compile() or iteration() starts it)."""
    global _unboxed_kernels, _plan_options, _ring_sizes
    if unboxed_kernels is not None and not isinstance(unboxed_kernels, bool):
        raise CrucibleError(f"crucible.configure: unboxed_kernels must be True or False, got "
                            f"{type(unboxed_kernels).__name__} {unboxed_kernels!r}")
    if unboxed_kernels is not None and _ext.key_floor_installed():
        raise CrucibleError("crucible.configure(unboxed_kernels=...) in a process that installed the key-floor "
                            "kernels (install_key_floor, a benchmark's), which record nothing; record in another "
                            "process: the key's kernels are installed once per process")
    if unboxed_kernels is not None and _ext.installed() and bool(unboxed_kernels) != _unboxed_kernels:
        raise CrucibleError("crucible.configure(unboxed_kernels=...) after the recording kernels were installed "
                            "(by enable(), recording() or compile()); call configure() before those")
    rings = tuple(old if v is None else _nonnegative_int("configure", name, v) for v, old, name in
                  zip((ring_entries, meta_cells, scalar_slots), _ring_sizes,
                      ("ring_entries", "meta_cells", "scalar_slots")))
    for n, name in zip(rings, ("ring_entries", "meta_cells", "scalar_slots")):
        if n < 2 or n & (n - 1) or n >= 1 << 32:
            raise CrucibleError(f"crucible.configure: {name} {n} is not a power of two from 2 to 2^31: "
                                f"use 65536, 131072, ...")
    plan = tuple(old if v is None else _nonnegative_int("configure", name, v) for v, old, name in
                 zip((memory_budget, plan_alignment), _plan_options, ("memory_budget", "plan_alignment")))
    if plan[0] >= 1 << 64:
        raise CrucibleError(f"crucible.configure: memory_budget {plan[0]} is over 2^64 - 1 bytes")
    _check_alignment("configure", "plan_alignment", plan[1])
    # Every setting is checked before any is applied: the recorder's and the pipeline's own checks
    # first, then both applied (which can then fail only if another thread began recording or
    # started the pipeline in between).
    def apply(check_only):
        if rings != _ring_sizes:
            try:
                _ext.configure(*rings, check_only=check_only)
            except (RuntimeError, TypeError) as e:
                msg = f"crucible.configure: {e}"
                if "already exists" in msg:
                    msg += (" (the recorder is made by the first call that records or reads the recording: "
                            "enable(), recording(), compile(), track_modules(), track_optimizer(), "
                            "mark_inputs(), mark_constants(), stats(), trace(), iteration(), export(), "
                            "clear() or flush()): call crucible.configure() before any of those")
                raise CrucibleError(msg) from None
        if plan != _plan_options:
            try:
                _ext.configure_plan(*plan, check_only=check_only)
            except (RuntimeError, TypeError) as e:
                raise CrucibleError(f"crucible.configure: {e}") from None
    apply(check_only=True)
    apply(check_only=False)
    _ring_sizes, _plan_options = rings, plan
    if unboxed_kernels is not None:
        _unboxed_kernels = bool(unboxed_kernels)


def enable(drop_when_full: bool = False) -> None:
    """Start recording on the calling thread. Other threads call enable() themselves.

    drop_when_full=False (default): a full ring makes the recording thread wait for the drain.
    True: the op is counted as dropped (stats()['dropped']) and the next op is flagged.
    The mode is the calling thread's, as recording is.
    """
    if not isinstance(drop_when_full, bool):
        raise CrucibleError(f"crucible.enable: drop_when_full must be True or False, got "
                            f"{type(drop_when_full).__name__} {drop_when_full!r}")
    try:
        _ext.install(_unboxed_kernels)
        _ext.set_thread_drop_when_full(drop_when_full)
        _ext.start_pipeline()
        _ext.set_enabled(True)
    except RuntimeError as e:
        raise CrucibleError(str(e)) from None


def disable() -> bool:
    """Stop recording on the calling thread (already recorded ops are kept). Returns whether
    the calling thread was recording: recording is per thread, and disable() on one thread
    leaves the others recording."""
    was = bool(_ext.is_enabled())
    _ext.set_enabled(False)
    return was


def is_enabled() -> bool:
    """Whether the calling thread records (per thread, as enable() and disable())."""
    return bool(_ext.is_enabled())


@contextlib.contextmanager
def recording(drop_when_full: bool = False):
    """with crucible.recording(): ... records the block on this thread. On exit (an exception
    included) recording is as before the block, and so is the drop_when_full mode."""
    was = is_enabled()
    mode = bool(_ext.thread_drop_when_full())
    enable(drop_when_full)
    try:
        yield
    finally:
        _ext.set_thread_drop_when_full(mode)
        if not was:
            disable()


class _Handles:
    def __init__(self, handles, on_remove=None):
        self._handles = handles
        self._on_remove = on_remove

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []
        if self._on_remove is not None:
            self._on_remove()
            self._on_remove = None


_tracked = {}                # id(model) -> (weak reference to it, its _Handles), while its hooks are on
_scopes = threading.local()  # per thread: (tracking, id(module)) -> scope depths of its open calls
_trackings = itertools.count(1)  # one number per track_modules() that added hooks


def _untrack(key: int, ref, _tracked=_tracked) -> None:  # bound: may run at interpreter exit
    entry = _tracked.get(key)
    if entry is not None and entry[0] is ref:
        _tracked.pop(key, None)


def _open_calls() -> dict:
    d = getattr(_scopes, "calls", None)
    if d is None:
        d = _scopes.calls = {}
    return d


def track_modules(model) -> _Handles:
    """Every op run inside a submodule's forward carries that module's path ("layer1.0.conv1").

    Also classifies the model's parameters and buffers as externals of the trace.
    Returns a handle whose remove() takes the hooks off again; for a model tracked already, the
    same handle (its parameters and buffers classified again), not a second set of hooks. The
    hooks hold no reference to the model. A forward that raises leaves no stale scope behind:
    the end of the call of a module around it drops it, and so does the model's next call
    (the model itself is never called from inside its own forward).
    A module path a trace file cannot hold (over 65536 bytes or 256 levels) raises
    CrucibleError before any hook is added (the paths interned before it stay interned: an
    unused path costs nothing).
    """
    key = id(model)
    entry = _tracked.get(key)
    if entry is not None and entry[0]() is model:
        _classify(model.parameters(), "parameter")
        _classify(model.buffers(), "buffer")
        return entry[1]
    handles = []
    # Open calls are kept per tracking: a model tracked inside another tracked model (its
    # submodule tracked too) has two sets of hooks, and neither must read the other's calls.
    tracking = next(_trackings)
    modules = list(model.named_modules())
    ids = []
    for name, _ in modules:  # all interned (or refused) before any hook exists
        try:
            ids.append(_ext.intern_module(name))
        except ValueError as e:
            raise CrucibleError(f"crucible.track_modules: {e}") from None
    for (name, mod), mid in zip(modules, ids):
        def pre(m, _inp, _id=mid, _root=mod is model):  # interned once, not per call
            calls = _open_calls()
            k = (tracking, id(m))
            depths = calls.get(k)
            if depths is None:
                depths = calls[k] = []
            elif depths and _root:
                # A call of the model that never returned (its forward raised): drop the scopes
                # it left, and what this tracking's open calls at or above that depth remember.
                stale = depths[0]
                _ext.pop_modules_to_if(stale, _id)
                for (t, _), d in calls.items():
                    if t == tracking:
                        d[:] = [x for x in d if x < stale]
            depths.append(_ext.push_module_id(_id))

        def post(m, _inp, _out):
            depths = _open_calls().get((tracking, id(m)))
            if depths:
                _ext.pop_modules_to(depths.pop())

        handles.append(mod.register_forward_pre_hook(pre))
        handles.append(mod.register_forward_hook(post))
    _classify(model.parameters(), "parameter")
    _classify(model.buffers(), "buffer")
    ref = weakref.ref(model, lambda r, k=key, untrack=_untrack: untrack(k, r))
    h = _Handles(handles, lambda: _untrack(key, ref))
    _tracked[key] = (ref, h)
    return h


def track_optimizer(optimizer) -> int:
    """Classifies the optimizer's current state tensors and the parameters' gradients. Returns
    how many gradient and state tensors it classified: gradients and optimizer state exist only
    after the first backward and step, and before those it warns that it found none."""
    import torch
    n = 0
    for group in optimizer.param_groups:
        _classify(group["params"], "parameter")
        n += _classify((p.grad for p in group["params"]), "gradient")
    for st in optimizer.state.values():
        n += _classify((v for v in st.values() if isinstance(v, torch.Tensor)), "optimizer_state")
    if n == 0 and not optimizer.state:
        import warnings
        warnings.warn("crucible.track_optimizer: no gradients or optimizer state exist yet (they are made by "
                      "the first backward and step); call it after the first training step", CrucibleWarning,
                      stacklevel=2)
    return n


def _tensors_of(fn: str, args) -> list:
    import torch
    out = []
    for a in args:
        for t in (a if isinstance(a, (list, tuple)) else (a,)):
            if t is None:  # an optional tensor that is not there
                continue
            if not isinstance(t, torch.Tensor):
                raise CrucibleError(f"crucible.{fn}: expected tensors (or lists of them), got {type(t).__name__}")
            out.append(t)
    return out


def mark_inputs(*tensors) -> int:
    """Classifies tensors the step consumes that no recorded op produced (a batch); lists and
    tuples of tensors are taken apart. Returns how many it classified (a sparse tensor has no
    storage id and is not counted)."""
    return _classify(_tensors_of("mark_inputs", tensors), "input")


def mark_constants(*tensors) -> int:
    """As mark_inputs, for tensors the program reads but never changes."""
    return _classify(_tensors_of("mark_constants", tensors), "constant")


def flush() -> None:
    """Returns once every op recorded before the call is in the trace."""
    _ext.flush()


def stats() -> dict:
    """Ops recorded per phase and per thread, dropped ops, ring bytes, producer waits,
    and ops the fallback saw but did not record (kernel internals, decomposed composites).
    stats()["storage_ids"]: "allocation tags" when storages allocated while recording carry
    their ids in their memory, else why the weak-reference table names them all.
    stats()["compiled"]: crucible.compile's plan builds, plan runs, guard failures,
    divergences, eager calls and refusals, over every compiled step."""
    d = _ext.stats()
    c = _compiled_totals()
    # The native counters under their own names: "captures" there counts only the captures
    # that became plans' inputs, the Python total counts every capture attempt.
    c.update({f"native_{k}": v for k, v in _ext.replay_counters().items()})
    d["compiled"] = c
    return d


_warned_drops = 0  # the drop count trace(), iteration() and export_graph() last warned about


def _warn_dropped(dropped: int, what: str, always: bool = False) -> None:
    """Warns that `what` comes from a recording with `dropped` dropped ops: export() always,
    the others once per new drop count (not on every call after one drop)."""
    global _warned_drops
    if dropped and (always or dropped != _warned_drops):
        if not always:
            _warned_drops = dropped
        import warnings
        warnings.warn(f"crucible: {dropped} ops were dropped while recording (drop_when_full): {what} "
                      f"is of an incomplete recording", CrucibleWarning, stacklevel=3)


def trace():
    """Everything recorded so far (flushes first), as a Trace (len(), op(i), ops())."""
    t = _ext.snapshot()
    _warn_dropped(t.stats()["dropped"], "the trace")
    return t


def export(path: str) -> dict:
    """Flushes and writes everything recorded so far to a .crtrace file. Returns its stats."""
    t = _ext.snapshot()
    try:
        t.save(os.fspath(path))
    except RuntimeError as e:
        raise CrucibleError(str(e)) from None
    s = t.stats()
    _warn_dropped(s["dropped"], f"the trace written to {path}", always=True)
    return s


def load_trace(path: str):
    """Reads a .crtrace file. A truncated or corrupted file raises CrucibleError."""
    try:
        return _ext.load_trace(os.fspath(path))
    except RuntimeError as e:
        raise CrucibleError(str(e)) from None


def iteration(trace=None, thread: int = -1, budget: Optional[int] = None,
              alignment: Optional[int] = None) -> dict:
    """The latest steady iteration of the recording (or of `trace`): op counts per phase, the
    Merkle root hash, region hashes, and the static memory plan (arena bytes, lower bound,
    ratio, plan_placement: "greedy by size", or "time order" for a plan too large for it).
    incomplete / ops_after_drop: whether (and how many of) its ops were recorded right after
    dropped ones (drop_when_full), so that the analysis covers only what was recorded.
    pipeline_stale: the ops recorded on its thread since it are not periodic (a CrucibleWarning
    says so, with pipeline_last_detection, the detector's reason); it is the last one found.
    Published iterations also say how the pipeline got them (pipeline_builds, pipeline_reused,
    pipeline_rewired, pipeline_cached: analyses kept for reuse; pipeline_recycled: copies made into
    an earlier copy's memory; pipeline_build_faults: the last build's minor page faults) and what it planned with
    (pipeline_plan_budget, pipeline_plan_alignment: crucible.configure's memory_budget and
    plan_alignment).
    budget, alignment: None plans as the pipeline does (configure's values); a number plans the
    recorded step again with it (budget 0: no check). A plan over the budget comes back with
    plan_error naming what is live at the peak.
    Raises CrucibleError when no iteration can be found (and says why)."""
    _check_trace("iteration", trace)
    thread = _thread_arg("iteration", thread)
    budget = _plan_options[0] if budget is None else _nonnegative_int("iteration", "budget", budget)
    if budget >= 1 << 64:
        raise CrucibleError(f"crucible.iteration: budget {budget} is over 2^64 - 1 bytes")
    alignment = _plan_options[1] if alignment is None else _nonnegative_int("iteration", "alignment", alignment)
    _check_alignment("iteration", "alignment", alignment)
    try:
        if trace is None and thread == -1 and (budget, alignment) == _plan_options:
            it = _ext.published_iteration()  # what the background pipeline published
            _warn_dropped(_ext.stats()["dropped"], "the iteration")
            if it["pipeline_stale"]:
                import warnings
                warnings.warn(f"crucible: this is the last iteration found, older than the ops recorded "
                              f"after it, which are no loop ({it['pipeline_last_detection']}). Call "
                              f"crucible.clear() before recording another loop, so that the one before "
                              f"is not reported as the latest",
                              CrucibleWarning, stacklevel=2)
            return it
        t = trace if trace is not None else _ext.snapshot()
        _warn_dropped(t.stats()["dropped"], "the iteration")
        return _ext.iteration(t, thread, budget, alignment)
    except RuntimeError as e:
        raise CrucibleError(_with_drop_hint(str(e), trace)) from None


def _with_drop_hint(msg: str, trace) -> str:
    """msg, and when no iteration was found in a recording that dropped ops, that this may be why."""
    dropped = (trace.stats() if trace is not None else _ext.stats())["dropped"]
    if dropped and "not periodic" in msg:
        msg += (f" ({dropped} ops were dropped while recording (drop_when_full), which may be why: a step "
                f"that lost ops differs from one that did not. Record with back-pressure, the default, or "
                f"larger rings: crucible.configure(ring_entries=..., meta_cells=..., scalar_slots=...))")
    return msg


def _thread_arg(fn: str, thread) -> int:
    """A recording thread's index (stats()['threads'] order), or -1: the thread with most ops."""
    if isinstance(thread, bool):
        raise CrucibleError(f"crucible.{fn}: thread must be an int, got bool")
    try:
        n = operator.index(thread)
    except TypeError:
        raise CrucibleError(f"crucible.{fn}: thread must be an int, got {type(thread).__name__}") from None
    if n < -1 or n >= 1 << 31:
        raise CrucibleError(f"crucible.{fn}: thread {n} is no recording thread's index: use one from "
                            f"0 (the first thread that recorded), or -1 for the thread with the most ops")
    return n


def _check_trace(fn: str, trace) -> None:
    if trace is not None and not isinstance(trace, _ext.Trace):
        raise CrucibleError(f"crucible.{fn}: trace must be a Trace (from crucible.trace() or crucible.load_trace()), "
                            f"got {type(trace).__name__}; for a file, pass crucible.load_trace(path)")


def export_graph(path: str, trace=None, thread: int = -1) -> int:
    """Writes the latest iteration's dataflow graph as Graphviz DOT (nodes coloured by phase,
    clustered by module). Returns the number of nodes. Render: dot -Tsvg path -o graph.svg"""
    _check_trace("export_graph", trace)
    thread = _thread_arg("export_graph", thread)
    try:
        t = trace if trace is not None else _ext.snapshot()
        _warn_dropped(t.stats()["dropped"], "the graph")
        return _ext.export_graph(t, os.fspath(path), thread)
    except RuntimeError as e:
        raise CrucibleError(_with_drop_hint(str(e), trace)) from None


def clear() -> None:
    """Forgets every recorded op; stats() counts ops, drops, bytes and waits from here on
    (the skipped-op counts and stats()["compiled"] keep counting)."""
    global _warned_drops
    _warned_drops = 0
    _ext.clear()


# ---------------------------------------------------------------------------------------
# crucible.compile: record a training step, build an ExecutionPlan, replay it from C++.

_MISSING = object()
_PLAIN = (bool, int, float, str, type(None), tuple)
_COUNTERS = ("calls", "plan_runs", "eager_calls", "captures", "plans_built", "guard_misses",
             "guard_failures", "plan_updates", "hyper_learned", "rebinds", "replans",
             "verifications", "divergences", "refusals")
_compile_totals = {k: 0 for k in _COUNTERS}   # of compiled steps already garbage-collected
_live_steps = weakref.WeakSet()


def _retire_stats(stats):
    with _lock:
        for k, v in stats.items():
            _compile_totals[k] += v


def _compiled_totals() -> dict:
    with _lock:
        d = dict(_compile_totals)
    for step in list(_live_steps):
        for k, v in step._stats.items():
            d[k] += v
    return d


_ONE_TENSOR = ("t",)
_MAX_SIGNATURES = 64   # call signatures (plans) per compiled step; more run eagerly
_MAX_ATTEMPTS = 3      # pairs of recorded calls that disagree before a signature runs eagerly


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
                    keys.append((m.__dict__, "training", m.training, E))
                    # plain settings a forward reads (dropout p, batchnorm momentum and eps)
                    for k, v in vars(m).items():
                        if not k.startswith("_") and k != "training" and isinstance(v, _PLAIN):
                            keys.append((m.__dict__, k, v, E))
            else:
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
        self._hyper = hyper
        self._native = _ext.StateGuard(keys, dicts, lists)
        self.ok = self._native.ok


class _ScalarSources:
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
        import math
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


class _Entry:
    __slots__ = ("plan", "forms", "srcs", "spec", "seen", "refused", "guard", "lifted", "patched", "attempts")

    def __init__(self):
        self.plan, self.forms, self.srcs, self.spec, self.seen, self.refused, self.guard = None, [], [], None, 0, None, None
        self.lifted = {}       # id(param group) -> hyperparameters the plan takes from sources
        self.patched = False   # the plan has patch points: each run needs the sources' values
        self.attempts = 0      # plan builds that failed: two recorded calls disagreed


class CompiledStep:
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
    plan's first run (arena=False: PyTorch's allocator throughout). verify_every=N re-records every N-th plan call eagerly and compares;
    a divergence returns the eager result and retires the plan. A step whose two recordings
    differ (a changing scalar of unknown source, a different op path) runs eagerly, and a
    CrucibleWarning says which op and argument."""

    def __init__(self, fn, verify_every: int = 0, warmup: int = 1, guard=(), arena: bool = True):
        if not callable(fn):
            raise CrucibleError(f"crucible.compile needs a callable, got {type(fn).__name__}")
        verify_every = _nonnegative_int("compile", "verify_every", verify_every)
        warmup = _nonnegative_int("compile", "warmup", warmup)
        if not isinstance(arena, bool):
            raise CrucibleError(f"crucible.compile: arena must be True or False, got {type(arena).__name__}")
        import torch
        if isinstance(guard, (torch.nn.Module, torch.optim.Optimizer)):
            guard = (guard,)
        try:
            guard = tuple(guard)
        except TypeError:
            raise CrucibleError(f"crucible.compile: guard must be a module, an optimizer, or a sequence of "
                                f"them (or of objects holding them), got {type(guard).__name__}") from None
        for g in guard:  # each must hold something to guard, or it would be ignored without a word
            if not _discover_state(_guards_nothing, (g,)):
                raise CrucibleError(f"crucible.compile: guard entry of type {type(g).__name__} is no module or "
                                    f"optimizer and holds none as an attribute: pass the modules and "
                                    f"optimizers the step uses")
        try:
            _ext.install(_unboxed_kernels)
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
        self._run = torch.ops.crucible.run
        self._finish = torch.ops.crucible.capture_finish
        self._note_grads = torch.ops.crucible.note_grads
        self._tensor = torch.Tensor
        self._stats = {k: 0 for k in _COUNTERS}
        self._has_sources = bool(self._sources)
        _live_steps.add(self)
        weakref.finalize(self, _retire_stats, self._stats)
        self._overflow_warned = False
        self._recording_warned = False
        self._unhashable_warned = False
        self._warm = False        # the warm-up call has run (gradients and optimizer state exist)
        self._argkeys = set()     # argument signatures seen (guard_misses counts new ones)
        self.last_refusal = None    # why the last refused signature runs eagerly
        self.last_divergence = None
        self.__wrapped__ = fn

    # -- bookkeeping -------------------------------------------------------------------
    def _count(self, k, n=1):
        self._stats[k] += n

    def stats(self) -> dict:
        """calls, plan_runs, eager_calls, captures, plans_built; guard_misses (a call signature
        without a plan yet); guard_failures (the modules' or optimizers' state changed), each
        ending in a plan_update (the plan kept: hyper_learned, a hyperparameter taken over as
        patch points; rebinds, new persistent tensors bound) or a replan (the plan dropped,
        the step records again); verifications, divergences, refusals; plus plans (live plans)
        and guarded (the modules and optimizers found)."""
        d = dict(self._stats)
        d["plans"] = sum(1 for e in self._entries.values() if e.plan is not None)
        d["guarded"] = [type(o).__name__ for o in self._guard_objs]
        return d

    def plans(self) -> list:
        """plan_info() of every live plan: kernel calls, slots, externals, hash, build time."""
        return [_ext.plan_info(e.plan) for e in self._entries.values() if e.plan is not None]

    def reset(self) -> None:
        """Forgets every plan and refusal; the next calls record again."""
        for e in self._entries.values():
            self._drop(e)
        self._entries.clear()

    def _drop(self, e):
        for f in e.forms:
            _ext.form_release(f)
        e.forms, e.srcs = [], []
        if e.plan is not None:
            _ext.plan_release(e.plan)
        e.plan, e.seen, e.guard, e.lifted, e.patched = None, 0, None, {}, False

    def _refuse(self, e, why):
        import warnings
        self._drop(e)
        e.refused = why
        self.last_refusal = why
        self._count("refusals")
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
                key.append((a.shape, a.stride(), a.dtype, a.device, a.requires_grad))
            else:
                self._nested_key(a, key, tensors)
        for k in sorted(kwargs):
            key.append(k)
            self._nested_key(kwargs[k], key, tensors)
        # Which parameters have a .grad as the call begins: backward stores a new gradient
        # into an empty .grad and accumulates into an existing one (other ops), so a loop that
        # clears gradients every few steps gets a plan for each case.
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
            if len(self._entries) >= _MAX_SIGNATURES:
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
            if self._warm:   # the first call made the step's state: later signatures record at once
                e.seen = self._warmup
        if e.plan is not None:
            if not e.guard.ok():
                st["guard_failures"] += 1
                return self._update(e, args, kwargs, tensors)
            else:
                if self._verify_every and (st["plan_runs"] + st["verifications"] + 1) % self._verify_every == 0:
                    return self._verify(e, args, kwargs, tensors)
                vals = [v for _, _, v, _ in self._sources.values(True)] if e.patched else []
                try:
                    outs = self._run(e.plan, tensors, vals)
                except RuntimeError as err:
                    if "crucible-guard:" not in str(err):
                        raise
                    st["guard_failures"] += 1   # checked before anything ran
                    return self._update(e, args, kwargs, tensors)
                st["plan_runs"] += 1
                return outs[0] if e.spec is _ONE_TENSOR else _unflatten_out(e.spec, iter(outs))
        if e.refused is not None:
            self._count("eager_calls")
            return self._fn(*args, **kwargs)
        e.seen += 1
        if e.seen <= self._warmup:
            self._count("eager_calls")
            result = self._fn(*args, **kwargs)
            self._warm = True
            return result
        result, form, spec = self._capture(e, args, kwargs, tensors)
        if form is None:
            return result
        if e.forms and spec != e.spec:
            _ext.form_release(form)
            self._refuse(e, "the step returned a different structure in two calls")
            return result
        e.spec = spec
        e.forms.append(form)
        e.srcs.append(self._sources.values(False) if self._sources else [])
        if len(e.forms) == 2:
            try:
                e.plan = _ext.plan_build(e.forms[0], e.forms[1], e.srcs[0], e.srcs[1])
            except RuntimeError as err:
                e.attempts += 1
                if e.attempts >= _MAX_ATTEMPTS:
                    self._refuse(e, str(err))
                else:   # maybe a one-off (state that changed between the two calls): try the next pair
                    _ext.form_release(e.forms.pop(0))
                    e.srcs.pop(0)
                return result
            for f in e.forms:
                _ext.form_release(f)
            e.forms, e.srcs = [], []
            if not self._arena:
                _ext.plan_set_arena(e.plan, False)
            info = _ext.plan_info(e.plan)
            e.patched = info["patches"] > 0
            if not self._guard_objs and not self._nothing_guarded_warned:
                import warnings
                self._nothing_guarded_warned = True
                warnings.warn(
                    "crucible.compile found no torch.nn.Module or optimizer in the step (its bound "
                    "self, closure, the globals it names, one attribute deep): a replaced parameter, "
                    "a loaded optimizer state, train()/eval() or a new learning rate will not be "
                    "noticed. Pass them: crucible.compile(step, guard=(model, optimizer)).",
                    CrucibleWarning, stacklevel=2)
            e.guard = _StateGuard(self._guard_objs, e.lifted)
            self._count("plans_built")
            if info["value_reads"] and not self._verify_every:
                import warnings
                warnings.warn(
                    f"crucible.compile: the step reads tensor values into Python "
                    f"({', '.join(info['value_reads'][:3])}: .item(), bool(), float()). The plan "
                    f"replays the path those values took in the recorded calls; a branch on them is "
                    f"caught only by verification: pass verify_every=N.", CrucibleWarning, stacklevel=2)
        return result

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

    def _rediscover(self):
        """Modules and optimizers again (a global assigned after compile(), a new optimizer)."""
        objs = _discover_state(self._fn, self._guard_extra)
        if [id(o) for o in objs] != [id(o) for o in self._guard_objs]:
            self._guard_objs = objs
            self._sources = _ScalarSources(objs)
            self._has_sources = bool(self._sources)
            self._param_list = self._params()

    def _capture(self, e, args, kwargs, tensors):
        """Runs the step eagerly while capturing its ops. Returns (result, form or None, spec)."""
        if not e.forms:
            self._rediscover()
        self._count("captures")
        self._count("eager_calls")
        self._note_grads(self._params())
        try:
            _ext.capture_start(not is_enabled())
        except RuntimeError as err:   # e.g. under torch.autocast: nothing can be recorded
            self._refuse(e, str(err))
            return self._fn(*args, **kwargs), None, None
        try:
            result = self._fn(*args, **kwargs)
        except BaseException:
            _ext.capture_discard()
            raise
        _ext.capture_stop()
        flat = []
        try:
            spec = _flatten_out(result, flat)
        except _Unsupported as err:
            _ext.capture_discard()
            self._refuse(e, str(err))
            return result, None, None
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
        are bound instead. Anything else drops the plan, and the step records again."""
        changed = [(d, k) for d, k, v in e.guard._hyper if d.get(k, _MISSING) != v]
        result, form, spec = self._capture(e, args, kwargs, tensors)
        if form is None:
            return result
        srcs = self._sources.values(False) if self._has_sources else []
        if spec == e.spec:
            why, added, rebound = _ext.plan_update(e.plan, form, srcs)
        else:
            why, added, rebound = "the step returned a different structure", 0, 0
        _ext.form_release(form)
        if why:
            self._count("replans")
            self._drop(e)
            return result
        for d, k in changed:   # that group's value now comes from the sources at every run
            e.lifted.setdefault(id(d), set()).add(k)
        e.patched = _ext.plan_info(e.plan)["patches"] > 0
        e.guard = _StateGuard(self._guard_objs, e.lifted)
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
        srcs = self._sources.values(False) if self._sources else []
        why = _ext.plan_check(e.plan, form, srcs) if spec == e.spec else "the step returned a different structure"
        _ext.form_release(form)
        if why:
            self._count("divergences")
            self.last_divergence = why
            self._drop(e)
            warnings.warn(f"crucible.compile: verification found the step diverged from its plan: {why} "
                          f"The plan is retired; this call's result is eager.", CrucibleWarning, stacklevel=2)
        return result


def compile(fn=None, *, verify_every: int = 0, warmup: int = 1, guard=(), arena: bool = True):
    """step = crucible.compile(train_step): see CompiledStep. Also usable as a decorator,
    with or without arguments."""
    if fn is None:
        return lambda f: CompiledStep(f, verify_every=verify_every, warmup=warmup, guard=guard, arena=arena)
    return CompiledStep(fn, verify_every=verify_every, warmup=warmup, guard=guard, arena=arena)
