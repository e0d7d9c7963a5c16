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
@pytest.mark.slow
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


@pytest.mark.slow
def test_grad_of_a_real_function_of_complex_input_matches_jax():
    def f(z):
        return jnp.sum(jnp.abs(jnp.fft.fft(z * jnp.conj(z[::-1]))) ** 2)

    z = crandn(4)
    close(jax.jit(fx.grad(fx.lift(f)))(z), jax.grad(f)(z))


@pytest.mark.slow
def test_abs_derivative_at_zero_matches_jax():
    x = jnp.array([0.0, -1.0, 2.0])
    z = jnp.array([0.0 + 0.0j, 3.0 - 4.0j])
    close(fx.jvp(fx.lift(jnp.abs), (x,), (jnp.ones(3),)), jax.jvp(jnp.abs, (x,), (jnp.ones(3),)))
    tz = jnp.array([1.0 + 2.0j, 1.0j])
    close(fx.jvp(fx.lift(jnp.abs), (z,), (tz,)), jax.jvp(jnp.abs, (z,), (tz,)))


# --------------------------------------------------------------------------
# pow: JAX guards the derivative in x (0 where y == 0) for integer exponents
# only; a floating or complex exponent takes y x^(y - 1) as it is, so
# d/dx at 0 ** 0 is NaN and the mixed partial at (4, 0) is 1/4, not 0.
# Compared op by op, not in one jax.jit: at these points Jacobian entries
# are 0 * NaN and 0 * inf (a basis' zeros times a NaN partial), and whether
# a compiled program keeps those NaNs depends on how XLA simplifies the
# whole program (and JAX's and functx's programs differ).

_POW = fx.lift(lax.pow)


def _same_as_jax(got, want):
    for key in want:  # NaN where JAX has NaN (assert_allclose's equal_nan)
        try:
            close(got[key], want[key], tol=1e-12)
        except AssertionError as e:
            raise AssertionError(f"pow, {key}: {e}") from None


@pytest.mark.slow
def test_pow_derivative_in_x_is_guarded_for_integer_exponents_only():
    got, want = {}, {}
    pairs = {  # name -> derivative of pow, given the transforms' module and pow
        "fwd_fwd": lambda T, f: T.jacfwd(T.jacfwd(f, (0, 1)), (0, 1)),
        "rev_rev": lambda T, f: T.jacrev(T.jacrev(f, (0, 1)), (0, 1)),
        "grad": lambda T, f: T.grad(f),
    }
    cases = [((4.0, 0.0), jnp.float64), ((4.0, 0.0), jnp.float32), ((0.0, 0.0), jnp.float64)]
    for (x, y), dtype in cases:
        for name, d in pairs.items():
            key, args = f"{name}{x, y} {dtype.__name__}", (dtype(x), dtype(y))
            got[key], want[key] = d(fx, _POW)(*args), d(jax, lax.pow)(*args)
    # d/dy d/dx x^y = x^(y - 1) (1 + y log x): 1/4 at (4, 0); d/dx at (0, 0): 0 * 0^-1
    assert want["rev_rev(4.0, 0.0) float64"][0][1] == 0.25
    assert np.isnan(want["grad(0.0, 0.0) float64"])
    got["power"], want["power"] = fx.grad(fx.numpy.power)(0.0, 0.0), jax.grad(jnp.power)(0.0, 0.0)
    # an integer exponent keeps the guard: x^0 has derivative 0, also at x = 0
    xs, ns = jnp.array([0.0, 0.0, 0.0, 2.0]), jnp.array([0, 1, 2, 0], jnp.int32)
    got["int"] = fx.jacfwd(lambda x: _POW(x, ns))(xs)
    want["int"] = jax.jacfwd(lambda x: lax.pow(x, ns))(xs)
    _same_as_jax(got, want)


