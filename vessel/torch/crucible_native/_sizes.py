"""Note [Symbolic sizes]: what the step's Python did with tensor sizes while a call was
captured, so that a whole-step plan can be bound to new sizes without recording a call
(Note [Bound sizes] in vessel/torch/Replay.cpp).

A whole-step plan runs no Python. Two plans of one size family (the template, and the one
derived from a call at other sizes, Note [Size families]) show that the ATen ops are the
same at both sizes, but not why: a branch on `x.shape[1] > 10` takes the same path at 12 and
14 and another at 8. So while a call is captured, the sizes Python reads from tensors
(`.shape`, `.size()`, `.stride()`, `.numel()`, `.nelement()`, `.storage_offset()`,
`torch.numel`) are handed out as `_Sym`, an int that logs what is done with it: arithmetic
(+, -, *, //, %, **, neg, abs) gives another `_Sym` (a node of the log), a comparison or a truth
test logs its operands and result, and any other use (int(), float(), hash(), str(), a bit
operation, a true division, len() of a tensor) logs an escape: a value Crucible cannot follow
further.

Two such logs, of the template's call and of the derived call, must be the same sequence
of reads, operations, comparisons and escapes (only the values differ); `SizeGuard` then
holds, per node, its values at the two sizes. At new sizes C it evaluates every node: a read
by the one-parameter fits of the argument sizes that differ (S + d, c*S, c*S*T: the fits the
plans' integers were explained by), an operation exactly from its operands; and it checks that
each comparison gives the recorded result, each escaped value is the recorded one (an escape of
a size that differs between the two recorded calls rules binding out for the family), and each
computed value is the one its own fit predicts (a value Python could have passed to an op: the
bound plan's integer comes from that fit). Then C takes the recorded path with the integers the
plan is bound with, and needs no recorded call.

C functions that take an int's value without calling a method of it are wrapped while a call
is captured, their size arguments logged as escapes: range() and the math functions of _MATH.
What is not followed: a size made a plain int by C code that is not wrapped (indexing or slicing
a Python list with it, torch.Size.numel(), a math function imported by name before the capture,
`from math import log2`, NumPy, other extensions). Such a value that reaches
an ATen op and differs between the two recorded sizes is explained by a fit or refuses the
family; one that changes the number of ops shows between the two recorded calls; but one equal
at both recorded sizes is a constant of the bound plan, and would go unnoticed if it differed at
a third (a size-indexed table of integers). verify_every=N compares bound plans with recorded
calls; crucible.compile(step, new_sizes="record") records every new size instead.
"""
from __future__ import annotations

import operator
import threading

_index = operator.index   # an int subclass's plain value, calling none of its methods

# Operations that give another _Sym: name -> function of two plain ints (one for unary ones).
_BINARY = {"add": operator.add, "sub": operator.sub, "mul": operator.mul, "floordiv": operator.floordiv,
           "mod": operator.mod, "pow": operator.pow}
_UNARY = {"neg": operator.neg, "pos": operator.pos, "abs": operator.abs}
_COMPARE = {"eq": operator.eq, "ne": operator.ne, "lt": operator.lt, "le": operator.le, "gt": operator.gt,
            "ge": operator.ge}


class SizeLog:
    """The log of one captured call (its thread's reads only)."""
    __slots__ = ("thread", "active", "nodes", "vals", "events")

    def __init__(self):
        self.thread = threading.get_ident()
        self.active = True
        self.nodes = []    # ("read", kind, dim) | (op, x, y): operands are node indices or ("k", value)
        self.vals = []     # per node, its value
        self.events = []   # ("cmp", op, x, y, result) | ("esc", x, how)

    def live(self) -> bool:
        return self.active and threading.get_ident() == self.thread

    def node(self, desc, value) -> "_Sym":
        value = _index(value)
        self.nodes.append(desc)
        self.vals.append(value)
        return _Sym._make(value, self, len(self.nodes) - 1)

    def operand(self, x):
        """x as an operand: its node, ("k", value) for a plain int, None for anything else."""
        if isinstance(x, _Sym) and x._log is self:
            return x._n
        if isinstance(x, int):   # bool included: True is 1
            return ("k", _index(x))
        return None


