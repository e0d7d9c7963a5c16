"""Custom derivative rules: lifted JAX custom_jvp / custom_vjp functions and
the functx.custom_jvp / functx.custom_vjp decorators.

Oracles: JAX's transforms of the same function with the same custom rules
(jax.custom_jvp / jax.custom_vjp twins of the functx decorators), central
finite differences where the custom rule is the true derivative, and for
forward mode of a custom_vjp (which JAX refuses) the inner-product identity
<jvp(t), c> = <t, vjp(c)>. Each group of compositions runs inside one
`jax.jit` (one XLA compilation), which also covers "an outer jax.jit".
"""

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import tree_util

import functx as fx
import functx.numpy as fnp

EPS = 1e-6


def _check(results, tol=1e-9):
    for name, (got, want) in results.items():
        got_l, got_t = tree_util.tree_flatten(got)
        want_l, want_t = tree_util.tree_flatten(want)
        assert got_t == want_t, f"{name}: structure {got_t} != {want_t}"
        for g, w in zip(got_l, want_l):
            np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=tol, atol=tol,
                                       equal_nan=True, err_msg=name)


def _fd(f, x, v):
    return (f(x + EPS * v) - f(x - EPS * v)) / (2 * EPS)


def _inner(a, b):
    return sum(jnp.vdot(u, w) for u, w in zip(tree_util.tree_leaves(a), tree_util.tree_leaves(b)))


# --------------------------------------------------------------------------
# Lifted JAX functions with custom rules (and, as controls, without)

LIFTED = {
    "relu": (jax.nn.relu, np.array([-1.0, 0.0, 2.0])),
    "softplus": (jax.nn.softplus, np.array([-40.0, 0.0, 3.0, 50.0])),
    "silu": (jax.nn.silu, np.array([-2.0, 0.0, 1.0])),
    "gelu": (jax.nn.gelu, np.array([-2.0, 0.0, 1.0])),
    "norm at 0": (jnp.linalg.norm, np.zeros(3)),
    "logsumexp": (jax.scipy.special.logsumexp, np.array([1000.0, 1000.0, -np.inf])),
}


@pytest.mark.slow
def test_lifted_functions_keep_jax_derivatives():
    @jax.jit
    def run(xs):
        res = {}
        for name, (f, _) in LIFTED.items():
            x = xs[name]
            s = lambda x, f=f: f(x).sum()  # noqa: E731
            fs = fx.lift(s)
            t = jnp.linspace(0.5, 1.5, x.shape[0])
            res[f"{name}: grad"] = (fx.grad(fs)(x), jax.grad(s)(x))
            res[f"{name}: jvp"] = (fx.jvp(fs, (x,), (t,))[1], jax.jvp(s, (x,), (t,))[1])
            if name in ("relu", "softplus", "logsumexp"):
                res[f"{name}: hessian"] = (fx.hessian(fs)(x), jax.hessian(s)(x))
            if name in ("relu", "softplus"):  # the two with custom rules: more compositions
                rows = jnp.stack([x, 0.5 * x])
                res[f"{name}: vmap(grad)"] = (fx.vmap(fx.grad(fs))(rows),
                                             jax.vmap(jax.grad(s))(rows))
                res[f"{name}: grad(vmap)"] = (fx.grad(lambda r: fx.vmap(fs)(r).sum())(rows),
                                             jax.grad(lambda r: jax.vmap(s)(r).sum())(rows))
        return res

    results = run({k: jnp.asarray(x) for k, (_, x) in LIFTED.items()})
    _check(results)
    # The custom rules, not the bodies: relu'(0) is 0 (the body would give 0.5).
    assert results["relu: grad"][0][1] == 0.0
    assert np.isfinite(results["softplus: grad"][0]).all()


@jax.custom_vjp
def _clip_gradient(x):
    return x


_clip_gradient.defvjp(lambda x: (x, None), lambda _, g: (jnp.clip(g, -1.0, 1.0),))


@pytest.mark.slow
def test_lifted_custom_vjp_uses_its_bwd():
    f = lambda x: (3.0 * _clip_gradient(x) ** 2).sum()  # noqa: E731
    g = lambda x: 3.0 * _clip_gradient(x) ** 2  # noqa: E731
    ff, fg = fx.lift(f), fx.lift(g)

    @jax.jit
    def run(x):
        return {
            "grad": (fx.grad(ff)(x), jax.grad(f)(x)),
            "jacrev": (fx.jacrev(fg)(x), jax.jacrev(g)(x)),
            "vmap(grad)": (fx.vmap(fx.grad(fg))(x), jax.vmap(jax.grad(g))(x)),
            "grad(vmap)": (fx.grad(lambda x: fx.vmap(fg)(x).sum())(x),
                           jax.grad(lambda x: jax.vmap(g)(x).sum())(x)),
            "hessian": (fx.hessian(ff)(x), jax.jacrev(jax.jacrev(f))(x)),
            "jit(grad)": (fx.jit(fx.grad(ff))(x), jax.grad(f)(x)),
        }

    results = run(jnp.array([0.1, 2.0, -3.0]))
    _check(results)
    np.testing.assert_allclose(results["grad"][0], [0.6, 1.0, -1.0])  # clipped, not 6x
    # Forward mode transposes bwd, which clipping makes non-linear: refused.
    with pytest.raises(fx.MissingRuleError, match="custom_vjp function `_clip_gradient`: "
                       "functx derives forward mode by transposing its bwd rule"):
        fx.jvp(fg, (jnp.ones(2),), (jnp.ones(2),))


