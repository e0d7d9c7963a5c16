"""functx.jit and make_graph: compile caching (call counters), every
composition in both orders against JAX's transforms (float64), inner jits
that stay one staged call under outer transforms, static and donated
arguments, the stateful generator threaded through compiled code, and the
printed program."""

import numpy as np
import pytest

import jax
import jax.numpy as jnp

import functx as fx
import functx.numpy as fnp
from functx.interpreters.staging import Graph

rng = np.random.default_rng(1)
X = jnp.asarray(rng.uniform(-1, 1, (3,)))
Y = jnp.asarray(rng.uniform(-1, 1, (3,)))
XS = jnp.asarray(rng.uniform(-1, 1, (4, 3)))
YS = jnp.asarray(rng.uniform(-1, 1, (4, 3)))


def close(a, b):
    la, ta = jax.tree_util.tree_flatten(a)
    lb, tb = jax.tree_util.tree_flatten(b)
    assert ta == tb
    for x, y in zip(la, lb):
        assert np.shape(x) == np.shape(y)
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-6, atol=1e-12)


def f_np(np_):
    def f(x, y):
        return np_.sum(np_.tanh(x) * np_.exp(y) * x) + np_.sum(np_.sin(x * y))
    return f


f_fx, f_jax = f_np(fnp), f_np(jnp)


class Counted:
    """A function that counts how often its Python body runs."""

    def __init__(self, fn):
        self.fn, self.calls = fn, 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return self.fn(*args, **kwargs)


# ---------------------------------------------------------------------------
# Caching


def test_second_call_with_same_signature_does_not_rerun_python():
    body = Counted(f_fx)
    jf = fx.jit(body)
    close(jf(X, Y), f_jax(X, Y))
    close(jf(Y, X), f_jax(Y, X))
    assert body.calls == 1
    jf(XS[0:2], YS[0:2, :3][0:2])  # a new shape traces again
    assert body.calls == 2
    jf(X.astype(jnp.float32), Y.astype(jnp.float32))  # a new dtype too
    assert body.calls == 3


def test_cached_calls_take_jaxs_cpp_path():
    """NOTE [no Python in front of a cached call]: what jit returns is JAX's
    C++ jitted-function type, so a cache hit runs no functx Python; the
    functx handler only sees misses."""
    jf = fx.jit(f_fx)
    assert type(jf) is type(jax.jit(f_jax))
    assert jf.__name__ == f_fx.__name__ and jf.__wrapped__ is f_fx
    handler = jf.functx_jitted
    misses = []
    original = type(handler)._miss

    def counting(self, jax_miss, args, kwargs):
        misses.append(1)
        return original(self, jax_miss, args, kwargs)

    type(handler)._miss = counting
    try:
        jg = fx.jit(lambda x, y: f_fx(x, y))  # built while the counter is installed
        for _ in range(3):
            close(jg(X, Y), f_jax(X, Y))
        # under a transform every call is a miss (functx values are not arrays)
        close(fx.grad(lambda x: jg(x, Y).sum())(X), jax.grad(lambda x: f_jax(x, Y).sum())(X))
    finally:
        type(handler)._miss = original
    assert len(misses) == 2


def test_static_arguments_key_the_cache():
    def h(x, n, scale=1.0):
        for _ in range(n):
            x = fnp.sin(x)
        return x * scale

    body = Counted(h)
    jh = fx.jit(body, static_argnums=1, static_argnames="scale")
    close(jh(X, 2), jnp.sin(jnp.sin(X)))
    close(jh(X + 1.0, 2), jnp.sin(jnp.sin(X + 1.0)))
    assert body.calls == 1
    close(jh(X, 3), jnp.sin(jnp.sin(jnp.sin(X))))
    close(jh(X, 2, scale=2.0), 2.0 * jnp.sin(jnp.sin(X)))
    assert body.calls == 3
    # static arguments also work on the staged path, under a transform
    close(fx.grad(lambda x: jh(x, 2, scale=3.0).sum())(X),
          jax.grad(lambda x: 3.0 * jnp.sin(jnp.sin(x)).sum())(X))


@pytest.mark.slow
def test_inner_jit_under_a_transform_is_staged_once():
    body = Counted(f_fx)
    jf = fx.jit(body)
    g = fx.grad(jf)
    close(g(X, Y), jax.grad(f_jax)(X, Y))
    close(g(Y, X), jax.grad(f_jax)(Y, X))
    close(fx.vmap(jf)(XS, YS), jax.vmap(f_jax)(XS, YS))
    close(fx.vmap(jf)(YS, XS), jax.vmap(f_jax)(YS, XS))
    # vmap sees per-example 3-vectors: the same signature as grad's, so the
    # graph staged for grad is reused (batched) and the body ran once
    assert body.calls == 1