def _tensor_type():
    import torch
    return torch.Tensor


class _Sym(int):
    """A tensor size handed to the step's Python during a capture (Note [Symbolic sizes])."""

    @staticmethod
    def _make(value, log, n):
        s = int.__new__(_Sym, value)
        s._log, s._n = log, n
        return s

    def _escape(self, how):
        log = self._log
        if log.live():
            log.events.append(("esc", self._n, how))


def _arith(name, reflected=False):
    plain = getattr(int, f"__{'r' if reflected else ''}{name}__")

    def op(self, other, *mod):
        res = plain(self, other, *mod)
        log = self._log
        if not log.live():
            return res
        if mod:   # pow(s, e, m)
            log.events.append(("esc", self._n, "pow"))
            return res
        if res is NotImplemented:
            if not isinstance(other, _tensor_type()):   # a tensor's own operator takes the int to ATen
                log.events.append(("esc", self._n, name))
            return NotImplemented
        if not isinstance(res, int):   # 2 ** -1 is a float
            log.events.append(("esc", self._n, name))
            return res
        o = log.operand(other)
        return log.node((name, o, self._n) if reflected else (name, self._n, o), res)
    return op


def _unary(name):
    plain = getattr(int, f"__{name}__")

    def op(self):
        res = plain(self)
        log = self._log
        if not log.live():
            return res
        return log.node((name, self._n, None), res)
    return op


def _compare(name):
    plain = getattr(int, f"__{name}__")

    def op(self, other):
        res = plain(self, other)
        log = self._log
        if not log.live():
            return res
        if res is NotImplemented:
            if isinstance(other, float):
                log.events.append(("esc", self._n, name))
            return res
        o = log.operand(other)
        if o is None:
            return res
        log.events.append(("cmp", name, self._n, o, bool(res)))
        return res
    return op


def _escaping(name):
    plain = getattr(int, name)

    def op(self, *a, **k):
        self._escape(name)
        return plain(self, *a, **k)
    return op


def _bool(self):
    res = int.__bool__(self)
    log = self._log
    if log.live():
        log.events.append(("cmp", "ne", self._n, ("k", 0), res))
    return res


for _n in _BINARY:
    setattr(_Sym, f"__{_n}__", _arith(_n))
    setattr(_Sym, f"__r{_n}__", _arith(_n, reflected=True))
for _n in _UNARY:
    setattr(_Sym, f"__{_n}__", _unary(_n))
for _n in _COMPARE:
    setattr(_Sym, f"__{_n}__", _compare(_n))
_Sym.__bool__ = _bool
for _n in ("__int__", "__index__", "__float__", "__complex__", "__round__", "__trunc__", "__floor__", "__ceil__",
           "__hash__", "__format__", "__str__", "__repr__", "__truediv__", "__rtruediv__", "__divmod__",
           "__rdivmod__", "__and__", "__rand__", "__or__", "__ror__", "__xor__", "__rxor__", "__lshift__",
           "__rlshift__", "__rshift__", "__rrshift__", "__invert__", "bit_length", "bit_count", "to_bytes",
           "as_integer_ratio", "conjugate", "is_integer", "__getnewargs__"):
    if hasattr(int, _n):
        setattr(_Sym, _n, _escaping(_n))
# A copy, a pickle: a plain int (the escape is logged while the call is captured).
_Sym.__reduce__ = lambda self: (self._escape("pickle"), (int, (_index(self),)))[1]
_Sym.__reduce_ex__ = lambda self, protocol: _Sym.__reduce__(self)
_Sym.__copy__ = lambda self: (self._escape("copy"), _index(self))[1]
_Sym.__deepcopy__ = lambda self, memo: (self._escape("copy"), _index(self))[1]
for _n in ("numerator", "denominator", "real", "imag"):
    setattr(_Sym, _n, property(lambda self, _n=_n: (self._escape(_n), getattr(_index(self), _n))[1]))