# --------------------------------------------------------------------------
# functx.custom_jvp against jax.custom_jvp twins


def _softplus_pair():
    """softplus with its true derivative as the custom rule."""

    @fx.custom_jvp
    def sp(x, y):
        return fnp.logaddexp(x * y, 0.0)

    @sp.defjvp
    def sp_jvp(primals, tangents):
        (x, y), (tx, ty) = primals, tangents
        s = fx.nn.sigmoid(x * y)
        return sp(x, y), s * (tx * y + x * ty)

    @jax.custom_jvp
    def jsp(x, y):
        return jnp.logaddexp(x * y, 0.0)

    @jsp.defjvp
    def jsp_jvp(primals, tangents):
        (x, y), (tx, ty) = primals, tangents
        s = jax.nn.sigmoid(x * y)
        return jsp(x, y), s * (tx * y + x * ty)

    return sp, jsp


def _odd_pair():
    """A rule that is deliberately not the body's derivative (so only the
    rule can produce it): d/dx = 2 * cos(x), linear in the tangent."""

    @fx.custom_jvp
    def f(x):
        return fnp.sin(x)

    f.defjvps(lambda t, ans, x: 2.0 * fnp.cos(x) * t)

    @jax.custom_jvp
    def jf(x):
        return jnp.sin(x)

    jf.defjvps(lambda t, ans, x: 2.0 * jnp.cos(x) * t)
    return f, jf


@pytest.mark.slow
def test_custom_jvp_decorator_under_every_transform():
    sp, jsp = _softplus_pair()
    odd, jodd = _odd_pair()

    def compositions(x, y, v):
        L = lambda x, y: (sp(x, y) ** 2).sum()  # noqa: E731
        Lj = lambda x, y: (jsp(x, y) ** 2).sum()  # noqa: E731
        body = lambda x, y: jnp.logaddexp(x * y, 0.0)  # noqa: E731
        res = {
            "grad": (fx.grad(L, argnums=(0, 1))(x, y), jax.grad(Lj, argnums=(0, 1))(x, y)),
            "vjp": (fx.vjp(sp, x, y)[1](v), jax.vjp(jsp, x, y)[1](v)),
            "jvp": (fx.jvp(sp, (x, y), (v, v))[1], jax.jvp(jsp, (x, y), (v, v))[1]),
            "jvp vs finite differences": (fx.jvp(lambda x: sp(x, y), (x,), (v,))[1],
                                          _fd(lambda x: body(x, y), x, v)),
            "jacrev": (fx.jacrev(sp, argnums=(0, 1))(x, y), jax.jacrev(jsp, argnums=(0, 1))(x, y)),
            "jacfwd": (fx.jacfwd(sp)(x, y), jax.jacfwd(jsp)(x, y)),
            "hessian": (fx.hessian(L)(x, y), jax.hessian(Lj)(x, y)),
            "jacfwd(jacfwd)": (fx.jacfwd(fx.jacfwd(sp))(x, y), jax.jacfwd(jax.jacfwd(jsp))(x, y)),
            "grad^3": (fx.grad(fx.grad(fx.grad(lambda x: sp(x, 0.7))))(0.3),
                       jax.grad(jax.grad(jax.grad(lambda x: jsp(x, 0.7))))(0.3)),
            "vmap": (fx.vmap(sp)(x, y), jax.vmap(jsp)(x, y)),
            "vmap(grad)": (fx.vmap(fx.grad(sp), in_dims=(0, None))(x, y[0]),
                           jax.vmap(jax.grad(jsp), in_axes=(0, None))(x, y[0])),
            "grad(vmap)": (fx.grad(lambda y: fx.vmap(sp, in_dims=(0, None))(x, y).sum())(y[0]),
                           jax.grad(lambda y: jax.vmap(jsp, in_axes=(0, None))(x, y).sum())(y[0])),
            "jacrev(vmap)": (fx.jacrev(fx.vmap(sp))(x, y), jax.jacrev(jax.vmap(jsp))(x, y)),
            "functx.jit(grad)": (fx.jit(fx.grad(L))(x, y), jax.grad(Lj)(x, y)),
            "grad(functx.jit)": (fx.grad(fx.jit(L))(x, y), jax.grad(Lj)(x, y)),
            "odd grad": (fx.grad(lambda x: odd(x).sum())(x), 2.0 * jnp.cos(x)),
            "odd jacfwd": (fx.jacfwd(odd)(x), jax.jacfwd(jodd)(x)),
            "odd hessian": (fx.hessian(lambda x: odd(x).sum())(x),
                            jax.hessian(lambda x: jodd(x).sum())(x)),
            "odd vmap(jvp)": (fx.vmap(lambda x, v: fx.jvp(odd, (x,), (v,))[1])(x, v),
                              jax.vmap(lambda x, v: jax.jvp(jodd, (x,), (v,))[1])(x, v)),
        }
        return res

    x, y, v = jnp.array([0.3, -1.2, 2.0]), jnp.array([1.5, 0.4, -0.8]), jnp.array([0.7, -0.2, 1.1])
    _check(jax.jit(compositions)(x, y, v), tol=1e-7)


