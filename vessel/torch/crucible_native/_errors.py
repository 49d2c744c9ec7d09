"""The exception and warning types crucible_native raises.

Every error is a CrucibleError. A bad argument is also a TypeError (wrong type) or ValueError
(wrong value), so `except ValueError` catches it as it would for any Python API. What the native
side reports arrives as one of these types, never as a prefix inside a message to parse.
"""


class CrucibleError(RuntimeError):
    """An error from Crucible, with what went wrong and what to do."""


class CrucibleTypeError(CrucibleError, TypeError):
    """An argument of the wrong type."""


class CrucibleValueError(CrucibleError, ValueError):
    """An argument of the right type and a wrong value."""


class CrucibleStateError(CrucibleError):
    """The call is valid, but not now: the recorder or the pipeline is already made, or this
    process is a forked child. The message says what to do instead."""


class CrucibleWarning(UserWarning):
    """A compiled step runs eagerly (and why), a plan was retired, or the recording a result
    comes from dropped ops (drop_when_full)."""
