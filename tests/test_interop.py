"""JAX code inside functx transforms, unchanged (NOTE [JAX on functx values]
in functx/interop.py, NOTE [foreign primitives] in primitives/foreign.py):
jax.numpy / jax.nn / jax.lax / jax.jit helpers / custom rules called on
functx values with no `lift`, user primitives that only JAX has rules for,
and the JAX libraries users bring (optax, Equinox, Flax, diffrax, lineax,
optimistix). Every result against JAX's own transforms of the same program,
float64."""

import math
from functools import partial

import numpy as np
import pytest

import jax
import jax.numpy as jnp
from jax import tree_util

import functx as fx

X = jnp.array([0.5, 1.0, 2.0])
XS = jnp.stack([X, -X, X + 1.0])


def close(a, b):
    return all(np.allclose(p, q, rtol=1e-10, atol=1e-12)
               for p, q in zip(tree_util.tree_leaves(a), tree_util.tree_leaves(b), strict=True))


# Each: (name, f of one array argument).
FUNCTIONS = {
    "jnp.sin": lambda x: jnp.sin(x).sum(),
    "softmax": lambda x: (jax.nn.softmax(x) * jnp.arange(3.0)).sum(),
    "logsumexp": jax.nn.logsumexp,
    "argmax index": lambda x: x[jnp.argmax(x)] * x.sum(),
    "where": lambda x: jnp.where(x > 1.0, x ** 2, -x).sum(),
    "take + stack": lambda x: jnp.stack([jnp.take(x, jnp.array([0, 2])), x[:2] ** 2]).sum(),
    "asarray / array": lambda x: (jnp.asarray(x, jnp.float64) * jnp.array([x[0], 1.0, x[2]])).sum(),
    "linalg": lambda x: jnp.linalg.norm(jnp.linalg.solve(jnp.eye(3) * 2.0 + 0.1, x)),
    "custom_jvp relu/gelu": lambda x: (jax.nn.relu(x - 1.0) + jax.nn.gelu(x)).sum(),
    "jax.jit helper": lambda x: jax.jit(lambda v: jnp.tanh(v) @ v)(x),
    "jax.jit closing over": lambda x: jax.jit(lambda v: (v * x).sum())(jnp.ones(3)),
    "cond closure": lambda x: jax.lax.cond(x[0] > 0, lambda: x.sum(), lambda: -x.sum()),
    "fori closure": lambda x: jax.lax.fori_loop(0, 3, lambda i, c: c * x, jnp.ones(3)).sum(),
    "scan": lambda x: jax.lax.scan(lambda c, a: (c * a + x[0], c), 1.0, x)[0],
    "python if": lambda x: jnp.sum(x) if jnp.sum(x) > 0 else -jnp.sum(x),
}


@pytest.mark.parametrize("name", list(FUNCTIONS))
@pytest.mark.slow
def test_jax_functions_on_functx_values(name):
    f = FUNCTIONS[name]
    assert close(fx.grad(f)(X), jax.grad(f)(X))
    assert close(fx.jvp(f, (X,), (X,)), jax.jvp(f, (X,), (X,)))
    if name != "python if":
        assert close(fx.vmap(fx.grad(f))(XS), jax.vmap(jax.grad(f))(XS))
        assert close(fx.hessian(f)(X), jax.hessian(f)(X))


@pytest.mark.slow
def test_functx_jit_of_transforms_of_jax_code():
    f = FUNCTIONS["softmax"]
    assert close(fx.jit(fx.vmap(fx.grad(f)))(XS), jax.vmap(jax.grad(f))(XS))
    g = FUNCTIONS["fori closure"]
    assert close(fx.jit(fx.grad(g))(X), jax.grad(g)(X))


def test_jax_functions_on_a_closed_over_functx_value_inside_loop_bodies_under_staging():
    """A loop body or branch that applies a jax.numpy function (itself a
    `jax.jit`) to a functx value it closes over, while functx stages the
    whole function (`grad(jit(f))`): functx's staging folds constants, and
    JAX evaluated the body's operation on the functx value instead of
    staging it (a TypeError before the fix)."""
    def f(x):
        a = jax.lax.fori_loop(0, 2, lambda i, c: c * jnp.cos(x), x)
        b = jax.lax.cond(True, lambda: jnp.sin(x) * jnp.power(x, 2.0), lambda: x)
        c = jax.lax.scan(lambda c, v: (c * jnp.tanh(x[0]) + v, None), 1.0, x)[0]
        return (a * b).sum() + c

    expected = jax.grad(f)(X)
    assert close(fx.grad(fx.jit(f))(X), expected)
    assert close(fx.jit(fx.grad(f))(X), expected)
    assert close(fx.vmap(fx.grad(fx.jit(f)))(XS), jax.vmap(jax.grad(f))(XS))
    assert close(fx.jacrev(fx.jit(lambda x: f(x) * x))(X), jax.jacrev(lambda x: f(x) * x)(X))