@pytest.mark.slow
def test_custom_jvp_eager_and_python_control_flow_in_rule():
    """Eagerly (no jit) the rule runs on concrete values, so Python control
    flow on primals works (as in JAX); repeated calls hit the eager caches."""

    @fx.custom_jvp
    def f(x):
        return x ** 3

    @f.defjvp
    def f_jvp(primals, tangents):
        (x,), (t,) = primals, tangents
        if x > 0:
            return f(x), 3.0 * x ** 2 * t
        return f(x), 0.0 * t

    got = [float(fx.grad(f)(v)) for v in (2.0, -1.0, 2.0, 3.0, 2.0)]
    assert got == [12.0, 0.0, 12.0, 27.0, 12.0]
    sp, _ = _softplus_pair()
    x, y = jnp.array([0.3, -1.2]), jnp.array([1.5, 0.4])
    for _ in range(3):  # the second and third calls take the eager caches
        np.testing.assert_allclose(fx.grad(lambda x: sp(x, y).sum())(x),
                                   jax.nn.sigmoid(x * y) * y, rtol=1e-12)


def test_custom_jvp_nondiff_argnums_pytrees_and_integer_arguments():
    @partial(fx.custom_jvp, nondiff_argnums=(0, 2))
    def app(fn, d, scale):
        return {"out": fn(d["a"]) * scale + d["b"]}

    @app.defjvp
    def app_jvp(fn, scale, primals, tangents):
        (d,), (t,) = primals, tangents
        return app(fn, d, scale), {"out": 2.0 * t["a"] * scale + t["b"]}

    @partial(jax.custom_jvp, nondiff_argnums=(0, 2))
    def japp(fn, d, scale):
        return {"out": fn(d["a"]) * scale + d["b"]}

    @japp.defjvp
    def japp_jvp(fn, scale, primals, tangents):
        (d,), (t,) = primals, tangents
        return japp(fn, d, scale), {"out": 2.0 * t["a"] * scale + t["b"]}

    @fx.custom_jvp
    def power(x, n):
        return x ** n

    @power.defjvp
    def power_jvp(primals, tangents):
        (x, n), (tx, tn) = primals, tangents
        assert tn.dtype == jax.dtypes.float0  # as JAX gives an integer input
        return power(x, n), n * x ** (n - 1) * tx

    def run(d, s):
        L = lambda d, s: app(fnp.sin, d, s)["out"].sum()  # noqa: E731
        Lj = lambda d, s: japp(jnp.sin, d, s)["out"].sum()  # noqa: E731
        return {
            "grad": (fx.grad(L, argnums=(0, 1))(d, s), jax.grad(Lj, argnums=(0, 1))(d, s)),
            "vmap(grad)": (fx.vmap(fx.grad(L))(d, s), jax.vmap(jax.grad(Lj))(d, s)),
            "grad(vmap)": (fx.grad(lambda d: fx.vmap(L, in_dims=(0, None))(d, s[0]).sum())(d),
                           jax.grad(lambda d: jax.vmap(Lj, in_axes=(0, None))(d, s[0]).sum())(d)),
            "integer argument": (fx.grad(power)(2.0, 3), jnp.asarray(12.0)),
        }

    d = {"a": jnp.array([1.0, 2.0]), "b": jnp.array([0.5, -0.5])}
    _check(jax.jit(run)(d, jnp.array([3.0, 4.0])))


# --------------------------------------------------------------------------
# functx.custom_vjp against jax.custom_vjp twins


def _tanh_pair():
    """tanh(x * w) with its true vjp as bwd (so forward mode can be checked
    against plain JAX and finite differences)."""

    @fx.custom_vjp
    def h(x, w):
        return fnp.tanh(x * w)

    def h_fwd(x, w):
        out = fnp.tanh(x * w)
        return out, (x, w, out)

    def h_bwd(res, g):
        x, w, out = res
        d = g * (1.0 - out ** 2)
        return d * w, (d * x).sum()

    h.defvjp(h_fwd, h_bwd)

    @jax.custom_vjp
    def jh(x, w):
        return jnp.tanh(x * w)

    def jh_fwd(x, w):
        out = jnp.tanh(x * w)
        return out, (x, w, out)

    def jh_bwd(res, g):
        x, w, out = res
        d = g * (1.0 - out ** 2)
        return d * w, (d * x).sum()

    jh.defvjp(jh_fwd, jh_bwd)
    return h, jh


