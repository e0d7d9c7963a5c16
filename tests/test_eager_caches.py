"""The two caches of eager reverse mode (NOTE [eager reverse mode in few
dispatches] in interpreters/reverse.py): a fused primal+residual step per
repeated primitive application, and a compiled backward pass per repeated
tape structure. Results must equal JAX's on every call, before and after
the caches engage, and the caches must actually engage."""

import os
import sys
import time

import numpy as np
import pytest

import jax
import jax.numpy as jnp

import functx as fx
import functx.numpy as fnp
from functx import caches
from functx.interpreters import deferred, reverse

rng = np.random.default_rng(2)
X = jnp.asarray(rng.uniform(-1, 1, (5,)))
W = jnp.asarray(rng.uniform(-1, 1, (4, 5)))


def loss(np_):
    def f(w, x):
        h = np_.tanh(w @ x)
        s = np_.sort(h)  # a primitive with an index-dependent jvp
        return np_.sum(s * np_.arange(4.0)) + np_.sum(np_.exp(-w ** 2)) + np_.max(h)
    return f


def test_repeated_grads_equal_jax_before_and_after_the_caches_engage():
    g = fx.grad(loss(fnp), argnums=(0, 1))
    want = jax.grad(loss(jnp), argnums=(0, 1))(W, X)
    for i in range(5):
        got = g(W, X)
        for a, b in zip(got, want):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-12)
        caches.wait_for_compiles()  # NOTE [bounded caches]: compiled off this thread
    fused = [k[0][0].name for k, v in reverse._fused.entries.items() if isinstance(v, reverse.FusedStep)]
    assert {"tanh", "dot_general", "exp"} <= set(fused)
    # the backward pass: compiled alone, or staged to run in the forward
    # program (NOTE [one program per gradient]), whichever came first
    assert (any(not isinstance(v, int) for v in reverse._backward.entries.values())
            or any(v is not None for v in reverse._staged.entries.values()))


def test_cached_backward_with_new_values_and_vjp_cotangents():
    f = loss(fnp)
    for i in range(4):
        w = W * (1.0 + 0.1 * i)
        out, vjp_fn = fx.vjp(f, w, X)
        ct = jnp.asarray(1.0 + i)
        gw, gx = vjp_fn(ct)
        jout, jvjp = jax.vjp(loss(jnp), w, X)
        jw, jx = jvjp(ct)
        np.testing.assert_allclose(np.asarray(out), np.asarray(jout), rtol=1e-6)
        np.testing.assert_allclose(np.asarray(gw), np.asarray(jw), rtol=1e-6, atol=1e-12)
        np.testing.assert_allclose(np.asarray(gx), np.asarray(jx), rtol=1e-6, atol=1e-12)


def test_nested_transforms_and_jax_jit_around_cached_steps_equal_jax():
    # nested: the inner grad's primals are tracers of the outer one
    h = fx.grad(lambda x: fx.grad(lambda y: fnp.sum(fnp.sin(y) * y))(x).sum())
    for _ in range(3):
        np.testing.assert_allclose(
            np.asarray(h(X)),
            np.asarray(jax.grad(lambda x: jax.grad(lambda y: jnp.sum(jnp.sin(y) * y))(x).sum())(X)),
            rtol=1e-6)
    np.testing.assert_allclose(np.asarray(jax.jit(fx.grad(lambda x: fnp.sum(fnp.cos(x))))(X)),
                               -np.sin(np.asarray(X)), rtol=1e-6)


def test_fused_steps_do_not_copy_inputs_into_residuals():
    # the residual of `w @ x` for x is w itself: it must be passed on, not
    # returned (copied) by the compiled primal step
    w = jnp.ones((256, 1024))
    x = jnp.ones(1024)
    kept = []
    for _ in range(3):
        before = sum(a.nbytes for a in jax.live_arrays())
        kept.append(fx.vjp(lambda x: w @ x, x))
        assert sum(a.nbytes for a in jax.live_arrays()) - before < w.nbytes // 4


def test_repeated_vmaps_equal_jax_before_and_after_batched_steps_engage():
    from functx.interpreters import batching

    def f(np_):
        def g(w, x):  # batched and unbatched operands, a moved batch axis
            return np_.sum(np_.tanh(w @ x) * np_.cos(x[:4]) + x[1:5] ** 2)
        return g

    xs = jnp.asarray(rng.uniform(-1, 1, (3, 5)))
    want = jax.vmap(f(jnp), in_axes=(None, 1))(W, xs.T)
    for _ in range(3):
        got = fx.vmap(f(fnp), in_dims=(None, 1))(W, xs.T)
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6)
        caches.wait_for_compiles()
    built = [k[0][0].name for k, v in batching._steps.entries.items() if isinstance(v, batching.BatchedStep)]
    # (w @ x is jnp.matmul, a jitted JAX function: one call, NOTE [JAX's jit
    # programs stay calls], batched as a whole graph rather than by a step)
    assert {"tanh", "cos"} <= set(built)


# --------------------------------------------------------------------------
# NOTE [bounded caches]: compiled off the calling thread, bounded, weak


def _bits(tree):
    return [np.asarray(x).tobytes() for x in jax.tree_util.tree_leaves(tree)]


def test_calls_do_not_wait_for_compilation_and_agree_bit_for_bit(monkeypatch, held_compiles):
    """While the fused steps, batched steps and compiled backward passes
    are compiling, calls take the per-primitive path; once they are ready
    the cached path runs. Every call's result is identical, bit for bit,
    and equal to JAX's."""
    for cache in (reverse._fused, reverse._backward):  # other tests' finished builds
        cache._collect()
    earlier = len(reverse._fused.pending) + len(reverse._backward.pending)
    deferred._programs.clear()
    switch = sys.getswitchinterval()
    held = held_compiles
    w = W * 1.2345  # avals/values no other test uses, so nothing is cached yet
    xs = jnp.asarray(rng.uniform(-1, 1, (6, 5)))

    def per_sample(np_):
        def f(w, x):
            h = np_.tanh(w @ x)
            return np_.sum(np_.exp(-h ** 2) * np_.sin(x[:4])) + np_.max(h)
        return f

    grad_fn = fx.grad(per_sample(fnp))
    vmapped = fx.vmap(fx.grad(per_sample(fnp)), in_dims=(None, 0))
    first = (_bits(grad_fn(w, X)), _bits(vmapped(w, xs)))
    for _ in range(3):  # compilations requested, none finished
        assert (_bits(grad_fn(w, X)), _bits(vmapped(w, xs))) == first
    pending = len(reverse._fused.pending) + len(reverse._backward.pending)
    assert pending > earlier and held.jobs
    assert sys.getswitchinterval() == min(switch, caches.SWITCH_INTERVAL)
    held.release()
    # steps ready: now the deferred runs of them compile. Each stage takes a
    # call or two (a queue program is built on its structure's second
    # sighting, the structure changes as fused steps, staged backward passes
    # and the steps above vmap land), so the rounds go on until a combined
    # program has run, as many as the slowest path needs
    for _ in range(10):
        assert (_bits(grad_fn(w, X)), _bits(vmapped(w, xs))) == first
        held.release()
        if deferred._programs.entries:
            break
    assert deferred._programs.entries  # NOTE [deferred eager steps]: combined programs ran
    for cache in (reverse._fused, reverse._backward):  # finished, never asked for again
        cache._collect()
    assert len(reverse._fused.pending) + len(reverse._backward.pending) <= earlier
    assert sys.getswitchinterval() == switch  # restored once the queue is empty
    want = jax.grad(per_sample(jnp))(w, X)
    np.testing.assert_allclose(np.asarray(grad_fn(w, X)), np.asarray(want), rtol=1e-6, atol=1e-12)
    np.testing.assert_allclose(np.asarray(vmapped(w, xs)),
                               np.asarray(jax.vmap(jax.grad(per_sample(jnp)), in_axes=(None, 0))(w, xs)),
                               rtol=1e-6, atol=1e-12)


