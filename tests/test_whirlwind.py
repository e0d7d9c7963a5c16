"""Every example of torch.func's whirlwind tour
(../shared/reference/torch_func_whirlwind_tour_ar.rst.txt), in functx form,
checked against JAX and, where torch is installed, against torch.func on
the same numbers."""

import numpy as np
import pytest

import jax
import jax.numpy as jnp

import functx as fx
import functx.numpy as fnp
from functx import grad, hessian, jacfwd, jacrev, jvp, vjp, vmap

torch = pytest.importorskip("torch")
tfunc = torch.func

rng = np.random.default_rng(0)


def randn(*shape):
    return jnp.asarray(rng.standard_normal(shape))


def allclose(a, b):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-8)


def test_grad_first_and_second_order():
    x = randn()
    cos_x = grad(lambda x: fnp.sin(x))(x)
    allclose(cos_x, jnp.cos(x))
    neg_sin_x = grad(grad(lambda x: fnp.sin(x)))(x)
    allclose(neg_sin_x, -jnp.sin(x))
    allclose(neg_sin_x, jax.grad(jax.grad(jnp.sin))(x))


def test_vmap_of_a_model():
    batch_size, feature_size = 3, 5
    weights = randn(feature_size)

    def model(feature_vec):
        assert feature_vec.ndim == 1
        return fx.nn.relu(feature_vec.dot(weights))

    examples = randn(batch_size, feature_size)
    result = vmap(model)(examples)
    allclose(result, jax.nn.relu(examples @ weights))
    tw = torch.tensor(np.asarray(weights))
    want = tfunc.vmap(lambda v: v.dot(tw).relu())(torch.tensor(np.asarray(examples)))
    allclose(result, want.numpy())


@pytest.mark.slow
def test_per_sample_gradients():
    batch_size, feature_size = 3, 5

    def model(weights, feature_vec):
        assert feature_vec.ndim == 1
        return fx.nn.relu(feature_vec.dot(weights))

    def compute_loss(weights, example, target):
        y = model(weights, example)
        return ((y - target) ** 2).mean()

    weights = randn(feature_size)
    examples = randn(batch_size, feature_size)
    targets = randn(batch_size)
    inputs = (weights, examples, targets)
    grad_weight_per_example = vmap(grad(compute_loss), in_dims=(None, 0, 0))(*inputs)

    def jloss(w, e, t):
        return ((jax.nn.relu(e.dot(w)) - t) ** 2).mean()

    allclose(grad_weight_per_example, jax.vmap(jax.grad(jloss), in_axes=(None, 0, 0))(*inputs))

    def tloss(w, e, t):
        return ((e.dot(w).relu() - t) ** 2).mean()

    t_inputs = [torch.tensor(np.asarray(a)) for a in inputs]
    want = tfunc.vmap(tfunc.grad(tloss), in_dims=(None, 0, 0))(*t_inputs)
    allclose(grad_weight_per_example, want.numpy())


def test_vjp():
    inputs = randn(3)
    func = fnp.sin
    cotangents = (randn(3),)
    outputs, vjp_fn = vjp(func, inputs)
    vjps = vjp_fn(*cotangents)
    allclose(outputs, jnp.sin(inputs))
    allclose(vjps[0], jax.vjp(jnp.sin, inputs)[1](cotangents[0])[0])
    t_out, t_vjp_fn = tfunc.vjp(torch.sin, torch.tensor(np.asarray(inputs)))
    allclose(vjps[0], t_vjp_fn(torch.tensor(np.asarray(cotangents[0])))[0].numpy())


def test_jvp():
    x = randn(5)
    y = randn(5)
    f = lambda x, y: (x * y)  # noqa: E731
    _, out_tangent = jvp(f, (x, y), (jnp.ones(5), jnp.ones(5)))
    allclose(out_tangent, x + y)
    allclose(out_tangent, jax.jvp(f, (x, y), (jnp.ones(5), jnp.ones(5)))[1])


@pytest.mark.slow
def test_jacrev_jacfwd_and_batched_jacobians():
    x = randn(5)
    jacobian = jacrev(fnp.sin)(x)
    expected = jnp.diag(jnp.cos(x))
    allclose(jacobian, expected)
    xs = randn(64, 5)
    jacobian = vmap(jacrev(fnp.sin))(xs)
    assert jacobian.shape == (64, 5, 5)
    allclose(jacobian, jax.vmap(jax.jacrev(jnp.sin))(xs))
    jacobian = jacfwd(fnp.sin)(x)
    allclose(jacobian, expected)


@pytest.mark.slow
def test_hessians():
    def f(x):
        return fnp.sin(x).sum()

    x = randn(5)
    hessian0 = jacrev(jacrev(f))(x)
    hessian1 = jacfwd(jacrev(f))(x)
    hess = hessian(f)(x)
    want = jax.hessian(lambda x: jnp.sin(x).sum())(x)
    for h in (hessian0, hessian1, hess):
        allclose(h, want)
    allclose(hess, tfunc.hessian(lambda x: x.sin().sum())(torch.tensor(np.asarray(x))).numpy())
