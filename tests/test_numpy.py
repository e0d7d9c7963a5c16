"""functx.numpy / functx.nn / functx.lax as drop-ins for their JAX
namesakes, functx values as jax.Array look-alikes, and lifting."""

import collections

import equinox as eqx
import numpy as np
import pytest

import jax
import jax.numpy as jnp
from jax import tree_util

import functx as fx
import functx.numpy as fnp
from functx.numpy import _BINARY, _UNARY


def close(a, b, rtol=1e-6):
    la, ta = tree_util.tree_flatten(a)
    lb, tb = tree_util.tree_flatten(b)
    assert ta == tb, (ta, tb)
    for x, y in zip(la, lb):
        assert np.shape(x) == np.shape(y), (np.shape(x), np.shape(y))
        if np.asarray(y).dtype == jax.dtypes.float0:  # JAX's tangent of a non-float value
            assert not np.any(np.asarray(x))
            continue
        assert np.asarray(x).dtype == np.asarray(y).dtype, (np.asarray(x).dtype, np.asarray(y).dtype)
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=rtol, atol=1e-12)


rng = np.random.default_rng(0)
A = jnp.asarray(rng.uniform(0.2, 0.9, (4, 3)))
B = jnp.asarray(rng.uniform(0.2, 0.9, (4, 3)))
AS = jnp.asarray(rng.uniform(0.2, 0.9, (2, 4, 3)))


def _prims(jaxpr):
    out = []
    for e in jaxpr.eqns:
        sub = e.params.get("jaxpr")
        if sub is not None:
            out += _prims(sub.jaxpr if hasattr(sub, "jaxpr") else sub)
        else:
            out.append(e.primitive.name)
    return out


_NP_TO_PRIM = {
    "arcsin": "asin", "arccos": "acos", "arctan": "atan", "arcsinh": "asinh", "arccosh": "acosh",
    "arctanh": "atanh", "absolute": "abs", "negative": "neg", "subtract": "sub", "multiply": "mul",
    "divide": "div", "true_divide": "div", "maximum": "max", "minimum": "min", "arctan2": "atan2",
    "equal": "eq", "not_equal": "ne", "less": "lt", "less_equal": "le", "greater": "gt",
    "greater_equal": "ge",
}


@pytest.mark.parametrize("name", sorted(_UNARY) + sorted(_BINARY))
def test_direct_binding_is_the_jax_numpy_primitive(name):
    """The fast path binds exactly the primitive jax.numpy emits for float32
    arrays, so it gives the same result."""
    fn = getattr(jnp, name)
    args = (jnp.ones(3, jnp.float32),) * (1 if name in _UNARY else 2)
    prims = _prims(jax.make_jaxpr(fn)(*args).jaxpr)
    assert prims == [_NP_TO_PRIM.get(name, name)], prims


_SHAPES = [((3, 4), (1, 4)), ((3, 1), (1, 4)), ((2, 3, 4), (1, 3, 1))]
_RANKS = [((3, 4), (4,)), ((4,), (2, 3, 4)), ((2, 3, 4), (3, 1))]
_MATMULS = [((3, 4), (4, 2)), ((4,), (4, 2)), ((3, 4), (4,)), ((4,), (4,)), ((2, 3, 4), (4, 5))]


@pytest.mark.parametrize("name,shapes,promote", [("add", s, False) for s in _SHAPES]
                         + [("add", s, True) for s in _RANKS] + [("less", _RANKS[0], True)]
                         + [("matmul", s, False) for s in _MATMULS])