def test_caches_are_bounded_and_count_keys_seen_once_in_an_lru(monkeypatch):
    cache = caches.RepeatCache("test cache", after=1, limit=3, count_limit=4)
    monkeypatch.setattr(caches, "BACKGROUND", False)
    try:
        for i in range(10):
            for _ in range(2):
                cache.get(("key", i), lambda i=i: (f"value {i}", lambda: 7))
            assert len(cache.entries) <= 3 and len(cache.counts) <= 4
        assert list(cache.entries.values()) == ["value 7", "value 8", "value 9"]
        assert cache.bytes == 21
        for i in range(10):  # keys seen once are forgotten in LRU order
            cache.get(("once", i), lambda: (None, None))
        assert len(cache.counts) == 4 and (("once", 9), caches.options_id()) in cache.counts
        info = fx.cache_info()["test cache"]
        assert (info["entries"], info["limit"], info["counted"]) == (3, 3, 4)
        fx.clear_caches()
        assert not cache.entries and not cache.counts and cache.bytes == 0
    finally:
        caches._REGISTRY.pop("test cache", None)


def test_an_entry_used_past_half_the_bound_outlives_older_unused_ones():
    """Hits reorder the LRU only past half its bound (a reorder hashes the
    key again); eviction still takes the oldest entries not used since."""
    cache = caches.Cache("test half lru", limit=4)
    try:
        for k in "abc":
            cache.put(k, k.upper())
        assert cache.get("a") == "A"  # 3 entries > half of 4: moved to the end
        cache.put("d", "D")
        cache.put("e", "E")  # over the bound: the oldest unused entry goes
        assert list(cache.entries) == ["c", "a", "d", "e"]
        assert cache.get("b") is None and cache.get("a") == "A"
    finally:
        caches._REGISTRY.pop("test half lru", None)


def test_a_graph_in_a_key_is_held_weakly():
    """A key holding a staged graph (a jit_call's parameter) does not keep
    it alive; once it dies its entries go at the next insertion."""
    import gc
    import weakref

    from functx.interpreters.staging import Graph

    cache = caches.Cache("test weak cache", limit=10)
    try:
        graph = Graph([], [], [])
        ref = weakref.ref(graph)
        key = ("jit_call", (("graph", graph), ("name", "f")))
        cache.put(key, "compiled")
        assert cache.get(key) == "compiled"
        assert cache.get(("jit_call", (("graph", Graph([], [], [])), ("name", "f")))) is None
        del graph, key
        gc.collect()
        assert ref() is None
        cache.put(("other",), "x")
        assert list(cache.entries) == [("other",)]
    finally:
        caches._REGISTRY.pop("test weak cache", None)


def test_eager_programs_of_all_primitives_share_one_bound(monkeypatch):
    """NOTE [eager programs, bounded process-wide]: the per-primitive
    programs of every primitive, parameter set and argument signature
    together stay within `PROGRAM_LIMIT` binds and `PROGRAM_BYTE_LIMIT`
    bytes, results unchanged when a dropped one is compiled again."""
    from functx.interpreters import eval as ev

    monkeypatch.setattr(ev, "PROGRAM_LIMIT", 6)
    monkeypatch.setattr(ev, "PROGRAM_BYTE_LIMIT", 10 * caches.PROGRAM_BYTES)
    fx.clear_caches()
    ours = fx.grad(lambda v: (fnp.sin(v) * fnp.cos(v)).sum())
    theirs = jax.grad(lambda v: (jnp.sin(v) * jnp.cos(v)).sum())
    for n in range(1, 25):  # a new shape per call: the per-primitive programs run
        x = jnp.linspace(-1.0, 1.0, n)
        np.testing.assert_array_equal(np.asarray(ours(x)), np.asarray(theirs(x)))
        assert len(ev._PROGRAMS) <= 6
    info = fx.cache_info()["eager programs"]
    assert 0 < info["bytes"] <= info["byte_limit"] == 10 * caches.PROGRAM_BYTES
    assert info["entries"] <= info["limit"] == 6


def test_programs_of_calls_run_on_arrays_share_the_bound(monkeypatch):
    """Jitted JAX functions met eagerly run their graphs' programs (one per
    graph, derived graphs included): listed under the same bound, holding
    the graphs weakly, and made again when needed again."""
    import gc
    import weakref

    from functx.interpreters import eval as ev

    monkeypatch.setattr(ev, "PROGRAM_LIMIT", 3)
    fx.clear_caches()
    x = jnp.linspace(-1.0, 1.0, 5)
    fns = [jax.jit(lambda v, k=k: jnp.sin(v * (k + 1.5)) * v) for k in range(6)]
    for _ in range(2):
        for jf in fns:
            got = fx.grad(lambda v: jf(v).sum())(x)
            np.testing.assert_array_equal(np.asarray(got), np.asarray(jax.grad(lambda v: jf(v).sum())(x)))
            assert len(ev._PROGRAMS) <= 3
    graphs = [h() for h, key in ev._PROGRAMS if key == ev.CALL_PROGRAM]
    assert graphs and all(g is not None and ev.CALL_PROGRAM in g.cache for g in graphs)
    del graphs
    # the listing holds a graph weakly: one dropped leaves it at the next count
    from functx.interpreters.staging import Graph

    graph = Graph([], [], [])
    ev.keep_call_program(graph, lambda: [])
    ref = weakref.ref(graph)
    del graph
    gc.collect()
    ev._bound()
    assert ref() is None
    assert all(not isinstance(h, weakref.ref) or h() is not None for h, _ in ev._PROGRAMS)
    fx.clear_caches()
    assert not ev._PROGRAMS