# -- the reads ----------------------------------------------------------------------------------
# math functions that take an int's value without calling its methods (sqrt, ceil, floor call
# __float__, __ceil__, __floor__: escapes already)
_MATH = ("isqrt", "log", "log2", "log10", "log1p", "gcd", "lcm", "comb", "perm", "factorial", "dist", "hypot")
_builtin_range = range


class _RangeMeta(type):
    def __instancecheck__(cls, obj):
        return isinstance(obj, _builtin_range)

    def __subclasscheck__(cls, sub):
        return issubclass(sub, _builtin_range)

    def __getattr__(cls, name):   # range.index, range.count, ... as the builtin's
        return getattr(_builtin_range, name)


class _Range(metaclass=_RangeMeta):
    """builtins.range while a call is captured: a real range, its size arguments logged as escapes
    (a loop's count is the number of ops it makes, compared between the recorded calls; a count
    equal at both and not at a third would go unseen)."""

    def __new__(cls, *a):
        log = _log_now()
        if log is not None:
            for x in a:
                if isinstance(x, _Sym) and x._log is log:
                    log.events.append(("esc", x._n, "range"))
        return _builtin_range(*a)


# Named as the builtin (pickling a reference to `range` during a capture finds it in builtins).
_Range.__name__ = _Range.__qualname__ = "range"
_Range.__module__ = "builtins"

_state = threading.local()
_active = []          # the live logs (one per capturing thread)
_lock = threading.Lock()
_saved = {}


def _log_now():
    log = getattr(_state, "log", None)
    return log if log is not None and log.active else None


def _install():
    import torch
    T = torch.Tensor
    base = torch._C.TensorBase
    shape_get = base.shape.__get__
    size_m, stride_m, numel_m, nelement_m, offset_m = base.size, base.stride, base.numel, base.nelement, \
        base.storage_offset
    len_m = T.__len__
    numel_f = torch.numel

    def sized(kind, values):
        log = _log_now()
        if log is None:
            return None
        return [log.node(("read", kind, d), v) for d, v in enumerate(values)]

    def shape(self):
        s = shape_get(self)
        got = sized("shape", s)
        return s if got is None else torch.Size(got)

    def size(self, dim=None):
        if dim is None:
            s = size_m(self)
            got = sized("size", s)
            return s if got is None else torch.Size(got)
        v = size_m(self, dim)
        log = _log_now()
        return v if log is None else log.node(("read", "size", dim if isinstance(dim, str) else _index(dim)), v)

    def stride(self, dim=None):
        if dim is None:
            s = stride_m(self)
            got = sized("stride", s)
            return s if got is None else tuple(got)
        v = stride_m(self, dim)
        log = _log_now()
        return v if log is None else log.node(("read", "stride", dim if isinstance(dim, str) else _index(dim)), v)

    def scalar_read(kind, m):
        def read(self):
            v = m(self)
            log = _log_now()
            return v if log is None else log.node(("read", kind, 0), v)
        return read

    def length(self):
        v = len_m(self)
        log = _log_now()
        if log is not None:
            log.node(("read", "len", 0), v)._escape("len")
        return _index(v)

    def numel(t):
        if not isinstance(t, T):
            return numel_f(t)
        return scalar_read("numel", numel_m)(t)

    # C functions that read a size as a plain int without calling a method of it: while a call is
    # captured, a size given to them is an escape (its value checked, never followed)
    import builtins
    import math

    def escaping(fn, how):
        def call(*a, **k):
            log = _log_now()
            if log is not None:
                for x in list(a) + list(k.values()):
                    if isinstance(x, _Sym) and x._log is log:
                        log.events.append(("esc", x._n, how))
            return fn(*a, **k)
        call.__wrapped__ = fn
        return call
    for name in _MATH:
        if hasattr(math, name):
            _saved["math." + name] = getattr(math, name)
            setattr(math, name, escaping(getattr(math, name), "math." + name))
    _saved["range"] = builtins.range
    builtins.range = _Range
    _saved.update(shape=T.__dict__.get("shape"), size=T.__dict__.get("size"), stride=T.__dict__.get("stride"),
                  numel=T.__dict__.get("numel"), nelement=T.__dict__.get("nelement"),
                  storage_offset=T.__dict__.get("storage_offset"), __len__=T.__dict__.get("__len__"),
                  torch_numel=numel_f)
    T.shape = property(shape)
    T.size = size
    T.stride = stride
    T.numel = scalar_read("numel", numel_m)
    T.nelement = scalar_read("numel", nelement_m)
    T.storage_offset = scalar_read("offset", offset_m)
    T.__len__ = length
    torch.numel = numel