@pytest.mark.slow
def test_custom_vjp_decorator_reverse_mode():
    h, jh = _tanh_pair()

    @fx.custom_vjp
    def clip(x):
        return x

    clip.defvjp(lambda x: (x, None), lambda _, g: (fnp.clip(g, -1.0, 1.0),))

    @jax.custom_vjp
    def jclip(x):
        return x

    jclip.defvjp(lambda x: (x, None), lambda _, g: (jnp.clip(g, -1.0, 1.0),))

    def run(x, w, c):
        L = lambda x, w: (h(x, w) ** 2).sum()  # noqa: E731
        Lj = lambda x, w: (jh(x, w) ** 2).sum()  # noqa: E731
        C = lambda x: (3.0 * clip(x) ** 2).sum()  # noqa: E731
        Cj = lambda x: (3.0 * jclip(x) ** 2).sum()  # noqa: E731
        return {
            "grad": (fx.grad(L, argnums=(0, 1))(x, w), jax.grad(Lj, argnums=(0, 1))(x, w)),
            "vjp": (fx.vjp(h, x, w)[1](c), jax.vjp(jh, x, w)[1](c)),
            "jacrev": (fx.jacrev(h, argnums=(0, 1))(x, w), jax.jacrev(jh, argnums=(0, 1))(x, w)),
            "vmap(grad)": (fx.vmap(fx.grad(L), in_dims=(0, None))(x[:, None], w),
                           jax.vmap(jax.grad(Lj), in_axes=(0, None))(x[:, None], w)),
            "grad(vmap)": (fx.grad(lambda w: fx.vmap(h, in_dims=(0, None))(x, w).sum())(w),
                           jax.grad(lambda w: jax.vmap(jh, in_axes=(0, None))(x, w).sum())(w)),
            "jacrev(jacrev)": (fx.jacrev(fx.jacrev(L))(x, w), jax.jacrev(jax.jacrev(Lj))(x, w)),
            "functx.jit(grad)": (fx.jit(fx.grad(L))(x, w), jax.grad(Lj)(x, w)),
            "grad(functx.jit)": (fx.grad(fx.jit(L))(x, w), jax.grad(Lj)(x, w)),
            "clip grad": (fx.grad(C)(x), jax.grad(Cj)(x)),
            "clip vmap(grad)": (fx.vmap(fx.grad(C))(x[:, None]), jax.vmap(jax.grad(Cj))(x[:, None])),
            "clip hessian": (fx.hessian(C)(x), jax.jacrev(jax.jacrev(Cj))(x)),
        }

    x, w, c = jnp.array([0.3, -1.2, 2.0]), jnp.array(0.7), jnp.array([1.0, -0.5, 0.25])
    results = jax.jit(run)(x, w, c)
    _check(results)
    np.testing.assert_allclose(results["clip grad"][0], [1.0, -1.0, 1.0])


@pytest.mark.slow
def test_custom_vjp_forward_mode_transposes_bwd():
    """jvp / jacfwd / hessian of a custom_vjp function (JAX refuses them):
    against plain JAX of the body (bwd is the true vjp), finite differences,
    and <jvp(t), c> = <t, vjp(c)>."""
    h, _ = _tanh_pair()
    body = lambda x, w: jnp.tanh(x * w)  # noqa: E731

    def run(x, w, t, c):
        L = lambda x, w: (h(x, w) ** 2).sum()  # noqa: E731
        Lb = lambda x, w: (body(x, w) ** 2).sum()  # noqa: E731
        out_t = fx.jvp(h, (x, w), (t, 0.5))[1]
        pulled = fx.vjp(h, x, w)[1](c)
        return {
            "jvp": (out_t, jax.jvp(body, (x, w), (t, 0.5))[1]),
            "jvp vs finite differences": (fx.jvp(lambda x: h(x, w), (x,), (t,))[1],
                                          _fd(lambda x: body(x, w), x, t)),
            "<jvp(t), c> = <t, vjp(c)>": (jnp.vdot(out_t, c), _inner((t, 0.5), pulled)),
            "jacfwd": (fx.jacfwd(h, argnums=(0, 1))(x, w), jax.jacfwd(body, argnums=(0, 1))(x, w)),
            "hessian": (fx.hessian(L, argnums=(0, 1))(x, w), jax.hessian(Lb, argnums=(0, 1))(x, w)),
            "jacfwd(jacfwd)": (fx.jacfwd(fx.jacfwd(h))(x, w), jax.jacfwd(jax.jacfwd(body))(x, w)),
            "grad(jvp)": (fx.grad(lambda x: fx.jvp(lambda x: h(x, w), (x,), (t,))[1].sum())(x),
                          jax.grad(lambda x: jax.jvp(lambda x: body(x, w), (x,), (t,))[1].sum())(x)),
            "vmap(jvp)": (fx.vmap(lambda x, t: fx.jvp(lambda x: h(x, w), (x,), (t,))[1])(x, t),
                          jax.vmap(lambda x, t: jax.jvp(lambda x: body(x, w), (x,), (t,))[1])(x, t)),
            "jvp(vmap)": (fx.jvp(fx.vmap(lambda x: h(x, w)), (x,), (t,))[1],
                          jax.jvp(jax.vmap(lambda x: body(x, w)), (x,), (t,))[1]),
            "linearize": (fx.linearize(lambda x: h(x, w), x)[1](t),
                          jax.jvp(lambda x: body(x, w), (x,), (t,))[1]),
        }

    x, w = jnp.array([0.3, -1.2, 2.0]), jnp.array(0.7)
    t, c = jnp.array([0.7, -0.2, 1.1]), jnp.array([1.0, -0.5, 0.25])
    _check(jax.jit(run)(x, w, t, c), tol=1e-7)


