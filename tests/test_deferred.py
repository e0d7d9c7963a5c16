"""NOTE [deferred eager steps] (functx/interpreters/deferred.py): eager
reverse mode and vmap queue their compiled steps and run them as one
program. Results equal JAX's and are the same bit for bit whichever way the
steps ran; values are computed whenever Python needs one; nothing deferred
leaks out of a transform; callbacks run where the program reaches them."""

import contextlib
import gc
import weakref

import numpy as np
import pytest

import jax
import jax.numpy as jnp

import functx as fx
import functx.numpy as fnp
from functx import caches
from warming import warm
from functx.interpreters import deferred

rng = np.random.default_rng(7)
W = jnp.asarray(rng.uniform(-1, 1, (6, 4)))
XS = jnp.asarray(rng.uniform(-1, 1, (3, 4)))


def mlp_loss(np_):
    def f(w, x):
        h = jax.nn.relu(w @ x)  # jax.nn inside: relu's comparison, jnp.mean's constant
        return jnp.mean(np_.tanh(h) ** 2) + np_.sum(np_.sin(w)) / 3.0
    return f


def _bits(tree):
    return [np.asarray(x).tobytes() for x in jax.tree_util.tree_leaves(tree)]


def _warm(fn, *args, calls=4):
    """Call until the steps and the queue's program are compiled."""
    return warm(fn, *args, calls=calls)


def test_queued_steps_equal_jax_and_run_as_one_program():
    deferred._programs.clear()
    g = fx.grad(mlp_loss(fnp))
    per_sample = fx.vmap(fx.grad(mlp_loss(fnp)), in_dims=(None, 0))
    first = (_bits(g(W, XS[0])), _bits(per_sample(W, XS)))
    # how many calls the queue's program takes to land depends on when the
    # compile thread finishes the steps' own programs (the queue's key
    # changes as they land): call until it has, within a bound
    for fn, args in ((g, (W, XS[0])), (per_sample, (W, XS))):
        before = len(deferred._programs.entries)
        for _ in range(12):
            fn(*args)
            caches.wait_for_compiles()
            fn(*args)  # a finished build enters the cache at its next lookup
            if len(deferred._programs.entries) > before:
                break
        else:
            raise AssertionError("no queue ran as one compiled program in 24 calls")
    for _ in range(2):
        assert (_bits(g(W, XS[0])), _bits(per_sample(W, XS))) == first
    np.testing.assert_allclose(np.asarray(g(W, XS[0])),
                               np.asarray(jax.grad(mlp_loss(jnp))(W, XS[0])), rtol=1e-12)
    np.testing.assert_allclose(
        np.asarray(per_sample(W, XS)),
        np.asarray(jax.vmap(jax.grad(mlp_loss(jnp)), in_axes=(None, 0))(W, XS)), rtol=1e-12)


def test_python_control_flow_on_a_queued_value_gets_its_value():
    """A branch on an intermediate value forces the queue; the branch taken
    changes with the input, and so does the gradient (JAX cannot trace
    this: the oracle is jax.grad of the branch taken)."""

    def branch(np_, positive):
        def fn(x):
            y = np_.sin(x) * 2.0
            return np_.sum(np_.exp(y)) if positive else np_.sum(y ** 3)
        return fn

    def f(x):
        y = fnp.sin(x) * 2.0
        if float(y.sum()) > 0:  # the concrete value of a queued result
            return fnp.sum(fnp.exp(y))
        return fnp.sum(y ** 3)

    g = fx.grad(f)
    for x in [XS[0], -XS[0], XS[1], -XS[1]] * 2:
        positive = float(jnp.sum(jnp.sin(x) * 2.0)) > 0
        np.testing.assert_allclose(np.asarray(g(x)),
                                   np.asarray(jax.grad(branch(jnp, positive))(x)), rtol=1e-12)
        caches.wait_for_compiles()


