"""Eager control flow without recompiles (NOTE [staged bodies: one graph per
code and closure] in functx/lax.py, NOTE [compiled loops] and NOTE [lifted
bodies by structure] in functx/primitives/control.py).

grad / vmap / jvp / jacrev of `functx.lax.scan / fori_loop / while_loop /
cond / switch / map` with the same body code and the same shapes stage the
body once (counted by a Python side effect in the body, which runs only
when it is staged) and compile the loop once, also when the body is a new
lambda on every call that closes over that call's values; results equal
JAX's transforms of the same program; a closure value that changes gives
the new result; what a dropped body closed over is freed; caches stay
within their bounds. Shapes are tiny and loops short: each test costs a few
small compilations.
"""

# The tests' lambdas close over loop variables on purpose: each is called in
# its own iteration, and a new closure value per iteration is the point.
# ruff: noqa: B023

import collections
import gc
import logging
import types
import weakref

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import functx as fx
from functx import lax as flax
from functx.primitives import control

N, T = 3, 4
STAGED = collections.Counter()  # body name -> times its Python ran


def _arr(seed, *shape):
    return jnp.asarray(np.random.default_rng(seed).normal(size=shape) * 0.5)


W = _arr(0, N, N)
XS = _arr(1, T, N)
H0 = _arr(2, N)
WS = jnp.stack([W, 0.5 * W, -W])


@pytest.fixture(autouse=True)
def _fresh_caches():
    """Each test starts without staged bodies (so its first call stages)."""
    flax._STAGED.clear()
    control._LIFTED.clear()


def _close(got, want, tol=1e-10):
    for g, w in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=tol, atol=tol)


# Each loss is written once for both libraries: `L` is jax.lax or functx.lax.
# Its body is a new function object on every call and closes over `w` (a
# value of the enclosing transform) and module arrays.


def scan_loss(L, w):
    def step(h, x):
        STAGED["scan"] += 1
        return jnp.tanh(h @ w + x), h.sum()

    h, ys = L.scan(step, H0, XS)
    return h.sum() + ys.sum()


def fori_loss(L, w):
    def body(i, h):
        STAGED["fori"] += 1
        return jnp.tanh(h @ w + XS[i])

    return L.fori_loop(0, T, body, H0).sum()


def cond_loss(L, w):
    def yes(h):
        STAGED["cond"] += 1
        return jnp.sin(h @ w).sum()

    return L.cond(w.sum() > 0, yes, lambda h: jnp.cos(h @ w).sum(), H0)


def switch_loss(L, w):
    def first(h):
        STAGED["switch"] += 1
        return jnp.sin(h @ w).sum()

    index = jnp.where(w.sum() > 0, 0, 1)
    return L.switch(index, [first, lambda h: (h @ w).sum(), lambda h: h.sum()], H0)


def map_loss(L, w):
    def f(x):
        STAGED["map"] += 1
        return jnp.tanh(x @ w)

    return L.map(f, XS).sum()


def while_loss(L, w):
    def body(c):
        STAGED["while"] += 1
        i, h = c
        return i + 1, jnp.tanh(h @ w + XS[i])

    return L.while_loop(lambda c: c[0] < T, body, (0, H0))[1].sum()


def fori_traced_loss(L, w):
    def body(i, h):
        STAGED["fori_traced"] += 1
        return jnp.tanh(h @ w + XS[i])

    upper = jnp.where(w.sum() > 100, 2, T)  # a traced bound: a while loop
    return L.fori_loop(0, upper, body, H0).sum()


REVERSE = {"scan": scan_loss, "fori": fori_loss, "cond": cond_loss, "switch": switch_loss,
           "map": map_loss}
FORWARD = {"while": while_loss, "fori_traced": fori_traced_loss}
ALL = {**REVERSE, **FORWARD}


