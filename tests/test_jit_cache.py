"""functx.jit's cache keyed on the function (NOTE [one jit per function] in
functx/transforms/jit.py): a fresh `functx.jit(f)` per call stages and
compiles once, eagerly and under transforms; the cache holds functions
weakly and is bounded; closures, partials and static arguments never share
a program that baked in another value. Results are checked against plain
JAX; trace counts come from a Python side effect in the function, which runs
only when it is traced or staged."""

import functools
import gc
import sys
import types
import weakref

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import functx as fx
import functx.numpy as fnp
import functx.transforms.jit  # the module, for its cache

jit_module = sys.modules["functx.transforms.jit"]

rng = np.random.default_rng(7)
X = jnp.asarray(rng.uniform(-1, 1, (3,)), dtype=jnp.float32)
XS = jnp.asarray(rng.uniform(-1, 1, (4, 3)), dtype=jnp.float32)


def close(a, b):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)


def counted(calls, scale=2.0):
    """A new function (its own cache key) counting its traces in `calls`."""

    def f(x):
        calls.append(1)
        return fnp.sin(x) * scale

    return f


def f_jax(x, scale=2.0):
    return jnp.sin(x) * scale


@pytest.mark.slow
def test_a_fresh_jit_per_call_traces_once():
    calls = []
    f = counted(calls)
    for _ in range(3):
        close(fx.jit(f)(X), f_jax(X))
    assert len(calls) == 1
    # under grad: staged once (the staged path traces f once more), then
    # the graph, its jvp, transpose and compiled program are reused
    for _ in range(3):
        close(fx.grad(lambda v: fx.jit(f)(v).sum())(X), jax.grad(lambda v: f_jax(v).sum())(X))
    assert len(calls) == 2
    # under vmap: per-example avals are grad's, so the same graph is batched
    for _ in range(3):
        close(fx.vmap(fx.jit(f))(XS), jax.vmap(f_jax)(XS))
    assert len(calls) == 2
    # and the composition: grad of a vmapped fresh jit
    for _ in range(3):
        close(fx.grad(lambda v: fx.vmap(fx.jit(f))(v).sum())(XS),
              jax.grad(lambda v: jax.vmap(f_jax)(v).sum())(XS))
    assert len(calls) == 2
    # the wrappers share one state, but each is its own object holding f
    a, b = fx.jit(f), fx.jit(f)
    assert a is not b and a.__wrapped__ is f
    assert a.functx_jitted is b.functx_jitted
    assert len(a.functx_jitted._graphs) == 1


def test_a_fresh_jit_inside_a_transformed_function_under_vmap_of_grad():
    calls = []
    f = counted(calls, 0.5)

    def loss(v):
        return fx.jit(f)(v).sum()

    for _ in range(3):
        close(fx.vmap(fx.grad(loss))(XS), jax.vmap(jax.grad(lambda v: f_jax(v, 0.5).sum()))(XS))
    assert len(calls) == 1


@pytest.mark.slow
def test_a_dropped_function_is_freed():
    def make(c):
        def f(x):
            return fnp.sin(x) * c
        return f

    def use(f):  # eagerly, under grad and vmap; the state behind jit(f)
        close(fx.jit(f)(X), f_jax(X, 3.0))
        close(fx.grad(lambda v: fx.jit(f)(v).sum())(X), jax.grad(lambda v: f_jax(v, 3.0).sum())(X))
        close(fx.vmap(fx.jit(f))(XS), jax.vmap(lambda v: f_jax(v, 3.0))(XS))
        return weakref.ref(fx.jit(f).functx_jitted)

    f = make(3.0)
    ref = weakref.ref(f)
    state = use(f)
    entries = jit_module.cache_info()["entries"]
    del f
    gc.collect()
    assert ref() is None
    assert state() is None  # the state (graphs, programs) went with it
    assert jit_module.cache_info()["entries"] == entries - 1

    # a bound method: neither its object nor the method is kept
    class Model:
        def __init__(self, w):
            self.w = w

        def forward(self, x):
            return fnp.tanh(x * self.w)

    def use_model(model):
        close(fx.grad(lambda v: fx.jit(model.forward)(v).sum())(X),
              jax.grad(lambda v: jnp.tanh(v * 1.5).sum())(X))
        assert fx.jit(model.forward).functx_jitted is fx.jit(model.forward).functx_jitted

    model = Model(1.5)
    owner = weakref.ref(model)
    use_model(model)
    del model
    gc.collect()
    assert owner() is None


@pytest.mark.slow
def test_a_live_wrapper_keeps_its_function():
    # jit(f) holds f: the lambda lives as long as the wrapper, and
    # `.lower` of a temporary wrapper keeps it while lowering
    g = fx.jit(lambda x: fnp.cos(x) + 1.0)
    gc.collect()
    close(g(X), jnp.cos(X) + 1.0)
    close(fx.grad(lambda v: g(v).sum())(X), -jnp.sin(X))
    lowered = fx.jit(lambda x: fnp.cos(x) * 2.0).lower(X)
    gc.collect()
    close(lowered.compile()(X), jnp.cos(X) * 2.0)


@pytest.mark.slow
def test_closures_with_the_same_code_and_other_values_do_not_share():
    def make(c):
        return lambda x: fnp.sin(x) * c

    fs = [make(c) for c in (1.0, 2.0, 3.0)]
    assert len({f.__code__ for f in fs}) == 1
    for _ in range(2):
        for c, f in zip((1.0, 2.0, 3.0), fs):
            close(fx.jit(f)(X), f_jax(X, c))
            close(fx.grad(lambda v, f=f: fx.jit(f)(v).sum())(X),
                  jax.grad(lambda v, c=c: f_jax(v, c).sum())(X))
            close(fx.vmap(fx.jit(f))(XS), jax.vmap(lambda v, c=c: f_jax(v, c))(XS))
    # a new function object with the same code and the same cells is a new
    # key, as in JAX (which keys on the function object)
    f = fs[0]
    twin = types.FunctionType(f.__code__, f.__globals__, f.__name__, f.__defaults__,
                              f.__closure__)
    assert fx.jit(twin).functx_jitted is not fx.jit(f).functx_jitted
    close(fx.jit(twin)(X), f_jax(X, 1.0))


