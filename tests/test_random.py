"""functx.random: explicit keys as jax.random, and torch-style stateful
functions governed by vmap's `randomness` as in torch.func."""

import numpy as np
import pytest

import jax
import jax.numpy as jnp

import functx as fx
import functx.numpy as fnp
from functx import random as fr

XS = jnp.ones((4, 3))


def test_explicit_keys_match_jax_random():
    key = jax.random.PRNGKey(3)
    np.testing.assert_array_equal(fr.normal(key, (3,)), jax.random.normal(key, (3,)))
    keys = fr.split(key, 2)
    np.testing.assert_array_equal(keys, jax.random.split(key, 2))


def test_manual_seed_is_deterministic():
    fr.manual_seed(7)
    a = fr.rand(3)
    b = fr.randn(2, 2)
    fr.manual_seed(7)
    np.testing.assert_array_equal(a, fr.rand(3))
    np.testing.assert_array_equal(b, fr.randn((2, 2)))
    assert not np.array_equal(fr.rand(3), a)  # the generator advances
    assert fr.initial_seed() == 7


@pytest.mark.slow
def test_ranges_shapes_and_dtypes():
    fr.manual_seed(0)
    u = fr.rand(1000)
    assert u.shape == (1000,) and bool(jnp.all((u >= 0) & (u < 1)))
    n = fr.randn(2000)
    assert abs(float(n.mean())) < 0.1 and abs(float(n.std()) - 1) < 0.1
    r = fr.randint(2, 5, (100,))
    assert r.shape == (100,) and int(r.min()) >= 2 and int(r.max()) < 5
    assert fr.randint(3, (4,)).shape == (4,)
    p = fr.randperm(6)
    np.testing.assert_array_equal(np.sort(np.asarray(p)), np.arange(6))
    b = fr.bernoulli(jnp.full((1000,), 0.25))
    assert b.dtype == jnp.full((1,), 0.25).dtype and abs(float(b.mean()) - 0.25) < 0.06


def test_vmap_randomness_different_and_same():
    fr.manual_seed(1)
    diff = fx.vmap(lambda x: x * fr.rand(3), randomness="different")(XS)
    rows = np.asarray(diff)
    assert not np.allclose(rows[0], rows[1])
    same = fx.vmap(lambda x: x * fr.rand(3), randomness="same")(XS)
    rows = np.asarray(same)
    assert np.allclose(rows, rows[0])


@pytest.mark.slow
def test_nested_vmap_randomness():
    fr.manual_seed(2)
    A = jnp.ones((2, 3, 4))
    out = fx.vmap(fx.vmap(lambda x: x + fr.randn(4), randomness="different"), randomness="same")(A)
    out = np.asarray(out)
    assert np.allclose(out[0], out[1])  # outer level shares
    assert not np.allclose(out[0, 0], out[0, 1])  # inner level differs
    out = fx.vmap(fx.vmap(lambda x: x + fr.randn(4), randomness="different"), randomness="different")(A)
    assert not np.allclose(np.asarray(out)[0], np.asarray(out)[1])


@pytest.mark.slow
def test_randperm_and_bernoulli_under_vmap():
    fr.manual_seed(3)
    perms = np.asarray(fx.vmap(lambda x: fr.randperm(5), randomness="different")(XS))
    for p in perms:
        np.testing.assert_array_equal(np.sort(p), np.arange(5))
    probs = jnp.stack([jnp.zeros(200), jnp.ones(200)])
    draws = np.asarray(fx.vmap(fr.bernoulli, randomness="different")(probs))
    assert draws[0].sum() == 0 and draws[1].sum() == 200


@pytest.mark.slow
def test_dropout_modes():
    fr.manual_seed(4)
    x = jnp.ones((4, 1000))
    np.testing.assert_array_equal(fx.nn.dropout(x, 0.3, training=False), x)
    np.testing.assert_array_equal(fx.nn.dropout(x, 0.0), x)
    y = np.asarray(fx.nn.dropout(x, 0.3))
    assert np.all((y == 0.0) | np.isclose(y, 1 / 0.7))
    assert abs(y.mean() - 1.0) < 0.1
    same = np.asarray(fx.vmap(lambda r: fx.nn.dropout(r, 0.5), randomness="same")(x))
    assert np.array_equal(same[0], same[1])
    diff = np.asarray(fx.vmap(lambda r: fx.nn.dropout(r, 0.5), randomness="different")(x))
    assert not np.array_equal(diff[0], diff[1])
    with pytest.raises(fx.FunctxValueError, match="p must be in"):
        fx.nn.dropout(x, 1.5)


def test_dropout_under_grad_scales_the_gradient_by_the_mask():
    fr.manual_seed(5)
    x = jnp.arange(1.0, 9.0)
    state = fr.get_rng_state()
    g = fx.grad(lambda x: fnp.sum(fx.nn.dropout(x, 0.5)))(x)
    fr.set_rng_state(state)
    mask = np.asarray(fx.nn.dropout(jnp.ones(8), 0.5))
    np.testing.assert_allclose(g, mask)


def test_chunked_vmap_with_randomness():
    fr.manual_seed(6)
    out = np.asarray(fx.vmap(lambda x: x * fr.rand(3), randomness="different", chunk_size=2)(XS))
    assert out.shape == (4, 3) and len({tuple(r) for r in out}) == 4