def test_eager_programs_drop_the_oldest_unused_bind_and_free_it(monkeypatch):
    """Second-chance LRU: a bind called since it was listed outlives older
    unused ones; a dropped bind (and with it its executables) is freed."""
    import gc
    import weakref

    from functx.interpreters import eval as ev
    from functx.primitives.elementwise import integer_pow_p

    monkeypatch.setattr(ev, "PROGRAM_LIMIT", 4)
    fx.clear_caches()
    impl = ev.impl_rules[integer_pow_p]
    x = jnp.arange(3.0)
    for y in (2, 3, 4, 5):
        np.testing.assert_array_equal(np.asarray(impl(x, y=y)), np.asarray(x) ** y)
    listed = {k[0]: e for k, e in impl.programs.items()}
    dropped = weakref.ref(listed[(("y", 3),)][0])
    impl(x, y=2)  # used again: a second chance
    impl(x, y=6)
    assert sorted(dict(k[0])["y"] for k in impl.programs) == [2, 4, 5, 6]
    del listed
    gc.collect()
    assert dropped() is None
    np.testing.assert_array_equal(np.asarray(impl(x, y=3)), np.asarray(x) ** 3)


def test_clear_caches_then_results_unchanged():
    g = fx.grad(loss(fnp), argnums=(0, 1))
    before = _bits(g(W, X))
    g(W, X)
    caches.wait_for_compiles()
    fx.clear_caches()
    info = fx.cache_info()
    assert all(v["entries"] == 0 for v in info.values())
    assert _bits(g(W, X)) == before


_X64_IN_A_CONTEXT = """
import numpy as np, jax, jax.numpy as jnp, functx as fx
from functx import caches
from functx.interpreters import reverse

def f(a):
    return jax.nn.logsumexp(a * 1e-3 + 1.0) + jnp.sum(jnp.sort(a) * jnp.arange(4.0))

assert not jax.config.jax_enable_x64
with jax.enable_x64(True):
    a = jnp.asarray(np.linspace(-1, 1, 4), jnp.float64)
    want = np.asarray(jax.grad(f)(a))
    g = fx.grad(f)
    errors = []
    for _ in range(6):
        got = g(a)
        errors.append((str(got.dtype), float(np.max(np.abs(np.asarray(got) - want)))))
        caches.wait_for_compiles()
    built = bool(reverse._fused.entries)
print(sorted(set(errors)), built)
"""


