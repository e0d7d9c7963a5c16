"""functx.test_util.check_grads: passes on correct rules and catches wrong
ones (a bad jvp rule, a bad transpose rule)."""

import numpy as np
import pytest

import jax.numpy as jnp
from jax import lax

import functx as fx
import functx.numpy as fnp
from functx.core import Primitive, bind
from functx.interpreters.batching import batch_rules
from functx.interpreters.eval import lower_to_jax
from functx.interpreters.jvp import jvp_rules
from functx.interpreters.reverse import transpose_rules
from functx.interpreters.staging import shape_rules
from functx.primitives import elementwise as ew
from functx.test_util import check_grads

X = jnp.asarray(np.random.default_rng(0).uniform(-1, 1, (3,)))
W = jnp.asarray(np.random.default_rng(1).uniform(-1, 1, (2, 3)))


@pytest.mark.parametrize("order", [1, 2, 3])
@pytest.mark.slow
def test_passes_on_correct_functions(order):
    check_grads(lambda x: fnp.tanh(W @ x) * fnp.sin(x[0]), (X,), order=order)
    check_grads(lambda w, x: fnp.sum(fnp.exp(w @ x)), (W, X), order=min(order, 2), modes=("rev",))
    check_grads(lambda d: d["a"] * fnp.cos(d["b"]), ({"a": X, "b": X * 2},), order=1, modes=("fwd",))


def _unary(name, jvp, transpose=None):
    p = Primitive(name)  # not registered as the functx twin of a JAX primitive
    p.jax = lax.sin_p if transpose is None else lax.mul_p
    lower_to_jax(p)
    shape_rules[p] = lambda a, *rest, **kw: a
    jvp_rules[p] = jvp
    if transpose is not None:
        transpose_rules[p] = transpose
    batch_rules[p] = lambda size, vals, dims, **kw: (bind(p, *vals, **kw), dims[0])
    return p


def test_catches_a_wrong_jvp_rule():
    bad_sin = _unary(
        "test_bad_sin",
        lambda primals, tangents, **kw: (bind(bad_sin, *primals, **kw), ew.mul(tangents[0], ew.sin(primals[0]))),
    )
    with pytest.raises(AssertionError, match="jvp vs finite differences"):
        check_grads(lambda x: bind(bad_sin, x, accuracy=None), (X,), order=1, modes=("fwd",))
    with pytest.raises(AssertionError, match="inner-product"):
        check_grads(lambda x: bind(bad_sin, x, accuracy=None), (X,), order=1, modes=("rev",))


def test_catches_a_wrong_transpose_rule():
    # scale(x, c) = x * c is linear in x; its transpose below forgets c.
    def jvp(primals, tangents, **params):
        x, c = primals
        return bind(scale, x, c, **params), bind(scale, tangents[0], c, **params)

    scale = _unary("test_bad_scale", jvp, transpose=lambda ct, x, c, **p: [ct, None])
    f = lambda x: bind(scale, x, jnp.asarray(3.0), out_dtype=None)  # noqa: E731
    check_grads(f, (X,), order=1, modes=("fwd",))  # forward mode is right
    with pytest.raises(AssertionError, match="inner-product"):
        check_grads(f, (X,), order=1, modes=("fwd", "rev"))


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
@pytest.mark.slow
def test_low_precision_defaults(dtype):
    """bfloat16 and float16 inputs get float16's loose defaults (finite
    differences at 16 bits are coarse): correct functions pass to second
    order, a wrong rule (2 cos x for sin) is still caught. (bfloat16 inputs
    got float32's defaults, and failed on correct functions.)"""
    x, w = jnp.asarray([0.7, 1.3, -1.1], dtype), W.astype(dtype)
    for f in (fnp.sin, fnp.tanh, lambda x: x * x, lambda x: fnp.tanh(w @ x) * fnp.sin(x[0])):
        check_grads(f, (x,), order=2)

    @fx.custom_jvp
    def bad_sin(x):
        return fnp.sin(x)

    bad_sin.defjvps(lambda t, ans, x: 2.0 * fnp.cos(x) * t)
    with pytest.raises(AssertionError, match="jvp vs finite differences"):
        check_grads(bad_sin, (x,), order=1, modes=("fwd",))
