"""A batch handed to an Equinox layer inside a functx transform raises an
error that says Equinox modules take one example and how to batch
(NOTE [Equinox's one-example convention] in functx/errors.py); shape errors
elsewhere keep JAX's message."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import functx
from functx.errors import EquinoxBatchShapeError, FunctxError

IN, OUT, BATCH, MODELS = 3, 2, 5, 4


@pytest.fixture(scope="module")
def mlp():
    return eqx.nn.MLP(IN, OUT, 6, 2, key=jax.random.PRNGKey(0), dtype=jnp.float64)


@pytest.fixture(scope="module")
def xs():
    return jnp.asarray(np.random.default_rng(0).standard_normal((BATCH, IN)))


def assert_explains_batching(err, shape):
    message = str(err.value)
    assert isinstance(err.value, FunctxError)
    assert isinstance(err.value, ValueError) and isinstance(err.value, TypeError)
    assert "Equinox modules take one example" in message
    assert f"input of shape {shape}" in message
    assert "inner vmap over the examples" in message
    # JAX's own message stays in, and the user's line is named.
    assert "dot_general requires contracting dimensions" in message
    assert "test_equinox_errors.py" in message


def test_ensemble_without_inner_vmap(mlp, xs):
    models = [eqx.nn.MLP(IN, OUT, 6, 2, key=k, dtype=jnp.float64)
              for k in jax.random.split(jax.random.PRNGKey(1), MODELS)]
    stacked, buffers = functx.stack_module_state(models)

    def predict(params, buffers, xs):
        return functx.functional_call(models[0], (params, buffers), (xs,))  # no inner vmap

    with pytest.raises(EquinoxBatchShapeError) as err:
        functx.vmap(predict, in_dims=(0, 0, None))(stacked, buffers, xs)
    assert_explains_batching(err, (BATCH, IN))
    assert "eqx.nn.Linear inside eqx.nn.MLP" in str(err.value)

    # The fix the message gives works, and agrees with a loop over models.
    def predict_batched(params, buffers, xs):
        return functx.vmap(lambda x: functx.functional_call(models[0], (params, buffers), (x,)))(xs)

    out = functx.vmap(predict_batched, in_dims=(0, 0, None))(stacked, buffers, xs)
    expected = np.stack([jax.vmap(m)(xs) for m in models])
    np.testing.assert_allclose(out, expected, rtol=1e-12)


def test_grad_of_mlp_on_a_batch(mlp, xs):
    def loss(model, xs):
        return jnp.sum(model(xs) ** 2)

    with pytest.raises(EquinoxBatchShapeError) as err:
        functx.grad(loss)(mlp, xs)
    assert_explains_batching(err, (BATCH, IN))


def test_linear_under_jit_and_grad(xs):
    linear = eqx.nn.Linear(IN, OUT, key=jax.random.PRNGKey(2), dtype=jnp.float64)
    params = functx.named_parameters(linear)

    def loss(params, xs):
        return jnp.sum(functx.functional_call(linear, params, (xs,)))

    with pytest.raises(EquinoxBatchShapeError) as err:
        functx.jit(functx.grad(loss))(params, xs)
    assert_explains_batching(err, (BATCH, IN))
    assert "eqx.nn.Linear (called at" in str(err.value)


def test_one_example_of_the_wrong_size_is_not_called_a_batch():
    linear = eqx.nn.Linear(IN, OUT, key=jax.random.PRNGKey(2), dtype=jnp.float64)
    with pytest.raises(TypeError) as err:
        functx.grad(lambda x: jnp.sum(linear(x)))(jnp.ones(IN + 1))
    assert not isinstance(err.value, EquinoxBatchShapeError)


def test_non_equinox_code_keeps_jax_error(xs):
    w = jnp.ones((OUT, IN))

    def loss(w, xs):
        return jnp.sum(w @ xs)  # the same mistake, without Equinox

    with pytest.raises(TypeError) as ours:
        functx.grad(loss)(w, xs)
    with pytest.raises(TypeError) as theirs:
        jax.grad(loss)(w, xs)
    assert not isinstance(ours.value, FunctxError)
    assert str(ours.value) == str(theirs.value)


def test_outside_transforms_equinox_error_is_unchanged(mlp, xs):
    with pytest.raises(TypeError) as err:
        mlp(xs)
    assert not isinstance(err.value, FunctxError)
