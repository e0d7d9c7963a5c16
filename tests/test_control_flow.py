"""Structured control flow (functx/primitives/control.py, functx/lax.py):
`cond`, `switch`, `scan`, `fori_loop`, `while_loop` and `map` under every
transform, against JAX's own transforms of the same program written with
jax.lax (float64), and finite differences where it is cheap.

Each test runs its compositions inside one `jax.jit` (functx runs at trace
time on JAX tracers), so it costs one XLA compilation.
"""

import numpy as np
import pytest

import jax
import jax.numpy as jnp
from jax import lax, tree_util

import functx as fx
from functx import numpy as fnp

EPS = 1e-6


def _close(results, tol=1e-9):
    for name, (got, want) in results.items():
        got_l, got_t = tree_util.tree_flatten(got)
        want_l, want_t = tree_util.tree_flatten(want)
        assert got_t == want_t, f"{name}: structure {got_t} != {want_t}"
        for g, w in zip(got_l, want_l):
            g, w = np.asarray(g), np.asarray(w)
            if w.dtype == jax.dtypes.float0:  # JAX's tangent of an integer
                w = np.zeros(w.shape, g.dtype)
            assert g.shape == w.shape, f"{name}: shape {g.shape} != {w.shape}"
            np.testing.assert_allclose(g, w, rtol=tol, atol=tol, err_msg=name)


def _rng(seed, *shape):
    return jnp.asarray(np.random.default_rng(seed).normal(size=shape))


# --------------------------------------------------------------------------
# scan


def _rnn(np_):
    """A small RNN written with `np_` (functx.numpy or jax.numpy) and the
    matching lax; its loss mixes the final carry and the stacked outputs."""
    scan = fx.lax.scan if np_ is fnp else lax.scan

    def loss(w, xs, h0, reverse=False, unroll=1):
        def cell(h, x):
            h = np_.tanh(w @ h + x) + np_.sin(w).sum()  # sin(w): hoisted out of the loop
            return h, (h * h).sum()
        h, ys = scan(cell, h0, xs, reverse=reverse, unroll=unroll)
        return (h * h).sum() + (ys * np_.arange(ys.shape[0])).sum()

    return loss


@pytest.mark.slow
def test_scan_rnn_every_transform_matches_jax():
    F, J = _rnn(fnp), _rnn(jnp)
    w, xs, h0 = 0.4 * _rng(0, 2, 2), _rng(1, 3, 2), _rng(2, 2)
    v, ct = _rng(3, 2, 2), _rng(4, 3, 2)

    @jax.jit
    def run(w, xs, h0, v, ct):
        res = {"eval": (F(w, xs, h0), J(w, xs, h0))}
        res["grad"] = (fx.grad(F, argnums=(0, 1, 2))(w, xs, h0),
                       jax.grad(J, argnums=(0, 1, 2))(w, xs, h0))
        res["grad, reverse=True unroll=2"] = (fx.grad(F)(w, xs, h0, True, 2),
                                              jax.grad(J)(w, xs, h0, True, 2))
        res["jvp"] = (fx.jvp(lambda a: F(a, xs, h0), (w,), (v,)),
                      jax.jvp(lambda a: J(a, xs, h0), (w,), (v,)))
        fd = (J(w + EPS * v, xs, h0) - J(w - EPS * v, xs, h0)) / (2 * EPS)
        res["grad . v vs finite differences"] = ((res["grad"][0][0] * v).sum(), fd)
        # per-sequence gradients, the sequences batched at axis 1
        xb = jnp.stack([xs, -xs])
        res["vmap(grad) at in_dims=1"] = (
            fx.vmap(fx.grad(F), in_dims=(None, 1, None))(w, jnp.moveaxis(xb, 0, 1), h0),
            jax.vmap(jax.grad(J), in_axes=(None, 0, None))(w, xb, h0))

        # vjp of the stacked outputs, and vmap over its cotangents
        def G(np_, scan):
            return lambda w: scan(lambda h, x: (np_.tanh(w @ h + x), h * x), h0, xs)[1]
        _, f_vjp = fx.vjp(G(fnp, fx.lax.scan), w)
        _, j_vjp = jax.vjp(G(jnp, lax.scan), w)
        res["vmap(vjp)"] = (fx.vmap(f_vjp)(jnp.stack([ct, -ct])),
                            jax.vmap(j_vjp)(jnp.stack([ct, -ct])))
        return res

    _close(run(w, xs, h0, v, ct), tol=1e-7)