def test_jax_takes_its_traced_path_for_a_functx_value_with_no_concrete_value():
    """JAX asks `core.is_concrete` before specialising on a value; a batched
    functx value is not concrete, so JAX uses its traced path (a while loop
    for a batched trip count, a traced power for a batched exponent, the
    primitive cond for a batched index under disable_jit) instead of calling
    int() on it, which raised functx's ConcretizationError. A concrete
    functx value (under grad) is still used as one."""
    n = jnp.arange(4)
    count = lambda x, n: jax.lax.fori_loop(0, n, lambda _, c: c * x + 1.0, 1.0)  # noqa: E731
    assert close(fx.vmap(count, in_dims=(None, 0))(1.5, n), jax.vmap(count, in_axes=(None, 0))(1.5, n))
    assert close(fx.jvp(lambda x: fx.vmap(count, in_dims=(None, 0))(x, n), (1.5,), (1.0,)),
                 jax.jvp(lambda x: jax.vmap(count, in_axes=(None, 0))(x, n), (1.5,), (1.0,)))
    power = lambda x, p: jnp.power(x, p)  # noqa: E731
    assert close(fx.vmap(power, in_dims=(None, 0))(2.0, n), jax.vmap(power, in_axes=(None, 0))(2.0, n))
    assert close(fx.grad(count)(1.5, 3), jax.grad(count)(1.5, 3))
    with jax.disable_jit():
        pick = lambda i, x: jax.lax.cond(i > 0, lambda x: x + 1.0, lambda x: x - 1.0, x)  # noqa: E731
        i, x = jnp.array([0, 1]), jnp.array([0.0, 0.0])
        assert close(fx.vmap(pick)(i, x), jax.vmap(pick)(i, x))


def test_data_dependent_branch_in_jax_code_under_vmap_names_the_line():
    with pytest.raises(fx.ConcretizationError, match="test_interop.py"):
        fx.vmap(FUNCTIONS["python if"])(XS)


@pytest.mark.slow
def test_user_custom_vjp_and_while_loop_closure():
    @jax.custom_vjp
    def clip_grad(x):
        return x

    clip_grad.defvjp(lambda x: (x, None), lambda _, g: (jnp.clip(g, -0.5, 0.5),))

    def f(x):
        return (clip_grad(x ** 2) * x).sum()

    assert close(fx.grad(f)(X), jax.grad(f)(X))
    assert close(fx.vmap(fx.grad(f))(XS), jax.vmap(jax.grad(f))(XS))

    def g(x):  # forward mode through a while loop closing over x
        return jax.lax.while_loop(lambda c: c[0] < 3, lambda c: (c[0] + 1, c[1] * x), (0, x))[1]

    assert close(fx.jvp(g, (X,), (X,)), jax.jvp(g, (X,), (X,)))
    assert close(fx.jacfwd(g)(X), jax.jacfwd(g)(X))


def _user_primitive():
    """A primitive defined the way a JAX library defines one: impl, abstract
    eval, jvp, transpose (of its linear companion) and batching, in JAX."""
    from jax.extend.core import Primitive
    from jax.interpreters import ad, batching, mlir

    cube = Primitive("test_user_cube")
    scale = Primitive("test_user_scale")  # linear: x * k
    for p, fn in ((cube, lambda x: x ** 3), (scale, lambda x, *, k: x * k)):
        p.def_impl(fn)
        p.def_abstract_eval(lambda x, **_: jax.core.ShapedArray(x.shape, x.dtype))
        mlir.register_lowering(p, mlir.lower_fun(fn, multiple_results=False))
    ad.defjvp(cube, lambda t, x: scale.bind(t, k=3.0) * x ** 2)
    ad.deflinear(scale, lambda ct, *, k: [scale.bind(ct, k=k)])
    batching.defvectorized(cube)
    batching.defvectorized(scale)
    return cube


@pytest.mark.slow
def test_a_primitive_only_jax_has_rules_for_borrows_them():
    cube = _user_primitive()

    def f(x):
        return jnp.sin(cube.bind(x)).sum()

    assert close(fx.grad(f)(X), jax.grad(f)(X))
    assert close(fx.jacfwd(fx.grad(f))(X), jax.jacfwd(jax.grad(f))(X))
    assert close(fx.vmap(fx.grad(f))(XS), jax.vmap(jax.grad(f))(XS))
    assert close(fx.jit(fx.grad(f))(X), jax.grad(f)(X))


def test_a_primitive_with_no_lowering_runs_by_its_python_implementation():
    """A borrowed primitive JAX can only run by its Python implementation
    (no lowering) runs eagerly in every call, the repeated ones too, whose
    combined programs cannot hold it."""
    from jax.extend.core import Primitive
    from jax.interpreters import ad, batching

    cube = Primitive("test_python_only_cube")
    cube.def_impl(lambda x: np.asarray(x) ** 3)
    cube.def_abstract_eval(lambda x: jax.core.ShapedArray(x.shape, x.dtype))
    ad.defjvp(cube, lambda t, x: t * 3.0 * x ** 2)
    batching.defvectorized(cube)

    def f(x):
        return jnp.sum(jnp.sin(cube.bind(x) * 1.3))

    for _ in range(3):
        assert close(fx.grad(f)(X), jax.grad(f)(X))
        fx.caches.wait_for_compiles()
    assert close(fx.vmap(f)(XS), jax.vmap(f)(XS))


def test_a_functx_value_given_to_jax_as_a_number_stays_a_value():
    """JAX's lax wrappers turn numbers into constants with `lax._const`
    after asking whether the value is a JAX tracer; a functx value is not
    one, so it reached NumPy and was refused. It is kept a value: its
    derivative and batch flow as JAX's would."""
    from jax._src.lax import lax as lax_module

    def scaled(c):  # the constant maker as every lax wrapper calls it
        return jnp.sum(jnp.cos(XS * lax_module._const(XS, c)))

    c = jnp.float32(0.7)
    assert close(fx.grad(scaled)(c), jax.grad(lambda c: jnp.sum(jnp.cos(XS * c)))(c))
    cs = jnp.array([0.2, 0.7, 1.1])
    assert close(fx.vmap(scaled)(cs), jax.vmap(lambda c: jnp.sum(jnp.cos(XS * c)))(cs))