def test_custom_vjp_pytrees_none_cotangents_and_nondiff_argnums():
    @fx.custom_vjp
    def two(d):
        return d["a"] * d["b"], d["a"] + 1.0

    two.defvjp(lambda d: (two(d), (d["a"], d["b"])),
               lambda res, cts: ({"a": cts[0] * res[1] + cts[1], "b": None},))

    @jax.custom_vjp
    def jtwo(d):
        return d["a"] * d["b"], d["a"] + 1.0

    jtwo.defvjp(lambda d: (jtwo(d), (d["a"], d["b"])),
                lambda res, cts: ({"a": cts[0] * res[1] + cts[1], "b": None},))

    @partial(fx.custom_vjp, nondiff_argnums=(1,))
    def scaled(x, k):
        return x * k

    scaled.defvjp(lambda x, k: (x * k, None), lambda k, _, g: (10.0 * g * k,))

    @partial(jax.custom_vjp, nondiff_argnums=(1,))
    def jscaled(x, k):
        return x * k

    jscaled.defvjp(lambda x, k: (x * k, None), lambda k, _, g: (10.0 * g * k,))

    def run(d):
        S = lambda d: two(d)[0].sum() + 2.0 * two(d)[1].sum()  # noqa: E731
        Sj = lambda d: jtwo(d)[0].sum() + 2.0 * jtwo(d)[1].sum()  # noqa: E731
        return {
            "grad": (fx.grad(S)(d), jax.grad(Sj)(d)),
            "one output unused": (fx.grad(lambda d: two(d)[1].sum())(d),
                                  jax.grad(lambda d: jtwo(d)[1].sum())(d)),
            "jacrev": (fx.jacrev(two)(d), jax.jacrev(jtwo)(d)),
            "vmap(vjp)": (fx.vmap(lambda c: fx.vjp(two, d)[1]((c, c)))(jnp.eye(2)),
                          jax.vmap(lambda c: jax.vjp(jtwo, d)[1]((c, c)))(jnp.eye(2))),
            "nondiff_argnums": (fx.grad(lambda x: scaled(x, 3).sum())(d["a"]),
                                jax.grad(lambda x: jscaled(x, 3).sum())(d["a"])),
        }

    _check(jax.jit(run)({"a": jnp.array([1.0, 2.0]), "b": jnp.array([3.0, 5.0])}))


# --------------------------------------------------------------------------
# Closures, interplay with JAX, and errors


def test_closures_and_jax_interplay():
    def batched_closure(x):
        def inner(c):
            @fx.custom_jvp
            def f(x):
                return fnp.sin(x) * c

            f.defjvp(lambda p, t: (f(p[0]), fnp.cos(p[0]) * t[0] * c))
            return f(x)

        return fx.vmap(inner)(jnp.array([1.0, 2.0])).sum()

    def jbatched_closure(x):
        def inner(c):
            @jax.custom_jvp
            def f(x):
                return jnp.sin(x) * c

            f.defjvp(lambda p, t: (f(p[0]), jnp.cos(p[0]) * t[0] * c))
            return f(x)

        return jax.vmap(inner)(jnp.array([1.0, 2.0])).sum()

    odd, jodd = _odd_pair()

    def run(x):
        return {
            # grad(vmap(f)) with f closing over a value vmap batches (as JAX).
            "closure over a batched value": (fx.grad(batched_closure)(x),
                                             jax.grad(jbatched_closure)(x)),
            # A functx custom_jvp inside lifted JAX code keeps its rule...
            "inside lift": (fx.grad(fx.lift(lambda x: jnp.sum(odd(x))))(x[None]),
                            2.0 * jnp.cos(x[None])),
            # ... and JAX's own transforms see the same rule.
            "under jax.grad": (jax.grad(lambda x: odd(x).sum())(x[None]),
                               jax.grad(lambda x: jodd(x).sum())(x[None])),
        }

    _check(jax.jit(run)(jnp.asarray(0.5)))


