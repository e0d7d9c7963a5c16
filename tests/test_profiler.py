"""functx.autograd.profiler: event counts and labels per transform stack,
record_function nesting, the key_averages table, the Chrome trace's
structure, and that nothing is hooked when no profile is active."""

import collections
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import functx
import functx.numpy as fnp
from functx import core
from functx.autograd import profiler
from functx.errors import FunctxRuntimeError, FunctxValueError


def f(x):
    return jnp_sum(fnp.sin(x) * x)


def jnp_sum(y):
    return y if y.shape == () else fnp.sum(y)


def _counts(prof):
    return collections.Counter(e.name for e in prof.events())


def _warm(fn, *args):
    from functx.caches import wait_for_compiles

    for _ in range(3):  # past every eager compile cache (fused steps, compiled backward)
        fn(*args)
        wait_for_compiles()  # NOTE [bounded caches]: they compile off this thread
    fn(*args)


def test_counts_and_labels_under_grad_and_vmap():
    x = jnp.float64(0.3)
    xs = jnp.arange(3.0)
    g, vm = functx.grad(f), functx.vmap(f)
    _warm(g, x)
    _warm(vm, xs)
    with profiler.profile():  # profiled, grad's backward pass is its own program
        _warm(g, x)
    with profiler.profile() as prof:
        gx = g(x)
        vx = vm(xs)
    # Profiling changes no number.
    np.testing.assert_allclose(gx, jax.grad(lambda x: jnp.sin(x) * x)(x), rtol=1e-12)
    np.testing.assert_allclose(vx, jnp.sin(xs) * xs, rtol=1e-12)
    # Steady state, profiled: each primitive the rules bind, once (under grad
    # sin's rule computes cos for its derivative; nothing is deferred or
    # fused while the profiler watches, NOTE [deferred eager steps]), and the
    # backward pass as one compiled dispatch.
    assert _counts(prof) == {"grad/sin": 1, "grad/cos": 1, "grad/mul": 1, "backward": 1,
                             "vmap/sin": 1, "vmap/mul": 1}
    avgs = {a.key: a for a in prof.key_averages()}
    assert avgs["grad/sin"].count == 1
    for a in avgs.values():
        assert a.cpu_time_total > 0 and 0 <= a.self_cpu_time_total <= a.cpu_time_total
        assert a.cpu_time == pytest.approx(a.cpu_time_total / a.count)


def test_nested_transforms_label_outer_first():
    x = jnp.float64(0.7)
    gg = functx.grad(functx.grad(f))
    with profiler.profile() as prof:
        out = gg(x)
    np.testing.assert_allclose(out, jax.grad(jax.grad(lambda x: jnp.sin(x) * x))(x), rtol=1e-12)
    names = set(_counts(prof))
    # Forward of the inner grad runs under both grads; the inner backward
    # runs under the outer grad; the outer backward under nothing.
    assert {"grad/grad/sin", "grad/grad/mul", "grad/backward", "backward"} <= names
    for n in names:
        assert n.split("/")[-1] in {"sin", "cos", "mul", "neg", "add_any", "backward"}, n


@pytest.mark.slow
def test_backward_range_encloses_its_primitives():
    x = jnp.full((5, 7), 0.25)  # a shape unlikely to be warm: backward runs op by op
    with profiler.profile() as prof:
        functx.grad(f)(x)
    events = prof.events()
    (bw,) = [e for e in events if e.name == "backward"]
    inner = [e for e in events if e.name.startswith("backward/")]
    for e in inner:
        assert bw.start_us <= e.start_us and e.end_us <= bw.end_us
        assert e.depth == bw.depth + 1
    assert bw.self_cpu_time_total == pytest.approx(
        bw.cpu_time_total - sum(e.cpu_time_total for e in inner), abs=1e-3)


def test_record_function_encloses_and_decorates():
    xs = jnp.arange(4.0)

    @profiler.record_function("model")
    def model(v):
        return fnp.cos(v) + v

    with profiler.profile(record_shapes=True) as prof:
        with profiler.record_function("outer"):
            functx.vmap(model)(xs)
            functx.vmap(model)(xs)
    events = prof.events()
    (outer,) = [e for e in events if e.name == "outer"]
    models = [e for e in events if e.name == "model"]
    prims = [e for e in events if e.kind == "primitive"]
    assert len(models) == 2 and _counts(prof)["vmap/cos"] == 2 and _counts(prof)["vmap/add"] == 2
    for e in models + prims:
        assert outer.start_us <= e.start_us and e.end_us <= outer.end_us
    for p in prims:
        assert sum(m.start_us <= p.start_us and p.end_us <= m.end_us for m in models) == 1
        assert p.depth == 2
    children = sum(m.cpu_time_total for m in models)
    assert outer.self_cpu_time_total == pytest.approx(outer.cpu_time_total - children, abs=1e-3)
    assert [e.input_shapes for e in prims if e.name == "vmap/cos"] == [[[4]], [[4]]]
    # Outside a profile record_function is inert.
    np.testing.assert_allclose(model(xs), jnp.cos(xs) + xs)


def _avg(key, count, total, self_total):
    a = profiler.FunctionEventAvg(key, None)
    a.count, a.cpu_time_total, a.self_cpu_time_total = count, total, self_total
    return a


def _rows(table):
    lines = table.splitlines()
    # sep, header, sep, rows..., sep, footer
    assert lines[0].startswith("-") and lines[2].startswith("-") and lines[-2].startswith("-")
    return lines[1], [ln.split() for ln in lines[3:-2]]


