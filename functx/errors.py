"""The exceptions functx raises.

Every misuse raises a subclass of :class:`FunctxError` that is also the
matching built-in exception, so ``except ValueError`` keeps working:

* :class:`FunctxTypeError` (``TypeError``): a value of the wrong kind.
* :class:`FunctxValueError` (``ValueError``): a wrong size, shape, index or
  structure.
* :class:`FunctxRuntimeError` (``RuntimeError``): a condition found while
  running (escaped tracer, missing rule, data-dependent control flow).

Messages start with the call pattern (``grad(f)(*args)``) and end with what
to do about it.
"""

import linecache
import os
import sys

__all__ = [
    "FunctxError",
    "FunctxTypeError",
    "FunctxValueError",
    "FunctxRuntimeError",
    "EscapedTracerError",
    "MissingRuleError",
    "ConcretizationError",
    "IndexConcretizationError",
    "JaxOnFunctxValueError",
    "EquinoxBatchShapeError",
]


class FunctxError(Exception):
    """Base class of every error functx raises on misuse."""


class FunctxTypeError(FunctxError, TypeError):
    """A value of the wrong kind (non-callable, integer input to grad, ...)."""


class FunctxValueError(FunctxError, ValueError):
    """A wrong size, shape, index or structure (vmap sizes, argnums, ...)."""


class FunctxRuntimeError(FunctxError, RuntimeError):
    """A condition found while running a transformed function."""


class EscapedTracerError(FunctxRuntimeError):
    """A value that belongs to a finished transform was used afterwards."""


class MissingRuleError(FunctxRuntimeError):
    """A primitive has no rule for the transform that met it.

    A rule that finds out it cannot apply (a rule borrowed from JAX that JAX
    does not have) raises it with `transform=None` and a message holding
    `{transform}`; the interpreter running the rule names itself
    (`name_transform`)."""

    transform = "?"

    def __init__(self, message="", transform="?"):
        super().__init__(message)
        self.transform = transform

    def name_transform(self, transform):
        self.transform = transform
        self.args = (self.args[0].replace("{transform}", transform),)


class ConcretizationError(FunctxRuntimeError):
    """A batched value was turned into a Python bool/int/float under vmap."""


class IndexConcretizationError(ConcretizationError, TypeError):
    """A traced value with no concrete value was used as a Python integer
    index (`operator.index`). Also a `TypeError`, as Python's and JAX's are
    for a value that is no integer: JAX code that tries for a static
    integer and falls back (jax.numpy's power with an integer exponent,
    roll with a shift) takes its traced path on functx values too."""


class JaxOnFunctxValueError(FunctxTypeError):
    """A JAX function was handed a functx value directly."""


class EquinoxBatchShapeError(FunctxValueError, TypeError):
    """A shape error inside an Equinox layer under a functx transform, most
    likely a batch handed to a module that takes one example.

    A ``ValueError`` (a wrong shape), and also a ``TypeError``: the error it
    replaces is JAX's shape-rule ``TypeError``, which callers may catch."""


class UnboundAxisNameError(FunctxError, NameError):
    """A collective names an axis that no enclosing functx.vmap binds."""


class ChunkedCollectiveError(FunctxValueError):
    """A collective that needs the whole batch, under vmap(chunk_size=...)."""


_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


def user_frame():
    """Return ``(filename, lineno, source_line)`` of the innermost frame
    outside functx and JAX, or None when there is none."""
    frame = sys._getframe(1)
    while frame is not None:
        filename = os.path.abspath(frame.f_code.co_filename)
        internal = (
            filename.startswith(_PACKAGE_DIR)
            or f"{os.sep}jax{os.sep}" in filename
            or f"{os.sep}jaxlib{os.sep}" in filename
            or f"{os.sep}equinox{os.sep}" in filename
            or filename.startswith("<frozen")
        )
        if not internal:
            line = linecache.getline(filename, frame.f_lineno).strip()
            return filename, frame.f_lineno, line
        frame = frame.f_back
    return None