def test_jax_transforms_around_functx_transforms_keep_custom_rules():
    """NOTE [custom rules under JAX's transforms]: `jax.grad` of a function
    calling `functx.vmap(f)`, or `jax.jit(functx.vmap(f))` inside a functx
    transform, with `f` a custom_jvp / custom_vjp function (lifted from JAX,
    batched, with a nondiff argument): the rule is used, not the body.
    Before, relu'(0) came out 0.5 and a rule whose derivative differs from
    the body's was ignored."""
    @jax.custom_jvp
    def f(x):
        return 3.0 * x

    f.defjvp(lambda p, t: (f(p[0]), 2.0 * t[0]))  # not the body's derivative

    @jax.custom_vjp
    def g(x):
        return jnp.sin(x)

    g.defvjp(lambda x: (jnp.sin(x), jnp.cos(x)), lambda c, ct: (2.0 * c * ct,))

    @partial(jax.custom_vjp, nondiff_argnums=(0,))
    def h(k, x):
        return jnp.tanh(x) * k

    h.defvjp(lambda k, x: (h(k, x), x), lambda k, x, ct: (3.0 * k * ct,))

    x = jnp.array([-1.0, 0.0, 0.5])
    fsum = lambda fn, vmap: lambda x: vmap(fn)(x).sum()  # noqa: E731
    hk = lambda x: h(2.0, x)  # noqa: E731
    _check({
        "jax.grad(vmap(custom_jvp))": (jax.grad(fsum(f, fx.vmap))(x), jax.grad(fsum(f, jax.vmap))(x)),
        "jax.grad(vmap(custom_vjp))": (jax.grad(fsum(g, fx.vmap))(x), jax.grad(fsum(g, jax.vmap))(x)),
        "jax.grad(vmap(nondiff))": (jax.grad(fsum(hk, fx.vmap))(x), jax.grad(fsum(hk, jax.vmap))(x)),
        "jax.jvp(vmap(custom_jvp))": (jax.jvp(fx.vmap(f), (x,), (x,)), jax.jvp(jax.vmap(f), (x,), (x,))),
        "relu under jax.jit(vmap)": (fx.grad(lambda x: jax.jit(fx.vmap(jax.nn.relu))(x).sum())(x),
                                     jax.grad(lambda x: jax.vmap(jax.nn.relu)(x).sum())(x)),
        "jax.jit(vmap(custom_vjp)) in grad": (
            fx.grad(lambda x: jax.jit(fx.vmap(g))(x).sum())(x), jax.grad(fsum(g, jax.vmap))(x)),
        "jax.grad(grad(custom_jvp))": (jax.grad(fx.grad(lambda x: f(x) * x))(1.5),
                                       jax.grad(jax.grad(lambda x: f(x) * x))(1.5)),
        "jax.jacfwd(vmap)": (jax.jacfwd(fx.vmap(f))(x), jax.jacfwd(jax.vmap(f))(x)),
        "jax.jit(jax.grad(vmap))": (jax.jit(jax.grad(fsum(g, fx.vmap)))(x),
                                    jax.grad(fsum(g, jax.vmap))(x)),
    })

    def closing(c):  # the rule ignores `c`'s derivative: refused, as JAX refuses it
        @jax.custom_jvp
        def k(x):
            return jnp.sin(x) * c

        k.defjvp(lambda p, t: (k(p[0]), jnp.cos(p[0]) * t[0] * c))
        return fx.vmap(k)(x).sum()

    with pytest.raises(fx.FunctxError, match="custom_jvp function .* under a JAX transform"):
        jax.grad(closing)(2.0)


def test_a_custom_vjp_equation_whose_unused_outputs_jax_dropped():
    """JAX's dead-code elimination of a custom_vjp equation keeps only its
    used outputs (and its fwd returns only those): functx replayed it
    expecting all of them (StopIteration, an internal RuntimeError)."""
    from jax._src import core as jcore
    from jax._src.interpreters import partial_eval as pe

    @jax.custom_vjp
    def f(x, y):
        return jnp.sin(x), x + jnp.cos(y)

    f.defvjp(lambda x, y: (f(x, y), (jnp.cos(x), jnp.sin(y))),
             lambda res, cts: (2.0 * res[0] * cts[0] + 1.5 * cts[1], -0.5 * res[1] * cts[1]))
    jaxpr = jax.make_jaxpr(f)(0.1, -1.3).jaxpr
    for used in ([True, False], [False, True]):
        fn = jcore.jaxpr_as_fun(pe.close_jaxpr(pe.dce_jaxpr(jaxpr, used)[0]))
        g = lambda x, y: fn(x, y)[0]  # noqa: E731
        _check({str(used): (fx.grad(g, argnums=(0, 1))(0.1, -1.3),
                            jax.grad(g, argnums=(0, 1))(0.1, -1.3))})