@pytest.mark.skipif(not hasattr(jax.lax, "polynomial"), reason="jax.lax.polynomial is new in jax 0.12")
def test_polynomial_with_a_functx_coefficient_matches_jax():
    def f(c, x):
        return jnp.sum(jax.lax.polynomial(x, [1.0, c, 2.0, -0.5]))

    c = jnp.float32(3.0)
    for argnums in (0, 1):
        assert close(fx.grad(f, argnums=argnums)(c, X), jax.grad(f, argnums=argnums)(c, X))
    cs = jnp.array([0.5, 1.0, 3.0])
    assert close(fx.vmap(f, in_dims=(0, None))(cs, X), jax.vmap(f, in_axes=(0, None))(cs, X))


def test_a_primitive_without_any_jax_rule_names_itself_and_the_transform():
    def f(v):
        return jnp.sum(jax.lax.linalg.cholesky_update(jnp.eye(2) * 2.0, v))

    v = jnp.array([0.5, 0.25])
    assert close(fx.lift(f)(v), f(v))
    for transform in ("jacrev", "grad", "jacfwd"):
        with pytest.raises(fx.MissingRuleError, match=f"{transform}.*`cholesky_update`"):
            getattr(fx, transform)(f)(v)
    with pytest.raises(fx.MissingRuleError, match="vmap.*`cholesky_update`"):
        fx.vmap(f)(jnp.stack([v, v]))


# --------------------------------------------------------------------------
# Libraries (test-only dependencies)


@pytest.mark.slow
def test_optax_loss_and_update_step():
    optax = pytest.importorskip("optax")
    logits = jnp.linspace(-1.0, 1.0, 20).reshape(4, 5)
    labels = jnp.array([0, 1, 2, 3])

    def loss(l):
        return optax.softmax_cross_entropy_with_integer_labels(l, labels).mean()

    assert close(fx.grad(loss)(logits), jax.grad(loss)(logits))
    opt = optax.adam(1e-2)
    state = opt.init(logits)

    def meta(l, grad):
        updates, _ = opt.update(grad(loss)(l), state, l)
        return loss(optax.apply_updates(l, updates))

    assert close(fx.grad(lambda l: meta(l, fx.grad))(logits),
                 jax.grad(lambda l: meta(l, jax.grad))(logits))


@pytest.mark.slow
def test_equinox_model_called_directly():
    eqx = pytest.importorskip("equinox")
    mlp = eqx.nn.MLP(3, 2, 8, 2, key=jax.random.key(0))

    def loss(x):
        return jnp.sum(mlp(x) ** 2)

    assert close(fx.vmap(fx.grad(loss))(XS), jax.vmap(jax.grad(loss))(XS))
    assert close(fx.grad(lambda x: eqx.filter_jit(loss)(x))(X), jax.grad(loss)(X))
    params, static = eqx.partition(mlp, eqx.is_array)

    def per_param_loss(p, x):
        return jnp.sum(eqx.combine(p, static)(x) ** 2)

    got = fx.vmap(fx.grad(per_param_loss), in_dims=(None, 0))(params, XS)
    want = jax.vmap(jax.grad(per_param_loss), in_axes=(None, 0))(params, XS)
    assert close(got, want)
    # eqx.error_if: silent on valid input, raising on invalid input
    assert close(fx.grad(lambda x: eqx.error_if(x, x < 0, "negative").sum())(X), jnp.ones(3))
    with pytest.raises(Exception, match="negative"):
        fx.grad(lambda x: eqx.error_if(x, x < 0, "negative").sum())(-X)


@pytest.mark.slow
def test_flax_linen_and_nnx_ntk_by_vmap_jacrev():
    nn = pytest.importorskip("flax.linen")

    class MLP(nn.Module):
        @nn.compact
        def __call__(self, x):
            return nn.Dense(2)(jnp.tanh(nn.Dense(4)(x)))

    model = MLP()
    params = model.init(jax.random.key(0), X)
    got = fx.vmap(fx.jacrev(model.apply), in_dims=(None, 0))(params, XS)
    want = jax.vmap(jax.jacrev(model.apply), in_axes=(None, 0))(params, XS)
    assert close(got, want)
    nnx = pytest.importorskip("flax.nnx")
    graphdef, state = nnx.split(nnx.Linear(3, 2, rngs=nnx.Rngs(0)))

    def apply(state, x):
        return jnp.tanh(nnx.merge(graphdef, state)(x))

    got = fx.vmap(fx.jacrev(apply), in_dims=(None, 0))(state, XS)
    want = jax.vmap(jax.jacrev(apply), in_axes=(None, 0))(state, XS)
    assert close(got, want)


@pytest.mark.slow
def test_diffrax_ode_solve_under_transforms():
    diffrax = pytest.importorskip("diffrax")

    def solve(y0, a, adjoint=diffrax.RecursiveCheckpointAdjoint()):
        term = diffrax.ODETerm(lambda t, y, args: -args * jnp.tanh(y))
        sol = diffrax.diffeqsolve(term, diffrax.Tsit5(), 0.0, 1.0, 0.1, y0, args=a,
                                  saveat=diffrax.SaveAt(ts=jnp.linspace(0.0, 1.0, 3)),
                                  adjoint=adjoint)
        return sol.ys

    y0 = X[:2]

    def loss(y0, a):
        return solve(y0, a).sum()

    # (grad, vmap(grad) and jacfwd, under functx.jit: examples/neural_ode.py)
    ys = jnp.stack([y0, 2.0 * y0])
    assert close(fx.vmap(loss, in_dims=(0, None))(ys, 0.5), jax.vmap(loss, in_axes=(0, None))(ys, 0.5))


