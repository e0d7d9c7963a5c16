"""Complex numbers, fft, pooling, top_k and special functions beyond the op
table (tests/op_table.py): JAX's conventions with complex tangents and
cotangents, Equinox pooling layers in a CNN under vmap(grad) and second
order, functx.numpy.fft under transforms, the generic reduce_window, and
the clear errors where JAX defines no derivative either. Every composition
of a test runs inside one jax.jit (functx runs at trace time)."""

import equinox as eqx
import numpy as np
import pytest

import jax
import jax.numpy as jnp
from jax import lax

import functx as fx
from functx.errors import MissingRuleError

rng = np.random.default_rng(7)


def close(a, b, tol=1e-8):
    la, ta = jax.tree_util.tree_flatten(a)
    lb, tb = jax.tree_util.tree_flatten(b)
    assert ta == tb, (ta, tb)
    for x, y in zip(la, lb):
        x, y = np.asarray(x), np.asarray(y)
        assert x.shape == y.shape and x.dtype == y.dtype, (x.shape, x.dtype, y.shape, y.dtype)
        np.testing.assert_allclose(x, y, rtol=tol, atol=tol)


def crandn(*shape):
    return jnp.asarray(rng.normal(size=shape) + 1j * rng.normal(size=shape))


# --------------------------------------------------------------------------
# Complex numbers: jvp and vjp with complex tangents/cotangents equal JAX's
# (the vjp is the transpose of the jvp, without conjugation)

COMPLEX_FUNCTIONS = {
    "holomorphic": lambda z, w: jnp.exp(z) * w / (z * z + 2.0) + jnp.sqrt(z + 3.0),
    "matmul_conj": lambda z, w: z @ jnp.conj(w).T + jnp.sum(z * w),
    "to_real": lambda z, w: jnp.abs(z) ** 2 + jnp.real(w) * jnp.imag(z) + jnp.angle(w),
    "parts": lambda z, w: lax.complex(jnp.real(z) * jnp.imag(w), jnp.imag(z)) + jnp.conj(w),
    "fft": lambda z, w: jnp.fft.fft2(z) + jnp.fft.ifft(w, axis=0) + jnp.fft.rfft(jnp.real(z), n=4),
}


@pytest.mark.parametrize("name", list(COMPLEX_FUNCTIONS))
def test_complex_jvp_vjp_match_jax(name):
    f = COMPLEX_FUNCTIONS[name]
    z, w = crandn(2, 3), crandn(2, 3)
    tz, tw = crandn(2, 3), crandn(2, 3)
    out = jax.eval_shape(f, z, w)
    ct = crandn(*out.shape) if jnp.iscomplexobj(out) else jnp.asarray(rng.normal(size=out.shape))
    cts = jnp.stack([ct, 2 * ct])

    @jax.jit
    def run(z, w, tz, tw, ct, cts):
        F = fx.lift(f)
        got, want = {}, {}
        got["jvp"] = fx.jvp(F, (z, w), (tz, tw))
        want["jvp"] = jax.jvp(f, (z, w), (tz, tw))
        got["vjp"] = fx.vjp(F, z, w)[1](ct)
        want["vjp"] = jax.vjp(f, z, w)[1](ct)
        got["vmap(vjp)"] = fx.vmap(fx.vjp(F, z, w)[1])(cts)
        want["vmap(vjp)"] = jax.vmap(jax.vjp(f, z, w)[1])(cts)
        # second order: the jvp of the pullback
        got["jvp(vjp)"] = fx.jvp(lambda a: fx.vjp(F, a, w)[1](ct), (z,), (tz,))[1]
        want["jvp(vjp)"] = jax.jvp(lambda a: jax.vjp(f, a, w)[1](ct), (z,), (tz,))[1]
        return got, want

    got, want = run(z, w, tz, tw, ct, cts)
    close(got, want)


def test_grad_of_a_real_function_of_complex_input_matches_jax():
    def f(z):
        return jnp.sum(jnp.abs(jnp.fft.fft(z * jnp.conj(z[::-1]))) ** 2)

    z = crandn(4)
    close(jax.jit(fx.grad(fx.lift(f)))(z), jax.grad(f)(z))