@pytest.mark.slow
def test_pow_first_second_and_third_derivatives_match_jax_at_singular_points():
    argnums = (0, 1)
    compositions = {  # name -> derivative of pow, given the transforms' module and pow
        "grad_x": lambda T, f: T.grad(f), "grad_y": lambda T, f: T.grad(f, 1),
        "fwd_fwd": lambda T, f: T.jacfwd(T.jacfwd(f, argnums), argnums),
        "rev_rev": lambda T, f: T.jacrev(T.jacrev(f, argnums), argnums),
        "fwd_rev": lambda T, f: T.jacfwd(T.jacrev(f, argnums), argnums),
        "hessian": lambda T, f: T.hessian(f, argnums),
        "third": lambda T, f: T.jacfwd(T.jacrev(T.jacfwd(f, argnums), argnums), argnums),
    }
    points = [(4.0, 0.0), (0.0, 0.0), (0.0, 2.0), (2.0, 3.0), (-2.0, 2.0), (-2.0, 0.5),
              (0.0, 1.0), (0.0, -1.0), (3.0, -1.5)]
    got, want = {}, {}
    for x, y in points:
        for name, d in compositions.items():
            key, args = f"{name}{x, y}", (jnp.float64(x), jnp.float64(y))
            got[key], want[key] = d(fx, _POW)(*args), d(jax, lax.pow)(*args)

    # integer exponents, also 0 and 1 at x = 0 (x^1's second derivative is
    # 0 * 0^-1, NaN, in JAX: the inner pow has a floating exponent)
    xs = jnp.array([0.0, 0.0, 0.0, 0.0, 2.0, -2.0, 3.0, 0.0])
    ns = jnp.array([0, 1, 2, -1, 0, 3, -2, 3], jnp.int32)
    pow_n, pow_n_fx = (lambda x: lax.pow(x, ns)), (lambda x: _POW(x, ns))
    for name, d in {"fwd": lambda T, f: T.jacfwd(f), "rev": lambda T, f: T.jacrev(f),
                    "fwd_fwd": lambda T, f: T.jacfwd(T.jacfwd(f)),
                    "rev_rev": lambda T, f: T.jacrev(T.jacrev(f)),
                    "fwd_rev": lambda T, f: T.jacfwd(T.jacrev(f))}.items():
        got["int_" + name], want["int_" + name] = d(fx, pow_n_fx)(xs), d(jax, pow_n)(xs)
    d2 = lambda T, f: T.vmap(T.grad(T.grad(f)))  # noqa: E731
    got["int_scalar"] = d2(fx, lambda x: _POW(x, jnp.int32(1)))(xs)
    want["int_scalar"] = d2(jax, lambda x: lax.pow(x, jnp.int32(1)))(xs)

    # complex bases, with complex and integer exponents
    z, w = jnp.array([0j, 4 + 0j, 1 + 2j, -2 + 0j]), jnp.array([0j, 0j, 0.5 - 1j, 2 + 0j])
    hol2 = lambda T, f: T.jacfwd(T.jacfwd(f, argnums, holomorphic=True),  # noqa: E731
                                 argnums, holomorphic=True)
    rev2 = lambda T, f: T.jacrev(T.jacrev(f, holomorphic=True), holomorphic=True)  # noqa: E731
    tangents = (jnp.complex128(1 + 0.5j), jnp.complex128(-0.3 + 2j))
    for k in range(len(z)):
        got[f"complex{k}"] = hol2(fx, _POW)(z[k], w[k])
        want[f"complex{k}"] = hol2(jax, lax.pow)(z[k], w[k])
        got[f"complex_jvp{k}"] = fx.jvp(_POW, (z[k], w[k]), tangents)
        want[f"complex_jvp{k}"] = jax.jvp(lax.pow, (z[k], w[k]), tangents)
        got[f"complex_int{k}"] = rev2(fx, lambda x: _POW(x, jnp.int32(2)))(z[k])
        want[f"complex_int{k}"] = rev2(jax, lambda x: lax.pow(x, jnp.int32(2)))(z[k])
    _same_as_jax(got, want)


# --------------------------------------------------------------------------
# fft through functx.numpy.fft


@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.slow
def test_max_pool_with_window_dilation_reverse_mode_raises_forward_mode_works():
    def pool(x):
        return lax.reduce_window(x, -jnp.inf, lax.max, (2,), (1,), "VALID", window_dilation=(2,))

    x, t = jnp.asarray(rng.normal(size=6)), jnp.asarray(rng.normal(size=6))
    close(fx.jvp(fx.lift(pool), (x,), (t,)), jax.jvp(pool, (x,), (t,)))
    with pytest.raises(MissingRuleError, match="select_and_gather_add.*window dilation"):
        fx.grad(lambda y: fx.lift(pool)(y).sum())(x)