@pytest.mark.slow
def test_lineax_and_optimistix_implicit_derivatives():
    lx = pytest.importorskip("lineax")
    optx = pytest.importorskip("optimistix")
    a = jnp.array([[3.0, 1.0], [1.0, 2.0]])

    def lsolve(b):
        return jnp.sum(lx.linear_solve(lx.MatrixLinearOperator(a), b).value ** 2)

    b = X[:2]
    assert close(fx.vmap(fx.grad(lsolve))(XS[:, :2]), jax.vmap(jax.grad(lsolve))(XS[:, :2]))
    assert close(fx.hessian(lsolve)(b), jax.hessian(lsolve)(b))

    def root(c):
        sol = optx.root_find(lambda y, c: y ** 3 - c, optx.Newton(1e-10, 1e-10), jnp.array(1.0),
                             args=c)
        return sol.value

    cs = jnp.array([2.0, 3.0])
    assert close(fx.vmap(fx.grad(root))(cs), jax.vmap(jax.grad(root))(cs))
    assert close(fx.hessian(root)(2.0), jax.hessian(root)(2.0))


@pytest.mark.slow
def test_jax_checkpoint_in_jax_code_keeps_its_memory_saving():
    """A checkpointed recurrent cell in a scan: same gradient as JAX, and the
    compiled backward pass needs JAX's temp memory, less than without it;
    a saving policy (on dots, on `checkpoint_name`s) is followed as JAX
    follows it (more memory than saving nothing, the same as JAX's)."""
    from jax.ad_checkpoint import checkpoint_name

    h_size = 32
    cp = jax.checkpoint_policies

    def run(w, xs, policy):
        def cell(h, x):
            a = checkpoint_name(h @ w, "hw")
            return jnp.tanh(jnp.sin(a) @ w + x)

        body = cell if policy == "off" else jax.checkpoint(cell, policy=policy)
        h, _ = jax.lax.scan(lambda h, x: (body(h, x), None), jnp.zeros(h_size), xs)
        return h.sum()

    w, xs = jnp.eye(h_size) * 0.5, jnp.full((100, h_size), 0.1)

    def temp(grad, policy):
        fn = jax.jit(grad(lambda w: run(w, xs, policy)))
        return fn, fn.lower(w).compile().memory_analysis().temp_size_in_bytes

    temps = {}
    names_hw = cp.save_only_these_names("hw")  # (a new function per call from jax 0.12)
    for policy in (None, cp.dots_saveable, names_hw):
        fx_fn, fx_temp = temp(fx.grad, policy)
        jax_fn, jax_temp = temp(jax.grad, policy)
        assert close(fx_fn(w), jax_fn(w))
        assert fx_temp == jax_temp
        temps[policy] = fx_temp
    assert temps[None] < temps[names_hw] < temps[cp.dots_saveable]
    assert temps[None] < temp(fx.grad, "off")[1]


@pytest.mark.slow
def test_callbacks_in_jax_code_run_when_their_branch_runs():
    """jax.debug.callback in a lax.cond branch: called exactly as JAX calls
    it (once when taken, never when not), under grad, vmap and jit; an
    io_callback under grad refuses its derivative naming it and grad."""
    calls = []

    def record(v):
        calls.append(np.asarray(v).copy())

    def f(x, flag):
        def taken(x):
            jax.debug.callback(record, x)
            return x * 2.0

        return jax.lax.cond(flag, taken, lambda x: x * 3.0, x).sum()

    def count(fn):
        calls.clear()
        jax.block_until_ready(fn())
        return len(calls)

    for flag in (True, False):
        assert count(lambda: fx.grad(f)(X, flag)) == count(lambda: jax.grad(f)(X, flag))
        assert count(lambda: fx.vmap(lambda x: f(x, flag))(XS)) == \
            count(lambda: jax.vmap(lambda x: f(x, flag))(XS))
        assert count(lambda: fx.jit(fx.grad(f), static_argnums=1)(X, flag)) == int(flag)
    from jax.experimental import io_callback

    def g(x):
        return (io_callback(lambda v: np.asarray(v) * 0, jax.ShapeDtypeStruct((3,), X.dtype), x)
                + x).sum()

    with pytest.raises(fx.MissingRuleError, match="grad.*io_callback"):
        fx.grad(g)(X)


@pytest.mark.slow
def test_jax_jit_functions_run_as_one_call_eagerly(monkeypatch):
    """NOTE [JAX's jit programs stay calls]: eagerly, a jitted JAX function
    on functx values is one functx call (its graph transformed whole), not
    its equations one by one: fewer programs to compile, the same numbers
    as JAX; under functx.jit its equations are inlined as before."""
    from functx import interop

    compiles = []

    def listener(event, duration, **kwargs):
        if event == "/jax/core/compile/backend_compile_duration":
            compiles.append(kwargs.get("fun_name"))

    jax.monitoring.register_event_duration_secs_listener(listener)

    def loss(x):
        return (jax.nn.log_softmax(x, axis=-1) * jnp.arange(float(x.size)).reshape(x.shape)).sum()

    def count(shape):
        x = jnp.linspace(-1.0, 1.0, math.prod(shape)).reshape(shape)
        compiles.clear()
        got = fx.vmap(fx.grad(loss))(x)
        assert close(got, jax.vmap(jax.grad(loss))(x))
        return len(compiles)

    as_calls = count((3, 17, 5))  # shapes no other test uses
    monkeypatch.setattr(interop, "_AS_CALL", ())
    inlined = count((3, 17, 6))
    assert as_calls < inlined
    monkeypatch.undo()
    x = jnp.linspace(-1.0, 1.0, 10).reshape(2, 5)
    graph = str(fx.make_graph(fx.grad(loss))(x[0]))
    assert "jit_call" not in graph and "exp" in graph


