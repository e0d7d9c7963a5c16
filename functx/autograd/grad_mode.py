"""Grad modes: `no_grad`, `enable_grad`, `set_grad_enabled`,
`inference_mode`, `is_grad_enabled`, with torch.func's semantics.

NOTE [grad modes]
torch.func documents two cases, and functx gets both from levels
(NOTE [levels] in core.py), not from a global on/off switch:

* a `no_grad` *inside* the function being transformed blocks
  differentiation through the operations run inside it, for every
  differentiation transform (grad, vjp, jvp, jacrev, jacfwd, linearize,
  hessian, ...) that was already active when it was entered;
* a transform *started inside* a `no_grad` differentiates as usual
  (`with no_grad(): grad(f)(x)` is the gradient).

Entering `no_grad` records the depth of the interpreter stack in the
thread-local `core._state.no_grad_level`. The jvp and reverse interpreters
(interpreters/jvp.py, reverse.py) compare their own level with it on every
primitive: at a level <= the recorded one they apply the primitive to the
primals only, so its outputs have symbolic Zero tangents. Transforms started
later sit at higher levels and are unaffected. A staging interpreter that
was active (user code under functx.jit) puts a stop_gradient after each
such operation, so differentiating the staged graph later gives the same
answer. `enable_grad` (and `set_grad_enabled(True)`) sets the level back to
-1 (nothing blocked) until it exits. vmap ignores grad modes.
`is_grad_enabled()` is True unless a no_grad is active for the innermost
level: inside `with no_grad(): grad(f)(x)`, f sees True, as in torch.func.
`inference_mode(True)` is `no_grad` (functx has no tensor versions to
protect); `inference_mode(False)` changes nothing.
"""

import functools
import inspect

from .. import core as _core

__all__ = ["no_grad", "enable_grad", "set_grad_enabled", "inference_mode", "is_grad_enabled"]


def is_grad_enabled():
    """Whether operations run now are differentiated by the innermost
    active transform (torch.is_grad_enabled)."""
    return _core._state.no_grad_level < len(_core._state.stack)


class _GradMode:
    """Base of the grad-mode contexts: usable as a context manager or as a
    decorator (a fresh context per call, so the decorated function is
    reentrant and works from several threads)."""

    def _target(self):
        """The no_grad_level while the context is active (None: unchanged)."""
        raise NotImplementedError

    def __enter__(self):
        state = _core._state
        if not hasattr(self, "_prev"):
            self._prev = []
        self._prev.append(state.no_grad_level)
        target = self._target()
        if target is not None:
            state.no_grad_level = target
        return None

    def __exit__(self, *exc):
        _core._state.no_grad_level = self._prev.pop()
        return False

    def clone(self):
        return type(self)()

    def __call__(self, fn):
        if inspect.isclass(fn) or not callable(fn):
            from ..errors import FunctxTypeError

            raise FunctxTypeError(
                f"{type(self).__name__} as a decorator expects a function, got "
                f"{type(fn).__name__}."
            )
        if inspect.isgeneratorfunction(fn):
            @functools.wraps(fn)
            def gen_wrapper(*args, **kwargs):
                with self.clone():
                    yield from fn(*args, **kwargs)

            return gen_wrapper

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            with self.clone():
                return fn(*args, **kwargs)

        return wrapper


def _blocking_level():
    return len(_core._state.stack)


class no_grad(_GradMode):
    """Disable differentiation (by the transforms active now) of the
    operations run inside (NOTE [grad modes]). Context manager or
    decorator, as torch.no_grad."""

    def __init__(self, orig_func=None):
        # torch allows `@no_grad` without parentheses in some versions.
        self._orig = orig_func

    def __new__(cls, orig_func=None):
        self = super().__new__(cls)
        if orig_func is not None and callable(orig_func):
            return self(orig_func)
        return self

    def _target(self):
        return _blocking_level()


class enable_grad(_GradMode):
    """Re-enable differentiation inside a no_grad (torch.enable_grad)."""

    def __new__(cls, orig_func=None):
        self = super().__new__(cls)
        if orig_func is not None and callable(orig_func):
            return self(orig_func)
        return self

    def __init__(self, orig_func=None):
        pass

    def _target(self):
        return -1


class set_grad_enabled(_GradMode):
    """`set_grad_enabled(False)` is no_grad, `set_grad_enabled(True)` is
    enable_grad. As in torch, calling it as a function (not in a `with`)
    sets the mode right away; prefer the context-manager form."""

    def __init__(self, mode):
        self.mode = bool(mode)
        state = _core._state
        self._prev = [state.no_grad_level]
        state.no_grad_level = self._target()

    def _target(self):
        return -1 if self.mode else _blocking_level()

    def __enter__(self):
        # The mode was already set by __init__; remember what to restore.
        self._entered = self._prev.pop()
        self._prev.append(self._entered)
        return None

    def __exit__(self, *exc):
        _core._state.no_grad_level = self._prev.pop()
        return False

    def clone(self):
        return _PlainSet(self.mode)

    def __call__(self, fn):
        # Used as a decorator: undo the mode set by __init__ (as torch does);
        # each call of the function then sets it for its duration.
        _core._state.no_grad_level = self._prev[-1]
        return _PlainSet(self.mode)(fn)


class _PlainSet(_GradMode):
    def __init__(self, mode):
        self.mode = mode

    def _target(self):
        return -1 if self.mode else _blocking_level()

    def clone(self):
        return _PlainSet(self.mode)


class inference_mode(_GradMode):
    """torch.inference_mode: `inference_mode(True)` (the default) acts as
    no_grad; `inference_mode(False)` leaves the mode unchanged."""

    def __new__(cls, mode=True):
        self = super().__new__(cls)
        if callable(mode) and not isinstance(mode, bool):
            self.mode = True
            return self(mode)
        return self

    def __init__(self, mode=True):
        if callable(mode) and not isinstance(mode, bool):
            mode = True
        self.mode = bool(mode)

    def _target(self):
        return _blocking_level() if self.mode else None

    def clone(self):
        return inference_mode(self.mode)

