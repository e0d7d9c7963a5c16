"""The transforms against JAX's own on the same functions (float64, 1e-6
relative), alone and composed, plus the nesting regressions.

The test functions are written with functx.numpy, which calls jax.numpy
directly on JAX values: the same function runs under functx and under JAX
transforms, so JAX is the oracle for every result here.
"""

import numpy as np
import pytest

import jax
import jax.numpy as jnp
from jax import tree_util

import functx as fx
import functx.numpy as fnp

RTOL = 1e-6


def staged(fn):
    """Run a functx composition inside jax.jit: functx's interpreters run
    once at trace time on JAX tracers and XLA compiles one program, instead
    of compiling every primitive eagerly. The eager path is covered by the
    lighter tests."""
    return jax.jit(fn)


def close(a, b, rtol=RTOL):
    la, ta = tree_util.tree_flatten(a)
    lb, tb = tree_util.tree_flatten(b)
    assert ta == tb, f"structure {ta} != {tb}"
    for x, y in zip(la, lb):
        assert np.shape(x) == np.shape(y), (np.shape(x), np.shape(y))
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=rtol, atol=1e-12)


rng = np.random.default_rng(0)
X = jnp.asarray(rng.uniform(-1, 1, (3,)))
Y = jnp.asarray(rng.uniform(-1, 1, (3,)))
M = jnp.asarray(rng.uniform(-1, 1, (4, 3)))
XS = jnp.asarray(rng.uniform(-1, 1, (5, 3)))
V = jnp.asarray(rng.uniform(-1, 1, (3,)))


def f_scalar(x):
    return fnp.sum(fnp.sin(x) * x ** 2) + fnp.prod(fnp.cos(x))


def f_two(x, y):
    return fnp.sum(x * y) + fnp.sum(fnp.exp(x) / (1.0 + y ** 2))


def f_vec(x):
    return fnp.tanh(M @ x) * fnp.sum(x)


def f_tree(p):
    return fnp.sum(fnp.tanh(p["w"] @ p["x"]) ** 2) + fnp.sum(p["b"][0] * p["b"][1])


def f_multi(x):
    return fnp.sin(x), {"s": fnp.sum(x ** 3), "m": fnp.outer(x, x)}


TREE = {"w": M, "x": X, "b": (Y, V)}


# --------------------------------------------------------------------------
# grad, grad_and_value, vjp


@pytest.mark.parametrize("f,args", [(f_scalar, (X,)), (f_two, (X, Y)), (f_tree, (TREE,))])
@pytest.mark.slow
def test_grad_matches_jax(f, args):
    close(fx.grad(f)(*args), jax.jit(jax.grad(f))(*args))


@pytest.mark.slow
def test_grad_argnums_tuple_and_negative():
    close(fx.grad(f_two, argnums=(0, 1))(X, Y), jax.jit(jax.grad(f_two, argnums=(0, 1)))(X, Y))
    close(fx.grad(f_two, argnums=-1)(X, Y), jax.jit(jax.grad(f_two, argnums=1))(X, Y))
    g = fx.grad(f_two, argnums=(1,))(X, Y)
    assert isinstance(g, tuple) and len(g) == 1


@pytest.mark.slow
def test_grad_has_aux_and_grad_and_value():
    def f(x):
        return f_scalar(x), {"aux": fnp.cos(x)}

    g, aux = fx.grad(f, has_aux=True)(X)
    jg, jaux = jax.jit(jax.grad(f, has_aux=True))(X)
    close((g, aux), (jg, jaux))
    g, (value, aux) = fx.grad_and_value(f, has_aux=True)(X)
    (jvalue, jaux), jg = jax.jit(jax.value_and_grad(f, has_aux=True))(X)
    close((g, value, aux), (jg, jvalue, jaux))
    g, value = fx.grad_and_value(f_scalar)(X)
    close((g, value), (jax.jit(jax.grad(f_scalar))(X), f_scalar(X)))


def test_grad_kwargs_pass_through():
    def f(x, *, scale):
        return fnp.sum(x * scale)

    close(fx.grad(f)(X, scale=Y), Y)


def test_unused_input_gets_zero_gradient():
    g = fx.grad(lambda x, y: fnp.sum(x ** 2), argnums=(0, 1))(X, Y)
    close(g, (2 * X, jnp.zeros_like(Y)))


@pytest.mark.slow
def test_vjp_matches_jax_and_is_reusable():
    out, vjp_fn = fx.vjp(f_multi, X)
    jout, jvjp_fn = jax.vjp(f_multi, X)
    close(out, jout)
    ct = (V, {"s": jnp.asarray(0.7), "m": jnp.outer(V, Y)})
    first = vjp_fn(ct)
    close(first, jvjp_fn(ct))
    close(vjp_fn(ct), first)  # callable many times
    assert isinstance(first, tuple) and len(first) == 1


@pytest.mark.slow
def test_vjp_several_primals_and_aux():
    out, vjp_fn, aux = fx.vjp(lambda x, y: (f_two(x, y), x * 2), X, Y, has_aux=True)
    jout, jvjp_fn, jaux = jax.vjp(lambda x, y: (f_two(x, y), x * 2), X, Y, has_aux=True)
    close((out, aux), (jout, jaux))
    close(vjp_fn(jnp.asarray(1.5)), jvjp_fn(jnp.asarray(1.5)))


# --------------------------------------------------------------------------
# jvp, linearize