def test_abs_derivative_at_zero_matches_jax():
    x = jnp.array([0.0, -1.0, 2.0])
    z = jnp.array([0.0 + 0.0j, 3.0 - 4.0j])
    close(fx.jvp(fx.lift(jnp.abs), (x,), (jnp.ones(3),)), jax.jvp(jnp.abs, (x,), (jnp.ones(3),)))
    tz = jnp.array([1.0 + 2.0j, 1.0j])
    close(fx.jvp(fx.lift(jnp.abs), (z,), (tz,)), jax.jvp(jnp.abs, (z,), (tz,)))


# --------------------------------------------------------------------------
# fft through functx.numpy.fft


def test_functx_numpy_fft_under_grad_vmap_and_second_order():
    x = jnp.asarray(rng.normal(size=(3, 4, 6)))
    v = jnp.asarray(rng.normal(size=(3, 4, 6)))

    def power(np_, y):
        fft = np_.fft
        spectrum = fft.rfftn(y, axes=(0, 1))  # (3, 3, 6)
        back = fft.irfft(spectrum * fft.fftfreq(3)[None, :, None], n=4, axis=1)
        return np_.sum(np_.abs(fft.fftshift(fft.fft(y, axis=-1))) ** 3) + np_.sum(back ** 2)

    jax_fn = lambda y: power(jnp, y)  # noqa: E731
    fx_fn = lambda y: power(fx.numpy, y)  # noqa: E731

    @jax.jit
    def run(x, v):
        got = (fx.grad(fx_fn)(x), fx.vmap(fx.grad(fx_fn))(x[:, None]),
               fx.jvp(fx.grad(fx_fn), (x,), (v,))[1],
               fx.vmap(fx.numpy.fft.ihfft)(x))
        want = (jax.grad(jax_fn)(x), jax.vmap(jax.grad(jax_fn))(x[:, None]),
                jax.jvp(jax.grad(jax_fn), (x,), (v,))[1],
                jax.vmap(jnp.fft.ihfft)(x))
        return got, want

    got, want = run(x, v)
    close(got, want)


# --------------------------------------------------------------------------
# Pooling: Equinox's MaxPool2d and AvgPool2d in a CNN


def test_equinox_pooling_cnn_per_sample_grads_and_hvp_match_jax():
    # The model is built abstractly (no random initialisation to compile),
    # then given NumPy weights.
    abstract = eqx.filter_eval_shape(lambda key: eqx.nn.Sequential([
        eqx.nn.Conv2d(1, 2, 3, padding=1, key=key),
        eqx.nn.MaxPool2d(2, stride=1, padding=((0, 1), (1, 0))),
        eqx.nn.Lambda(jnp.tanh),
        eqx.nn.AvgPool2d(3, stride=2, padding=1),
        eqx.nn.Lambda(jnp.ravel),
        eqx.nn.Linear(8, 1, key=key),
    ]), jax.random.PRNGKey(1))
    model = jax.tree_util.tree_map(
        lambda s: jnp.asarray(rng.normal(size=s.shape)) if isinstance(s, jax.ShapeDtypeStruct)
        else s, abstract)
    params = fx.named_parameters(model)
    imgs = jnp.asarray(rng.normal(size=(3, 1, 4, 4)))
    direction = jax.tree_util.tree_map(lambda p: jnp.asarray(rng.normal(size=p.shape)), params)

    def loss(p, x):
        return (fx.functional_call(model, p, (x,)) ** 2).sum()

    # Under JAX's transforms functional_call gets no functx values and just
    # calls the model: JAX differentiates the plain Equinox model.
    @jax.jit
    def run(params, imgs, direction):
        got = (fx.vmap(fx.grad(loss), in_dims=(None, 0))(params, imgs),
               fx.jvp(lambda p: fx.grad(loss)(p, imgs[0]), (params,), (direction,))[1])
        want = (jax.vmap(jax.grad(loss), in_axes=(None, 0))(params, imgs),
                jax.jvp(lambda p: jax.grad(loss)(p, imgs[0]), (params,), (direction,))[1])
        return got, want

    got, want = run(params, imgs, direction)
    close(got, want)