def test_table_sorting_and_row_limit():
    evs = profiler.EventList([_avg("a", 1, 10.0, 1.0), _avg("b", 5, 40.0, 30.0),
                              _avg("c", 2, 2000.0, 3.0), _avg("d", 3, 6.0, 6.0)])
    head, rows = _rows(evs.table(sort_by="count"))
    assert head.split() == ["Name", "Self", "CPU", "%", "Self", "CPU", "CPU", "total", "%",
                            "CPU", "total", "CPU", "time", "avg", "#", "of", "Calls"]
    assert [r[0] for r in rows] == ["b", "d", "c", "a"]
    assert [r[0] for r in _rows(evs.table(sort_by="self_cpu_time_total"))[1]] == ["b", "d", "c", "a"]
    assert [r[0] for r in _rows(evs.table(sort_by="cpu_time_total"))[1]] == ["c", "b", "a", "d"]
    assert [r[0] for r in _rows(evs.table(sort_by="cpu_time"))[1]] == ["c", "a", "b", "d"]
    assert [r[0] for r in _rows(evs.table(sort_by="count", row_limit=2))[1]] == ["b", "d"]
    assert len(_rows(evs.table(row_limit=-1))[1]) == 4
    # Columns: self % of the self total (40 us), formatted times, calls.
    c = dict((r[0], r) for r in rows)["c"]
    assert c[1:] == ["7.50%", "3.000us", "5000.00%", "2.000ms", "1.000ms", "2"]
    assert evs.table().splitlines()[-1] == "Self CPU time total: 40.000us"
    with pytest.raises(FunctxValueError, match="sort_by"):
        evs.table(sort_by="cuda_time_total")


def test_table_of_a_profile_with_input_shapes():
    xs = jnp.ones((2, 3))
    vsin = functx.vmap(fnp.sin)
    with profiler.profile(record_shapes=True) as prof:
        vsin(xs)
        vsin(xs[0])
        vsin(xs)
    grouped = prof.key_averages(group_by_input_shape=True)
    by = {(a.key, str(a.input_shapes)): a.count for a in grouped}
    assert by == {("vmap/sin", "[[2, 3]]"): 2, ("vmap/sin", "[[3]]"): 1}
    head, rows = _rows(grouped.table(sort_by="count", show_compile=False))
    assert head.split()[-2:] == ["Input", "Shapes"]
    # By default the Compile column appears exactly when a row compiled.
    compiled = any(a.compile_time > 0 for a in grouped)
    assert ("Compile" in grouped.table().splitlines()[1]) == compiled
    assert rows[0][0] == "vmap/sin" and rows[0][6] == "2" and " ".join(rows[0][7:]) == "[[2, 3]]"
    assert {a.key: a.count for a in prof.key_averages()} == {"vmap/sin": 3}
    with profiler.profile() as p2:
        pass
    with pytest.raises(FunctxValueError, match="record_shapes"):
        p2.key_averages(group_by_input_shape=True)


def test_chrome_trace_structure(tmp_path):
    xs = jnp.arange(3.0)
    with profiler.profile(record_shapes=True) as prof:
        with profiler.record_function("step"):
            functx.grad(lambda v: fnp.sum(fnp.sin(v) * v))(xs)
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    trace = json.loads(path.read_text())
    assert set(trace) == {"traceEvents"}
    evs = trace["traceEvents"]
    assert len(evs) == len(prof.events()) >= 4
    for e in evs:
        assert {"name", "ph", "ts", "dur", "pid", "tid", "args"} <= set(e)
        assert isinstance(e["name"], str) and e["ph"] == "X"
        assert isinstance(e["ts"], float) and isinstance(e["dur"], float)
        assert e["ts"] >= 0 and e["dur"] >= 0
        assert isinstance(e["pid"], int) and isinstance(e["tid"], int)
        assert isinstance(e["args"], dict)
        if e["cat"] == "primitive":
            assert isinstance(e["args"]["Input Shapes"], list)
    # Events of one thread nest properly: any two are disjoint or one
    # contains the other; "step" contains every other event.
    eps = 1e-6
    for a in evs:
        for b in evs:
            if a is b or a["tid"] != b["tid"]:
                continue
            a0, a1, b0, b1 = a["ts"], a["ts"] + a["dur"], b["ts"], b["ts"] + b["dur"]
            disjoint = a1 <= b0 + eps or b1 <= a0 + eps
            nested = (a0 <= b0 + eps and b1 <= a1 + eps) or (b0 <= a0 + eps and a1 <= b1 + eps)
            assert disjoint or nested, (a, b)
    (step,) = [e for e in evs if e["name"] == "step"]
    assert all(step["ts"] <= e["ts"] and e["ts"] + e["dur"] <= step["ts"] + step["dur"] + eps
               for e in evs)


def test_hook_only_while_profiling():
    assert core.eager_hook is None
    with profiler.profile(enabled=False) as prof:
        assert core.eager_hook is None
        functx.vmap(fnp.sin)(jnp.ones(2))
    assert len(prof.events()) == 0
    with pytest.raises(ZeroDivisionError):
        with profiler.profile():
            assert core.eager_hook is not None
            with pytest.raises(FunctxRuntimeError, match="already active"):
                with profiler.profile():
                    pass
            1 / 0
    assert core.eager_hook is None
    with profiler.profile() as prof:
        pass
    assert core.eager_hook is None and len(prof.events()) == 0
    with pytest.raises(FunctxValueError, match="use_cuda"):
        profiler.profile(use_cuda=True)


def test_traced_programs_record_no_primitive_events():
    x = jnp.float64(0.5)
    with profiler.profile() as prof:
        with profiler.record_function("traced"):
            out = jax.jit(functx.grad(f))(x)
            functx.jit(functx.vmap(f))(jnp.arange(2.0))
    np.testing.assert_allclose(out, jnp.cos(x) * x + jnp.sin(x), rtol=1e-12)
    assert [e.name for e in prof.events()] == ["traced"]