@pytest.mark.slow
def test_jvp_matches_jax():
    close(fx.jvp(f_vec, (X,), (V,)), jax.jvp(f_vec, (X,), (V,)))
    close(fx.jvp(f_multi, (X,), (V,)), jax.jvp(f_multi, (X,), (V,)))
    close(fx.jvp(f_two, (X, Y), (V, X)), jax.jvp(f_two, (X, Y), (V, X)))
    tangent_tree = tree_util.tree_map(jnp.ones_like, TREE)
    close(fx.jvp(f_tree, (TREE,), (tangent_tree,)), jax.jvp(f_tree, (TREE,), (tangent_tree,)))


def test_jvp_has_aux():
    out, t, aux = fx.jvp(lambda x: (f_vec(x), x + 1), (X,), (V,), has_aux=True)
    jout, jt, jaux = jax.jvp(lambda x: (f_vec(x), x + 1), (X,), (V,), has_aux=True)
    close((out, t, aux), (jout, jt, jaux))


def test_jvp_of_function_ignoring_its_input_gives_zeros():
    out, t = fx.jvp(lambda x: Y * 2.0, (X,), (V,))
    close((out, t), (Y * 2.0, jnp.zeros_like(Y)))


@pytest.mark.slow
def test_linearize_matches_jax_without_retracing():
    calls = []

    def f(x):
        calls.append(1)
        return f_vec(x)

    out, jvp_fn = fx.linearize(f, X)
    jout, jjvp_fn = jax.linearize(f_vec, X)
    n = len(calls)
    close(out, jout)
    close(jvp_fn(V), jjvp_fn(V))
    close(jvp_fn(X), jjvp_fn(X))
    assert len(calls) == n  # no re-trace of f
    close(fx.vmap(jvp_fn)(XS), jax.jit(jax.vmap(jjvp_fn))(XS))


# --------------------------------------------------------------------------
# vmap


@pytest.mark.slow
def test_vmap_matches_jax_and_loop():
    close(fx.vmap(f_vec)(XS), jax.jit(jax.vmap(f_vec))(XS))
    close(fx.vmap(f_vec)(XS), jnp.stack([f_vec(x) for x in XS]))


@pytest.mark.slow
def test_vmap_in_dims_pytree_negative_and_none():
    tree = {"w": jnp.stack([M] * 5, axis=-1), "x": XS, "b": (Y, V)}
    in_dims = ({"w": -1, "x": 0, "b": None},)
    got = fx.vmap(f_tree, in_dims=in_dims)(tree)
    want = jax.jit(jax.vmap(f_tree, in_axes=in_dims))(tree)
    close(got, want)
    close(fx.vmap(f_two, in_dims=(0, None))(XS, Y), jax.jit(jax.vmap(f_two, in_axes=(0, None)))(XS, Y))
    close(fx.vmap(f_two, in_dims=(1, -1))(XS.T, XS.T), jax.jit(jax.vmap(f_two, in_axes=(1, 1)))(XS.T, XS.T))


def test_vmap_out_dims():
    def f(x):
        return x * 2.0, fnp.sum(x)

    got = fx.vmap(f, out_dims=(1, 0))(XS)
    close(got, jax.jit(jax.vmap(f, out_axes=(1, 0)))(XS))
    got = fx.vmap(lambda x: (x, Y), out_dims=(0, None))(XS)
    close(got, (XS, Y))
    # an output independent of the batch is broadcast along out_dims
    close(fx.vmap(lambda x: Y)(XS), jnp.stack([Y] * 5))


def test_vmap_kwargs_are_not_mapped():
    def f(x, *, scale):
        return x * scale

    close(fx.vmap(f)(XS, scale=Y), XS * Y[None, :])


@pytest.mark.slow
def test_vmap_chunk_size_same_result():
    want = fx.vmap(f_vec)(XS)
    for k in (1, 2, 3, 5, 7):
        close(staged(fx.vmap(f_vec, chunk_size=k))(XS), want)
    close(fx.vmap(f_two, in_dims=(1, None), chunk_size=2)(XS.T, Y), fx.vmap(f_two, in_dims=(1, None))(XS.T, Y))
    close(fx.vmap(lambda x: (x, Y), out_dims=(1, None), chunk_size=2)(XS), (XS.T, Y))


@pytest.mark.slow
def test_vmap_nested_and_in_dims_shapes():
    A = jnp.asarray(rng.uniform(-1, 1, (2, 5, 3)))
    close(fx.vmap(fx.vmap(f_vec))(A), jax.jit(jax.vmap(jax.vmap(f_vec)))(A))
    close(fx.vmap(fx.vmap(f_two, in_dims=(0, None)), in_dims=(None, 0))(XS, A[0]),
          jax.jit(jax.vmap(jax.vmap(f_two, in_axes=(0, None)), in_axes=(None, 0)))(XS, A[0]))


# --------------------------------------------------------------------------
# Jacobians, Hessians


@pytest.mark.parametrize("jac,jjac", [(fx.jacrev, jax.jacrev), (fx.jacfwd, jax.jacfwd)])
@pytest.mark.slow
def test_jacobians_match_jax(jac, jjac):
    close(jac(f_vec)(X), jjac(f_vec)(X))
    close(staged(jac(f_two, argnums=(0, 1)))(X, Y), jjac(f_two, argnums=(0, 1))(X, Y))
    close(staged(jac(f_multi))(X), jjac(f_multi)(X))
    close(staged(jac(f_tree))(TREE), jjac(f_tree)(TREE))
    close(staged(jac(lambda x: (f_vec(x), {"a": x}), has_aux=True))(X), jjac(lambda x: (f_vec(x), {"a": x}), has_aux=True)(X))


@pytest.mark.slow
def test_jacrev_chunk_size_same_result():
    want = fx.jacrev(f_multi)(X)
    for k in (1, 2, 4):
        close(staged(fx.jacrev(f_multi, chunk_size=k))(X), want)


