"""functx.autograd.forward_ad: torch's forward-mode AD API (dual levels,
make_dual, unpack_dual) on functx's jvp interpreter.

NOTE [dual levels]
A dual level is a jvp interpreter left open on the interpreter stack
between `enter_dual_level()` and `exit_dual_level()` (instead of for the
duration of one `functx.jvp` call). `make_dual(x, t)` boxes `x` with the
tangent `t` as a tracer of that interpreter; every functx operation on it
(functx.numpy, operators, lifted JAX code) runs the primitives' jvp rules,
exactly as inside functx.jvp; `unpack_dual` reads the primal and tangent
back. Levels are numbered 0, 1, ... in the order they were entered, as in
torch, and the functions default to the innermost open one.

Unlike torch, levels nest: a value made dual at an outer level and again
at an inner level carries two independent perturbations, so the tangent
read at the inner level is itself a dual of the outer level and reading its
tangent gives a second derivative (as `jax.jvp` of `jax.jvp`). The inner
level must have been entered after the outer one, and a tangent must be a
value of an older level than the dual it makes.

When a level exits, its interpreter dies (NOTE [escaped tracers] in
core.py): `unpack_dual` of one of its values returns `(primal, None)` as in
torch, giving the plain value back; using such a value in any other
computation raises EscapedTracerError.

A dual level may be entered inside a functx transform (e.g. in a function
given to functx.vmap, as torch.autograd.functional.jacobian does) or around
one. What cannot be done is making or unpacking a dual of level k from a
value of a transform opened *after* level k (e.g. inside functx.vmap,
inside the dual level): that raises an error saying to enter the dual
level inside that transform instead.
"""

import contextlib
import threading
from typing import Any, NamedTuple

import jax
import numpy as np

from ..core import (
    Tracer, _escaped, aval_of, host_to_jax, interpreter_stack, is_inexact_dtype, new_interpreter,
)
from ..errors import FunctxRuntimeError, FunctxTypeError, FunctxValueError
from ..interpreters.jvp import JVPInterpreter, JVPTracer
from ._util import AutogradValueError

__all__ = [
    "UnpackedDualTensor",
    "enter_dual_level",
    "exit_dual_level",
    "make_dual",
    "unpack_dual",
    "dual_level",
]


class _DualInterpreter(JVPInterpreter):
    """The jvp interpreter of one dual level."""

    def __init__(self, index):
        super().__init__(f"forward_ad.dual_level (level {index})")
        self.index = index


class _Levels(threading.local):
    def __init__(self):
        self.open = []  # [(interpreter, context manager)], innermost last


_levels = _Levels()


def enter_dual_level():
    """Enter a new dual level and make it the current one.

    Returns:
      int: The new level's number (0 for the first open level).

    Example:
      >>> level = forward_ad.enter_dual_level()
      >>> y, t = forward_ad.unpack_dual(fnp.sin(forward_ad.make_dual(x, v)))
      >>> forward_ad.exit_dual_level()
    """
    interp = _DualInterpreter(len(_levels.open))
    cm = new_interpreter(interp)
    cm.__enter__()
    _levels.open.append((interp, cm))
    return interp.index


def exit_dual_level(*, level=None):
    """Exit the current (innermost) dual level; its tangents are dropped.

    Args:
      level (int | None): the level to exit (default: the current one). Only the
        innermost open level can be exited, as in torch.

    Returns:
      None: Duals of the exited level unpack to `(primal, None)` from now
      on.

    Example:
      >>> level = forward_ad.enter_dual_level()
      >>> out = fnp.exp(forward_ad.make_dual(x, v))
      >>> forward_ad.exit_dual_level(level=level)
      >>> forward_ad.unpack_dual(out).tangent is None
      True
    """
    opened = _levels.open
    if not opened:
        raise FunctxRuntimeError(
            "forward_ad.exit_dual_level(): no dual level is open. Enter one with "
            "forward_ad.dual_level() or enter_dual_level() first."
        )
    if level is None:
        level = len(opened) - 1
    if level != len(opened) - 1:
        raise FunctxRuntimeError(
            f"forward_ad.exit_dual_level(level={level}): only the last level that was "
            f"entered (level {len(opened) - 1}) can be exited. Exit the levels in the "
            "reverse order of entering them."
        )
    interp, cm = opened.pop()
    stack = interpreter_stack()
    on_top = bool(stack) and stack[-1] is interp
    if interp in stack:
        cm.__exit__(None, None, None)
    else:
        interp.alive = False
    if not on_top:
        raise FunctxRuntimeError(
            f"forward_ad.exit_dual_level(): dual level {level} was exited while a "
            "transform entered after it was still running (or after that transform had "
            "already returned). Enter and exit a dual level within one transform: use "
            "`with forward_ad.dual_level():` around the code that uses it."
        )


class dual_level(contextlib.ContextDecorator):
    """Context manager (or decorator) for a dual level: entered on entry,
    exited on exit; `with dual_level() as level:` gives the level number.

    Example:
      >>> with forward_ad.dual_level():
      ...     out = f(forward_ad.make_dual(x, v))
      ...     value, jvp = forward_ad.unpack_dual(out)
    """

    def __enter__(self):
        return enter_dual_level()

    def __exit__(self, exc_type, exc_value, traceback):
        exit_dual_level()
        return False