@pytest.mark.slow
def test_scan_carries_of_every_kind():
    """Pytree carries, an integer carry, no xs (length=), ys None, a batched
    carry with unbatched xs, a constant in the body, and a Hessian through
    the loop."""

    def make(np_, scan):
        def f(w, c0):
            def body(c, _):
                h, k = c
                # a NumPy constant in the body: under jax.jit it must stay a
                # constant of the staged graphs (staging.stage)
                return (np_.where(h > 0, np_.sin(h) * w + k, np.full(3, 0.5)), k + 1), None
            (h, k), none = scan(body, (c0, jnp.int32(0)), None, length=3)
            assert none is None
            return (h * h).sum() * k
        return f

    F, J = make(fnp, fx.lax.scan), make(jnp, lax.scan)
    w, c0 = 0.7, _rng(5, 3)

    @jax.jit
    def run(w, c0):
        return {
            "grad": (fx.grad(F, argnums=(0, 1))(w, c0), jax.grad(J, argnums=(0, 1))(w, c0)),
            "hessian": (fx.hessian(F, argnums=1)(w, c0), jax.hessian(J, argnums=1)(w, c0)),
            "vmap carry": (fx.vmap(F, in_dims=(None, 0))(w, jnp.stack([c0, -c0])),
                           jax.vmap(J, in_axes=(None, 0))(w, jnp.stack([c0, -c0]))),
        }

    _close(run(w, c0))


@pytest.mark.slow
def test_fori_loop_static_bounds_supports_reverse_mode():
    F = lambda x: fx.lax.fori_loop(0, 4, lambda i, v: fnp.sin(v) * x + i, x)  # noqa: E731
    J = lambda x: lax.fori_loop(0, 4, lambda i, v: jnp.sin(v) * x + i, x)  # noqa: E731

    @jax.jit
    def run(x):
        return {
            "eval": (F(x), J(x)),
            "grad": (fx.grad(F)(x), jax.grad(J)(x)),
            "hessian": (fx.hessian(F)(x), jax.hessian(J)(x)),
            "grad vs finite differences": (fx.grad(F)(x), (J(x + EPS) - J(x - EPS)) / (2 * EPS)),
        }

    _close(run(0.6), tol=1e-7)
    # eagerly too (the static bounds are seen as Python ints either way)
    np.testing.assert_allclose(fx.grad(F)(0.6), jax.grad(J)(0.6), rtol=1e-12)


# --------------------------------------------------------------------------
# cond and switch


def _branches(np_):
    return (lambda a, b: {"s": np_.sin(a) * b, "i": jnp.int32(1)},
            lambda a, b: {"s": a * a + b, "i": jnp.int32(2)})


@pytest.mark.slow
def test_reverse_mode_through_a_batched_branch_index_ignores_branches_a_lane_does_not_take():
    """NOTE [branches a lane does not take]: under vmap with a batched
    predicate every branch runs on every lane; the derivative must not flow
    through the ones a lane does not take (0 * inf from sqrt at 0 gave NaN
    where JAX gives 0). Eager, so that XLA's simplifications of one
    compiled program do not hide a NaN."""
    f = lambda x: lax.cond(x < 1e-3, lambda x: 1e-3 + 0 * x, jnp.sqrt, x)  # noqa: E731
    g = lambda x, i: lax.switch(i, [lambda x: 1e-3 + 0 * x, jnp.sqrt, jnp.log], x)  # noqa: E731
    h = lambda x, w: lax.cond(x < 1e-3, lambda x: 1e-3 + 0 * x,  # noqa: E731
                              lambda x: jnp.sqrt(w - 1.0) * x, x)
    x = jnp.array([0.0, 0.5, 0.0])
    i = jnp.array([0, 1, 2])
    results = {
        "grad(vmap(cond))": (fx.grad(lambda x: fx.vmap(f)(x).sum())(x),
                             jax.grad(lambda x: jax.vmap(f)(x).sum())(x)),
        "jacrev(vmap(cond))": (fx.jacrev(fx.vmap(f))(x), jax.jacrev(jax.vmap(f))(x)),
        "grad(vmap(switch))": (fx.grad(lambda x: fx.vmap(g)(x, i).sum())(x + 1.0 * (i == 2)),
                               jax.grad(lambda x: jax.vmap(g)(x, i).sum())(x + 1.0 * (i == 2))),
        "unbatched input": (
            fx.grad(lambda w: fx.vmap(h, in_dims=(0, None))(x + 1.0, w).sum())(1.0),
            jax.grad(lambda w: jax.vmap(h, in_axes=(0, None))(x + 1.0, w).sum())(1.0)),
        "jax.grad(fx.vmap)": (jax.grad(lambda x: fx.vmap(f)(x).sum())(x),
                              jax.grad(lambda x: jax.vmap(f)(x).sum())(x)),
        "values": (fx.vmap(f)(x), jax.vmap(f)(x)),
    }
    for name, (got, want) in results.items():
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-12, atol=0,
                                   equal_nan=False, err_msg=name)


