"""Named vmap axes and the collectives of functx.lax (NOTE [named axes] in
functx/primitives/collectives.py), against jax.vmap(axis_name=...) with
jax.lax's collectives on the same programs."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import functx
import functx.lax as fl
import functx.numpy as fnp
from functx.errors import FunctxError

X = jnp.array([0.5, -1.25, 2.0, 0.75])
M = jnp.array([[0.3, -0.2, 1.1], [0.7, 0.4, -0.9], [-0.5, 1.3, 0.2], [0.9, -1.4, 0.6]])


def close(a, b):
    jax.tree_util.tree_map(
        lambda u, v: np.testing.assert_allclose(np.asarray(u), np.asarray(v), rtol=1e-12,
                                                atol=1e-12), a, b)


# The same program written against functx.lax (L=fl) and jax.lax (L=jax.lax)
def normalise(L, np_):
    def f(x):
        return np_.sin(x) * x / L.psum(x * x, "i") + L.pmean(np_.cos(x), "i")
    return f


def reductions(L, np_):
    def f(x):
        return (L.pmax(x, "i") - L.pmin(x * x, "i")) * x + L.psum(2.0, "i")
    return f


def indexed(L, np_):
    def f(x):
        i = L.axis_index("i")
        return x * i + L.psum(x * i, "i")
    return f


def gathered(L, np_):
    def f(x):
        g = L.all_gather(np_.sin(x), "i")
        return np_.sum(g * g) * x
    return f


def scattered(L, np_):
    def f(x):  # x: a row of 4 per batch element
        return L.psum_scatter(np_.sin(x) * x, "i") * 2.0
    return f


def permuted(L, np_):
    def f(x):
        return L.ppermute(np_.sin(x), "i", [(0, 1), (1, 2), (2, 3), (3, 0)]) * x
    return f


def shifted(L, np_):
    def f(x):  # element 3 receives nothing: zeros
        return L.ppermute(x * x, "i", [(0, 1), (1, 2), (3, 0)]) + x
    return f


def scalar_programs():
    return [normalise, reductions, indexed, gathered, permuted]


@pytest.mark.parametrize("prog", scalar_programs(), ids=lambda p: p.__name__)
@pytest.mark.slow
def test_vmap_matches_jax(prog):
    close(functx.vmap(prog(fl, fnp), axis_name="i")(X),
          jax.vmap(prog(jax.lax, jnp), axis_name="i")(X))


def test_jax_collectives_of_a_constant_over_a_functx_axis_match_jax():
    """jax.lax collectives given a value no transform traces (a constant)
    over a functx.vmap's axis name: an unbatched operand of functx's
    collective, as in JAX (all_gather reached JAX's eager implementation:
    an internal AssertionError)."""
    x = jnp.arange(3.0)
    for name, g in {
        "all_gather of 1": lambda x: jax.lax.all_gather(1, axis_name="i"),
        "all_gather of ones": lambda x: jax.lax.all_gather(jnp.ones(2), axis_name="i"),
        "psum of 1": lambda x: jax.lax.psum(1, "i"),
        "tiled all_gather + x": lambda x: jax.lax.all_gather(jnp.ones(2), "i", tiled=True).sum() + x,
    }.items():
        out = 0 if name.endswith("x") else None
        got = functx.vmap(g, axis_name="i", out_dims=out)(x)
        want = jax.vmap(g, axis_name="i", out_axes=out)(x)
        close(got, want)


def test_partial_permutation_sends_zeros():
    # jax.vmap refuses a partial permutation; on devices the missing
    # destinations get zeros, and so they do here
    out = functx.vmap(shifted(fl, fnp), axis_name="i")(X)
    expected = np.asarray(X).copy()
    for src, dst in [(0, 1), (1, 2), (3, 0)]:
        expected[dst] += float(X[src]) ** 2
    close(out, expected)
    g = functx.vmap(functx.grad(lambda x: shifted(fl, fnp)(x) * x), axis_name="i")(X)
    assert np.all(np.isfinite(np.asarray(g)))


@pytest.mark.slow
def test_psum_scatter_and_tiled_all_gather_match_jax():
    close(functx.vmap(scattered(fl, fnp), axis_name="i")(jnp.tile(M[:, :1], (1, 4))),
          jax.vmap(scattered(jax.lax, jnp), axis_name="i")(jnp.tile(M[:, :1], (1, 4))))
    rows = jnp.arange(32.0).reshape(4, 8) / 7.0

    def tiled(L):
        return lambda r: L.psum_scatter(r * r, "i", tiled=True)

    close(functx.vmap(tiled(fl), axis_name="i")(rows), jax.vmap(tiled(jax.lax), axis_name="i")(rows))

    def gather_tiled(L):
        return lambda r: L.all_gather(r, "i", axis=0, tiled=True)

    close(functx.vmap(gather_tiled(fl), axis_name="i")(M),
          jax.vmap(gather_tiled(jax.lax), axis_name="i")(M))

    def gather_axis1(L):
        return lambda r: L.all_gather(r, "i", axis=1)

    close(functx.vmap(gather_axis1(fl), axis_name="i")(M),
          jax.vmap(gather_axis1(jax.lax), axis_name="i")(M))


def test_in_dims_and_out_dims_with_axis_name():
    def f(L):
        return lambda x, y: L.psum(x * y, "b")

    close(functx.vmap(f(fl), in_dims=(1, None), out_dims=0, axis_name="b")(M, 2.0),
          jax.vmap(f(jax.lax), in_axes=(1, None), out_axes=0, axis_name="b")(M, 2.0))


def test_axis_size():
    out = functx.vmap(lambda x: x * fl.axis_size("i"), axis_name="i")(X)
    close(out, X * 4)


@pytest.mark.parametrize("prog", [normalise, reductions, indexed, gathered, permuted],
                         ids=lambda p: p.__name__)
@pytest.mark.slow
def test_vmap_of_grad(prog):
    def loss(L, np_):
        f = prog(L, np_)
        return lambda x: np_.sum(np_.tanh(f(x)) * x)

    if prog in (reductions,):  # JAX has no derivative for pmax / pmin
        pytest.skip("pmax/pmin: no JAX derivative to compare with")
    close(functx.vmap(functx.grad(loss(fl, fnp)), axis_name="i")(X),
          jax.vmap(jax.grad(loss(jax.lax, jnp)), axis_name="i")(X))


@pytest.mark.parametrize("prog", scalar_programs(), ids=lambda p: p.__name__)
@pytest.mark.slow
def test_grad_of_vmap(prog):
    def total(L, np_, vmap, grad):
        f = vmap(prog(L, np_), axis_name="i")
        return grad(lambda xs: np_.sum(np_.sin(f(xs)) * xs))

    if prog is reductions:  # JAX has no derivative of pmax / pmin: the same on the batch
        def batch(xs):
            return (jnp.max(xs) - jnp.min(xs * xs)) * xs + 4 * 2.0
        expected = jax.grad(lambda xs: jnp.sum(jnp.sin(batch(xs)) * xs))(X)
    else:
        expected = total(jax.lax, jnp, jax.vmap, jax.grad)(X)
    close(total(fl, fnp, functx.vmap, functx.grad)(X), expected)


@pytest.mark.slow
def test_jacrev_and_jacfwd_of_vmap():
    def fn(L, np_, vmap):
        return lambda xs: vmap(normalise(L, np_), axis_name="i")(xs)

    close(functx.jacrev(fn(fl, fnp, functx.vmap))(X), jax.jacrev(fn(jax.lax, jnp, jax.vmap))(X))
    close(functx.jacfwd(fn(fl, fnp, functx.vmap))(X), jax.jacfwd(fn(jax.lax, jnp, jax.vmap))(X))


@pytest.mark.slow
def test_vmap_of_jacrev():
    def fn(L, np_):
        return lambda x: np_.sin(x) * L.psum(x * x, "i")

    f = lambda x: fn(fl, fnp)(x).reshape(())  # noqa: E731
    close(functx.vmap(functx.jacrev(f), axis_name="i")(X),
          jax.vmap(jax.jacrev(fn(jax.lax, jnp)), axis_name="i")(X))


@pytest.mark.slow
def test_jvp_through_and_inside_vmap():
    t = jnp.array([0.1, 0.2, -0.3, 0.4])
    f_fx = functx.vmap(normalise(fl, fnp), axis_name="i")
    f_jax = jax.vmap(normalise(jax.lax, jnp), axis_name="i")
    close(functx.jvp(f_fx, (X,), (t,)), jax.jvp(f_jax, (X,), (t,)))

    def inner(L, np_, jvp):
        f = normalise(L, np_)
        return lambda x, tx: jvp(f, (x,), (tx,))[1]

    close(functx.vmap(inner(fl, fnp, functx.jvp), axis_name="i")(X, t),
          jax.vmap(inner(jax.lax, jnp, jax.jvp), axis_name="i")(X, t))


def test_psum_transpose_is_psum_as_in_jax():
    # vmap(grad(psum)): the cotangent 1 of each element is summed again
    close(functx.vmap(functx.grad(lambda x: fl.psum(x, "i")), axis_name="i")(X),
          jax.vmap(jax.grad(lambda x: jax.lax.psum(x, "i")), axis_name="i")(X))
    # repeated, so eager caches (fused steps, compiled backward) come into play
    for _ in range(4):
        close(functx.vmap(functx.grad(lambda x: fl.psum(x * x, "i")), axis_name="i")(X),
              jax.vmap(jax.grad(lambda x: jax.lax.psum(x * x, "i")), axis_name="i")(X))


@pytest.mark.slow
def test_nested_named_vmaps():
    def f(L):
        def g(x):
            return (x * L.psum(x, "inner") + L.psum(x, "outer")
                    + L.psum(x * x, ("outer", "inner")) + L.axis_index("outer")
                    - L.pmean(x, ("inner", "outer")))
        return g

    close(functx.vmap(functx.vmap(f(fl), axis_name="inner"), axis_name="outer")(M),
          jax.vmap(jax.vmap(f(jax.lax), axis_name="inner"), axis_name="outer")(M))
    # the same name twice: the inner vmap shadows the outer one
    close(functx.vmap(functx.vmap(lambda x: fl.psum(x, "i"), axis_name="i"), axis_name="i")(M),
          jax.vmap(jax.vmap(lambda x: jax.lax.psum(x, "i"), axis_name="i"), axis_name="i")(M))


@pytest.mark.slow
def test_nested_with_unnamed_inner_vmap_and_grad():
    def f(L, np_, vmap, grad):
        def per_row(row):
            return grad(lambda r: np_.sum(np_.sin(r) * L.psum(r, "rows")))(row)
        return vmap(per_row, axis_name="rows")

    close(f(fl, fnp, functx.vmap, functx.grad)(M), f(jax.lax, jnp, jax.vmap, jax.grad)(M))

    def h(L, np_, vmap):
        return vmap(lambda row: vmap(lambda e: e * L.psum(e, "rows"))(row), axis_name="rows")

    close(h(fl, fnp, functx.vmap)(M), h(jax.lax, jnp, jax.vmap)(M))


@pytest.mark.slow
def test_jit_of_vmap_and_vmap_of_jit():
    f_fx = normalise(fl, fnp)
    f_jax = normalise(jax.lax, jnp)
    expected = jax.vmap(f_jax, axis_name="i")(X)
    close(functx.jit(functx.vmap(f_fx, axis_name="i"))(X), expected)
    close(functx.vmap(functx.jit(f_fx), axis_name="i")(X), expected)
    close(jax.jit(functx.vmap(f_fx, axis_name="i"))(X), expected)
    close(functx.jit(functx.vmap(functx.grad(lambda x: fnp.sum(f_fx(x))), axis_name="i"))(X),
          jax.jit(jax.vmap(jax.grad(lambda x: jnp.sum(f_jax(x))), axis_name="i"))(X))


@pytest.mark.slow
def test_collective_inside_control_flow_under_vmap():
    def f(L, cond):
        return lambda x: cond(x > 0, lambda v: L.psum(v, "i"), lambda v: v * 2.0, x)

    close(functx.vmap(f(fl, fl.cond), axis_name="i")(X),
          jax.vmap(f(jax.lax, jax.lax.cond), axis_name="i")(X))


@pytest.mark.slow
def test_eager_repeats_are_stable():
    f = functx.vmap(normalise(fl, fnp), axis_name="i")
    expected = jax.vmap(normalise(jax.lax, jnp), axis_name="i")(X)
    for _ in range(4):
        close(f(X), expected)
    # the same program under a vmap of another size
    close(functx.vmap(normalise(fl, fnp), axis_name="i")(X[:3]),
          jax.vmap(normalise(jax.lax, jnp), axis_name="i")(X[:3]))


@pytest.mark.parametrize("background", [True, False])
@pytest.mark.slow
def test_eager_caches_never_compile_a_collective(monkeypatch, background):
    # fused steps and compiled backward passes would fix the axis size of the
    # first vmap in a compiled program: they must stay uncached (AxisNames)
    from functx import caches

    monkeypatch.setattr(caches, "BACKGROUND", background)
    functx.clear_caches()
    for n in (4, 3, 4, 3, 4, 3):
        xs = X[:n]
        close(functx.vmap(lambda x: functx.grad(lambda w: fl.psum(w * w, "i"))(1.5) + x,
                          axis_name="i")(xs),
              jax.vmap(lambda x: jax.grad(lambda w: jax.lax.psum(w * w, "i"))(1.5) + x,
                       axis_name="i")(xs))
        close(functx.vmap(functx.grad(lambda x: fl.psum(x, "i")), axis_name="i")(xs),
              jnp.full(n, float(n)))
        close(functx.vmap(lambda x: fl.psum(3.0, "i") * x, axis_name="i")(xs), n * 3.0 * xs)
        caches.wait_for_compiles()


G_FX = functx.jit(lambda c: fl.psum(c, "i") + fl.axis_index("i"))
G_JAX = jax.jit(lambda c: jax.lax.psum(c, "i") + jax.lax.axis_index("i"))


def _scan_psum(L):
    return lambda x: x + jax.lax.scan(lambda c, _: (c + L.psum(1.0, "i"), None), 0.0, None,
                                      length=3)[0]


def _grad_of_closure(L, grad, vmap, np_, xs):
    # a JAX loop body inside the vmap closing over a value of a grad outside it
    def outer(w):
        inner = lambda x: jax.lax.cond(True, lambda: L.psum(w * x * 0 + w, "i"),  # noqa: E731
                                       lambda: w) * x + jax.lax.cond(
            True, lambda: L.psum(w * w, "i"), lambda: w)
        return np_.sum(vmap(inner, axis_name="i")(xs))
    return grad(outer)(1.5)


@pytest.mark.parametrize("form", [
    "functx.jit", "jax.jit", "no operands", "functx cond", "jax cond", "jax scan",
    "jax.jit in functx.jit", "functx.jit in jax.jit", "vmap(grad)", "grad(vmap)", "jit(vmap)",
    "closure over grad"])
@pytest.mark.slow
def test_collective_in_program_without_batched_operand(form):
    # as JAX batches a jit whose program uses the vmap's axis: the program
    # is batched even when none of its operands is (sizes 4 and 3: never
    # computed for the first size met)
    forms = {
        "functx.jit": (lambda x: x + G_FX(2.0), lambda x: x + G_JAX(2.0)),
        "jax.jit": (lambda x: x + G_JAX(2.0), lambda x: x + G_JAX(2.0)),
        "no operands": (lambda x: x * functx.jit(lambda: fl.axis_index("i") * 1.5)(),
                        lambda x: x * jax.jit(lambda: jax.lax.axis_index("i") * 1.5)()),
        "functx cond": (lambda x: x + fl.cond(True, lambda c: fl.psum(c, "i"), lambda c: c, 2.0),
                        lambda x: x + jax.lax.cond(True, lambda c: jax.lax.psum(c, "i"),
                                                   lambda c: c, 2.0)),
        "jax cond": (lambda x: x + jax.lax.cond(True, lambda c: jax.lax.psum(c, "i"),
                                                lambda c: c, 2.0),) * 2,
        "jax scan": (_scan_psum(jax.lax),) * 2,
        "jax.jit in functx.jit": (lambda x: x + functx.jit(lambda c: G_JAX(c) * 2.0)(2.0),
                                  lambda x: x + jax.jit(lambda c: G_JAX(c) * 2.0)(2.0)),
        "functx.jit in jax.jit": (lambda x: x + jax.jit(lambda c: G_FX(c) * 2.0)(2.0),
                                  lambda x: x + jax.jit(lambda c: G_JAX(c) * 2.0)(2.0)),
    }
    for n in (4, 3):
        xs = X[:n]
        if form == "vmap(grad)":
            out = functx.vmap(functx.grad(lambda x: x * G_FX(x * 0 + 2.0) + G_FX(2.0) * x),
                              axis_name="i")(xs)
            expected = jax.vmap(jax.grad(lambda x: x * G_JAX(x * 0 + 2.0) + G_JAX(2.0) * x),
                                axis_name="i")(xs)
        elif form == "grad(vmap)":
            out = functx.grad(lambda v: fnp.sum(functx.vmap(lambda x: x * G_FX(2.0),
                                                            axis_name="i")(v) ** 2))(xs)
            expected = jax.grad(lambda v: jnp.sum(jax.vmap(lambda x: x * G_JAX(2.0),
                                                           axis_name="i")(v) ** 2))(xs)
        elif form == "closure over grad":
            out = _grad_of_closure(fl, functx.grad, functx.vmap, fnp, xs)
            expected = _grad_of_closure(jax.lax, jax.grad, jax.vmap, jnp, xs)
        elif form == "jit(vmap)":
            out = functx.jit(functx.vmap(lambda x: x + G_FX(2.0), axis_name="i"))(xs)
            expected = jax.jit(jax.vmap(lambda x: x + G_JAX(2.0), axis_name="i"))(xs)
        else:
            fx_f, jax_f = forms[form]
            out = functx.vmap(fx_f, axis_name="i")(xs)
            expected = jax.vmap(jax_f, axis_name="i")(xs)
        close(out, expected)


@pytest.mark.slow
def test_axis_size_in_staged_programs_follows_the_vmap():
    # pmean and axis_size inside a functx.jit function met under vmaps of
    # two sizes: the staged graph is not reused across sizes
    g = functx.jit(lambda c: fl.pmean(c, "i") + c * fl.axis_size("i"))
    h = jax.jit(lambda c: jax.lax.pmean(c, "i") + c * jax.lax.axis_size("i"))
    for n in (4, 3, 4):
        close(functx.vmap(g, axis_name="i")(X[:n]), jax.vmap(h, axis_name="i")(X[:n]))
    # pmean inside a control-flow body staged once by its code
    body = lambda v: v + fl.pmean(v * v, "i")  # noqa: E731
    for n in (4, 3):
        close(functx.vmap(lambda x: fl.cond(x > 0, body, lambda v: v, x), axis_name="i")(X[:n]),
              jax.vmap(lambda x: jax.lax.cond(x > 0, lambda v: v + jax.lax.pmean(v * v, "i"),
                                              lambda v: v, x), axis_name="i")(X[:n]))


@pytest.mark.slow
def test_chunked_named_vmap():
    # chunks know their offset and the whole batch's size: axis_index,
    # axis_size and reductions of unbatched values are those of the batch
    xs = jnp.linspace(-1.0, 2.0, 7)

    def f(L):
        return lambda x: (x * L.axis_index("i") + L.psum(1.5, "i") + L.axis_size("i")
                          + L.pmean(2.0, "i") + L.pmax(3.0, "i"))

    expected = jax.vmap(f(jax.lax), axis_name="i")(xs)
    for k in (1, 3, 7):
        close(functx.vmap(f(fl), axis_name="i", chunk_size=k)(xs), expected)
    close(functx.vmap(functx.grad(lambda x: fnp.sin(f(fl)(x))), axis_name="i", chunk_size=3)(xs),
          jax.vmap(jax.grad(lambda x: jnp.sin(f(jax.lax)(x))), axis_name="i")(xs))
    close(functx.jit(functx.vmap(f(fl), axis_name="i", chunk_size=3))(xs), expected)
    # collectives that need the whole batch refuse, naming chunk_size
    from functx.errors import ChunkedCollectiveError

    for bad in (lambda x: fl.psum(x, "i"), lambda x: fl.all_gather(x, "i"),
                lambda x: fl.ppermute(x, "i", [(0, 1), (1, 0)]), lambda x: G_FX(x)):
        with pytest.raises(ChunkedCollectiveError, match="chunk_size") as info:
            functx.vmap(bad, axis_name="i", chunk_size=2)(xs)
        assert isinstance(info.value, ValueError)


@pytest.mark.slow
def test_staged_bodies_do_not_fix_the_axis_size():
    # psum of a constant inside a staged body (cached by code) is recorded,
    # not computed for the first vmap's size
    def f(L, cond):
        return lambda x: cond(x > 0, lambda v: v + L.psum(2.0, "i"), lambda v: v * 2.0, x)

    for n in (4, 3, 4):
        close(functx.vmap(f(fl, fl.cond), axis_name="i")(X[:n]),
              jax.vmap(f(jax.lax, jax.lax.cond), axis_name="i")(X[:n]))
    g = functx.jit(lambda c: fl.psum(c, "i") + fl.axis_index("i"))
    for n in (4, 3):
        close(functx.vmap(lambda x: g(x), axis_name="i")(X[:n]),
              jax.vmap(lambda x: jax.lax.psum(x, "i") + jax.lax.axis_index("i"),
                       axis_name="i")(X[:n]))
    h = functx.jit(lambda c: fl.psum(c, "i"))
    for n in (4, 3):
        close(functx.vmap(lambda x: x + h(2.0), axis_name="i")(X[:n]), X[:n] + 2.0 * n)


def test_unbound_axis_name():
    with pytest.raises(NameError, match="axis name 'i' is not bound") as info:
        fl.psum(X, "i")
    assert isinstance(info.value, FunctxError)
    with pytest.raises(FunctxError, match=r"vmap\(axis_name='j'\).*axis_name='i'") as info:
        functx.vmap(lambda x: fl.psum(x, "i"), axis_name="j")(X)
    assert isinstance(info.value, NameError)
    with pytest.raises(NameError, match="pass|Pass axis_name='k'"):
        functx.vmap(functx.grad(lambda x: fl.pmean(x, "k")))(X)
    with pytest.raises(NameError, match="axis_index"):
        functx.vmap(lambda x: x * fl.axis_index("q"))(X)


def test_vmap_argument_checks():
    with pytest.raises(TypeError, match="spmd_axis_name"):
        functx.vmap(lambda x: x, spmd_axis_name=3)
    with pytest.raises(TypeError, match="axis_name"):
        functx.vmap(lambda x: x, axis_name=["a"])
    with pytest.raises(ValueError, match="chunk_size"):
        functx.vmap(lambda x: fl.psum(x, "i"), axis_name="i", chunk_size=2)(X)
    # with no mesh and nothing sharded, spmd_axis_name changes nothing (as jax.vmap's)
    close(functx.vmap(normalise(fl, fnp), axis_name="i", spmd_axis_name="d")(X),
          jax.vmap(normalise(jax.lax, jnp), axis_name="i", spmd_axis_name="d")(X))
    # a chunk at least the batch is no chunking
    close(functx.vmap(lambda x: fl.psum(x, "i"), axis_name="i", chunk_size=8)(X),
          jnp.full(4, X.sum()))


def test_jax_collectives_on_functx_values():
    def f(x):
        return x / jax.lax.psum(x, "i") + jax.lax.pmean(x * x, "i") + jax.lax.axis_index("i")

    close(functx.vmap(f, axis_name="i")(X), jax.vmap(f, axis_name="i")(X))
    close(functx.vmap(functx.grad(lambda x: jnp.sin(f(x))), axis_name="i")(X),
          jax.vmap(jax.grad(lambda x: jnp.sin(f(x))), axis_name="i")(X))


def test_functx_collective_under_jax_vmap():
    close(jax.vmap(lambda x: fl.psum(x, "i"), axis_name="i")(X), jnp.full(4, X.sum()))


@pytest.mark.parametrize("mode", ["ema", "batch"])
@pytest.mark.slow
def test_equinox_batchnorm_training(mode):
    eqx = pytest.importorskip("equinox")
    def make():  # an eqx.nn.State may be used once
        return eqx.nn.make_with_state(eqx.nn.BatchNorm)(3, axis_name="batch", mode=mode,
                                                        dtype=jnp.float64)

    bn, state = make()

    def f(x, state):
        return bn(x, state)

    out_fx, state_fx = functx.vmap(f, in_dims=(0, None), out_dims=(0, None),
                                   axis_name="batch")(M, make()[1])
    out_jax, state_jax = jax.vmap(f, in_axes=(0, None), out_axes=(0, None),
                                  axis_name="batch")(M, make()[1])
    close(out_fx, out_jax)
    close(state_fx, state_jax)

    # per-sample gradients of the affine parameters through the batch statistics
    def loss(w, b, x, st):
        model = eqx.tree_at(lambda m: (m.weight, m.bias), bn, (w, b))
        y, _ = model(x, st)
        return jnp.sum(jnp.tanh(y) * x)

    w, b = bn.weight * 1.5, bn.bias + 0.25
    grads_fx = functx.vmap(functx.grad(loss, argnums=(0, 1, 2)), in_dims=(None, None, 0, None),
                           axis_name="batch")(w, b, M, make()[1])
    grads_jax = jax.vmap(jax.grad(loss, argnums=(0, 1, 2)), in_axes=(None, None, 0, None),
                         axis_name="batch")(w, b, M, make()[1])
    close(grads_fx, grads_jax)


A2A = jnp.arange(4 * 4 * 6, dtype=jnp.float64).reshape(4, 4, 6) / 10


@pytest.mark.parametrize("split,concat,tiled,x", [
    (0, 0, False, A2A), (0, 1, False, A2A), (0, 1, True, A2A[:, :, :4]),
    (1, 0, True, A2A[:, :, :4].transpose(0, 2, 1)), (0, 0, True, A2A),
    (1, 1, True, A2A[:, :, :4].transpose(0, 2, 1))])
@pytest.mark.slow
def test_all_to_all(split, concat, tiled, x):
    def f(L, np_):
        return lambda v: L.all_to_all(np_.sin(v), "i", split, concat, tiled=tiled)

    expected = jax.vmap(f(jax.lax, jnp), axis_name="i")(x)
    close(functx.vmap(f(fl, fnp), axis_name="i")(x), expected)
    w = jnp.arange(expected.size, dtype=jnp.float64).reshape(expected.shape) / 7

    def total(L, np_, vmap, grad):
        return grad(lambda v: np_.sum(vmap(f(L, np_), axis_name="i")(v) * w))

    reference = total(jax.lax, jnp, jax.vmap, jax.grad)(x)
    close(total(fl, fnp, functx.vmap, functx.grad)(x), reference)
    # vmap(grad) (which jax.vmap cannot transpose here): the cotangent of
    # each element is w[0], so it equals grad(vmap) with w[0] everywhere
    w0 = jnp.broadcast_to(w[0], w.shape)
    per_sample = functx.vmap(functx.grad(lambda v: fnp.sum(f(fl, fnp)(v) * w[0])),
                             axis_name="i")(x)
    close(per_sample, jax.grad(lambda v: jnp.sum(jax.vmap(f(jax.lax, jnp), axis_name="i")(v)
                                                 * w0))(x))


@pytest.mark.slow
def test_jax_jit_function_with_collectives_under_named_vmap():
    f = jax.jit(lambda x: x / jax.lax.psum(x, "i") + jax.lax.axis_index("i")
                + jax.lax.pmean(x * x, "i"))
    close(functx.vmap(f, axis_name="i")(X), jax.vmap(f, axis_name="i")(X))
    close(functx.vmap(functx.grad(lambda x: jnp.sin(f(x))), axis_name="i")(X),
          jax.vmap(jax.grad(lambda x: jnp.sin(f(x))), axis_name="i")(X))
    close(functx.grad(lambda xs: jnp.sum(jnp.sin(functx.vmap(f, axis_name="i")(xs))))(X),
          jax.grad(lambda xs: jnp.sum(jnp.sin(jax.vmap(f, axis_name="i")(xs))))(X))


# Every collective in one program (one element: a row of 4; a batch of 4),
# swept over every composition against JAX's, float64. all_to_all is
# swept separately (test_all_to_all): jax.vmap cannot transpose it.
ROWS = jnp.asarray(np.random.default_rng(3).standard_normal((4, 4)))
T_ROWS = jnp.asarray(np.random.default_rng(4).standard_normal((4, 4)))


def everything(L, np_):
    def f(x):
        i = L.axis_index("i")
        a = np_.sin(x) * L.psum(x * x, "i") + L.pmean(np_.cos(x), "i")
        g = L.all_gather(np_.tanh(x), "i")
        s = L.psum_scatter(x * x, "i")
        p = L.ppermute(np_.sin(x), "i", [(0, 1), (1, 2), (2, 3), (3, 0)])
        return a + np_.sum(g, axis=0) * x + s * x + p * i
    return f


def _compositions(vmap, grad, jvp, vjp, jacrev, jacfwd, hessian, jit, np_):
    def batched(L):
        return vmap(everything(L, np_), axis_name="i")

    def per_element(L):
        return lambda x: np_.sum(np_.sin(everything(L, np_)(x)))

    return {
        "vmap": lambda L: batched(L)(ROWS),
        "jit(vmap)": lambda L: jit(batched(L))(ROWS),
        "jvp(vmap)": lambda L: jvp(batched(L), (ROWS,), (T_ROWS,)),
        "vjp(vmap)": lambda L: vjp(batched(L), ROWS)[1](T_ROWS),
        "jacrev(vmap)": lambda L: jacrev(batched(L))(ROWS),
        "jacfwd(vmap)": lambda L: jacfwd(batched(L))(ROWS),
        "hessian(vmap)": lambda L: hessian(lambda r: np_.sum(np_.sin(batched(L)(r))))(ROWS),
        "vmap(grad)": lambda L: vmap(grad(per_element(L)), axis_name="i")(ROWS),
        "vmap(jvp)": lambda L: vmap(lambda x, t: jvp(everything(L, np_), (x,), (t,))[1],
                                    axis_name="i")(ROWS, T_ROWS),
        "vmap(vjp)": lambda L: vmap(lambda x, c: vjp(everything(L, np_), x)[1](c)[0],
                                    axis_name="i")(ROWS, T_ROWS),
        "vmap(jacrev)": lambda L: vmap(jacrev(everything(L, np_)), axis_name="i")(ROWS),
        "vmap(jacfwd)": lambda L: vmap(jacfwd(everything(L, np_)), axis_name="i")(ROWS),
        "vmap(hessian)": lambda L: vmap(hessian(per_element(L)), axis_name="i")(ROWS),
        "jit(vmap(grad))": lambda L: jit(vmap(grad(per_element(L)), axis_name="i"))(ROWS),
        "vmap(jit)": lambda L: vmap(jit(everything(L, np_)), axis_name="i")(ROWS),
    }


FX_COMPOSITIONS = _compositions(functx.vmap, functx.grad, functx.jvp, functx.vjp, functx.jacrev,
                                functx.jacfwd, functx.hessian, functx.jit, fnp)
JAX_COMPOSITIONS = _compositions(jax.vmap, jax.grad, jax.jvp, jax.vjp, jax.jacrev, jax.jacfwd,
                                 jax.hessian, jax.jit, jnp)


@pytest.mark.parametrize("composition", list(FX_COMPOSITIONS))
@pytest.mark.slow
def test_every_collective_under_every_composition(composition):
    # Both sides compiled (eager transforms of this many operations would
    # take most of the suite's time), except the first few compositions:
    # eager functx is checked there (and throughout the tests above).
    fx = lambda: FX_COMPOSITIONS[composition](fl)  # noqa: E731
    if composition not in ("vmap", "vmap(grad)", "jvp(vmap)", "vjp(vmap)"):
        fx = functx.jit(fx)
    close(fx(), jax.jit(lambda: JAX_COMPOSITIONS[composition](jax.lax))())