@pytest.mark.slow
def test_hessian_hvp_vhp_match_jax():
    close(fx.hessian(f_scalar)(X), jax.jit(jax.hessian(f_scalar))(X))
    close(staged(fx.hessian(f_two, argnums=(0, 1)))(X, Y), jax.jit(jax.hessian(f_two, argnums=(0, 1)))(X, Y))
    value, (hv,) = fx.hvp(f_scalar, (X,), (V,))
    close((value, hv), (f_scalar(X), jax.jit(jax.hessian(f_scalar))(X) @ V))
    value, (vh,) = fx.vhp(f_scalar, (X,), (V,))
    close((value, vh), (f_scalar(X), V @ jax.jit(jax.hessian(f_scalar))(X)))
    value, hv2 = staged(lambda *a: fx.hvp(f_two, a[:2], a[2:]))(X, Y, V, X)
    jh = jax.jit(jax.hessian(f_two, argnums=(0, 1)))(X, Y)
    close(hv2, (jh[0][0] @ V + jh[0][1] @ X, jh[1][0] @ V + jh[1][1] @ X))


def _dots(fn, *args):
    """Output shapes of the dot_generals in the staged program of fn."""
    graph = fx.make_graph(fn)(*args)
    return [e.outputs[0].aval.shape for e in graph.eqns if e.prim.name == "dot_general"]


W45 = jnp.asarray(rng.uniform(-1, 1, (4, 5)))


@pytest.mark.slow
def test_identity_bases_are_not_multiplied(monkeypatch):
    # NOTE [identity bases]: a product with the identity basis is the other
    # operand's slice; results against JAX (which does multiply), and the
    # staged programs lose exactly the basis products. Products this small
    # are kept where the slice would need its axes moved, unless the
    # threshold is lowered:
    from functx.primitives import dot

    x5 = jnp.asarray(rng.uniform(-1, 1, (5,)))

    def lin_w(w, x):
        return w @ x

    def lin_wt(wt, x):
        return x @ wt

    assert _dots(fx.jacfwd(lin_w, argnums=1), W45, x5) == [(4,), (4, 5)]
    assert _dots(fx.jacfwd(lin_wt, argnums=1), W45.T, x5) == [(4,)]  # in place: always
    monkeypatch.setattr(dot, "_SMALL_PRODUCT", 0)

    def energy(w, x):
        return fnp.tanh(w @ x).sum()

    # the staged programs: only the primal products are left
    for jac in (fx.jacfwd, fx.jacrev):
        assert _dots(jac(lin_w, argnums=1), W45, x5) == [(4,)]
        assert _dots(jac(lin_wt, argnums=1), W45.T, x5) == [(4,)]
    # the value, the gradient and one dense n^2 m product (no W @ identity)
    assert _dots(fx.hessian(energy, argnums=1), W45, x5) == [(4,), (5,), (5, 5)]
    # a matrix input (both axes contracted, in swapped order), reshape and a dtype cast
    m = jnp.asarray(rng.uniform(-1, 1, (2, 3)))
    w = jnp.asarray(rng.uniform(-1, 1, (3, 2, 4)))
    ones = jnp.ones((6, 4), jnp.float32)

    def tensor(m, w, ones):
        return fnp.einsum("ij,jik->k", m, w) + (fnp.reshape(m, (6,)).astype(jnp.float32)
                                                 @ ones).astype(m.dtype)

    assert _dots(fx.jacfwd(tensor), m, w, ones) == [(4,), (4,)]

    def two(x, m):  # the second input's rows start at 5 (zero rows before)
        return W45 @ x + fnp.einsum("ij,jik->k", m, w)

    xs = jnp.asarray(rng.uniform(-1, 1, (3, 5)))

    def results(jac, vmap, hessian, jit):
        """Every case, written once for functx and for JAX (the oracle)."""
        return (
            [jac(f, argnums=1)(w_, x5) for f, w_ in ((lin_w, W45), (lin_wt, W45.T))],
            jac(tensor)(m, w, ones),
            jac(two, argnums=(0, 1))(x5, m),
            jit(jac(two, argnums=(0, 1)))(x5, m),
            hessian(energy, argnums=1)(W45, x5),
            vmap(jac(energy, argnums=1), (None, 0))(W45, xs),  # under an outer vmap
        )

    want = {jac: jax.jit(lambda: results(jac, jax.vmap, jax.hessian, jax.jit))()
            for jac in (jax.jacfwd, jax.jacrev)}
    for jac, jjac in ((fx.jacfwd, jax.jacfwd), (fx.jacrev, jax.jacrev)):
        # under jax.jit (one compile) and functx.jit
        close(staged(lambda: results(jac, fx.vmap, fx.hessian, fx.jit))(), want[jjac])
    close(fx.jit(fx.jacfwd(fx.jacfwd(energy, argnums=1), argnums=1))(W45, x5),
          jax.hessian(energy, argnums=1)(W45, x5))
    close(fx.jacfwd(two, argnums=(0, 1))(x5, m), want[jax.jacfwd][2])  # eagerly


def _all_dots(graph):
    """The dot_generals of a staged program, inside jit_call graphs too."""
    n = 0
    for e in graph.eqns:
        n += e.prim.name == "dot_general"
        n += sum(_all_dots(v) for v in e.params.values() if hasattr(v, "eqns"))
    return n