def test_cond_jvp_vjp_vmap_match_jax():
    def make(np_, cond):
        t, f = _branches(np_)
        return lambda x, y: cond(x.sum() > 0, t, f, x, y)

    F, J = make(fnp, fx.lax.cond), make(jnp, lax.cond)
    x, y, tx, ty = _rng(6, 3), _rng(7, 3), _rng(8, 3), _rng(9, 3)
    xb = jnp.stack([x, -x, 2 * x])

    @jax.jit
    def run(x, y, tx, ty, xb):
        res = {}
        for sign in (1, -1):  # both branches
            res[f"eval {sign}"] = (F(sign * x, y), J(sign * x, y))
            res[f"jvp {sign}"] = (fx.jvp(F, (sign * x, y), (tx, ty)),
                                  jax.jvp(J, (sign * x, y), (tx, ty)))
            gf = lambda a, b: F(a, b)["s"].sum()  # noqa: E731
            gj = lambda a, b: J(a, b)["s"].sum()  # noqa: E731
            res[f"grad {sign}"] = (fx.grad(gf, argnums=(0, 1))(sign * x, y),
                                   jax.grad(gj, argnums=(0, 1))(sign * x, y))
            if sign == 1:
                res["hessian"] = (fx.hessian(gf)(x, y), jax.hessian(gj)(x, y))
        # an unbatched predicate with batched operands, then a batched one
        res["vmap, unbatched pred"] = (fx.vmap(F, in_dims=(None, 0))(x, xb),
                                       jax.vmap(J, in_axes=(None, 0))(x, xb))
        loop = [J(a, y) for a in xb]
        res["vmap, batched pred vs Python loop"] = (
            fx.vmap(F, in_dims=(0, None))(xb, y),
            tree_util.tree_map(lambda *v: jnp.stack(v), *loop))
        gf = fx.grad(lambda a, b: F(a, b)["s"].sum())
        res["vmap(grad), batched pred vs Python loop"] = (
            fx.vmap(gf, in_dims=(0, None))(xb, y),
            jnp.stack([jax.grad(lambda a: J(a, y)["s"].sum())(a) for a in xb]))
        return res

    _close(run(x, y, tx, ty, xb))


@pytest.mark.slow
def test_switch_batched_index_clamps_and_differentiates():
    def make(np_, switch):
        branches = [lambda v: jnp.zeros(3), lambda v: v * 2.0, lambda v: np_.sin(v) * v]
        return lambda i, x: switch(i, branches, x)

    F, J = make(fnp, fx.lax.switch), make(jnp, lax.switch)
    idx = jnp.array([-1, 0, 1, 2, 7])  # out-of-range indices clamp
    x = _rng(10, 3)

    @jax.jit
    def run(idx, x):
        gf = fx.grad(lambda i, v: F(i, v).sum(), argnums=1)
        gj = jax.grad(lambda i, v: J(i, v).sum(), argnums=1)
        return {
            "vmap": (fx.vmap(F, in_dims=(0, None))(idx, x), jnp.stack([J(i, x) for i in idx])),
            "vmap(grad)": (fx.vmap(gf, in_dims=(0, None))(idx, x),
                           jnp.stack([gj(i, x) for i in idx])),
            "jacrev, unbatched index": (fx.jacrev(F, argnums=1)(2, x), jax.jacrev(J, argnums=1)(2, x)),
        }

    _close(run(idx, x))


# --------------------------------------------------------------------------
# while_loop


def _while(np_, while_loop):
    def f(x):
        return while_loop(lambda c: c[1] < 10.0, lambda c: (c[0] + 1, np_.sin(c[1]) + c[1] * x),
                          (0, x))
    return f