@pytest.mark.slow
def test_partials_share_by_value_and_type():
    calls = []

    def h(a, x, *, shift):
        calls.append(1)
        return x * a + shift

    for _ in range(3):
        close(fx.grad(lambda v: fx.jit(functools.partial(h, 2.0, shift=1.0))(v).sum())(X),
              jnp.full(3, 2.0))
    assert len(calls) == 1
    close(fx.jit(functools.partial(h, 3.0, shift=1.0))(X), X * 3.0 + 1.0)
    assert len(calls) == 2  # another value: its own program

    def k(a, x):
        return x + (1.0 if type(a) is float else 2.0)

    # 1 == 1.0 and they hash alike, but they are different keys
    close(fx.jit(functools.partial(k, 1.0))(X), X + 1.0)
    close(fx.jit(functools.partial(k, 1))(X), X + 2.0)
    close(fx.grad(lambda v: fx.jit(functools.partial(k, 1))(v).sum())(X), jnp.ones(3))
    # an unhashable bound argument: not shared, still correct
    close(fx.jit(functools.partial(k, [1.0]))(X), X + 2.0)


@pytest.mark.parametrize("under", ["eager", "grad"])
@pytest.mark.slow
def test_static_argument_values_key_the_program(under):
    calls = []

    def h(x, n, scale=1.0):
        calls.append(1)
        for _ in range(n):
            x = fnp.sin(x)
        return x * scale

    def h_jax(x, n, scale=1.0):
        for _ in range(n):
            x = jnp.sin(x)
        return x * scale

    def run(n, scale):
        jh = fx.jit(h, static_argnums=1, static_argnames="scale")  # a fresh wrapper per call
        if under == "eager":
            return jh(X, n, scale=scale)
        return fx.grad(lambda v: jh(v, n, scale=scale).sum())(X)

    def oracle(n, scale):
        if under == "eager":
            return h_jax(X, n, scale)
        return jax.grad(lambda v: h_jax(v, n, scale).sum())(X)

    for n, scale in [(1, 1.0), (2, 1.0), (1, 2.0), (1, 1.0), (2, 1.0), (1, 2.0)]:
        close(run(n, scale), oracle(n, scale))
    assert len(calls) == 3  # one trace per distinct static value
    # other options are another entry
    assert (fx.jit(h, static_argnums=1).functx_jitted
            is not fx.jit(h, static_argnums=1, static_argnames="scale").functx_jitted)


@pytest.mark.slow
def test_the_cache_is_bounded(monkeypatch):
    monkeypatch.setattr(jit_module, "CACHE_SIZE", 3)
    monkeypatch.setattr(jit_module, "SIGNATURE_CACHE_SIZE", 2)
    fs = [counted([], float(i)) for i in range(6)]  # kept alive: only the bound evicts
    wrappers = []
    for i, f in enumerate(fs):
        wrapper = fx.jit(f)
        wrappers.append(wrapper)
        close(fx.grad(lambda v, w=wrapper: w(v).sum())(X),
              jax.grad(lambda v, i=i: f_jax(v, i).sum())(X))
        info = jit_module.cache_info()
        assert info["entries"] <= 3 and info["bound"] == 3
    # an evicted entry's live wrapper keeps working
    close(wrappers[0](X), f_jax(X, 0.0))
    close(fx.grad(lambda v: wrappers[0](v).sum())(X), jax.grad(lambda v: f_jax(v, 0.0).sum())(X))
    # staged graphs per entry are bounded too (new shapes under grad)
    calls = []
    f = counted(calls)
    for n in (1, 2, 3, 4, 1):
        x = jnp.ones((n,), jnp.float32)
        close(fx.grad(lambda v: fx.jit(f)(v).sum())(x), jax.grad(lambda v: f_jax(v).sum())(x))
        assert len(fx.jit(f).functx_jitted._graphs) <= 2
    assert len(calls) == 5  # shape (1,) was evicted and staged again
    assert jit_module.cache_info()["signature_bound"] == 2


def test_clear_cache():
    calls = []
    f = counted(calls)
    close(fx.grad(lambda v: fx.jit(f)(v).sum())(X), jax.grad(lambda v: f_jax(v).sum())(X))
    assert jit_module.cache_info()["entries"] >= 1
    jit_module.clear_cache()
    info = jit_module.cache_info()
    assert info["entries"] == 0 and info["signatures"] == 0
    close(fx.grad(lambda v: fx.jit(f)(v).sum())(X), jax.grad(lambda v: f_jax(v).sum())(X))
    assert len(calls) == 2


def test_python_wrapper_shares_too(monkeypatch):
    # where JAX's C++ jitted function cannot be built, jit returns a Python
    # wrapper; it shares the state all the same
    monkeypatch.setattr(jit_module, "_cpp_jit", lambda *a, **k: None)
    calls = []
    f = counted(calls)
    for _ in range(3):
        close(fx.jit(f)(X), f_jax(X))
        close(fx.grad(lambda v: fx.jit(f)(v).sum())(X), jax.grad(lambda v: f_jax(v).sum())(X))
    assert len(calls) == 2
    wrapper = fx.jit(f)
    assert isinstance(wrapper, jit_module._Wrapper) and wrapper.__wrapped__ is f
    close(wrapper.lower(X).compile()(X), f_jax(X))