def test_inner_jit_is_one_equation_of_the_outer_program():
    jf = fx.jit(f_fx)
    graph = fx.make_graph(fx.grad(jf))(X, Y)
    prims = [e.prim.name for e in graph.eqns]
    assert prims == ["jit_call", "jit_call"]  # the primal part and the transposed tangent part
    text = str(graph)
    assert "transpose(jvp(f))" in text and "tanh" in text


# ---------------------------------------------------------------------------
# Compositions, both orders


@pytest.mark.parametrize("name, fx_fn, jax_fn, args", [
    ("jit(vmap(grad))", fx.jit(fx.vmap(fx.grad(f_fx))), jax.vmap(jax.grad(f_jax)), (XS, YS)),
    ("jit(jacfwd(jacrev))", fx.jit(fx.jacfwd(fx.jacrev(f_fx))), jax.jacfwd(jax.jacrev(f_jax)), (X, Y)),
    ("jit(hessian)", fx.jit(fx.hessian(f_fx, argnums=1)), jax.hessian(f_jax, argnums=1), (X, Y)),
    ("grad(jit)", fx.grad(fx.jit(f_fx), argnums=(0, 1)), jax.grad(f_jax, argnums=(0, 1)), (X, Y)),
    ("vmap(jit)", fx.vmap(fx.jit(f_fx), in_dims=(1, None)), jax.vmap(f_jax, in_axes=(1, None)),
     (XS.T, Y)),
    ("jacrev(jacrev(jit))", fx.jacrev(fx.jacrev(fx.jit(f_fx))), jax.hessian(f_jax), (X, Y)),
    ("jacfwd(grad(jit))", fx.jacfwd(fx.grad(fx.jit(f_fx))), jax.hessian(f_jax), (X, Y)),
    ("vmap(grad(jit))", fx.vmap(fx.grad(fx.jit(f_fx))), jax.vmap(jax.grad(f_jax)), (XS, YS)),
    ("grad(vmap(jit)).sum", fx.grad(lambda x, y: fx.vmap(fx.jit(f_fx))(x, y).sum()),
     jax.grad(lambda x, y: jax.vmap(f_jax)(x, y).sum()), (XS, YS)),
    ("jit(grad(jit))", fx.jit(fx.grad(fx.jit(f_fx))), jax.grad(f_jax), (X, Y)),
])
@pytest.mark.slow
def test_composition_matches_jax(name, fx_fn, jax_fn, args):
    close(fx_fn(*args), jax_fn(*args))


@pytest.mark.slow
def test_jvp_and_linearize_of_jit():
    jf = fx.jit(f_fx)
    out, t = fx.jvp(jf, (X, Y), (Y, X))
    close((out, t), jax.jvp(f_jax, (X, Y), (Y, X)))
    out, lin = fx.linearize(lambda x: jf(x, Y), X)
    close(lin(Y), jax.jvp(lambda x: f_jax(x, Y), (X,), (Y,))[1])
    close(lin(X), jax.jvp(lambda x: f_jax(x, Y), (X,), (X,))[1])


def test_vjp_of_jit_with_a_zero_cotangent_and_unused_input():
    def two(x, y):
        return fnp.sin(x), fnp.cos(x) * 2.0

    out, vjp_fn = fx.vjp(fx.jit(two), X, Y)
    cx, cy = vjp_fn((jnp.zeros(3), Y))
    close(cx, -2.0 * jnp.sin(X) * Y)
    close(cy, jnp.zeros(3))


def test_jit_inside_jit_and_inside_jax_jit():
    inner = fx.jit(lambda a: fnp.sin(a) * 2.0)
    outer = fx.jit(lambda a: fx.grad(lambda b: inner(b).sum())(a) + inner(a))
    close(outer(X), 2.0 * jnp.cos(X) + 2.0 * jnp.sin(X))
    close(jax.jit(fx.grad(fx.jit(f_fx)))(X, Y), jax.grad(f_jax)(X, Y))


