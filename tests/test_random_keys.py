"""JAX's random primitives under functx transforms (primitives/random_prims.py)
and key-typed values (NOTE [key dtypes] in core.py).

vmap over new-style `key<fry>` keys and raw uint32[2] keys (batch axis 0
and 1), over seeds, split / fold_in batched, gradients through
reparameterised samples and gamma, keys passing through transforms as
non-differentiable inputs, functx.jit and an outer jax.jit.

The oracle is JAX's own transform of the same function (jax.vmap over keys
equals the Python loop for JAX's counter-based generator; checked once
eagerly). Each test runs its checks inside one `jax.jit` where it can: XLA
compilation dominates, and every `random_bits` or gamma sampler in a
program costs compile time, so the programs are kept small. Every public
jax.random function, with raw keys, is also swept through all compositions
in tests/op_table_public.py.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import tree_util

import functx as fx
from functx import random as fr
from functx.core import aval_of
from functx.errors import FunctxTypeError
from functx.primitives import random_prims

R = jax.random
KEY = R.key(0)
KEYS = R.split(KEY, 3)  # key<fry>[3]
RAWS = R.split(R.PRNGKey(0), 3)  # uint32[3, 2], the same keys' data
P = jnp.array([0.6, 0.8])


def _is_key(x):
    return jnp.issubdtype(x.dtype, jax.dtypes.prng_key)


def _data(k):
    """Key data of a new-style key; raw keys as they are."""
    return R.key_data(k) if _is_key(k) else k


def _close(got, want, rtol=1e-10, atol=1e-12):
    got_l, got_t = tree_util.tree_flatten(got)
    want_l, want_t = tree_util.tree_flatten(want)
    assert got_t == want_t, (got_t, want_t)
    for g, w in zip(got_l, want_l):
        assert _is_key(g) == _is_key(w), (g.dtype, w.dtype)
        g, w = _data(g), _data(w)
        assert g.shape == w.shape and g.dtype == w.dtype, (g.shape, g.dtype, w.shape, w.dtype)
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=rtol, atol=atol)


# XLA's cheapest CPU settings: these programs are tiny and run once, so
# optimising them costs more than it saves (as in tests/sweep.py).
_CHEAP = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}


def _run(checks):
    """Trace `checks()` (functx runs at trace time) and run it as one
    cheaply compiled XLA program."""
    return jax.jit(checks).lower().compile(_CHEAP)()


def _compare(pairs):
    """pairs: {name: (functx result, oracle)}."""
    for name, (got, want) in pairs.items():
        try:
            _close(got, want)
        except AssertionError as e:
            raise AssertionError(f"{name}: {e}") from None


def _draws(k, mu):
    """Several primitives on one key: bits (normal, permutation's sort keys),
    split, fold_in, clone; key outputs as key data."""
    return {
        "normal": mu + R.normal(k, (2,)),
        "permutation": R.permutation(k, 4),
        "split": _data(R.split(k, 2)),
        "fold_in": _data(R.fold_in(k, 7)),
        "clone": _data(R.clone(k)),
    }


@pytest.mark.slow
def test_vmap_over_keys_matches_jax_vmap():
    """New-style keys (axis 0) and raw keys (axis 0 and 1) give jax.vmap's
    draws for the same keys."""

    def checks():
        want = jax.vmap(_draws, in_axes=(0, None))(KEYS, P)
        draws = fx.lift(_draws)
        return {
            "key, 0": (fx.vmap(draws, in_dims=(0, None))(KEYS, P), want),
            "raw, 0": (fx.vmap(draws, in_dims=(0, None))(RAWS, P), want),
            "raw, 1": (fx.vmap(draws, in_dims=(1, None))(RAWS.T, P), want),
        }

    _compare(_run(checks))


@pytest.mark.slow
def test_eager_vmap_over_keys_matches_loop():
    """Eagerly (no jit): functx.vmap over keys equals the loop over keys;
    keys come out of vmap (out_dims=1) as keys."""
    sample = fx.lift(lambda k, mu: mu + R.normal(k, (2,)))
    loop = jnp.stack([P + R.normal(k, (2,)) for k in KEYS])
    _close(fx.vmap(sample, in_dims=(0, None))(KEYS, P), loop)
    _close(fx.vmap(sample, in_dims=(1, None))(RAWS.T, P), loop)
    split = fx.vmap(fx.lift(lambda k: R.split(k, 2)), out_dims=1)(KEYS)
    assert split.shape == (2, 3) and split.dtype == KEYS.dtype
    _close(split, jnp.stack([R.split(k, 2) for k in KEYS], 1))


@pytest.mark.slow
def test_vmap_over_seeds_split_and_fold_in():
    data = jnp.arange(3)
    seeds = jnp.array([1, 2, 3])
    keys23 = R.split(KEY, (2, 3))

    def checks():
        fold = fx.lift(R.fold_in)
        split = fx.lift(lambda k: R.split(k, 2))
        jsplit = lambda k: R.split(k, 2)
        return {
            "key(seed)": (fx.vmap(fx.lift(R.key))(seeds), jax.vmap(R.key)(seeds)),
            "PRNGKey(seed)": (fx.vmap(fx.lift(R.PRNGKey))(seeds), jax.vmap(R.PRNGKey)(seeds)),
            "fold_in data": (fx.vmap(fold, in_dims=(None, 0))(KEY, data),
                             jax.vmap(R.fold_in, in_axes=(None, 0))(KEY, data)),
            "fold_in both": (fx.vmap(fold)(KEYS, data), jax.vmap(R.fold_in)(KEYS, data)),
            "fold_in raw axis 1": (fx.vmap(fold, in_dims=(1, 0))(RAWS.T, data),
                                   jax.vmap(R.fold_in, in_axes=(1, 0))(RAWS.T, data)),
            "fold_in keys x data": (
                fx.vmap(fx.vmap(fold, in_dims=(0, None)), in_dims=(None, 0))(KEYS, data),
                jax.vmap(jax.vmap(R.fold_in, in_axes=(0, None)), in_axes=(None, 0))(KEYS, data)),
            "split out_dims=1": (fx.vmap(split, out_dims=1)(KEYS),
                                 jax.vmap(jsplit, out_axes=1)(KEYS)),
            "split raw axis 1": (fx.vmap(split, in_dims=1)(RAWS.T),
                                 jax.vmap(jsplit, in_axes=1)(RAWS.T)),
            "split nested": (fx.vmap(fx.vmap(split), in_dims=1)(keys23),
                             jax.vmap(jax.vmap(jsplit), in_axes=1)(keys23)),
            "key equality": (fx.vmap(lambda k: k == KEYS[1])(KEYS),
                             jax.vmap(lambda k: k == KEYS[1])(KEYS)),
            "wrap/unwrap raw axis 1": (
                fx.vmap(fx.lift(lambda d: R.key_data(R.wrap_key_data(d))), in_dims=1)(RAWS.T),
                RAWS),
        }

    _compare(_run(checks))


@pytest.mark.slow
def test_parameters_batched_and_reparameterised_gradients():
    """Unbatched key with batched parameters (any axis); grad, jvp and
    vmap(grad) over keys through reparameterised samples."""
    mus = jnp.stack([P, P + 1, P + 2])  # (3, 2)
    normal = lambda k, mu, s: mu + s * R.normal(k, (2,))
    uniform = lambda k, lo, hi: R.uniform(k, (2,), minval=lo, maxval=hi)
    n_loss = lambda mu, s, k: jnp.sum(jnp.sin(normal(k, mu, s)))
    u_loss = lambda lo, hi, k: jnp.sum(uniform(k, lo, hi) ** 2)

    def checks():
        return {
            "normal mu axis 0, sigma axis 1": (
                fx.vmap(fx.lift(normal), in_dims=(None, 0, 1))(KEY, mus, mus.T),
                jax.vmap(normal, in_axes=(None, 0, 1))(KEY, mus, mus.T)),
            "uniform minval axis 0": (
                fx.vmap(fx.lift(uniform), in_dims=(None, 0, None))(KEY, mus - 2, P),
                jax.vmap(uniform, in_axes=(None, 0, None))(KEY, mus - 2, P)),
            "grad normal": (fx.grad(fx.lift(n_loss), (0, 1))(P, P + 1, KEY),
                            jax.grad(n_loss, (0, 1))(P, P + 1, KEY)),
            "vmap(grad) normal": (
                fx.vmap(fx.grad(fx.lift(n_loss), (0, 1)), in_dims=(None, None, 0))(P, P + 1, KEYS),
                jax.vmap(jax.grad(n_loss, (0, 1)), in_axes=(None, None, 0))(P, P + 1, KEYS)),
            "jvp normal": (fx.jvp(fx.lift(lambda mu: normal(KEY, mu, 2.0)), (P,), (P,)),
                           jax.jvp(lambda mu: normal(KEY, mu, 2.0), (P,), (P,))),
            "grad uniform": (fx.grad(fx.lift(u_loss), (0, 1))(P - 1, P + 1, RAWS[0]),
                             jax.grad(u_loss, (0, 1))(P - 1, P + 1, RAWS[0])),
        }

    _compare(_run(checks))


@pytest.mark.slow
def test_gamma_batched_with_gradient():
    """random_gamma batched over keys and shape parameters (batch axis 1),
    with its gradient in `a` (random_gamma's jvp, transposed; the batched
    random_gamma_grad); an unbatched key; loggamma's gradient (log_space)."""
    a = jnp.array([[0.4, 1.5, 3.0], [2.0, 0.7, 1.0]])  # batch axis 1
    loss = lambda k, a: jnp.sum(R.gamma(k, a) ** 2)
    log_loss = lambda a: jnp.sum(jnp.sin(R.loggamma(KEY, a)))

    def checks():
        got = fx.vmap(fx.grad_and_value(fx.lift(loss), argnums=1), in_dims=(0, 1))(KEYS, a)
        want = jax.vmap(jax.value_and_grad(loss, argnums=1), in_axes=(0, 1))(KEYS, a)
        return {
            "vmap(grad_and_value)": (got, want[::-1]),
            "key unbatched": (fx.vmap(fx.lift(R.gamma), in_dims=(None, 1))(KEY, a),
                              jax.vmap(R.gamma, in_axes=(None, 1))(KEY, a)),
            "loggamma grad": (fx.grad(fx.lift(log_loss))(a[0]), jax.grad(log_loss)(a[0])),
        }

    _compare(_run(checks))


@pytest.mark.slow
def test_random_gamma_grad_derivatives():
    """random_gamma_grad(a, x) = dx/da for a gamma sample x: its value is
    JAX's, and its own derivatives (second derivatives of gamma samples)
    are JAX's forward-mode ones; reverse mode of it satisfies
    <ct, jvp(t)> = <vjp(ct), t> (JAX cannot reverse its while loop). End
    to end, functx's jacrev(grad) of gamma samples equals JAX's
    jacfwd(grad)."""
    from jax._src.lax.special import random_gamma_grad

    a, x = jnp.array([0.7, 3.0]), jnp.array([0.4, 2.5])
    ta, tx, ct = jnp.array([1.0, -0.5]), jnp.array([0.3, 2.0]), jnp.array([0.7, 1.3])
    g = lambda a, x: random_prims.random_gamma_grad_p.bind(a, x, log_space=False)

    f = lambda a: jnp.sum(R.gamma(KEY, a))

    def checks():
        out, t = fx.jvp(g, (a, x), (ta, tx))
        want_out, want_t = jax.jvp(random_gamma_grad, (a, x), (ta, tx))
        _, vjp_fn = fx.vjp(g, a, x)
        ca, cx = vjp_fn(ct)
        return {"value": (out, want_out), "jvp": (t, want_t),
                "<ct, jvp t> = <vjp ct, t>": (jnp.sum(ct * t), jnp.sum(ca * ta) + jnp.sum(cx * tx)),
                "jacrev(grad(gamma))": (fx.jacrev(fx.grad(fx.lift(f)))(a),
                                        jax.jacfwd(jax.grad(f))(a))}

    _compare(_run(checks))


@pytest.mark.slow
def test_keys_as_non_differentiable_inputs():
    """A key next to the parameters (dropout) is a plain input: grad in the
    parameters equals JAX's, per key under vmap too; grad in the key is
    refused; a key output's tangent is float0, as in JAX."""
    w = jnp.array([[0.5, -1.0, 2.0], [1.5, 0.3, -0.7]])
    x = jnp.array([1.0, 2.0, -1.0])

    def loss(w, key):
        h = jnp.tanh(w @ x)
        keep = R.bernoulli(key, 0.5, h.shape)
        return jnp.sum(jnp.where(keep, h / 0.5, 0.0) ** 2)

    fx_loss = fx.lift(loss)

    def checks():
        return {
            "grad, key": (fx.grad(fx_loss)(w, KEY), jax.grad(loss)(w, KEY)),
            "grad, raw key": (fx.grad(fx_loss)(w, RAWS[1]), jax.grad(loss)(w, RAWS[1])),
            "vmap over keys": (fx.vmap(fx.grad(fx_loss), in_dims=(None, 0))(w, KEYS),
                               jax.vmap(jax.grad(loss), in_axes=(None, 0))(w, KEYS)),
        }

    _compare(_run(checks))

    with pytest.raises(FunctxTypeError, match=r"key<fry>.*only floating-point"):
        fx.grad(fx_loss, argnums=1)(w, KEY)

    def keys_out(mu):
        _, k2 = fr.split(fr.fold_in(KEY, 3))
        return mu * 2.0, k2

    (out, k2), (t_out, t_key) = fx.jvp(keys_out, (x,), (x,))
    (j_out, j_k2), (jt_out, jt_key) = jax.jvp(keys_out, (x,), (x,))
    _close((out, k2, t_out), (j_out, j_k2, jt_out))
    assert t_key.dtype == jt_key.dtype == jax.dtypes.float0 and t_key.shape == jt_key.shape


@pytest.mark.slow
def test_jit_and_outer_jax_jit():
    sample = fx.lift(lambda k, mu: mu + R.normal(k, (2,)))
    batched = fx.vmap(sample, in_dims=(0, None))
    want = jax.vmap(lambda k: P + R.normal(k, (2,)))(KEYS)
    # no transform around: the jax.jit path (an outer jax.jit is in every other test)
    _close(fx.jit(batched)(KEYS, P), want)
    # under a functx transform: a staged graph with key inputs, one jit_call
    inner = fx.jit(lambda k, mu: sample(k, mu) * 2.0)
    _close(fx.vmap(inner, in_dims=(0, None))(KEYS, P), 2.0 * want)
    graph = fx.make_graph(fx.vmap(inner, in_dims=(0, None)))(KEYS, P)
    text = str(graph)
    assert "a:key<fry>[3]" in text and "random_bits" in text, text
    assert aval_of(KEYS).str_short() == "key<fry>[3]" and aval_of(KEY).str_short() == "key<fry>[]"


def test_functx_random_namespace():
    """functx.random's explicit-key functions accept functx values."""
    lows = jnp.stack([P, P + 1, P + 2]) - 2

    def checks():
        return {
            "uniform over keys and minval": (
                fx.vmap(lambda k, lo: fr.uniform(k, (2,), minval=lo))(KEYS, lows),
                jax.vmap(lambda k, lo: R.uniform(k, (2,), minval=lo))(KEYS, lows)),
            "split/fold_in": (
                fx.vmap(lambda k, d: fr.split(fr.fold_in(k, d)))(KEYS, jnp.arange(3)),
                jax.vmap(lambda k, d: R.split(R.fold_in(k, d)))(KEYS, jnp.arange(3))),
        }

    _compare(_run(checks))


@pytest.mark.slow
def test_threefry2x32_batched():
    from jax.extend.random import threefry_2x32

    raw = jnp.array([[1, 2], [3, 4], [5, 6]], jnp.uint32)
    counts = jnp.arange(6, dtype=jnp.uint32).reshape(3, 2)

    def checks():
        f = fx.lift(threefry_2x32)
        return {
            "both": (fx.vmap(f)(raw, counts), jax.vmap(threefry_2x32)(raw, counts)),
            "key only": (fx.vmap(f, in_dims=(0, None))(raw, counts[0]),
                         jax.vmap(threefry_2x32, in_axes=(0, None))(raw, counts[0])),
            "counts axis 1": (fx.vmap(f, in_dims=(None, 1))(raw[0], counts.T),
                              jax.vmap(threefry_2x32, in_axes=(None, 1))(raw[0], counts.T)),
        }

    _compare(_run(checks))