@pytest.mark.slow
def test_identity_bases_pass_into_jitted_functions(monkeypatch):
    # jacrev(jit(f)): the basis reaches the jitted graph's batching as marks
    from functx.primitives import dot

    monkeypatch.setattr(dot, "_SMALL_PRODUCT", 0)
    x5 = jnp.asarray(rng.uniform(-1, 1, (5,)))

    def lin_w(w, x):
        return w @ x

    def energy(w, x):
        return fnp.sum(fnp.tanh(w @ x) ** 3)

    for jac in (fx.jacrev, fx.jacfwd):
        inner = fx.jit(lin_w)
        assert _all_dots(fx.make_graph(jac(inner, argnums=1))(W45, x5)) == 1  # the primal
        close(jac(inner, argnums=1)(W45, x5), W45)
    # the value, the gradient and one dense product: no W @ identity
    hess = fx.hessian(fx.jit(energy), argnums=1)
    assert _all_dots(fx.make_graph(hess)(W45, x5)) == 3
    close(hess(W45, x5), jax.hessian(lambda w, x: jnp.sum(jnp.tanh(w @ x) ** 3), argnums=1)(W45, x5))


@pytest.mark.slow
def test_chunked_jacrev_skips_the_identity_products(monkeypatch):
    # each chunk of jacrev(chunk_size=k) carries its rows' offsets: chunk
    # [lo, hi) of an output leaf whose rows start at s is the basis at s - lo,
    # possibly wholly outside the chunk (zero rows on both sides); inside the
    # loop that chunks become under jit, lo is known when the loop runs
    from functx.primitives import dot

    monkeypatch.setattr(dot, "_SMALL_PRODUCT", 0)
    x5 = jnp.asarray(rng.uniform(-1, 1, (5,)))

    def two_outputs(x):  # 4 + 2 output rows
        return W45 @ x, fnp.tanh(W45[:2] @ x)

    def jax_two_outputs(x):
        return W45 @ x, jnp.tanh(W45[:2] @ x)

    def linear(w, x):  # w an input, so that the products are staged
        return w @ x, w[2:] @ x

    def jit_products(chunk_size):
        jac = fx.jit(fx.jacrev(linear, argnums=1, chunk_size=chunk_size))
        return jac.lower(W45, x5).as_text().count("dot_general")

    want = jax.jacrev(jax_two_outputs)(x5)
    for k in (1, 3, 4, 5):
        # only the primal products are left (no product of W with the basis)
        assert _dots(fx.jacrev(linear, argnums=1, chunk_size=k), W45, x5) == [(4,), (2,)], k
        # the same in the loop that chunks become under jit
        assert jit_products(k) == jit_products(None), k
        jac = fx.jacrev(two_outputs, chunk_size=k)
        close(jac(x5), want)  # eagerly
        close(fx.vmap(jac)(jnp.stack([x5, 2 * x5])),
              jax.vmap(jax.jacrev(jax_two_outputs))(jnp.stack([x5, 2 * x5])))
    for k in (1, 4, 5):  # a loop under jit (k=4, 5: and a last partial chunk)
        close(fx.jit(fx.jacrev(two_outputs, chunk_size=k))(x5), want)
    # JAX's transforms of that loop (the offsets are loop values there)
    xs = jnp.stack([x5, 2 * x5])
    looped = fx.jit(fx.jacrev(two_outputs, chunk_size=4))
    close(jax.vmap(looped)(xs), jax.vmap(jax.jacrev(jax_two_outputs))(xs))

    def squares(jac):
        return lambda x: sum(jnp.sum(t ** 2) for t in jac(x))

    close(jax.grad(squares(looped))(x5), jax.grad(squares(jax.jacrev(jax_two_outputs)))(x5))


# --------------------------------------------------------------------------
# Compositions


def loss(w, x, t):
    return fnp.mean((fnp.tanh(M @ (w * x)) - t) ** 2)


T = jnp.asarray(rng.uniform(-1, 1, (5, 4)))


@pytest.mark.slow
def test_vmap_grad_per_sample():
    close(fx.vmap(fx.grad(loss), in_dims=(None, 0, 0))(X, XS, T),
          jax.jit(jax.vmap(jax.grad(loss), in_axes=(None, 0, 0)))(X, XS, T))


@pytest.mark.slow
def test_jacfwd_jacrev_and_jacrev_jacrev():
    close(fx.jacfwd(fx.jacrev(f_vec))(X), jax.jit(jax.jacfwd(jax.jacrev(f_vec)))(X))
    close(staged(fx.jacrev(fx.jacrev(f_vec)))(X), jax.jit(jax.jacrev(jax.jacrev(f_vec)))(X))
    close(staged(fx.jacfwd(fx.jacfwd(f_vec)))(X), jax.jit(jax.jacfwd(jax.jacfwd(f_vec)))(X))


@pytest.mark.slow
def test_grad_grad_grad():
    f = lambda x: fnp.sin(x) * fnp.exp(x)  # noqa: E731
    close(fx.grad(fx.grad(fx.grad(f)))(0.3), jax.jit(jax.grad(jax.grad(jax.grad(f))))(0.3))
    g = lambda x: fnp.sum(fnp.tanh(x) ** 3)  # noqa: E731
    close(fx.grad(lambda x: fnp.sum(fx.grad(g)(x) ** 2))(X), jax.jit(jax.grad(lambda x: jnp.sum(jax.grad(g)(x) ** 2)))(X))


@pytest.mark.slow
def test_vmap_vmap_grad():
    XSS = jnp.stack([XS, XS * 2])
    TS = jnp.stack([T, T * 0.5])
    got = fx.vmap(fx.vmap(fx.grad(loss), in_dims=(None, 0, 0)), in_dims=(None, 0, 0))(X, XSS, TS)
    want = jax.jit(jax.vmap(jax.vmap(jax.grad(loss), in_axes=(None, 0, 0)), in_axes=(None, 0, 0)))(X, XSS, TS)
    close(got, want)