def test_closure_over_an_outer_tracer_is_differentiated():
    # the inner jit closes over `y`, a value of the enclosing grad
    def outer(y):
        return fx.jit(lambda x: fnp.sum(x * y ** 2))(X)

    close(fx.grad(outer)(Y), jax.grad(lambda y: jnp.sum(X * y ** 2))(Y))
    close(fx.vmap(outer)(YS), jax.vmap(lambda y: jnp.sum(X * y ** 2))(YS))


def test_pytrees_in_and_out():
    k = fx.jit(lambda d: {"a": d["x"] * 2.0, "b": (fnp.sin(d["y"]), None)})
    out = k({"x": X, "y": Y})
    close(out, {"a": X * 2.0, "b": (jnp.sin(Y), None)})
    g = fx.grad(lambda d: k(d)["a"].sum() + k(d)["b"][0].sum())({"x": X, "y": Y})
    close(g, {"x": jnp.full(3, 2.0), "y": jnp.cos(Y)})


def test_donated_arguments_give_the_same_result():
    d = fx.jit(lambda a, b: a * 2.0 + b, donate_argnums=0)
    close(d(jnp.array(X), Y), X * 2.0 + Y)


def test_lower_gives_jax_lowering():
    lowered = fx.jit(f_fx).lower(X, Y)
    assert "tanh" in lowered.as_text()
    close(lowered.compile()(X, Y), f_jax(X, Y))


def test_compiler_options_reach_xla():
    # a valid option compiles the same function; an unknown one is XLA's error
    # naming it (so the dict is handed to XLA, as jax.jit's compiler_options)
    close(fx.jit(f_fx, compiler_options={"xla_cpu_enable_fast_math": False})(X, Y), f_jax(X, Y))
    with pytest.raises(Exception, match="xla_no_such_option"):
        fx.jit(f_fx, compiler_options={"xla_no_such_option": True})(X, Y)
    with pytest.raises(fx.FunctxTypeError, match=r"jit\(.*compiler_options must be None or a dict"):
        fx.jit(f_fx, compiler_options=[("xla_cpu_enable_fast_math", False)])
    # on XLA:CPU versions that offload dots to YNNPACK, the option documented
    # in the README (Performance) turns that off
    a, b = jnp.ones((64, 128), jnp.float32), jnp.ones((128, 128), jnp.float32)
    mm = lambda a, b: fnp.tanh(a @ b)  # noqa: E731
    if "__ynn_fusion" in fx.jit(mm).lower(a, b).compile().as_text():
        off = fx.jit(mm, compiler_options={"xla_cpu_experimental_ynn_fusion_type": ""})
        assert "__ynn_fusion" not in off.lower(a, b).compile().as_text()
        close(off(a, b), jnp.tanh(a @ b))


def _in_ynn(compiled_text):
    return "__ynn_fusion" in compiled_text