def test_outputs_and_aux_of_transforms_are_arrays_never_placeholders():
    def f(w, x):
        h = fnp.tanh(w @ x)
        return fnp.sum(h ** 2), {"h": h, "mask": h > 0}

    for _ in range(4):
        grad, (val, aux) = fx.grad_and_value(f, has_aux=True)(W, XS[0])
        outs = jax.tree_util.tree_leaves(((val, aux), grad))
        outs += jax.tree_util.tree_leaves(fx.vmap(lambda x: f(W, x))(XS))
        outs += jax.tree_util.tree_leaves(fx.jacrev(lambda x: f(W, x)[0])(XS[0]))
        outs += jax.tree_util.tree_leaves(fx.hessian(lambda x: f(W, x)[0])(XS[0]))
        assert all(isinstance(o, jax.Array) for o in outs), {type(o) for o in outs}
        caches.wait_for_compiles()
    want = jax.value_and_grad(lambda w, x: jnp.sum(jnp.tanh(w @ x) ** 2))(W, XS[0])
    np.testing.assert_allclose(np.asarray(val), np.asarray(want[0]), rtol=1e-12)
    np.testing.assert_allclose(np.asarray(grad), np.asarray(want[1]), rtol=1e-12)
    np.testing.assert_array_equal(np.asarray(aux["mask"]), np.asarray(aux["h"]) > 0)


def test_an_output_with_no_tangent_stays_queued(monkeypatch):
    """A comparison (relu's mask, a user's `x > 0`) has no tangent. Reached
    through the rules of transforms above (the inner steps of grad(vmap(f)),
    MAML's shape) its output stays queued instead of running the queue, so
    a warm call runs its forward steps as one program. The user's own
    comparisons under plain grad give arrays, as in JAX, which may be kept
    after grad returns."""
    kept = []

    def f(w, x, read=False):
        h = jax.nn.relu(w @ x)
        mask = h > 0.1
        kept.append(mask)
        scale = jnp.where(mask, 2.0, 1.0)  # JAX code on the mask
        out = fnp.sum(fnp.where(mask, fnp.tanh(h), h) * scale)
        return out, {"mask": mask, "any": bool(mask.any()) if read else None}

    g = fx.grad(f, has_aux=True)
    outer = fx.grad(lambda w: fnp.sum(fx.vmap(lambda x: f(w, x)[0])(XS)))
    _warm(g, W, XS[0])
    _warm(outer, W, calls=8)  # steps downstream of a queued mask join the queue later
    runs = []
    flush = deferred.Queue.flush
    monkeypatch.setattr(deferred.Queue, "flush",
                        lambda q: (runs.append(len(q.steps)) if q.steps else None, flush(q))[1])
    got_outer = outer(W)
    assert len(runs) == 1, f"the queue ran {len(runs)} times in one call: {runs}"
    kept.clear()
    got, aux = g(W, XS[0])

    def jf(w, x):
        h = jax.nn.relu(w @ x)
        mask = h > 0.1
        return jnp.sum(jnp.where(mask, jnp.tanh(h), h) * jnp.where(mask, 2.0, 1.0)), mask

    def mask_of(x):
        return jax.nn.relu(W @ x) > 0.1

    want, mask = jax.grad(jf, has_aux=True)(W, XS[0])
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-12)
    assert isinstance(aux["mask"], jax.Array) and aux["any"] is None
    np.testing.assert_array_equal(np.asarray(aux["mask"]), np.asarray(mask))
    # kept past grad's return and used, as with JAX's eager grad
    assert int(jnp.sum(kept[0])) == int(np.sum(np.asarray(mask))) == int(fnp.sum(kept[0]))
    want_outer = jax.grad(lambda w: jnp.sum(jax.vmap(lambda x: jf(w, x)[0])(XS)))(W)
    np.testing.assert_allclose(np.asarray(got_outer), np.asarray(want_outer), rtol=1e-12)
    # Python reading the mask's value (bool) still gets it
    for x in (XS[1], -XS[1]):
        _, aux = g(W, x, True)
        assert aux["any"] == bool(np.any(np.asarray(mask_of(x))))


