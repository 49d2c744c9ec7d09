"""Recording: the per-thread switch, module paths, classification of external tensors, the
trace and its analyses (iterations, graphs, files)."""
from __future__ import annotations

import contextlib
import itertools
import os
import threading
import weakref
from typing import Iterable, Optional

from ._args import _check_alignment, _check_trace, _nonnegative_int, _tensors_of, _thread_arg
from ._compile_stats import compiled_totals as _compiled_totals
from ._errors import CrucibleError, CrucibleStateError, CrucibleTypeError, CrucibleValueError, CrucibleWarning
from ._native import ext as _ext

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


def unboxed_kernels() -> bool:
    """Whether hot ops record through typed kernels (configure(unboxed_kernels=...))."""
    return _unboxed_kernels


_ring_sizes = (1 << 16, 1 << 17, 1 << 16)  # ring_entries, meta_cells, scalar_slots: as configured
_plan_options = (0, 64)  # memory_budget, plan_alignment: as configured


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
        raise CrucibleTypeError(f"crucible.configure: unboxed_kernels must be True or False, got "
                            f"{type(unboxed_kernels).__name__} {unboxed_kernels!r}")
    if unboxed_kernels is not None and _ext.key_floor_installed():
        raise CrucibleStateError("crucible.configure(unboxed_kernels=...) in a process that installed the key-floor "
                            "kernels (install_key_floor, a benchmark's), which record nothing; record in another "
                            "process: the key's kernels are installed once per process")
    if unboxed_kernels is not None and _ext.installed() and bool(unboxed_kernels) != _unboxed_kernels:
        raise CrucibleStateError("crucible.configure(unboxed_kernels=...) after the recording kernels were installed "
                            "(by enable(), recording() or compile()); call configure() before those")
    rings = tuple(old if v is None else _nonnegative_int("configure", name, v) for v, old, name in
                  zip((ring_entries, meta_cells, scalar_slots), _ring_sizes,
                      ("ring_entries", "meta_cells", "scalar_slots")))
    for n, name in zip(rings, ("ring_entries", "meta_cells", "scalar_slots")):
        if n < 2 or n & (n - 1) or n >= 1 << 32:
            raise CrucibleValueError(f"crucible.configure: {name} {n} is not a power of two from 2 to 2^31: "
                                f"use 65536, 131072, ...")
    plan = tuple(old if v is None else _nonnegative_int("configure", name, v) for v, old, name in
                 zip((memory_budget, plan_alignment), _plan_options, ("memory_budget", "plan_alignment")))
    if plan[0] >= 1 << 64:
        raise CrucibleValueError(f"crucible.configure: memory_budget {plan[0]} is over 2^64 - 1 bytes")
    _check_alignment("configure", "plan_alignment", plan[1])
    # Every setting is checked before any is applied: the recorder's and the pipeline's own checks
    # first, then both applied (which can then fail only if another thread began recording or
    # started the pipeline in between).
    def apply(check_only):
        if rings != _ring_sizes:
            try:
                _ext.configure(*rings, check_only=check_only)
            except CrucibleStateError as e:   # the recorder exists already
                raise CrucibleStateError(
                    f"crucible.configure: {e} (the recorder is made by the first call that records or "
                    "reads the recording: enable(), recording(), compile(), track_modules(), "
                    "track_optimizer(), mark_inputs(), mark_constants(), stats(), trace(), iteration(), "
                    "export(), clear() or flush()): call crucible.configure() before any of those") from None
            except CrucibleValueError as e:
                raise CrucibleValueError(f"crucible.configure: {e}") from None
            except RuntimeError as e:
                raise CrucibleError(f"crucible.configure: {e}") from None
        if plan != _plan_options:
            try:
                _ext.configure_plan(*plan, check_only=check_only)
            except CrucibleStateError as e:   # the pipeline runs already
                raise CrucibleStateError(f"crucible.configure: {e}") from None
            except CrucibleValueError as e:
                raise CrucibleValueError(f"crucible.configure: {e}") from None
            except RuntimeError as e:
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
        raise CrucibleTypeError(f"crucible.enable: drop_when_full must be True or False, got "
                            f"{type(drop_when_full).__name__} {drop_when_full!r}")
    try:
        _ext.install(_unboxed_kernels)
        _ext.set_thread_drop_when_full(drop_when_full)
        _ext.start_pipeline()
        _ext.set_enabled(True)
    except CrucibleError:
        raise
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
            raise CrucibleValueError(f"crucible.track_modules: {e}") from None
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
    except CrucibleError:
        raise
    except RuntimeError as e:
        raise CrucibleError(str(e)) from None
    s = t.stats()
    _warn_dropped(s["dropped"], f"the trace written to {path}", always=True)
    return s


def load_trace(path: str):
    """Reads a .crtrace file. A truncated or corrupted file raises CrucibleError."""
    try:
        return _ext.load_trace(os.fspath(path))
    except CrucibleError:
        raise
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
        raise CrucibleValueError(f"crucible.iteration: budget {budget} is over 2^64 - 1 bytes")
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
    except CrucibleError as e:
        raise type(e)(_with_drop_hint(str(e), trace)) from None
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


def export_graph(path: str, trace=None, thread: int = -1) -> int:
    """Writes the latest iteration's dataflow graph as Graphviz DOT (nodes coloured by phase,
    clustered by module). Returns the number of nodes. Render: dot -Tsvg path -o graph.svg"""
    _check_trace("export_graph", trace)
    thread = _thread_arg("export_graph", thread)
    try:
        t = trace if trace is not None else _ext.snapshot()
        _warn_dropped(t.stats()["dropped"], "the graph")
        return _ext.export_graph(t, os.fspath(path), thread)
    except CrucibleError as e:
        raise type(e)(_with_drop_hint(str(e), trace)) from None
    except RuntimeError as e:
        raise CrucibleError(_with_drop_hint(str(e), trace)) from None


def clear() -> None:
    """Forgets every recorded op; stats() counts ops, drops, bytes and waits from here on
    (the skipped-op counts and stats()["compiled"] keep counting)."""
    global _warned_drops
    _warned_drops = 0
    _ext.clear()

