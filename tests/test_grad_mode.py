"""Grad modes (NOTE [grad modes]) against torch.func with torch.no_grad,
on the same functions and numbers, plus properties: decorator form,
nesting, is_grad_enabled, forward mode, vmap unaffected, functx.jit.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import functx as fx
import functx.numpy as fnp

X = np.array([0.5, -1.5, 2.0])


def _close(got, want, tol=1e-10):
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=tol, atol=tol)


def _pair(ng, eg, sin, grad):
    """The torch.func documentation's cases, written once per library."""

    def inside(x):  # no_grad inside the transformed function
        with ng():
            c = sin(x)
        return (c * x).sum()

    def outside(x):  # a transform started inside no_grad
        with ng():
            return grad(lambda y: (sin(y) * y).sum())(x)

    def reenabled(x):
        with ng():
            with eg():
                c = sin(x)
        return (c * x).sum()

    def nested(x):  # the outer grad is blocked, the inner one is not
        with ng():
            g = grad(lambda y: (sin(y) * x).sum())(x)
        return (g * x).sum()

    return {"inside": grad(inside), "outside": outside, "reenabled": grad(reenabled),
            "nested": grad(nested)}


@pytest.mark.slow
def test_against_torch_func():
    t = _pair(torch.no_grad, torch.enable_grad, torch.sin, torch.func.grad)
    f = _pair(fx.no_grad, fx.enable_grad, fnp.sin, fx.grad)
    xt = torch.tensor(X)
    got = jax.jit(lambda x: {k: fn(x) for k, fn in f.items()})(jnp.asarray(X))
    for k, fn in t.items():
        _close(got[k], fn(xt).numpy())


def test_every_transform_and_jit():
    x = jnp.asarray(X)
    v = jnp.array([1.0, 2.0, -1.0])

    def f(x):
        with fx.no_grad():
            c = fnp.sin(x)
        return c * x

    def ref(x):
        return jax.lax.stop_gradient(jnp.sin(x)) * x

    @jax.jit
    def run(x, v):
        s = lambda g: lambda x: g(x).sum()  # noqa: E731
        return {
            "jvp": (fx.jvp(f, (x,), (v,)), jax.jvp(ref, (x,), (v,))),
            "vjp": (fx.vjp(f, x)[1](v), jax.vjp(ref, x)[1](v)),
            "jacfwd": (fx.jacfwd(f)(x), jax.jacfwd(ref)(x)),
            "jacrev": (fx.jacrev(f)(x), jax.jacrev(ref)(x)),
            "hessian": (fx.hessian(s(f))(x), jax.hessian(s(ref))(x)),
            "linearize": (fx.linearize(f, x)[1](v), jax.linearize(ref, x)[1](v)),
            "grad_jit": (fx.grad(fx.jit(s(f)))(x), jax.grad(s(ref))(x)),
            "jit_grad": (fx.jit(fx.grad(s(f)))(x), jax.grad(s(ref))(x)),
            "vmap": (fx.vmap(f)(jnp.stack([x, v])), jax.vmap(ref)(jnp.stack([x, v]))),
            "vmap_grad": (fx.vmap(fx.grad(s(f)))(jnp.stack([x, v])),
                          jax.vmap(jax.grad(s(ref)))(jnp.stack([x, v]))),
        }

    for name, (got, want) in run(x, v).items():
        for g, w in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
            np.testing.assert_allclose(g, w, rtol=1e-10, atol=1e-10, err_msg=name)


def test_decorators_and_is_grad_enabled():
    seen = []

    @fx.no_grad()
    def blocked(x):
        seen.append(fx.is_grad_enabled())
        return fnp.sin(x)

    @fx.set_grad_enabled(False)
    def blocked2(x):
        return fnp.sin(x)

    @fx.inference_mode()
    def blocked3(x):
        return fnp.sin(x)

    assert fx.is_grad_enabled()  # the decorators did not change the mode
    x = jnp.asarray(X)
    for fn in (blocked, blocked2, blocked3):
        _close(fx.grad(lambda x: (fn(x) * x).sum())(x), np.sin(X))
    assert seen == [False]

    assert fx.is_grad_enabled()
    with fx.no_grad():
        assert not fx.is_grad_enabled()
        with fx.enable_grad():
            assert fx.is_grad_enabled()
        with fx.set_grad_enabled(True):
            assert fx.is_grad_enabled()
        with fx.inference_mode(False):
            assert not fx.is_grad_enabled()
        assert not fx.is_grad_enabled()
        # a transform started here differentiates, and sees grad enabled
        flags = []
        fx.grad(lambda y: (flags.append(fx.is_grad_enabled()), fnp.sin(y).sum())[1])(x)
        assert flags == [True]
    assert fx.is_grad_enabled()
    with fx.set_grad_enabled(False):
        assert not fx.is_grad_enabled()
    assert fx.is_grad_enabled()
    # torch's functional form: set_grad_enabled(False) sets the mode now
    fx.set_grad_enabled(False)
    assert not fx.is_grad_enabled()
    fx.set_grad_enabled(True)
    assert fx.is_grad_enabled()
    # restored after an exception
    with pytest.raises(ZeroDivisionError):
        with fx.no_grad():
            1 / 0  # noqa: B018
    assert fx.is_grad_enabled()
    assert fx.autograd.no_grad is fx.no_grad
