"""Lifted JAX custom_jvp / custom_vjp rules that close over tracers of a
finished JAX trace (functx/primitives/custom.py, `_LiftedJVPRule`,
`_LiftedVJPRule`).

`jax.scipy.special.expn` is a custom_jvp whose nondiff order `n` is traced
inside its jitted jvp rule, which calls expn again: the jvp rule of that
inner expn, traced lazily by JAX, closes over the tracer `n` of the finished
jit trace. functx feeds it the equation's own input instead.

Oracles: JAX differentiates expn once but not twice (JAX 0.10: its own
rule hits the same dead tracer), so first derivatives are checked against
JAX and second derivatives against the closed form its rule gives,
d^2/dx^2 E_2(x) = E_0(x) = exp(-x) / x. A small function of the same
structure (`_power`) is checked to third order, eagerly and under jax.jit.

A custom_vjp's fwd and bwd close over such tracers too (a traced value
the function closes over, or one a function passed as a nondiff argument
closes over); bwd gets no input of the function, so fwd passes it the
ones it reads along with the residuals. Checked against JAX's own
derivatives of the same functions (functx's forward mode of a custom_vjp,
which JAX refuses, against the Jacobian JAX gives by reverse mode).
"""

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.scipy.special import expn

import functx as fx
from functx.errors import MissingRuleError

X = jnp.linspace(0.5, 2.0, 3)
V = jnp.array([0.3, -1.2, 0.7])


def _close(got, want, tol=1e-10):
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=tol, atol=tol)


@pytest.mark.slow
def test_expn_second_order():
    """The report's repro (vjp of grad of a lifted expn under jax.jit) and
    jvp of grad, against E_0; and the order as a traced argument of the
    lifted function, to first order against JAX. One jax.jit."""
    n = jnp.array([1, 2, 3])

    def grad_expn2(x):
        return fx.grad(lambda x: fx.lift(lambda x: expn(2, x))(x).sum())(x)

    def run(n, x, v):
        return (fx.vjp(grad_expn2, x)[1](v)[0], fx.jvp(grad_expn2, (x,), (v,))[1],
                fx.vjp(lambda x: fx.lift(expn)(n, x), x)[1](v)[0])

    vjp_grad, jvp_grad, traced_n = jax.jit(run)(n, X, V)
    want = jnp.exp(-X) / X * V  # d^2/dx^2 E_2 = E_0 (JAX's rule, twice)
    _close(vjp_grad, want)
    _close(jvp_grad, want)
    _close(traced_n, jax.vjp(lambda x: expn(n, x), X)[1](V)[0])


# expn's structure in small: a custom_jvp whose jitted jvp rule calls it
# again with the (there traced) nondiff order n - 1.
@partial(jax.custom_jvp, nondiff_argnums=(0,))
@jax.jit
def _power(n, x):
    return x ** n


@_power.defjvp
@jax.jit
def _power_jvp(n, primals, tangents):
    (x,), (t,) = primals, tangents
    return _power(n, x), n * _power(n - 1, x) * t


@pytest.mark.parametrize("under_jit", [True, False], ids=["jit", "eager"])
def test_traced_nondiff_order_nested(under_jit):
    """Third order through two levels of such rules, in two nestings
    (forward over reverse over reverse, reverse over forward over reverse),
    eagerly (the rule first needed outside any JAX trace) and under
    jax.jit. Oracle: d^3/dx^3 x^3 = 6."""
    def g(x):
        return fx.grad(lambda x: fx.lift(lambda x: _power(3.0, x))(x).sum())(x)

    def h(x):  # d^2/dx^2 x^3 applied to 1, by reverse over reverse
        return fx.vjp(g, x)[1](jnp.ones_like(x))[0]

    def both(x, v):
        return (fx.jvp(h, (x,), (v,))[1],
                fx.vjp(lambda x: fx.jvp(g, (x,), (jnp.ones_like(x),))[1], x)[1](v)[0])

    run = jax.jit(both) if under_jit else both
    for got in run(X, V):
        _close(got, 6.0 * V)


def test_closure_through_an_inlined_jit():
    """A custom_jvp closing over an argument of the lifted function, called
    through jax.jit: its jvp rule reads the argument under the name it has
    outside the jit."""
    def f(a, x):
        @jax.custom_jvp
        def k(x):
            return a * jnp.sin(x)

        k.defjvp(lambda p, t: (k(p[0]), 2 * a * jnp.cos(p[0]) * t[0]))
        return jax.jit(k)(x)

    a = jnp.array([1.5, 2.0, 3.0])
    got = jax.jit(lambda x: fx.grad(lambda x: fx.lift(f)(a, x).sum())(x))(X)
    _close(got, jax.grad(lambda x: f(a, x).sum())(X))


