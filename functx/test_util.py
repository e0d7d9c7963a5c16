"""Numerical checks of derivatives, for functx's tests and its users.

`check_grads(f, args, order=2, modes=("fwd", "rev"))` checks:

* forward mode: `jvp(f, args, v)` against central finite differences of `f`
  along a random direction `v`;
* reverse mode: the inner-product identity <vjp(c), v> = <c, jvp(v)> (with
  the jvp taken by finite differences when forward mode is not checked);
* higher orders: the same checks on the jvp / vjp functions themselves, up
  to `order`.

Run it in float64 (`jax.config.update("jax_enable_x64", True)`) for tight
tolerances.
"""

import numpy as np
from jax import tree_util

from .core import aval_of, is_inexact_dtype, is_real_float_dtype
from .transforms.grad import vjp
from .transforms.jvp import jvp

__all__ = ["check_grads", "check_jvp", "check_vjp"]

_DEFAULT_EPS = {np.dtype("float64"): 1e-4, np.dtype("float32"): 3e-2, np.dtype("float16"): 1e-1}
_DEFAULT_TOL = {np.dtype("float64"): 1e-5, np.dtype("float32"): 3e-2, np.dtype("float16"): 1e-1}


def _leaves(x):
    return [np.asarray(v) for v in tree_util.tree_leaves(x)]


def _random_like(rng, tree):
    def draw(x):
        a = aval_of(x)
        if not is_inexact_dtype(a.dtype):
            raise TypeError(f"check_grads: inputs must be floating point, got {a.dtype}")
        return np.asarray(rng.standard_normal(a.shape), a.dtype)

    return tree_util.tree_map(draw, tree)


def _axpy(alpha, x, y):
    return tree_util.tree_map(lambda a, b: np.asarray(a + alpha * np.asarray(b), np.asarray(a).dtype), y, x)


def _inner(x, y):
    return sum(float(np.vdot(a.astype(np.float64), b.astype(np.float64)))
               for a, b in zip(_leaves(x), _leaves(y), strict=True))


def _dtype_of(args):
    """Whose defaults apply: float64's if any input is float64, float16's if
    any is a 16- or 8-bit float (bfloat16 and float8 included), else float32's."""
    dtypes = [aval_of(x).dtype for x in tree_util.tree_leaves(args)]
    if any(d == np.float64 for d in dtypes):
        return np.dtype("float64")
    if any(is_real_float_dtype(d) and np.dtype(d).itemsize <= 2 for d in dtypes):
        return np.dtype("float16")
    return np.dtype("float32")


def _tolerances(args, eps, atol, rtol):
    """(eps, atol, rtol), defaulting by the inputs' precision."""
    dtype = _dtype_of(args)
    return (
        eps or _DEFAULT_EPS[dtype],
        _DEFAULT_TOL[dtype] if atol is None else atol,
        _DEFAULT_TOL[dtype] if rtol is None else rtol,
    )


def _assert_close(name, got, want, atol, rtol):
    for g, w in zip(_leaves(got), _leaves(want), strict=True):
        g64, w64 = g.astype(np.float64), w.astype(np.float64)
        if not np.allclose(g64, w64, atol=atol, rtol=rtol, equal_nan=True):
            err = np.max(np.abs(g64 - w64))
            raise AssertionError(
                f"check_grads: {name} disagrees (max abs error {err:.3g}, atol={atol}, "
                f"rtol={rtol}).\n got: {g64}\nwant: {w64}"
            )


def _numerical_jvp(f, args, tangents, eps):
    plus = f(*_axpy(eps, tangents, args))
    minus = f(*_axpy(-eps, tangents, args))
    return tree_util.tree_map(
        lambda a, b: (np.asarray(a, np.float64) - np.asarray(b, np.float64)) / (2 * eps), plus, minus
    )


def check_jvp(f, args, *, eps=None, atol=None, rtol=None, rng=None):
    """jvp of `f` at `args` against central finite differences."""
    args = tuple(args)
    eps, atol, rtol = _tolerances(args, eps, atol, rtol)
    rng = rng or np.random.default_rng(0)
    tangents = _random_like(rng, args)
    _, got = jvp(f, args, tangents)
    want = _numerical_jvp(f, args, tangents, eps)
    _assert_close("jvp vs finite differences", got, want, atol, rtol)
    return tangents


def check_vjp(f, args, *, eps=None, atol=None, rtol=None, rng=None, use_jvp=True):
    """vjp of `f` at `args` via <vjp(c), v> == <c, J v>, where J v is the
    jvp (`use_jvp`) or finite differences."""
    args = tuple(args)
    eps, atol, rtol = _tolerances(args, eps, atol, rtol)
    rng = rng or np.random.default_rng(1)
    out, vjp_fn = vjp(f, *args)
    cts = _random_like(rng, out)
    tangents = _random_like(rng, args)
    pulled = vjp_fn(cts)
    if use_jvp:
        _, pushed = jvp(f, args, tangents)
    else:
        pushed = _numerical_jvp(f, args, tangents, eps)
    lhs = _inner(pulled, tangents)
    rhs = _inner(cts, pushed)
    scale = max(1.0, abs(lhs), abs(rhs))
    if abs(lhs - rhs) > atol + rtol * scale:
        raise AssertionError(
            f"check_grads: vjp fails the inner-product test: <vjp(c), v> = {lhs!r} but "
            f"<c, J v> = {rhs!r} (atol={atol}, rtol={rtol})."
        )
    return cts


def check_grads(f, args, order=2, modes=("fwd", "rev"), atol=None, rtol=None, eps=None):
    """Check derivatives of `f` at `args` up to `order` in the given modes.

    Args:
      f (Callable): a function of arrays, written with functx.numpy (or lifted).
      args (tuple): a tuple of floating-point arrays (pytrees allowed).
      order (int): highest derivative order to check.
      modes (Sequence[str]): any of "fwd" (jvp) and "rev" (vjp).
      atol (float | None): the absolute tolerance (default by dtype; use
        float64 for tight checks).
      rtol (float | None): the relative tolerance (default by dtype).
      eps (float | None): the finite-difference step (default by dtype).

    Raises:
      AssertionError: describing the first disagreement.

    Example:
      >>> functx.test_util.check_grads(functx.numpy.tanh, (x,), order=3)
    """
    args = tuple(args)
    modes = tuple(modes)
    for m in modes:
        if m not in ("fwd", "rev"):
            raise ValueError(f"check_grads: modes must be 'fwd' and/or 'rev', got {m!r}")
    rng = np.random.default_rng(0)
    kw = dict(eps=eps, atol=atol, rtol=rtol)

    def check(fn, fn_args, k):
        if "fwd" in modes:
            tangents = check_jvp(fn, fn_args, rng=rng, **kw)
            if k > 1:
                n = len(fn_args)

                def fn_jvp(*a, n=n, fn=fn):
                    return jvp(fn, tuple(a[:n]), tuple(a[n:]))[1]

                check(fn_jvp, fn_args + tuple(tangents), k - 1)
        if "rev" in modes:
            cts = check_vjp(fn, fn_args, rng=rng, use_jvp="fwd" in modes, **kw)
            if k > 1:
                n = len(fn_args)

                def fn_vjp(*a, n=n, fn=fn):
                    return vjp(fn, *a[:n])[1](a[n])

                check(fn_vjp, fn_args + (cts,), k - 1)

    check(f, args, order)