@pytest.mark.slow
def test_jvp_grad_and_vjp_vmap():
    close(fx.jvp(fx.grad(f_scalar), (X,), (V,)), jax.jvp(jax.jit(jax.grad(f_scalar)), (X,), (V,)))
    out, vjp_fn = fx.vjp(fx.vmap(f_vec), XS)
    jout, jvjp_fn = jax.vjp(jax.jit(jax.vmap(f_vec)), XS)
    close(out, jout)
    ct = jnp.ones((5, 4))
    close(vjp_fn(ct), jvjp_fn(ct))


@pytest.mark.slow
def test_vmap_jacrev_jacfwd_hessian():
    close(fx.vmap(fx.jacrev(f_vec))(XS), jax.jit(jax.vmap(jax.jacrev(f_vec)))(XS))
    close(staged(fx.vmap(fx.jacfwd(f_vec)))(XS), jax.jit(jax.vmap(jax.jacfwd(f_vec)))(XS))
    close(staged(fx.vmap(fx.hessian(f_scalar)))(XS), jax.jit(jax.vmap(jax.hessian(f_scalar)))(XS))


@pytest.mark.slow
def test_grad_through_vmap_and_vmap_of_vjp_fn():
    close(fx.grad(lambda x: fnp.sum(fx.vmap(f_vec)(x)))(XS), jax.jit(jax.grad(lambda x: jnp.sum(jax.vmap(f_vec)(x))))(XS))
    _, vjp_fn = fx.vjp(f_vec, X)
    _, jvjp_fn = jax.vjp(f_vec, X)
    cts = jnp.eye(4)
    close(fx.vmap(vjp_fn)(cts), jax.jit(jax.vmap(jvjp_fn))(cts))


@pytest.mark.slow
def test_maml_style_grad_through_inner_grads():
    def inner(w, x, t):
        for _ in range(2):
            w = w - 0.1 * fx.grad(loss)(w, x, t)
        return loss(w, x, t)

    def jinner(w, x, t):
        for _ in range(2):
            w = w - 0.1 * jax.jit(jax.grad(loss))(w, x, t)
        return loss(w, x, t)

    close(fx.grad(inner)(X, XS[0], T[0]), jax.jit(jax.grad(jinner))(X, XS[0], T[0]))
    close(fx.vmap(fx.grad(inner), in_dims=(None, 0, 0))(X, XS, T),
          jax.jit(jax.vmap(jax.grad(jinner), in_axes=(None, 0, 0)))(X, XS, T))


# --------------------------------------------------------------------------
# JAX transforms around functx transforms


@pytest.mark.slow
def test_jax_jit_and_jax_vmap_around_functx():
    close(jax.jit(fx.grad(f_scalar))(X), jax.jit(jax.grad(f_scalar))(X))
    close(jax.jit(jax.vmap(fx.grad(f_scalar)))(XS), jax.jit(jax.vmap(jax.grad(f_scalar)))(XS))
    close(jax.grad(lambda x: jnp.sum(fx.grad(f_scalar)(x)))(X),
          jax.jit(jax.grad(lambda x: jnp.sum(jax.grad(f_scalar)(x))))(X))
    close(jax.jit(fx.vmap(fx.grad(loss), in_dims=(None, 0, 0)))(X, XS, T),
          jax.jit(jax.vmap(jax.grad(loss), in_axes=(None, 0, 0)))(X, XS, T))


def test_lift_of_jax_transform_inside_functx():
    jg = fx.lift(jax.jit(jax.grad(lambda w, x: jnp.sum(jnp.sin(w * x)))))
    close(fx.vmap(jg, in_dims=(None, 0))(X, XS),
          jax.jit(jax.vmap(jax.grad(lambda w, x: jnp.sum(jnp.sin(w * x))), in_axes=(None, 0)))(X, XS))
    close(fx.grad(lambda w: fnp.sum(jg(w, X)))(Y),
          jax.jit(jax.grad(lambda w: jnp.sum(jax.grad(lambda w, x: jnp.sum(jnp.sin(w * x)))(w, X))))(Y))


# --------------------------------------------------------------------------
# Nesting regressions


def test_no_perturbation_confusion():
    assert fx.grad(lambda x: fx.grad(lambda y: x * y)(1.0))(2.0) == 1.0
    # closure over an outer tracer in forward mode too
    d = fx.jvp(lambda x: fx.jvp(lambda y: x * y, (1.0,), (1.0,))[1], (2.0,), (1.0,))[1]
    assert d == 1.0
    # reverse over forward with the same variable captured
    f = lambda x: fx.grad(lambda y: fnp.sin(x * y))(x)  # noqa: E731
    close(fx.grad(f)(0.7), jax.jit(jax.grad(lambda x: jax.grad(lambda y: jnp.sin(x * y))(x)))(0.7))


def test_closure_over_outer_batched_value():
    def f(x):
        return fx.grad(lambda y: fnp.sum(x * y ** 2))(Y)

    close(fx.vmap(f)(XS), jax.jit(jax.vmap(lambda x: jax.grad(lambda y: jnp.sum(x * y ** 2))(Y)))(XS))


@pytest.mark.slow
def test_python_control_flow_on_concrete_values():
    def f(x):
        if fnp.sum(x) > 0:
            return fnp.sum(fnp.sin(x))
        return fnp.sum(fnp.cos(x))

    xp = jnp.abs(X)
    close(fx.grad(f)(xp), jnp.cos(xp))
    close(fx.grad(f)(-xp), jnp.sin(xp))
    close(fx.jvp(f, (xp,), (V,))[1], jnp.sum(jnp.cos(xp) * V))

    def g(x):
        n = int(x.shape[0])
        total = 0.0
        for i in range(n):
            if float(x[i]) > 0.0:
                total = total + x[i] ** 2
        return total

    close(fx.grad(g)(X), jnp.where(X > 0, 2 * X, 0.0))


