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
import json
import os
import sys
import threading
from typing import Iterable, Optional

__all__ = [
    "configure", "enable", "disable", "is_enabled", "recording", "track_modules", "track_optimizer",
    "mark_inputs", "mark_constants", "flush", "stats", "export", "load_trace", "trace",
    "clear", "storage_id", "iteration", "export_graph", "build_dir", "CrucibleError",
]


class CrucibleError(RuntimeError):
    """An error from Crucible, with what went wrong and what to do."""


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
_state = threading.local()
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
        _ext.classify_external(storage_id(t), _KINDS[kind])
        n += 1
    return n


_unboxed_kernels = True


def configure(ring_entries: int = 1 << 16, meta_cells: int = 1 << 17, scalar_slots: int = 1 << 16,
              unboxed_kernels: bool = True) -> None:
    """Sets the per-thread ring sizes (powers of two) and whether hot ops record through typed
    (unboxed) kernels — the same records, less overhead. Only before recording starts."""
    global _unboxed_kernels
    if _ext.installed():
        raise CrucibleError("crucible.configure() after recording started; call it first")
    try:
        _ext.configure(ring_entries, meta_cells, scalar_slots)
    except (RuntimeError, TypeError) as e:
        raise CrucibleError(str(e)) from None
    _unboxed_kernels = bool(unboxed_kernels)


def enable(drop_when_full: bool = False) -> None:
    """Start recording on the calling thread. Other threads call enable() themselves.

    drop_when_full=False (default): a full ring makes the recording thread wait for the drain.
    True: the op is counted as dropped (stats()['dropped']) and the next op is flagged.
    """
    try:
        _ext.install(_unboxed_kernels)
    except RuntimeError as e:
        raise CrucibleError(str(e)) from None
    _ext.set_drop_when_full(bool(drop_when_full))
    _ext.start_pipeline()
    _ext.set_enabled(True)


def disable() -> None:
    """Stop recording on the calling thread (already recorded ops are kept)."""
    _ext.set_enabled(False)


def is_enabled() -> bool:
    return bool(_ext.is_enabled())


@contextlib.contextmanager
def recording(drop_when_full: bool = False):
    """with crucible.recording(): ... records the block on this thread."""
    was = is_enabled()
    enable(drop_when_full)
    try:
        yield
    finally:
        if not was:
            disable()


class _Handles:
    def __init__(self, handles):
        self._handles = handles

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []


def track_modules(model) -> _Handles:
    """Every op run inside a submodule's forward carries that module's path ("layer1.0.conv1").

    Also classifies the model's parameters and buffers as externals of the trace.
    Returns a handle whose remove() takes the hooks off again.
    """
    handles = []
    for name, mod in model.named_modules():
        def pre(_m, _inp, _name=name):
            _ext.push_module(_name)

        def post(_m, _inp, _out):
            _ext.pop_module()

        handles.append(mod.register_forward_pre_hook(pre))
        handles.append(mod.register_forward_hook(post))
    _classify(model.parameters(), "parameter")
    _classify(model.buffers(), "buffer")
    return _Handles(handles)


def track_optimizer(optimizer) -> None:
    """Classifies the optimizer's current state tensors and the parameters' gradients."""
    import torch
    for group in optimizer.param_groups:
        _classify(group["params"], "parameter")
        _classify((p.grad for p in group["params"]), "gradient")
    for st in optimizer.state.values():
        _classify((v for v in st.values() if isinstance(v, torch.Tensor)), "optimizer_state")


def mark_inputs(*tensors) -> None:
    """Classifies tensors the step consumes that no recorded op produced (a batch)."""
    _classify(tensors, "input")


def mark_constants(*tensors) -> None:
    _classify(tensors, "constant")


def flush() -> None:
    """Returns once every op recorded before the call is in the trace."""
    _ext.flush()


def stats() -> dict:
    """Ops recorded per phase and per thread, dropped ops, ring bytes, producer waits,
    and ops the fallback saw but did not record (kernel internals, decomposed composites)."""
    return _ext.stats()


def trace():
    """Everything recorded so far (flushes first), as a Trace (len(), op(i), ops())."""
    return _ext.snapshot()


def export(path: str) -> dict:
    """Flushes and writes everything recorded so far to a .crtrace file. Returns its stats."""
    t = _ext.snapshot()
    try:
        t.save(os.fspath(path))
    except RuntimeError as e:
        raise CrucibleError(str(e)) from None
    s = t.stats()
    if s["dropped"]:
        print(f"crucible: warning: {s['dropped']} ops were dropped (drop_when_full); "
              f"the trace of {path} is incomplete", file=sys.stderr)
    return s


def load_trace(path: str):
    """Reads a .crtrace file. A truncated or corrupted file raises CrucibleError."""
    try:
        return _ext.load_trace(os.fspath(path))
    except RuntimeError as e:
        raise CrucibleError(str(e)) from None


def iteration(trace=None, thread: int = -1, budget: int = 0, alignment: int = 64) -> dict:
    """The latest steady iteration of the recording (or of `trace`): op counts per phase, the
    Merkle root hash, region hashes, and the static memory plan (arena bytes, lower bound,
    ratio). budget > 0 checks persistent state + arena against that many bytes: a plan that
    does not fit comes back with plan_error naming what is live at the peak.
    Raises CrucibleError when no iteration can be found (and says why)."""
    try:
        if trace is None and thread == -1 and budget == 0 and alignment == 64:
            return _ext.published_iteration()  # what the background pipeline published
        return _ext.iteration(trace if trace is not None else _ext.snapshot(), thread, budget, alignment)
    except RuntimeError as e:
        raise CrucibleError(str(e)) from None


def export_graph(path: str, trace=None, thread: int = -1) -> int:
    """Writes the latest iteration's dataflow graph as Graphviz DOT (nodes coloured by phase,
    clustered by module). Returns the number of nodes. Render: dot -Tsvg path -o graph.svg"""
    try:
        return _ext.export_graph(trace if trace is not None else _ext.snapshot(), os.fspath(path), thread)
    except RuntimeError as e:
        raise CrucibleError(str(e)) from None


def clear() -> None:
    """Forgets every recorded op (counters in stats() keep counting)."""
    _ext.clear()