def test_builds_off_the_calling_thread_take_the_callers_jax_options():
    """A call inside `with jax.enable_x64(True)` (a context: this thread
    only) hands its repeated steps to the compile thread; they must be
    staged with the caller's options (NOTE [JAX options off the calling
    thread] in caches.py). Before, the fused steps of logsumexp's rules were
    staged in float32 there and the fifth call failed. Run in a process
    with x64 off, as users' are."""
    import os
    import subprocess

    env = dict(os.environ, JAX_ENABLE_X64="0")
    out = subprocess.run([sys.executable, "-c", _X64_IN_A_CONTEXT], capture_output=True,
                         text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[('float64', 0.0)] True", out.stdout
    # a job runs with the options its caller had entered, and only those
    x64 = not jax.config.jax_enable_x64
    with jax.enable_x64(x64):
        seen = caches.submit(lambda: jax.config.jax_enable_x64).result()
    assert seen is x64
    assert caches.submit(lambda: jax.config.jax_enable_x64).result() is not x64


def test_an_entry_built_under_other_jax_options_is_not_taken():
    """The same structure, first outside a context, then inside one: the
    eager caches key on JAX's options, so the call inside sees no step
    built outside (as jax.jit traces again under a new context)."""
    fx.clear_caches()  # and what earlier tests left pending
    g = fx.grad(lambda w: fnp.sum(fnp.tanh(w @ X)))
    for _ in range(3):
        g(W)
        caches.wait_for_compiles()
    outside = {k for k, v in reverse._fused.entries.items() if isinstance(v, reverse.FusedStep)}
    assert outside
    with jax.default_matmul_precision("highest"):
        want = jax.grad(lambda w: jnp.sum(jnp.tanh(w @ X)))(W)
        for _ in range(3):
            np.testing.assert_allclose(np.asarray(g(W)), np.asarray(want), rtol=1e-6)
            caches.wait_for_compiles()
    ids = {k[1] for k in outside}
    inside = {k for k, v in reverse._fused.entries.items()
              if isinstance(v, reverse.FusedStep) and k[1] not in ids}
    assert inside
    assert {k[0] for k in inside} & {k[0] for k in outside}  # the same steps, again


def test_a_lifted_function_dropped_by_the_user_is_freed():
    import gc
    import weakref

    from functx import lifting

    def make(scale):
        def f(x):
            return jnp.sin(x) * scale
        return f

    f = make(2.5)
    ref = weakref.ref(f)
    got = fx.grad(lambda x: fx.lift(f)(x).sum())(X)
    np.testing.assert_allclose(np.asarray(got), 2.5 * np.cos(np.asarray(X)), rtol=1e-12)

    def names(key, obj):
        return any(part.ref() is obj for part in caches._refs(key, []))

    assert len([k for k in lifting._CACHE.entries if names(k, f)]) == 1
    del f
    gc.collect()
    assert ref() is None  # the cache names the function weakly
    g = make(1.5)
    fx.grad(lambda x: fx.lift(g)(x).sum())(X)  # the next insertion purges
    assert not any(part.ref() is None for k in lifting._CACHE.entries
                   for part in caches._refs(k, []))


def test_custom_functions_defined_at_every_call_keep_nothing_alive():
    """jax.custom_vjp / custom_jvp functions defined inside the function being
    differentiated, at every call, closing over a new array: the staged
    program holds the array and the objects, so caching it under a key that
    names them weakly kept each call's closure alive until the cache's bound
    of 2,048 entries (NOTE [lifted functions keyed by what they read]), and
    the eager engine's counts of keys seen once held the rule objects, and
    through them the closures, until their bound of 4,096
    (`caches.WeaklyKeyed`). Nothing survives the calls now, under grad,
    vmap(grad), jvp and hessian; the derivatives are the rules' (JAX's)."""
    import gc
    import weakref

    refs = []

    def loss(y, i):
        big = jnp.full((64,), float(i))
        refs.append(weakref.ref(big))

        @jax.custom_vjp
        def f(y):
            return y * big.sum()

        f.defvjp(lambda y: (f(y), None), lambda _, g: (g * big.sum() * 2.0,))

        @jax.custom_jvp
        def h(y):
            return y * big.sum()

        h.defjvp(lambda p, t: (h(*p), t[0] * big.sum() * 3.0))
        return f(y * 1.0) + h(y)

    one, ones = jnp.asarray(1.0), jnp.ones(3)
    cases = {  # the rules say d/dy = 2S + 3S, S = 64 i; JAX cannot jvp a custom_vjp
        "grad": (lambda i: fx.grad(loss)(one, i), lambda i: 5 * 64.0 * i),
        "vmap(grad)": (lambda i: fx.vmap(fx.grad(loss), in_dims=(0, None))(ones, i),
                       lambda i: np.full(3, 5 * 64.0 * i)),
        "jvp": (lambda i: fx.jvp(lambda y: loss(y, i), (one,), (one,)),  # noqa: B023
                lambda i: (2 * 64.0 * i, 5 * 64.0 * i)),
        "hessian": (lambda i: fx.hessian(loss)(one, i), lambda i: 0.0),
    }
    for name, (case, want) in cases.items():
        refs.clear()
        for i in range(4):
            np.testing.assert_allclose(np.asarray(case(i)), np.asarray(want(i)), err_msg=name)
        gc.collect()
        assert [r for r in refs if r() is not None] == [], name
    np.testing.assert_allclose(np.asarray(jax.grad(loss)(1.0, 3)), 5 * 64.0 * 3)


def test_a_new_batch_size_compiles_a_few_programs_not_one_per_step():
    """Memory per new shape (issue: a notebook trying batch sizes keeps every
    program): beyond the per-primitive programs (which JAX eager compiles
    too), a new batch size of vmap(grad) compiles only the deferred queue's
    programs, the same number for every size; fused and batched steps are
    staged graphs, never programs of their own (NOTE [deferred eager steps])."""
    def loss(w, x, y):
        return fnp.sum((fnp.tanh(x @ w) - y) ** 2)

    per_sample = fx.vmap(fx.grad(loss), in_dims=(None, 0, 0))
    w = jnp.ones((3, 2))
    compiles = []
    def programs():
        caches.wait_for_compiles()
        deferred._programs._collect()  # finished builds, this test's or earlier tests'
        return caches.cache_info()["deferred steps"]["entries"]

    for b in (5, 6, 7):
        before = programs()
        xs, ys = jnp.ones((b, 3)) * 0.1 * b, jnp.zeros((b, 2))
        for _ in range(7):  # past the steps (2nd sighting) and the queue's program
            out = per_sample(w, xs, ys)
            caches.wait_for_compiles()
        np.testing.assert_allclose(
            out, jax.vmap(jax.grad(loss), in_axes=(None, 0, 0))(w, xs, ys), rtol=1e-12)
        compiles.append(programs() - before)
    assert compiles[1] == compiles[2] and 1 <= compiles[2] <= 4, compiles
    for name in ("batched steps", "fused steps"):
        assert caches.cache_info()[name]["bytes"] == 0, f"{name} hold compiled programs"


def test_a_new_batch_size_compiles_one_queue_program_not_those_of_its_warm_up():
    """At a new batch size, the hidden layers of an MLP of equal widths each
    flushed the same two batched steps while the fused step of the `tanh`
    after them was being staged: that structure, met twice within one call,
    was compiled and never run again (two queue programs per size, the
    first size five). Held back while staging builds are in flight
    (`caches.HOLD_CALLS`), each size compiles the one program its calls
    run."""
    if not caches.BACKGROUND:
        pytest.skip("FUNCTX_BACKGROUND_COMPILE=0: nothing is staged in the background")

    def mlp(np_, nn):
        def loss(p, x, y):
            h = x
            for w, b in p[:-1]:
                h = np_.tanh(h @ w + b)
            w, b = p[-1]
            return -np_.sum(y * nn.log_softmax(h @ w + b))
        return loss

    r = np.random.default_rng(7)
    params = [(jnp.asarray(r.normal(size=(m, n)) * 0.3), jnp.asarray(r.normal(size=n) * 0.1))
              for m, n in ((4, 8), (8, 8), (8, 3))]
    per_sample = fx.vmap(fx.grad(mlp(fnp, fx.nn)), in_dims=(None, 0, 0))

    def programs():
        caches.wait_for_compiles()
        deferred._programs._collect()
        return caches.cache_info()["deferred steps"]["entries"]

    compiles = []
    for b in (9, 10, 11):
        before = programs()
        x, y = jnp.asarray(r.normal(size=(b, 4))), jnp.eye(3)[np.arange(b) % 3]
        for _ in range(7):
            out = per_sample(params, x, y)
            caches.wait_for_compiles()
        want = jax.vmap(jax.grad(mlp(jnp, jax.nn)), in_axes=(None, 0, 0))(params, x, y)
        for (gw, gb), (ww, wb) in zip(out, want):
            np.testing.assert_allclose(gw, ww, rtol=1e-10, atol=1e-12)
            np.testing.assert_allclose(gb, wb, rtol=1e-10, atol=1e-12)
        compiles.append(programs() - before)
    assert compiles[1:] == [1, 1], compiles


def test_a_key_met_while_steps_are_staged_is_built_later_or_after_some_calls(monkeypatch):
    """`RepeatCache.get(hold=True)`: a key seen often enough is not built
    while held; it is built at its next sighting without `hold`, or at a
    held one `HOLD_CALLS` transform calls after the first held sighting."""
    if not caches.BACKGROUND:
        pytest.skip("FUNCTX_BACKGROUND_COMPILE=0: there is no compile thread")
    built = []
    cache = caches.RepeatCache("test held builds", after=1, limit=8)
    build = lambda name: lambda: (built.append(name) or name, None)  # noqa: E731
    try:
        for _ in range(3):
            assert cache.get("a", build("a"), hold=True) is None
        caches.wait_for_compiles()
        assert built == [] and cache.info()["pending"] == 0
        cache.get("a", build("a"))  # nothing staged now: submitted
        caches.wait_for_compiles()
        assert cache.get("a", build("a")) == "a" and built == ["a"] and not cache.held

        calls = caches.calls_begun
        for k in range(caches.HOLD_CALLS):
            monkeypatch.setattr(caches, "calls_begun", calls + k)
            for _ in range(2):
                assert cache.get("b", build("b"), hold=True) is None
        caches.wait_for_compiles()
        assert built == ["a"]
        monkeypatch.setattr(caches, "calls_begun", calls + caches.HOLD_CALLS)
        cache.get("b", build("b"), hold=True)  # still met: built after all
        caches.wait_for_compiles()
        assert cache.get("b", build("b"), hold=True) == "b" and built == ["a", "b"]
    finally:
        caches._REGISTRY.pop("test held builds", None)


def test_the_compile_thread_returns_its_free_heap_after_compiling():
    """NOTE [the compile thread's heap]: once the compile thread has
    compiled and has nothing left to do, it returns the allocator's free
    pages (glibc), before `wait_for_compiles` returns."""
    if not caches.BACKGROUND or caches._trim is None:
        pytest.skip("no compile thread, or no glibc malloc_trim")
    def loss(np_):
        return lambda w, x: np_.sum(np_.sin(np_.cos(x @ w) * 1.7) ** 2)

    f = fx.vmap(fx.grad(loss(fnp)), in_dims=(None, 0))
    w, x = jnp.ones((3, 2)) * 0.3, jnp.linspace(0.0, 1.0, 39).reshape(13, 3)
    before = caches.heap_releases[0]
    for _ in range(10):  # past the steps (2nd sighting) and the queue's program
        out = f(w, x)
        caches.wait_for_compiles()
        if caches.heap_releases[0] > before:
            break
    assert caches.heap_releases[0] > before
    np.testing.assert_allclose(out, jax.vmap(jax.grad(loss(jnp)), in_axes=(None, 0))(w, x),
                               rtol=1e-12)


def test_a_staged_backward_pass_is_batched_off_the_calling_thread():
    """NOTE [staged backward passes]: the first call that uses a staged
    backward pass inside vmap batches its graph, which folds the graph's
    constants (relu's zero, broadcast to the batch) through per-primitive
    programs: that used to compile on the calling thread at call 3 or later
    (a call slower than the one before). It is staged on the compile thread
    while that call's backward runs equation by equation."""
    import logging
    import threading

    def loss(w, x, y):
        h = x @ w
        return fnp.sum((fnp.where(h > 0, h, 0.0) - y) ** 2)

    def loss_jax(w, x, y):
        h = x @ w
        return jnp.sum((jnp.where(h > 0, h, 0.0) - y) ** 2)

    per_sample = fx.vmap(fx.grad(loss), in_dims=(None, 0, 0))
    w, xs, ys = W[:, :3], X[:, None] * jnp.ones((5, 4)), jnp.zeros((5, 3))
    want = jax.vmap(jax.grad(loss_jax), in_axes=(None, 0, 0))(w, xs, ys)
    main = threading.main_thread()
    compiled_here = []

    class Listen(logging.Handler):
        def emit(self, record):
            if threading.current_thread() is main:
                compiled_here.append(record.getMessage())

    handler = Listen()
    was = fx.config.read("log_compiles")
    for call in range(6):
        if call == 2:  # what the first calls compile is not the question
            logging.getLogger("functx").addHandler(handler)
            fx.config.update("log_compiles", True)
        try:
            out = per_sample(w, xs, ys)
        finally:
            if call == 5:
                fx.config.update("log_compiles", was)
                logging.getLogger("functx").removeHandler(handler)
        np.testing.assert_allclose(out, want, rtol=1e-12)
        caches.wait_for_compiles()
    assert caches.cache_info()["staged backward passes"]["entries"] >= 1
    assert not compiled_here, compiled_here


def test_a_jitted_jax_function_through_functx_numpy_is_one_call_eagerly():
    """NOTE [JAX's jit programs stay calls] holds for functions lifted by
    functx.numpy / functx.nn too (`fx.nn.log_softmax` is jax.nn's jitted
    function): eagerly one jit_call, compiled as one program per shape, as
    JAX eager compiles it; its equations used to be inlined, each compiled
    per shape (twice JAX's memory per new batch size)."""
    import logging

    names = []

    class Listen(logging.Handler):
        def emit(self, record):
            names.append(record.getMessage())

    w = jnp.arange(1.0, 5.0)
    f = fx.vmap(fx.grad(lambda x: (fx.nn.log_softmax(x) * w).sum()))
    handler = Listen()
    was = fx.config.read("log_compiles")
    logging.getLogger("functx").addHandler(handler)
    fx.config.update("log_compiles", True)
    try:
        xs = jnp.linspace(-1.0, 1.0, 7 * 4).reshape(7, 4)
        out = f(xs)
    finally:
        fx.config.update("log_compiles", was)
        logging.getLogger("functx").removeHandler(handler)
    np.testing.assert_allclose(
        out, jax.vmap(jax.grad(lambda x: (jax.nn.log_softmax(x) * w).sum()))(xs), rtol=1e-12)
    inlined = [n for n in names if any(f"functx_eval_{p})" in n for p in ("exp", "log", "reduce_max"))]
    assert not inlined, inlined
    assert any("jax.jit(log_softmax)" in n for n in names), names  # one program of it


def test_one_equation_is_not_compiled_again_as_a_backward_pass_or_a_queue_program():
    """`grad(jit(f))` (a new jit wrapper every call, as in a loop): the tape
    is one `jit_call` and the deferred queue one step of one. Each is one
    dispatch already, so neither a compiled backward pass nor a queue
    program is built for them: those compilations (hundreds of ms on the
    compile thread) ran beside calls 3-9 and slowed them 2-4x."""
    import logging

    names = []

    class Listen(logging.Handler):
        def emit(self, record):
            names.append(record.getMessage())

    def f(np_):
        return lambda w: np_.sum(np_.tanh(W @ w) ** 2)

    expected = jax.grad(jax.jit(f(jnp)))(X)
    g = f(fnp)
    handler = Listen()
    was = fx.config.read("log_compiles")
    logging.getLogger("functx").addHandler(handler)
    fx.config.update("log_compiles", True)
    try:
        for _ in range(6):
            out = fx.grad(fx.jit(g))(X)
            caches.wait_for_compiles()
            np.testing.assert_allclose(out, expected, rtol=1e-12)
    finally:
        fx.config.update("log_compiles", was)
        logging.getLogger("functx").removeHandler(handler)
    again = [n for n in names if "functx_backward" in n or "functx_deferred" in n]
    assert not again, again


def test_a_jitted_function_differentiated_alone_compiles_its_programs_whole():
    """NOTE [a jitted function differentiated alone]: `grad(jit(f))` at the
    top level runs its forward and transposed graphs as whole programs (no
    primitive kept apart, as jax.grad(jax.jit(f)) compiles them), the same
    in every call; the same jitted function inside a larger function keeps
    its primitives apart."""
    from functx.interpreters import eval as ev

    def f(np_):
        return lambda w: np_.sum(np_.tanh(W @ w) ** 2)

    expected = jax.grad(jax.jit(f(jnp)))(X)
    jitted = fx.jit(f(fnp))
    fx.clear_caches()
    firsts = None
    for _ in range(4):
        out = fx.grad(jitted)(X)
        caches.wait_for_compiles()
        np.testing.assert_allclose(out, expected, rtol=1e-12)
        firsts = np.asarray(out).tobytes() if firsts is None else firsts
        assert np.asarray(out).tobytes() == firsts
    whole = [h() for h, key in ev._PROGRAMS if key == ev.WHOLE_CALL_PROGRAM]
    assert len(whole) == 2 and not [h for h, key in ev._PROGRAMS if key == ev.CALL_PROGRAM]
    for graph in whole:
        program = graph.cache[ev.WHOLE_CALL_PROGRAM][0]
        specs = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in graph.in_avals]
        assert "functx_eval_" not in program.lower(*specs).as_text()  # no kept call
    out = fx.grad(lambda w: jitted(w) * 2.0)(X)
    np.testing.assert_allclose(out, 2.0 * expected, rtol=1e-12)
    assert [h for h, key in ev._PROGRAMS if key == ev.CALL_PROGRAM]