# --------------------------------------------------------------------------
# top_k: the indices under vmap


@pytest.mark.slow
def test_top_k_indices_and_values_under_vmap():
    x = jnp.asarray(rng.normal(size=(3, 5, 2)))
    f = lambda y: lax.top_k(y, 3, axis=1)  # noqa: E731
    close(jax.jit(fx.vmap(fx.lift(f), in_dims=2))(x), jax.vmap(f, in_axes=2)(x))


# --------------------------------------------------------------------------
# Special functions: derivatives JAX does not define raise clear errors


@pytest.mark.slow
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


# --------------------------------------------------------------------------
# lax.reduce with a custom computation (NOTE [generic reduce]): the
# derivative of JAX's pairwise tree, so reverse mode and second order work


def _prod_reduce(x):  # lax.mul with 1.0 but through a lambda: JAX's generic reduce
    return lax.reduce(x, 1.0, lambda a, b: a * b, (0,))


def _argmax_reduce(x, i):  # variadic: a value and its index, reduced together
    def comp(a, b):
        take = a[0] >= b[0]
        return jnp.where(take, a[0], b[0]), jnp.where(take, a[1], b[1])

    return lax.reduce((x, i), (-jnp.inf, jnp.zeros((), i.dtype)), comp, (1,))


@pytest.mark.slow
def test_generic_reduce_all_modes_match_jax():
    x = jnp.asarray(rng.uniform(0.5, 1.5, size=(5, 3)))
    t = jnp.asarray(rng.normal(size=(5, 3)))
    i = jnp.broadcast_to(jnp.arange(3), (5, 3))
    F, G = fx.lift(_prod_reduce), fx.lift(_argmax_reduce)
    assert "reduce[" in str(jax.make_jaxpr(_prod_reduce)(x))
    loss = lambda f: lambda y: (f(y) ** 2).sum()  # noqa: E731

    @jax.jit
    def run(x, t, i):
        fi = i.astype(x.dtype)  # JAX's jvp of reduce fails on an integer operand
        got = (F(x), fx.jvp(F, (x,), (t,)), fx.vjp(F, x)[1](t[0]), fx.grad(loss(F))(x),
               fx.hessian(loss(F))(x[:, 0]), fx.vmap(F, in_dims=1)(x),
               fx.vmap(fx.grad(loss(F)))(x[:, None]),
               G(x, i), fx.jvp(lambda y: G(y, i)[0], (x,), (t,))[1],
               fx.grad(lambda y: G(y, i)[0].sum())(x), fx.vmap(G)(x[:, None], i[:, None]))
        want = (_prod_reduce(x), jax.jvp(_prod_reduce, (x,), (t,)),
                jax.vjp(_prod_reduce, x)[1](t[0]), jax.grad(loss(_prod_reduce))(x),
                jax.hessian(loss(_prod_reduce))(x[:, 0]), jax.vmap(_prod_reduce, 1)(x),
                jax.vmap(jax.grad(loss(_prod_reduce)))(x[:, None]),
                _argmax_reduce(x, i),
                jax.jvp(lambda y, j: _argmax_reduce(y, j)[0], (x, fi), (t, 0 * fi))[1],
                jax.grad(lambda y, j: _argmax_reduce(y, j)[0].sum(), argnums=(0, 1))(x, fi)[0],
                jax.vmap(_argmax_reduce)(x[:, None], i[:, None]))
        return got, want

    got, want = run(x, t, i)
    close(got, want)


def test_generic_reduce_batched_initial_values_and_init_tangent_error():
    # JAX cannot batch initial values; functx reduces one element at a time
    x = jnp.asarray(rng.uniform(0.5, 1.5, size=(3, 4)))
    s = jnp.asarray(rng.uniform(0.5, 1.5, size=3))
    f = lambda y, init: lax.reduce(y, init, lambda a, b: a * b, (0,))  # noqa: E731
    got = fx.vmap(fx.lift(f))(x, s)
    close(got, jnp.stack([f(x[k], s[k]) for k in range(3)]))
    with pytest.raises(MissingRuleError, match="`reduce`.*initial values"):
        fx.jvp(lambda init: fx.lift(f)(x[0], init), (s[0],), (s[1],))