@pytest.mark.slow
def test_while_loop_forward_mode_and_vmap():
    F, J = _while(fnp, fx.lax.while_loop), _while(jnp, lax.while_loop)
    xs = jnp.array([1.5, 2.0, 3.0, 11.0])  # different trip counts, one of zero
    Fd = lambda x, n: fx.lax.fori_loop(0, n, lambda i, v: v * x + i, x)  # noqa: E731
    Jd = lambda x, n: lax.fori_loop(0, n, lambda i, v: v * x + i, x)  # noqa: E731
    ns = jnp.array([0, 1, 3, 5])

    @jax.jit
    def run(xs, ns):
        second = lambda f: lambda x: f(x)[1]  # noqa: E731
        return {
            "eval": (F(xs[0]), J(xs[0])),
            "jvp": (fx.jvp(F, (xs[0],), (1.0,)), jax.jvp(J, (xs[0],), (1.0,))),
            "linearize": (fx.linearize(second(F), xs[1])[1](2.0),
                          jax.jvp(second(J), (xs[1],), (2.0,))[1]),
            "jacfwd(jacfwd)": (fx.jacfwd(fx.jacfwd(second(F)))(xs[0]),
                               jax.jacfwd(jax.jacfwd(second(J)))(xs[0])),
            "vmap, batched predicate vs Python loop": (
                fx.vmap(F)(xs), tree_util.tree_map(lambda *v: jnp.stack(v), *[J(x) for x in xs])),
            "vmap(jacfwd), batched predicate": (
                fx.vmap(fx.jacfwd(second(F)))(xs), jnp.stack([jax.jacfwd(second(J))(x) for x in xs])),
            "fori_loop, traced bounds, vmap": (fx.vmap(Fd)(xs, ns),
                                               jnp.stack([Jd(x, n) for x, n in zip(xs, ns)])),
            "fori_loop, traced bounds, jvp": (fx.jvp(lambda x: Fd(x, ns[2]), (xs[0],), (1.0,)),
                                              jax.jvp(lambda x: Jd(x, ns[2]), (xs[0],), (1.0,))),
        }

    _close(run(xs, ns))


@pytest.mark.slow
def test_reverse_mode_through_while_loop_raises_a_clear_error():
    F = lambda x: _while(fnp, fx.lax.while_loop)(x)[1]  # noqa: E731
    Fd = lambda x, n: fx.lax.fori_loop(0, n, lambda i, v: v * x, x)  # noqa: E731
    lifted = fx.lift(lambda x: _while(jnp, lax.while_loop)(x)[1])
    for call in (lambda: fx.grad(F)(1.5), lambda: fx.vjp(F, 1.5)[1](1.0),
                 lambda: fx.jacrev(lifted)(1.5), lambda: jax.jit(fx.grad(Fd))(1.5, 3),
                 lambda: fx.grad(fx.jit(F))(1.5)):
        with pytest.raises(fx.MissingRuleError) as info:
            call()
        msg = str(info.value)
        assert isinstance(info.value, RuntimeError)
        for word in ("while_loop", "reverse", "functx.lax.scan", "fori_loop", "static"):
            assert word in msg, (word, msg)


# --------------------------------------------------------------------------
# map


@pytest.mark.slow
def test_map_with_and_without_batch_size():
    w = _rng(11, 3)
    xs = _rng(12, 5, 3)

    @jax.jit
    def run(w, xs):
        res = {}
        for bs in (None, 2):
            F = lambda w, xs: fx.lax.map(lambda x: fnp.sin(x * w).sum(), xs, batch_size=bs)  # noqa: E731,B023
            J = lambda w, xs: lax.map(lambda x: jnp.sin(x * w).sum(), xs, batch_size=bs)  # noqa: E731,B023
            res[f"eval {bs}"] = (F(w, xs), J(w, xs))
            res[f"grad {bs}"] = (fx.grad(lambda w: F(w, xs).sum())(w),
                                 jax.grad(lambda w: J(w, xs).sum())(w))
            res[f"vmap {bs}"] = (fx.vmap(F, in_dims=(0, None))(jnp.stack([w, -w]), xs),
                                 jax.vmap(J, in_axes=(0, None))(jnp.stack([w, -w]), xs))
        return res

    _close(run(w, xs))


# --------------------------------------------------------------------------
# Nesting and closures


