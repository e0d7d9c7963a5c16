"""NOTE [staged backward passes] (functx/interpreters/reverse.py): a tape
recorded inside other eager transforms is transposed as one staged
`jit_call` once its structure repeats. Results equal JAX's and the
per-equation path's; nothing staged by functx.jit/make_graph changes; the
cache holds no value of the calls that filled it. NOTE [fused steps above
another transform] (functx/interpreters/deferred.py): the forward steps of
such a reverse interpreter are bound as one call each, with the same
results bit for bit as the jvp rules'."""

import gc
import weakref

import numpy as np
import pytest

import jax
import jax.numpy as jnp

import functx as fx
import functx.numpy as fnp
from functx import caches
from warming import warm
from functx.interpreters import reverse

rng = np.random.default_rng(3)
W = jnp.asarray(rng.uniform(-1, 1, (5, 3)))
XS = jnp.asarray(rng.uniform(-1, 1, (4, 3)))
YS = jnp.asarray(rng.uniform(-1, 1, (4, 5)))


def loss(w, x, y):
    return jnp.mean((jnp.tanh(w @ x) - y) ** 2) + jnp.sum(jax.nn.relu(w)) / 7.0


def adapted(w, x, y):  # two inner SGD steps, then the loss (MAML's shape)
    for _ in range(2):
        w = w - 0.1 * fx.grad(loss)(w, x, y)
    return loss(w, x, y)


def adapted_jax(w, x, y):
    for _ in range(2):
        w = w - 0.1 * jax.grad(loss)(w, x, y)
    return loss(w, x, y)


def _warm(fn, *args, calls=4):
    """Call until the steps and the queue's program are compiled."""
    return warm(fn, *args, calls=calls)


def _staged_entries():
    return reverse._staged.info()["entries"]


CASES = {
    "vmap(grad)": (lambda: fx.vmap(fx.grad(loss), in_dims=(None, 0, 0)),
                   lambda: jax.vmap(jax.grad(loss), in_axes=(None, 0, 0))),
    "grad(vmap(grad)) (MAML)": (
        lambda: fx.grad(lambda w, x, y: fnp.mean(fx.vmap(adapted, in_dims=(None, 0, 0))(w, x, y))),
        lambda: jax.grad(lambda w, x, y: jnp.mean(jax.vmap(adapted_jax, in_axes=(None, 0, 0))(w, x, y)))),
    "hessian": (lambda: lambda w, x, y: fx.hessian(loss)(w, x[0], y[0]),
                lambda: lambda w, x, y: jax.hessian(loss)(w, x[0], y[0])),
    "jacfwd(grad)": (lambda: lambda w, x, y: fx.jacfwd(fx.grad(loss), argnums=1)(w, x[0], y[0]),
                     lambda: lambda w, x, y: jax.jacfwd(jax.grad(loss), argnums=1)(w, x[0], y[0])),
}


@pytest.mark.parametrize("case", list(CASES))
def test_staged_transpose_equals_jax_and_the_per_equation_path(case):
    make, make_jax = CASES[case]
    fn = make()
    reverse._staged.clear()
    first = fn(W, XS, YS)  # per equation: the structure is new
    warm = _warm(fn, W, XS, YS)
    assert _staged_entries() >= 1, "no tape was transposed as one staged call"
    expected = make_jax()(W, XS, YS)
    for out in (first, warm, fn(W, XS, YS)):
        np.testing.assert_allclose(np.asarray(out), np.asarray(expected), rtol=1e-11, atol=1e-13)


def test_staged_transpose_not_used_while_staging():
    """Under functx.jit / make_graph the inner tape's transpose stays as its
    equations (the program is compiled whole anyway, and graph analyses see
    the products)."""
    fn = fx.vmap(fx.grad(loss), in_dims=(None, 0, 0))
    _warm(fn, W, XS, YS)
    assert _staged_entries() >= 1
    graph = fx.make_graph(fn)(W, XS, YS)
    prims = {e.prim.name for e in graph.eqns}
    assert "jit_call" not in prims and "dot_general" in prims
    np.testing.assert_allclose(np.asarray(fx.jit(fn)(W, XS, YS)), np.asarray(fn(W, XS, YS)),
                               rtol=1e-12)