def _uninstall():
    import torch
    T = torch.Tensor
    for name in ("shape", "size", "stride", "numel", "nelement", "storage_offset", "__len__"):
        old = _saved.get(name)
        if old is None:
            if name in T.__dict__:
                delattr(T, name)
        else:
            setattr(T, name, old)
    torch.numel = _saved["torch_numel"]
    import builtins
    import math
    builtins.range = _saved["range"]
    for name in _MATH:
        if "math." + name in _saved:
            setattr(math, name, _saved["math." + name])
    _saved.clear()


def start() -> SizeLog:
    """Logs the calling thread's size reads until stop()."""
    log = SizeLog()
    with _lock:
        if not _active:
            _install()
        _active.append(log)
    _state.log = log
    return log


def stop(log: SizeLog) -> None:
    log.active = False
    if getattr(_state, "log", None) is log:
        _state.log = None
    with _lock:
        if log in _active:
            _active.remove(log)
            if not _active:
                _uninstall()


# -- the guard -----------------------------------------------------------------------------------
def _fits(x, y, syms):
    """The fits (as functions of the symbols' values at C) that explain x and y (Note [Size
    families]); empty when none does."""
    out = []
    for i, (a, b) in enumerate(syms):
        if x - a == y - b:
            out.append((1, x - a, i, None, 1))           # S + d
        if x * b == y * a:
            out.append((0, x, i, None, a))               # x * S / a
        for j in range(i, len(syms)):
            c, d = syms[j]
            if x * b * d == y * a * c:
                out.append((0, x, i, j, a * c))          # x * S * T / (a * c)
    return out


def _fit_at(fits, c):
    """The value every fit gives at C, or None (none integral, or two disagree)."""
    v = None
    for add, x, i, j, den in fits:
        if add:
            q = c[i] + x
        else:
            num = x * c[i] * (c[j] if j is not None else 1)
            if num % den:
                return None
            q = num // den
        if v is not None and q != v:
            return None
        v = q
    return v


