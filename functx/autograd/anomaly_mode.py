"""Anomaly detection (torch.autograd.detect_anomaly / set_detect_anomaly).

NOTE [anomaly mode]
While anomaly mode is on, two hooks of reverse mode are active (NOTE [tape
hooks] in interpreters/reverse.py):

* when a forward operation records the linear equations of its derivative
  on the tape, each equation is tagged with the forward primitive, the user
  source line that applied it and the transforms active there. This costs a
  stack walk per primitive, which is why it only happens in anomaly mode;
  with the mode off nothing is recorded and nothing is checked.
* after each transpose rule of the backward pass, the cotangents it
  produced are checked for NaN. The first NaN raises `AnomalyError` (a
  functx error and a RuntimeError) naming the forward primitive, its user
  line, the shapes, the transforms, and, when the backward runs under
  `vmap`, the batch indices of the samples that hold the NaN.

The compiled backward pass (one XLA program per tape structure) is not used
in anomaly mode, so each step can be checked.

Where the checks run: on concrete values (eager functx code, also under
`vmap`, whose batched values hold concrete arrays), each check is an
immediate test. Under a trace (`functx.jit`, `jax.jit`) the cotangents are
traced values; there the check is staged with `jax.debug.callback` and runs
when the compiled program runs, raising from inside the program: JAX
re-raises it as its own runtime error (`jax.errors.JaxRuntimeError` /
XlaRuntimeError) whose message carries the same text. Tape entries recorded
while tracing still name the user's line.
"""

import contextlib
import functools

import jax
import numpy as np

from ..core import Tracer, Zero, interpreter_stack, is_inexact_dtype
from ..core import _ArrayImpl as ArrayImpl
from ..errors import FunctxRuntimeError, describe_user_line
from ..interpreters import reverse
from ..interpreters.staging import Eqn

__all__ = ["detect_anomaly", "set_detect_anomaly", "is_anomaly_enabled",
           "is_anomaly_check_nan_enabled", "AnomalyError"]


class AnomalyError(FunctxRuntimeError):
    """A backward computation produced NaN while anomaly mode was on."""


class _State:
    enabled = False
    check_nan = True


_state = _State()


class _NotedEqn(Eqn):
    """A tape equation with where it came from (anomaly mode only)."""

    __slots__ = ("forward", "where", "stack")


def _note_recorded(tape, start, prim):
    eqns = tape.eqns
    where = None
    for i in range(start, len(eqns)):
        eqn = eqns[i]
        if type(eqn) is _NotedEqn:
            continue  # tagged by an inner forward primitive already
        if where is None:
            where = describe_user_line()
            stack = tuple(interp.transform for interp in interpreter_stack())
        noted = _NotedEqn(eqn.prim, eqn.inputs, eqn.outputs, eqn.params)
        noted.forward = prim.name
        noted.where = where
        noted.stack = stack
        eqns[i] = noted


def _describe(eqn, k, ct, c, batch_indices=None):
    def short(x):
        try:
            return x.aval.str_short()
        except AttributeError:
            try:
                return f"{np.dtype(x.dtype).name}{list(x.shape)}"
            except Exception:
                return type(x).__name__

    cts = ct if isinstance(ct, list) else [ct]
    if type(eqn) is _NotedEqn:
        head = (f"the backward of `{eqn.forward}` (its derivative step `{eqn.prim.name}`) "
                f"returned NaN values in its {k}th output")
        origin = (f" The forward `{eqn.forward}` was applied at {eqn.where}, under "
                  f"transforms [{', '.join(eqn.stack)}].")
    else:
        head = (f"the backward step `{eqn.prim.name}` returned NaN values in its "
                f"{k}th output")
        origin = (" Its forward operation was recorded before anomaly mode was "
                  "enabled, so its source line is unknown.")
    shapes = (f" Output cotangent shape(s): "
              f"{', '.join(short(x) for x in cts if type(x) is not Zero)}; "
              f"NaN cotangent: {short(c)}.")
    batch = ""
    if batch_indices is not None:
        batch = f" Under vmap, batch indices with NaN: {batch_indices}."
    now = tuple(interp.transform for interp in interpreter_stack())
    return (f"detect_anomaly: {head}.{origin}{shapes}{batch} Backward ran under "
            f"transforms [{', '.join(now) or 'none'}]. Guard the forward operation "
            "(e.g. functx.numpy.where on its input, or a custom_jvp with a safe "
            "derivative) so its derivative is finite.")