def test_fast_paths_of_broadcasting_and_matmul(name, shapes, promote):
    """Operands of different shapes (size-1 broadcasting, and jax.numpy's
    rank promotion where `jax_numpy_rank_promotion` allows it) and `@` with
    a vector or matrix on the right bind their primitives directly (no
    lifting), with JAX's results bit for bit under vmap and grad; where the
    option raises (this suite sets it), rank promotion raises as in
    jax.numpy."""
    from functx import lifting

    jfn = getattr(jnp, name)
    xs = [jnp.asarray(rng.standard_normal(s), jnp.float32) for s in shapes]
    lifted = []
    real = lifting._CACHE.get
    counting = []

    def fn(x, y):
        counting.append(True)
        try:
            return getattr(fnp, name)(x, y)
        finally:
            counting.pop()

    def run():
        got = fx.vmap(fn, in_dims=(0, None))(jnp.stack([xs[0], -xs[0]]), xs[1])
        want = jax.vmap(jfn, in_axes=(0, None))(jnp.stack([xs[0], -xs[0]]), xs[1])
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
        if name != "less":
            got = fx.grad(lambda x, y: fn(x, y).sum(), argnums=(0, 1))(*xs)
            want = jax.grad(lambda x, y: jfn(x, y).sum(), argnums=(0, 1))(*xs)
            for a, b in zip(got, want):
                np.testing.assert_array_equal(np.asarray(a), np.asarray(b))

    with jax.numpy_rank_promotion("allow"):
        try:
            lifting._CACHE.get = lambda key: (counting and lifted.append(key)) or real(key)
            run()
        finally:
            del lifting._CACHE.get
    assert not lifted, lifted
    if promote:
        with jax.numpy_rank_promotion("raise"), pytest.raises(ValueError, match="rank_promotion"):
            fx.vmap(fn, in_dims=(0, None))(xs[0][None], xs[1])


def test_no_transform_calls_jax_numpy_directly():
    assert fnp.sin(A) is not None
    close(fnp.sin(A), jnp.sin(A))
    close(fnp.einsum("ij,kj->ik", A, B), jnp.einsum("ij,kj->ik", A, B))
    assert fnp.float32 is jnp.float32 and fnp.pi == jnp.pi
    assert fnp.linalg.norm is not None and fnp.fft.fft is not None


PLAIN_CALLS = [
    ("sin", lambda np_: np_.sin(A)),
    ("add", lambda np_: np_.add(A, B)),
    ("add_scalar", lambda np_: np_.add(A, 2.0)),
    ("sum_axis_tuple", lambda np_: np_.sum(A, axis=(0, 1))),
    ("reshape", lambda np_: np_.reshape(A, (3, 4))),
    ("transpose", lambda np_: np_.transpose(A, (1, 0))),
    ("stack_list", lambda np_: np_.stack([A, B], axis=-1)),
    ("concatenate_tuple", lambda np_: np_.concatenate((A, B))),
    ("pad_nested", lambda np_: np_.pad(A, ((1, 0), (0, 2)))),
    ("einsum", lambda np_: np_.einsum("ij,kj->ik", A, B)),
    ("add_outer", lambda np_: np_.add.outer(A[0], B[0])),
    ("linalg_norm", lambda np_: np_.linalg.norm(A, axis=1)),
]


@pytest.mark.parametrize("name,call", PLAIN_CALLS, ids=[c[0] for c in PLAIN_CALLS])
def test_plain_calls_do_not_lift(name, call, monkeypatch):
    """NOTE [plain calls]: without functx values, containers of arrays and
    numbers included, a functx.numpy function calls jax.numpy directly."""
    def lifted(fn, args, kwargs):
        raise AssertionError(f"{name}: a call without functx values was lifted")

    monkeypatch.setattr(fnp, "_call_lifted", lifted)
    close(call(fnp), call(jnp))


@pytest.mark.slow
def test_functx_values_inside_named_tuples_are_lifted():
    Pair = collections.namedtuple("Pair", "a b")

    def f(np_):
        return lambda v: np_.stack(Pair(v, 2 * v), axis=0).sum(0)

    close(fx.vmap(f(fnp))(A), jax.vmap(f(jnp))(A))
    close(fx.grad(lambda v: f(fnp)(v).sum())(A[0]), jax.grad(lambda v: f(jnp)(v).sum())(A[0]))


