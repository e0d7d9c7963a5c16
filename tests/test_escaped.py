"""Escaped tracers and tracers of another thread (NOTE [escaped tracers] in
functx/core.py): every use raises EscapedTracerError, also where nothing is
computed on the value (a no-op reshape, a transform returning it); copies of
a tracer die with its transform; each thread runs its own transforms."""

import copy
import pickle
import threading

import jax
import jax.numpy as jnp
import pytest

import functx as fx
import functx.numpy as fnp
from functx.errors import ConcretizationError, EscapedTracerError, FunctxError


def _escaped_tracer():
    box = []
    fx.grad(lambda x: (box.append(x), x.sum())[1])(jnp.ones(3))
    return box[0]


_NO_OPS = {
    "reshape to its shape": lambda t: t.reshape(t.shape),
    "astype its dtype": lambda t: t.astype(t.dtype),
    "fnp.asarray": lambda t: fnp.asarray(t),
    "t[...]": lambda t: t[...],
    "squeeze": lambda t: t.squeeze(),
    "ravel": lambda t: t.ravel(),
    "transpose of 1-d": lambda t: t.T,
    "sum over no axes": lambda t: t.sum(axis=()),
    "broadcast_to its shape": lambda t: fnp.broadcast_to(t, t.shape),
    "lax.convert_element_type": lambda t: fx.lax.convert_element_type(t, t.dtype),
    "lift(identity)": lambda t: fx.lift(lambda a: a)(t),
    "jax.jit(identity)": lambda t: jax.jit(lambda a: a)(t),
}

_TRANSFORMS = {
    "jvp output": lambda t: fx.jvp(lambda y: t, (jnp.ones(2),), (jnp.ones(2),)),
    "jvp primal": lambda t: fx.jvp(lambda y: y, (t,), (jnp.ones(3),)),
    "jvp tangent": lambda t: fx.jvp(lambda y: y, (jnp.ones(3),), (t,)),
    "vjp output": lambda t: fx.vjp(lambda y: t, jnp.ones(2)),
    "vjp_fn cotangent": lambda t: fx.vjp(lambda y: y, jnp.ones(3))[1](t),
    "grad aux": lambda t: fx.grad(lambda y: (y.sum(), t), has_aux=True)(jnp.ones(2)),
    "jacrev of a constant": lambda t: fx.jacrev(lambda y: t)(jnp.ones(2)),
    "jacfwd of a constant": lambda t: fx.jacfwd(lambda y: t)(jnp.ones(2)),
    "vmap input": lambda t: fx.vmap(lambda y: y)(t),
    "vmap unbatched output": lambda t: fx.vmap(lambda y: t, out_dims=None)(jnp.ones(2)),
    "linearize output": lambda t: fx.linearize(lambda y: t, jnp.ones(2)),
    "jit output": lambda t: fx.jit(lambda y: t)(jnp.ones(2)),
    "jit input": lambda t: fx.jit(lambda y: y)(t),
}


@pytest.mark.parametrize("use", list(_NO_OPS) + list(_TRANSFORMS))
def test_every_use_of_an_escaped_tracer_raises(use):
    t = _escaped_tracer()
    fn = {**_NO_OPS, **_TRANSFORMS}[use]
    with pytest.raises(EscapedTracerError, match="grad"):
        fn(t)


def _in_thread(fn):
    box = {}

    def target():
        try:
            box["result"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed back to the test
            box["error"] = e

    th = threading.Thread(target=target, name="other")
    th.start()
    th.join()
    return box


_OTHER_THREAD = {
    "arithmetic": lambda x: x * 2,
    "no-op reshape": lambda x: x.reshape(x.shape),
    "returned from vmap": lambda x: fx.vmap(lambda y: x, out_dims=None)(jnp.ones((2, 3))),
    "closed over by vmap": lambda x: fx.vmap(lambda y: y + x)(jnp.ones((2, 3))),
    "closed over by grad": lambda x: fx.grad(lambda y: (y * x).sum())(jnp.ones(3)),
    "input of grad": lambda x: fx.grad(lambda y: y.sum())(x),
    "bool": lambda x: bool(x[0] > 0),
}


@pytest.mark.parametrize("use", list(_OTHER_THREAD))
def test_a_live_tracer_used_on_another_thread_raises(use):
    """The tracer's transform is still running on the main thread; another
    thread's use raises, naming both threads, and leaves the transform's
    result (checked against JAX) unharmed."""
    seen = {}

    def f(x):
        seen.update(_in_thread(lambda: _OTHER_THREAD[use](x)))
        return (x ** 3).sum()

    x = jnp.array([0.5, 1.0, 2.0])
    assert jnp.allclose(fx.grad(f)(x), jax.grad(lambda x: (x ** 3).sum())(x))
    assert "result" not in seen
    assert isinstance(seen["error"], EscapedTracerError)
    assert "'other'" in str(seen["error"]) and "'MainThread'" in str(seen["error"])


@pytest.mark.slow
def test_threads_running_their_own_transforms_agree_with_jax():
    def loss(w, x):
        return jnp.tanh(x @ w).sum()

    w = jnp.linspace(-1.0, 1.0, 12).reshape(4, 3)
    xs = [jnp.full((2, 4), 0.1 * i) for i in range(4)]
    results = [None] * len(xs)

    def work(i):
        for _ in range(3):
            results[i] = fx.vmap(fx.grad(fx.lift(loss)), in_dims=(None, 0))(w, xs[i][:, None])

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(xs))]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    for x, got in zip(xs, results):
        assert jnp.allclose(got, jax.vmap(jax.grad(loss), in_axes=(None, 0))(w, x[:, None]))


def test_a_copied_tracer_dies_with_its_transform_and_pickling_raises():
    kept = {}

    def f(x):
        kept["deep"] = copy.deepcopy(x)
        kept["shallow"] = copy.copy({"x": x})["x"]
        assert kept["deep"] is x  # the traced value itself: no second interpreter
        with pytest.raises(ConcretizationError, match="pickle"):
            pickle.dumps(x)
        return (kept["deep"] * x).sum()

    x = jnp.array([1.0, 2.0])
    assert jnp.allclose(fx.grad(f)(x), 2 * x)
    for t in kept.values():
        with pytest.raises(EscapedTracerError):
            t + 1
        with pytest.raises(EscapedTracerError):
            copy.deepcopy(t)


def test_errors_are_functx_errors():
    t = _escaped_tracer()
    with pytest.raises(FunctxError):
        t.reshape(t.shape)
    with pytest.raises(RuntimeError):
        t.reshape(t.shape)
