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
    "JaxOnFunctxValueError",
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


class JaxOnFunctxValueError(FunctxTypeError):
    """A JAX function was handed a functx value directly."""


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