@pytest.mark.slow
def test_ufunc_methods_and_properties():
    """jax.numpy's ufuncs (add, multiply, ...) are objects with methods;
    functx's versions have the same methods, under transforms too."""
    for attr in ("nin", "nout", "nargs", "identity"):
        assert getattr(fnp.add, attr) == getattr(jnp.add, attr)
        assert getattr(fnp.multiply, attr) == getattr(jnp.multiply, attr)

    def f(np_):
        def g(v):
            return (np_.multiply.reduce(v) + np_.add.accumulate(v).sum()
                    + np_.add.outer(v, v).sum() + np_.add.at(v, 0, v[1], inplace=False).sum()
                    + np_.maximum.reduce(v))
        return g

    close(f(fnp)(A[0]), f(jnp)(A[0]))
    close(fx.grad(f(fnp))(A[0]), jax.grad(f(jnp))(A[0]))
    close(fx.vmap(f(fnp))(A), jax.vmap(f(jnp))(A))
    close(fx.vmap(fx.grad(f(fnp)))(A), jax.vmap(jax.grad(f(jnp)))(A))


@pytest.mark.slow
def test_frompyfunc_ufuncs_accept_functx_values():
    def f(np_):
        u = np_.frompyfunc(lambda a, b: a * b + np_.sin(a), 2, 1, identity=0.0)
        return lambda v: u(v, 2 * v).sum() + u.reduce(v) + u.outer(v, v).sum()

    assert fnp.frompyfunc(jnp.add, 2, 1).nin == 2
    close(fx.grad(f(fnp))(A[0]), jax.grad(f(jnp))(A[0]))
    close(fx.vmap(fx.grad(f(fnp)))(A), jax.vmap(jax.grad(f(jnp)))(A))


FUNCTIONS = [
    ("sum", lambda x: fnp.sum(x, axis=0), lambda x: jnp.sum(x, axis=0)),
    ("mean_keepdims", lambda x: fnp.mean(x, axis=1, keepdims=True), lambda x: jnp.mean(x, axis=1, keepdims=True)),
    ("reshape", lambda x: fnp.reshape(x, (3, 4)), lambda x: jnp.reshape(x, (3, 4))),
    ("concatenate", lambda x: fnp.concatenate([x, x * 2], axis=0), lambda x: jnp.concatenate([x, x * 2], axis=0)),
    ("where", lambda x: fnp.where(x > 0.5, x, 0.0), lambda x: jnp.where(x > 0.5, x, 0.0)),
    ("einsum", lambda x: fnp.einsum("ij,ij->i", x, x), lambda x: jnp.einsum("ij,ij->i", x, x)),
    ("matmul", lambda x: fnp.matmul(x.T, x), lambda x: jnp.matmul(x.T, x)),
    ("solve", lambda x: fnp.linalg.solve(x.T @ x + fnp.eye(3), x[0]),
     lambda x: jnp.linalg.solve(x.T @ x + jnp.eye(3), x[0])),
    ("norm", lambda x: fnp.linalg.norm(x, axis=1), lambda x: jnp.linalg.norm(x, axis=1)),
    ("cumsum", lambda x: fnp.cumsum(x, axis=1), lambda x: jnp.cumsum(x, axis=1)),
    ("sort", lambda x: fnp.sort(x, axis=0), lambda x: jnp.sort(x, axis=0)),
    ("take_along_axis", lambda x: fnp.take_along_axis(x, fnp.argsort(x, axis=1), axis=1),
     lambda x: jnp.take_along_axis(x, jnp.argsort(x, axis=1), axis=1)),
    ("pad", lambda x: fnp.pad(x, ((1, 0), (0, 2))), lambda x: jnp.pad(x, ((1, 0), (0, 2)))),
    ("clip", lambda x: fnp.clip(x, 0.3, 0.7), lambda x: jnp.clip(x, 0.3, 0.7)),
    ("softmax", lambda x: fx.nn.softmax(x, axis=-1), lambda x: jax.nn.softmax(x, axis=-1)),
    ("gelu", lambda x: fx.nn.gelu(x), lambda x: jax.nn.gelu(x)),
    ("logsumexp", lambda x: fx.nn.logsumexp(x), lambda x: jax.nn.logsumexp(x)),
    ("one_hot", lambda x: fx.nn.one_hot(fnp.argmax(x, axis=1), 3) * x,
     lambda x: jax.nn.one_hot(jnp.argmax(x, axis=1), 3) * x),
    ("lax_stop_gradient", lambda x: fx.lax.stop_gradient(x) * x, lambda x: jax.lax.stop_gradient(x) * x),
    ("stack_split", lambda x: fnp.stack(fnp.split(x, 2, axis=0), axis=-1),
     lambda x: jnp.stack(jnp.split(x, 2, axis=0), axis=-1)),
]