def test_a_call_marked_alone_with_other_work_is_never_inlined(monkeypatch):
    """NOTE [a jitted function differentiated alone]: should a marked call
    ever share its queue and tape with other work, neither the queue nor
    the backward pass is compiled into one program with it (the call would
    round otherwise inlined): every call runs it step by step, the same
    bits each time, equal to JAX's. Forced here by marking the jitted
    function's call inside a larger function."""
    import logging
    import sys as _sys

    names = []

    class Listen(logging.Handler):
        def emit(self, record):
            names.append(record.getMessage())

    monkeypatch.setattr(_sys.modules["functx.transforms.grad"], "_is_jitted", lambda f: True)
    inner = fx.jit(lambda w: fnp.sum(fnp.tanh(W @ w) ** 2))
    expected = jax.grad(lambda w: jnp.sum(jnp.tanh(W @ w) ** 2) * 2.0 + jnp.sum(jnp.sin(w)))(X)
    g = fx.grad(lambda w: inner(w) * 2.0 + fnp.sum(fnp.sin(w)))
    handler = Listen()
    was = fx.config.read("log_compiles")
    logging.getLogger("functx").addHandler(handler)
    fx.config.update("log_compiles", True)
    seen = set()
    try:
        for _ in range(6):
            out = g(X)
            caches.wait_for_compiles()
            np.testing.assert_allclose(out, expected, rtol=1e-12)
            seen.add(np.asarray(out).tobytes())
    finally:
        fx.config.update("log_compiles", was)
        logging.getLogger("functx").removeHandler(handler)
    assert len(seen) == 1
    combined = [n for n in names if "functx_backward" in n or "functx_deferred" in n]
    assert not combined, combined