def test_generic_reduce_window_forward_mode_and_vmap_and_reverse_error():
    def prod_pool(x):  # a custom computation: lax.mul is no monoid JAX special-cases
        return lax.reduce_window(x, 1.0, lax.mul, (2, 2), (1, 1), ((0, 1), (1, 0)))

    x = jnp.asarray(rng.uniform(0.5, 1.5, size=(3, 3)))
    t = jnp.asarray(rng.normal(size=(3, 3)))
    F = fx.lift(prod_pool)

    xs = jnp.stack([x, t], axis=-1)
    ts = jnp.stack([t, x], axis=-1)

    @jax.jit
    def run(x, t, xs, ts):
        got = (fx.jvp(F, (x,), (t,)),
               fx.jvp(lambda y: fx.jvp(F, (y,), (t,))[1], (x,), (t,))[1],
               fx.vmap(lambda y, s: fx.jvp(F, (y,), (s,)), in_dims=-1)(xs, ts))
        # (JAX's own jvp of this reduce_window fails when a tangent of the
        # inner one is a symbolic zero: the oracle passes explicit zeros)
        want = (jax.jvp(prod_pool, (x,), (t,)),
                jax.jvp(lambda y, s: jax.jvp(prod_pool, (y,), (s,))[1], (x, t),
                        (t, jnp.zeros_like(t)))[1],
                jax.vmap(lambda y, s: jax.jvp(prod_pool, (y,), (s,)), in_axes=-1)(xs, ts))
        return got, want

    got, want = run(x, t, xs, ts)
    close(got, want)
    with pytest.raises(MissingRuleError, match="reduce_window.*custom computation"):
        fx.grad(lambda y: F(y).sum())(x)


def test_max_pool_with_window_dilation_reverse_mode_raises_forward_mode_works():
    def pool(x):
        return lax.reduce_window(x, -jnp.inf, lax.max, (2,), (1,), "VALID", window_dilation=(2,))

    x, t = jnp.asarray(rng.normal(size=6)), jnp.asarray(rng.normal(size=6))
    close(fx.jvp(fx.lift(pool), (x,), (t,)), jax.jvp(pool, (x,), (t,)))
    with pytest.raises(MissingRuleError, match="select_and_gather_add.*window dilation"):
        fx.grad(lambda y: fx.lift(pool)(y).sum())(x)


# --------------------------------------------------------------------------
# top_k: the indices under vmap


def test_top_k_indices_and_values_under_vmap():
    x = jnp.asarray(rng.normal(size=(3, 5, 2)))
    f = lambda y: lax.top_k(y, 3, axis=1)  # noqa: E731
    close(jax.jit(fx.vmap(fx.lift(f), in_dims=2))(x), jax.vmap(f, in_axes=2)(x))


# --------------------------------------------------------------------------
# Special functions: derivatives JAX does not define raise clear errors


def test_zeta_derivative_in_q_against_closed_form_and_finite_differences():
    # JAX has no derivative for zeta; functx has d/dq zeta(s, q) = -s zeta(s+1, q)
    s = jnp.array([2.5, 3.0, 4.0])
    q = jnp.array([0.7, 1.5, 2.0])
    t = jnp.asarray(rng.normal(size=3))
    F = fx.lift(lambda q: lax.zeta(s, q))
    eps = 1e-6

    @jax.jit
    def run(q, t):
        got = (fx.jvp(F, (q,), (t,))[1], fx.vjp(F, q)[1](t)[0],
               fx.jvp(lambda p: fx.vjp(F, p)[1](t)[0], (q,), (t,))[1])
        want = (-s * lax.zeta(s + 1, q) * t, -s * lax.zeta(s + 1, q) * t,
                s * (s + 1) * lax.zeta(s + 2, q) * t * t)
        fd = (lax.zeta(s, q + eps * t) - lax.zeta(s, q - eps * t)) / (2 * eps)
        return got, want, fd

    got, want, fd = run(q, t)
    close(got, want)
    close(got[0], fd, tol=1e-6)


@pytest.mark.parametrize("name, fn, argnums", [
    ("zeta", lambda a, b: lax.zeta(a, b), 0),
    ("regularized_incomplete_beta", lambda a, b: lax.betainc(a, b, 0.3), 1),
    ("polygamma", lambda a, b: lax.polygamma(a, b), 0),
    ("igamma_grad_a", lambda a, b: lax.igamma_grad_a(a, b), 1),
])
def test_missing_derivatives_raise_naming_the_primitive(name, fn, argnums):
    # eval_shape: the error is raised while tracing, nothing is compiled
    with pytest.raises(MissingRuleError, match=f"`{name}` has no derivative"):
        jax.eval_shape(fx.grad(fx.lift(fn), argnums=argnums), 2.0, 1.5)