def _repeat(name, run, calls=3):
    """Run `run()` `calls` times; the body's Python must run on the first
    call only, and the staged-body cache must not grow after it."""
    flax._STAGED.clear()
    before = STAGED[name]
    first = run()
    staged = STAGED[name] - before
    assert staged >= 1
    size = len(flax._STAGED)
    for _ in range(calls - 1):
        again = run()
        _close(again, first, tol=0)
    assert STAGED[name] - before == staged, f"{name}: staged again on a later call"
    assert len(flax._STAGED) == size
    return first


@pytest.mark.parametrize("name", sorted(REVERSE))
@pytest.mark.slow
def test_grad_stages_once(name):
    loss = REVERSE[name]
    got = _repeat(name, lambda: fx.grad(lambda w: loss(flax, w))(W))
    _close(got, jax.grad(lambda w: loss(jax.lax, w))(W))


@pytest.mark.parametrize("name", sorted(ALL))
def test_vmap_stages_once(name):
    loss = ALL[name]
    got = _repeat(name, lambda: fx.vmap(lambda w: loss(flax, w))(WS))
    _close(got, jax.vmap(lambda w: loss(jax.lax, w))(WS))


@pytest.mark.parametrize("name", sorted(FORWARD))
@pytest.mark.slow
def test_jvp_stages_once(name):
    loss = FORWARD[name]
    got = _repeat(name, lambda: fx.jvp(lambda w: loss(flax, w), (W,), (W,)))
    _close(got, jax.jvp(lambda w: loss(jax.lax, w), (W,), (W,)))


@pytest.mark.parametrize("name", ["scan", "cond", "fori"])
@pytest.mark.slow
def test_vmap_grad_and_jacrev_stage_once(name):
    loss = REVERSE[name]
    got = _repeat(name, lambda: fx.vmap(fx.grad(lambda w: loss(flax, w)))(WS))
    _close(got, jax.vmap(jax.grad(lambda w: loss(jax.lax, w)))(WS))

    def vec(L, w):  # a vector output for jacrev
        return jnp.stack([loss(L, w), loss(L, 2.0 * w)])

    got = _repeat(name, lambda: fx.jacrev(lambda w: vec(flax, w))(W))
    _close(got, jax.jacrev(lambda w: vec(jax.lax, w))(W))


# --------------------------------------------------------------------------
# Compilations


class _CompileLog(logging.Handler):
    def __init__(self):
        super().__init__()
        self.names = []

    def emit(self, record):
        msg = record.getMessage()
        if msg.startswith("Finished XLA compilation of "):
            self.names.append(msg.split(" of ", 1)[1].split(" in ", 1)[0])

    def __enter__(self):
        self.prev = jax.config.jax_log_compiles
        jax.config.update("jax_log_compiles", True)
        self.logger = logging.getLogger("jax")
        self.logger.addHandler(self)
        return self

    def __exit__(self, *exc):
        self.logger.removeHandler(self)
        jax.config.update("jax_log_compiles", self.prev)


def _loop_compiles(run, calls=4):
    """Compilations of functx's loop programs (functx_scan, functx_while)
    per call."""
    counts = []
    with _CompileLog() as log:
        for _ in range(calls):
            start = len(log.names)
            jax.block_until_ready(run())
            counts.append(sum("functx_scan" in n or "functx_while" in n
                              for n in log.names[start:]))
    return counts


@pytest.mark.parametrize("L", ["functx", "jax"], ids=["functx.lax", "jax.lax"])
@pytest.mark.slow
def test_loops_compile_once(L):
    """The loop programs compile on the first call only, for functx.lax and
    for jax.lax called on functx values (whose bodies JAX traces anew on
    every call, into jaxprs of the same structure)."""
    L = flax if L == "functx" else jax.lax
    lifted = len(control._LIFTED)
    counts = _loop_compiles(lambda: fx.grad(lambda w: scan_loss(L, w))(W))
    assert counts[0] >= 1 and counts[1:] == [0, 0, 0], counts
    counts = _loop_compiles(lambda: fx.vmap(lambda w: while_loss(L, w))(WS))
    assert counts[0] >= 1 and counts[1:] == [0, 0, 0], counts
    counts = _loop_compiles(lambda: fx.jvp(lambda w: fori_traced_loss(L, w), (W,), (W,)))
    assert counts[1:] == [0, 0, 0], counts
    if L is jax.lax:
        assert len(control._LIFTED) > lifted  # translated once per structure
        size = len(control._LIFTED)
        fx.grad(lambda w: scan_loss(L, w))(W)
        assert len(control._LIFTED) == size