def test_a_build_no_lookup_asked_for_lately_is_dropped_not_compiled():
    """While the compile thread is behind, a pending build whose key no
    lookup has asked for in the last `stale_after` lookups is dropped when
    its turn comes (the deferred queue's structures of a warm-up that the
    calls have moved past); a key met again later is built."""
    import threading

    if not caches.BACKGROUND:
        pytest.skip("FUNCTX_BACKGROUND_COMPILE=0: there is no compile thread")
    built = []
    cache = caches.RepeatCache("test stale builds", after=1, limit=8, stale_after=3)
    gate = threading.Event()
    try:
        blocker = caches.submit(gate.wait)  # the compile thread is behind
        for _ in range(2):  # the second sighting submits the build
            assert cache.get("old", lambda: (built.append("old") or "v", None)) is None
        for i in range(5):  # other lookups: "old" is not asked for again
            cache.get(("other", i), lambda: ("w", None))
        gate.set()
        blocker.result()
        caches.wait_for_compiles()
        assert cache.info()["pending"] == 0 and not cache.asked  # nothing left behind
        assert cache.get("old", lambda: ("v", None)) is None and built == []
        for _ in range(2):  # met again: counted, submitted, built
            cache.get("old", lambda: (built.append("old") or "v", None))
        caches.wait_for_compiles()
        assert cache.get("old", lambda: ("v", None)) == "v" and built == ["old"]
    finally:
        gate.set()
        caches._REGISTRY.pop("test stale builds", None)


def test_a_build_not_asked_for_during_the_last_calls_is_stale_and_newest_compiles_first():
    """While the compile thread is behind, a pending build that no lookup
    asked for during the last `stale_calls` transform calls is dropped when
    its turn comes, and of two compilations the newer runs first (the
    structure the calls run now, not one of a warm-up they left)."""
    import threading

    if not caches.BACKGROUND:
        pytest.skip("FUNCTX_BACKGROUND_COMPILE=0: there is no compile thread")
    order = []
    cache = caches.RepeatCache("test stale calls", after=1, limit=8, stale_after=1000,
                               stale_calls=2)
    gate = threading.Event()
    f = fx.grad(lambda x: (x * x).sum())
    x = jnp.ones(3)
    try:
        blocker = caches.submit(gate.wait)  # the compile thread is behind
        for key in ("left", "kept", "newest"):
            for _ in range(2):  # the second sighting submits the build
                cache.get(key, lambda key=key: (order.append(key) or key, None))
            f(x)  # a transform call: the clock of stale_calls
        for _ in range(3):  # "kept" and "newest" are asked for in every call; "left" is not
            cache.get("kept", None)
            cache.get("newest", None)
            f(x)
        gate.set()
        blocker.result()
        caches.wait_for_compiles()
        assert order == ["newest", "kept"]
        assert cache.get("kept", None) == "kept" and cache.get("newest", None) == "newest"
        assert cache.info()["pending"] == 0 and cache.get("left", None) is None
    finally:
        gate.set()
        caches._REGISTRY.pop("test stale calls", None)


def test_finished_builds_never_asked_for_again_are_bounded_by_the_cache():
    """A build that finished for a key no lookup asks for again (a queue
    structure the calls moved past) moves into the cache's bounded entries
    at a later lookup, instead of staying pending with its value."""
    if not caches.BACKGROUND:
        pytest.skip("FUNCTX_BACKGROUND_COMPILE=0: there is no compile thread")
    cache = caches.RepeatCache("test collected builds", after=1, limit=2)
    try:
        for i in range(5):
            for _ in range(2):  # submitted, never asked for again
                cache.get(("gone", i), lambda i=i: (f"v{i}", None))
        caches.wait_for_compiles()
        for i in range(130):
            cache.get(("other", i), lambda: ("w", None))
        info = cache.info()
        assert info["pending"] <= 1 and info["entries"] <= 2, info
    finally:
        caches._REGISTRY.pop("test collected builds", None)


def test_the_compile_thread_stages_before_it_compiles():
    """Builds that only stage (steps, staged backward passes) run before XLA
    compilations submitted earlier: they change which programs the calls
    need (NOTE [bounded caches])."""
    import threading

    if not caches.BACKGROUND:
        pytest.skip("FUNCTX_BACKGROUND_COMPILE=0: there is no compile thread")
    order = []
    gate = threading.Event()
    blocker = caches.submit(gate.wait)
    try:
        compiling = caches._submit(lambda: order.append("compile"), caches.COMPILING)
        staging = caches.submit(lambda: order.append("stage"), caches.STAGING)
    finally:
        gate.set()
    blocker.result(), compiling.result(), staging.result()
    assert order == ["stage", "compile"]


def test_the_compile_thread_runs_a_new_program_once_before_a_call_takes_it(monkeypatch):
    """NOTE [a program's first run]: XLA:CPU finishes a program on its first
    run, so the compile thread runs each program it compiled for the eager
    engine once, on zeros, when no call is in progress; the calls' results
    are unchanged (JAX's, bit for bit on every call). Its zeros compile
    nothing (`jnp.zeros` compiled a program per shape: 2 MB each)."""
    import threading

    from functx.interpreters import eval as eval_

    runs, compiled, zero_run_compiles = [], [], []
    first_run = eval_._first_run

    def spy(program, jaxpr, specs):
        def counted(*args):
            runs.append(threading.current_thread() is threading.main_thread())
            return program(*args)

        before = len(compiled)
        first_run(counted, jaxpr, specs)
        zero_run_compiles.append(compiled[before:])

    def listener(event, duration, **kwargs):
        if event == "/jax/core/compile/backend_compile_duration":
            compiled.append(kwargs.get("fun_name"))

    monkeypatch.setattr(eval_, "_first_run", spy)
    jax.monitoring.register_event_duration_secs_listener(listener)
    fx.clear_caches()
    g = fx.vmap(fx.grad(loss(fnp)), in_dims=(None, 0))
    xs = jnp.stack([X * (1.0 + 0.1 * i) for i in range(13)])  # shapes of no other test
    want = jax.vmap(jax.grad(loss(jnp)), in_axes=(None, 0))(W, xs)
    seen = set()
    for _ in range(6):
        got = g(W, xs)
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6, atol=1e-12)
        seen.add(np.asarray(got).tobytes())
        caches.wait_for_compiles()
    assert len(seen) == 1
    assert runs and not any(runs), runs  # at least one, none on the calling thread
    assert not any(zero_run_compiles), zero_run_compiles