def test_a_jax_rule_closing_over_a_value_of_an_enclosing_functx_transform_gets_it():
    """A jax.custom_jvp / custom_vjp defined inside a functx transform whose
    function and rule read a value of that transform through their closure
    (a vmap's batched value): the function's own read makes it one of the
    lifted call's inputs, and the rule JAX traces later gets that input in
    its place (`_closure_as_inputs`), batched as the call is. Equal to JAX
    (before: refused by name; before that an internal AssertionError, or,
    called on plain arrays, the body's derivative instead of the rule's). A
    rule reading a value the function does not read is refused by name."""
    def mk(T):
        def h(z):
            def f(x):
                @jax.custom_jvp
                def g(y):
                    return x * y

                g.defjvp(lambda p, t: (x * p[0], x * t[0] * 3.0))  # not the body's: 3x
                return g(z)

            return T.vmap(f)(jnp.arange(3.0))

        return h

    def outer(x):
        @jax.custom_vjp
        def f(y):
            return x * y

        f.defvjp(lambda y: (f(y), (x, jnp.cos(y))), lambda res, g: (res[1] * g * res[0],))
        return f

    def make(x):
        @jax.custom_jvp
        def f(y):
            return jnp.sin(x) * jnp.abs(y)

        f.defjvp(lambda p, t: (f(*p), jnp.sin(x) * 7.0 * t[0]))
        return f

    xs, y0 = jnp.linspace(0.1, 1.0, 3), jnp.asarray(0.3)
    cases = {
        "jvp(vmap)": lambda T: T.jvp(mk(T), (1.0,), (2.0,)),
        "vmap(grad) custom_vjp": lambda T: T.vmap(lambda x: T.grad(outer(x))(3.0))(xs),
        "grad(vmap) custom_vjp": lambda T: T.grad(
            lambda y: T.vmap(lambda x: outer(x)(y))(xs).sum())(3.0),
        "vmap(grad) custom_jvp": lambda T: T.vmap(lambda x: T.grad(make(x))(y0))(xs),
        "grad(vmap) custom_jvp": lambda T: T.grad(
            lambda y: T.vmap(lambda x: make(x)(y))(xs).sum())(y0),
    }
    for name, case in cases.items():
        for _ in range(2):
            _check({name: (case(fx), case(jax))}, tol=1e-6)

    def bwd_only(x):
        @jax.custom_vjp
        def f(y):
            return y * 2.0

        f.defvjp(lambda y: (f(y), None), lambda _, g: (g * x,))
        return f

    with pytest.raises(fx.FunctxError, match="custom_vjp function `f`.*neither takes nor reads"):
        fx.vmap(lambda x: fx.grad(bwd_only(x))(3.0))(xs)


def test_errors():
    def closing(w):
        @fx.custom_jvp
        def f(x):
            return x * w

        f.defjvp(lambda p, t: (f(p[0]), t[0] * w))
        return f(2.0)

    with pytest.raises(fx.FunctxRuntimeError, match="closes over a value .* differentiated"):
        fx.grad(closing)(3.0)

    @fx.custom_jvp
    def no_pair(x):
        return 2.0 * x

    no_pair.defjvp(lambda p, t: 2.0 * t[0])
    with pytest.raises(fx.FunctxValueError, match="jvp rule .* must return a pair"):
        fx.grad(no_pair)(1.0)

    @fx.custom_jvp
    def bad_shape(x):
        return 2.0 * x

    bad_shape.defjvp(lambda p, t: (bad_shape(p[0]), fnp.ones(3)))
    with pytest.raises(fx.FunctxValueError, match=r"tangent f64\[3\] for the output f64\[\]"):
        fx.jvp(bad_shape, (1.0,), (1.0,))

    @fx.custom_jvp
    def nonlinear(x):
        return x

    nonlinear.defjvp(lambda p, t: (nonlinear(p[0]), t[0] ** 2))
    with pytest.raises(fx.MissingRuleError, match="jvp rule applies `integer_pow` to a tangent"):
        fx.grad(nonlinear)(2.0)

    @fx.custom_vjp
    def v(x, y):
        return x * y

    v.defvjp(lambda x, y: (x * y, (x, y)), lambda r, g: (g * r[1],))
    with pytest.raises(fx.FunctxValueError, match="one cotangent per differentiable argument"):
        fx.grad(v)(1.0, 2.0)
    v.defvjp(lambda x, y: (x * y, (x, y)), lambda r, g: (g * r[1], fnp.ones(2)))
    with pytest.raises(fx.FunctxValueError, match=r"cotangent f64\[2\] for the input f64\[\]"):
        fx.grad(v)(1.0, 2.0)
    v.defvjp(lambda x, y: (x * y, (x, y)), lambda r, g: (g * g, g))
    with pytest.raises(fx.MissingRuleError, match="transposing its bwd rule"):
        fx.jvp(v, (1.0, 2.0), (1.0, 1.0))

    @fx.custom_vjp
    def undefined(x):
        return x

    with pytest.raises(fx.FunctxTypeError, match="before its rules were defined"):
        fx.grad(undefined)(1.0)



def test_rule_definition_errors_name_the_call_and_the_fix():
    # JAX accepts a non-callable rule here and fails later, at the first call
    @fx.custom_jvp
    def f(x):
        return x

    with pytest.raises(fx.FunctxTypeError,
                       match=r"f\.defjvp\(jvp\).*`jvp`.*got int 3.*@f\.defjvp"):
        f.defjvp(3)

    @fx.custom_vjp
    def g(x):
        return x

    with pytest.raises(fx.FunctxTypeError,
                       match=r"g\.defvjp\(fwd, bwd\).*got str 'b' as `bwd`.*Pass the two rule"):
        g.defvjp(lambda x: (x, None), "b")
    with pytest.raises(fx.FunctxTypeError, match=r"custom_jvp\(h, nondiff_argnums=\.\.\.\).*e\.g\."):
        fx.custom_jvp(_named("h"), nondiff_argnums=1)
    with pytest.raises(fx.FunctxValueError, match=r"nondiff_argnums=\(1, 1\).*List each"):
        fx.custom_vjp(_named("h"), nondiff_argnums=(1, 1))
    with pytest.raises(fx.FunctxTypeError, match=r"before its rule was defined.*@f\.defjvp"):
        fx.grad(f)(1.0)


