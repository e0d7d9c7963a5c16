"""The primitive sweep (STYLE.md "Tests"): every record of tests/op_table.py
through every composition, against JAX's own transforms of the same
function and against central finite differences in float64:

  jvp, vjp, jvp∘vjp, vjp∘vjp, vmap∘vjp, and vmap against a Python loop for
  every batch-dimension placement of every argument.

All compositions of one record run inside a single `jax.jit` (functx runs
at trace time on JAX tracers), so each record costs one XLA compilation.
"""

import numpy as np
import pytest

import jax
import jax.numpy as jnp
from jax import tree_util

import functx as fx
from op_table import OPS, XFAIL

NB = 3  # batch size for the vmap checks
EPS = 1e-5  # finite-difference step (float64)


def _is_float(x):
    return np.issubdtype(x.dtype, np.floating)


def _instances(op, seed):
    rng = np.random.default_rng(seed)
    return [[g(rng) for g in op.gens] for _ in range(NB + 1)]


def _random_like(rng, tree):
    return tree_util.tree_map(
        lambda s: rng.standard_normal(s.shape).astype(s.dtype)
        if np.issubdtype(s.dtype, np.floating) else np.zeros(s.shape, s.dtype),
        tree,
    )


def _placements(args):
    """in_dims tuples: each argument alone at each of its positions, then all
    arguments at 0 and at -1."""
    n = len(args)
    out = []
    for i, a in enumerate(args):
        for d in range(np.ndim(a) + 1):
            dims = [None] * n
            dims[i] = d
            out.append(tuple(dims))
    if n > 1:
        out.append((0,) * n)
        out.append((-1,) * n)
    return out


def _stack_at(xs, d):
    return np.stack(xs, axis=d if d >= 0 else np.ndim(xs[0]) + 1 + d)


def _checks(op, args, tangents, cts, cts2, batched_cts, placements, vmap_inputs):
    """Every composition for one record; returns {name: (functx, oracle)}."""
    diff = op.diff if op.diff is not None else tuple(i for i, a in enumerate(args) if _is_float(a))
    d = tuple(args[i] for i in diff)

    def F(*dargs):
        full = list(args)
        for i, v in zip(diff, dargs):
            full[i] = v
        return op.fn(*full)

    fxF = fx.lift(F)
    res = {}
    if diff:
        _, t = fx.jvp(fxF, d, tangents)
        if op.nondiff:
            res["jvp is zero"] = (t, tree_util.tree_map(jnp.zeros_like, t))
        else:
            res["jvp vs jax.jvp"] = (t, jax.jvp(F, d, tangents)[1])
            if op.fd and all(np.dtype(x.dtype) == np.float64 for x in d):
                plus = F(*[x + EPS * v for x, v in zip(d, tangents)])
                minus = F(*[x - EPS * v for x, v in zip(d, tangents)])
                fd = tree_util.tree_map(lambda a, b: (a - b) / (2 * EPS), plus, minus)
                res["jvp vs finite differences"] = (t, fd)
            _, vjp_fn = fx.vjp(fxF, *d)
            _, jvjp_fn = jax.vjp(F, *d)
            pulled = vjp_fn(cts)
            res["vjp vs jax.vjp"] = (pulled, jvjp_fn(cts))
            if "jvp vs finite differences" in res:
                # <vjp(c), v> == <c, (f(x + eps v) - f(x - eps v)) / 2 eps>
                dot = lambda a, b: sum(jnp.vdot(u, w) for u, w in zip(  # noqa: E731
                    tree_util.tree_leaves(a), tree_util.tree_leaves(b)))
                res["vjp vs finite differences"] = (dot(pulled, tangents), dot(cts, fd))
            res["vmap(vjp) vs jax.vmap(jax.vjp)"] = (fx.vmap(vjp_fn)(batched_cts), jax.vmap(jvjp_fn)(batched_cts))
            if op.order >= 2:
                G = lambda *x: fx.vjp(fxF, *x)[1](cts)  # noqa: E731
                Gj = lambda *x: jax.vjp(F, *x)[1](cts)  # noqa: E731
                res["jvp(vjp)"] = (fx.jvp(G, d, tangents)[1], jax.jvp(Gj, d, tangents)[1])
                res["vjp(vjp)"] = (fx.vjp(G, *d)[1](cts2), jax.vjp(Gj, *d)[1](cts2))
                H = lambda *x: fx.jvp(fxF, x, tangents)[1]  # noqa: E731
                Hj = lambda *x: jax.jvp(F, x, tangents)[1]  # noqa: E731
                res["jvp(jvp)"] = (fx.jvp(H, d, tangents)[1], jax.jvp(Hj, d, tangents)[1])
    if op.batch:
        fx_fn = fx.lift(op.fn)
        for dims, (inputs, loop) in zip(placements, vmap_inputs):
            res[f"vmap in_dims={dims}"] = (fx.vmap(fx_fn, in_dims=dims)(*inputs), loop)
    return res