@pytest.mark.slow
def test_jax_array_operators_defer_to_functx_values(monkeypatch):
    """NOTE [JAX on functx values]: `x @ w` with a JAX array `x` on the left
    and a functx value `w` on the right takes the functx value's reflected
    operator, as NumPy's operators do, not JAX's operator through its
    jitted ufunc and the jit hook (twice the Python per operation; JAX's
    `x ** v` asked a batched exponent for a Python number and raised); every
    operator gives JAX's values, derivatives and dtypes."""
    import operator

    from functx import interop

    x = jnp.array([0.5, 1.0, 2.0])
    m = jnp.array([[0.5, -1.0, 2.0], [1.5, 0.25, -0.75]])
    w = jnp.array([0.75, -1.25, 2.5])
    arithmetic = [operator.add, operator.sub, operator.mul, operator.truediv, operator.pow,
                  operator.floordiv, operator.mod]
    comparisons = [operator.lt, operator.le, operator.gt, operator.ge, operator.eq,
                   operator.ne]
    translated = []
    bind_jax = interop.bind_jax
    monkeypatch.setattr(interop, "bind_jax",
                        lambda *a: translated.append(a[0].name) or bind_jax(*a))
    for op in arithmetic + comparisons:
        got = fx.vmap(lambda v, op=op: op(x, v))(jnp.stack([w, w + 1.0]))
        want = jax.vmap(lambda v, op=op: op(x, v))(jnp.stack([w, w + 1.0]))
        assert got.dtype == want.dtype and close(got, want), op
    got = fx.vmap(lambda v: m @ v)(jnp.stack([w, w + 1.0]))
    assert close(got, jax.vmap(lambda v: m @ v)(jnp.stack([w, w + 1.0])))
    assert translated == [], translated
    for op in arithmetic[:5]:
        loss = lambda v, op=op: jnp.sum(op(jnp.abs(x) + 1.0, v) ** 2)
        assert close(fx.grad(loss)(w), jax.grad(loss)(w)), op
    loss = lambda v: jnp.sum(jnp.tanh(m @ v)) * jnp.sum(divmod(x, v)[1])
    assert close(fx.grad(loss)(w), jax.grad(loss)(w))


def test_a_transpose_jax_has_is_borrowed_for_functx_primitives(monkeypatch):
    """A library may register a JAX transpose rule JAX lacks (lineax does so
    for stop_gradient, applied to tangents in its own jvp rules): functx's
    reverse mode borrows it where its primitive has none, as jax.grad uses it."""
    from jax._src import ad_util
    from jax._src.interpreters import ad

    monkeypatch.setitem(ad.primitive_transposes, ad_util.stop_gradient_p, lambda ct, x: (ct,))

    @jax.custom_jvp
    def f(x):
        return jnp.sin(x)

    @f.defjvp
    def f_jvp(primals, tangents):
        (x,), (t,) = primals, tangents
        return jnp.sin(x), jnp.cos(x) * jax.lax.stop_gradient(t)

    def loss(x):
        return f(x).sum()

    assert close(fx.grad(loss)(X), jax.grad(loss)(X))
    assert close(fx.vmap(fx.grad(loss))(XS), jax.vmap(jax.grad(loss))(XS))


# --------------------------------------------------------------------------
# A custom rule reached through a JAX transform (jax.vmap, jax.jit) inside a
# functx transform: JAX binds it on its parent trace past the bind hook,
# which once ran the primal alone (relu's derivative at 0 came out 0.5, a
# custom_jvp's rule was ignored) or leaked a functx value into jax.jit's
# program (EscapedTracerError).

@jax.custom_jvp
def _scaled_sin(x):
    return jnp.sin(x)


_scaled_sin.defjvp(lambda p, t: (jnp.sin(p[0]), 100.0 * jnp.cos(p[0]) * t[0]))


@jax.custom_vjp
def _clipped_id(x):
    return x


_clipped_id.defvjp(lambda x: (x, x), lambda r, c: (jnp.clip(c, -0.1, 0.1) * jnp.exp(r),))

_CUSTOM = {"relu": jax.nn.relu, "custom_jvp": _scaled_sin, "custom_vjp": _clipped_id}
_JAX_WRAPS = {
    "jax.vmap": lambda f: jax.vmap(f),
    "jax.vmap in_axes=1": lambda f: lambda m: jax.vmap(f, in_axes=1, out_axes=1)(m),
    "jax.vmap(jax.vmap)": lambda f: jax.vmap(jax.vmap(f)),
    "jax.jit(jax.vmap)": lambda f: jax.jit(jax.vmap(f)),
}
_M = jnp.array([[0.0, -0.5, 2.0], [1.5, 0.0, -1.0]])