def _named(name):
    def fn(x, n):
        return x

    fn.__name__ = name
    return fn


# ---- symbolic_zeros=True --------------------------------------------------


def _symbolic_zero_twins(lib, np_, seen):
    """The same rules for jax and functx: the jvp rule and fwd record what
    they are given (a SymbolicZero or a value; the perturbed flags), and bwd
    branches on the flags that fwd returned as residuals."""
    from jax.custom_derivatives import SymbolicZero

    @lib.custom_jvp
    def scaled_sin(x, y):
        return np_.sin(x) * y

    def scaled_sin_jvp(primals, tangents):
        (x, y), (tx, ty) = primals, tangents
        seen.append(tuple(isinstance(t, SymbolicZero) for t in tangents))
        t = np_.zeros_like(x)
        if not isinstance(tx, SymbolicZero):
            t = t + np_.cos(x) * y * tx
        if not isinstance(ty, SymbolicZero):
            t = t + np_.sin(x) * ty
        return scaled_sin(x, y), t

    scaled_sin.defjvp(scaled_sin_jvp, symbolic_zeros=True)

    @lib.custom_vjp
    def prod(x, y):
        return x * np_.tanh(y)

    def prod_fwd(x, y):
        seen.append((x.perturbed, y.perturbed))
        return prod(x.value, y.value), (x.value, y.value, x.perturbed, y.perturbed)

    def prod_bwd(res, ct):
        x, y, px, py = res
        return (ct * np_.tanh(y) if px else None,
                ct * x * (1 - np_.tanh(y) ** 2) if py else None)

    prod.defvjp(prod_fwd, prod_bwd, symbolic_zeros=True)
    return scaled_sin, prod


@pytest.mark.slow
def test_symbolic_zeros_match_jax():
    """defjvp / defvjp(symbolic_zeros=True) as in JAX: the jvp rule gets a
    SymbolicZero for each input without a tangent, fwd gets CustomVJPPrimal
    values whose `perturbed` says which inputs are differentiated, Python
    residuals reach bwd unchanged (bwd branches on them), and rules may
    return SymbolicZero / None. Values and what the rules saw, against JAX;
    the same JAX rules lifted into functx, against JAX."""
    seen_fx, seen_jax = [], []
    ours = _symbolic_zero_twins(fx, fnp, seen_fx)
    theirs = _symbolic_zero_twins(jax, jnp, seen_jax)
    lifted_seen = []
    lifted = tuple(fx.lift(f) for f in _symbolic_zero_twins(jax, jnp, lifted_seen))
    x, y = jnp.array([0.3, 0.7, -1.1]), jnp.array([1.5, -2.0, 0.4])
    cases = {
        "grad x": lambda f, g, T: T.grad(lambda x: (f(x, y) + g(x, y)).sum())(x),
        "grad y": lambda f, g, T: T.grad(lambda y: (f(x, y) + g(x, y)).sum())(y),
        "jvp y (custom_jvp)": lambda f, g, T: T.jvp(lambda y: f(x, y), (y,), (x,))[1],
        "vmap grad": lambda f, g, T: T.vmap(T.grad(lambda a, b: f(a, b) * g(a, b)))(x, y),
        "hessian (custom_jvp)": lambda f, g, T: T.hessian(lambda x: f(x, y).sum())(x),
        "jacrev x, x": lambda f, g, T: T.jacrev(lambda x: g(x, x))(x),
    }
    for name, case in cases.items():
        seen_fx.clear()
        seen_jax.clear()
        got = case(*ours, fx)
        want = case(*theirs, jax)
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-12, err_msg=name)
        assert set(seen_fx) == set(seen_jax), (name, seen_fx, seen_jax)  # not how often
        # the JAX-defined rules lifted into functx: the flags fwd returns
        # reach bwd as Python values there too (lifted fwd sees every input
        # perturbed, so only the values are compared)
        np.testing.assert_allclose(np.asarray(case(*lifted, fx)), np.asarray(want), rtol=1e-12,
                                   err_msg=f"lifted {name}")
    # forward mode of the custom_vjp (JAX refuses it): the transposed bwd,
    # staged, still sees fwd's Python flags
    for g in (ours[1], lifted[1]):
        _check({"jvp x (custom_vjp)": (fx.jvp(lambda x: g(x, y), (x,), (y,))[1],  # noqa: B023
                                       jax.jvp(lambda x: x * jnp.tanh(y), (x,), (y,))[1])})