@pytest.mark.slow
def test_functx_lax_reduce_recognises_functx_monoids():
    x = jnp.asarray(rng.normal(size=(3, 4)))
    for comp, init, name in [(fx.lax.add, 0.0, "reduce_sum"), (fx.lax.max, -jnp.inf, "reduce_max"),
                             (fx.lax.mul, 1.0, "reduce_prod")]:
        jaxpr = str(jax.make_jaxpr(lambda y: fx.lax.reduce(y, init, comp, (1,)))(x))
        assert name in jaxpr and "reduce[" not in jaxpr, jaxpr
    close(fx.grad(lambda y: fx.lax.reduce(y, -jnp.inf, fx.lax.max, (0,)).sum())(x),
          jax.grad(lambda y: lax.reduce(y, -jnp.inf, lax.max, (0,)).sum())(x))


# --------------------------------------------------------------------------
# Pooling written with functx's (or any) add / max / min: recognised, so
# reverse mode works (NOTE [pooling recognised from its computation])


@pytest.mark.parametrize("name, fx_comp, jax_comp, init", [
    ("max", fx.lax.max, lax.max, -jnp.inf), ("sum", fx.lax.add, lax.add, 0.0),
    ("min", fx.lax.min, lax.min, jnp.inf)])
@pytest.mark.slow
def test_functx_lax_reduce_window_is_pooling_under_every_transform(name, fx_comp, jax_comp, init):
    x = jnp.asarray(rng.normal(size=(4, 5)))
    t = jnp.asarray(rng.normal(size=(4, 5)))
    win = ((2, 2), (1, 2), ((0, 1), (1, 0)))

    def ours(y):
        return (fx.lax.reduce_window(y, init, fx_comp, *win) ** 2).sum()

    def theirs(y):
        return (lax.reduce_window(y, init, jax_comp, *win) ** 2).sum()

    # JAX code with other spellings of the computation and an array identity,
    # lifted: recognised when the program is replayed
    spelled = {"max": jnp.maximum, "sum": lambda a, b: a + b, "min": jnp.minimum}[name]
    lifted = fx.lift(lambda y: (lax.reduce_window(y, jnp.asarray(init), spelled, *win) ** 2).sum())

    @jax.jit
    def run(x, t):
        got = (fx.grad(ours)(x), fx.vmap(fx.grad(ours))(jnp.stack([x, t])),
               fx.jvp(fx.grad(ours), (x,), (t,))[1], fx.grad(lifted)(x))
        want = (jax.grad(theirs)(x), jax.vmap(jax.grad(theirs))(jnp.stack([x, t])),
                jax.jvp(jax.grad(theirs), (x,), (t,))[1], jax.grad(theirs)(x))
        return got, want

    got, want = run(x, t)
    close(got, want)
    assert f"reduce_window_{name}" in str(jax.make_jaxpr(lambda y: fx.lax.reduce_window(
        y, init, fx_comp, *win))(x))


def test_reduce_window_with_a_traced_initial_value_stays_generic():
    # an initial value known only when the program runs (here an argument of
    # jax.jit) is no known identity: forward mode works, reverse mode
    # explains what to write instead
    x, t = jnp.asarray(rng.normal(size=6)), jnp.asarray(rng.normal(size=6))
    f = lambda y, init: lax.reduce_window(y, init, lax.max, (2,), (1,), "VALID")  # noqa: E731
    F = fx.lift(f)
    jvp = jax.jit(lambda y, init, s: (fx.jvp(lambda z: F(z, init), (y,), (s,)),
                                      jax.jvp(lambda z: f(z, init), (y,), (s,))))
    close(*jvp(x, -jnp.inf, t))
    with pytest.raises(MissingRuleError, match="constant initial value"):
        jax.jit(lambda y, init: fx.grad(lambda z: F(z, init).sum())(y))(x, -jnp.inf)
    # batched initial values (JAX cannot): one batch element at a time
    xs, inits = jnp.asarray(rng.normal(size=(3, 6))), jnp.asarray(rng.normal(size=3))
    g = lambda y, init: lax.reduce_window(y, init, lax.mul, (2,), (1,), "VALID")  # noqa: E731
    close(fx.vmap(fx.lift(g))(xs, inits), jnp.stack([g(xs[k], inits[k]) for k in range(3)]))