def _prepare(op):
    inst = _instances(op, seed=hash(op.name) % (2**31))
    args = inst[0]
    rng = np.random.default_rng(1)
    diff = op.diff if op.diff is not None else tuple(i for i, a in enumerate(args) if _is_float(a))
    out_shape = jax.eval_shape(op.fn, *args)
    tangents = tuple(_random_like(rng, jax.ShapeDtypeStruct(np.shape(args[i]), args[i].dtype)) for i in diff)
    cts = _random_like(rng, out_shape)
    cts2 = tuple(_random_like(rng, jax.ShapeDtypeStruct(np.shape(args[i]), args[i].dtype)) for i in diff)
    batched_cts = tree_util.tree_map(
        lambda *xs: np.stack(xs), *[_random_like(rng, out_shape) for _ in range(NB)]
    )
    placements = _placements(args)
    vmap_inputs = []
    for dims in placements:
        inputs = [
            a if dd is None else _stack_at([inst[b + 1][i] for b in range(NB)], dd)
            for i, (a, dd) in enumerate(zip(args, dims))
        ]
        rows = []
        for b in range(NB):
            row = [a if dd is None else inst[b + 1][i] for i, (a, dd) in enumerate(zip(args, dims))]
            rows.append(op.fn(*row))
        loop = tree_util.tree_map(lambda *xs: jnp.stack(xs), *rows)
        vmap_inputs.append((inputs, loop))
    return args, tangents, cts, cts2, batched_cts, placements, vmap_inputs


def _compare(name, got, want, tol):
    got_l, got_t = tree_util.tree_flatten(got)
    want_l, want_t = tree_util.tree_flatten(want)
    assert got_t == want_t, f"{name}: structure {got_t} != {want_t}"
    for g, w in zip(got_l, want_l):
        g, w = np.asarray(g), np.asarray(w)
        if w.dtype == jax.dtypes.float0:
            w = np.zeros(w.shape, g.dtype)
        assert g.shape == w.shape, f"{name}: shape {g.shape} != {w.shape}"
        if np.issubdtype(w.dtype, np.inexact):
            np.testing.assert_allclose(g, w, rtol=tol, atol=tol, err_msg=name)
        else:
            np.testing.assert_array_equal(g, w, err_msg=name)


def _params():
    for op in OPS:
        marks = [pytest.mark.xfail(reason=XFAIL[op.name], strict=True)] if op.name in XFAIL else []
        yield pytest.param(op, id=op.name, marks=marks)


@pytest.mark.parametrize("op", list(_params()))
def test_primitive_sweep(op):
    args, tangents, cts, cts2, batched_cts, placements, vmap_inputs = _prepare(op)
    loops = [loop for _, loop in vmap_inputs]
    inputs = [inp for inp, _ in vmap_inputs]

    @jax.jit
    def run(args, tangents, cts, cts2, batched_cts, inputs, loops):
        return _checks(op, args, tangents, cts, cts2, batched_cts, placements, list(zip(inputs, loops)))

    results = run(args, tangents, cts, cts2, batched_cts, inputs, loops)
    assert results, "no composition was checked"
    for name, (got, want) in results.items():
        _compare(f"{op.name}: {name}", got, want, op.tol)


def test_table_covers_the_core_primitive_set():
    """Every primitive named by the interpreter-core issue has a record."""
    names = " ".join(op.name for op in OPS)
    for p in (
        "add sub mul div pow integer_pow max min abs sign exp log expm1 log1p sqrt rsqrt cbrt "
        "sin cos tan asin acos atan sinh cosh tanh asinh acosh atanh logistic erf eq ne lt "
        "select_n clamp convert broadcast_in_dim reshape squeeze expand_dims transpose rev "
        "concatenate pad slice dynamic_slice dynamic_update_slice gather scatter_add "
        "matmul reduce_sum reduce_max reduce_min reduce_prod argmax argmin cumsum sort "
        "stop_gradient"
    ).split():
        assert p in names, p
    assert len(XFAIL) < 0.05 * len(OPS)