@pytest.mark.slow
def test_jax_lax_on_functx_values_matches_jax():
    for name in ("scan", "fori", "cond"):
        loss = REVERSE[name]
        for _ in range(2):
            _close(fx.grad(lambda w: loss(jax.lax, w))(W), jax.grad(lambda w: loss(jax.lax, w))(W))
    _close(fx.vmap(lambda w: while_loss(jax.lax, w))(WS),
           jax.vmap(lambda w: while_loss(jax.lax, w))(WS))


# --------------------------------------------------------------------------
# Soundness: what the body reads may change between calls


def _scaled_loss(L, w, b, c):
    def step(h, x):
        STAGED["scaled"] += 1
        return jnp.tanh(h @ w * c + x + b), None

    return L.scan(step, H0, XS)[0].sum()


@pytest.mark.slow
def test_closure_array_changes_without_restaging():
    for k, b in enumerate([H0, 2.0 * H0, jnp.zeros(N)]):
        before = STAGED["scaled"]
        got = fx.grad(lambda w: _scaled_loss(flax, w, b, 0.5))(W)
        assert STAGED["scaled"] == before + (1 if k == 0 else 0)
        _close(got, jax.grad(lambda w: _scaled_loss(jax.lax, w, b, 0.5))(W))
    # A NumPy array too (not a functx or JAX value).
    b = np.asarray(H0) * 3.0
    _close(fx.grad(lambda w: _scaled_loss(flax, w, b, 0.5))(W),
           jax.grad(lambda w: _scaled_loss(jax.lax, w, b, 0.5))(W))
    b[:] = 1.0  # changed in place: the next call sees it
    _close(fx.grad(lambda w: _scaled_loss(flax, w, b, 0.5))(W),
           jax.grad(lambda w: _scaled_loss(jax.lax, w, b, 0.5))(W))


@pytest.mark.slow
def test_closure_static_changes_restage():
    for c in (0.5, 0.25, 0.5, -0.0, 0.0):
        got = fx.grad(lambda w: _scaled_loss(flax, w, H0, c))(W)
        _close(got, jax.grad(lambda w: _scaled_loss(jax.lax, w, H0, c))(W))


GLOBAL_B = H0


def _global_helper(h):
    return h + GLOBAL_B  # a global read through a helper function


def _global_loss(L, w):
    def step(h, x):
        STAGED["global"] += 1
        return jnp.tanh(_global_helper(h @ w) + x * GLOBAL_B), None

    return L.scan(step, H0, XS)[0].sum()


@pytest.mark.slow
def test_global_array_reassigned():
    global GLOBAL_B
    try:
        for k, b in enumerate([H0, 3.0 * H0, -H0]):
            GLOBAL_B = b
            before = STAGED["global"]
            got = fx.grad(lambda w: _global_loss(flax, w))(W)
            assert STAGED["global"] == before + (1 if k == 0 else 0)
            _close(got, jax.grad(lambda w: _global_loss(jax.lax, w))(W))
    finally:
        GLOBAL_B = H0


@pytest.mark.slow
def test_nested_functions_and_partials():
    import functools

    def loss(L, w, b):
        def inner(h):  # a closure function that itself closes over arrays
            return jnp.tanh(h @ w + b)

        def step(scale, h, x):
            STAGED["nested"] += 1
            return inner(h) * scale + x, None

        return L.scan(functools.partial(step, 0.5), H0, XS)[0].sum()

    for k, b in enumerate([H0, -H0]):
        before = STAGED["nested"]
        got = fx.grad(lambda w: loss(flax, w, b))(W)
        assert STAGED["nested"] == before + (1 if k == 0 else 0)
        _close(got, jax.grad(lambda w: loss(jax.lax, w, b))(W))