def test_programs_with_effects_or_callbacks_are_not_run_on_zeros():
    from functx.interpreters import eval as eval_

    def plain(x):
        return jnp.sin(x) * 2.0

    def printing(x):
        jax.debug.callback(lambda v: None, x)
        return x * 2.0

    def calling_back(x):  # a pure callback, nested in a jitted function
        inner = jax.jit(lambda v: jax.pure_callback(np.sin, jax.ShapeDtypeStruct((3,), v.dtype), v))
        return inner(x) + 1.0

    spec = jax.ShapeDtypeStruct((3,), jnp.float32)
    assert not eval_._calls_back(jax.make_jaxpr(plain)(spec))
    assert eval_._calls_back(jax.make_jaxpr(printing)(spec))
    assert eval_._calls_back(jax.make_jaxpr(calling_back)(spec))


def test_host_values_and_zeros_reach_the_device_without_a_program():
    """`host_to_jax` / `jax_zeros` (core.py): NumPy arrays and Python numbers
    given to eager transforms, and the zeros they make at the top level,
    have `jnp.asarray`'s / `jnp.zeros`'s dtypes, weak types and values, and
    compile no JAX program (those compile one per new shape, 12-25 ms each
    on a CPU: a first eager call paid them)."""
    from functx.core import host_to_jax, jax_zeros

    compiles, on = [], [True]

    def listener(event, duration, **kwargs):
        if on[0] and event == "/jax/core/compile/backend_compile_duration":
            compiles.append(kwargs.get("fun_name"))

    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        for v in [np.ones((3, 7)), np.float64(2.0), np.int64(3), np.ones((2,), np.float16),
                  np.array(True), 2.0, 3, True, 1j]:
            compiles.clear()
            got = host_to_jax(v)
            assert compiles == [], (v, compiles)
            want = jnp.asarray(v)
            assert (got.dtype, got.weak_type) == (want.dtype, want.weak_type), v
            assert np.array_equal(got, want)
        compiles.clear()
        z = jax_zeros((4, 9), np.float32)
        assert compiles == [] and z.dtype == np.float32 and not np.asarray(z).any()
        key = jax.random.key(0)
        assert jax_zeros((2,), key.dtype).dtype == jnp.zeros((2,), key.dtype).dtype
        traced = jax.make_jaxpr(lambda: jax_zeros((4, 9), np.float32))()
        assert not traced.consts  # while JAX traces: a broadcast, not a 36-element constant

        # end to end: a NumPy input of a new shape, and an input the output
        # does not read (its gradient is zeros)
        x = np.linspace(-1.0, 1.0, 3 * 11, dtype=np.float32).reshape(3, 11)
        compiles.clear()
        gx, gy = fx.grad(lambda x, y: fnp.sum(fnp.sin(x)), argnums=(0, 1))(x, np.ones((5, 13), np.float32))
        assert np.allclose(gx, np.cos(x)) and gy.shape == (5, 13) and not np.asarray(gy).any()
        # only functx's own programs (before: JAX's `stage` three times and a `broadcast_in_dim`)
        assert all("functx" in n or "lambda" in n for n in compiles), compiles
    finally:
        on[0] = False