@pytest.mark.parametrize(
    "name,f,jf", FUNCTIONS, ids=[p.values[0] if hasattr(p, "values") else p[0] for p in FUNCTIONS]
)
@pytest.mark.slow
def test_numpy_functions_under_transforms(name, f, jf):
    close(fx.vmap(f)(AS), jax.jit(jax.vmap(jf))(AS))
    g = fx.grad(lambda x: fnp.sum(f(x) ** 2))(A)
    close(g, jax.jit(jax.grad(lambda x: jnp.sum(jf(x) ** 2)))(A))


# --------------------------------------------------------------------------
# functx values behave like jax.Array


def _array_program(x, y):
    """Exercises operators, methods, properties, indexing and .at on x."""
    parts = [
        x + 1.0, 2.0 - x, x * y, y / x, x ** 2, 2.0 ** x, -x, abs(x - 0.5), x // 0.3, x % 0.3,
        x @ y.T, (x > 0.5) * 1.0, (x <= y) * 1.0, x == x, x != y,
        x.sum(), x.mean(axis=0), x.max(), x.min(axis=1), x.prod(), x.std(), x.var(axis=0),
        x.reshape(3, 4), x.reshape((2, 6)), x.transpose(), x.T, x.astype(jnp.float32),
        x.dot(y.T), x[None].squeeze(0), x.ravel(), x.flatten(), x.clip(0.3, 0.6), x.round(2),
        x.swapaxes(0, 1), x.cumsum(axis=0), x.argmax(axis=1), x.argsort(axis=0),
        x[0], x[1:3], x[::2, ::-1], x[..., 1], x[None, :, 1], x[jnp.array([0, 2, 2])],
        x[jnp.array([0, 3]), jnp.array([1, 2])], x[:, 0], x[:, [0, 2]],
        x.at[0].set(9.0), x.at[1:3, 1].add(2.0), x.at[jnp.array([0, 0, 2])].add(1.0),
        x.at[:, 0].multiply(3.0), x.at[2].min(0.4), x.at[2].max(0.6), x.at[1].get(),
        x.at[jnp.array([1, 2])].set(y[:2]),
        jnp.asarray([x.shape[0], x.ndim, x.size]) * 1.0,
    ]
    return parts


@pytest.mark.slow
def test_functx_values_behave_like_jax_arrays():
    want = jax.jit(jax.vmap(_array_program))(AS, AS * 0.5)
    got = fx.vmap(_array_program)(AS, AS * 0.5)
    close(got, want)
    jvp_want = jax.jit(lambda x, t: jax.jvp(lambda x: _array_program(x, B), (x,), (t,)))(A, B)
    jvp_got = fx.jvp(lambda x: _array_program(x, B), (A,), (B,))
    close(jvp_got, jvp_want)


@pytest.mark.slow
def test_attributes_and_iteration():
    def f(x):
        assert x.shape == (4, 3) and x.ndim == 2 and x.size == 12 and x.dtype == A.dtype
        assert len(x) == 4
        rows = [r for r in x]
        return fnp.stack(rows[::-1])

    close(fx.vmap(f)(AS), AS[:, ::-1])
    close(fx.grad(lambda x: fnp.sum(f(x) * B))(A), B[::-1])


@pytest.mark.slow
def test_numpy_arrays_and_scalars_on_either_side():
    n = np.asarray(B)

    def f(x):
        return n * x + x * n + 3 * x + x * 3 + 1.5 + x

    close(fx.vmap(f)(AS), jax.vmap(lambda x: n * x + x * n + 3 * x + x * 3 + 1.5 + x)(AS))