def _is_float(x):
    try:
        return is_inexact_dtype(x.dtype)
    except Exception:
        return False


def _nan_mask(x):
    """(mask, batch axes): a concrete boolean array marking NaNs of the
    value `x` stands for, or None when `x` is not concrete; the batch axes
    of vmap collected on the way down, outermost first."""
    axes = []
    while isinstance(x, Tracer):
        val = getattr(x, "val", None)
        if val is not None and hasattr(x, "bdim"):  # batching tracer
            if x.bdim is not None:
                axes.append(x.bdim)
            x = val
            continue
        primal = getattr(x, "primal", None)
        if primal is None:
            return None, axes
        x = primal
    if type(x) is ArrayImpl or (isinstance(x, jax.Array)
                                and not isinstance(x, (jax.core.Tracer, Tracer))):
        return np.isnan(np.asarray(x)), axes
    return None, axes


def _batch_indices(mask, axes):
    """Batch indices (tuples over nested vmaps, outermost first) of NaNs."""
    if not axes:
        return None
    # `axes` was collected from the innermost vmap down; the outermost
    # one's bdim indexes the concrete array, each inner one's bdim the
    # per-sample value of the one around it. Bring them to the front in
    # order: (outer, ..., inner, rest).
    for i, d in enumerate(reversed(axes)):
        mask = np.moveaxis(mask, i + d, i)
    lead = mask.reshape(mask.shape[:len(axes)] + (-1,)).any(-1)
    idx = [tuple(int(i) for i in t) if len(t) > 1 else int(t[0]) for t in np.argwhere(lead)]
    return idx[:10]


def _check(eqn, ct, in_cts):
    if not _state.check_nan:
        return
    for k, c in enumerate(in_cts):
        if c is None or type(c) is Zero or not _is_float(c):
            continue
        mask, axes = _nan_mask(c)
        if mask is not None:
            if mask.any():
                raise AnomalyError(_describe(eqn, k, ct, c, _batch_indices(mask, axes)))
        elif isinstance(c, jax.core.Tracer):
            message = _describe(eqn, k, ct, c)
            jax.debug.callback(functools.partial(_raise_if_nan, message),
                               jax.numpy.isnan(c).any())


def _raise_if_nan(message, has_nan):
    if bool(has_nan):
        raise AnomalyError(message)


def _set(enabled, check_nan):
    _state.enabled = bool(enabled)
    _state.check_nan = bool(check_nan)
    if _state.enabled:
        if _note_recorded not in reverse.tape_observers:
            reverse.tape_observers.append(_note_recorded)
        reverse.backward_check = _check
    else:
        if _note_recorded in reverse.tape_observers:
            reverse.tape_observers.remove(_note_recorded)
        if reverse.backward_check is _check:
            reverse.backward_check = None


def is_anomaly_enabled():
    """Whether anomaly mode is on."""
    return _state.enabled


def is_anomaly_check_nan_enabled():
    """Whether anomaly mode checks backward results for NaN."""
    return _state.check_nan


class detect_anomaly(contextlib.ContextDecorator):
    """Context manager and decorator turning anomaly mode on (NOTE [anomaly
    mode]): a backward step that produces NaN raises `AnomalyError` naming
    the forward primitive and the user line that applied it.

    Args:
      check_nan (bool): check backward results for NaN (torch's argument).

    Example:
      >>> with functx.autograd.detect_anomaly():
      ...     functx.grad(lambda x: (functx.numpy.sqrt(x) * 0.0).sum())(jnp.zeros(3))
      AnomalyError: detect_anomaly: the backward of `sqrt` ... returned NaN ...
    """

    def __init__(self, check_nan=True):
        self.check_nan = check_nan
        self._prev = None

    def __enter__(self):
        self._prev = (_state.enabled, _state.check_nan)
        _set(True, self.check_nan)
        return self

    def __exit__(self, *exc):
        _set(*self._prev)
        return False


class set_detect_anomaly(contextlib.ContextDecorator):
    """Turn anomaly mode on or off: as a function call (lasting until
    changed) or as a context manager / decorator (restoring the previous
    mode on exit), like torch.autograd.set_detect_anomaly."""

    def __init__(self, mode, check_nan=True):
        self._prev = (_state.enabled, _state.check_nan)
        _set(mode, check_nan)
        self.mode = bool(mode)
        self.check_nan = check_nan

    def __enter__(self):
        _set(self.mode, self.check_nan)
        return self

    def __exit__(self, *exc):
        _set(*self._prev)
        return False