def test_a_near_full_collection_runs_on_the_compile_thread_between_calls(monkeypatch):
    """NOTE [full collections between calls]: once CPython's full collection
    is near, the compile thread runs it while no call is running (not while
    one is), so that it does not land inside a later call."""
    import gc
    import threading

    from functx import core

    ic = caches.idle_collection
    if not ic.on or not gc.isenabled() or gc.get_threshold()[2] < 2:
        pytest.skip("no generational full collections to move on this Python")
    caches.submit(lambda: None).result()  # the compile thread is running
    full = []

    def observe(phase, info):
        if phase == "stop" and info["generation"] == 2:
            full.append(threading.get_ident())

    def wait_for(pred, seconds):
        deadline = time.perf_counter() + seconds
        while not pred() and time.perf_counter() < deadline:
            time.sleep(0.01)
        return pred()

    gc.callbacks.append(observe)
    try:
        gc.collect()
        runs = ic.runs
        ic.base //= 2  # as if the heap had doubled since (a full collection resets it)
        monkeypatch.setitem(core.busy, -1, 1)  # a call in progress on another thread
        for _ in range(gc.get_threshold()[2] // 2):
            gc.collect(1)  # each counts toward the next full collection
        assert ic.armed()
        time.sleep(3 * ic.POLL_S)
        assert ic.runs == runs and caches.compile_thread not in full  # not while a call runs
        del core.busy[-1]
        assert wait_for(lambda: ic.runs > runs, 20.0)
        assert caches.compile_thread in full and not ic.armed()
    finally:
        gc.callbacks.remove(observe)


def test_the_compile_thread_yields_its_python_while_a_call_runs(monkeypatch):
    """NOTE [bounded caches]: while another thread is inside a transform, the
    compile thread's own Python (here JAX's tracing and lowering of a
    program) sleeps after every `SLICE_S` of running, so a call in a tight
    loop is not stalled for a whole lowering; with no call running it never
    does. Up to Python 3.11 through a trace function on that thread alone,
    from 3.12 on through `sys.monitoring` events on the functions called
    once per equation."""
    from functx import core

    def chain(x):
        for k in range(40):
            x = jnp.sin(x) * (k + 1.0)
        return x

    spec = jax.ShapeDtypeStruct((3,), jnp.float32)

    def lower_until_yields(k, seconds=20.0):
        start, deadline = caches.yields, time.perf_counter() + seconds
        while caches.yields - start < k and time.perf_counter() < deadline:
            jax.jit(lambda x: chain(x)).lower(spec)  # a new function: traced and lowered anew
        return caches.yields - start

    caches.submit(lambda: None).result()  # the compile thread is running
    before = caches.yields
    caches.submit(lambda: [jax.jit(lambda x: chain(x)).lower(spec) for _ in range(3)]).result()
    assert caches.yields == before  # nobody to yield to
    monkeypatch.setitem(core.busy, -1, 1)  # a call in progress on another thread
    assert caches.submit(lambda: lower_until_yields(5)).result() >= 5
    del core.busy[-1]
    assert sys.gettrace() is None


_OVERDUE_AT_IMPORT = """
import gc, sys, threading, time
import jax
threshold = gc.get_threshold()
if threshold[2] < 1 or not gc.isenabled() or sys.version_info >= (3, 14):
    print("skip"); sys.exit()
gc.set_threshold(10**9, threshold[1], threshold[2])  # no collection of CPython's own meanwhile
for _ in range(threshold[2]):
    gc.collect(1)  # each counts toward the next full collection: now overdue
full = []
gc.callbacks.append(lambda phase, info: full.append(threading.current_thread().name)
                    if phase == "stop" and info["generation"] == 2 else None)
import functx
deadline = time.perf_counter() + 20
while not full and time.perf_counter() < deadline:
    time.sleep(0.01)
while any(t.name == "functx-collect" for t in threading.enumerate()) and time.perf_counter() < deadline:
    time.sleep(0.01)
print(full, gc.get_count()[2], [t.name for t in threading.enumerate() if t.name.startswith("functx")])
"""


_OPTIONS_ASKED_AHEAD = """
import threading, time
import jax.numpy as jnp
import functx as fx
from functx import xla_cpu
asked = []
isolation = xla_cpu.isolation
def spy():
    asked.append(threading.current_thread().name)
    return isolation()
xla_cpu.isolation = spy
out = fx.grad(lambda x: (x * x).sum())(jnp.arange(3.0))
deadline = time.perf_counter() + 20
while any(t.name == "functx-options" for t in threading.enumerate()) and time.perf_counter() < deadline:
    time.sleep(0.01)
print(asked[0], sorted(set(asked)), list(xla_cpu._taken) == [xla_cpu.KEEP_CALLS_KEY],
      [t.name for t in threading.enumerate() if t.name == "functx-options"], out.tolist())
"""


@pytest.mark.slow
def test_the_first_call_asks_for_the_compile_options_on_another_thread():
    """The first transform call of a process starts the tiny compile that
    asks the jaxlib about the eager engine's options (`xla_cpu.ask_ahead`)
    on a short-lived thread, and its first program waits for that answer
    rather than compiling the probe again; the thread then ends."""
    import subprocess

    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    out = subprocess.run([sys.executable, "-c", _OPTIONS_ASKED_AHEAD], capture_output=True,
                         text=True, timeout=300, check=True, env=env).stdout.strip()
    assert out == "functx-options ['MainThread', 'functx-options'] True [] [0.0, 2.0, 4.0]", out


_OPTIONS_THREAD_AT_EXIT = """
import sys, time
import functx as fx
from functx import xla_cpu
isolation = xla_cpu.isolation
def slow():
    time.sleep(0.5)  # still asking when the script ends
    isolation()
    print("asked", flush=True)
xla_cpu.isolation = slow
def f(x):
    raise ValueError("boom")
try:
    fx.grad(f)(1.0)
except ValueError:
    print("raised", flush=True)
"""


def test_the_interpreter_waits_for_the_options_thread_at_exit():
    """A script whose first transform call raises at once ends while the
    thread asking the jaxlib about compile options (`xla_cpu.ask_ahead`)
    still compiles. As a daemon, the interpreter stopped it inside XLA's
    compiler at exit, and the process aborted (SIGABRT, "FATAL: exception
    not rethrown"); the interpreter now waits for it."""
    import subprocess

    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    run = subprocess.run([sys.executable, "-c", _OPTIONS_THREAD_AT_EXIT], capture_output=True,
                         text=True, timeout=300, env=env)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.split() == ["raised", "asked"], run.stdout


@pytest.mark.slow
def test_a_full_collection_overdue_at_import_runs_before_the_first_call():
    """NOTE [full collections between calls]: importing JAX and functx can
    leave CPython's next full collection overdue; the import starts a
    thread that runs it while no call is running, and then ends."""
    import subprocess

    out = subprocess.run([sys.executable, "-c", _OVERDUE_AT_IMPORT], capture_output=True,
                         text=True, timeout=300, check=True).stdout.strip()
    if out == "skip":
        pytest.skip("no generational full collections to move on this Python")
    assert out == "['functx-collect'] 0 []", out  # run there; the thread has ended


# Keys whose equality runs Python (as functx's `WeakRef` and lifted-function
# keys do), put, looked up and dropped by four threads at once, with the
# interpreter switching threads as often as it can: each LRU of functx's
# caches must stay whole (NOTE [caches shared between threads] in
# functx/caches.py). Unlocked, CPython's OrderedDict frees a node twice and
# the process crashes: hence a child process.
_CACHES_ON_THREADS = """
import importlib, sys, threading, time
from functx import caches, lax
from functx.primitives import control
jit = importlib.import_module("functx.transforms.jit")

class Key:
    __slots__ = ("v", "__weakref__")
    def __init__(self, v):
        self.v = v
    def __hash__(self):
        return hash(self.v)
    def __eq__(self, other):
        for _ in range(8):  # a loop: the interpreter may switch threads here
            pass
        return type(other) is Key and self.v == other.v

class Obj:
    pass

plain = caches.Cache("threads test", limit=3)
repeat = caches.RepeatCache("threads test counts", after=5, limit=3, count_limit=3)
jit_lru = jit._LRU("CACHE_SIZE")
jit.CACHE_SIZE = 3
control_lru = control._LRU(3)
staged = lax._StagedCache(3)
held = [Obj() for _ in range(4)]

def work(seed):
    n, end = 0, time.perf_counter() + 2.0
    while time.perf_counter() < end:
        n += 1
        k, other = Key(n % 3), Key((n + 1) % 3)
        plain.put(k, n)
        plain.get(other)
        plain.pop(other)
        repeat.get(k, lambda: (None, None))
        jit_lru.put(k, n)
        jit_lru.get(other)
        control_lru.put(k, n)
        control_lru.get(other)
        obj = held[(n + seed) % 4]
        staged.put((k, lax._Ident(obj)), n, [lax._Ident(obj)])
        staged.get((other, lax._Ident(obj)))

sys.setswitchinterval(1e-6)
threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
for t in threads:
    t.start()
for t in threads:
    t.join()
assert len(plain.entries) <= 3 and len(jit_lru) <= 3 and len(staged) <= 3
print("whole")
"""


def test_caches_stay_whole_when_threads_put_and_drop_equal_keys_at_once():
    import subprocess

    run = subprocess.run([sys.executable, "-X", "faulthandler", "-c", _CACHES_ON_THREADS], capture_output=True,
                         text=True, timeout=300, env={**os.environ, "FUNCTX_BACKGROUND_COMPILE": "0"})
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.split() == ["whole"]


_EXIT_WITH_CACHES_FULL = """
import jax, jax.numpy as jnp, functx as fx
x = jnp.linspace(0.1, 0.9, 4)
def f(v):  # globals of __main__: they die while the interpreter exits
    return jnp.sin(v).sum()
def body(c, y):
    return c + jnp.sin(y), None
def double(i, c):
    return c * 2.0
def lifted(v):
    return jnp.tanh(v * x).sum()
print(float(fx.jit(f)(x)))
print(float(fx.grad(lambda v: fx.lax.scan(body, 0.0, v)[0])(x)[0]))
print(float(fx.lax.fori_loop(0, 3, double, x)[0]))
print(float(fx.grad(fx.lift(lifted))(x)[0]))
"""


def test_interpreter_exit_with_cached_entries_is_silent():
    """The caches' weak-reference callbacks run at interpreter exit too,
    when module globals may already be cleared: they must stay silent
    (before: functx.jit's callback printed "Exception ignored ... 'NoneType'
    object is not callable")."""
    import subprocess

    run = subprocess.run([sys.executable, "-c", _EXIT_WITH_CACHES_FULL], capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert len(run.stdout.split()) == 4
    assert "Exception ignored" not in run.stderr and "Traceback" not in run.stderr, run.stderr