@pytest.mark.slow
def test_nested_control_flow_and_transforms():
    def make(np_, scan, cond):
        def f(w, xs):
            def step(c, x):
                c = cond(x.sum() > 0, lambda c: c * w + x, lambda c: np_.cos(c) - w, c)
                inner, _ = scan(lambda d, y: (d * w + y, None), c, np_.stack([x, x]))
                return inner, inner.sum()
            return scan(step, jnp.ones(2), xs)[1].sum()
        return f

    F, J = make(fnp, fx.lax.scan, fx.lax.cond), make(jnp, lax.scan, lax.cond)
    xs = _rng(13, 3, 2)
    xb = jnp.stack([xs, -xs])

    @jax.jit
    def run(w, xs, xb):
        return {
            "grad": (fx.grad(F, argnums=(0, 1))(w, xs), jax.grad(J, argnums=(0, 1))(w, xs)),
            "vmap(grad(scan)))": (fx.vmap(fx.grad(F), in_dims=(None, 0))(w, xb),
                                  jax.vmap(jax.grad(J), in_axes=(None, 0))(w, xb)),
        }

    _close(run(0.6, xs, xb), tol=1e-8)


@pytest.mark.slow
def test_closures_over_outer_transform_values():
    """Branches and bodies that close over tracers of enclosing transforms
    (grad, vmap, jvp) and over JAX tracers of the outer jit."""

    def make(np_, scan, cond, while_loop):
        def f(a, b, loop=True):
            c = cond(a > 0, lambda: np_.sin(b) * a, lambda: b * b)  # no operands at all
            ys = scan(lambda s, x: (s * a + x * b, s), 1.0, jnp.arange(3.0))[1]
            if not loop:
                return c + ys.sum()
            _, v = while_loop(lambda s: s[0] < 3, lambda s: (s[0] + 1, s[1] * b), (0, a))
            return c + ys.sum() + v
        return f

    F = make(fnp, fx.lax.scan, fx.lax.cond, fx.lax.while_loop)
    J = make(jnp, lax.scan, lax.cond, lax.while_loop)
    A = jnp.array([0.5, -0.4])

    @jax.jit
    def run(a, b, A):
        outer = b * 2.0  # a JAX tracer the functions below close over
        return {
            "jvp": (fx.jvp(F, (a, b), (1.0, 0.5)), jax.jvp(J, (a, b), (1.0, 0.5))),
            "vmap(jacfwd)": (fx.vmap(fx.jacfwd(F, argnums=(0, 1)), in_dims=(0, None))(A, b),
                             jax.vmap(jax.jacfwd(J, argnums=(0, 1)), in_axes=(0, None))(A, b)),
            "vmap, closing over the outer jit's tracer": (
                fx.vmap(lambda x: F(x, outer))(A), jax.vmap(lambda x: J(x, outer))(A)),
            "vmap(grad)": (
                fx.vmap(fx.grad(lambda a, b: F(a, b, False), argnums=(0, 1)), in_dims=(0, None))(A, b),
                jax.vmap(jax.grad(lambda a, b: J(a, b, False), argnums=(0, 1)), in_axes=(0, None))(A, b)),
            # no perturbation confusion: the inner grad's bodies see x as a constant
            "grad(grad)": (fx.grad(lambda x: fx.grad(lambda y: F(x, y, False))(0.3))(a),
                           jax.grad(lambda x: jax.grad(lambda y: J(x, y, False))(0.3))(a)),
        }

    _close(run(0.5, 0.3, A))


# --------------------------------------------------------------------------
# Lifted JAX code and functx.jit


def _jax_program(w, xs):
    """Plain JAX using every control-flow function (and jnp on top)."""
    h, ys = lax.scan(lambda h, x: (jnp.tanh(w * h + x), h), jnp.zeros(2), xs)
    c = lax.cond(h.sum() > 0, lambda v: jnp.sin(v), lambda v: v * 3.0, h)
    f = lax.fori_loop(0, 3, lambda i, v: v * w + i, c)
    m = lax.map(lambda x: (x * w).sum(), xs)
    _, wl = lax.while_loop(lambda s: s[0] < 2, lambda s: (s[0] + 1, s[1] * w), (0, f))
    return ys.sum() + f.sum() + m.sum() + wl.sum()