@pytest.mark.slow
def test_weak_types_follow_jax():
    got = fx.grad(lambda x: (x * 2.0).astype(jnp.float32).sum())(jnp.asarray(1.0))
    want = jax.grad(lambda x: (x * 2.0).astype(jnp.float32).sum())(jnp.asarray(1.0))
    close(got, want)
    out = fx.vmap(lambda x: x * 2)(jnp.arange(3))
    assert out.dtype == (jnp.arange(3) * 2).dtype


# --------------------------------------------------------------------------
# Lifting


@pytest.mark.slow
def test_lift_caches_per_shape_dtype_and_static_arguments():
    calls = []

    def f(x, *, power):
        calls.append(1)
        return jnp.sum(jnp.sin(x) ** power)

    lf = fx.lift(f)
    g = fx.grad(lambda x, p=2: lf(x, power=p))
    g(A)
    g(A + 1.0)
    assert len(calls) == 1  # second call replays the cached program
    g(jnp.ones(5))
    assert len(calls) == 2  # new shape
    fx.grad(lambda x: lf(x, power=3))(A)
    assert len(calls) == 3  # new static argument
    close(fx.grad(lambda x: lf(x, power=3))(A), jax.grad(lambda x: f(x, power=3))(A))


@pytest.mark.slow
def test_lift_inlines_jit_and_calls_through_custom_jvp():
    @jax.jit
    def inner(x):
        return jnp.tanh(x) * jax.nn.relu(x - 0.5) + jax.nn.softplus(x)

    close(fx.grad(lambda x: fnp.sum(fx.lift(inner)(x)))(A), jax.grad(lambda x: jnp.sum(inner(x)))(A))
    remat = jax.checkpoint(inner)
    close(fx.grad(lambda x: fnp.sum(fx.lift(remat)(x)))(A), jax.grad(lambda x: jnp.sum(inner(x)))(A))
    close(fx.jacfwd(fx.lift(inner))(A[0]), jax.jacfwd(inner)(A[0]))


@pytest.mark.slow
def test_lift_equinox_module_under_vmap_and_grad():
    mlp = eqx.nn.MLP(3, 2, 8, 2, key=jax.random.PRNGKey(0))
    lifted = fx.lift(mlp)
    close(fx.vmap(lifted)(A), jax.vmap(mlp)(A), rtol=1e-5)

    def loss(m, x):
        return fnp.sum(fx.lift(m)(x) ** 2)

    params, static = eqx.partition(mlp, eqx.is_array)
    got = fx.grad(lambda p: loss(eqx.combine(p, static), A[0]))(params)
    want = jax.grad(lambda p: jnp.sum(eqx.combine(p, static)(A[0]) ** 2))(params)
    close(got, want, rtol=1e-5)


def test_lift_without_functx_values_is_a_plain_call():
    calls = []

    def f(x):
        calls.append(1)
        return x + 1

    assert fx.lift(f)(1.0) == 2.0
    assert fx.lift(f)(A) is not None
    assert len(calls) == 2


def test_functions_with_static_results_return_python_values():
    seen = {}

    def f(x):
        seen.update(shape=fnp.shape(x), ndim=fnp.ndim(x), size=fnp.size(x),
                    dtype=fnp.result_type(x), floating=fnp.issubdtype(x.dtype, fnp.floating))
        return x * fnp.size(x)

    close(fx.vmap(f)(AS), AS * 12)
    assert seen == {"shape": (4, 3), "ndim": 2, "size": 12, "dtype": AS.dtype, "floating": True}


@pytest.mark.parametrize("call", [lambda x: x.sum(), lambda x: x.sum(1), lambda x: x.sum(axis=(-1, 0)),
                                  lambda x: fnp.sum(x, 0)],
                         ids=["all", "axis", "negative_tuple", "function"])