@pytest.mark.slow
def test_python_control_flow_on_a_closed_over_array():
    """A body that converts a closed-over concrete array to a Python value
    cannot take it as a staged input: it is staged as written, each time
    with the array it reads."""

    def loss(L, w, b):
        sign = 1.0 if float(b.sum()) > 0 else -1.0
        return L.scan(lambda h, x: (jnp.tanh(h @ w * sign + x), None), H0, XS)[0].sum()

    def loss_inside(L, w, b):
        def step(h, x):
            sign = 1.0 if float(b.sum()) > 0 else -1.0  # Python control flow on b
            return jnp.tanh(h @ w * sign + x), None

        return L.scan(step, H0, XS)[0].sum()

    for b in (jnp.ones(N), -jnp.ones(N), jnp.ones(N)):
        want = jax.grad(lambda w: loss(jax.lax, w, b))(W)
        _close(fx.grad(lambda w: loss(flax, w, b))(W), want)
        _close(fx.grad(lambda w: loss_inside(flax, w, b))(W), want)


# What a body's closure holds besides arrays and functions: a pytree (dict,
# list, Equinox module) by its structure and leaves, a plain object by its
# class and attributes. A global object the same way, where its contents are
# small (else by identity).


class _Activation:
    def __init__(self, fn, scale):
        self.fn, self.scale = fn, scale


def _object_loss(L, w, act, params):
    def step(h, x):
        STAGED["object"] += 1
        return act.fn(h @ w + x + params["b"]) * act.scale, None

    return L.scan(step, H0, XS)[0].sum()


@pytest.mark.slow
def test_a_body_closing_over_a_pytree_or_an_object_stages_once():
    """A new object of equal attributes and a dict of that call's values find
    the staged body; a changed attribute restages, a changed array does not."""
    cases = [(jnp.tanh, 0.5, H0), (jnp.tanh, 0.5, -H0), (jnp.sin, 0.5, H0), (jnp.sin, 2.0, H0)]
    for k, (fn, scale, b) in enumerate(cases):
        before = STAGED["object"]
        got = fx.grad(lambda w, p: _object_loss(flax, w, _Activation(fn, scale), p),
                      argnums=(0, 1))(W, {"b": b})
        assert STAGED["object"] == before + (0 if k == 1 else 1), k
        want = jax.grad(lambda w, p: _object_loss(jax.lax, w, _Activation(fn, scale), p),
                        argnums=(0, 1))(W, {"b": b})
        _close(got, want)


@pytest.mark.slow
def test_a_body_closing_over_an_equinox_module_stages_and_compiles_once():
    eqx = pytest.importorskip("equinox")
    cell = eqx.nn.GRUCell(N, N, key=jax.random.PRNGKey(0))

    def loss(L, model):
        def step(h, x):
            STAGED["eqx"] += 1
            return model(x, h), None

        return L.scan(step, H0, XS)[0].sum()

    got = _repeat("eqx", lambda: fx.grad(lambda m: loss(flax, m))(cell))
    _close(got, jax.grad(lambda m: loss(jax.lax, m))(cell))
    counts = _loop_compiles(lambda: fx.grad(lambda m: loss(flax, m))(cell), calls=3)
    assert counts == [0, 0, 0], counts


GLOBAL_OPTIONS = {"fn": jnp.tanh, "b": H0}


def _global_options_loss(L, w):
    def step(h, x):
        return GLOBAL_OPTIONS["fn"](h @ w + x + GLOBAL_OPTIONS["b"]), None

    return L.scan(step, H0, XS)[0].sum()