@pytest.mark.slow
def test_large_products_compile_without_ynnpack_on_cpu():
    """NOTE [XLA:CPU's matrix-product library]: on the CPU backend a program
    whose largest product reaches LARGE_PRODUCT multiply-adds, and whose
    operand matrices are all at most LARGEST_MATRIX bytes, compiles with
    YNNPACK's products off; other ones, and any program whose
    compiler_options name the option, compile as jax.jit's. The choice
    traces the Python function once, and cached calls run no Python. The
    programs that thread the generator state and those eager transforms
    compile follow the same rule."""
    from functx import xla_cpu

    small = (jnp.ones((16, 64), jnp.float32), jnp.ones((64, 64), jnp.float32))
    big = (jnp.ones((512, 256), jnp.float32), jnp.ones((256, 256), jnp.float32))  # 32M
    assert 512 * 256 * 256 >= xla_cpu.LARGE_PRODUCT > 16 * 64 * 64
    mm = lambda a, b: fnp.tanh(a @ b)  # noqa: E731
    if jax.default_backend() != "cpu" or not _in_ynn(jax.jit(mm).lower(*big).compile().as_text()):
        pytest.skip("this XLA computes no products in YNNPACK")
    body = Counted(mm)
    jf = fx.jit(body)
    for args in (small, big):
        close(jf(*args), jnp.tanh(args[0] @ args[1]))
        close(jf(*args), jnp.tanh(args[0] @ args[1]))
    assert body.calls == 2  # one trace per signature, cached calls in C++
    assert _in_ynn(jf.lower(*small).compile().as_text())
    assert not _in_ynn(jf.lower(*big).compile().as_text())
    # a product with a 32 MB operand matrix keeps YNNPACK: XLA's own dot may
    # hold a copy of it, which chunk_size is there to avoid
    wide = (jnp.ones((128, 512), jnp.float32), jnp.ones((512, 16384), jnp.float32))
    assert 512 * 16384 * 4 > xla_cpu.LARGEST_MATRIX
    assert _in_ynn(fx.jit(mm).lower(*wide).compile().as_text())
    # the same inside a loop body, and under transforms traced by JAX
    looped = fx.jit(lambda a, b: jax.lax.fori_loop(0, 2, lambda i, c: mm(a, b) + c, a @ b))
    assert not _in_ynn(looped.lower(*big).compile().as_text())
    per_row = fx.jit(fx.vmap(fx.grad(lambda a, b: mm(a, b).sum()), in_dims=(0, None)))
    a3 = jnp.ones((64, 8, 256), jnp.float32)  # 64 x 8 x 256 x 256 = 32M
    assert not _in_ynn(per_row.lower(a3, big[1]).compile().as_text())
    close(per_row(a3, big[1]),
          jax.vmap(jax.grad(lambda a, b: jnp.tanh(a @ b).sum()), in_axes=(0, None))(a3, big[1]))
    # a program drawing from the stateful generator chooses per signature too
    noisy = fx.jit(lambda a, b: mm(a, b) + fx.random.rand(a.shape[0], b.shape[1]))
    for args, large in ((small, False), (big, True), (small, False)):
        fx.random.manual_seed(11)
        got = noisy(*args)
        fx.random.manual_seed(11)
        close(got, jnp.tanh(args[0] @ args[1]) + fx.random.rand(args[0].shape[0], args[1].shape[1]))
        assert _in_ynn(noisy.lower(*args).compile().as_text()) is not large
    # options the user sets win
    keep = fx.jit(mm, compiler_options={xla_cpu.YNN_OPTION: "LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT"})
    assert _in_ynn(keep.lower(*big).compile().as_text())
    close(keep(*big), jnp.tanh(big[0] @ big[1]))
    # inside an enclosing JAX trace a program is part of the enclosing one
    # (JAX takes compiler options at the top level only)
    close(jax.jit(lambda a, b: jf(a, b) * 2)(*big), 2 * jnp.tanh(big[0] @ big[1]))
    summed = fx.jit(lambda a, b: mm(a, b).sum())
    want = jax.grad(lambda a, b: jnp.tanh(a @ b).sum())(*big)
    close(jax.jit(fx.grad(summed))(*big), want)
    close(jax.jit(lambda a: fx.grad(lambda a: mm(a, big[1]).sum())(a))(big[0]), want)
    # what eager transforms compile (a graph as one program, a single
    # eager dot_general) follows the same rule
    from functx.interpreters.eval import compiled, impl_rules
    from functx.primitives.dot import dot_general_p

    for args, large in ((small, False), (big, True)):
        graph = fx.make_graph(mm)(*args)
        assert _in_ynn(compiled(graph).lower(*args).compile().as_text()) is not large
    impl = impl_rules[dot_general_p]
    (params,) = [e.params for e in fx.make_graph(mm)(*big).eqns if e.prim is dot_general_p]
    for args, large in ((small, False), (big, True)):
        close(impl(*args, **params), args[0] @ args[1])
        program = impl.programs[(tuple(params.items()), True, large)][0]  # at the top level
        assert _in_ynn(program.lower(*args).compile().as_text()) is not large


# ---------------------------------------------------------------------------
# The stateful generator under jit


def test_generator_state_is_threaded_through_compiled_calls():
    draw = fx.jit(lambda x: fx.random.rand(3) + x)
    fx.random.manual_seed(7)
    a, b = draw(1.0), draw(1.0)
    fx.random.manual_seed(7)
    ea, eb = fx.random.rand(3) + 1.0, fx.random.rand(3) + 1.0
    close((a, b), (ea, eb))
    assert not np.allclose(a, b)


@pytest.mark.slow
def test_generator_state_through_nested_jits():
    inner = fx.jit(lambda: fx.random.randn(2))
    outer = fx.jit(lambda: inner() * 2.0)
    fx.random.manual_seed(3)
    got = [outer(), outer()]
    fx.random.manual_seed(3)
    want = [fx.random.randn(2) * 2.0, fx.random.randn(2) * 2.0]
    close(got, want)


@pytest.mark.slow
def test_generator_draws_under_an_outer_transform_run_inline():
    draw = fx.jit(lambda x: x * fx.random.rand(3))
    fx.random.manual_seed(5)
    g1, g2 = fx.grad(lambda x: draw(x).sum())(1.0), fx.grad(lambda x: draw(x).sum())(1.0)
    fx.random.manual_seed(5)
    e1, e2 = fx.random.rand(3).sum(), fx.random.rand(3).sum()
    close((g1, g2), (e1, e2))