@pytest.mark.slow
@pytest.mark.parametrize("wrap", list(_JAX_WRAPS))
@pytest.mark.parametrize("rule", list(_CUSTOM))
def test_custom_rules_through_jax_transforms_keep_their_derivative(rule, wrap):
    inner = _JAX_WRAPS[wrap](_CUSTOM[rule])

    def loss(m):
        return jnp.sum(inner(m) * jnp.arange(1.0, 7.0).reshape(2, 3))

    want = jax.grad(loss)(_M)
    assert close(fx.grad(loss)(_M), want)
    assert close(jax.jit(fx.grad(loss))(_M), want)
    assert close(fx.vmap(fx.grad(loss))(jnp.stack([_M, -_M])),
                 jax.vmap(jax.grad(loss))(jnp.stack([_M, -_M])))
    if rule != "custom_vjp":  # forward mode of a custom_vjp: JAX has none
        assert close(fx.jvp(loss, (_M,), (jnp.ones_like(_M),)),
                     jax.jvp(loss, (_M,), (jnp.ones_like(_M),)))


def test_jax_code_trying_for_a_static_integer_takes_its_traced_path_under_vmap():
    """jax.numpy's power takes a concrete integer exponent through
    `operator.index` and catches the TypeError a tracer raises; roll does
    the same with its shift. A batched functx value used as an index raises
    IndexConcretizationError, a ConcretizationError that is also a
    TypeError, so both take their traced path, as under jax.vmap (before:
    the ConcretizationError escaped)."""
    import operator

    a = jnp.asarray(np.random.default_rng(3).uniform(0.5, 2.0, (3, 2, 3)))
    exps = jnp.asarray([[1, 2, 3], [2, 0, 1]], jnp.int32)
    exps = jnp.stack([exps, exps + 1, exps * 2])
    shifts = jnp.asarray([1, -2, 3])

    def power(x, n):
        return jnp.sum(jnp.power(x, n))

    def roll(x, s):
        return jnp.sum(jnp.sin(jnp.roll(x, s, axis=1)) * jnp.arange(3.0)[None, :])

    for f, b in ((power, exps), (roll, shifts)):
        assert close(fx.vmap(fx.grad(f))(a, b), jax.vmap(jax.grad(f))(a, b))
        assert close(fx.vmap(f)(a, b), jax.vmap(f)(a, b))

    def index(s):
        return operator.index(s)

    with pytest.raises(fx.IndexConcretizationError, match="vmap") as info:
        fx.vmap(index)(shifts)
    assert isinstance(info.value, TypeError) and isinstance(info.value, fx.ConcretizationError)


def test_redefined_custom_rules_take_effect_and_the_object_is_held_weakly():
    """`defvjp` / `defjvp` again on the same jax.custom_vjp / custom_jvp
    object: the next call uses the new rule, as JAX's transforms do (before:
    the lifted program staged with the old rule was reused, keyed on the
    object, which stays the same). The cache does not keep the object alive
    (NOTE [lifting])."""
    import gc
    import weakref

    @jax.custom_vjp
    def f(x):
        return jnp.sin(x) * x

    @jax.custom_jvp
    def h(x):
        return jnp.sin(x) * x

    for k in (1.0, 2.0, 3.0):
        f.defvjp(lambda x: (jnp.sin(x) * x, x), lambda x, g, k=k: (k * g * x,))
        h.defjvp(lambda p, t, k=k: (jnp.sin(p[0]) * p[0], k * t[0] * p[0]))
        for _ in range(2):  # the second call through the caches
            assert close(fx.grad(lambda x: f(x).sum())(X), jax.grad(lambda x: f(x).sum())(X))
            assert close(fx.vmap(fx.grad(f))(X), jax.vmap(jax.grad(f))(X))
            assert close(fx.grad(lambda x: h(x).sum())(X), jax.grad(lambda x: h(x).sum())(X))
            assert close(fx.jvp(h, (X,), (X,)), jax.jvp(h, (X,), (X,)))
            assert close(fx.jit(fx.grad(f))(0.5), jax.grad(f)(0.5))
    refs = weakref.ref(f), weakref.ref(h)
    del f, h
    gc.collect()
    assert all(r() is None for r in refs)

    q = jax.custom_jvp(lambda x: jnp.sin(x) * x)
    for k in (4.0, 5.0):  # (defjvps's rule calls the object: the program holds it)
        q.defjvps(lambda t, y, x, k=k: k * t)
        assert close(fx.grad(lambda x: q(x).sum())(X), jax.grad(lambda x: q(x).sum())(X))


def test_lifted_functions_see_globals_closures_and_rules_changed_between_calls():
    """NOTE [lifted functions keyed by what they read] (lifting.py): JAX runs
    a function's Python at every eager call, so a reassigned global or
    closed-over array, a changed number a rule reads, is seen by the next
    call; functx's staged program of a lifted function must not keep the
    old value (before: the program cached per function object gave the
    first call's numbers, silently)."""
    namespace = {"jnp": jnp, "jax": jax, "scale": jnp.asarray(2.0), "k": 3.0}
    exec(  # a module of its own: its globals are reassigned below
        "def g(y):\n"
        "    return jnp.sin(y) * scale\n"
        "@jax.custom_vjp\n"
        "def f(y):\n"
        "    return y * scale\n"
        "f.defvjp(lambda y: (f(y), y), lambda y, g: (g * scale * k,))\n", namespace)
    g, f = namespace["g"], namespace["f"]

    def cell(value):
        def read(y):
            return jnp.cos(y) * value

        def set_(v):
            nonlocal value
            value = v

        return read, set_

    read, set_read = cell(jnp.asarray(1.5))
    lg, lread = fx.lift(g), fx.lift(read)
    loss = lambda y: f(y * 1.0).sum()  # noqa: E731
    for step, (scale, k, v) in enumerate(((2.0, 3.0, 1.5), (3.0, 3.0, 0.5), (3.0, 5.0, 0.5))):
        namespace["scale"], namespace["k"] = jnp.asarray(scale), k
        set_read(jnp.asarray(v))
        for _ in range(2):  # the second call through the caches
            assert close(fx.grad(lambda y: lg(y).sum())(X), jax.grad(lambda y: g(y).sum())(X))
            assert close(fx.vmap(lread)(X), jax.vmap(read)(X))
            assert close(fx.grad(loss)(X), jax.grad(loss)(X)), step
            assert close(fx.vmap(f)(X), X * scale)