def test_a_gradient_runs_forward_and_backward_as_one_program(monkeypatch, request):
    """NOTE [one program per gradient] in interpreters/reverse.py: a warm
    plain `grad` queues its backward pass behind the forward steps, so a
    call runs one program (it ran two: the forward queue, then the compiled
    backward pass). The transpose is staged on the compile thread from one
    call's tape while that call transposes equation by equation; it must
    map the tape's queued constants to inputs, never keep that call's
    values: here the compile thread is held until the call is over, and
    later calls with other inputs (and a branch that runs the queue
    mid-way) still equal JAX's gradients, bit for bit equal to the
    equation-by-equation path."""
    from functx.interpreters import reverse

    def f(np_):
        def loss(w, x):
            h = np_.tanh(w @ x) * 2.0
            return np_.sum(np_.exp(-h ** 2) * np_.sin(x[:1] * w[:, 0]))
        return loss

    w = jnp.asarray(rng.uniform(-1, 1, (5, 4)))  # avals no other test uses
    g = fx.grad(f(fnp))
    first = _bits(g(w, XS[0]))  # first sightings: equation by equation
    caches.wait_for_compiles()
    for _ in range(2):  # the fused steps land; the tape's structure is counted once
        assert _bits(g(w, XS[0])) == first
        caches.wait_for_compiles()
    held = request.getfixturevalue("held_compiles")
    # its transpose is handed to the compile thread (a call or two later
    # where a full suite's caches dropped the count of its first sighting)
    for _ in range(3):
        assert _bits(g(w, XS[0])) == first
        if reverse._staged.pending:
            break
    assert reverse._staged.pending, "the transpose was not handed to the compile thread"
    held.release()  # the build runs now, after the call whose tape it reads
    monkeypatch.undo()
    _warm(g, w, XS[1], calls=6)
    runs, backward_programs = [], []
    flush, compiled_backward = deferred.Queue.flush, reverse.compiled_backward
    monkeypatch.setattr(deferred.Queue, "flush",
                        lambda q: (runs.append(len(q.steps)) if q.steps else None, flush(q))[1])
    monkeypatch.setattr(reverse, "compiled_backward",
                        lambda *a: backward_programs.append(a) or compiled_backward(*a))
    for x in (XS[0], XS[2], -XS[1]):
        runs.clear()
        got = g(w, x)
        assert len(runs) == 1, f"a warm grad ran its queue {len(runs)} times: {runs}"
        assert not backward_programs, "the backward pass ran as a program of its own"
        np.testing.assert_allclose(np.asarray(got), np.asarray(jax.grad(f(jnp))(w, x)),
                                   rtol=1e-12)
    assert _bits(g(w, XS[0])) == first


def test_a_value_with_no_derivative_behaves_as_its_array():
    """Inside grad, the result of an inner vmap that has no derivative (a
    mask, an index) stays queued in a tracer, but reads as the array JAX
    gives there: NumPy conversion, tolist/tobytes, printing, pickling, and
    use after grad returned (NOTE [escaped tracers]). A differentiated
    value still refuses NumPy, which would lose its derivative, and still
    cannot be used after grad returned."""
    import pickle

    seen, kept = {}, []
    rows = jnp.asarray(rng.uniform(-1, 1, (4, 3)))

    def f(w):
        h = rows * w[None, :]
        masks = fx.vmap(lambda r: r > 0.2)(h)  # computed by the rules of vmap, inside grad
        index = fx.vmap(fnp.argmax)(h)
        seen.update(np=np.asarray(masks), tolist=masks.tolist(), bytes=masks.tobytes(),
                    str=str(masks), repr=repr(masks), fmt=f"{index}", pickled=pickle.dumps(masks),
                    queued=not isinstance(masks, type(rows)))
        kept.extend([masks, index, h])
        with pytest.raises(fx.FunctxError):
            np.asarray(h)
        return fnp.sum(fnp.where(masks, h ** 2, h))

    w = jnp.asarray([1.0, -0.5, 2.0])
    g = fx.grad(f)
    _warm(g, w, calls=6)
    got = g(w)
    h = rows * w[None, :]
    masks, index = h > 0.2, jnp.argmax(h, axis=1)
    assert seen["queued"], "the inner vmap's mask was not a queued value: nothing tested"
    assert {k: v for k, v in seen.items() if k not in ("np", "queued")} == dict(
        tolist=masks.tolist(), bytes=masks.tobytes(), str=str(masks), repr=repr(masks),
        fmt=f"{index}", pickled=seen["pickled"])
    np.testing.assert_array_equal(seen["np"], np.asarray(masks))
    np.testing.assert_array_equal(np.asarray(pickle.loads(seen["pickled"])), np.asarray(masks))
    np.testing.assert_allclose(np.asarray(got), np.asarray(
        jax.grad(lambda w: jnp.sum(jnp.where(masks, (rows * w[None]) ** 2, rows * w[None])))(w)))
    # kept past grad's return: the values with no derivative are their arrays
    kept_masks, kept_index, kept_h = kept[-3:]
    assert int(fnp.sum(kept_masks)) == int(jnp.sum(kept_masks)) == int(np.sum(np.asarray(masks)))
    assert bool(kept_masks[0, 0]) == bool(masks[0, 0]) and int(kept_index[1]) == int(index[1])
    assert [10, 20, 30][kept_index[0]] == [10, 20, 30][int(index[0])]
    with pytest.raises(fx.EscapedTracerError):
        fnp.sum(kept_h)