# ---------------------------------------------------------------------------
# make_graph and errors


def test_make_graph_prints_one_line_per_primitive_with_shapes():
    graph = fx.make_graph(fx.vmap(fx.grad(f_fx)))(XS, YS)
    assert isinstance(graph, Graph)
    text = str(graph)
    assert text.startswith("{ lambda a:f64[4,3] b:f64[4,3].")
    assert "tanh" in text and "cos" in text and "f64[4,3] = mul" in text
    assert len(text.splitlines()) == len(graph.eqns) + 2
    # the graph evaluates to the transform's result
    close(graph(XS, YS)[0], jax.vmap(jax.grad(f_jax))(XS, YS))


def test_make_graph_static_argnums():
    graph = fx.make_graph(lambda x, n: fnp.sin(x) * n, static_argnums=1)(X, 3)
    assert [e.prim.name for e in graph.eqns] == ["sin", "mul"]


def test_jit_errors_name_the_argument():
    with pytest.raises(fx.FunctxTypeError, match=r"jit\(func\).*callable"):
        fx.jit(3)
    with pytest.raises(fx.FunctxValueError, match=r"static_argnums.*out of range"):
        fx.jit(lambda x: x, static_argnums=3)
    jf = fx.jit(lambda x, s: x * len(s), static_argnums=1)
    with pytest.raises(fx.FunctxValueError, match=r"static arguments must be hashable"):
        fx.grad(lambda x: jf(x, [1, 2]))(1.0)



def test_jit_static_argument_errors_name_the_argument_and_the_fix():
    # JAX refuses each of these too (with raw errors or none of its own)
    with pytest.raises(TypeError):
        jax.jit(lambda x: x, static_argnums="a")
    with pytest.raises(fx.FunctxTypeError, match=r"jit\(.*static_argnums='a'.*ints.*static_argnames"):
        fx.jit(lambda x: x, static_argnums="a")
    with pytest.raises(fx.FunctxTypeError, match=r"static_argnames=3.*strs.*static_argnames=\('n',\)"):
        fx.jit(lambda x: x, static_argnames=3)
    with pytest.raises(fx.FunctxTypeError, match=r"donate_argnums.*ints"):
        fx.jit(lambda x: x, donate_argnums=(1.5,))
    with pytest.raises(ValueError, match="invalid argnames"):
        jax.jit(lambda x, n=1: x, static_argnames="m")
    with pytest.raises(fx.FunctxValueError, match=r"static_argnames='m'.*no parameter 'm'.*x, n.*Fix the name"):
        fx.jit(lambda x, n=1: x, static_argnames="m")
    with pytest.raises(fx.FunctxValueError, match=r"out of range.*1 positional argument\. Use positions in \[-1, 1\), or drop 3"):
        fx.jit(lambda x: x, static_argnums=3)
    # a function taking **kwargs accepts any name, as in JAX
    g = fx.jit(lambda x, **kw: x * kw["n"], static_argnames="n")
    close(g(X, n=3), jax.jit(lambda x, **kw: x * kw["n"], static_argnames="n")(X, n=3))
    # an unhashable static argument, at top level and under a transform
    f = fx.jit(lambda x, s, t=(): x * len(s) + len(t), static_argnums=1, static_argnames="t")
    close(f(X, (1, 2), t=(3,)), X * 2 + 1)
    with pytest.raises(ValueError, match="Non-hashable"):
        jax.jit(lambda x, s: x, static_argnums=1)(X, [1])
    for call in (lambda: f(X, [1, 2]), lambda: fx.grad(lambda x: fnp.sum(f(x, [1])))(X)):
        with pytest.raises(fx.FunctxValueError, match=r"jit\(<lambda>\).*argument 1 is a list.*tuple"):
            call()
    with pytest.raises(fx.FunctxValueError, match=r"argument 't' is a dict.*hashable"):
        f(X, (1,), t={})
    # the wrapper keeps what jit's result offers
    assert f.lower(X, (1,)).compile() is not None
    assert f.functx_jitted is not None and f.__name__ == "<lambda>"