# --------------------------------------------------------------------------
# optimization_barrier, device_put, dce_sink: identity-like primitives


def _barrier_fn(x, y):
    a, b = lax.optimization_barrier((jnp.sin(x) * y, y))
    return a * b + jnp.cos(a)


def _device_put_fn(x, y):
    a, b = jax.device_put((x * y, jnp.exp(y)), jax.devices()[0])
    return jnp.sin(a) * jax.device_put(b)


def _dce_sink_fn(x, y):
    lax.dce_sink(x * y)  # JAX keeps x * y alive; the value is unused
    return jnp.sin(x) * y


def _without_sink(x, y):  # the reference: JAX's own vmap of dce_sink's jvp fails
    return jnp.sin(x) * y


@pytest.mark.parametrize("ours, f", [(_barrier_fn, _barrier_fn), (_device_put_fn, _device_put_fn),
                                     (_dce_sink_fn, _without_sink)],
                         ids=["optimization_barrier", "device_put", "dce_sink"])
@pytest.mark.slow
def test_identity_like_primitives_under_every_transform_match_jax(ours, f):
    name = ours.__name__[1:-3]
    x, y = jnp.asarray(rng.normal(size=3)), jnp.asarray(rng.normal(size=3))
    tx, ty = jnp.asarray(rng.normal(size=3)), jnp.asarray(rng.normal(size=3))
    assert name in str(jax.make_jaxpr(ours)(x, y))
    F = fx.lift(ours)
    loss = lambda g: lambda a, b: g(a, b).sum()  # noqa: E731

    @jax.jit
    def run(x, y, tx, ty):
        got = (fx.jvp(F, (x, y), (tx, ty)), fx.vjp(F, x, y)[1](tx),
               fx.grad(loss(F), argnums=(0, 1))(x, y), fx.hessian(loss(F))(x, y),
               fx.vmap(F, in_dims=(0, None))(jnp.stack([x, tx]), y),
               fx.vmap(fx.grad(loss(F)))(jnp.stack([x, tx]), jnp.stack([y, ty])))
        want = (jax.jvp(f, (x, y), (tx, ty)), jax.vjp(f, x, y)[1](tx),
                jax.grad(loss(f), argnums=(0, 1))(x, y), jax.hessian(loss(f))(x, y),
                jax.vmap(f, in_axes=(0, None))(jnp.stack([x, tx]), y),
                jax.vmap(jax.grad(loss(f)))(jnp.stack([x, tx]), jnp.stack([y, ty])))
        return got, want

    got, want = run(x, y, tx, ty)
    close(got, want)
    # eagerly too (a transfer, a barrier, a sink on concrete arrays)
    close(fx.grad(loss(F))(x, y), jax.grad(loss(f))(x, y))


def test_functx_lax_optimization_barrier_and_dce_sink_on_functx_values():
    x = jnp.asarray(rng.normal(size=3))

    def f(y):
        a, b = fx.lax.optimization_barrier((y * 2.0, fx.numpy.sin(y)))
        assert fx.lax.dce_sink(a) is None
        return (a * b).sum()

    close(fx.grad(f)(x), jax.grad(lambda y: (2.0 * y * jnp.sin(y)).sum())(x))


def test_device_put_with_donation_has_no_reverse_mode():
    x = jnp.asarray(rng.normal(size=3))
    f = fx.lift(lambda y: jax.device_put(jnp.sin(y), donate=True))
    close(fx.jvp(f, (x,), (x,)), (jnp.sin(x), jnp.cos(x) * x))
    with pytest.raises(MissingRuleError, match="`device_put`.*donate"):
        fx.vjp(f, x)[1](x)


# --------------------------------------------------------------------------
# pure_callback: runs when the program runs; vmap per vmap_method as JAX


class _Recorder:
    """A host function that records the shapes it is called with."""

    def __init__(self):
        self.shapes = []

    def __call__(self, a, b):
        a, b = np.asarray(a), np.asarray(b)
        self.shapes.append((a.shape, b.shape))
        return (np.sin(a) * b).astype(a.dtype)