@pytest.mark.slow
def test_lifted_jax_control_flow_transforms():
    L = fx.lift(_jax_program)
    xs = _rng(14, 3, 2)

    def no_while(w, xs):  # reverse mode: the lifted scan, cond, fori_loop and map
        h, ys = lax.scan(lambda h, x: (jnp.tanh(w * h + x), h), jnp.zeros(2), xs)
        c = lax.cond(h.sum() > 0, lambda v: jnp.sin(v), lambda v: v * 3.0, h)
        return (ys.sum() + lax.fori_loop(0, 3, lambda i, v: v * w + i, c).sum()
                + lax.map(lambda x: (x * w).sum(), xs).sum())

    @jax.jit
    def run(w, xs):
        return {
            "eval": (L(w, xs), _jax_program(w, xs)),
            "jvp": (fx.jvp(L, (w, xs), (1.0, xs)), jax.jvp(_jax_program, (w, xs), (1.0, xs))),
            "vmap": (fx.vmap(L, in_dims=(0, None))(jnp.array([0.3, 0.6]), xs),
                     jax.vmap(_jax_program, in_axes=(0, None))(jnp.array([0.3, 0.6]), xs)),
            "grad": (fx.grad(fx.lift(no_while), argnums=(0, 1))(w, xs),
                     jax.grad(no_while, argnums=(0, 1))(w, xs)),
        }

    _close(run(0.4, xs))


@pytest.mark.slow
def test_functx_jit_of_control_flow():
    F, J = _rnn(fnp), _rnn(jnp)
    w, xs, h0 = 0.4 * _rng(15, 2, 2), _rng(16, 3, 2), _rng(17, 2)
    wb = jnp.stack([w, -w])
    # functx.jit on plain arrays: one jax.jit of the functx transforms
    np.testing.assert_allclose(fx.jit(fx.grad(F))(w, xs, h0), jax.grad(J)(w, xs, h0), rtol=1e-10)

    @jax.jit
    def run(w, xs, h0, wb):
        # functx.jit under functx transforms: the staged graph (jit_call)
        # is differentiated, transposed and batched as a whole
        jF = fx.jit(F)
        return {
            "grad(jit)": (fx.grad(jF)(w, xs, h0), jax.grad(J)(w, xs, h0)),
            "vmap(jit)": (fx.vmap(jF, in_dims=(0, None, None))(wb, xs, h0),
                          jax.vmap(J, in_axes=(0, None, None))(wb, xs, h0)),
            "jvp(jit(while))": (
                fx.jvp(fx.jit(lambda x: _while(fnp, fx.lax.while_loop)(x)[1]), (1.5,), (1.0,)),
                jax.jvp(lambda x: _while(jnp, lax.while_loop)(x)[1], (1.5,), (1.0,))),
        }

    _close(run(w, xs, h0, wb), tol=1e-10)


# --------------------------------------------------------------------------
# Errors and printing


def test_control_flow_errors_name_the_function_and_the_fix():
    cases = [
        (lambda: fx.lax.cond(jnp.ones(2) > 0, lambda: 1.0, lambda: 2.0), TypeError,
         ["cond", "scalar"]),
        (lambda: fx.lax.cond(True, lambda: jnp.ones(2), lambda: jnp.ones(3)), TypeError,
         ["cond", "branch 1", "f64[3]"]),
        (lambda: fx.lax.switch(0.5, [lambda: 1.0]), TypeError, ["switch", "integer"]),
        (lambda: fx.lax.scan(lambda c, x: (c.sum(), x), jnp.ones(2), jnp.ones(3)), TypeError,
         ["scan", "carry", "f64[2]"]),
        (lambda: fx.lax.scan(lambda c, x: c, 0.0, jnp.ones(3)), TypeError, ["scan", "pair"]),
        (lambda: fx.lax.scan(lambda c, x: (c, x), 0.0), ValueError, ["scan", "length"]),
        (lambda: fx.lax.while_loop(lambda c: c, lambda c: c + 1, 0.0), TypeError,
         ["while_loop", "cond_fun", "boolean"]),
        (lambda: fx.lax.fori_loop(0, jnp.int32(3) + fx.numpy.zeros((), jnp.int32), 1, 0.0),
         TypeError, ["fori_loop", "callable"]),
    ]
    for call, kind, words in cases:
        with pytest.raises(kind) as info:
            call()
        assert isinstance(info.value, fx.FunctxError)
        for word in words:
            assert word in str(info.value), (word, str(info.value))


def test_staged_graph_prints_branches_and_bodies():
    text = str(fx.make_graph(lambda x: fx.lax.cond(x > 0, fnp.sin, fnp.cos, x))(1.0))
    assert "cond[branches={2 graphs}]" in text and "sin" in text and "cos" in text
    text = str(fx.make_graph(fx.grad(
        lambda x: fx.lax.scan(lambda c, _: (fnp.sin(c) * x, None), x, None, length=3)[0]))(1.0))
    assert text.count("scan[") == 2 and "reverse=True" in text  # the transposed loop