@pytest.mark.slow
def test_per_sample_weight_gradients_are_not_transposed_copies():
    # the cotangent of W in x @ W is outer(x, ct) as laid out; the program
    # JAX writes for the same thing transposes each per-example gradient
    def loss(w, x):
        return fnp.sum(fnp.tanh(x @ w) ** 2)

    w, xs = jnp.ones((3, 2)), XS
    lowered = fx.jit(fx.vmap(fx.grad(loss), in_dims=(None, 0))).lower(w, xs)
    assert "transpose" not in lowered.as_text()
    close(lowered.compile()(w, xs),
          jax.vmap(jax.grad(lambda w, x: jnp.sum(jnp.tanh(x @ w) ** 2)), in_axes=(None, 0))(w, xs))


def test_chunked_vmap_under_jit_is_a_loop_that_bounds_memory():
    w = jnp.asarray(rng.uniform(-1, 1, (3, 256)))
    xs = jnp.asarray(rng.uniform(-1, 1, (64, 3)))

    def f(x):  # a wide per-example intermediate, a small output
        return fnp.sum(fnp.tanh(x @ w) ** 2)

    full = fx.jit(fx.vmap(fx.grad(f))).lower(xs).compile()
    full_temp = full.memory_analysis().temp_size_in_bytes
    for k, bound in ((8, 0.25), (24, 0.75)):  # 24 leaves a partial last chunk of 16
        lowered = fx.jit(fx.vmap(fx.grad(f), chunk_size=k)).lower(xs)
        assert "while" in lowered.as_text()
        compiled = lowered.compile()
        close(compiled(xs), full(xs))
        assert compiled.memory_analysis().temp_size_in_bytes < bound * full_temp


@pytest.mark.slow
def test_chunked_jacrev_under_jit_is_a_loop():
    w = jnp.asarray(rng.uniform(-1, 1, (3, 16)))

    def f(x):
        return fnp.tanh(w.T @ x)

    lowered = fx.jit(fx.jacrev(f, chunk_size=4)).lower(X)
    assert "while" in lowered.as_text()
    close(lowered.compile()(X), jax.jacrev(lambda x: jnp.tanh(w.T @ x))(X))


@pytest.mark.slow
def test_ensemble_forward_and_backward_lower_without_transposes():
    # vmap over stacked weights with a shared minibatch: `x @ W[model]`
    # broadcasts x rather than folding the model axis into W's columns
    # (which makes XLA copy W and the result around)
    ws = jnp.asarray(rng.uniform(-1, 1, (5, 3, 4)))

    def loss(w, x):
        return fnp.sum(fnp.tanh(x @ w) ** 2)

    lowered = fx.jit(fx.vmap(fx.grad(loss), in_dims=(0, None))).lower(ws, XS)
    assert "transpose" not in lowered.as_text()
    close(lowered.compile()(ws, XS),
          jax.vmap(jax.grad(lambda w, x: jnp.sum(jnp.tanh(x @ w) ** 2)), in_axes=(0, None))(ws, XS))


@pytest.mark.slow
def test_batched_matrix_vector_product_does_not_broadcast_the_matrix():
    # the broadcast that pays for an ensemble must not be chosen for a
    # shared matrix times batched vectors (a B x n x n copy)
    w = jnp.asarray(rng.uniform(-1, 1, (16, 16)))
    vs = jnp.asarray(rng.uniform(-1, 1, (16, 16)))
    for in_dims in (0, 1):
        text = fx.jit(lambda vs: fx.vmap(lambda v: w @ v, in_dims=in_dims)(vs)).lower(vs).as_text()
        assert "16x16x16" not in text
    close(fx.vmap(lambda v: w @ v)(vs), jax.vmap(lambda v: w @ v)(vs))


def test_forward_part_of_a_gradient_computes_no_dropped_tangent_work():
    # log_softmax differentiates reduce_max and then drops that tangent
    # (stop_gradient): the forward part of grad(jit(f)) must neither compute
    # nor return the max's derivative (its location mask), as JAX's does not
    from functx.interpreters.jvp import jvp_graph

    def f(np_):
        return lambda x: -np_.sum(jax.nn.log_softmax(x, axis=-1)[:, 0])

    split = jvp_graph(fx.make_graph(f(fnp))(XS), (True,))
    prims = [e.prim.name for e in split.primal.eqns]
    assert "eq" not in prims and "convert_element_type" not in prims, prims
    # the loss and two residuals: exp(x - max) and the sum it is divided by
    assert len(split.primal.outputs) == 3
    close(fx.grad(fx.jit(f(fnp)))(XS), jax.grad(f(jnp))(XS))