@pytest.mark.slow
def test_a_global_object_changed_between_calls_gives_the_new_result():
    """A global dict or plain object whose contents change between calls: the
    body reads the new contents, as JAX's eager scan (which traces a new
    lambda anew) does. It was keyed by identity and kept the first call's."""
    options = types.SimpleNamespace(scale=0.5)

    def loss(L, w):
        return L.scan(lambda h, x: (jnp.tanh(h @ w + x) * options.scale, None),
                      H0, XS)[0].sum()

    try:
        for fn, b, scale in [(jnp.tanh, H0, 0.5), (jnp.sin, H0, 0.5), (jnp.sin, -H0, 2.0)]:
            GLOBAL_OPTIONS["fn"], GLOBAL_OPTIONS["b"] = fn, b
            options.scale = scale
            _close(fx.grad(lambda w: _global_options_loss(flax, w))(W),
                   jax.grad(lambda w: _global_options_loss(jax.lax, w))(W))
            _close(fx.grad(lambda w: loss(flax, w))(W), jax.grad(lambda w: loss(jax.lax, w))(W))
    finally:
        GLOBAL_OPTIONS.update(fn=jnp.tanh, b=H0)


GLOBAL_SHIFT = H0


class _Shifted:
    """Its method reads a global array and a class attribute."""

    scale = 0.5

    def __call__(self, v):
        return jnp.tanh(v + GLOBAL_SHIFT) * self.scale


@pytest.mark.slow
def test_what_an_objects_methods_read_is_part_of_the_key():
    """The methods of a user's class (a plain one, an Equinox module) are
    followed like the body's own functions: a global array they read stays
    an input of the graph, a class attribute or global changed between
    calls gives the new result."""
    global GLOBAL_SHIFT
    eqx = pytest.importorskip("equinox")

    class Cell(eqx.Module):
        w: jax.Array

        def __call__(self, h, x):
            return _Shifted()(h @ self.w + x)

    def loss(L, w, obj):
        return L.scan(lambda h, x: (obj(h @ w + x), None), H0, XS)[0].sum()

    def cell_loss(L, w):
        cell = Cell(w)
        return L.scan(lambda h, x: (cell(h, x), None), H0, XS)[0].sum()

    try:
        for shift, scale in [(H0, 0.5), (-H0, 0.5), (-H0, 2.0)]:
            GLOBAL_SHIFT, _Shifted.scale = shift, scale
            _close(fx.grad(lambda w: loss(flax, w, _Shifted()))(W),
                   jax.grad(lambda w: loss(jax.lax, w, _Shifted()))(W))
            _close(fx.grad(lambda w: cell_loss(flax, w))(W),
                   jax.grad(lambda w: cell_loss(jax.lax, w))(W))
    finally:
        GLOBAL_SHIFT, _Shifted.scale = H0, 0.5


class _Box:
    """A plain object holding an array: a body closing over it is staged as
    written, per function object (an arbitrary object is not rebuilt)."""

    def __init__(self, a):
        self.a = a

    def __getitem__(self, i):
        return self.a


GLOBAL_BOX = _Box(H0)


def _global_box_loss(L, w):
    return L.scan(lambda h, x: (jnp.tanh(h @ w + GLOBAL_BOX.a), None), H0, XS)[0].sum()


@pytest.mark.slow
def test_an_object_holding_an_array_is_read_anew_each_call():
    """A plain object holding an array, in the closure or a global (a model
    object a training loop updates in place): the body reads the array the
    object holds now. The global one was keyed by identity, its array baked
    into the graph."""
    box = _Box(H0)

    def loss(L, w):
        return L.scan(lambda h, x: (jnp.tanh(h @ w + box.a), None), H0, XS)[0].sum()

    try:
        for b in (H0, 3.0 * H0):
            box.a = GLOBAL_BOX.a = b
            _close(fx.grad(lambda w: loss(flax, w))(W), jax.grad(lambda w: loss(jax.lax, w))(W))
            _close(fx.grad(lambda w: _global_box_loss(flax, w))(W),
                   jax.grad(lambda w: _global_box_loss(jax.lax, w))(W))
    finally:
        GLOBAL_BOX.a = H0