def test_a_lifted_function_reading_a_replaced_global_model_is_staged_once():
    """A training loop replaces the global parameters a lifted loss reads at
    every step: the arrays are inputs of one staged program (NOTE [lifted
    functions keyed by what they read]), so each step computes with its own
    parameters (against jax.grad) and stages nothing new (before: staged at
    every step, 1.4x JAX eager's time for a small MLP). Python control flow
    on such an array, which JAX's eager call computes, is staged with the
    array's value (before: refused, TracerBoolConversionError)."""
    from functx import lifting

    rng = np.random.default_rng(3)
    namespace = {"jnp": jnp, "params": {"w": jnp.asarray(rng.standard_normal((4, 3)),
                                                         jnp.float32),
                                        "b": jnp.asarray(0.5)}}
    exec(  # a module of its own: its globals are replaced below
        "def loss(x):\n"
        "    return jnp.sum(jnp.tanh(x @ params['w']) + params['b'])\n"
        "def branchy(x):\n"
        "    if params['b'] > 0:\n"
        "        return jnp.sum(x * params['b'])\n"
        "    return jnp.sum(jnp.sin(x))\n", namespace)
    loss, branchy = namespace["loss"], namespace["branchy"]
    g = fx.grad(fx.lift(loss))
    x = jnp.asarray(rng.standard_normal((2, 4)), jnp.float32)
    misses = []
    for step in range(5):
        params = namespace["params"]
        namespace["params"] = {k: v * (1.0 - 0.1 * step) for k, v in params.items()}
        before = lifting._CACHE.misses
        assert close(g(x), jax.grad(loss)(x)), step
        assert close(fx.grad(fx.lift(loss), argnums=0)(x), jax.grad(loss)(x)), step
        misses.append(lifting._CACHE.misses - before)
    assert misses[1:] == [0] * 4, misses
    for b in (0.5, -0.5, 2.0):
        namespace["params"] = {"w": namespace["params"]["w"], "b": jnp.asarray(b)}
        assert close(fx.grad(fx.lift(branchy))(x), jax.grad(branchy)(x)), b
    # a NumPy array changed in place between calls: each call reads it now,
    # as JAX's eager call does (an input, never a constant baked in)
    table = np.linspace(0.5, 1.5, 4).astype(np.float32)
    namespace["table"] = table
    exec("def scaled(x):\n    return jnp.sum(jnp.sin(x) * table)\n", namespace)
    scaled = namespace["scaled"]
    for k in (1.0, 2.0, -3.0):
        table *= k
        assert close(fx.grad(fx.lift(scaled))(x[0]), jax.grad(scaled)(x[0])), k
    # an input keeps the array's dtype and weak type: a weakly typed global
    # leaves a bfloat16 argument bfloat16, a float64 NumPy one is float32
    namespace["params"] = {"w": np.linspace(0.0, 1.0, 12).reshape(4, 3),
                           "b": jnp.add(1.0, 2.0)}
    xb = x.astype(jnp.bfloat16)
    got, want = fx.grad(fx.lift(loss))(xb), jax.grad(loss)(xb)
    assert got.dtype == want.dtype == jnp.bfloat16 and close(got, want)


def test_a_loop_body_calling_a_custom_function_sees_its_redefined_rule():
    """A functx.lax.scan body calling a jax.custom_vjp object whose rule is
    redefined between calls: the staged body is keyed by what the object's
    rules read (NOTE [staged bodies: one graph per code and closure]), so the
    new rule is used (before: the graph staged with the first rule). The
    oracle is the rule itself: JAX's own eager scan keeps its first jaxpr
    here (cached per body function)."""
    @jax.custom_vjp
    def f(x):
        return jnp.sin(x)

    def body(c, x):
        return c + f(x), None

    for k in (1.0, 2.0, 3.0):
        f.defvjp(lambda x: (jnp.sin(x), x), lambda x, g, k=k: (k * g * x,))
        for _ in range(2):
            assert close(fx.grad(lambda xs: fx.lax.scan(body, 0.0, xs)[0])(X), k * X)


def test_jax_closure_convert_hoists_functx_values_into_arguments():
    """jax.closure_convert (JAX's documented way to give a custom_vjp
    function a closure it differentiates) hoists the closed-over values that
    may carry a derivative into explicit arguments: functx values are
    hoisted too, so the rule gets them (before: left in the closure, then
    refused as a differentiated closure). Against jax.grad of the same
    program; the rule (2x the true derivative) tells it from the body's."""
    @partial(jax.custom_vjp, nondiff_argnums=(0,))
    def apply(fn, x, *args):
        return jnp.tanh(fn(x, *args))

    def fwd(fn, x, *args):
        return apply(fn, x, *args), (x, args)

    def bwd(fn, res, g):
        x, args = res
        _, pull = jax.vjp(lambda x, *a: jnp.tanh(fn(x, *a)), x, *args)
        return tuple(2.0 * c for c in pull(g))

    apply.defvjp(fwd, bwd)

    def solve(c, x):
        closure = lambda x: jnp.sum((x - c) ** 2) * jnp.sin(c[0])  # noqa: E731
        converted, hoisted = jax.closure_convert(closure, x)
        return apply(converted, x, *hoisted)

    c, x = jnp.asarray([0.3, -0.2]), jnp.asarray([0.1, 0.4])
    for _ in range(2):
        got = fx.grad(solve, argnums=(0, 1))(c, x)
        want = jax.grad(solve, argnums=(0, 1))(c, x)
        assert all(close(a, b) for a, b in zip(got, want))
    assert close(fx.vmap(fx.grad(solve), in_dims=(0, None))(jnp.stack([c, 2 * c]), x),
                 jax.vmap(jax.grad(solve), in_axes=(0, None))(jnp.stack([c, 2 * c]), x))