def test_a_callback_runs_where_the_program_reaches_it():
    """Python side effects and a jax.debug.callback keep their order: the
    callback's step is not queued behind later Python code."""
    seen = []

    def f(x):
        y = fnp.sin(x) * 3.0
        seen.append("before")
        jax.debug.callback(lambda v: seen.append(("callback", float(np.sum(v)))), y)
        seen.append("after")
        return fnp.sum(fnp.cos(y))

    g = fx.grad(f)
    for _ in range(3):
        seen.clear()
        g(XS[0])
        caches.wait_for_compiles()
        assert [s if isinstance(s, str) else s[0] for s in seen] == ["before", "callback", "after"]
        assert seen[1][1] == pytest.approx(float(jnp.sum(jnp.sin(XS[0]) * 3.0)), rel=1e-12)
    batched = fx.vmap(f)
    for _ in range(3):
        seen.clear()
        batched(XS)
        caches.wait_for_compiles()
        # under vmap, once per batch element (as jax.vmap calls it)
        assert [s if isinstance(s, str) else s[0] for s in seen] == (
            ["before"] + ["callback"] * len(XS) + ["after"])
        assert sum(s[1] for s in seen[1:-1]) == pytest.approx(
            float(jnp.sum(jnp.sin(XS) * 3.0)), rel=1e-12)


def test_an_error_midway_leaves_no_stale_work():
    """A function that raises after queueing steps; the next calls are
    right."""

    def f(x, fail):
        y = fnp.exp(fnp.sin(x))
        if fail:
            raise ValueError("user error")
        return fnp.sum(y * x)

    g = fx.grad(f)
    for i in range(4):
        with pytest.raises(ValueError, match="user error"):
            g(XS[i % 3], True)
        got = g(XS[i % 3], False)
        np.testing.assert_allclose(
            np.asarray(got), np.asarray(jax.grad(lambda x: jnp.sum(jnp.exp(jnp.sin(x)) * x))(XS[i % 3])),
            rtol=1e-12)
        caches.wait_for_compiles()