def test_symbolic_zeros_cost_nothing():
    """An input that does not reach the output adds no equation to the
    linear graph, and its cotangent is materialised only at the boundary."""
    from functx.transforms.grad import linearize_reverse

    r = linearize_reverse(lambda x, y: fnp.sin(x), (X, Y), False, "test")
    assert len(r.linear.graph.eqns) == 1  # the mul by cos(x) only
    close(fx.grad(lambda x, y: fnp.sum(fnp.sin(x)), argnums=1)(X, Y), jnp.zeros(3))


@pytest.mark.slow
def test_check_grads_on_the_test_functions():
    """functx.test_util.check_grads: finite differences and the inner-product
    identity up to second order, eagerly."""
    from functx.test_util import check_grads

    check_grads(f_scalar, (X,), order=2)
    check_grads(f_vec, (X,), order=2)
    check_grads(f_two, (X, Y), order=2, modes=("rev",))
    check_grads(lambda w: loss(w, XS[0], T[0]), (X,), order=2)


@pytest.mark.slow
def test_equinox_module_as_a_differentiated_pytree():
    """Array leaves are differentiated; the module's functions and Python
    config get None, as with equinox.filter_grad."""
    import equinox as eqx

    mlp = eqx.nn.MLP(3, 2, 4, 1, key=jax.random.PRNGKey(0))

    def loss_m(m, x):
        return fnp.sum(fx.lift(m)(x) ** 2)

    g = fx.grad(loss_m)(mlp, X)
    want = eqx.filter_grad(lambda m, x: jnp.sum(m(x) ** 2))(mlp, X)
    assert g.activation is None and g.final_activation is None
    close(eqx.filter(g, eqx.is_array), eqx.filter(want, eqx.is_array))
    _, vjp_fn = fx.vjp(lambda m: fx.lift(m)(X), mlp)
    (ct,) = vjp_fn(jnp.ones(2))
    close(eqx.filter(ct, eqx.is_array), eqx.filter(eqx.filter_grad(lambda m: jnp.sum(m(X)))(mlp), eqx.is_array))
    jac = fx.jacrev(lambda m: fx.lift(m)(X))(mlp)
    jjac = eqx.filter_jacrev(lambda m: m(X))(mlp)
    close(eqx.filter(jac, eqx.is_array), eqx.filter(jjac, eqx.is_array))
    jac_f = fx.jacfwd(lambda m: fx.lift(m)(X))(mlp)
    close(eqx.filter(jac_f, eqx.is_array), eqx.filter(jjac, eqx.is_array))
    tangent = jax.tree_util.tree_map(lambda l: jnp.ones_like(l) if eqx.is_array(l) else l, mlp)
    out, t = fx.jvp(lambda m: fx.lift(m)(X), (mlp,), (tangent,))
    params, static = eqx.partition(mlp, eqx.is_array)
    ones = jax.tree_util.tree_map(jnp.ones_like, params)
    jout, jt = jax.jvp(lambda p: eqx.combine(p, static)(X), (params,), (ones,))
    close((out, t), (jout, jt))


