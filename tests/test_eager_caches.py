"""The two caches of eager reverse mode (NOTE [eager reverse mode in few
dispatches] in interpreters/reverse.py): a fused primal+residual step per
repeated primitive application, and a compiled backward pass per repeated
tape structure. Results must equal JAX's on every call, before and after
the caches engage, and the caches must actually engage."""

import numpy as np

import jax
import jax.numpy as jnp

import functx as fx
import functx.numpy as fnp
from functx.interpreters import reverse

rng = np.random.default_rng(2)
X = jnp.asarray(rng.uniform(-1, 1, (5,)))
W = jnp.asarray(rng.uniform(-1, 1, (4, 5)))


def loss(np_):
    def f(w, x):
        h = np_.tanh(w @ x)
        s = np_.sort(h)  # a primitive with an index-dependent jvp
        return np_.sum(s * np_.arange(4.0)) + np_.sum(np_.exp(-w ** 2)) + np_.max(h)
    return f


def test_repeated_grads_equal_jax_before_and_after_the_caches_engage():
    g = fx.grad(loss(fnp), argnums=(0, 1))
    want = jax.grad(loss(jnp), argnums=(0, 1))(W, X)
    for i in range(4):
        got = g(W, X)
        for a, b in zip(got, want):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-12)
    fused = [k[0].name for k, v in reverse._fused.entries.items() if isinstance(v, reverse.FusedStep)]
    assert {"tanh", "dot_general", "exp"} <= set(fused)
    assert any(not isinstance(v, int) for v in reverse._backward.entries.values())


def test_cached_backward_with_new_values_and_vjp_cotangents():
    f = loss(fnp)
    for i in range(4):
        w = W * (1.0 + 0.1 * i)
        out, vjp_fn = fx.vjp(f, w, X)
        ct = jnp.asarray(1.0 + i)
        gw, gx = vjp_fn(ct)
        jout, jvjp = jax.vjp(loss(jnp), w, X)
        jw, jx = jvjp(ct)
        np.testing.assert_allclose(np.asarray(out), np.asarray(jout), rtol=1e-6)
        np.testing.assert_allclose(np.asarray(gw), np.asarray(jw), rtol=1e-6, atol=1e-12)
        np.testing.assert_allclose(np.asarray(gx), np.asarray(jx), rtol=1e-6, atol=1e-12)


def test_nested_transforms_and_jax_jit_around_cached_steps_equal_jax():
    # nested: the inner grad's primals are tracers of the outer one
    h = fx.grad(lambda x: fx.grad(lambda y: fnp.sum(fnp.sin(y) * y))(x).sum())
    for _ in range(3):
        np.testing.assert_allclose(
            np.asarray(h(X)),
            np.asarray(jax.grad(lambda x: jax.grad(lambda y: jnp.sum(jnp.sin(y) * y))(x).sum())(X)),
            rtol=1e-6)
    np.testing.assert_allclose(np.asarray(jax.jit(fx.grad(lambda x: fnp.sum(fnp.cos(x))))(X)),
                               -np.sin(np.asarray(X)), rtol=1e-6)


def test_fused_steps_do_not_copy_inputs_into_residuals():
    # the residual of `w @ x` for x is w itself: it must be passed on, not
    # returned (copied) by the compiled primal step
    w = jnp.ones((256, 1024))
    x = jnp.ones(1024)
    kept = []
    for _ in range(3):
        before = sum(a.nbytes for a in jax.live_arrays())
        kept.append(fx.vjp(lambda x: w @ x, x))
        assert sum(a.nbytes for a in jax.live_arrays()) - before < w.nbytes // 4


def test_repeated_vmaps_equal_jax_before_and_after_batched_steps_engage():
    from functx.interpreters import batching

    def f(np_):
        def g(w, x):  # batched and unbatched operands, a moved batch axis
            return np_.sum(np_.tanh(w @ x) * np_.cos(x[:4]) + x[1:5] ** 2)
        return g

    xs = jnp.asarray(rng.uniform(-1, 1, (3, 5)))
    want = jax.vmap(f(jnp), in_axes=(None, 1))(W, xs.T)
    for _ in range(3):
        got = fx.vmap(f(fnp), in_dims=(None, 1))(W, xs.T)
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6)
    built = [k[0].name for k, v in batching._steps.entries.items() if isinstance(v, batching.BatchedStep)]
    assert {"dot_general", "tanh", "cos"} <= set(built)