def test_staged_transpose_holds_no_value_of_a_call():
    fn = fx.vmap(fx.grad(loss), in_dims=(None, 0, 0))
    _warm(fn, W, XS, YS)
    x = jnp.asarray(rng.uniform(-1, 1, (4, 3)))
    ref = weakref.ref(x)
    fn(W, x, YS)
    del x
    gc.collect()
    assert ref() is None, "a cache kept an input of the call alive"
    for value in reverse._staged.entries.values():
        transposed, _ = value
        for eqn in transposed.eqns:
            for v in eqn.inputs:
                assert type(getattr(v, "value", None)) not in fx.core.TRACER_TYPES


def _bits(tree):
    return [np.asarray(x).tobytes() for x in jax.tree_util.tree_leaves(tree)]


@pytest.mark.parametrize("case", list(CASES))
def test_a_grad_above_another_transform_binds_its_fused_steps(case, monkeypatch):
    """Warm, the reverse interpreter above vmap / jvp binds each fused
    step's primal part as one call instead of running the jvp rule (fewer
    rules run); the
    results are those of the rules bit for bit (each call of `fn` taken
    once with the steps refused, once with them) and equal JAX's."""
    make, make_jax = CASES[case]
    fn = make()
    _warm(fn, W, XS, YS, calls=6)
    bound = []
    bind_step = reverse.bind_eager_call

    def spy(graph, args, backward, refuse=False):
        out = None if refuse and not backward else bind_step(graph, args, backward)
        if not backward:
            bound.append(out is not None)
        return out

    rule_runs = [0]
    apply_rule = reverse.ReverseInterpreter.apply_rule

    def counted(self, *args):
        rule_runs[0] += 1
        return apply_rule(self, *args)

    monkeypatch.setattr(reverse.ReverseInterpreter, "apply_rule", counted)
    runs = {}
    for refuse in (True, False, True, False):
        monkeypatch.setattr(reverse, "bind_eager_call",
                            lambda g, a, backward, r=refuse: spy(g, a, backward, r))
        bound.clear()
        rule_runs[0] = 0
        out = fn(W, XS, YS)
        runs.setdefault(refuse, []).append((tuple(_bits(out)), rule_runs[0], any(bound)))
    assert len({bits for bits, _, _ in runs[True] + runs[False]}) == 1  # bit for bit
    assert all(steps_bound for _, _, steps_bound in runs[False]), "no step was bound as one call"
    assert max(n for _, n, _ in runs[False]) < min(n for _, n, _ in runs[True]), runs
    np.testing.assert_allclose(np.asarray(out), np.asarray(make_jax()(W, XS, YS)),
                               rtol=1e-11, atol=1e-13)


def _chained(w, x):  # jnp.clip is a jax.jit function: a call inside the eager steps
    v = jnp.clip(w / (1 + x * x), -3.0, 3.0)
    u = jnp.clip((w * x) / (1 + v * v), -3.0, 3.0)
    return jnp.sum(jnp.clip(v * u, -3.0, 3.0) * u)


def test_a_gradient_of_a_gradient_adds_its_cotangents_in_one_order():
    """NOTE [transposed as if inlined]: the outer grad transposes the inner
    one's staged backward pass and the steps bound as calls equation by
    equation, as the first calls (no calls yet) do, so cotangents that
    reach a value from several uses add up in the same order and the bits
    agree (a sum grouped otherwise differed in the last bit from the fourth
    call on). Equal to JAX's too."""
    fn = fx.grad(lambda w, x: fnp.sum(fx.grad(_chained)(w, x) ** 2))
    w, x = (jnp.asarray(np.random.default_rng(0).uniform(-1, 1, (2, 8, 8))))
    bits = set()
    for _ in range(6):  # the first call's bits and each later stage's
        bits.add(tuple(_bits(fn(w, x))))
        caches.wait_for_compiles()
    assert len(bits) == 1
    want = jax.grad(lambda w, x: jnp.sum(jax.grad(_chained)(w, x) ** 2))(w, x)
    np.testing.assert_allclose(np.asarray(fn(w, x)), np.asarray(want), rtol=1e-12)