def describe_user_line():
    """A short ``file:line (`source`)`` string for error messages."""
    where = user_frame()
    if where is None:
        return "an unknown line"
    filename, lineno, line = where
    text = f"{filename}:{lineno}"
    if line:
        text += f" (`{line}`)"
    return text


# NOTE [Equinox's one-example convention]
# An Equinox layer (`eqx.nn.Linear`, `eqx.nn.MLP`, ...) takes one example: a
# batch is a `vmap` over it. Handed a batch `(B, in)` inside a functx
# transform (most often an ensemble, `vmap(functional_call)` over stacked
# weights with no inner `vmap` over examples), the first primitive of the
# layer fails JAX's shape rule with a message about contracting dimensions
# that names neither Equinox nor the fix. Every such failure passes through
# functx's bind hook (functx/interop.py), which asks `equinox_batch_error`
# for a better error: only a shape error, only with an `equinox/nn` layer's
# `__call__` on the stack, and only inside a functx transform. Everything
# else keeps its error as it was.

_EQX_NN_DIR = f"{os.sep}equinox{os.sep}nn{os.sep}"


def _equinox_layer_frames(frame):
    """The frames of `equinox.nn` modules' `__call__` on the stack from
    `frame` outwards, innermost first."""
    found = []
    while frame is not None:
        code = frame.f_code
        if code.co_name == "__call__" and _EQX_NN_DIR in code.co_filename and "self" in frame.f_locals:
            found.append(frame)
        frame = frame.f_back
    return found


def _first_argument(frame):
    """The value of the first argument after `self` of a method's frame."""
    code = frame.f_code
    if code.co_argcount < 2:
        return None
    return frame.f_locals.get(code.co_varnames[1])


def _expected_rank(layer):
    """The rank of one example for the Equinox layers whose rank is known,
    else None."""
    if hasattr(layer, "in_features"):  # Linear
        return 0 if layer.in_features == "scalar" else 1
    if hasattr(layer, "in_size"):  # MLP
        return 0 if layer.in_size == "scalar" else 1
    if hasattr(layer, "num_spatial_dims"):  # Conv, ConvTranspose, pooling
        return layer.num_spatial_dims + 1
    return None


def equinox_batch_error(exc):
    """An :class:`EquinoxBatchShapeError` to raise instead of JAX's shape
    error `exc`, when it was raised in an Equinox layer inside a functx
    transform (NOTE [Equinox's one-example convention]); else None."""
    if isinstance(exc, EquinoxBatchShapeError) or "shape" not in str(exc):
        return None  # already explained by an inner bind, or not a shape error
    from .core import interpreter_stack  # functx.core imports this module

    if not interpreter_stack():
        return None
    frames = _equinox_layer_frames(sys._getframe(1))
    if not frames:
        return None
    inner, outer = frames[0], frames[-1]
    layer, model = inner.f_locals["self"], outer.f_locals["self"]
    x = _first_argument(outer)
    shape = tuple(getattr(x, "shape", ())) if x is not None else None
    expected = _expected_rank(model)
    if expected is not None and shape is not None and len(shape) <= expected:
        return None  # one example of the wrong size: not a batch problem
    where = f"eqx.nn.{type(layer).__name__}"
    if outer is not inner:
        where += f" inside eqx.nn.{type(model).__name__}"
    got = f" got an input of shape {shape}" if shape is not None else ""
    if expected is not None:
        got += f", but one example of it has {expected} dimension{'s' if expected != 1 else ''}"
    return EquinoxBatchShapeError(
        f"{where} (called at {describe_user_line()}){got}: {exc} "
        "Equinox modules take one example, without a batch axis. To run a "
        "module on a batch, vmap over the examples: functx.vmap(model)(xs), or "
        "functx.vmap(lambda x: functx.functional_call(model, params, (x,)))(xs). "
        "For an ensemble, vmap(functional_call) over the stacked weights needs "
        "an inner vmap over the examples: functx.vmap(lambda p: functx.vmap("
        "lambda x: functx.functional_call(model, p, (x,)))(xs))(stacked_params)."
    )