def test_a_jax_custom_function_closing_over_a_differentiated_value_is_refused():
    """NOTE [custom functions closing over functx values] (interop.py): a
    jax.custom_jvp / custom_vjp function called on plain arrays but closing
    over the value functx differentiates cannot use its rule for it; JAX
    raises, and so does functx (before: the body's derivative, the rule
    silently ignored: 2 cos(x) here instead of an error). Closed over a
    plain array, the rule is used (the oracle: JAX)."""
    def outer(x, y):
        @jax.custom_vjp
        def f(y):
            return jnp.sin(x) * y

        f.defvjp(lambda y: (f(y), None), lambda _, g: (g * 100.0,))

        @jax.custom_jvp
        def h(y):
            return jnp.sin(x) * y

        h.defjvp(lambda p, t: (h(*p), t[0] * 100.0))
        return f(y) + h(y)

    two = jnp.asarray(2.0)
    for transform in (lambda fn: fx.grad(fn)(0.5), lambda fn: fx.jvp(fn, (0.5,), (1.0,))):
        with pytest.raises(fx.FunctxError, match="closes over a value .* being differentiated"):
            transform(lambda x: outer(x, two))
    with pytest.raises(Exception):  # JAX's own error (an escaped tracer)
        jax.grad(lambda x: outer(x, two))(0.5)
    x = jnp.asarray(0.5)
    for _ in range(2):
        assert close(fx.grad(lambda y: outer(x, y))(two), jax.grad(lambda y: outer(x, y))(two))
        assert close(fx.grad(lambda y: outer(x, y))(two), 200.0)

    @jax.custom_jvp
    def branchy(y):  # Python control flow on its (concrete) arguments, as JAX allows
        return y * 2.0 if float(y.sum()) > 0 else y * 3.0

    branchy.defjvp(lambda p, t: (branchy(*p), t[0] * 10.0))
    loss = lambda x: jnp.sum(x * branchy(jnp.asarray([1.0, -2.0])))  # noqa: E731
    for _ in range(2):
        assert close(fx.grad(loss)(X[:2]), jax.grad(loss)(X[:2]))


def test_jax_device_put_on_functx_values_is_the_identity_as_in_jax():
    """`jax.device_put` of functx values, bare or in a pytree beside JAX
    arrays, with no placement or with the default device: the identity on
    values and derivatives, as JAX's device_put rules are (before: outside a
    JAX trace it tried to transfer the functx value, InvalidInputException).
    A placement functx cannot honour raises naming device_put; device_get
    stays refused (NOTE [device_put on functx values] in interop.py)."""
    from jax.sharding import SingleDeviceSharding

    dev = jax.devices()[0]

    def tree_put(x, *device):
        t = jax.device_put({"a": x, "b": (jnp.cos(x), X)}, *device)
        return t["a"] * t["b"][0] + t["b"][1]

    functions = [
        lambda x: jnp.sin(jax.device_put(x)),
        lambda x: jnp.sin(jax.device_put(x, dev) * x),
        lambda x: jnp.sin(jax.device_put(x, SingleDeviceSharding(dev), may_alias=False)),
        lambda x: jnp.sin(jax.device_put(x, jax.memory.Space.Device, src=dev)),
        tree_put,
        lambda x: tree_put(x, dev),
    ]
    for f in functions:
        loss = lambda x, f=f: f(x).sum()  # noqa: E731
        assert close(fx.grad(loss)(X), jax.grad(loss)(X))
        assert close(fx.jvp(f, (X,), (X,)), jax.jvp(f, (X,), (X,)))
        assert close(fx.vmap(f)(XS), jax.vmap(f)(XS))
    f = functions[-1]
    loss = lambda x: f(x).sum()  # noqa: E731
    assert close(fx.vjp(f, X)[1](X), jax.vjp(f, X)[1](X))
    assert close(fx.vmap(fx.grad(loss))(XS), jax.vmap(jax.grad(loss))(XS))
    assert close(fx.jit(fx.grad(loss))(X), jax.grad(loss)(X))
    assert close(fx.hessian(loss)(X), jax.hessian(loss)(X))

    host = lambda x: jax.device_put(x, jax.memory.Space.Host).sum()  # noqa: E731
    for transform, x in ((fx.grad, X), (lambda f: fx.jit(fx.grad(f)), X), (fx.vmap, XS)):
        with pytest.raises(fx.FunctxValueError, match=r"device_put.*Space.Host.*outside"):
            transform(host)(x)
    for get in (jax.device_get, lambda x: jax.device_get({"a": x, "b": 1.0})["a"]):
        with pytest.raises(fx.JaxOnFunctxValueError, match="NumPy"):
            fx.grad(lambda x, get=get: get(x).sum())(X)
