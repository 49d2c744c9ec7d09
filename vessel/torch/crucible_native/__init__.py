"""crucible_native — record every ATen op of a PyTorch program, and compile a training step
(Crucible's PyTorch Vessel).

    import crucible_native as crucible
    crucible.enable()                       # this thread records from now on
    for x, y in loader:
        opt.zero_grad(); loss_fn(model(x), y).backward(); opt.step()
    crucible.disable()
    crucible.export("run.crtrace")

    step = crucible.compile(train_step)     # a plan replayed from one C++ call

One module per concern: _native (loading the native library and checking it matches this
torch), recorder (recording, module paths, traces and their analyses), compile (capture,
plans, guards, after_step), purity (what a captured call does besides ATen ops), _fingerprint
(fingerprints of Python state), _python_guard (the Python state checked before each plan
run), optimizer_sources (the optimizer scalars a plan takes as patch points), _errors (the
exception types). Everything public is re-exported here.
"""
from ._errors import (CrucibleError, CrucibleStateError, CrucibleTypeError, CrucibleValueError,
                      CrucibleWarning)
from ._native import build_dir, ext as _ext
from .recorder import (clear, configure, disable, enable, export, export_graph, flush, is_enabled,
                        iteration, load_trace, mark_constants, mark_inputs, recording, stats,
                        storage_id, trace, track_modules, track_optimizer)
from .recorder import _storage_cdata  # noqa: F401  (tests read storages' identities with it)
from .compile import CompiledStep, after_step, compile

__all__ = [
    "configure", "enable", "disable", "is_enabled", "recording", "track_modules", "track_optimizer",
    "mark_inputs", "mark_constants", "flush", "stats", "export", "load_trace", "trace",
    "clear", "storage_id", "iteration", "export_graph", "build_dir", "CrucibleError",
    "CrucibleTypeError", "CrucibleValueError", "CrucibleStateError",
    "compile", "CompiledStep", "after_step", "CrucibleWarning",
]

# What a forked child cannot do, and what is valid but not now, raise these whichever binding
# threw them (Note [Forked children]).
_ext.set_error_types(CrucibleStateError, CrucibleValueError)