def _callback_fn(record, vmap_method):
    def f(x, y):
        out = jax.ShapeDtypeStruct(jnp.broadcast_shapes(x.shape, y.shape), x.dtype)
        return jax.pure_callback(record, out, x, y, vmap_method=vmap_method) + x

    return f


@pytest.mark.parametrize("vmap_method", ["sequential", "sequential_unrolled", "expand_dims",
                                         "broadcast_all", "legacy_vectorized"])
@pytest.mark.slow
def test_pure_callback_vmap_methods_match_jax_results_and_calls(vmap_method):
    xs, y = jnp.asarray(rng.normal(size=(4, 3))), jnp.asarray(rng.normal(size=3))
    ours, theirs = _Recorder(), _Recorder()
    f_ours, f_theirs = _callback_fn(ours, vmap_method), _callback_fn(theirs, vmap_method)
    want = jax.vmap(f_theirs, in_axes=(0, None))(xs, y)
    got = fx.vmap(fx.lift(f_ours), in_dims=(0, None))(xs, y)
    close(got, want)
    assert ours.shapes == theirs.shapes, (ours.shapes, theirs.shapes)
    if vmap_method == "legacy_vectorized":
        return  # (nested, it passes shapes that do not broadcast: (4, 3) and (2, 3))
    # nested vmap, staged by an outer jax.jit: the callback is part of the program
    ours.shapes.clear(), theirs.shapes.clear()
    ys = xs[:2] + 1.0
    want = jax.jit(jax.vmap(jax.vmap(f_theirs, in_axes=(0, None)), in_axes=(None, 0)))(xs, ys)
    got = jax.jit(fx.vmap(fx.vmap(fx.lift(f_ours), in_dims=(0, None)), in_dims=(None, 0)))(xs, ys)
    close(got, want)
    assert sorted(ours.shapes) == sorted(theirs.shapes), (ours.shapes, theirs.shapes)


@pytest.mark.slow
def test_pure_callback_runs_only_when_the_program_runs():
    record = _Recorder()
    f = _callback_fn(record, "sequential")
    x, y = jnp.asarray(rng.normal(size=(2, 3))), jnp.asarray(rng.normal(size=3))
    # staging (lifting, functx transforms inside a JAX trace) calls nothing
    jax.make_jaxpr(fx.vmap(fx.lift(f), in_dims=(0, None)))(x, y)
    jax.eval_shape(fx.lift(f), x[0], y)
    assert record.shapes == []
    # each run calls it: once per batch element, every time
    want = jax.vmap(_callback_fn(_Recorder(), "sequential"), in_axes=(0, None))(x, y)
    step = fx.jit(fx.vmap(fx.lift(f), in_dims=(0, None)))
    for k in (1, 2):
        close(step(x, y), want)
        assert len(record.shapes) == 2 * k, record.shapes
    # a callback of constants only, in a branch functx stages: run when the
    # branch is taken, each time (not once, while staging)
    record.shapes.clear()
    ones = jnp.ones(3)
    branch = fx.lift(lambda z: z + _callback_fn(record, "sequential")(ones, ones))
    g = lambda z: fx.lax.cond(z.sum() > 0, branch, lambda w: w, z)  # noqa: E731
    close(g(-jnp.abs(y)), -jnp.abs(y))
    assert record.shapes == []
    for k in (1, 2):
        close(g(jnp.abs(y)), jnp.abs(y) + np.sin(1.0) + 1.0)
        assert len(record.shapes) == k, record.shapes


def test_pure_callback_has_no_derivative_or_default_vmap():
    x, y = jnp.asarray(rng.normal(size=3)), jnp.asarray(rng.normal(size=3))
    F = fx.lift(_callback_fn(_Recorder(), "sequential"))
    with pytest.raises(MissingRuleError, match="jvp.*`pure_callback`"):
        fx.jvp(F, (x, y), (x, y))
    with pytest.raises(MissingRuleError, match="`pure_callback`"):
        fx.grad(lambda a: F(a, y).sum())(x)
    # only y differentiated, and the callback does not see it: no derivative needed
    close(fx.grad(lambda b: (F(x, fx.lax.stop_gradient(b)) * b).sum())(y),
          F(x, y))
    G = fx.lift(_callback_fn(_Recorder(), None))
    with pytest.raises(MissingRuleError, match="vmap.*`pure_callback`.*vmap_method"):
        fx.vmap(G, in_dims=(0, None))(jnp.stack([x, y]), y)


