"""Argument checks shared by the recording and compile APIs: each names the function and the
argument, and raises CrucibleTypeError (a TypeError) or CrucibleValueError (a ValueError)."""
from __future__ import annotations

import operator

from ._errors import CrucibleTypeError, CrucibleValueError
from ._native import ext as _ext


def _nonnegative_int(fn: str, name: str, v) -> int:
    try:
        if isinstance(v, bool):
            raise TypeError
        n = operator.index(v)  # int, numpy integers, ...
    except TypeError:
        raise CrucibleTypeError(f"crucible.{fn}: {name} must be an int, got {type(v).__name__}") from None
    if n < 0:
        raise CrucibleValueError(f"crucible.{fn}: {name} must not be negative, got {n}")
    return n


def _check_alignment(fn: str, name: str, n: int) -> None:
    if n == 0 or n & (n - 1) or n > 1 << 30:
        raise CrucibleValueError(f"crucible.{fn}: {name} {n} is not a power of two up to 2^30: use 16, 64, 256, ...")


def _tensors_of(fn: str, args) -> list:
    import torch
    out = []
    for a in args:
        for t in (a if isinstance(a, (list, tuple)) else (a,)):
            if t is None:  # an optional tensor that is not there
                continue
            if not isinstance(t, torch.Tensor):
                raise CrucibleTypeError(f"crucible.{fn}: expected tensors (or lists of them), got {type(t).__name__}")
            out.append(t)
    return out


def _thread_arg(fn: str, thread) -> int:
    """A recording thread's index (stats()['threads'] order), or -1: the thread with most ops."""
    if isinstance(thread, bool):
        raise CrucibleTypeError(f"crucible.{fn}: thread must be an int, got bool")
    try:
        n = operator.index(thread)
    except TypeError:
        raise CrucibleTypeError(f"crucible.{fn}: thread must be an int, got {type(thread).__name__}") from None
    if n < -1 or n >= 1 << 31:
        raise CrucibleValueError(f"crucible.{fn}: thread {n} is no recording thread's index: use one from "
                            f"0 (the first thread that recorded), or -1 for the thread with the most ops")
    return n


def _check_trace(fn: str, trace) -> None:
    if trace is not None and not isinstance(trace, _ext.Trace):
        raise CrucibleTypeError(f"crucible.{fn}: trace must be a Trace (from crucible.trace() or crucible.load_trace()), "
                            f"got {type(trace).__name__}; for a file, pass crucible.load_trace(path)")