def _level_interp(level, fn):
    opened = _levels.open
    if level is None:
        if not opened:
            return None
        return opened[-1][0]
    if isinstance(level, bool) or not isinstance(level, (int, np.integer)):
        raise FunctxTypeError(f"forward_ad.{fn}: level must be an int, got {level!r}.")
    if not 0 <= level < len(opened):
        raise FunctxValueError(
            f"forward_ad.{fn}(level={level}): there is no open dual level {level} "
            f"({len(opened)} open). Use the number returned by enter_dual_level()."
        )
    return opened[level][0]


def _strip_dead(x):
    """The value under the duals of exited levels."""
    while type(x) is JVPTracer and isinstance(x._interp, _DualInterpreter) and not x._interp.alive:
        x = x.primal
    return x


def _as_value(x, what):
    if isinstance(x, (Tracer, jax.Array)):
        return x
    if isinstance(x, (np.ndarray, np.generic, float, int, complex)) and not isinstance(x, bool):
        return host_to_jax(x)
    raise FunctxTypeError(
        f"forward_ad.make_dual: the {what} is a {type(x).__name__}, not an array. Pass "
        "JAX or NumPy arrays."
    )


def _check_order(x, interp, what):
    """A value put into a dual of `interp` must belong to older levels."""
    if not isinstance(x, Tracer):
        return
    owner = x._interp
    if not owner.alive:
        raise _escaped(x, None)
    if owner is interp:
        raise FunctxRuntimeError(
            f"forward_ad.make_dual: the {what} already is a dual at level {interp.index}; "
            "making a dual of a value that already has a tangent at the same level is not "
            "supported (as in torch). Use unpack_dual(x).primal first."
        )
    if owner.level > interp.level:
        raise FunctxRuntimeError(
            f"forward_ad.make_dual: the {what} is a value of {owner.transform}, which "
            f"started after dual level {interp.index} was entered, so it cannot be put "
            f"into a dual of that level. Enter the dual level inside {owner.transform} "
            "instead (or use functx.jvp there)."
        )


def make_dual(tensor, tangent, *, level=None):
    """Pair `tensor` with the tangent `tangent` at a dual level: functx
    operations on the result propagate the tangent (forward-mode AD).

    Args:
      tensor (jax.Array): a floating-point array (the primal).
      tangent (jax.Array): an array of the same shape (cast to the primal's
        dtype).
      level (int | None): the dual level (default: the innermost open one).

    Returns:
      jax.Array: The dual value. Read it back with `unpack_dual`.

    Example:
      >>> with forward_ad.dual_level():
      ...     y = fnp.sin(forward_ad.make_dual(x, v))
      ...     forward_ad.unpack_dual(y).tangent      # cos(x) * v
    """
    interp = _level_interp(level, "make_dual")
    if interp is None:
        raise FunctxRuntimeError(
            "forward_ad.make_dual: no dual level is open. Enter one with "
            "`with forward_ad.dual_level():` (or enter_dual_level()) first."
        )
    tensor = _as_value(_strip_dead(tensor), "primal")
    tangent = _as_value(_strip_dead(tangent), "tangent")
    p, t = aval_of(tensor), aval_of(tangent)
    for what, a in (("primal", p), ("tangent", t)):
        if not is_inexact_dtype(a.dtype):
            raise FunctxValueError(
                f"forward_ad.make_dual: expected the {what} to be floating point or "
                f"complex, but got {a.str_short()}. Convert it with .astype(float)."
            )
    if p.shape != t.shape:
        raise AutogradValueError(
            f"forward_ad.make_dual: the tangent has shape {t.shape} but the primal has "
            f"shape {p.shape}; a tangent must have its primal's shape."
        )
    _check_order(tensor, interp, "primal")
    _check_order(tangent, interp, "tangent")
    if t.dtype != p.dtype:
        tangent = tangent.astype(p.dtype)
    return JVPTracer(interp, tensor, tangent)


class UnpackedDualTensor(NamedTuple):
    """What `unpack_dual` returns: the primal, and the tangent at the level
    asked for (None when the value has none there)."""

    primal: Any
    tangent: Any


def unpack_dual(tensor, *, level=None):
    """Split a dual value into its primal and its tangent at a dual level.

    Args:
      tensor (Any): any value.
      level (int | None): the dual level (default: the innermost open one).

    Returns:
      UnpackedDualTensor: `UnpackedDualTensor(primal, tangent)`; `tangent` is
      None when `tensor` has no tangent at that level (a plain array, a value
      that does not depend on any dual of the level, or any value once its level
      has exited).

    Example:
      >>> with forward_ad.dual_level():
      ...     out = f(forward_ad.make_dual(x, v))
      ...     primal, jvp = forward_ad.unpack_dual(out)
    """
    tensor = _strip_dead(tensor)
    interp = _level_interp(level, "unpack_dual")
    if interp is None:
        return UnpackedDualTensor(tensor, None)
    if type(tensor) is JVPTracer and tensor._interp is interp:
        return UnpackedDualTensor(tensor.primal, tensor.tangent)
    if isinstance(tensor, Tracer) and tensor._interp.alive and tensor._interp.level > interp.level:
        owner = tensor._interp
        raise FunctxRuntimeError(
            f"forward_ad.unpack_dual: the value belongs to {owner.transform}, which "
            f"started after dual level {interp.index} was entered, so its tangent at that "
            f"level cannot be read here. Enter the dual level inside {owner.transform} "
            "(or return the value from it first)."
        )
    return UnpackedDualTensor(tensor, None)