def test_interpreter_stacks_are_per_thread():
    import threading

    results = {}
    barrier = threading.Barrier(2)

    def work(name, scale):
        def f(x):
            barrier.wait(timeout=60)  # both threads are inside a transform at once
            return fnp.sum(fnp.sin(x) * scale)

        results[name] = fx.grad(f)(X)

    threads = [threading.Thread(target=work, args=(n, s)) for n, s in (("a", 1.0), ("b", 3.0))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    close(results["a"], jnp.cos(X))
    close(results["b"], 3.0 * jnp.cos(X))


@pytest.mark.slow
def test_edge_structures():
    # a vector-to-scalar Jacobian is the gradient; a matrix input keeps its shape
    close(fx.jacrev(f_scalar)(X), jax.grad(f_scalar)(X))
    close(fx.hessian(lambda m: fnp.sum(fnp.sin(m) ** 2))(M), jax.hessian(lambda m: jnp.sum(jnp.sin(m) ** 2))(M))
    # outputs that ignore the batch, None leaves and nested containers
    out = fx.vmap(lambda x: {"a": (x * 2, None), "b": [Y]})(XS)
    close(out, {"a": (XS * 2, None), "b": [jnp.stack([Y] * 5)]})
    # differentiating only some arguments leaves the others alone
    g = fx.grad(lambda x, n: fnp.sum(x ** n), argnums=0)(X, 3)
    close(g, 3 * X ** 2)
    # vmap inside jvp inside vmap
    got = fx.vmap(lambda x: fx.jvp(fx.vmap(fnp.sin), (XS,), (XS * x[0],))[1])(XS)
    want = jax.vmap(lambda x: jax.jvp(jax.vmap(jnp.sin), (XS,), (XS * x[0],))[1])(XS)
    close(got, want)


# --------------------------------------------------------------------------
# JAX's contracts for results and the functions transforms return (issue 15)


@pytest.mark.slow
def test_jacrev_of_an_integer_output_raises_as_jax_and_torch_do():
    torch = pytest.importorskip("torch")

    def f(x):
        return (x > 0).astype(jnp.int32)

    with pytest.raises(TypeError):
        jax.jacrev(f)(X)
    with pytest.raises(RuntimeError, match="floating-point"):
        torch.func.jacrev(lambda t: (t > 0).to(torch.int32))(torch.tensor(np.asarray(X)))
    with pytest.raises(fx.FunctxTypeError, match=r"jacrev\(.*int32.*astype\(float\)"):
        fx.jacrev(f)(X)
    with pytest.raises(fx.FunctxTypeError, match=r"output\[1\] has dtype bool"):
        fx.jacrev(lambda x: (x * 2, x > 0))(X)
    # forward mode has zeros for it, as JAX's (and torch's) jacfwd
    got, want = fx.jacfwd(f)(X), jax.jacfwd(f)(X)
    assert got.dtype == want.dtype
    close(got, want)


@pytest.mark.slow
def test_jvp_of_an_integer_output_gives_zeros_of_its_dtype_as_torch_does():
    """torch.func.jvp/linearize give an integer or bool output a zero
    tangent of its own dtype; functx's interface follows torch there (JAX
    gives float0, an array with no data, which no torch user expects)."""
    torch = pytest.importorskip("torch")

    def f(x):
        return (x * 2).astype(jnp.int32), x > 0, x * 3

    def tf(t):
        return (t * 2).to(torch.int32), t > 0, t * 3

    xt = torch.tensor(np.asarray(X))
    tt = torch.ones_like(xt)
    for got, want in [(fx.jvp(f, (X,), (jnp.ones_like(X),)), torch.func.jvp(tf, (xt,), (tt,))),
                      ((f(X), fx.linearize(f, X)[1](jnp.ones_like(X))),
                       (tf(xt), torch.func.linearize(tf, xt)[1](tt)))]:
        (_, _, _), (ti, tb, tr) = got
        (_, _, _), (wi, wb, wr) = want
        assert ti.dtype == jnp.int32 and wi.dtype == torch.int32
        assert tb.dtype == jnp.bool_ and wb.dtype == torch.bool
        np.testing.assert_array_equal(np.asarray(ti), wi.numpy())
        np.testing.assert_array_equal(np.asarray(tb), wb.numpy())
        close(tr, jnp.asarray(wr.numpy()))
    assert jax.jvp(f, (X,), (jnp.ones_like(X),))[1][0].dtype == jax.dtypes.float0


def _weak(tree):
    """(dtype, weak_type) per array leaf; None for the Python scalars JAX
    returns unconverted (functx returns arrays there)."""
    return [(a.dtype, a.weak_type) if isinstance(a, jax.Array) else None
            for a in tree_util.tree_leaves(tree)]


_STRONG = np.float64(2.0)
_WEAK_FNS = {
    "identity": lambda x: x,
    "scale": lambda x: x * 2.0,
    "sin": lambda x: fnp.sin(x) * x,
    "strong_const": lambda x: x * _STRONG,
    "unused": lambda x: 3.0 * fnp.ones(()),
    "astype": lambda x: (x * 2.0).astype(jnp.float32).astype(jnp.float64),
    "pair": lambda x: (x * 2.0, fnp.sin(x) * _STRONG),
}


@pytest.mark.parametrize("x", [1.5, jnp.float64(1.5)], ids=["python", "strong"])
@pytest.mark.slow
def test_results_keep_jaxs_weak_types(x):
    # (a Python float is weakly typed, also as a jit argument)
    def results(m, f, x):
        jvp_ = m.jvp(f, (x,), (x,))
        _, vjp_fn = m.vjp(f, x)
        ct = tree_util.tree_map(jnp.ones_like, jax.vjp(f, x)[0])
        lin = m.linearize(f, x)[1](x)
        r = [m.jacfwd(f)(x), m.jacrev(f)(x), m.hessian(f)(x), jvp_, vjp_fn(ct), lin]
        if not isinstance(jax.eval_shape(f, x), tuple):
            r += [m.grad(f)(x), m.grad(m.grad(f))(x)]
        return r

    for name, f in _WEAK_FNS.items():
        want = staged(lambda x, f=f: results(jax, f, x))(x)
        got = staged(lambda x, f=f: results(fx, f, x))(x)
        for k, (w, g) in enumerate(zip(want, got)):
            pairs = [(a, b) for a, b in zip(_weak(w), _weak(g)) if a is not None]
            assert all(a == b for a, b in pairs), (name, k, pairs)
    # the blocks of a Jacobian are cast to the leaf JAX casts them to, whatever
    # the rules in between did (tanh's derivative, a where, a strong constant)
    for f in (lambda x: fnp.tanh(x) * _STRONG, lambda x: fnp.where(x > 0, x, 0.0)):
        for jac, jjac in ((fx.jacrev, jax.jacrev), (fx.jacfwd, jax.jacfwd), (fx.hessian, jax.hessian)):
            assert _weak(jac(f)(x)) == _weak(jjac(f)(x))


def f_res(x):
    return fnp.sin(x) * fnp.exp(x[::-1])


@pytest.mark.slow
def test_vjp_fn_and_jvp_fn_are_pytrees():
    ct = jnp.linspace(-1.0, 1.0, 3)
    want_ct = jax.vjp(f_res, X)[1](ct)
    want_t = jax.linearize(f_res, X)[1](V)
    # returned from jax.jit (and functx.jit), then called twice
    for jit in (jax.jit, fx.jit):
        vjp_fn = jit(lambda x: fx.vjp(f_res, x)[1])(X)
        close(vjp_fn(ct), want_ct)
        close(vjp_fn(ct), want_ct)
        jvp_fn = jit(lambda x: fx.linearize(f_res, x)[1])(X)
        close(jvp_fn(V), want_t)
        close(jvp_fn(V), want_t)
    # their leaves are the residuals (arrays), the rest is static
    _, vjp_fn = fx.vjp(f_res, X)
    leaves, treedef = tree_util.tree_flatten(vjp_fn)
    assert leaves and all(isinstance(a, jax.Array) for a in leaves)
    close(tree_util.tree_unflatten(treedef, leaves)(ct), want_ct)
    close(tree_util.tree_map(lambda a: a + 0.0, vjp_fn)(ct), want_ct)
    # passed into jax.jit as an argument, and mapped over by vmap inside
    close(jax.jit(lambda g, c: g(c))(vjp_fn, ct), want_ct)
    cts = jnp.stack([ct, 2 * ct])
    close(fx.vmap(vjp_fn)(cts), jax.vmap(jax.vjp(f_res, X)[1])(cts))
    # returned as aux from an outer transform: its residuals are unboxed
    def outer(x):
        _, fn = fx.vjp(lambda y: fnp.sin(y) * x, x)
        return fnp.sum(fn(ct)[0]), fn
    close(fx.grad(outer, has_aux=True)(X)[1](ct), jax.vjp(lambda y: jnp.sin(y) * X, X)[1](ct))
    # a function that left a vmap holds batched residuals: refused when called
    batched = fx.vmap(lambda x: fx.vjp(f_res, x)[1])(XS)
    with pytest.raises(fx.FunctxValueError, match=r"vjp_fn\(cotangents\).*f64\[5,3\].*f64\[3\]"):
        batched(ct)


def test_linearize_has_aux_matches_jax():
    def f(x):
        return fnp.sin(x) * x, {"norm": fnp.sum(x ** 2), "n": 3}

    out, jvp_fn, aux = fx.linearize(f, X, has_aux=True)
    j_out, j_jvp_fn, j_aux = jax.linearize(f, X, has_aux=True)
    close(out, j_out)
    close(aux, j_aux)
    close(jvp_fn(V), j_jvp_fn(V))


Z = jnp.asarray([1.0 + 2.0j, 0.5 - 1.0j])


@pytest.mark.slow
def test_holomorphic_matches_jax():
    def f(z):
        return z ** 2 * fnp.sin(z)

    for jac, jjac in ((fx.jacrev, jax.jacrev), (fx.jacfwd, jax.jacfwd), (fx.hessian, jax.hessian)):
        close(jac(f, holomorphic=True)(Z), jjac(f, holomorphic=True)(Z))
    s = lambda z: fnp.sum(f(z))
    close(fx.grad(s, holomorphic=True)(Z), jax.grad(s, holomorphic=True)(Z))
    close(fx.grad_and_value(s, holomorphic=True)(Z),
          jax.value_and_grad(s, holomorphic=True)(Z)[::-1])
    close(fx.vjp(f, Z, holomorphic=True)[1](jnp.ones_like(Z)), jax.vjp(f, Z)[1](jnp.ones_like(Z)))
    # without holomorphic=True, complex outputs (grad, jacrev) and complex
    # inputs (jacfwd) are refused, as in JAX; real outputs of complex inputs
    # are not
    for bad, jbad in ((fx.grad(s), jax.grad(s)), (fx.jacrev(f), jax.jacrev(f)),
                      (fx.jacfwd(f), jax.jacfwd(f))):
        with pytest.raises(TypeError):
            jbad(Z)
        with pytest.raises(fx.FunctxTypeError, match="holomorphic=True"):
            bad(Z)
    r = lambda z: fnp.abs(z) ** 2
    close(fx.jacrev(r)(Z), jax.jacrev(r)(Z))


def test_allow_int_matches_jax():
    n = jnp.arange(3)

    def f(x, n, flag):
        return fnp.sum(x * n)

    def check(got, want):
        gl, wl = tree_util.tree_leaves(got), tree_util.tree_leaves(want)
        assert tree_util.tree_structure(got) == tree_util.tree_structure(want)
        for a, b in zip(gl, wl):
            assert (a.dtype, np.shape(a)) == (b.dtype, np.shape(b))
            if a.dtype != jax.dtypes.float0:
                close(a, b)

    args = (X, n, n > 0)
    nums = (0, 1, 2)
    check(fx.grad(f, argnums=nums, allow_int=True)(*args),
          jax.grad(f, argnums=nums, allow_int=True)(*args))
    check(fx.grad_and_value(f, argnums=nums, allow_int=True)(*args),
          jax.value_and_grad(f, argnums=nums, allow_int=True)(*args)[::-1])
    g = lambda x, n, flag: x * n
    # (JAX's jacrev fails on a bool input: it casts float0 rows to bool)
    check(fx.jacrev(g, argnums=(0, 1), allow_int=True)(*args),
          jax.jacrev(g, argnums=(0, 1), allow_int=True)(*args))
    check(fx.vjp(g, *args, allow_int=True)[1](X), jax.vjp(g, *args)[1](X))
    key = jax.random.key(0)
    check(fx.grad(lambda x, k: fnp.sum(x), argnums=(0, 1), allow_int=True)(X, key),
          jax.grad(lambda x, k: jnp.sum(x), argnums=(0, 1), allow_int=True)(X, key))
    # by default an integer input is refused, as torch.func refuses it
    with pytest.raises(fx.FunctxTypeError, match="allow_int=True"):
        fx.grad(f, argnums=1)(*args)
    with pytest.raises(fx.FunctxTypeError, match="dtype int"):
        fx.vjp(g, *args)


def test_jacobians_of_functions_without_outputs():
    # jacrev and hessian give what jacfwd gives (the empty structure)
    for f in (lambda x: None, lambda x: (), lambda x: {"a": None, "b": ()}):
        want = fx.jacfwd(f)(X)
        assert want == jax.jacfwd(f)(X)
        assert fx.jacrev(f)(X) == want
        assert fx.hessian(f)(X) == want
    jac, aux = fx.jacrev(lambda x: (None, fnp.sum(x)), has_aux=True)(X)
    assert jac is None
    close(aux, jnp.sum(X))
    assert fx.vmap(fx.jacrev(lambda x: None))(XS) is None
    # and no differentiated leaves (an empty dict) is no IndexError either
    assert fx.jacfwd(lambda d, y: y * 2)({}, X) == {}
    assert fx.jacrev(lambda d, y: y * 2)({}, X) == {}