@pytest.mark.slow
def test_pure_callback_with_integer_results_has_a_zero_derivative():
    # JAX refuses any derivative through a callback; an integer result has
    # a zero tangent whatever the callback does
    def f(x):
        idx = jax.pure_callback(lambda a: np.argsort(a).astype(np.int32),
                                jax.ShapeDtypeStruct(x.shape, jnp.int32), x,
                                vmap_method="sequential")
        return (x[idx] * jnp.arange(3.0)).sum()

    x = jnp.asarray(rng.normal(size=3))
    close(fx.grad(fx.lift(f))(x), jax.grad(lambda a: (a[jnp.argsort(a)] * jnp.arange(3.0)).sum())(x))


# --------------------------------------------------------------------------
# Primitives the inventory of jax.lax found (python -m functx.coverage)


@pytest.mark.slow
def test_ragged_dot_under_every_transform_matches_jax():
    lhs, rhs = jnp.asarray(rng.normal(size=(5, 3))), jnp.asarray(rng.normal(size=(2, 3, 4)))
    groups = jnp.array([2, 3], jnp.int32)
    f = lambda a, b: lax.ragged_dot(a, b, groups)  # noqa: E731
    F = fx.lift(f)
    loss = lambda g: lambda a, b: (g(a, b) ** 2).sum()  # noqa: E731
    lhs2, rhs2 = jnp.stack([lhs, 2 * lhs]), jnp.stack([rhs, -rhs])

    @jax.jit
    def run(lhs, rhs, lhs2, rhs2):
        got = (fx.jvp(F, (lhs, rhs), (lhs2[1], rhs2[1])),
               fx.grad(loss(F), argnums=(0, 1))(lhs, rhs),
               # JAX batches it only with every operand batched: compared with a loop
               fx.vmap(F, in_dims=(0, None))(lhs2, rhs),
               fx.vmap(fx.grad(loss(F), argnums=1), in_dims=(None, 0))(lhs, rhs2))
        want = (jax.jvp(f, (lhs, rhs), (lhs2[1], rhs2[1])),
                jax.grad(loss(f), argnums=(0, 1))(lhs, rhs),
                jnp.stack([f(lhs2[k], rhs) for k in range(2)]),
                jnp.stack([jax.grad(loss(f), argnums=1)(lhs, rhs2[k]) for k in range(2)]))
        return got, want

    got, want = run(lhs, rhs, lhs2, rhs2)
    close(got, want)


@pytest.mark.slow
def test_composite_is_its_decomposition_under_transforms():
    # JAX refuses to differentiate lax.composite; lifting inlines the decomposition
    f = lambda x: lax.composite(lambda y: jnp.sin(y) * y, "functx.test_op")(x)  # noqa: E731
    g = lambda x: jnp.sin(x) * x  # noqa: E731
    x = jnp.asarray(rng.normal(size=3))
    close(fx.grad(lambda y: fx.lift(f)(y).sum())(x), jax.grad(lambda y: g(y).sum())(x))
    close(fx.vmap(fx.jacfwd(fx.lift(f)))(x[:, None]), jax.vmap(jax.jacfwd(g))(x[:, None]))


@pytest.mark.slow
def test_rng_bit_generator_and_scaled_dot_under_vmap():
    # JAX has no batching rule for rng_bit_generator: one key at a time
    keys = jnp.asarray(rng.integers(0, 2**31, size=(3, 4)), jnp.uint32)
    draw = lambda k: lax.rng_bit_generator(k, (2,))  # noqa: E731
    got = fx.vmap(fx.lift(draw))(keys)
    close(list(got), [jnp.stack(z) for z in zip(*[draw(k) for k in keys])])
    m = jnp.asarray(rng.normal(size=(2, 3, 32)), jnp.float32)
    dot = lambda a, b: lax.scaled_dot(a, b)  # noqa: E731
    close(fx.vmap(fx.lift(dot))(m, m.transpose(0, 2, 1)), jax.vmap(dot)(m, m.transpose(0, 2, 1)))