@pytest.mark.slow
def test_mutable_closure_state():
    """A body that assigns a variable of its closure (nonlocal) is staged per
    function object, as in JAX."""
    calls = []
    n = 0

    def loss(w):
        def step(h, x):
            nonlocal n
            n += 1
            calls.append(1)
            return jnp.tanh(h @ w + x), None

        return flax.scan(step, H0, XS)[0].sum()

    want = jax.grad(lambda w: jax.lax.scan(lambda h, x: (jnp.tanh(h @ w + x), None),
                                           H0, XS)[0].sum())(W)
    for k in range(3):
        _close(fx.grad(loss)(W), want)
        assert n == k + 1 and len(calls) == k + 1


@pytest.mark.slow
def test_under_jit():
    """Bodies closing over JAX tracers (an outer jax.jit) and functx.jit."""
    want = jax.grad(lambda w: scan_loss(jax.lax, w))(W)
    for _ in range(2):
        _close(jax.jit(fx.grad(lambda w: scan_loss(flax, w)))(W), want)
        _close(fx.jit(fx.grad(lambda w: scan_loss(flax, w)))(W), want)


# --------------------------------------------------------------------------
# Memory


def _drop_body(plain):
    a = jnp.arange(float(N)) + 1.0  # a fresh array only the body refers to
    ref = weakref.ref(a)
    box = _Box(a)  # staged the old way, per function object

    def loss(w):
        if plain:
            return flax.scan(lambda h, x: (jnp.tanh(h @ w + box[0] * x), None), H0, XS)[0].sum()
        return flax.scan(lambda h, x: (jnp.tanh(h @ w + a * x), None), H0, XS)[0].sum()

    def plain_loss(h0):  # closes over no value of a transform: its graph is cached
        if plain:
            return flax.scan(lambda h, x: (jnp.sin(h) * box[0] + x, None), h0, XS)[0].sum()
        return flax.scan(lambda h, x: (jnp.sin(h) * a + x, None), h0, XS)[0].sum()

    for _ in range(2):
        fx.grad(loss)(W)
        fx.vmap(loss)(WS)
        plain_loss(H0)
        fx.vmap(plain_loss)(WS[:, 0])
    return ref


def _settle():
    """Let background compilations (which hold their arguments until they
    run) finish, where functx compiles in the background."""
    try:
        from functx import caches
    except ImportError:
        return
    wait = getattr(caches, "wait_for_compiles", None)
    if wait is not None:
        wait()


@pytest.mark.parametrize("plain", [False, True], ids=["snapshot", "plain"])
@pytest.mark.slow
def test_dropped_bodies_are_freed(plain):
    ref = _drop_body(plain)
    _settle()
    gc.collect()
    assert ref() is None, "a dropped body's array is kept alive"


@pytest.mark.slow
def test_caches_stay_bounded(monkeypatch):
    monkeypatch.setattr(flax._STAGED, "limit", 6)
    monkeypatch.setattr(control._PROGRAMS, "limit", 4)
    monkeypatch.setattr(control._LIFTED, "limit", 4)
    for k in range(12):  # distinct bodies: a distinct Python constant each
        fx.grad(lambda w: flax.scan(lambda h, x: (jnp.tanh(h @ w + k), None), H0, XS)[0].sum())(W)
        fx.grad(lambda w: jax.lax.scan(lambda h, x: (jnp.tanh(h @ w + k), None),
                                       H0, XS)[0].sum())(W)
        assert len(flax._STAGED) <= 6
        assert len(control._PROGRAMS) <= 4
        assert len(control._LIFTED) <= 4
    got = fx.grad(lambda w: flax.scan(lambda h, x: (jnp.tanh(h @ w + 3), None), H0, XS)[0].sum())(W)
    want = jax.grad(lambda w: jax.lax.scan(lambda h, x: (jnp.tanh(h @ w + 3), None),
                                           H0, XS)[0].sum())(W)
    _close(got, want)