def test_sum_of_float_values_is_one_reduce_sum(call):
    """`x.sum(...)` / `functx.numpy.sum` of a float32 functx value binds
    reduce_sum without lifting, with jax.vmap's and jax.grad's results bit
    for bit; float16 (which jax.numpy sums in float32), keywords and bad
    axes take jax.numpy's path and its errors."""
    from functx import lifting

    x = jnp.asarray(rng.standard_normal((2, 3)), jnp.float32)
    xs = jnp.stack([x, -2 * x])
    lifted = []
    real = lifting._CACHE.get
    try:
        lifting._CACHE.get = lambda key: lifted.append(key) or real(key)
        got = fx.vmap(call)(xs), fx.grad(lambda x: (call(x) * 3).mean())(x)
    finally:
        del lifting._CACHE.get
    jcall = {fnp.sum: jnp.sum}.get(call, call)
    want = jax.vmap(call)(xs), jax.grad(lambda x: (call(x) * 3).mean())(x)
    assert len(lifted) == 1, lifted  # mean, in the grad
    for a, b in zip(got, want):
        assert a.dtype == b.dtype
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    half = fx.vmap(lambda x: call(x.astype(jnp.float16)))(xs)
    assert half.dtype == jnp.float16
    np.testing.assert_array_equal(np.asarray(half), np.asarray(
        jax.vmap(lambda x: call(x.astype(jnp.float16)))(xs)))
    with pytest.raises(ValueError, match="out of bounds"):
        fx.vmap(lambda x: x.sum(2))(xs)
    np.testing.assert_array_equal(np.asarray(fx.vmap(lambda x: x.sum(keepdims=True))(xs)),
                                  np.asarray(xs.sum((1, 2), keepdims=True)))


@pytest.mark.parametrize("context", [None, "highest", "bfloat16"])
def test_matmul_takes_the_default_precision_where_it_is_written(context):
    """`@` on functx values bakes `jax.default_matmul_precision` into its
    product as jax.numpy does: eager programs are compiled on the compile
    thread and run when their queue runs, outside the caller's context,
    where XLA would read an unset precision as DEFAULT (TF32 on GPUs)."""
    import contextlib

    from functx.core import aval_of
    from functx.interpreters.staging import stage

    x = jnp.ones((3, 4), jnp.float32)
    y = jnp.ones((4, 2), jnp.float32)
    scope = contextlib.nullcontext() if context is None else jax.default_matmul_precision(context)
    with scope:
        want = [e.params["precision"] for e in jax.make_jaxpr(jnp.matmul)(x, y).eqns
                if e.primitive.name == "dot_general"]
        graph, _ = stage(lambda a, b: [fnp.matmul(a, b), a @ b], [aval_of(x), aval_of(y)])
    got = [e.params["precision"] for e in graph.eqns if e.prim.name == "dot_general"]
    assert got == want * 2, (got, want)
    if context is not None:
        assert want != [None]


def _dot_precisions(graph, out):
    for e in graph.eqns:
        if e.prim.name == "dot_general":
            out.append(e.params["precision"])
        for v in e.params.values():
            for g in v if isinstance(v, (list, tuple)) else [v]:
                if hasattr(g, "eqns"):
                    _dot_precisions(g, out)
    return out


def test_a_precision_context_reaches_programs_staged_before_it():
    """Lifted jax.numpy code (einsum, dot), `functx.lax.scan` bodies and
    `functx.jit` functions are staged once and cached; a `jax.default_matmul_precision` context
    entered later must still reach their products, as it reaches
    jax.jit's (whose caches key on JAX's tracing options)."""
    from functx.core import aval_of
    from functx.interpreters.staging import stage

    x = jnp.ones((3, 3), jnp.float32)
    w = jnp.asarray(rng.standard_normal((3, 3)), jnp.float32)

    def f(c):
        s = fx.lax.scan(lambda h, _: (fnp.tanh(h @ w), None), c, None, length=2)[0]
        return [fnp.einsum("ij,jk->ik", s, w), fnp.dot(s, w), fx.jit(_product)(s, w)]

    def precisions():
        return _dot_precisions(stage(f, [aval_of(x)])[0], [])

    outside = precisions()
    assert outside == [None] * 4, outside
    with jax.default_matmul_precision("highest"):
        want = jax.make_jaxpr(lambda a: jnp.einsum("ij,jk->ik", a, w))(x).eqns
        want = [e.params["precision"] for e in want if e.primitive.name == "dot_general"]
        assert want[0] is not None
        assert precisions() == want * 4
    assert precisions() == outside


def _product(a, b):  # one function: functx.jit stages it once per signature
    return a @ b