class SizeGuard:
    """The sizes two recorded calls of a size family read and decided on; check(shapes) says
    whether a call at other sizes takes their path (Note [Symbolic sizes])."""

    def __init__(self, nodes, events, va, syms, pairs, fits, shapes):
        self._nodes, self._events, self._va, self._syms, self._fits = nodes, events, va, syms, fits
        self._pairs = pairs     # per symbol, its values in the two recorded calls
        self._shapes = shapes   # the first recorded call's argument shapes (the dimensions that do not vary)
        self._compiled = None   # check() as one Python function (_compile), made at the first check

    @staticmethod
    def make(log_a, shapes_a, log_b, shapes_b):
        """(SizeGuard, None) or (None, why)."""
        if log_a is None or log_b is None:
            return None, "a recorded call's size reads are not known"
        if log_a.nodes != log_b.nodes or log_a.events != log_b.events:
            return None, "the step's Python read or compared sizes differently at the two recorded sizes"
        if len(shapes_a) != len(shapes_b):
            return None, "the step takes another number of tensor arguments"
        syms = []   # ((arg, dim), value at a, value at b)
        for j, (sa, sb) in enumerate(zip(shapes_a, shapes_b)):
            if len(sa) != len(sb):
                return None, f"step argument {j} has another rank"
            syms.extend(((j, d), x, y) for d, (x, y) in enumerate(zip(sa, sb)) if x != y)
        if not syms:
            return None, "no argument size differs"
        pairs = [(x, y) for _, x, y in syms]
        if len(set(pairs)) > 1:   # as Replay.cpp's independent_sizes says
            (x0, y0), (x1, y1) = sorted(set(pairs))[:2]
            return None, (f"two argument sizes vary independently between the recorded calls ({x0} -> {y0}, "
                          f"{x1} -> {y1}): two recorded sizes cannot tell their functions apart")
        va, vb = log_a.vals, log_b.vals
        for ev in log_a.events:
            if ev[0] == "esc" and va[ev[1]] != vb[ev[1]]:
                return None, (f"the step's Python used a size that differs between the recorded sizes in a way "
                              f"Crucible cannot follow ({ev[2]}: {va[ev[1]]} and {vb[ev[1]]})")
        fits = []
        for n, desc in enumerate(log_a.nodes):
            if va[n] == vb[n]:
                fits.append(None)   # a constant
                continue
            f = _fits(va[n], vb[n], pairs)
            if not f and desc[0] == "read":
                return None, (f"the step's Python read a size ({desc[1]} {desc[2]}: {va[n]} and {vb[n]}) that "
                              f"is no simple function of the argument sizes")
            fits.append(f)
        return SizeGuard(log_a.nodes, log_a.events, va, [s for s, _, _ in syms], pairs, fits, shapes_a), None

    @property
    def sibling_shapes(self):
        """The argument shapes of the first recorded call (the plan's sibling, Note [Bound sizes])."""
        return self._shapes

    def describe(self) -> list:
        """The guards as text over the symbols (S0, S1, ...: the argument dimensions that vary,
        named in order): each comparison Python made ("S0 > 10"), each computed value held to its
        fit ("S0 // 2 == S0/2"), each escaped value held to its recorded one ("int(64) == 64")."""
        names = {}   # one name per pair of recorded values (inputs and targets of one length: one S0)
        sym_names = [names.setdefault(pair, f"S{len(names)}") for pair in self._pairs]

        def fit_text(fits):
            add, x, i, j, den = fits[0]
            if add:
                return sym_names[i] + (f" + {x}" if x > 0 else f" - {-x}" if x < 0 else "")
            from fractions import Fraction
            c = Fraction(x, den)
            term = sym_names[i] + (f"*{sym_names[j]}" if j is not None else "")
            return term if c == 1 else f"{c}*{term}"
        text = []
        for n, desc in enumerate(self._nodes):
            f = self._fits[n]
            if desc[0] == "read":
                text.append(str(self._va[n]) if f is None else fit_text(f) if f else "?")
                continue

            def opd(o):
                return str(o[1]) if isinstance(o, tuple) else f"({text[o]})"
            sym = {"add": "+", "sub": "-", "mul": "*", "floordiv": "//", "mod": "%", "pow": "**"}
            if desc[0] in _UNARY:
                text.append(f"{desc[0]}{opd(desc[1])}")
            else:
                text.append(f"{opd(desc[1])} {sym[desc[0]]} {opd(desc[2])}")
        out = []
        cmp = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}
        for ev in self._events:
            if ev[0] == "cmp":
                _, name, x, y, res = ev
                xs = str(x[1]) if isinstance(x, tuple) else text[x]
                ys = str(y[1]) if isinstance(y, tuple) else text[y]
                out.append(f"{xs} {cmp[name]} {ys}" if res else f"not {xs} {cmp[name]} {ys}")
            else:
                out.append(f"{ev[2]}({text[ev[1]]}) == {self._va[ev[1]]}")
        for n, desc in enumerate(self._nodes):   # values of a division or a power: held to their fit
            if desc[0] in ("floordiv", "mod", "pow") and any(
                    isinstance(o, int) and self._fits[o] is not None for o in desc[1:] if o is not None):
                f = self._fits[n]
                out.append(f"{text[n]} == " + (str(self._va[n]) if f is None else fit_text(f) if f else "?"))
        return out

    def check(self, shapes):
        """None when a call with these argument sizes takes the recorded path, else why not (the
        guard compiled to one function: check_interpreted's answer, in a few microseconds)."""
        if self._compiled is None:
            try:
                self._compiled = self._compile()
            except (ValueError, TypeError, SyntaxError):   # a log the compiler does not know: walked
                self._compiled = self.check_interpreted
        return self._compiled(shapes)

    def _compile(self):
        """check_interpreted as straight-line Python source over this guard's log, compiled once:
        each node and event one or two statements, its message the interpreter's. Text from the
        log (labels) reaches the source only as constants in the function's globals."""
        va, fits = self._va, self._fits
        env = {"_fit_at": _fit_at, "_UNARY": _UNARY, "_BINARY": _BINARY, "_COMPARE": _COMPARE, "FITS": fits,
               "RANK": "the arguments have another number or rank"}
        lines = ["def check(shapes):", f"    if len(shapes) != {len(self._shapes)}: return RANK"]
        for j, y in enumerate(self._shapes):
            lines += [f"    s{j} = shapes[{j}]", f"    if len(s{j}) != {len(y)}: return RANK"]
        varies = set(self._syms)
        for j, y in enumerate(self._shapes):
            for d, v in enumerate(y):
                if (j, d) not in varies:
                    lines.append(f'    if s{j}[{d}] != {int(v)}: return f"step argument {j} dimension {d} is '
                                 f'{{s{j}[{d}]}}, and {int(v)} in both recorded sizes"')
        lines.append("    c = [" + "".join(f"s{j}[{d}], " for j, d in self._syms) + "]")

        fitted = {}   # one evaluation per distinct fit (a length read in many places)

        def fit_value(n):
            key = tuple(fits[n])
            if key not in fitted:
                fitted[key] = f"f{len(fitted)}"
                lines.append(f"    {fitted[key]} = _fit_at(FITS[{n}], c)")
            return fitted[key]

        def operand(o):
            if not isinstance(o, tuple):
                return f"v{int(o)}"
            if type(o[1]) not in (int, float, bool) or o[1] != o[1] or o[1] in (float("inf"), float("-inf")):
                raise ValueError(f"size guard: a constant {o[1]!r} with no literal")
            return repr(o[1])
        for n, desc in enumerate(self._nodes):
            f = fits[n]
            if desc[0] == "read":
                if f is None:
                    lines.append(f"    v{n} = {int(va[n])}")
                else:
                    env[f"M{n}"] = f"a size the step reads ({desc[1]} {desc[2]}) has no integer value at these sizes"
                    lines += [f"    v{n} = {fit_value(n)}", f"    if v{n} is None: return M{n}"]
                continue
            op = desc[0]
            if op not in _UNARY and op not in _BINARY:
                raise ValueError(f"size guard: unknown operation {op!r}")
            call = (f"_UNARY[{op!r}]({operand(desc[1])})" if op in _UNARY
                    else f"_BINARY[{op!r}]({operand(desc[1])}, {operand(desc[2])})")
            want = repr(int(va[n])) if f is None else (fit_value(n) if f else f"v{n}")
            lines += ["    try:", f"        v{n} = {call}",
                      "    except (ZeroDivisionError, ValueError, OverflowError):",
                      f'        return "the step\'s size arithmetic ({op}) fails at these sizes"',
                      f'    if not isinstance(v{n}, int): return "the step\'s size arithmetic ({op}) gives no integer '
                      f'at these sizes"',
                      f"    w{n} = {want}",
                      f'    if w{n} != v{n}: return (f"a size the step computes ({op}) is {{v{n}}} at these sizes, '
                      f'where the recorded sizes give " + (f"{{w{n}}}" if w{n} is not None else "no integer"))']
        for e, ev in enumerate(self._events):
            if ev[0] == "cmp":
                _, name, x, y, res = ev
                if name not in _COMPARE:
                    raise ValueError(f"size guard: unknown comparison {name!r}")
                xv, yv = operand(x), operand(y)
                lines.append(f'    if _COMPARE[{name!r}]({xv}, {yv}) != {bool(res)}: return (f"the step\'s Python '
                             f'compares a size ({{{xv}}} {name} {{{yv}}}) and takes the other branch at these sizes")')
            else:
                k = int(ev[1])
                env[f"L{e}"] = ev[2]
                lines.append(f'    if v{k} != {int(va[k])}: return (f"the step\'s Python uses a size ({{L{e}}}) that '
                             f'would be {{v{k}}} here, {int(va[k])} when recorded")')
        lines.append("    return None")
        exec(compile("\n".join(lines), "<crucible size guard>", "exec"), env)   # our own text, constants checked
        return env["check"]

    def check_interpreted(self, shapes):
        """None when a call with these argument sizes takes the recorded path, else why not:
        the guard's log walked node by node (check() is this, compiled)."""
        if len(shapes) != len(self._shapes) or any(len(x) != len(y) for x, y in zip(shapes, self._shapes)):
            return "the arguments have another number or rank"
        varies = set(self._syms)
        for j, (x, y) in enumerate(zip(shapes, self._shapes)):
            for d, (u, v) in enumerate(zip(x, y)):
                if u != v and (j, d) not in varies:
                    return f"step argument {j} dimension {d} is {u}, and {v} in both recorded sizes"
        c = [shapes[j][d] for j, d in self._syms]
        val = []
        va, fits = self._va, self._fits
        for n, desc in enumerate(self._nodes):
            f = fits[n]
            if desc[0] == "read":
                v = va[n] if f is None else _fit_at(f, c)
                if v is None:
                    return f"a size the step reads ({desc[1]} {desc[2]}) has no integer value at these sizes"
            else:
                x = desc[1][1] if isinstance(desc[1], tuple) else val[desc[1]]
                try:
                    if desc[0] in _UNARY:
                        v = _UNARY[desc[0]](x)
                    else:
                        y = desc[2][1] if isinstance(desc[2], tuple) else val[desc[2]]
                        v = _BINARY[desc[0]](x, y)
                except (ZeroDivisionError, ValueError, OverflowError):
                    return f"the step's size arithmetic ({desc[0]}) fails at these sizes"
                if not isinstance(v, int):
                    return f"the step's size arithmetic ({desc[0]}) gives no integer at these sizes"
                want = va[n] if f is None else (_fit_at(f, c) if f else v)
                if want != v:
                    return (f"a size the step computes ({desc[0]}) is {v} at these sizes, where the recorded "
                            f"sizes give " + (f"{want}" if want is not None else "no integer"))
            val.append(v)
        for ev in self._events:
            if ev[0] == "cmp":
                _, name, x, y, res = ev
                xv = x[1] if isinstance(x, tuple) else val[x]
                yv = y[1] if isinstance(y, tuple) else val[y]
                if _COMPARE[name](xv, yv) != res:
                    return (f"the step's Python compares a size ({xv} {name} {yv}) and takes the other "
                            f"branch at these sizes")
            elif val[ev[1]] != va[ev[1]]:
                return f"the step's Python uses a size ({ev[2]}) that would be {val[ev[1]]} here, {va[ev[1]]} when recorded"
        return None