def test_a_queue_keeps_only_live_values():
    """Intermediates nobody holds any more are not outputs of the queue's
    program; those still referenced are, and get their values."""
    q = deferred.Queue()

    from functx.interpreters.staging import stage

    graph, _ = stage(lambda x: [fnp.sin(x)], [fx.core.aval_of(XS[0])], "test")
    made = []  # weak references to every array the step computed
    sin = jax.jit(lambda x: [jnp.sin(x)])

    alive = []  # at each step, how many earlier outputs are still held

    def run(x):
        gc.collect()
        alive.append(sum(r() is not None for r in made))
        out = sin(x)
        made.append(weakref.ref(out[0]))
        return out

    step = deferred.StepOutputs(run, graph)
    x = XS[0]
    kept = []
    p = x
    for i in range(6):
        (p,) = q.defer(step, [p])
        if i % 2 == 0:
            kept.append(p)
    live = [r() for r in q.outs]
    assert sum(v is not None for v in live) == 4  # three kept, and the last
    del live
    q.flush()  # a structure seen once: its steps run one by one
    gc.collect()
    # the dead intermediates were dropped once read, not kept to the end:
    # when the last step runs, only the three kept outputs are held
    assert alive == [0, 1, 2, 2, 3, 3]
    assert [r() is not None for r in made] == [True, False, True, False, True, True]
    want = x
    for i in range(6):
        want = jnp.sin(want)
        if i % 2 == 0:
            np.testing.assert_array_equal(np.asarray(kept[i // 2].value), np.asarray(want))
    np.testing.assert_array_equal(np.asarray(p.value), np.asarray(want))


def test_a_queue_passes_each_array_once_and_jax_scalar_constants_by_value():
    """An array read by several steps is one program input (so XLA sees the
    sharing); JAX's typed scalar constants are part of the key by value and
    dtype, never confused across dtypes."""
    from jax._src import literals

    from functx.interpreters.staging import stage

    graph, _ = stage(lambda x, c: [fnp.sin(x) * c], [fx.core.aval_of(XS[0]),
                                                     fx.core.Aval((), np.dtype("float64"), True)],
                     "test")
    step = deferred.StepOutputs(jax.jit(lambda x, c: [jnp.sin(x) * c]), graph)
    q = deferred.Queue()
    c2 = literals.TypedFloat(2.0, np.dtype("float64"))
    x = XS[0]
    a = q.defer(step, [x, c2])
    b = q.defer(step, [x, c2])
    assert len(q.inputs) == 1
    refs = [r for _, r in q.steps]
    assert refs[0] == refs[1] and isinstance(refs[0][1], deferred.Literal)
    assert deferred.Literal(c2) != deferred.Literal(literals.TypedFloat(2.0, np.dtype("float32")))
    assert deferred.Literal(c2) == deferred.Literal(literals.TypedFloat(2.0, np.dtype("float64")))
    q.flush()
    np.testing.assert_array_equal(np.asarray(a[0].value), np.asarray(jnp.sin(x) * 2.0))
    np.testing.assert_array_equal(np.asarray(b[0].value), np.asarray(a[0].value))


def test_steps_run_one_at_a_time_with_a_named_collective_in_a_graph(monkeypatch):
    """Until a queue's program is compiled its steps run one by one, at the
    bottom of the stack: a jit_call whose graph holds a collective over a
    live named vmap's axis is not routed back to that vmap (which recursed
    without end, depending on when the background compiles finished)."""
    monkeypatch.setattr(deferred._programs, "get", lambda key, build: None)
    g_fx = fx.jit(lambda c: fx.lax.psum(c, "i") + fx.lax.axis_index("i"))
    g_jax = jax.jit(lambda c: jax.lax.psum(c, "i") + jax.lax.axis_index("i"))
    for _ in range(3):  # past the steps' second sighting
        out = fx.grad(lambda v: fnp.sum(fx.vmap(lambda x: x * g_fx(2.0), axis_name="i")(v) ** 2))(XS[0])
        caches.wait_for_compiles()
    want = jax.grad(lambda v: jnp.sum(jax.vmap(lambda x: x * g_jax(2.0), axis_name="i")(v) ** 2))(XS[0])
    np.testing.assert_allclose(np.asarray(out), np.asarray(want), rtol=1e-12)





@pytest.mark.parametrize("isolation", [None, "barriers", "calls"])
def test_barriers_keep_xla_from_rewriting_across_primitives(monkeypatch, isolation):
    """Where the eager engine cannot keep its primitives as calls (XLA:GPU
    aborts on a program compiled with its call inliner off), it puts
    optimisation barriers around them: XLA's simplifier then no longer
    turns the sum of a broadcast into a product (NOTE [one rounding per
    primitive]). The first calls (the sum over a materialised broadcast)
    and the later ones (one program) must agree bit for bit. Without
    isolation they differ: the case does test something."""
    from functx import xla_cpu

    if isolation != "calls":
        monkeypatch.setattr(xla_cpu, "isolation", lambda: isolation)
    elif not xla_cpu.keeps_calls():
        pytest.skip("this backend cannot keep calls")
    fx.clear_caches()
    x = jnp.asarray(rng.uniform(-1, 1, (5, 3, 7)))
    f = fx.vmap(lambda v: fnp.sum(fnp.broadcast_to(fnp.sin(v), (7,) + v.shape), 0))
    seen = []
    for _ in range(6):
        seen.append(np.asarray(f(x)).tobytes())
        caches.wait_for_compiles()
    fx.clear_caches()
    np.testing.assert_allclose(np.frombuffer(seen[-1]), np.asarray(7 * jnp.sin(x)).ravel(),
                               rtol=1e-14)
    if isolation is None:
        assert len(set(seen)) == 2, "XLA no longer rewrites this sum: pick another case"
    else:
        assert len(set(seen)) == 1


@pytest.mark.slow
def test_first_calls_equal_later_ones_bit_for_bit_under_default_xla_options():
    """The suite compiles with XLA's cheapest options (tests/xla_options.py);
    users' programs are compiled with the defaults, under which XLA fuses a
    product and the sum it feeds into one multiply-add, rewrites a sum of a
    broadcast into a product and reassociates sums with constants. Eager
    steps run first by per-primitive programs, then by combined ones: the
    bits must agree all the same (NOTE [one rounding per primitive], NOTE
    [transposed as if inlined]), over gradients, per-sample gradients and
    gradients of gradients of random programs, and of a JAX primitive
    functx borrows (bound inline in combined programs until 2026-12: it
    differed), and of digamma, whose derivative has a constant operand (XLA
    folded it into its call until 2026-12: it differed), and of jnp.nanvar
    called as a jitted JAX function and inside a functx.jit (each compiled
    whole until 2026-12: it differed), in a child process
    with XLA's default options. (Before: 20
    of 40 random programs differed in the last bit.) Where the eager engine cannot keep its calls (no CPU backend,
    or a jaxlib without the option) a mismatch is recorded as xfail."""
    import json
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))  # uninstalled
    script = os.path.join(os.path.dirname(__file__), "eager_bits.py")
    out = subprocess.run([sys.executable, script], env=env, capture_output=True, text=True,
                         timeout=600, check=True).stdout
    result = json.loads(out.strip().splitlines()[-1])
    if result["mismatched"] and result["isolation"] != "calls":
        pytest.xfail("this backend fuses across primitives in the eager engine's programs")
    assert result["mismatched"] == []


def _hits_and_misses():
    return list(deferred._speculation)


def _warm_until_ahead(fn, *args, calls=20):
    """Call until a call dispatched its program ahead (the queue's program
    compiled, and two calls in a row ran it)."""
    for _ in range(calls):
        before = deferred._speculation[0]
        fn(*args)
        caches.wait_for_compiles()
        if deferred._speculation[0] > before:
            return
    raise AssertionError(f"{calls} calls and none dispatched its program ahead")


def test_a_repeated_call_dispatches_its_program_ahead_with_the_same_results(monkeypatch):
    """NOTE [speculative first program]: once two calls in a row ran the
    same program on inputs from the same places, the next call dispatches
    it before its Python runs and uses its outputs; results equal those of
    the flush's own dispatch bit for bit, and JAX's."""
    w = jnp.asarray(rng.uniform(-1, 1, (7, 4)))  # avals no other test uses
    xs = [jnp.asarray(rng.uniform(-1, 1, (5, 4))) for _ in range(4)]
    scale = jnp.asarray(rng.uniform(1, 2, (7,)))  # a closure's array: an input held weakly

    def loss(w, x):
        return fnp.sum(fnp.tanh(w @ x) * scale) * 0.5

    per_sample = fx.vmap(fx.grad(loss), in_dims=(None, 0))
    g = fx.grad(loss)
    for fn, x in ((per_sample, xs[0]), (g, xs[0][0])):
        _warm_until_ahead(fn, w, x)
    before = _hits_and_misses()
    got = [(_bits(per_sample(w, x)), _bits(g(w, x[0]))) for x in xs]
    hits, misses = (a - b for a, b in zip(_hits_and_misses(), before))
    assert hits == 2 * len(xs) and misses == 0, (hits, misses)
    monkeypatch.setattr(deferred, "SPECULATE", False)
    assert [(_bits(per_sample(w, x)), _bits(g(w, x[0]))) for x in xs] == got
    assert _hits_and_misses()[0] == before[0] + hits
    ref = jax.vmap(jax.grad(lambda w, x: jnp.sum(jnp.tanh(w @ x) * scale) * 0.5),
                   in_axes=(None, 0))
    for x in xs:
        np.testing.assert_allclose(np.asarray(per_sample(w, x)), np.asarray(ref(w, x)),
                                   rtol=1e-12)


def test_a_call_that_changed_never_takes_the_speculative_outputs():
    """A plan predicts the program and its inputs; when the call turns out
    to run another program (a Python branch) or to read another array (a
    rebound global), the speculative outputs are dropped: the results equal
    JAX's, and alternating calls waste at most one speculative run."""
    w = jnp.asarray(rng.uniform(-1, 1, (3, 7)))
    x = jnp.asarray(rng.uniform(-1, 1, (7,)))
    state = {"c": jnp.asarray(rng.uniform(-1, 1, (3,))), "sin": True}

    def loss(w, x):
        h = w @ x
        h = fnp.sin(h) if state["sin"] else fnp.cos(h)
        return fnp.sum(h * state["c"])

    def expected(w, x):
        h = w @ x
        return jnp.sum((jnp.sin(h) if state["sin"] else jnp.cos(h)) * state["c"])

    g = fx.grad(loss)
    _warm_until_ahead(g, w, x)
    state["sin"] = False
    _warm_until_ahead(g, w, x)  # both structures compiled
    state["sin"] = True
    _warm_until_ahead(g, w, x)
    old_c = state["c"]  # still alive: the plan's weak reference resolves to it
    for change in ("branch", "global", "branch", "global"):
        if change == "branch":
            state["sin"] = not state["sin"]
        else:
            state["c"] = state["c"] * 1.5
        before = _hits_and_misses()
        for _ in range(4):  # alternating structure from here on: no more speculation
            np.testing.assert_allclose(np.asarray(g(w, x)),
                                       np.asarray(jax.grad(expected)(w, x)), rtol=1e-12)
            state["sin"] = not state["sin"]
        hits, misses = (a - b for a, b in zip(_hits_and_misses(), before))
        assert misses <= 1, misses
        state["sin"] = not state["sin"]
        _warm_until_ahead(g, w, x, calls=4)  # stable again: speculation resumes
    del old_c


def test_a_structure_still_compiling_in_between_stops_speculation(request):
    """Calls alternating between a structure whose program is compiled and
    one whose program is not (the compile thread held) are not two calls in
    a row of one plan: at most one program is dispatched ahead for
    nothing."""
    w = jnp.asarray(rng.uniform(-1, 1, (3, 11)))
    x = jnp.asarray(rng.uniform(-1, 1, (11,)))
    mode = {"sin": True}

    def loss(w, x):
        h = w @ x
        return fnp.sum(fnp.sin(h) if mode["sin"] else fnp.exp(h) * 0.5)

    g = fx.grad(loss)
    _warm_until_ahead(g, w, x)
    request.getfixturevalue("held_compiles")
    before = _hits_and_misses()[1]
    for _ in range(8):
        mode["sin"] = not mode["sin"]
        g(w, x)
    assert _hits_and_misses()[1] - before <= 1


def test_a_tracing_option_changed_mid_call_never_takes_the_speculative_outputs():
    """jax.jit traces a program anew under other tracing options (a
    `jax.default_matmul_precision` context): outputs dispatched ahead at the
    call's first step are not used by a flush run inside a context entered
    after it."""
    w = jnp.asarray(rng.uniform(-1, 1, (3, 13)))
    x = jnp.asarray(rng.uniform(-1, 1, (13,)))
    inside = {"on": False}

    def loss(w, x):
        h = fnp.tanh(w @ x)
        with (jax.default_matmul_precision("highest") if inside["on"]
              else contextlib.nullcontext()):
            float(h[0])  # the queue runs here, under the context once it is on
        return fnp.sum(h * h)

    g = fx.grad(loss)
    _warm_until_ahead(g, w, x)
    inside["on"] = True
    before = _hits_and_misses()
    got = g(w, x)
    hits, misses = (a - b for a, b in zip(_hits_and_misses(), before))
    assert hits == 0 and misses == 1, (hits, misses)
    np.testing.assert_allclose(np.asarray(got), np.asarray(
        jax.grad(lambda w, x: jnp.sum(jnp.tanh(w @ x) ** 2))(w, x)), rtol=1e-12)


def test_plans_hold_the_arrays_they_read_weakly():
    """A plan names a closure's array through a weak reference: dropping
    the function and the array frees the array; `clear_caches` empties the
    plans."""
    w = jnp.asarray(rng.uniform(-1, 1, (2, 9)))
    x = jnp.asarray(rng.uniform(-1, 1, (9,)))
    c = jnp.asarray(rng.uniform(-1, 1, (2,)))
    g = fx.grad(lambda w, x: fnp.sum(fnp.tanh(w @ x) * c))
    _warm_until_ahead(g, w, x)
    assert fx.cache_info()["eager plans"]["entries"] >= 1
    ref = weakref.ref(c)
    del g, c
    gc.collect()
    assert ref() is None, "a plan kept a closure's array alive"
    fx.clear_caches()
    assert fx.cache_info()["eager plans"]["entries"] == 0