def test_closure_over_an_enclosing_jit_value():
    """The same, closing over a value of an enclosing jax.jit that the
    lifted function reads through its closure (a constant of its program)."""
    def outer(a, x):
        def f(x):
            @jax.custom_jvp
            def k(x):
                return a * jnp.sin(x)

            k.defjvp(lambda p, t: (k(p[0]), 2 * a * jnp.cos(p[0]) * t[0]))
            return k(x)

        return fx.grad(lambda x: fx.lift(f)(x).sum())(x)

    a = jnp.array([1.5, 2.0, 3.0])
    _close(jax.jit(outer)(a, X), 2 * a * jnp.cos(X))


def test_closed_over_value_that_is_no_input_raises():
    """A jvp rule reading a traced value the primal function does not read
    (so not an input of the equation): a clear error, not a leaked tracer."""
    @partial(jax.custom_jvp, nondiff_argnums=(0,))
    def h(s, x):
        return jnp.sin(x)

    h.defjvp(lambda s, p, t: (h(s, p[0]), s * t[0]))
    with pytest.raises(MissingRuleError, match="`h`.*neither takes nor reads"):
        fx.grad(lambda x: fx.lift(h)(X, x).sum())(X)


# --------------------------------------------------------------------------
# custom_vjp

S = jnp.array([2.0, 3.0, -1.0])


def _scaled(scale):
    """sin(x) * scale as a custom_vjp whose fwd and bwd read `scale`
    through their closure."""
    @jax.custom_vjp
    def f(x):
        return jnp.sin(x) * scale

    f.defvjp(lambda x: (f(x), jnp.cos(x)), lambda c, g: (g * c * scale,))
    return f


@partial(jax.custom_vjp, nondiff_argnums=(0,))
def _apply_sin(h, x):
    return h(jnp.sin(x))


_apply_sin.defvjp(lambda h, x: (h(jnp.sin(x)), jnp.cos(x)),
                  lambda h, c, g: (jax.vjp(h, c)[1](g)[0] * c,))


def _scaled_nondiff(scale):
    """The same through a nondiff function argument closing over `scale`."""
    return partial(_apply_sin, lambda y: y * scale)


@pytest.mark.parametrize("make", [_scaled, _scaled_nondiff], ids=["closure", "nondiff_fn"])
@pytest.mark.parametrize("where", ["argument", "argument_eager", "enclosing_jit"])
@pytest.mark.slow
def test_custom_vjp_closing_over_traced_value(make, where):
    """The closed-over value an argument of the lifted function (traced by
    lifting; under jax.jit or eagerly) or a value of an enclosing jax.jit
    (a constant of the lifted program). grad, vjp, jvp, vmap of grad, and
    second order (forward over reverse, reverse over reverse)."""
    def derivs(s, x, v):
        if where == "enclosing_jit":
            F = fx.lift(lambda x: make(s)(x))
        else:
            F = partial(fx.lift(lambda s, x: make(s)(x)), s)
        g = fx.grad(lambda x: F(x).sum())
        return (g(x), fx.vjp(F, x)[1](v)[0], fx.jvp(F, (x,), (v,))[1],
                fx.vmap(g)(jnp.stack([x, 2 * x])), fx.jvp(g, (x,), (v,))[1],
                fx.vjp(g, x)[1](v)[0])

    run = derivs if where == "argument_eager" else jax.jit(derivs)
    got = run(S, X, V)
    F = make(S)
    g = jax.grad(lambda x: F(x).sum())
    hv = jax.jacrev(g)(X) @ V
    want = (g(X), jax.vjp(F, X)[1](V)[0], jax.jacrev(F)(X) @ V,
            jax.vmap(g)(jnp.stack([X, 2 * X])), hv, hv)
    for a, b in zip(got, want, strict=True):
        _close(a, b)


def test_custom_vjp_vmap_over_closed_value():
    """vmap over the closed-over value: the value bwd reads is batched."""
    s = jnp.stack([S, 2 * S])

    def run(s, x):
        return fx.vmap(lambda s: fx.grad(
            lambda x: fx.lift(lambda s, x: _scaled(s)(x))(s, x).sum())(x))(s)

    want = jax.vmap(lambda s: jax.grad(lambda x: _scaled(s)(x).sum())(X))(s)
    _close(jax.jit(run)(s, X), want)


def test_custom_vjp_bwd_reading_no_input_raises():
    """A bwd reading a traced value the function does not read: a clear
    error, not a leaked tracer."""
    def make(scale):
        @jax.custom_vjp
        def f(x):
            return jnp.sin(x)

        f.defvjp(lambda x: (f(x), jnp.cos(x)), lambda c, g: (g * c * scale,))
        return f

    with pytest.raises(MissingRuleError, match="`f`.*bwd rule.*neither takes nor reads"):
        fx.grad(lambda x: fx.lift(lambda s, x: make(s)(x))(S, x).sum())(X)

